#include "harness/bench_pair.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "harness/pattern.h"

namespace weightsync::bench {

BenchPair::BenchPair(const std::vector<TensorSpec>& tensors, int copy_threads)
    : copy_threads_(copy_threads),
      bytes_(TotalBytes(tensors)),
      source_(tensors, 0),
      destination_(tensors, 0xFF) {
  static std::atomic<int> counter{0};
  endpoint_ = "local://weightsync-bench-" + std::to_string(::getpid()) + "-" +
              std::to_string(counter.fetch_add(1));
  for (size_t i = 0; i < source_.size(); ++i) {
    FillPattern(static_cast<uint32_t>(i), 0, source_.data(i), source_.bytes(i));
  }
}

BenchPair::~BenchPair() = default;

Result<std::unique_ptr<BenchPair>> BenchPair::Create(const std::vector<TensorSpec>& tensors,
                                                     int copy_threads, const std::string& endpoint,
                                                     int ring_buckets, uint64_t ring_bucket_bytes) {
  std::unique_ptr<BenchPair> pair(new BenchPair(tensors, copy_threads));
  if (!endpoint.empty()) pair->endpoint_ = endpoint;
  PublisherOptions po;
  po.endpoint = pair->endpoint_;
  po.copy_threads = copy_threads;
  po.ring_buckets = ring_buckets;
  po.ring_bucket_bytes = ring_bucket_bytes;
  pair->ring_ = ring_buckets > 0;
  WS_ASSIGN_OR_RETURN(pair->publisher_, Publisher::Create(po));
  pair->endpoint_ = pair->publisher_->endpoint();  // tcp://127.0.0.1:0 → the bound port
  WS_RETURN_IF_ERROR(pair->publisher_->Register(pair->source_.Views()));
  return pair;
}

Result<std::unique_ptr<Subscriber>> BenchPair::NewSubscriber(UpdateMode mode, bool verify) const {
  SubscriberOptions so;
  so.endpoint = endpoint_;
  so.mode = mode;
  so.verify = verify;
  so.copy_threads = copy_threads_;
  so.timeout = std::chrono::milliseconds(60000);
  WS_ASSIGN_OR_RETURN(auto subscriber, Subscriber::Create(so));
  WS_RETURN_IF_ERROR(subscriber->Register(destination_.Views()));
  return subscriber;
}

Result<int64_t> BenchPair::PublishNext() {
  if (ring_) WS_RETURN_IF_ERROR(publisher_->BeginWrite());
  WS_ASSIGN_OR_RETURN(last_publish_, publisher_->Publish(step_ + 1));
  return ++step_;
}

void MemcpyAll(const TensorStorage& from, TensorStorage& to) {
  for (size_t i = 0; i < from.size(); ++i) std::memcpy(to.data(i), from.data(i), from.bytes(i));
}

void MemcpyAllThreads(const TensorStorage& from, TensorStorage& to, int threads) {
  constexpr uint64_t kChunk = 8ull << 20;
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      uint64_t chunk = 0;
      for (size_t i = 0; i < from.size(); ++i) {
        for (uint64_t at = 0; at < from.bytes(i); at += kChunk, ++chunk) {
          if (chunk % threads != static_cast<uint64_t>(w)) continue;
          std::memcpy(to.data(i) + at, from.data(i) + at, std::min(kChunk, from.bytes(i) - at));
        }
      }
    });
  }
  for (std::thread& t : workers) t.join();
}

int PublisherThreads(int64_t copy_threads) {
  if (copy_threads > 0) return static_cast<int>(copy_threads);
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
}

std::vector<TensorSpec> UniformTensors(int64_t count, uint64_t bytes) {
  std::vector<TensorSpec> specs;
  for (int64_t i = 0; i < count; ++i) {
    specs.push_back({"model.layers." + std::to_string(i) + ".weight",
                     DType::kUInt8,
                     {static_cast<int64_t>(bytes)},
                     bytes});
  }
  return specs;
}

}  // namespace weightsync::bench
