#include "cuda/transform_reference.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace weightsync::cuda::reference {
namespace {

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t u) { return std::bit_cast<float>(u); }

// Shifts `m` right by `shift` (1..31) rounding to nearest, ties to even.
uint32_t ShiftRightRne(uint32_t m, int shift) {
  const uint32_t kept = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1))) ? 1 : 0);
}

}  // namespace

float BFloat16ToFloat(uint16_t bits) { return FromBits(static_cast<uint32_t>(bits) << 16); }

float Float16ToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  const uint32_t exp = (bits >> 10) & 0x1F;
  const uint32_t man = bits & 0x3FF;
  if (exp == 0x1F) return FromBits(sign | 0x7F800000 | (man << 13));  // inf, NaN (payload kept)
  if (exp != 0) return FromBits(sign | ((exp + 127 - 15) << 23) | (man << 13));
  // Zero or subnormal: man * 2^-24, exact in float32.
  const float mag = std::ldexp(static_cast<float>(man), -24);
  return sign ? -mag : mag;
}

uint16_t FloatToBFloat16(float value) {
  const uint32_t u = Bits(value);
  if ((u & 0x7FFFFFFF) > 0x7F800000) return 0x7FFF;
  // Round the low 16 bits away, ties to even; a carry moves into the exponent (up to inf).
  return static_cast<uint16_t>(ShiftRightRne(u & 0x7FFFFFFF, 16) | ((u >> 16) & 0x8000));
}

uint16_t FloatToFloat16(float value) {
  const uint32_t u = Bits(value);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7FFFFFFF;
  if (a > 0x7F800000) return 0x7FFF;
  if (a >= 0x477FF000) return sign | 0x7C00;  // >= 65520: rounds to inf (65504 + half ulp, tie up)
  if (a >= 0x38800000) {                      // >= 2^-14: normal half
    // Rebias the exponent, then round the 13 dropped mantissa bits; a carry may reach the
    // exponent, which stays below 31 because a < 65520.
    const uint32_t rebased = a - ((127u - 15u) << 23);
    return sign | static_cast<uint16_t>(ShiftRightRne(rebased, 13));
  }
  if (a <= 0x33000000) return sign;  // <= 2^-25: rounds to zero (2^-25 is a tie, to even 0)
  // Subnormal half: value = m * 2^(e - 150) with the implicit bit, in units of 2^-24.
  const int e = static_cast<int>(a >> 23);
  const uint32_t m = (a & 0x7FFFFF) | 0x800000;
  return sign | static_cast<uint16_t>(ShiftRightRne(m, 126 - e));
}

uint16_t BFloat16ToFloat16(uint16_t bits) { return FloatToFloat16(BFloat16ToFloat(bits)); }
uint16_t Float16ToBFloat16(uint16_t bits) { return FloatToBFloat16(Float16ToFloat(bits)); }

uint8_t FloatToE4M3FN(float value) {
  const uint32_t u = Bits(value);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t a = u & 0x7FFFFFFF;
  if (a > 0x7F800000) return 0x7F;          // NaN
  if (a >= 0x43E00000) return sign | 0x7E;  // >= 448 (inf too): saturate
  if (a >= 0x3C800000) {                    // >= 2^-6: normal e4m3
    const uint32_t rebased = a - ((127u - 7u) << 23);
    // < 448 never rounds past 0x7E: the largest value below it rounds to at most 448.
    return sign | static_cast<uint8_t>(ShiftRightRne(rebased, 20));
  }
  if (a <= 0x3A800000) return sign;  // <= 2^-10: rounds to zero (2^-10 is a tie, to even 0)
  // Subnormal e4m3: value = m * 2^(e - 150) in units of 2^-9; may round up to 2^-6 (0x08).
  const int e = static_cast<int>(a >> 23);
  const uint32_t m = (a & 0x7FFFFF) | 0x800000;
  return sign | static_cast<uint8_t>(ShiftRightRne(m, 141 - e));
}

float E4M3FNToFloat(uint8_t bits) {
  const bool negative = bits & 0x80;
  const int exp = (bits >> 3) & 0xF;
  const int man = bits & 0x7;
  float mag;
  if ((bits & 0x7F) == 0x7F) {
    mag = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    mag = std::ldexp(static_cast<float>(man), -9);
  } else {
    mag = std::ldexp(static_cast<float>(8 + man), exp - 7 - 3);
  }
  return negative ? -mag : mag;
}

