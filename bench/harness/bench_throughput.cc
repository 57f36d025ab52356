#include <string>
#include <vector>

#include "harness/bench_figures.h"
#include "harness/bench_pair.h"
#include "harness/byte_units.h"
#include "harness/sample_stats.h"

namespace weightsync::bench {
namespace {

struct Mode {
  const char* id;
  const char* label;
  UpdateMode mode;
  bool verify;
};

}  // namespace

Status MeasureThroughput(const BenchOptions& o, BenchReport* report) {
  if (o.tensors < 1 || o.bytes < static_cast<uint64_t>(o.tensors)) {
    return Status::InvalidArgument("--bytes=", o.bytes, " --tensors=", o.tensors,
                                   ": need at least one byte per tensor");
  }
  const std::vector<TensorSpec> tensors = UniformTensors(o.tensors, o.bytes / o.tensors);
  WS_ASSIGN_OR_RETURN(auto pair, BenchPair::Create(tensors, static_cast<int>(o.copy_threads)));
  const uint64_t bytes = pair->bytes();
  const std::string model = FormatBytes(bytes) + " in " + std::to_string(o.tensors) + " tensors";

  // Baseline: one thread copying the same tensors between buffers that are already resident.
  std::vector<double> memcpy_seconds;
  for (int64_t i = 0; i <= o.throughput_steps; ++i) {
    auto t0 = BenchClock::now();
    MemcpyAll(pair->source(), pair->destination());
    if (i > 0) memcpy_seconds.push_back(SecondsSince(t0));  // the first run warms up
  }
  const double memcpy_gbps = bytes / Median(memcpy_seconds) / 1e9;
  // And on as many threads as the publisher copies and hashes with.
  const int publisher_threads = PublisherThreads(o.copy_threads);
  std::vector<double> parallel_seconds;
  for (int64_t i = 0; i <= o.throughput_steps; ++i) {
    auto t0 = BenchClock::now();
    MemcpyAllThreads(pair->source(), pair->destination(), publisher_threads);
    if (i > 0) parallel_seconds.push_back(SecondsSince(t0));
  }
  const double parallel_gbps = bytes / Median(parallel_seconds) / 1e9;
  const std::string parallel = "memcpy " + std::to_string(publisher_threads) + " threads";

  const Mode modes[] = {{"staged", "staged", UpdateMode::kStaged, false},
                        {"in_place", "in_place", UpdateMode::kInPlace, false},
                        {"staged_verify", "staged + verify", UpdateMode::kStaged, true}};
  std::vector<double> publish_seconds;
  for (const Mode& m : modes) {
    WS_ASSIGN_OR_RETURN(auto subscriber, pair->NewSubscriber(m.mode, m.verify));
    std::vector<double> seconds;
    // The first updates fault in the shadow buffer and map each arena slot: not steady state.
    const int64_t warmup = 3;
    for (int64_t i = 0; i < warmup + o.throughput_steps; ++i) {
      auto t0 = BenchClock::now();
      WS_ASSIGN_OR_RETURN(int64_t step, pair->PublishNext());
      double publish = SecondsSince(t0);
      WS_ASSIGN_OR_RETURN(UpdateStats stats, subscriber->Update(step));
      if (i < warmup) continue;
      seconds.push_back(stats.seconds);
      publish_seconds.push_back(publish);
    }
    const double gbps = bytes / Median(seconds) / 1e9;
    report->figures.push_back({"shm_update_gbps_" + std::string(m.id),
                               "shm update, " + std::string(m.label), gbps, "GB/s",
                               "memcpy 1 thread", memcpy_gbps, "GB/s", gbps / memcpy_gbps,
                               "x memcpy", "", std::nullopt,
                               model + ": bytes / median Subscriber::Update() time over " +
                                   std::to_string(o.throughput_steps) + " steps after " +
                                   std::to_string(warmup) + " warm-up steps"});
    WS_RETURN_IF_ERROR(subscriber->Close());
  }
  const double publish_gbps = bytes / Median(publish_seconds) / 1e9;
  report->figures.push_back({"publish_gbps", "publisher Publish (copy + digests)", publish_gbps,
                             "GB/s", parallel, parallel_gbps, "GB/s", publish_gbps / parallel_gbps,
                             "x memcpy", "≥ 0.8x", publish_gbps / parallel_gbps >= 0.8,
                             model +
                                 ": bytes / median Publisher::Publish() time (copy into a slot and "
                                 "xxHash3 per segment, hashed while copying, on " +
                                 std::to_string(publisher_threads) +
                                 " threads) against a memcpy of the same bytes on as many"});
  return pair->publisher().Close();
}

}  // namespace weightsync::bench
