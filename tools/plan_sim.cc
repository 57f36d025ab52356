// `weightsync plan-sim`: plans a whole cluster's weight transfer (every engine rank against every
// trainer rank) for a described layout without moving a byte, and prints the planning time and
// memory, the bytes per rank, the most loaded link and the transfer time the links' speeds
// predict (tools/plan_sim_model.h, docs/plan_sim.md).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "command_line.h"
#include "commands.h"
#include "harness/proc_stats.h"
#include "plan_sim_layout.h"
#include "plan_sim_model.h"

namespace weightsync::tools {
namespace {

constexpr char kSummary[] =
    "Computes the region schedule of a sharded trainer -> sharded engine transfer for every\n"
    "engine rank (nothing is moved) and prints: planning time and peak memory, bytes per trainer\n"
    "and engine rank (and each engine rank's ratio to its shard), the most loaded link and the\n"
    "transfer time predicted from the links' speeds. See docs/plan_sim.md.";

// VmHWM (peak resident set) from /proc/self/status, in bytes; 0 if unreadable.
uint64_t PeakResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return 0;
}

Result<double> PositiveNumber(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v > 0) || v > 1e9) {
    return Status::InvalidArgument("--", flag, "=", text, ": expected a positive number (Gb/s)");
  }
  return v;
}

}  // namespace

int RunPlanSim(int argc, char** argv) {
  std::string layout_name = "kimi-k2", trainer, engine, nic = "400", nvlink = "3600";
  std::string dtype_out = "bf16", changed;
  int64_t gpus_per_node = 8, drop_source = -1;
  bool colocated = false;
  CommandLine flags("weightsync plan-sim [flags]", kSummary);
  flags.String("layout", &layout_name, "the cluster layout: " + LayoutNames());
  flags.String("trainer", &trainer,
               "trainer parallelism overrides, e.g. tp8,pp4,ep8 (kimi-k2) or fsdp4 (qwen2.5-7b)");
  flags.String("engine", &engine,
               "engine parallelism overrides, e.g. tp8,dp16 (kimi-k2) or tp2 (qwen2.5-7b)");
  flags.String("nic-gbps", &nic, "NIC speed per rank and direction (between nodes), Gb/s");
  flags.String("nvlink-gbps", &nvlink, "NVLink speed per rank and direction (within a node), Gb/s");
  flags.Int("gpus-per-node", &gpus_per_node, "ranks per node");
  flags.Bool("colocated", &colocated,
             "engine rank r on trainer rank r's GPU (default: engine ranks on nodes of their own)");
  flags.String("dtype-out", &dtype_out,
               "bf16, or fp8: linear-layer weights reach the engine as fp8 (converted before "
               "sending: half the bytes on the wire)");
  flags.String("changed-fraction", &changed,
               "send deltas: this fraction (0..1) of elements changed per step, spread uniformly "
               "(the segment delta's size model; default: whole tensors)");
  flags.Int("drop-source", &drop_source,
            "remove every shard this trainer rank holds (a layout with uncovered ranges)");
  Status s = flags.Parse(argc, argv);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  ClusterOptions o;
  o.gpus_per_node = gpus_per_node;
  o.colocated = colocated;
  if (s.ok() && dtype_out != "bf16" && dtype_out != "fp8") {
    s = Status::InvalidArgument("--dtype-out=", dtype_out, ": expected bf16 or fp8");
  }
  o.fp8 = dtype_out == "fp8";
  if (s.ok() && gpus_per_node < 1) {
    s = Status::InvalidArgument("--gpus-per-node=", gpus_per_node, ": expected at least 1");
  }
  if (s.ok()) {
    Result<double> v = PositiveNumber("nic-gbps", nic);
    s = v.status();
    if (v.ok()) o.nic_gbps = *v;
  }
  if (s.ok()) {
    Result<double> v = PositiveNumber("nvlink-gbps", nvlink);
    s = v.status();
    if (v.ok()) o.nvlink_gbps = *v;
  }
  if (s.ok() && !changed.empty()) {
    char* end = nullptr;
    o.changed_fraction = std::strtod(changed.c_str(), &end);
    if (*end != '\0' || !(o.changed_fraction >= 0 && o.changed_fraction <= 1)) {
      s = Status::InvalidArgument("--changed-fraction=", changed,
                                  ": expected a number from 0 to 1");
    } else if (o.fp8) {
      s = Status::InvalidArgument(
          "--changed-fraction with --dtype-out fp8: deltas of tensors converted in flight are not "
          "built (docs/deltas.md)");
    }
  }
  const uint64_t rss_before = bench::ResidentBytes();
  const auto start = std::chrono::steady_clock::now();
  Result<SimLayout> layout = s.ok() ? FindLayout(layout_name, trainer, engine) : s;
  if (layout.ok() && drop_source >= 0 && drop_source >= layout->trainer_ranks) {
    layout = Status::InvalidArgument("--drop-source=", drop_source, ": the layout has ",
                                     layout->trainer_ranks, " trainer ranks");
  }
  if (!layout.ok()) {
    std::fprintf(stderr, "weightsync plan-sim: %s\n", layout.status().ToString().c_str());
    return 2;
  }
  if (drop_source >= 0) DropSource(&*layout, static_cast<uint32_t>(drop_source));
  const double layout_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Result<SimReport> report = SimulateCluster(*layout, o);
  if (!report.ok()) {
    std::fprintf(stderr, "weightsync plan-sim: %s\n", report.status().ToString().c_str());
    return report.status().message().find("cannot be planned") != std::string::npos ? 1 : 2;
  }
  report->layout_seconds = layout_seconds;
  report->rss_before = rss_before;
  report->peak_rss = PeakResidentBytes();
  report->machine = bench::MachineDescription() + "\n                  load average " +
                    std::to_string(bench::LoadAverage()).substr(0, 4);
  std::fputs(FormatReport(*layout, o, *report).c_str(), stdout);
  return 0;
}

}  // namespace weightsync::tools
