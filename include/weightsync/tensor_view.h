// TensorView: a non-owning description of a contiguous tensor in host or GPU memory.
// The caller keeps the memory alive and must not free it while a Publisher or Subscriber that
// registered it is prepared (call Subscriber::Sleep() first).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "weightsync/dtype.h"
#include "weightsync/status.h"

namespace weightsync {

// Where a tensor's bytes live.
struct Device {
  enum class Kind : uint8_t { kCPU = 0, kCUDA = 1 };
  Kind kind = Kind::kCPU;
  int index = 0;  // CUDA device ordinal (kCUDA)
  bool is_cuda() const { return kind == Kind::kCUDA; }
  bool operator==(const Device&) const = default;
};
std::string DeviceString(const Device& device);  // "cpu", "cuda:1"

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;  // row-major, contiguous
  Device device;               // CPU unless said otherwise

  // Elements (product of shape, overflow-checked; negative dims rejected).
  Result<uint64_t> NumElements() const;
  Result<uint64_t> NumBytes() const;
};

// "[4096, 11008]"
std::string ShapeString(const std::vector<int64_t>& shape);

// Where a registered tensor's elements sit in a larger, global tensor (weightsync/region.h has
// the helpers that build the usual layouts). Coordinates are elements, per dimension.
struct RegionPart {
  std::string tensor;                 // the global tensor's name; empty: the registered name
  std::vector<int64_t> global_shape;  // the global tensor's shape (same number of dims)
  std::vector<int64_t> offset;        // where the part starts in the global tensor
  std::vector<int64_t> extent;        // the part's shape; empty: the registered tensor's (one part)
  std::vector<int64_t> at;            // where the part starts in the registered tensor; empty: 0s
  bool operator==(const RegionPart&) const = default;
};

// A subscriber's destination that holds block-scaled weights (SubscriberOptions::convert_dtypes
// on; docs/quantized.md): the format, and where the scales go. The published tensor is bfloat16
// or float32 [..., cols]; the rows are every dimension but the last, blocks run along the last.
//   kMxfp8: the destination is float8_e4m3fn of the published shape; the scales float8_e8m0fnu
//     (or uint8), one per 32 elements of a row.
//   kNvfp4: the destination is float4_e2m1fn of the published shape (cols even: two per byte,
//     the even element in the low nibble); the scales float8_e4m3fn (or uint8), one per 16
//     elements; and one float32 global scale (shape [] or [1]).
// kNone (the default): the dtypes alone decide (bfloat16 -> float8_e4m3fn: 128x128 blocks).
struct Quantization {
  enum class Format : uint8_t { kNone, kMxfp8, kNvfp4 };
  enum class ScaleLayout : uint8_t {
    kRowMajor,       // [rows, blocks per row]: what checkpoints store
    kSwizzled128x4,  // cuBLAS/CUTLASS block-scaled GEMMs: rows padded to 128, blocks to 4
  };
  Format format = Format::kNone;
  ScaleLayout scale_layout = ScaleLayout::kRowMajor;
  std::string scales;        // the scale tensor's name; empty: NAME + fp8_scale_suffix
  std::string global_scale;  // kNvfp4: the global scale's name; empty: NAME + "_scale_2"
  bool operator==(const Quantization&) const = default;
};

struct NamedTensor {
  std::string name;
  TensorView view;
  // Empty: this is the whole tensor `name`. A publisher's tensor: one part, the region of a global
  // tensor it holds (extent = its shape). A subscriber's destination: the parts that together
  // write every one of its elements exactly once (a fused destination has several).
  std::vector<RegionPart> regions;
  // A subscriber's destination only: block-scaled quantized weights (not with regions yet).
  Quantization quantization;
};

}  // namespace weightsync
