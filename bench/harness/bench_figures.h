// The bench's measurements (`weightsync bench` parses the flags into BenchOptions and runs
// MeasureAll). Each adds figures, with their same-run baselines, to a report.
#pragma once

#include <cstdint>
#include <string>

#include "harness/bench_report.h"
#include "weightsync/status.h"

namespace weightsync::bench {

struct BenchOptions {
  bool quick = false;
  uint64_t bytes = 1ull << 30;   // throughput model
  int64_t tensors = 16;          // throughput model: bytes split evenly
  int64_t throughput_steps = 5;  // measured updates per mode (after warm-up)
  int64_t small_tensors = 400;   // per-step model
  uint64_t small_tensor_bytes = 4096;
  int64_t steps = 2000;          // steady-state steps (per-step time, allocations)
  int64_t no_reuse_steps = 100;  // steps with a fresh Subscriber each
  int64_t rss_steps = 10000;     // steps sampled for the RSS slope
  int64_t copy_threads = 0;      // 0: library default
  std::string json = "bench_results.json";
  bool check = false;  // exit 1 when a target is missed
};

// Update throughput of a large model (staged, in_place, staged + verify) and Publish throughput,
// against a single-threaded memcpy of the same bytes.
Status MeasureThroughput(const BenchOptions& options, BenchReport* report);

// One subscriber fed by two publishers, each holding half the tensors, against one publisher
// holding all of them (in_place, same bytes, same run).
Status MeasureTwoPublishers(const BenchOptions& options, BenchReport* report);

// A host ring publisher (2 buckets of 1/16 of the model) against the arena publisher, in place,
// same bytes, same run: its update (which now includes the fill) against the arena's publish +
// update, and the memory each store holds.
Status MeasureHostRing(const BenchOptions& options, BenchReport* report);

// The tcp transport on loopback (in_place and staged) against a plain socket copy of the same
// bytes between two threads over 127.0.0.1.
Status MeasureTcpThroughput(const BenchOptions& options, BenchReport* report);

// With many small tensors: the first (preparing) update, the steady-state step against memcpy
// of the same bytes (staged and in_place), heap allocations per steady-state step on both sides,
// the RSS slope, and a fresh Subscriber every step (no handle reuse).
Status MeasureSmallModel(const BenchOptions& options, BenchReport* report);

// The machine, the configuration and every measurement above, in that order, each announced by
// a line on stderr. Stops at the first failure.
Status MeasureAll(const BenchOptions& options, BenchReport* report);

}  // namespace weightsync::bench
