// A ring of host buckets (PublisherOptions::ring_buckets, path shm-ring) against the arena
// publisher, same tensors, same run. The ring's Publish only hashes; its bytes move in the update
// (each bucket filled from the tensors, then copied out), so its update is compared with the
// arena's publish + update: the time from the trainer's publish to the engine holding the step.
// And the memory each store holds (PublishStats::store_bytes).
#include <algorithm>
#include <string>
#include <vector>

#include "harness/bench_figures.h"
#include "harness/bench_pair.h"
#include "harness/byte_units.h"
#include "harness/sample_stats.h"

namespace weightsync::bench {
namespace {

struct Run {
  double publish_s = 0;  // median Publish (with its BeginWrite)
  double update_s = 0;   // median Subscriber::Update
  uint64_t store_bytes = 0;
};

Result<Run> Measure(BenchPair& pair, int64_t steps) {
  WS_ASSIGN_OR_RETURN(auto subscriber, pair.NewSubscriber(UpdateMode::kInPlace, false));
  std::vector<double> publish, update;
  const int64_t warmup = 3;  // fault in the store, map it, prepare the handle
  for (int64_t i = 0; i < warmup + steps; ++i) {
    const auto t0 = BenchClock::now();
    WS_ASSIGN_OR_RETURN(int64_t step, pair.PublishNext());
    const double publish_s = SecondsSince(t0);
    WS_ASSIGN_OR_RETURN(UpdateStats stats, subscriber->Update(step));
    if (i < warmup) continue;
    publish.push_back(publish_s);
    update.push_back(stats.seconds);
  }
  WS_RETURN_IF_ERROR(subscriber->Close());
  return Run{Median(publish), Median(update), pair.last_publish().store_bytes};
}

}  // namespace

Status MeasureHostRing(const BenchOptions& o, BenchReport* report) {
  const std::vector<TensorSpec> tensors = UniformTensors(o.tensors, o.bytes / o.tensors);
  const int threads = static_cast<int>(o.copy_threads);
  WS_ASSIGN_OR_RETURN(auto arena_pair, BenchPair::Create(tensors, threads));
  WS_ASSIGN_OR_RETURN(Run arena, Measure(*arena_pair, o.throughput_steps));
  WS_RETURN_IF_ERROR(arena_pair->publisher().Close());
  const uint64_t bytes = arena_pair->bytes();
  arena_pair.reset();
  // 16 buckets a version: enough that the ring streams, not so many that a bucket is tiny.
  const uint64_t bucket = std::max<uint64_t>(bytes / 16, 64 << 10);
  WS_ASSIGN_OR_RETURN(auto ring_pair, BenchPair::Create(tensors, threads, "", 2, bucket));
  WS_ASSIGN_OR_RETURN(Run ring, Measure(*ring_pair, o.throughput_steps));
  WS_RETURN_IF_ERROR(ring_pair->publisher().Close());

  const std::string model = FormatBytes(bytes) + " in " + std::to_string(o.tensors) +
                            " tensors, in place, ring of 2 x " + FormatBytes(bucket);
  const double ring_gbps = bytes / (ring.publish_s + ring.update_s) / 1e9;
  const double arena_gbps = bytes / (arena.publish_s + arena.update_s) / 1e9;
  report->figures.push_back(
      {"shm_ring_step_gbps", "shm-ring publish + update (2 buckets)", ring_gbps, "GB/s",
       "arena publish + update", arena_gbps, "GB/s", ring_gbps / arena_gbps, "x arena", "",
       std::nullopt,
       model + ": bytes / (median Publish + median Update) over " +
           std::to_string(o.throughput_steps) +
           " steps; the ring's publish only hashes, its update fills and copies each bucket"});
  report->figures.push_back(
      {"shm_ring_store_mib", "shm-ring store memory", ring.store_bytes / 1048576.0, "MiB",
       "arena store (2 slots)", arena.store_bytes / 1048576.0, "MiB",
       arena.store_bytes > 0 ? std::optional<double>(double(ring.store_bytes) / arena.store_bytes)
                             : std::nullopt,
       "x arena", "", std::nullopt, "PublishStats::store_bytes of each publisher"});
  return Status::Ok();
}

}  // namespace weightsync::bench