float E8M0ToFloat(uint8_t bits) {
  if (bits == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(bits) - 127);
}

uint8_t E8M0ScaleFor(float amax) {
  if (!(amax > 0)) return 127;  // zero (or NaN): scale 1
  uint32_t u = Bits(amax);
  int exp = static_cast<int>((u >> 23) & 0xFF);
  uint32_t man = u & 0x7FFFFF;
  int e;
  if (exp == 0xFF) {
    e = 127;  // +inf: the largest scale
  } else {
    if (exp == 0) {  // subnormal: normalize so the leading 1 sits at bit 23
      const int shift = std::countl_zero(man) - 8;
      man = (man << shift) & 0x7FFFFF;
      exp = 1 - shift;
    }
    // amax = 1.man * 2^(exp - 127); 448 = 1.75 * 2^8. The smallest e with amax <= 1.75 * 2^(8+e):
    // e = exp - 135 when 1.man <= 1.75 (man <= 0x600000), else one more.
    e = exp - 127 - 8 + (man > 0x600000 ? 1 : 0);
  }
  e = std::clamp(e, -127, 127);
  return static_cast<uint8_t>(e + 127);
}

float Float32ScaleFor(float amax) { return amax > 0 ? amax / kE4M3Max : 1.0f; }

Status Cast(DType from, DType to, const void* src, void* dst, uint64_t count) {
  WS_ASSIGN_OR_RETURN(KernelId kernel, CastKernelFor(from, to));
  const auto* s16 = static_cast<const uint16_t*>(src);
  const auto* s32 = static_cast<const float*>(src);
  auto* d16 = static_cast<uint16_t*>(dst);
  auto* d32 = static_cast<float*>(dst);
  for (uint64_t i = 0; i < count; ++i) {
    switch (kernel) {
      case KernelId::kCastBF16ToF32:
        d32[i] = BFloat16ToFloat(s16[i]);
        break;
      case KernelId::kCastBF16ToF16:
        d16[i] = BFloat16ToFloat16(s16[i]);
        break;
      case KernelId::kCastF16ToF32:
        d32[i] = Float16ToFloat(s16[i]);
        break;
      case KernelId::kCastF16ToBF16:
        d16[i] = Float16ToBFloat16(s16[i]);
        break;
      case KernelId::kCastF32ToBF16:
        d16[i] = FloatToBFloat16(s32[i]);
        break;
      case KernelId::kCastF32ToF16:
        d16[i] = FloatToFloat16(s32[i]);
        break;
      default:
        return Status::Internal("cast reference: kernel ", static_cast<int>(kernel));
    }
  }
  return Status::Ok();
}

Status QuantizeFp8(const uint16_t* x_bf16, int64_t rows, int64_t cols, uint8_t* q_e4m3,
                   void* scales, Fp8ScaleFormat format) {
  if (rows < 0 || cols < 0) {
    return Status::InvalidArgument("quantize fp8 reference: negative shape [", rows, ", ", cols,
                                   "]");
  }
  const int64_t scale_cols = Fp8ScaleCols(cols);
  for (int64_t br = 0; br < Fp8ScaleRows(rows); ++br) {
    for (int64_t bc = 0; bc < scale_cols; ++bc) {
      const int64_t r0 = br * kFp8BlockSize, r1 = std::min(rows, r0 + kFp8BlockSize);
      const int64_t c0 = bc * kFp8BlockSize, c1 = std::min(cols, c0 + kFp8BlockSize);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          // Not std::fmax: glibc returns NaN when one operand is a signaling NaN (bf16 0x7F81..
          // 0x7FBF widen to one), the device's fmaxf ignores every NaN. A NaN is never > amax.
          const float v = std::fabs(BFloat16ToFloat(x_bf16[r * cols + c]));
          if (v > amax) amax = v;
        }
      }
      float scale;
      if (format == Fp8ScaleFormat::kE8M0) {
        const uint8_t e8m0 = E8M0ScaleFor(amax);
        static_cast<uint8_t*>(scales)[br * scale_cols + bc] = e8m0;
        scale = E8M0ToFloat(e8m0);
      } else {
        scale = Float32ScaleFor(amax);
        static_cast<float*>(scales)[br * scale_cols + bc] = scale;
      }
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          q_e4m3[r * cols + c] = FloatToE4M3FN(BFloat16ToFloat(x_bf16[r * cols + c]) / scale);
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace weightsync::cuda::reference
