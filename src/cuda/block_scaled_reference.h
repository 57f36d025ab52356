// CPU references for the block-scaled formats (block_scaled_format.h): MXFP8 from the OCP
// Microscaling Formats v1.0 specification, NVFP4 from its two-level definition. Written from the
// formats, not from CUDA's headers (tests/cuda/block_scaled_reference_test.cc checks them against
// brute force and against CUDA's own host conversions). The GPU kernels must equal them bit for
// bit; a host path converts with them.
//
// Input: bfloat16 or float32 elements, [rows, cols] row-major. Every amax ignores NaNs (as the
// device's fmaxf does).
//
// MXFP8, per block of 32 (OCP MX §6.3): shared_exp = floor(log2(amax)) - 8 (8: the exponent of
// e4m3's largest power of two), clamped to the e8m0 range [-127, 127] (amax 0 gives -127, +inf
// 127); each value is x / 2^shared_exp rounded to e4m3 (nearest, ties to even), saturating to
// ±448 — the spec's rule, so a block whose amax lies in [448, 512) * 2^shared_exp clamps its
// largest values. NaN stays NaN (e4m3 0x7F).
//
// NVFP4: the tensor's encode scale is enc = 6 * 448 / amax(tensor) (1 when that is not a finite
// positive number: an all-zero tensor, or an amax so small the quotient overflows); the float32
// global scale stored for the engine is amax / (6 * 448) (1 in the same cases): the dequantizing
// factor, as ModelOpt checkpoints store `weight_scale_2`. Per block of 16: s = e4m3((amax(block)
// / 6) * enc) (nearest even, saturating at 448); each value is e2m1(x * (enc / s)) (nearest even,
// saturating to ±6; a block whose s is 0 gets zeros). e2m1 has no NaN: as the hardware
// conversion does, a NaN value becomes +6, and the block's scale becomes NaN (0x7F) so the block
// dequantizes to NaN instead of to plausible numbers. Dequantized: e2m1 * s * global.
#pragma once

#include <cstdint>

#include "cuda/block_scaled_format.h"
#include "weightsync/dtype.h"
#include "weightsync/status.h"

namespace weightsync::cuda::reference {

// float4_e2m1: 1 sign, 2 exponent (bias 1), 1 mantissa bit; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4,
// 6; no infinities or NaN. Round to nearest, ties to even, saturating at ±6 (±inf too); NaN -> +6
// (0x7); zero keeps the sign.
uint8_t FloatToE2M1(float value);
float E2M1ToFloat(uint8_t bits);  // the low nibble; exact

// The e8m0 shared scale of an MXFP8 block whose largest magnitude is `amax` (the rule above).
uint8_t Mxfp8ScaleFor(float amax);

// NVFP4's tensor-wide scales for a tensor whose largest magnitude is `amax`.
struct Nvfp4TensorScale {
  float encode = 1.0f;  // multiplies the block amax / 6 into the e4m3 block scale
  float global = 1.0f;  // stored for the engine: dequantized = e2m1 * block scale * global
};
Nvfp4TensorScale Nvfp4TensorScaleFor(float amax);

// The whole conversion. `values` gets ValueBytesPerRow(format, cols) bytes per row; `scales`
// ScaleShapeFor(format, layout, rows, cols).bytes() bytes (padding included, written as 0).
// NVFP4 also writes `*global_scale`. `from` must be bfloat16 or float32.
Status QuantizeMxfp8(DType from, const void* x, int64_t rows, int64_t cols, uint8_t* values,
                     uint8_t* scales, ScaleLayout layout);
Status QuantizeNvfp4(DType from, const void* x, int64_t rows, int64_t cols, uint8_t* values,
                     uint8_t* scales, float* global_scale, ScaleLayout layout);

// Back to float32 [rows, cols] (round trips and error bounds in tests; a CPU peer checking a
// result). `global_scale` is NVFP4's only.
Status DequantizeBlockScaled(BlockFormat format, const uint8_t* values, const uint8_t* scales,
                             float global_scale, int64_t rows, int64_t cols, ScaleLayout layout,
                             float* out);

}  // namespace weightsync::cuda::reference
