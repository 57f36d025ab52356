#include "cuda/block_scaled_reference.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "cuda/kernels.h"
#include "cuda/transform_reference.h"

namespace weightsync::cuda::reference {
namespace {

// Element i of a bfloat16 or float32 array, as float32 (exact).
float Load(DType from, const void* x, int64_t i) {
  if (from == DType::kBFloat16) return BFloat16ToFloat(static_cast<const uint16_t*>(x)[i]);
  return static_cast<const float*>(x)[i];
}

Status CheckArguments(const char* what, DType from, int64_t rows, int64_t cols) {
  if (from != DType::kBFloat16 && from != DType::kFloat32) {
    return Status::InvalidArgument(what, " reference: converts bfloat16 or float32, not ",
                                   DTypeName(from));
  }
  if (rows < 0 || cols < 0) {
    return Status::InvalidArgument(what, " reference: negative shape [", rows, ", ", cols, "]");
  }
  return Status::Ok();
}

// The largest |x| of elements [begin, end), NaNs ignored (a NaN is never > amax), and whether
// one was there.
struct Amax {
  float value = 0.0f;
  bool nan = false;
};
Amax AmaxOf(DType from, const void* x, int64_t begin, int64_t end) {
  Amax a;
  for (int64_t i = begin; i < end; ++i) {
    const float v = std::fabs(Load(from, x, i));
    if (v > a.value) a.value = v;
    if (std::isnan(v)) a.nan = true;
  }
  return a;
}

void ZeroScales(uint8_t* scales, const ScaleShape& shape) {
  std::memset(scales, 0, static_cast<size_t>(shape.bytes()));
}

}  // namespace

uint8_t FloatToE2M1(float value) {
  if (std::isnan(value)) return 0x7;
  const uint8_t sign = std::signbit(value) ? 0x8 : 0x0;
  const float a = std::fabs(value);
  // The midpoints between neighbouring magnitudes; on a midpoint the even code wins, so the
  // comparison is <= where the lower code is even and < where it is odd.
  uint8_t code;
  if (a <= 0.25f) {
    code = 0;
  } else if (a < 0.75f) {
    code = 1;
  } else if (a <= 1.25f) {
    code = 2;
  } else if (a < 1.75f) {
    code = 3;
  } else if (a <= 2.5f) {
    code = 4;
  } else if (a < 3.5f) {
    code = 5;
  } else if (a <= 5.0f) {
    code = 6;
  } else {
    code = 7;  // (5, inf]: 6, saturating
  }
  return sign | code;
}

float E2M1ToFloat(uint8_t bits) {
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float mag = kMagnitude[bits & 0x7];
  return (bits & 0x8) ? -mag : mag;
}

uint8_t Mxfp8ScaleFor(float amax) {
  if (std::isinf(amax)) return 254;  // floor(log2(inf)) clamps to 127
  // floor(log2(amax)) = biased exponent - 127 for a normal float; zero and subnormals lie below
  // 2^-126, so shared_exp = that - 8 clamps to -127 for them. e8m0 bits = shared_exp + 127.
  const int biased = static_cast<int>((std::bit_cast<uint32_t>(amax) >> 23) & 0xFF);
  return static_cast<uint8_t>(std::clamp(biased - 8, 0, 254));
}

Nvfp4TensorScale Nvfp4TensorScaleFor(float amax) {
  const float limit = kE2M1Max * kE4M3Max;
  const float encode = limit / amax;
  if (!(amax > 0) || !std::isfinite(amax) || !std::isfinite(encode)) return {};
  return {encode, amax / limit};
}

Status QuantizeMxfp8(DType from, const void* x, int64_t rows, int64_t cols, uint8_t* values,
                     uint8_t* scales, ScaleLayout layout) {
  WS_RETURN_IF_ERROR(CheckArguments("MXFP8", from, rows, cols));
  const ScaleShape shape = ScaleShapeFor(BlockFormat::kMxfp8, layout, rows, cols);
  ZeroScales(scales, shape);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < BlocksPerRow(BlockFormat::kMxfp8, cols); ++b) {
      const int64_t begin = r * cols + b * kMxfp8BlockSize;
      const int64_t end = r * cols + std::min(cols, (b + 1) * kMxfp8BlockSize);
      const uint8_t scale = Mxfp8ScaleFor(AmaxOf(from, x, begin, end).value);
      scales[ScaleOffset(layout, shape, r, b)] = scale;
      // x / 2^shared_exp: a multiplication by a power of two, rounded once (only when the
      // quotient is a float32 subnormal, far below e4m3's smallest value).
      for (int64_t i = begin; i < end; ++i) {
        values[i] = FloatToE4M3FN(std::ldexp(Load(from, x, i), 127 - static_cast<int>(scale)));
      }
    }
  }
  return Status::Ok();
}

Status QuantizeNvfp4(DType from, const void* x, int64_t rows, int64_t cols, uint8_t* values,
                     uint8_t* scales, float* global_scale, ScaleLayout layout) {
  WS_RETURN_IF_ERROR(CheckArguments("NVFP4", from, rows, cols));
  const ScaleShape shape = ScaleShapeFor(BlockFormat::kNvfp4, layout, rows, cols);
  ZeroScales(scales, shape);
  const Nvfp4TensorScale tensor = Nvfp4TensorScaleFor(AmaxOf(from, x, 0, rows * cols).value);
  *global_scale = tensor.global;
  const int64_t row_bytes = ValueBytesPerRow(BlockFormat::kNvfp4, cols);
  std::memset(values, 0, static_cast<size_t>(rows * row_bytes));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < BlocksPerRow(BlockFormat::kNvfp4, cols); ++b) {
      const int64_t c0 = b * kNvfp4BlockSize, c1 = std::min(cols, c0 + kNvfp4BlockSize);
      const Amax amax = AmaxOf(from, x, r * cols + c0, r * cols + c1);
      const uint8_t scale = FloatToE4M3FN((amax.value / kE2M1Max) * tensor.encode);
      const float decoded = E4M3FNToFloat(scale);
      const float factor = decoded > 0 ? tensor.encode / decoded : 0.0f;
      scales[ScaleOffset(layout, shape, r, b)] = amax.nan ? 0x7F : scale;
      for (int64_t c = c0; c < c1; ++c) {
        const uint8_t q = FloatToE2M1(Load(from, x, r * cols + c) * factor);
        values[r * row_bytes + c / 2] |= static_cast<uint8_t>(c % 2 ? q << 4 : q);
      }
    }
  }
  return Status::Ok();
}

Status DequantizeBlockScaled(BlockFormat format, const uint8_t* values, const uint8_t* scales,
                             float global_scale, int64_t rows, int64_t cols, ScaleLayout layout,
                             float* out) {
  if (rows < 0 || cols < 0) {
    return Status::InvalidArgument("dequantize reference: negative shape [", rows, ", ", cols, "]");
  }
  const ScaleShape shape = ScaleShapeFor(format, layout, rows, cols);
  const int64_t row_bytes = ValueBytesPerRow(format, cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t s = scales[ScaleOffset(layout, shape, r, c / BlockSize(format))];
      if (format == BlockFormat::kMxfp8) {
        out[r * cols + c] = E4M3FNToFloat(values[r * row_bytes + c]) * E8M0ToFloat(s);
      } else {
        const uint8_t byte = values[r * row_bytes + c / 2];
        const uint8_t q = c % 2 ? byte >> 4 : byte & 0xF;
        out[r * cols + c] = E2M1ToFloat(q) * E4M3FNToFloat(s) * global_scale;
      }
    }
  }
  return Status::Ok();
}

}  // namespace weightsync::cuda::reference
