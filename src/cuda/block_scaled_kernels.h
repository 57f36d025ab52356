// MXFP8 and NVFP4 quantization on the GPU (issue 43): many tensors converted by one prepared
// group, equal bit for bit to the CPU references (block_scaled_reference.h, which states the
// arithmetic) and writing the same bytes: values, scales in the destination's layout (padding as
// zeros) and NVFP4's float32 global scale. Host code, no CUDA headers; in a CPU-only build
// PrepareQuantizeBlockScaledGroup returns Unavailable("built without CUDA").
//
// A launch is at most one memset and two kernels on the prepared stream, with nothing allocated:
// NVFP4's block scales depend on the whole tensor's amax, so when the group holds an NVFP4 tensor
// a first kernel reduces every such tensor's amax into a word of the group's scratch (zeroed
// first), and the quantize kernel reads it.
//
// Work split (block_scaled_kernels.cu): a thread takes 8 consecutive elements of a row (one
// 16-byte load of bf16, two of float32), so an MXFP8 block of 32 is 4 neighbouring lanes and an
// NVFP4 block of 16 is 2; they agree on the block's amax through warp shuffles. Each job's work
// is rounded up to whole warps, so a warp never straddles two tensors.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cuda/block_scaled_format.h"
#include "cuda/device.h"
#include "cuda/prepared_launch.h"
#include "weightsync/dtype.h"
#include "weightsync/status.h"

namespace weightsync::cuda {

// One tensor to convert: x[rows, cols] (bfloat16 or float32, row-major, device memory) into
// `values` (ValueBytesPerRow(format, cols) bytes a row), `scales` (ScaleShapeFor(format, layout,
// rows, cols).bytes() bytes) and, for NVFP4, the float32 at `global_scale`. Every pointer is
// memory this device reaches (its own, a peer's, mapped pinned host memory).
struct BlockScaledTensor {
  DType from = DType::kBFloat16;
  const void* x = nullptr;
  void* values = nullptr;
  void* scales = nullptr;
  void* global_scale = nullptr;  // NVFP4 only
  int64_t rows = 0, cols = 0;
  BlockFormat format = BlockFormat::kMxfp8;
  ScaleLayout layout = ScaleLayout::kRowMajor;
};

// The job table entry both kernels read (device memory, built at prepare time).
struct BlockScaledJob {
  const void* x;
  uint8_t* values;
  uint8_t* scales;
  float* global_scale;  // NVFP4: where the global scale goes
  uint32_t* amax;       // NVFP4: the tensor's amax (float bits) in the group's scratch
  int64_t rows, cols;
  int64_t scale_rows, scale_cols;  // ScaleShapeFor: padded when swizzled
  int64_t row_bytes;               // ValueBytesPerRow
  int64_t chunks_per_row;          // 8-element chunks over the (padded) scale columns
  uint64_t units;                  // quantize work items: scale_rows * chunks_per_row
  uint64_t first_unit;             // of the jobs before, each rounded up to a warp (32)
  uint64_t amax_units;             // NVFP4: 8-element chunks of x; 0 for MXFP8
  uint64_t first_amax_unit;        // likewise rounded
  uint8_t format;                  // BlockFormat
  uint8_t layout;                  // ScaleLayout
  uint8_t float32;                 // 1: x is float32, 0: bfloat16
  uint8_t x_aligned;               // x is 16-byte aligned: vector loads of whole chunks
  uint8_t vector;                  // x_aligned, cols % 8 == 0 and values aligned for the stores
  uint8_t reserved[3];
};

class PreparedBlockScaledGroup {
 public:
  PreparedBlockScaledGroup() = default;
  Status Launch();  // nothing to do for an empty group
  bool empty() const { return jobs_.empty(); }
  size_t tensors() const { return jobs_.size(); }
  uint64_t units() const { return units_; }

 private:
  friend Result<PreparedBlockScaledGroup> PrepareQuantizeBlockScaledGroup(
      std::span<const BlockScaledTensor>, StreamHandle);
  std::vector<BlockScaledJob> jobs_;  // host copy (kept: what the table holds)
  DeviceBuffer table_;
  DeviceBuffer amax_;  // one word per job (read only for NVFP4 ones)
  PreparedLaunch amax_launch_, quantize_launch_;
  uint64_t units_ = 0;
  bool has_nvfp4_ = false;
};

// InvalidArgument names the tensor (by its index in `tensors`) whose dtype is not bfloat16 or
// float32, whose shape is negative, or whose pointers the device cannot reach for their sizes.
// Allocates the job table and the amax scratch once, uploaded on `stream`.
Result<PreparedBlockScaledGroup> PrepareQuantizeBlockScaledGroup(
    std::span<const BlockScaledTensor> tensors, StreamHandle stream);

}  // namespace weightsync::cuda
