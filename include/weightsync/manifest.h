// Manifest: what one side holds — names, dtypes, shapes and byte sizes, in registration order.
// Both sides build one at Register(); the plan matches them at the first update.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "weightsync/dtype.h"
#include "weightsync/status.h"
#include "weightsync/tensor_view.h"

namespace weightsync {

// Limits every decoder and every Register() enforces (also documented in docs/wire_format.md).
inline constexpr uint32_t kMaxTensors = 1u << 20;
inline constexpr uint32_t kMaxNameBytes = 1024;
inline constexpr uint32_t kMaxDims = 16;

struct TensorSpec {
  std::string name;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;  // derived from dtype and shape
  // Tied weights (Subscriber::PublishedManifest): the name of an earlier tensor of the same dtype
  // and shape whose bytes these are — one tensor the publisher serves under both names and moves
  // once, when the subscriber registers both names as one memory (an exact alias). Empty
  // otherwise.
  std::string alias_of;
};

class Manifest {
 public:
  // Validates names (non-empty, unique, ≤ kMaxNameBytes), dims (≤ kMaxDims, ≥ 0), byte sizes
  // (overflow-checked) and aliases (alias_of names an earlier tensor of the same dtype and shape
  // that is no alias itself), and fills each nbytes. One error lists every problem found.
  static Result<Manifest> Build(std::vector<TensorSpec> specs);
  static Result<Manifest> FromTensors(const std::vector<NamedTensor>& tensors);

  // Validates `specs` as Build does, their names also against the tensors already here, and
  // appends them: the cost is that of the new tensors only, so registering n tensors one call at
  // a time costs O(n) in all. On error nothing changes.
  Status Append(std::vector<TensorSpec> specs);
  // Removes the last `count` tensors (undoes an Append).
  void RemoveLast(size_t count);

  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  size_t size() const { return tensors_.size(); }
  uint64_t total_bytes() const { return total_bytes_; }
  // Index of `name`, or -1. O(1).
  int64_t Find(const std::string& name) const;

 private:
  std::vector<TensorSpec> tensors_;
  std::unordered_map<std::string, uint32_t> index_;  // name → position in tensors_
  uint64_t total_bytes_ = 0;
};

}  // namespace weightsync
