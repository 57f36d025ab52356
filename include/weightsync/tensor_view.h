// TensorView: a non-owning description of a contiguous CPU tensor (name-less).
// The caller keeps the memory alive and must not free it while a Publisher or Subscriber that
// registered it is prepared (call Subscriber::Sleep() first).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "weightsync/dtype.h"
#include "weightsync/status.h"

namespace weightsync {

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;  // row-major, contiguous

  // Elements (product of shape, overflow-checked; negative dims rejected).
  Result<uint64_t> NumElements() const;
  Result<uint64_t> NumBytes() const;
};

// "[4096, 11008]"
std::string ShapeString(const std::vector<int64_t>& shape);

struct NamedTensor {
  std::string name;
  TensorView view;
};

}  // namespace weightsync
