// Host memory for a model's tensors, for the demo's processes and the benchmarks' pairs: one
// buffer, each tensor 64-byte aligned, every page touched at construction.
#pragma once

#include <cstdint>
#include <vector>

#include "weightsync/manifest.h"
#include "weightsync/tensor_view.h"

namespace weightsync::bench {

class TensorStorage {
 public:
  // `tensors` must outlive the storage; every byte starts as `fill`.
  TensorStorage(const std::vector<TensorSpec>& tensors, uint8_t fill);
  std::vector<NamedTensor> Views() const;
  uint8_t* data(size_t i) { return buffer_.data() + offsets_[i]; }
  const uint8_t* data(size_t i) const { return buffer_.data() + offsets_[i]; }
  uint64_t bytes(size_t i) const { return (*tensors_)[i].nbytes; }
  size_t size() const { return offsets_.size(); }

 private:
  const std::vector<TensorSpec>* tensors_;
  std::vector<uint64_t> offsets_;
  std::vector<uint8_t> buffer_;
};

// Sum of the specs' nbytes.
uint64_t TotalBytes(const std::vector<TensorSpec>& specs);

}  // namespace weightsync::bench
