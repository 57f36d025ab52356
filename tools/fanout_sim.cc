// `weightsync fanout-sim`: how long until every one of N inference replicas holds a step, sent by
// the trainer to each (direct) or relayed by the replicas along trees of bounded fan-out or a
// chain (tools/fanout_model.h, docs/plan_sim.md "Fan-out to replicas").
#include <cstdio>
#include <string>

#include "command_line.h"
#include "commands.h"
#include "fanout_model.h"
#include "plan_sim_layout.h"

namespace weightsync::tools {
namespace {

constexpr char kSummary[] =
    "Predicts, from link speeds, how long until every inference replica holds a step: the\n"
    "trainer sending to each replica (direct), replicas relaying along trees of bounded fan-out,\n"
    "or a chain, each relay forwarding a bucket while it receives the next (or, with\n"
    "--store-and-forward, each whole step once it holds it). Prints the trainer's egress and the\n"
    "time per topology. See docs/plan_sim.md.";

Result<double> Number(const std::string& flag, const std::string& text, double low, double high) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v >= low && v <= high)) {
    return Status::InvalidArgument("--", flag, "=", text, ": expected a number from ", low, " to ",
                                   high);
  }
  return v;
}

}  // namespace

int RunFanoutSim(int argc, char** argv) {
  std::string layout_name = "qwen2.5-7b", trainer_gbps = "400", replica_gbps = "400", changed;
  int64_t replicas = 1000;
  uint64_t model_bytes = 0, bucket_bytes = 64ull << 20;
  CommandLine flags("weightsync fanout-sim [flags]", kSummary);
  flags.Int("replicas", &replicas, "inference replicas, each holding the whole model");
  flags.String("layout", &layout_name,
               "the model, as bf16: " + LayoutNames() + " (its parameters x 2 bytes)");
  flags.Bytes("model-bytes", &model_bytes, "the model's bytes instead of --layout's (e.g. 256M)");
  flags.String("trainer-gbps", &trainer_gbps, "the trainer's egress, Gb/s");
  flags.String("replica-gbps", &replica_gbps, "each replica's NIC, per direction, Gb/s");
  flags.Bytes("bucket-bytes", &bucket_bytes, "what a relay receives before forwarding it");
  bool store_and_forward = false;
  flags.Bool("store-and-forward", &store_and_forward,
             "relays forward a step once they hold all of it (relays do for steps that come as "
             "deltas; default: cut-through, bucket by bucket, as relays do for whole steps over "
             "tcp)");
  flags.String("changed-fraction", &changed,
               "send deltas: this fraction (0..1) of elements changed per step (default: whole)");
  Status s = flags.Parse(argc, argv);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  FanoutOptions o;
  o.bucket_bytes = bucket_bytes;
  o.store_and_forward = store_and_forward;
  if (s.ok() && replicas < 1) {
    s = Status::InvalidArgument("--replicas=", replicas, ": expected at least 1");
  }
  o.replicas = static_cast<uint64_t>(replicas);
  for (auto [flag, text, target] : {std::tuple{"trainer-gbps", &trainer_gbps, &o.trainer_gbps},
                                    std::tuple{"replica-gbps", &replica_gbps, &o.replica_gbps}}) {
    if (!s.ok()) break;
    Result<double> v = Number(flag, *text, 1e-3, 1e9);
    s = v.status();
    if (v.ok()) *target = *v;
  }
  if (s.ok() && !changed.empty()) {
    Result<double> v = Number("changed-fraction", changed, 0, 1);
    s = v.status();
    if (v.ok()) o.changed_fraction = *v;
  }
  if (s.ok() && model_bytes == 0) {
    Result<SimLayout> layout = FindLayout(layout_name, "", "");
    s = layout.status();
    if (layout.ok()) model_bytes = layout->params() * 2;
  }
  o.model_bytes = model_bytes;
  Result<std::vector<FanoutPrediction>> rows =
      s.ok() ? PredictFanout(o, {2, 4, 8, 16}) : Result<std::vector<FanoutPrediction>>(s);
  if (!rows.ok()) {
    std::fprintf(stderr, "weightsync fanout-sim: %s\n", rows.status().ToString().c_str());
    return 2;
  }
  std::fputs(FormatFanout(o, *rows).c_str(), stdout);
  return 0;
}

}  // namespace weightsync::tools
