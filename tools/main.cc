// weightsync: the command-line tool. Subcommands: demo, bench, info, plan-sim, fanout-sim.
#include <cstdio>
#include <cstring>
#include <string>

#include "commands.h"

namespace {

constexpr char kUsage[] =
    "usage: weightsync <command> [flags]\n"
    "\n"
    "Moves model weights from a trainer (Publisher) to inference processes (Subscriber) over\n"
    "shared memory.\n"
    "\n"
    "commands:\n"
    "  demo    two processes, a publisher and a subscriber, update a synthetic model shaped like\n"
    "          a real one (qwen2.5-0.5b by default) every step and verify every byte\n"
    "  bench   throughput, per-step overhead, heap allocations and RSS slope, each against a\n"
    "          baseline measured in the same run; prints a table and writes JSON\n"
    "  info    protocol version, the transports this build and machine can use, and every\n"
    "          WEIGHTSYNC_* environment knob with its default and current value\n"
    "  plan-sim\n"
    "          plans a sharded trainer -> sharded engine transfer for a whole cluster (Kimi-K2 on\n"
    "          256 -> 128 GPUs by default) without moving bytes: planning time and memory, bytes\n"
    "          per rank, the most loaded link and the transfer time the links' speeds predict\n"
    "  fanout-sim\n"
    "          how long until every one of N inference replicas holds a step, from the trainer\n"
    "          directly or relayed by replicas (trees, chains), from link speeds\n"
    "\n"
    "'weightsync <command> --help' lists the command's flags.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::string command = argv[1];
  if (command == "demo") return weightsync::tools::RunDemo(argc - 2, argv + 2);
  if (command == "bench") return weightsync::tools::RunBench(argc - 2, argv + 2);
  if (command == "fanout-sim") return weightsync::tools::RunFanoutSim(argc - 2, argv + 2);
  if (command == "info") return weightsync::tools::RunInfo(argc - 2, argv + 2);
  if (command == "plan-sim") return weightsync::tools::RunPlanSim(argc - 2, argv + 2);
  std::fprintf(stderr, "weightsync: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return 2;
}
