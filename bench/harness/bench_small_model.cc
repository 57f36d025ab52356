#include <cstdio>
#include <string>
#include <vector>

#include "harness/alloc_counter.h"
#include "harness/bench_figures.h"
#include "harness/bench_pair.h"
#include "harness/byte_units.h"
#include "harness/proc_stats.h"
#include "harness/sample_stats.h"

namespace weightsync::bench {
namespace {

// Median Update() seconds over `steps` steady-state steps (each: Publish, then Update).
Result<std::vector<double>> SteadySteps(BenchPair& pair, Subscriber& subscriber, int64_t steps) {
  std::vector<double> seconds;
  seconds.reserve(static_cast<size_t>(steps));
  for (int64_t i = 0; i < steps; ++i) {
    WS_ASSIGN_OR_RETURN(int64_t step, pair.PublishNext());
    WS_ASSIGN_OR_RETURN(UpdateStats stats, subscriber.Update(step));
    seconds.push_back(stats.seconds);
  }
  return seconds;
}

Figure StepFigure(const std::string& id, const std::string& label, double step_s, double memcpy_s,
                  const std::string& model, int64_t steps) {
  return {id,
          "steady-state step, " + label,
          step_s * 1e6,
          "us",
          "memcpy 1 thread",
          memcpy_s * 1e6,
          "us",
          step_s / memcpy_s,
          "x memcpy",
          "",
          std::nullopt,
          model + ": median Subscriber::Update() time over " + std::to_string(steps) +
              " steps (each after a Publish)"};
}

Figure OverheadFigure(const std::string& id, const std::string& label, double step_s,
                      double memcpy_s) {
  const double overhead_us = (step_s - memcpy_s) * 1e6;
  return {id,
          "overhead beyond the copy, " + label,
          overhead_us,
          "us",
          "",
          0,
          "",
          std::nullopt,
          "",
          "<= 200 us",
          overhead_us <= 200,
          "median step time minus median single-threaded memcpy time of the same bytes"};
}

Figure AllocFigure(const std::string& id, const std::string& name, const std::vector<double>& per,
                   double first, const std::string& first_name, const std::string& how) {
  const double max = Max(per);
  return {id,
          name,
          Mean(per),
          "/step",
          first_name,
          first,
          "allocs",
          std::nullopt,
          "",
          "0",
          max == 0,
          how + "; mean over " + std::to_string(per.size()) + " steady-state steps, max " +
              std::to_string(static_cast<int64_t>(max))};
}

}  // namespace

Status MeasureSmallModel(const BenchOptions& o, BenchReport* report) {
  if (!AllocCounterActive()) {
    return Status::Internal(
        "the allocation counter saw no allocation from `new`; the malloc "
        "hook in bench/harness/alloc_counter.cc is not active");
  }
  const std::vector<TensorSpec> tensors = UniformTensors(o.small_tensors, o.small_tensor_bytes);
  WS_ASSIGN_OR_RETURN(auto pair, BenchPair::Create(tensors, static_cast<int>(o.copy_threads)));
  const std::string model =
      std::to_string(o.small_tensors) + " x " + FormatBytes(o.small_tensor_bytes) + " tensors";
  const std::string label =
      std::to_string(o.small_tensors) + " x " + FormatBytes(o.small_tensor_bytes);

  // The first step: Publish freezes the layout, Update prepares the handle.
  AllocCounts g0 = ProcessAllocations(), t0 = ThreadAllocations();
  WS_ASSIGN_OR_RETURN(int64_t step, pair->PublishNext());
  AllocCounts t1 = ThreadAllocations();
  WS_ASSIGN_OR_RETURN(auto subscriber, pair->NewSubscriber(UpdateMode::kStaged, false));
  AllocCounts t2 = ThreadAllocations();
  WS_ASSIGN_OR_RETURN(UpdateStats first, subscriber->Update(step));
  AllocCounts t3 = ThreadAllocations(), g1 = ProcessAllocations();
  const double first_publish_allocs = static_cast<double>((t1 - t0).allocations);
  const double first_update_allocs = static_cast<double>((t3 - t2).allocations);
  const double first_process_allocs = static_cast<double>((g1 - g0).allocations);
  // Until every slot has been mapped and every buffer has grown to its size.
  WS_RETURN_IF_ERROR(SteadySteps(*pair, *subscriber, 20).status());

  // Steady state, staged: time and allocations per step.
  std::vector<double> seconds, publish_allocs, update_allocs, process_allocs;
  for (auto* v : {&seconds, &publish_allocs, &update_allocs, &process_allocs}) {
    v->reserve(static_cast<size_t>(o.steps));
  }
  for (int64_t i = 0; i < o.steps; ++i) {
    const AllocCounts p0 = ProcessAllocations(), a0 = ThreadAllocations();
    WS_ASSIGN_OR_RETURN(step, pair->PublishNext());
    const AllocCounts a1 = ThreadAllocations();
    WS_ASSIGN_OR_RETURN(UpdateStats stats, subscriber->Update(step));
    const AllocCounts a2 = ThreadAllocations(), p1 = ProcessAllocations();
    seconds.push_back(stats.seconds);
    publish_allocs.push_back(static_cast<double>((a1 - a0).allocations));
    update_allocs.push_back(static_cast<double>((a2 - a1).allocations));
    process_allocs.push_back(static_cast<double>((p1 - p0).allocations));
  }
  const double steady = Median(seconds);

  // Baseline: one thread copying the same tensors (cache-warm, as the update's are).
  std::vector<double> memcpy_seconds;
  const int64_t reps = std::max<int64_t>(200, o.steps / 4);
  for (int64_t i = 0; i <= reps; ++i) {
    auto t = BenchClock::now();
    MemcpyAll(pair->source(), pair->destination());
    if (i > 0) memcpy_seconds.push_back(SecondsSince(t));
  }
  const double memcpy_s = Median(memcpy_seconds);

  char prepare[32];
  std::snprintf(prepare, sizeof(prepare), "%.2f ms", first.prepare_seconds * 1e3);
  report->figures.push_back(
      {"first_update_ms", "first update (prepare), " + label, first.seconds * 1e3, "ms",
       "steady-state step", steady * 1e3, "ms", first.seconds / steady, "x steady", "",
       std::nullopt,
       "the Update() that creates the transfer handle (connect, handshake, plan, map, staging), "
       "vs the staged steady-state median; its prepare phase took " +
           std::string(prepare)});
  report->figures.push_back(
      StepFigure("steady_step_us_staged", label + ", staged", steady, memcpy_s, model, o.steps));
  report->figures.push_back(OverheadFigure("overhead_us_staged", "staged", steady, memcpy_s));

  // The same in place (no shadow buffer, one copy).
  {
    WS_ASSIGN_OR_RETURN(auto in_place, pair->NewSubscriber(UpdateMode::kInPlace, false));
    WS_RETURN_IF_ERROR(SteadySteps(*pair, *in_place, 20).status());
    WS_ASSIGN_OR_RETURN(std::vector<double> s, SteadySteps(*pair, *in_place, o.steps));
    const double median = Median(s);
    report->figures.push_back(StepFigure("steady_step_us_in_place", label + ", in_place", median,
                                         memcpy_s, model, o.steps));
    report->figures.push_back(OverheadFigure("overhead_us_in_place", "in_place", median, memcpy_s));
    WS_RETURN_IF_ERROR(in_place->Close());
  }

  // No reuse: a fresh Subscriber (so a fresh transfer handle) for every step.
  {
    std::vector<double> fresh;
    for (int64_t i = 0; i < o.no_reuse_steps; ++i) {
      WS_ASSIGN_OR_RETURN(step, pair->PublishNext());
      auto t = BenchClock::now();
      WS_ASSIGN_OR_RETURN(auto s, pair->NewSubscriber(UpdateMode::kStaged, false));
      WS_RETURN_IF_ERROR(s->Update(step).status());
      WS_RETURN_IF_ERROR(s->Close());
      s.reset();
      fresh.push_back(SecondsSince(t));
    }
    const double median = Median(fresh);
    report->figures.push_back({"no_reuse_step_us", "fresh Subscriber every step (no reuse)",
                               median * 1e6, "us", "reused handle", steady * 1e6, "us",
                               median / steady, "x reused", ">= 10x", median / steady >= 10,
                               "median of Create + Register + Update + Close per step over " +
                                   std::to_string(o.no_reuse_steps) +
                                   " steps, vs the staged steady-state step"});
  }

  report->figures.push_back(
      AllocFigure("allocs_publish", "heap allocs per step: Publish (caller)", publish_allocs,
                  first_publish_allocs, "first Publish",
                  "malloc-hook count on the thread calling Publisher::Publish()"));
  report->figures.push_back(AllocFigure(
      "allocs_update", "heap allocs per step: Update (caller)", update_allocs, first_update_allocs,
      "first Update", "malloc-hook count on the thread calling Subscriber::Update()"));
  report->figures.push_back(AllocFigure(
      "allocs_process", "heap allocs per step: whole process", process_allocs, first_process_allocs,
      "first step",
      "every thread (publisher workers and connection thread, subscriber workers) from before "
      "Publish() to after Update()"));

  // RSS slope after a warm-up, sampled after every step.
  {
    const int64_t warmup = std::max<int64_t>(100, o.rss_steps / 10);
    WS_RETURN_IF_ERROR(SteadySteps(*pair, *subscriber, warmup).status());
    // Sized (and so touched) before the loop: filling reserved-but-untouched capacity would
    // fault pages in and show up as growth that is the benchmark's own.
    std::vector<double> x(static_cast<size_t>(o.rss_steps)), y(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      WS_ASSIGN_OR_RETURN(step, pair->PublishNext());
      WS_RETURN_IF_ERROR(subscriber->Update(step).status());
      x[i] = static_cast<double>(i);
      y[i] = static_cast<double>(ResidentBytes());
    }
    const double slope = Slope(x, y);
    report->figures.push_back(
        {"rss_slope_bytes_per_step", "RSS slope over " + std::to_string(o.rss_steps) + " steps",
         slope, "B/step", "RSS at start", y.empty() ? 0 : y.front() / 1048576.0, "MiB",
         std::nullopt, "", "< 1 B/step", slope < 1,
         "least-squares slope of /proc/self/statm resident bytes sampled after every step, "
         "after " +
             std::to_string(warmup) + " warm-up steps; RSS went from " +
             FormatBytes(static_cast<uint64_t>(y.front())) + " to " +
             FormatBytes(static_cast<uint64_t>(y.back()))});
  }
  WS_RETURN_IF_ERROR(subscriber->Close());
  return pair->publisher().Close();
}

}  // namespace weightsync::bench
