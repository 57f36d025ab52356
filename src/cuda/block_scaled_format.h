// The block-scaled formats engines serve quantized weights in (issue 43), besides the 128x128 fp8
// blocks of kernels.h: their block sizes, the shape of their value and scale tensors, and where a
// block's scale sits in each scale layout an engine's kernels read. Shared by the CPU reference
// (block_scaled_reference.h), the plan and the kernels, so all three agree on every offset.
//
// Both formats cut each row (the last dimension: the reduction dimension of a [out, in] weight)
// into blocks of consecutive elements; a row whose length is not a multiple of the block ends in
// a shorter block, quantized over the elements it has.
//   MXFP8 (OCP Microscaling Formats v1.0): float8_e4m3fn values, one float8_e8m0fnu scale (a
//     power of two) per 32 elements.
//   NVFP4: float4_e2m1 values packed two per byte (the even element in the low nibble), one
//     float8_e4m3fn scale per 16 elements, and one float32 scale for the whole tensor.
#pragma once

#include <cstdint>

// The shape and offset functions below run on both sides: the plan and the references call them
// on the host, the kernels (block_scaled_kernels.cu) on the device.
#if defined(__CUDACC__)
#define WS_HOST_DEVICE __host__ __device__
#else
#define WS_HOST_DEVICE
#endif

namespace weightsync::cuda {

enum class BlockFormat : uint8_t { kMxfp8, kNvfp4 };

// Where the scale of row r, block b goes in the scale tensor.
enum class ScaleLayout : uint8_t {
  // [rows, blocks per row], row-major: the layout checkpoints store (ModelOpt NVFP4
  // `weight_scale`, MX checkpoints) and engines load.
  kRowMajor,
  // The layout block-scaled GEMMs of cuBLAS and CUTLASS read (torch._scaled_mm with MX or NVFP4
  // operands; vLLM swizzles NVFP4 scales into it after loading): rows padded to a multiple of 128
  // and blocks per row to a multiple of 4, cut into 128x4 tiles stored one after the other (tiles
  // of one 128-row band first), each tile 512 bytes in which (r, c) sits at
  // (r % 32) * 16 + (r / 32) * 4 + c. Padding holds zeros.
  kSwizzled128x4,
};

inline constexpr int64_t kMxfp8BlockSize = 32;
inline constexpr int64_t kNvfp4BlockSize = 16;
inline constexpr float kE2M1Max = 6.0f;  // largest finite float4_e2m1

WS_HOST_DEVICE inline constexpr int64_t BlockSize(BlockFormat format) {
  return format == BlockFormat::kMxfp8 ? kMxfp8BlockSize : kNvfp4BlockSize;
}

// Scale blocks per row.
WS_HOST_DEVICE inline constexpr int64_t BlocksPerRow(BlockFormat format, int64_t cols) {
  return (cols + BlockSize(format) - 1) / BlockSize(format);
}

// Bytes of one row of values: one per element (MXFP8), one per two (NVFP4; an odd row's last
// byte has a zero high nibble).
WS_HOST_DEVICE inline constexpr int64_t ValueBytesPerRow(BlockFormat format, int64_t cols) {
  return format == BlockFormat::kMxfp8 ? cols : (cols + 1) / 2;
}

// The scale tensor's shape in a layout: [rows, blocks] row-major; swizzled, both padded.
struct ScaleShape {
  int64_t rows = 0, cols = 0;
  WS_HOST_DEVICE int64_t bytes() const { return rows * cols; }
};

WS_HOST_DEVICE inline constexpr int64_t RoundUp(int64_t n, int64_t to) {
  return (n + to - 1) / to * to;
}

WS_HOST_DEVICE inline constexpr ScaleShape ScaleShapeFor(BlockFormat format, ScaleLayout layout,
                                                         int64_t rows, int64_t cols) {
  const int64_t blocks = BlocksPerRow(format, cols);
  if (layout == ScaleLayout::kRowMajor) return {rows, blocks};
  return {RoundUp(rows, 128), RoundUp(blocks, 4)};
}

// The byte offset of row r's block b in the scale tensor of `shape` (from ScaleShapeFor).
WS_HOST_DEVICE inline constexpr int64_t ScaleOffset(ScaleLayout layout, const ScaleShape& shape,
                                                    int64_t r, int64_t b) {
  if (layout == ScaleLayout::kRowMajor) return r * shape.cols + b;
  const int64_t tile = (r / 128) * (shape.cols / 4) + b / 4;
  const int64_t in_band = r % 128;
  return tile * 512 + (in_band % 32) * 16 + (in_band / 32) * 4 + b % 4;
}

}  // namespace weightsync::cuda
