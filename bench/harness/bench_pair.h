// An in-process publisher and its subscribers for the benchmarks: a real Unix socket and real
// shared memory, with both sides' tensors owned here.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "harness/tensor_storage.h"
#include "weightsync/options.h"
#include "weightsync/publisher.h"
#include "weightsync/subscriber.h"

namespace weightsync::bench {

class BenchPair {
 public:
  // `tensors` must outlive the pair. `endpoint` empty: a fresh local:// one (shared memory).
  // `ring_buckets` > 0: a ring publisher (PublisherOptions::ring_buckets, ring_bucket_bytes).
  static Result<std::unique_ptr<BenchPair>> Create(const std::vector<TensorSpec>& tensors,
                                                   int copy_threads,
                                                   const std::string& endpoint = "",
                                                   int ring_buckets = 0,
                                                   uint64_t ring_bucket_bytes = 0);
  ~BenchPair();

  // A subscriber of this pair's destinations (not yet prepared).
  Result<std::unique_ptr<Subscriber>> NewSubscriber(UpdateMode mode, bool verify) const;
  // Publishes the next step (the source bytes are not changed: the copy costs the same); a ring
  // publisher fences it with BeginWrite first, as its trainer must.
  Result<int64_t> PublishNext();
  // The last PublishNext's stats.
  const PublishStats& last_publish() const { return last_publish_; }
  Publisher& publisher() { return *publisher_; }
  const TensorStorage& source() const { return source_; }
  TensorStorage& destination() { return destination_; }
  uint64_t bytes() const { return bytes_; }
  int64_t step() const { return step_; }

 private:
  BenchPair(const std::vector<TensorSpec>& tensors, int copy_threads);

  std::string endpoint_;
  int copy_threads_;
  uint64_t bytes_;
  TensorStorage source_;
  TensorStorage destination_;
  std::unique_ptr<Publisher> publisher_;
  bool ring_ = false;
  PublishStats last_publish_;
  int64_t step_ = 0;
};

// Single-threaded memcpy of every tensor of `from` into `to`: the baseline for "moving the bytes".
void MemcpyAll(const TensorStorage& from, TensorStorage& to);
// The same on `threads` threads, each taking every threads-th 8 MiB chunk: what memory bandwidth
// allows a copy on that many cores (the baseline for the publisher's copy + hash).
void MemcpyAllThreads(const TensorStorage& from, TensorStorage& to, int threads);
// The publisher's copy threads for `copy_threads` (0: the library default).
int PublisherThreads(int64_t copy_threads);

// `count` tensors of `bytes` bytes each (uint8), named like model layers.
std::vector<TensorSpec> UniformTensors(int64_t count, uint64_t bytes);

using BenchClock = std::chrono::steady_clock;
inline double SecondsSince(BenchClock::time_point t) {
  return std::chrono::duration<double>(BenchClock::now() - t).count();
}

}  // namespace weightsync::bench
