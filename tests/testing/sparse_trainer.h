// SparseTrainer: a small host model whose steps change a chosen fraction of its elements — what
// an RL step does to published bf16 weights (docs/deltas.md). Shared by the delta and relay tests.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "weightsync/dtype.h"
#include "weightsync/tensor_view.h"

namespace weightsync::testing {

// A trainer's tensors: bf16, float32 and uint8 ones, one whose size is not a whole number of
// segments, and an empty one. Step() changes `fraction` of every tensor's elements.
class SparseTrainer {
 public:
  SparseTrainer() {
    Add("layers.0.w", DType::kBFloat16, {96, 128});
    Add("layers.0.b", DType::kFloat32, {1000});
    Add("layers.1.w", DType::kBFloat16, {40, 333});
    Add("embed.idx", DType::kUInt8, {5000});
    Add("empty", DType::kFloat32, {0});
    for (auto& bytes : storage_) {
      for (auto& b : bytes) b = static_cast<uint8_t>(rng_());
    }
  }
  std::vector<NamedTensor> Tensors() {
    std::vector<NamedTensor> out;
    for (size_t i = 0; i < names_.size(); ++i) {
      out.push_back({names_[i], TensorView{storage_[i].data(), dtypes_[i], shapes_[i]}});
    }
    return out;
  }
  // Changes each element with probability `fraction` (1: every one).
  void Step(double fraction) {
    std::bernoulli_distribution change(fraction);
    for (size_t i = 0; i < storage_.size(); ++i) {
      const uint32_t e = static_cast<uint32_t>(Info(dtypes_[i]).bits / 8);
      for (size_t at = 0; at + e <= storage_[i].size(); at += e) {
        if (!change(rng_)) continue;
        storage_[i][at] ^= static_cast<uint8_t>(1 + rng_() % 255);  // always a different element
      }
    }
  }
  uint64_t total_bytes() const {
    uint64_t t = 0;
    for (const auto& s : storage_) t += s.size();
    return t;
  }
  // Fresh poisoned destinations of the same manifest.
  std::vector<std::vector<uint8_t>> Poisoned() const {
    std::vector<std::vector<uint8_t>> out;
    for (const auto& s : storage_) out.emplace_back(s.size(), 0xFF);
    return out;
  }
  std::vector<NamedTensor> Views(std::vector<std::vector<uint8_t>>& storage) const {
    std::vector<NamedTensor> out;
    for (size_t i = 0; i < names_.size(); ++i) {
      out.push_back({names_[i], TensorView{storage[i].data(), dtypes_[i], shapes_[i]}});
    }
    return out;
  }
  // The first tensor again under another name (tied weights: one memory, two names).
  NamedTensor Tied() {
    return {"lm_head.weight", TensorView{storage_[0].data(), dtypes_[0], shapes_[0]}};
  }
  const std::vector<uint8_t>& First() const { return storage_[0]; }
  bool HeldBy(const std::vector<std::vector<uint8_t>>& dst) const { return dst == storage_; }
  std::vector<std::vector<uint8_t>> Snapshot() const { return storage_; }

 private:
  void Add(std::string name, DType dtype, std::vector<int64_t> shape) {
    uint64_t n = Info(dtype).bits / 8;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    names_.push_back(std::move(name));
    dtypes_.push_back(dtype);
    shapes_.push_back(std::move(shape));
    storage_.emplace_back(n);
  }
  std::mt19937_64 rng_{41};
  std::vector<std::string> names_;
  std::vector<DType> dtypes_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<std::vector<uint8_t>> storage_;
};

}  // namespace weightsync::testing
