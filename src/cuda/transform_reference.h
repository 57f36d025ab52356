// CPU references for the GPU transforms (kernels.h): bit-level float conversions written from the
// formats' definitions, not from CUDA's headers, and a blockwise fp8 quantizer that follows the
// same recipe as the kernel. The GPU tests compare the kernels against these bit for bit; a CPU
// peer can use them to check or reproduce a GPU result.
//
// Conversions to a narrower format round to nearest, ties to even. NaN results are the canonical
// NaN of the target (bfloat16/float16 0x7FFF, e4m3fn 0x7F), sign dropped.
#pragma once

#include <cstdint>

#include "cuda/kernels.h"
#include "weightsync/dtype.h"
#include "weightsync/status.h"

namespace weightsync::cuda::reference {

float BFloat16ToFloat(uint16_t bits);       // exact
float Float16ToFloat(uint16_t bits);        // exact
uint16_t FloatToBFloat16(float value);      // RNE; overflow rounds to ±inf
uint16_t FloatToFloat16(float value);       // RNE; |x| >= 65520 -> ±inf; subnormals kept
uint16_t BFloat16ToFloat16(uint16_t bits);  // through float32: one rounding
uint16_t Float16ToBFloat16(uint16_t bits);  // through float32: one rounding

// float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; 0x7F/0xFF NaN;
// largest finite ±448, smallest subnormal 2^-9.
// RNE with saturation to ±448 (any |x| >= 448, ±inf included); NaN -> 0x7F; the sign of zero and
// of values that round to zero is kept.
uint8_t FloatToE4M3FN(float value);
float E4M3FNToFloat(uint8_t bits);  // exact; NaN for 0x7F/0xFF

// float8_e8m0fnu: an unsigned biased exponent, value 2^(bits - 127); 0xFF is NaN.
float E8M0ToFloat(uint8_t bits);
// The e8m0 scale of a block whose largest magnitude is `amax`: the smallest power of two 2^e with
// amax / 2^e <= 448, clamped to e in [-127, 127]; 2^0 when amax is 0 (or NaN); 2^127 for +inf.
uint8_t E8M0ScaleFor(float amax);
// The float32 scale: amax / 448 (float32 division, rounded to nearest even); 1 when amax is 0.
float Float32ScaleFor(float amax);

// Casts `count` elements, from/to as PrepareCast takes them.
Status Cast(DType from, DType to, const void* src, void* dst, uint64_t count);

// The quantizer of PrepareQuantizeFp8, on the CPU: x is bf16 bits [rows, cols] row-major; q gets
// e4m3fn bits [rows, cols]; scales gets Fp8ScaleRows(rows) x Fp8ScaleCols(cols) float32 values or
// e8m0 bytes. amax of a block is the largest |x|, quiet and signaling NaNs ignored (as the device's
// fmaxf does).
Status QuantizeFp8(const uint16_t* x_bf16, int64_t rows, int64_t cols, uint8_t* q_e4m3,
                   void* scales, Fp8ScaleFormat format);

}  // namespace weightsync::cuda::reference
