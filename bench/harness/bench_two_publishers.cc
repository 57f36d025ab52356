// Two publishers (two trainer ranks, each holding half of the model) feeding one subscriber over
// shared memory, against one publisher holding all of it, in the same run: shows that the two
// shares really move at the same time (issue 7's schedule, on the CPU).
#include <string>
#include <vector>

#include "harness/bench_figures.h"
#include "harness/bench_pair.h"
#include "harness/byte_units.h"
#include "harness/sample_stats.h"

namespace weightsync::bench {
namespace {

// Median seconds of Subscriber::Update() over `steps` after 3 warm-up steps; `publish` publishes
// the next step everywhere and returns it.
template <typename PublishFn>
Result<double> MedianUpdateSeconds(Subscriber& subscriber, int64_t steps, PublishFn publish) {
  std::vector<double> seconds;
  for (int64_t i = 0; i < 3 + steps; ++i) {
    WS_ASSIGN_OR_RETURN(int64_t step, publish());
    WS_ASSIGN_OR_RETURN(UpdateStats stats, subscriber.Update(step));
    if (i >= 3) seconds.push_back(stats.seconds);
  }
  return Median(seconds);
}

}  // namespace

Status MeasureTwoPublishers(const BenchOptions& o, BenchReport* report) {
  const int64_t count = std::max<int64_t>(2, o.tensors - o.tensors % 2);
  const std::vector<TensorSpec> all = UniformTensors(count, o.bytes / count);
  const std::vector<TensorSpec> first(all.begin(), all.begin() + count / 2);
  const std::vector<TensorSpec> second(all.begin() + count / 2, all.end());
  const int threads = static_cast<int>(o.copy_threads);

  // Baseline: one publisher holding every tensor.
  WS_ASSIGN_OR_RETURN(auto one, BenchPair::Create(all, threads));
  WS_ASSIGN_OR_RETURN(auto single, one->NewSubscriber(UpdateMode::kInPlace, false));
  WS_ASSIGN_OR_RETURN(double one_s, MedianUpdateSeconds(*single, o.throughput_steps,
                                                        [&] { return one->PublishNext(); }));
  WS_RETURN_IF_ERROR(single->Close());
  WS_RETURN_IF_ERROR(one->publisher().Close());

  // Two publishers, one subscriber registering both halves.
  WS_ASSIGN_OR_RETURN(auto a, BenchPair::Create(first, threads));
  WS_ASSIGN_OR_RETURN(auto b, BenchPair::Create(second, threads));
  SubscriberOptions so;
  so.endpoints = {a->publisher().endpoint(), b->publisher().endpoint()};
  so.mode = UpdateMode::kInPlace;
  so.copy_threads = threads;
  so.timeout = std::chrono::milliseconds(60000);
  WS_ASSIGN_OR_RETURN(auto both, Subscriber::Create(so));
  std::vector<NamedTensor> views = a->destination().Views();
  for (const NamedTensor& t : b->destination().Views()) views.push_back(t);
  WS_RETURN_IF_ERROR(both->Register(views));
  WS_ASSIGN_OR_RETURN(double two_s,
                      MedianUpdateSeconds(*both, o.throughput_steps, [&]() -> Result<int64_t> {
                        WS_RETURN_IF_ERROR(a->PublishNext().status());
                        return b->PublishNext();
                      }));
  WS_RETURN_IF_ERROR(both->Close());

  const uint64_t bytes = TotalBytes(all);
  const double two = bytes / two_s / 1e9, base = bytes / one_s / 1e9;
  report->figures.push_back(
      {"shm_two_publishers_gbps", "shm update, 2 publishers (halves)", two, "GB/s",
       "1 publisher, same bytes", base, "GB/s", two / base, "x one publisher", "", std::nullopt,
       FormatBytes(bytes) + " in " + std::to_string(count) +
           " tensors: bytes / median Subscriber::Update() time over " +
           std::to_string(o.throughput_steps) +
           " steps; each publisher holds half the tensors "
           "and both shares move at once (one thread per publisher, each with its copy workers)"});
  WS_RETURN_IF_ERROR(a->publisher().Close());
  return b->publisher().Close();
}

}  // namespace weightsync::bench
