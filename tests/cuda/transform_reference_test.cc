// The CPU references of the GPU transforms (src/cuda/transform_reference.h) against known values,
// against brute force over the target formats, and for the fp8 scale rules and error bound.
#include "cuda/transform_reference.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "testing/test_util.h"

namespace weightsync::cuda::reference {
namespace {

float F(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t B(float f) { return std::bit_cast<uint32_t>(f); }

// ---- brute force: nearest representable value, ties to the even code ----------------------------

// The finite values of a format, indexed by code: decode(code) for all non-NaN codes.
struct Table {
  std::vector<uint32_t> codes;
  std::vector<double> values;
};

Table FiniteE4M3() {
  Table t;
  for (uint32_t c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    t.codes.push_back(c);
    t.values.push_back(E4M3FNToFloat(static_cast<uint8_t>(c)));
  }
  return t;
}

// RNE by search: the closest value; on a tie the code whose lowest mantissa bit is 0; zero keeps
// the input's sign.
uint32_t NearestEven(const Table& t, double x) {
  double best = std::numeric_limits<double>::infinity();
  uint32_t code = 0;
  for (size_t i = 0; i < t.codes.size(); ++i) {
    const double d = std::fabs(t.values[i] - x);
    if (d < best || (d == best && (t.codes[i] & 1) == 0 && (code & 1) == 1)) {
      best = d;
      code = t.codes[i];
    }
  }
  return code;
}

uint8_t BruteE4M3(const Table& t, float x) {
  if (std::isnan(x)) return 0x7F;
  if (std::fabs(x) >= 448.0f) return std::signbit(x) ? 0xFE : 0x7E;  // saturate
  uint32_t code = NearestEven(t, x);
  if ((code & 0x7F) == 0) code = std::signbit(x) ? 0x80 : 0x00;  // zero keeps the sign
  return static_cast<uint8_t>(code);
}

// ---- bfloat16 / float16
// --------------------------------------------------------------------------

TEST(CastReferenceTest, DecodesKnownValues) {
  EXPECT_EQ(BFloat16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0xC000), -2.0f);
  EXPECT_TRUE(std::isinf(BFloat16ToFloat(0x7F80)));
  EXPECT_EQ(BFloat16ToFloat(0x0001), F(0x00010000));
  EXPECT_EQ(Float16ToFloat(0x3C00), 1.0f);
  EXPECT_EQ(Float16ToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(Float16ToFloat(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(Float16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(Float16ToFloat(0x83FF), -std::ldexp(1023.0f, -24));
  EXPECT_EQ(B(Float16ToFloat(0x8000)), 0x80000000u);
  EXPECT_TRUE(std::isinf(Float16ToFloat(0xFC00)) && Float16ToFloat(0xFC00) < 0);
  EXPECT_TRUE(std::isnan(Float16ToFloat(0x7E00)));
}

TEST(CastReferenceTest, FloatToBFloat16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBFloat16(F(0x3F808000)), 0x3F80);  // tie, even stays
  EXPECT_EQ(FloatToBFloat16(F(0x3F818000)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(FloatToBFloat16(F(0x3F808001)), 0x3F81);  // above the tie
  EXPECT_EQ(FloatToBFloat16(F(0xBF80FFFF)), 0xBF81);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7F80);  // overflow to inf
  EXPECT_EQ(FloatToBFloat16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()), 0x7FFF);
  EXPECT_EQ(FloatToBFloat16(F(0xFFC00001)), 0x7FFF);  // negative NaN: canonical
  EXPECT_EQ(FloatToBFloat16(F(0x00008000)), 0x0000);  // tiny subnormal tie, to even 0
  EXPECT_EQ(FloatToBFloat16(F(0x80018000)), 0x8002);
}

TEST(CastReferenceTest, FloatToFloat16RoundsToNearestEven) {
  EXPECT_EQ(FloatToFloat16(1.0f), 0x3C00);
  EXPECT_EQ(FloatToFloat16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie, even
  EXPECT_EQ(FloatToFloat16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie, odd up
  EXPECT_EQ(FloatToFloat16(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToFloat16(F(0x477FEFFF)), 0x7BFF);  // just below 65520
  EXPECT_EQ(FloatToFloat16(65520.0f), 0x7C00);       // tie between 65504 and inf: inf
  EXPECT_EQ(FloatToFloat16(-1e10f), 0xFC00);
  EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -25)), 0x0000);      // tie, to even 0
  EXPECT_EQ(FloatToFloat16(std::ldexp(3.0f, -26)), 0x0001);      // 0.75 ulp: up to 1
  EXPECT_EQ(FloatToFloat16(std::ldexp(3.0f, -25)), 0x0002);      // 1.5 ulp, tie, to even 2
  EXPECT_EQ(FloatToFloat16(-std::ldexp(1023.5f, -24)), 0x8400);  // rounds up into normal
  EXPECT_EQ(FloatToFloat16(std::numeric_limits<float>::quiet_NaN()), 0x7FFF);
  EXPECT_EQ(FloatToFloat16(-0.0f), 0x8000);
}

TEST(CastReferenceTest, EveryFinite16BitPatternSurvivesARoundTripThroughFloat32) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const float f16 = Float16ToFloat(bits);
    if (!std::isnan(f16)) {
      ASSERT_EQ(FloatToFloat16(f16), bits) << std::hex << h;
    } else {
      ASSERT_EQ(FloatToFloat16(f16), 0x7FFF);
    }
    const float bf = BFloat16ToFloat(bits);
    if (!std::isnan(bf)) {
      ASSERT_EQ(FloatToBFloat16(bf), bits) << std::hex << h;
    } else {
      ASSERT_EQ(FloatToBFloat16(bf), 0x7FFF);
    }
  }
}

TEST(CastReferenceTest, NarrowingMatchesDoublePrecisionNearestEven) {
  // For random float32 inputs, the reference must pick the nearest 16-bit value (ties to even),
  // found here by looking at the two neighbours in double precision.
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    float x = F(rng());
    if (std::isnan(x)) continue;
    // float16
    {
      const uint16_t h = FloatToFloat16(x);
      const double got = Float16ToFloat(h);
      if (std::fabs(x) < 65520.0) {
        ASSERT_FALSE(std::isinf(got)) << x;
        // Any other finite float16 is no closer.
        const uint16_t up = static_cast<uint16_t>(h + 1), down = static_cast<uint16_t>(h - 1);
        for (uint16_t n : {up, down}) {
          const double other = Float16ToFloat(n);
          if (std::isnan(other) || std::isinf(other) || ((n ^ h) & 0x8000)) continue;
          const double dg = std::fabs(got - x), dn = std::fabs(other - x);
          ASSERT_TRUE(dg < dn || (dg == dn && (h & 1) == 0)) << x << " " << std::hex << h;
        }
      } else {
        ASSERT_TRUE(std::isinf(got)) << x;
      }
    }
    // bfloat16
    {
      const uint16_t b = FloatToBFloat16(x);
      const double got = BFloat16ToFloat(b);
      if (!std::isinf(got)) {
        for (uint16_t n : {static_cast<uint16_t>(b + 1), static_cast<uint16_t>(b - 1)}) {
          const double other = BFloat16ToFloat(n);
          if (std::isnan(other) || std::isinf(other) || ((n ^ b) & 0x8000)) continue;
          const double dg = std::fabs(got - x), dn = std::fabs(other - x);
          ASSERT_TRUE(dg < dn || (dg == dn && (b & 1) == 0)) << x << " " << std::hex << b;
        }
      }
    }
  }
}

TEST(CastReferenceTest, CastsThroughFloat32RoundOnce) {
  // bf16 -> f16: exact through float32, so one rounding. 0x3F81 = 1.0078125 is exact in f16.
  EXPECT_EQ(BFloat16ToFloat16(0x3F81), 0x3C08);
  EXPECT_EQ(BFloat16ToFloat16(0x4780), 0x7C00);      // 65536 -> inf
  EXPECT_EQ(BFloat16ToFloat16(0x3380), 0x0001);      // 2^-24
  EXPECT_EQ(Float16ToBFloat16(0x3C01), 0x3F80);      // 1 + 2^-10 -> 1 (below the bf16 half ulp)
  EXPECT_EQ(Float16ToBFloat16(0x3C03), 0x3F80 + 0);  // 1 + 3*2^-10: 1.0029 -> 1.0 (ulp 2^-7)
  EXPECT_EQ(Float16ToBFloat16(0x3C04), 0x3F80);      // 1 + 2^-8: tie, to even
  EXPECT_EQ(Float16ToBFloat16(0x3C0C), 0x3F82);      // 1 + 3*2^-8: tie, odd up
  uint16_t in[4] = {0x3F80, 0xC000, 0x7F80, 0x0000};
  float out[4];
  ASSERT_OK(Cast(DType::kBFloat16, DType::kFloat32, in, out, 4));
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  ASSERT_STATUS_IS(kInvalidArgument, Cast(DType::kFloat32, DType::kFloat32, in, out, 4));
}

// ---- float8 e4m3fn
// -------------------------------------------------------------------------------

TEST(Fp8ReferenceTest, EncodesKnownValues) {
  EXPECT_EQ(FloatToE4M3FN(1.0f), 0x38);
  EXPECT_EQ(FloatToE4M3FN(-1.0f), 0xB8);
  EXPECT_EQ(FloatToE4M3FN(448.0f), 0x7E);
  EXPECT_EQ(FloatToE4M3FN(-448.0f), 0xFE);
  EXPECT_EQ(FloatToE4M3FN(449.0f), 0x7E);  // saturates, never NaN
  EXPECT_EQ(FloatToE4M3FN(464.0f), 0x7E);
  EXPECT_EQ(FloatToE4M3FN(1e30f), 0x7E);
  EXPECT_EQ(FloatToE4M3FN(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(FloatToE4M3FN(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(FloatToE4M3FN(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(FloatToE4M3FN(-std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(FloatToE4M3FN(432.0f), 0x7E);                // tie between 416 (0x7D) and 448: to even
  EXPECT_EQ(FloatToE4M3FN(1.0625f), 0x38);               // tie between 1 and 1.125: to even 1
  EXPECT_EQ(FloatToE4M3FN(1.1875f), 0x3A);               // tie between 1.125 and 1.25: to even 1.25
  EXPECT_EQ(FloatToE4M3FN(std::ldexp(1.0f, -6)), 0x08);  // smallest normal
  EXPECT_EQ(FloatToE4M3FN(std::ldexp(1.0f, -9)), 0x01);  // smallest subnormal
  EXPECT_EQ(FloatToE4M3FN(std::ldexp(7.0f, -9)), 0x07);  // largest subnormal
  EXPECT_EQ(FloatToE4M3FN(std::ldexp(7.5f, -9)), 0x08);  // tie, odd 7 up to 8 (normal)
  EXPECT_EQ(FloatToE4M3FN(std::ldexp(1.0f, -10)), 0x00);   // tie between 0 and 2^-9: 0
  EXPECT_EQ(FloatToE4M3FN(std::ldexp(3.0f, -11)), 0x01);   // above the tie
  EXPECT_EQ(FloatToE4M3FN(std::ldexp(3.0f, -10)), 0x02);   // 1.5 units: tie, to even 2
  EXPECT_EQ(FloatToE4M3FN(-std::ldexp(1.0f, -12)), 0x80);  // underflow keeps the sign
  EXPECT_EQ(FloatToE4M3FN(-0.0f), 0x80);
  EXPECT_EQ(FloatToE4M3FN(0.0f), 0x00);
}

TEST(Fp8ReferenceTest, EveryCodeRoundTrips) {
  for (uint32_t c = 0; c < 256; ++c) {
    const float v = E4M3FNToFloat(static_cast<uint8_t>(c));
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    EXPECT_EQ(FloatToE4M3FN(v), c) << c << " = " << v;
  }
  EXPECT_EQ(E4M3FNToFloat(0x7E), 448.0f);
  EXPECT_EQ(E4M3FNToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(E4M3FNToFloat(0x5F), 30.0f);  // exp 11, mantissa 7: 1.875 * 2^4
}

TEST(Fp8ReferenceTest, MatchesBruteForceNearestEven) {
  const Table table = FiniteE4M3();
  std::mt19937 rng(11);
  std::vector<float> xs;
  // Every midpoint and neighbour of every pair of adjacent codes, and random values of all sizes.
  for (size_t i = 0; i + 1 < table.values.size(); ++i) {
    const double a = table.values[i], b = table.values[i + 1];
    if (std::signbit(a) != std::signbit(b) || a == b) continue;
    const float mid = static_cast<float>((a + b) / 2);
    xs.insert(xs.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f),
                         std::nextafter(mid, -1e9f)});
  }
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-14, 10);
  for (int i = 0; i < 300000; ++i) {
    const float m = std::ldexp(mant(rng), expo(rng));
    xs.push_back(rng() & 1 ? -m : m);
  }
  for (float x : xs) {
    ASSERT_EQ(FloatToE4M3FN(x), BruteE4M3(table, x)) << x;
  }
}

// ---- scales -----------------------------------------------------------------------------------

TEST(Fp8ReferenceTest, E8M0ScaleIsTheSmallestPowerOfTwoThatFits) {
  EXPECT_EQ(E8M0ScaleFor(448.0f), 127);  // 2^0
  EXPECT_EQ(E8M0ScaleFor(std::nextafter(448.0f, 1e9f)), 128);
  EXPECT_EQ(E8M0ScaleFor(449.0f), 128);
  EXPECT_EQ(E8M0ScaleFor(224.0f), 126);
  EXPECT_EQ(E8M0ScaleFor(1.0f), 119);  // 1 * 2^8 = 256 <= 448 < 512
  EXPECT_EQ(E8M0ScaleFor(0.0f), 127);  // all-zero block: scale 1
  EXPECT_EQ(E8M0ScaleFor(std::numeric_limits<float>::infinity()), 254);
  EXPECT_EQ(E8M0ScaleFor(std::numeric_limits<float>::max()), 247);       // 2^120
  EXPECT_EQ(E8M0ScaleFor(std::numeric_limits<float>::denorm_min()), 0);  // clamped to 2^-127
  EXPECT_EQ(E8M0ToFloat(127), 1.0f);
  EXPECT_EQ(E8M0ToFloat(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(E8M0ToFloat(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(E8M0ToFloat(255)));

  std::mt19937 rng(3);
  for (int i = 0; i < 200000; ++i) {
    const float amax = std::fabs(F(rng() & 0x7FFFFFFF));
    if (!(amax > 0) || std::isinf(amax) || std::isnan(amax)) continue;
    const uint8_t bits = E8M0ScaleFor(amax);
    const int e = int(bits) - 127;
    // Exact in double: amax / 2^e <= 448 and, unless clamped, amax / 2^(e-1) > 448.
    ASSERT_LE(std::ldexp(double(amax), -e), 448.0) << amax;
    if (e > -127) {
      ASSERT_GT(std::ldexp(double(amax), -(e - 1)), 448.0) << amax;
    }
  }
}

TEST(Fp8ReferenceTest, Float32ScaleIsAmaxOver448) {
  EXPECT_EQ(Float32ScaleFor(448.0f), 1.0f);
  EXPECT_EQ(Float32ScaleFor(896.0f), 2.0f);
  EXPECT_EQ(Float32ScaleFor(0.0f), 1.0f);
  EXPECT_EQ(Float32ScaleFor(1.0f), 1.0f / 448.0f);
}

// ---- the blockwise quantizer -------------------------------------------------------------------

TEST(Fp8QuantizeReferenceTest, SmallMatrixKnownValues) {
  // 2 x 3, one block. amax 896: float32 scale 2, e8m0 scale 2^1.
  const float x[6] = {1.0f, -2.0f, 448.0f, 896.0f, 0.5f, 0.0f};
  uint16_t xb[6];
  for (int i = 0; i < 6; ++i) xb[i] = FloatToBFloat16(x[i]);
  const uint8_t want[6] = {0x30, 0xB8, 0x76, 0x7E, 0x28, 0x00};  // 0.5, -1, 224, 448, 0.25, 0
  uint8_t q[6];
  float scale_f32 = 0;
  ASSERT_OK(QuantizeFp8(xb, 2, 3, q, &scale_f32, Fp8ScaleFormat::kFloat32));
  EXPECT_EQ(scale_f32, 2.0f);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(q[i], want[i]) << i;
  uint8_t scale_e8m0 = 0;
  ASSERT_OK(QuantizeFp8(xb, 2, 3, q, &scale_e8m0, Fp8ScaleFormat::kE8M0));
  EXPECT_EQ(scale_e8m0, 128);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(q[i], want[i]) << i;

  // amax 500: float32 scale 500/448 puts 500 at exactly 448; e8m0 rounds the scale up to 2.
  xb[3] = FloatToBFloat16(500.0f);
  ASSERT_OK(QuantizeFp8(xb, 2, 3, q, &scale_f32, Fp8ScaleFormat::kFloat32));
  EXPECT_EQ(scale_f32, 500.0f / 448.0f);
  EXPECT_EQ(q[3], 0x7E);
  ASSERT_OK(QuantizeFp8(xb, 2, 3, q, &scale_e8m0, Fp8ScaleFormat::kE8M0));
  EXPECT_EQ(scale_e8m0, 128);
  EXPECT_EQ(q[3], FloatToE4M3FN(250.0f));
}

TEST(Fp8QuantizeReferenceTest, E8M0NearTheTopOfTheFloatRange) {
  // The largest bf16 (0x7F7F = 255 * 2^120) gets scale 2^120 and rounds to 256: the dequantized
  // value 2^128 exists only in a wider type (float32 overflows to inf). Dequantize in double.
  const uint16_t x[2] = {0x7F7F, 0x3F80};
  uint8_t q[2], scale = 0;
  ASSERT_OK(QuantizeFp8(x, 1, 2, q, &scale, Fp8ScaleFormat::kE8M0));
  EXPECT_EQ(scale, 127 + 120);
  EXPECT_EQ(q[0], FloatToE4M3FN(256.0f));
  EXPECT_EQ(q[1], 0x00);  // 1 / 2^120 underflows
  EXPECT_EQ(std::ldexp(double(E4M3FNToFloat(q[0])), 120), std::ldexp(1.0, 128));
}

// A block's amax ignores NaNs, signaling ones included: bf16 0x7FAF widens to a float32 signaling
// NaN, on which std::fmax returns NaN (and so forgot the larger values met before it, the GPU
// convert test's mismatch on random bit patterns). The device's fmaxf ignores both kinds.
TEST(Fp8QuantizeReferenceTest, AmaxIgnoresQuietAndSignalingNaNs) {
  const uint16_t big = FloatToBFloat16(896.0f), small = FloatToBFloat16(2.0f);
  for (uint16_t nan : {uint16_t{0x7FAF}, uint16_t{0xFF81}, uint16_t{0x7FC0}, uint16_t{0xFFFF}}) {
    const uint16_t x[4] = {big, nan, small, nan};
    uint8_t q[4];
    float scale = 0;
    ASSERT_OK(QuantizeFp8(x, 1, 4, q, &scale, Fp8ScaleFormat::kFloat32));
    EXPECT_EQ(scale, 2.0f) << std::hex << nan;
    EXPECT_EQ(q[0], 0x7E) << std::hex << nan;  // 896 / 2 = 448
    EXPECT_EQ(q[2], FloatToE4M3FN(1.0f)) << std::hex << nan;
    EXPECT_EQ(q[1] & 0x7F, 0x7F) << std::hex << nan;  // NaN stays NaN
    uint8_t e8m0 = 0;
    ASSERT_OK(QuantizeFp8(x, 1, 4, q, &e8m0, Fp8ScaleFormat::kE8M0));
    EXPECT_EQ(e8m0, 128) << std::hex << nan;
  }
}

// The bound dequantization keeps: with y = x / s rounded to e4m3 (3 mantissa bits) and no
// saturation beyond rounding, |q(y) - y| <= 2^-4 |y| for |y| >= 2^-6 (half an ulp, relative) and
// <= 2^-10 below (half the subnormal spacing 2^-9). Times s:
//   |dequant - x| <= max(2^-4 |x|, 2^-10 s)
// plus float32 rounding of x / s and of q * s (relative 2^-24 each), covered by a 2^-20 slack.
void ExpectWithinBound(float x, double dequant, float scale) {
  const double bound =
      std::max(std::ldexp(std::fabs(double(x)), -4), std::ldexp(double(scale), -10)) *
      (1 + std::ldexp(1.0, -20));
  ASSERT_LE(std::fabs(dequant - double(x)), bound)
      << "x " << x << " dequant " << dequant << " scale " << scale;
}

TEST(Fp8QuantizeReferenceTest, EdgeBlocksScalesAndErrorBound) {
  const int64_t rows = 300, cols = 131;  // 3 x 2 blocks, both edges partial
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> x(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      // Blocks of very different magnitudes, one all zero, one tiny (subnormal e4m3 results).
      const int64_t block = (r / 128) * 2 + c / 128;
      float v = normal(rng) * std::ldexp(1.0f, int(block) * 7 - 20);
      if (block == 1) v = 0.0f;
      x[r * cols + c] = FloatToBFloat16(v);
    }
  }
  for (Fp8ScaleFormat format : {Fp8ScaleFormat::kFloat32, Fp8ScaleFormat::kE8M0}) {
    SCOPED_TRACE(format == Fp8ScaleFormat::kE8M0 ? "e8m0" : "float32");
    std::vector<uint8_t> q(rows * cols);
    std::vector<float> scales_f32(Fp8ScaleRows(rows) * Fp8ScaleCols(cols));
    std::vector<uint8_t> scales_e8m0(scales_f32.size());
    void* scales = format == Fp8ScaleFormat::kE8M0 ? static_cast<void*>(scales_e8m0.data())
                                                   : static_cast<void*>(scales_f32.data());
    ASSERT_OK(QuantizeFp8(x.data(), rows, cols, q.data(), scales, format));
    ASSERT_EQ(Fp8ScaleRows(rows), 3);
    ASSERT_EQ(Fp8ScaleCols(cols), 2);
    for (int64_t br = 0; br < 3; ++br) {
      for (int64_t bc = 0; bc < 2; ++bc) {
        float amax = 0;
        for (int64_t r = br * 128; r < std::min<int64_t>(rows, br * 128 + 128); ++r) {
          for (int64_t c = bc * 128; c < std::min<int64_t>(cols, bc * 128 + 128); ++c) {
            amax = std::max(amax, std::fabs(BFloat16ToFloat(x[r * cols + c])));
          }
        }
        const float scale = format == Fp8ScaleFormat::kE8M0 ? E8M0ToFloat(scales_e8m0[br * 2 + bc])
                                                            : scales_f32[br * 2 + bc];
        if (format == Fp8ScaleFormat::kE8M0) {
          EXPECT_EQ(scales_e8m0[br * 2 + bc], E8M0ScaleFor(amax));
        } else {
          EXPECT_EQ(scale, Float32ScaleFor(amax));
        }
        if (amax == 0) {
          EXPECT_EQ(scale, 1.0f);
        }
        for (int64_t r = br * 128; r < std::min<int64_t>(rows, br * 128 + 128); ++r) {
          for (int64_t c = bc * 128; c < std::min<int64_t>(cols, bc * 128 + 128); ++c) {
            const float xv = BFloat16ToFloat(x[r * cols + c]);
            const uint8_t code = q[r * cols + c];
            ASSERT_NE(code & 0x7F, 0x7F) << "NaN for a finite input";
            ExpectWithinBound(xv, double(E4M3FNToFloat(code)) * scale, scale);
            if (std::fabs(xv) == amax && amax > 0 && format == Fp8ScaleFormat::kFloat32) {
              EXPECT_EQ(code & 0x7F, 0x7E) << "the block's amax maps to 448";
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace weightsync::cuda::reference
