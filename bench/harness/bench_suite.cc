// The whole `weightsync bench` run: the machine and configuration, then every measurement.
#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>

#include "harness/bench_figures.h"
#include "harness/bench_pair.h"
#include "harness/byte_units.h"
#include "harness/proc_stats.h"

namespace weightsync::bench {

Status MeasureAll(const BenchOptions& o, BenchReport* report) {
  report->machine = MachineDescription();
  report->config = {
      {"quick", o.quick ? "yes" : "no"},
      {"copy threads",
       o.copy_threads == 0
           ? "library default (publisher " + std::to_string(PublisherThreads(0)) + ", subscriber " +
                 std::to_string(std::min(4u, std::thread::hardware_concurrency())) + ")"
           : std::to_string(o.copy_threads)},
      {"throughput model", FormatBytes(o.bytes) + " / " + std::to_string(o.tensors) + " tensors"},
      {"per-step model",
       std::to_string(o.small_tensors) + " x " + FormatBytes(o.small_tensor_bytes)},
      {"steps", std::to_string(o.steps)},
      {"rss steps", std::to_string(o.rss_steps)},
  };
  char load[32];
  std::snprintf(load, sizeof(load), "%.2f", LoadAverage());
  report->config.push_back({"load average at start", load});
  std::fprintf(stderr, "weightsync bench: measuring throughput (%s)...\n",
               FormatBytes(o.bytes).c_str());
  WS_RETURN_IF_ERROR(MeasureThroughput(o, report));
  std::fprintf(stderr, "weightsync bench: measuring two publishers feeding one subscriber...\n");
  WS_RETURN_IF_ERROR(MeasureTwoPublishers(o, report));
  std::fprintf(stderr, "weightsync bench: measuring a ring of host buckets...\n");
  WS_RETURN_IF_ERROR(MeasureHostRing(o, report));
  std::fprintf(stderr, "weightsync bench: measuring tcp on loopback (%s)...\n",
               FormatBytes(o.bytes).c_str());
  WS_RETURN_IF_ERROR(MeasureTcpThroughput(o, report));
  std::fprintf(stderr, "weightsync bench: measuring per-step figures (%lld x %s)...\n",
               static_cast<long long>(o.small_tensors), FormatBytes(o.small_tensor_bytes).c_str());
  return MeasureSmallModel(o, report);
}

}  // namespace weightsync::bench
