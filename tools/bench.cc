// weightsync bench: parses the flags, runs the harness (bench/harness/) and prints a table of
// figures, each beside a baseline measured in the same run, and writes them as JSON.
#include <cstdio>
#include <cstdlib>

#include "command_line.h"
#include "commands.h"
#include "harness/bench_figures.h"
#include "harness/bench_report.h"

namespace weightsync::tools {
namespace {

constexpr char kSummary[] =
    "Measures, in one process (publisher and subscriber over a real Unix socket and real shared\n"
    "memory), each figure beside a baseline from the same run:\n"
    "  * update throughput of a large model vs a single-threaded memcpy of the same bytes;\n"
    "  * with 400 small tensors: the first (preparing) update, the steady-state step and its\n"
    "    overhead beyond a memcpy of the same bytes (target <= 200 us), and a fresh Subscriber\n"
    "    per step vs the reused handle (target >= 10x);\n"
    "  * heap allocations per steady-state step, publisher and subscriber (target 0);\n"
    "  * RSS slope over many steps (target < 1 byte/step).\n"
    "See docs/demo.md for how each figure is measured.";

void ApplyQuick(const CommandLine& flags, bench::BenchOptions* o) {
  if (!o->quick) return;
  if (!flags.WasSet("bytes")) o->bytes = 64ull << 20;
  if (!flags.WasSet("throughput-steps")) o->throughput_steps = 3;
  if (!flags.WasSet("steps")) o->steps = 300;
  if (!flags.WasSet("no-reuse-steps")) o->no_reuse_steps = 20;
  if (!flags.WasSet("rss-steps")) o->rss_steps = 1000;
}

Status Validate(const bench::BenchOptions& o) {
  if (o.throughput_steps < 1 || o.steps < 1 || o.no_reuse_steps < 1 || o.rss_steps < 2) {
    return Status::InvalidArgument(
        "--throughput-steps, --steps and --no-reuse-steps must be "
        "≥ 1 and --rss-steps ≥ 2");
  }
  if (o.small_tensors < 1 || o.small_tensor_bytes < 1) {
    return Status::InvalidArgument("--small-tensors and --small-tensor-bytes must be ≥ 1");
  }
  if (o.copy_threads < 0) return Status::InvalidArgument("--copy-threads must be ≥ 0");
  return Status::Ok();
}

}  // namespace

int RunBench(int argc, char** argv) {
  bench::BenchOptions o;
  CommandLine flags("weightsync bench [flags]", kSummary);
  flags.Bool("quick", &o.quick,
             "small sizes and few steps (a few seconds); flags given explicitly still apply");
  flags.Bytes("bytes", &o.bytes, "throughput model size (--quick: 64 MiB)");
  flags.Int("tensors", &o.tensors, "throughput model: number of equal tensors");
  flags.Int("throughput-steps", &o.throughput_steps, "measured updates per mode (--quick: 3)");
  flags.Int("small-tensors", &o.small_tensors, "per-step model: number of tensors");
  flags.Bytes("small-tensor-bytes", &o.small_tensor_bytes, "per-step model: bytes per tensor");
  flags.Int("steps", &o.steps, "steady-state steps for step time and allocations (--quick: 300)");
  flags.Int("no-reuse-steps", &o.no_reuse_steps, "steps with a fresh Subscriber (--quick: 20)");
  flags.Int("rss-steps", &o.rss_steps, "steps sampled for the RSS slope (--quick: 1000)");
  flags.Int("copy-threads", &o.copy_threads, "copy threads on each side; 0: library default");
  flags.String("json", &o.json, "where to write the results as JSON ('' to skip)");
  flags.Bool("check", &o.check, "exit 1 if a target is missed");
  Status s = flags.Parse(argc, argv);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  ApplyQuick(flags, &o);
  if (s.ok()) s = Validate(o);
  if (!s.ok()) {
    std::fprintf(stderr, "weightsync bench: %s\n", s.ToString().c_str());
    return 2;
  }

  // The per-step figures prepare hundreds of handles; their INFO lines would bury the table.
  ::setenv("WEIGHTSYNC_LOG_LEVEL", "warn", /*overwrite=*/0);
  bench::BenchReport report;
  if (Status m = bench::MeasureAll(o, &report); !m.ok()) {
    std::fprintf(stderr, "weightsync bench: %s\n", m.ToString().c_str());
    return 1;
  }
  bench::PrintReport(report);
  if (!o.json.empty()) {
    if (Status w = bench::WriteJson(report, o.json); !w.ok()) {
      std::fprintf(stderr, "weightsync bench: %s\n", w.ToString().c_str());
      return 1;
    }
    std::printf("wrote %s\n", o.json.c_str());
  }
  return o.check && !report.all_targets_met() ? 1 : 0;
}

}  // namespace weightsync::tools
