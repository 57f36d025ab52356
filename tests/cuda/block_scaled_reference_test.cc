// The CPU references of MXFP8 and NVFP4 (src/cuda/block_scaled_reference.h): e2m1 against brute
// force, the MX shared exponent against floor(log2) from <cmath>, whole tensors checked by hand
// (every value and scale byte), the scale layouts' offsets by hand, NaN, infinities, subnormals,
// awkward shapes, and the round-trip error each format promises.
#include "cuda/block_scaled_reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "cuda/kernels.h"
#include "cuda/transform_reference.h"

namespace weightsync::cuda::reference {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- e2m1 -------------------------------------------------------------------------------------

// Nearest e2m1 magnitude code by search; on a tie the even code.
uint8_t BruteE2M1(float x) {
  if (std::isnan(x)) return 0x7;
  const double a = std::fabs(static_cast<double>(x));
  uint8_t code = 7;
  if (a <= 6.0) {
    double best = std::numeric_limits<double>::infinity();
    for (uint8_t c = 0; c < 8; ++c) {
      const double d = std::fabs(E2M1ToFloat(c) - a);
      if (d < best || (d == best && (c & 1) == 0)) {
        best = d;
        code = c;
      }
    }
  }
  return static_cast<uint8_t>((std::signbit(x) ? 0x8 : 0x0) | code);
}

TEST(E2M1Reference, DecodesEveryCode) {
  const float magnitudes[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (uint8_t c = 0; c < 16; ++c) {
    EXPECT_EQ(E2M1ToFloat(c), (c & 8) ? -magnitudes[c & 7] : magnitudes[c & 7]) << int(c);
    EXPECT_EQ(FloatToE2M1(E2M1ToFloat(c)), c) << int(c);  // -0 keeps its sign
  }
}

TEST(E2M1Reference, TiesGoToTheEvenCodeAndLargeValuesSaturate) {
  EXPECT_EQ(FloatToE2M1(0.25f), 0x0);  // 0 | 0.5
  EXPECT_EQ(FloatToE2M1(0.75f), 0x2);  // 0.5 | 1
  EXPECT_EQ(FloatToE2M1(1.25f), 0x2);  // 1 | 1.5
  EXPECT_EQ(FloatToE2M1(1.75f), 0x4);  // 1.5 | 2
  EXPECT_EQ(FloatToE2M1(2.5f), 0x4);   // 2 | 3
  EXPECT_EQ(FloatToE2M1(3.5f), 0x6);   // 3 | 4
  EXPECT_EQ(FloatToE2M1(5.0f), 0x6);   // 4 | 6
  EXPECT_EQ(FloatToE2M1(-5.0f), 0xE);
  EXPECT_EQ(FloatToE2M1(5.0001f), 0x7);
  EXPECT_EQ(FloatToE2M1(1e30f), 0x7);
  EXPECT_EQ(FloatToE2M1(-kInf), 0xF);
  EXPECT_EQ(FloatToE2M1(kNaN), 0x7);  // as the hardware conversion: +6
  EXPECT_EQ(FloatToE2M1(-0.1f), 0x8);
}

TEST(E2M1Reference, EveryBFloat16AndRandomFloatsRoundToTheNearestEvenCode) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float x = BFloat16ToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(FloatToE2M1(x), BruteE2M1(x)) << std::hex << h;
  }
  std::mt19937 rng(43);
  std::uniform_real_distribution<float> near(-7.0f, 7.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = i % 2 ? near(rng) : std::bit_cast<float>(static_cast<uint32_t>(rng()));
    ASSERT_EQ(FloatToE2M1(x), BruteE2M1(x)) << x;
  }
}

// ---- MXFP8's shared exponent ------------------------------------------------------------------

TEST(Mxfp8Reference, TheSharedExponentIsFloorLog2OfAmaxLessEight) {
  std::mt19937 rng(41);
  for (int i = 0; i < 200000; ++i) {
    const float amax = std::fabs(std::bit_cast<float>(static_cast<uint32_t>(rng())));
    if (std::isnan(amax) || std::isinf(amax) || amax == 0) continue;
    const int expected = std::clamp(std::ilogb(amax) - 8, -127, 127) + 127;
    ASSERT_EQ(Mxfp8ScaleFor(amax), expected) << amax;
  }
  EXPECT_EQ(Mxfp8ScaleFor(0.0f), 0);      // floor(log2(0)) clamps to -127
  EXPECT_EQ(Mxfp8ScaleFor(kInf), 254);    // and +inf to 127
  EXPECT_EQ(Mxfp8ScaleFor(256.0f), 127);  // 2^8: scale 1
  EXPECT_EQ(Mxfp8ScaleFor(511.0f), 127);  // still 2^8: 511 clamps to 448
  EXPECT_EQ(Mxfp8ScaleFor(512.0f), 128);
  EXPECT_EQ(Mxfp8ScaleFor(1.0f), 119);  // 2^-8
}

// ---- the scale layouts ------------------------------------------------------------------------

TEST(ScaleLayout, SwizzledOffsetsAreTheCublasTilesAndCoverThePaddedTensor) {
  const ScaleShape shape = ScaleShapeFor(BlockFormat::kMxfp8, ScaleLayout::kSwizzled128x4, 130,
                                         7 * 32);  // 7 blocks per row
  EXPECT_EQ(shape.rows, 256);
  EXPECT_EQ(shape.cols, 8);
  // Worked by hand: tile = (r / 128) * (8 / 4) + b / 4; then (r % 32) * 16 + (r % 128 / 32) * 4.
  EXPECT_EQ(ScaleOffset(ScaleLayout::kSwizzled128x4, shape, 0, 0), 0);
  EXPECT_EQ(ScaleOffset(ScaleLayout::kSwizzled128x4, shape, 0, 3), 3);
  EXPECT_EQ(ScaleOffset(ScaleLayout::kSwizzled128x4, shape, 1, 0), 16);
  EXPECT_EQ(ScaleOffset(ScaleLayout::kSwizzled128x4, shape, 32, 0), 4);
  EXPECT_EQ(ScaleOffset(ScaleLayout::kSwizzled128x4, shape, 33, 5), 512 + 16 + 4 + 1);
  EXPECT_EQ(ScaleOffset(ScaleLayout::kSwizzled128x4, shape, 130, 2), 1024 + 2 * 16 + 2);
  std::set<int64_t> seen;
  for (int64_t r = 0; r < shape.rows; ++r) {
    for (int64_t b = 0; b < shape.cols; ++b) {
      const int64_t at = ScaleOffset(ScaleLayout::kSwizzled128x4, shape, r, b);
      ASSERT_GE(at, 0);
      ASSERT_LT(at, shape.bytes());
      ASSERT_TRUE(seen.insert(at).second) << r << "," << b;
    }
  }
  const ScaleShape plain = ScaleShapeFor(BlockFormat::kNvfp4, ScaleLayout::kRowMajor, 3, 33);
  EXPECT_EQ(plain.rows, 3);
  EXPECT_EQ(plain.cols, 3);  // 16 + 16 + 1
  EXPECT_EQ(ScaleOffset(ScaleLayout::kRowMajor, plain, 2, 1), 7);
}

// ---- whole tensors by hand --------------------------------------------------------------------

std::vector<uint16_t> BF16(const std::vector<float>& v) {
  std::vector<uint16_t> out;
  for (float f : v) out.push_back(FloatToBFloat16(f));
  return out;
}

TEST(Mxfp8Reference, AKnownTensorGivesTheScalesAndValuesWorkedByHand) {
  // 2 rows x 64: two blocks per row.
  std::vector<float> x(128, 0.0f);
  x[0] = 300.0f;  // amax 300 = 1.17 * 2^8: scale 2^0; 300 -> 288 (e4m3 steps of 32 there)
  x[1] = 1.0f;
  x[2] = -2.5f;
  x[32] = 500.0f;  // amax 500: scale 2^0 still; 500 clamps to 448 (the spec's rule)
  x[33] = 3.0f;
  x[64] = std::ldexp(1.0f, -10);  // amax 2^-10: scale 2^-18; 2^-10 -> 256
  x[65] = std::ldexp(1.0f, -13);  // -> 32
  // row 1, block 1: zeros: scale 2^-127, values 0
  const std::vector<uint16_t> in = BF16(x);
  std::vector<uint8_t> q(128), s(4);
  ASSERT_TRUE(
      QuantizeMxfp8(DType::kBFloat16, in.data(), 2, 64, q.data(), s.data(), ScaleLayout::kRowMajor)
          .ok());
  EXPECT_EQ(s, (std::vector<uint8_t>{127, 127, 127 - 18, 0}));
  EXPECT_EQ(q[0], 0x79);  // 288 = 1.125 * 2^8
  EXPECT_EQ(q[1], 0x38);  // 1.0
  EXPECT_EQ(q[2], 0xC2);  // -2.5 = -1.25 * 2
  EXPECT_EQ(q[3], 0x00);
  EXPECT_EQ(q[32], 0x7E);  // 448
  EXPECT_EQ(q[33], 0x44);  // 3.0 = 1.5 * 2
  EXPECT_EQ(q[64], 0x78);  // 256
  EXPECT_EQ(q[65], 0x60);  // 32
  for (int i = 96; i < 128; ++i) EXPECT_EQ(q[i], 0) << i;

  // The same tensor with swizzled scales: same values, the four scales at their tile offsets.
  std::vector<uint8_t> q2(128), s2(512, 0xAB);
  ASSERT_TRUE(QuantizeMxfp8(DType::kBFloat16, in.data(), 2, 64, q2.data(), s2.data(),
                            ScaleLayout::kSwizzled128x4)
                  .ok());
  EXPECT_EQ(q2, q);
  std::vector<uint8_t> expected(512, 0);  // padding is zeros
  expected[0] = 127;
  expected[1] = 127;
  expected[16] = 127 - 18;
  expected[17] = 0;
  EXPECT_EQ(s2, expected);
}

TEST(Nvfp4Reference, AKnownTensorGivesTheScalesAndValuesWorkedByHand) {
  // Tensor amax 6: encode = 2688 / 6 = 448. Row 0's block amax 6: scale e4m3(448) = 0x7E, so the
  // values are e2m1(x) as they are. Row 1's amax 3: scale 224 (0x76), values e2m1(2x).
  const std::vector<float> x = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.25f, 0.75f, 2.5f, 5, -6, 5.5f,
                                0.1875f, -1,
                                // row 1
                                3, -1.5f, 0.75f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  const std::vector<uint16_t> in = BF16(x);
  std::vector<uint8_t> q(16), s(2);
  float global = 0;
  ASSERT_TRUE(QuantizeNvfp4(DType::kBFloat16, in.data(), 2, 16, q.data(), s.data(), &global,
                            ScaleLayout::kRowMajor)
                  .ok());
  EXPECT_EQ(global, 6.0f / 2688.0f);
  EXPECT_EQ(s, (std::vector<uint8_t>{0x7E, 0x76}));
  // Codes row 0: 0 1 2 3 4 5 6 7 | -0 2 4 6 -6(F) 7 0 -1(A); the even element in the low nibble.
  EXPECT_EQ(q, (std::vector<uint8_t>{0x10, 0x32, 0x54, 0x76, 0x28, 0x64, 0x7F, 0xA0,
                                     // row 1: 6 -3 | 1.5 0: codes 7 D | 3 0
                                     0xD7, 0x03, 0, 0, 0, 0, 0, 0}));
}

// ---- special values and awkward shapes --------------------------------------------------------

TEST(Mxfp8Reference, NaNStaysNaNAndInfinitySaturatesWithTheLargestScale) {
  std::vector<float> x(64, 1.0f);
  x[3] = kNaN;  // block 0: amax 1 ignoring the NaN
  x[40] = -kInf;
  std::vector<uint8_t> q(64), s(2);
  ASSERT_TRUE(
      QuantizeMxfp8(DType::kFloat32, x.data(), 1, 64, q.data(), s.data(), ScaleLayout::kRowMajor)
          .ok());
  EXPECT_EQ(s[0], 119);
  EXPECT_EQ(q[3], 0x7F);
  EXPECT_EQ(q[0], 0x78);
  EXPECT_EQ(s[1], 254);    // 2^127
  EXPECT_EQ(q[40], 0xFE);  // -448
  EXPECT_EQ(q[41], 0x00);  // 1 / 2^127 rounds to zero
}

TEST(Mxfp8Reference, SubnormalAndHugeBlocksKeepTheirValues) {
  // bf16 subnormal 2^-130: amax below 2^-126, scale 2^-127, 2^-130 * 2^127 = 0.125 (0x20).
  // 1.5 * 2^127: scale 2^119, value 1.5 * 2^8 = 384 (0x7C).
  std::vector<float> x = {std::ldexp(1.0f, -130),
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          1.5f * std::ldexp(1.0f, 127)};
  const std::vector<uint16_t> in = BF16(x);
  std::vector<uint8_t> q(33), s(2);
  ASSERT_TRUE(
      QuantizeMxfp8(DType::kBFloat16, in.data(), 1, 33, q.data(), s.data(), ScaleLayout::kRowMajor)
          .ok());
  EXPECT_EQ(s[0], 0);
  EXPECT_EQ(q[0], 0x20);
  EXPECT_EQ(s[1], 246);  // the last block holds one element
  EXPECT_EQ(q[32], 0x7C);
}

TEST(Nvfp4Reference, ABlockWithANaNGetsANaNScaleSoItNeverDequantizesToNumbers) {
  std::vector<float> x(32, 1.0f);
  x[20] = kNaN;
  std::vector<uint8_t> q(16), s(2);
  float global = 0;
  ASSERT_TRUE(QuantizeNvfp4(DType::kFloat32, x.data(), 1, 32, q.data(), s.data(), &global,
                            ScaleLayout::kRowMajor)
                  .ok());
  EXPECT_EQ(s[0], 0x7E);
  EXPECT_EQ(s[1], 0x7F);
  std::vector<float> back(32);
  ASSERT_TRUE(DequantizeBlockScaled(BlockFormat::kNvfp4, q.data(), s.data(), global, 1, 32,
                                    ScaleLayout::kRowMajor, back.data())
                  .ok());
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(back[i], 1.0f, 1e-6f) << i;
  for (int i = 16; i < 32; ++i) EXPECT_TRUE(std::isnan(back[i])) << i;
}

TEST(Nvfp4Reference, ZeroInfiniteAndTinyTensorsFallBackToScaleOne) {
  EXPECT_EQ(Nvfp4TensorScaleFor(0.0f).encode, 1.0f);
  EXPECT_EQ(Nvfp4TensorScaleFor(kInf).global, 1.0f);
  EXPECT_EQ(Nvfp4TensorScaleFor(1e-38f).encode, 1.0f);  // 2688 / 1e-38 overflows
  EXPECT_EQ(Nvfp4TensorScaleFor(2688.0f).encode, 1.0f);
  EXPECT_EQ(Nvfp4TensorScaleFor(2688.0f).global, 1.0f);
  // An all-zero tensor: scales 0, values 0, global 1.
  std::vector<float> x(16, 0.0f);
  std::vector<uint8_t> q(8, 0xCD), s(1, 0xCD);
  float global = 0;
  ASSERT_TRUE(QuantizeNvfp4(DType::kFloat32, x.data(), 1, 16, q.data(), s.data(), &global,
                            ScaleLayout::kRowMajor)
                  .ok());
  EXPECT_EQ(global, 1.0f);
  EXPECT_EQ(s[0], 0);
  EXPECT_EQ(q, std::vector<uint8_t>(8, 0));
}

TEST(BlockScaledReference, ShapesNotMultiplesOfTheBlockAndEmptyTensors) {
  // One element; an odd row length (NVFP4's last byte half used); zero rows or columns.
  const float one = -3.0f;
  uint8_t q = 0xCD, s = 0xCD;
  float global = 0;
  ASSERT_TRUE(
      QuantizeNvfp4(DType::kFloat32, &one, 1, 1, &q, &s, &global, ScaleLayout::kRowMajor).ok());
  EXPECT_EQ(q, 0x0F);  // -6 in the low nibble, the high one zero
  EXPECT_EQ(s, 0x7E);
  EXPECT_EQ(global, 3.0f / 2688.0f);
  ASSERT_TRUE(QuantizeMxfp8(DType::kFloat32, &one, 1, 1, &q, &s, ScaleLayout::kRowMajor).ok());
  EXPECT_EQ(s, 127 - 7);  // 3 = 1.5 * 2: scale 2^-7, value 384
  EXPECT_EQ(q, 0xFC);

  std::vector<float> x(3 * 17);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) - 20.0f;
  std::vector<uint8_t> q17(3 * 9, 0xCD), s17(6);
  ASSERT_TRUE(QuantizeNvfp4(DType::kFloat32, x.data(), 3, 17, q17.data(), s17.data(), &global,
                            ScaleLayout::kRowMajor)
                  .ok());
  for (int r = 0; r < 3; ++r) EXPECT_EQ(q17[r * 9 + 8] & 0xF0, 0) << r;
  EXPECT_EQ(q17[8] & 0x0F,
            FloatToE2M1(x[16] * (Nvfp4TensorScaleFor(30.0f).encode / E4M3FNToFloat(s17[1]))));

  uint8_t untouched = 0xCD;
  EXPECT_TRUE(QuantizeMxfp8(DType::kBFloat16, nullptr, 0, 64, &untouched, &untouched,
                            ScaleLayout::kRowMajor)
                  .ok());
  EXPECT_TRUE(QuantizeNvfp4(DType::kBFloat16, nullptr, 5, 0, &untouched, &untouched, &global,
                            ScaleLayout::kRowMajor)
                  .ok());
  EXPECT_EQ(untouched, 0xCD);
  EXPECT_EQ(global, 1.0f);
}

TEST(BlockScaledReference, RefusesOtherInputTypesAndNegativeShapesByName) {
  uint8_t q = 0, s = 0;
  float global = 0;
  const Status f16 = QuantizeMxfp8(DType::kFloat16, &q, 1, 1, &q, &s, ScaleLayout::kRowMajor);
  EXPECT_EQ(f16.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(f16.message().find("float16"), std::string::npos) << f16.message();
  const Status negative =
      QuantizeNvfp4(DType::kFloat32, &q, -1, 4, &q, &s, &global, ScaleLayout::kRowMajor);
  EXPECT_EQ(negative.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(negative.message().find("negative shape"), std::string::npos);
}

// ---- what each format promises: the error of a round trip --------------------------------------

// The largest error the format allows for x: half a step of the value grid at x's magnitude, in
// the block's units, plus what saturation clips.
double Mxfp8Bound(float x, float block_scale) {
  const double scaled = std::fabs(x) / block_scale;
  const double half_step = std::max(scaled * std::ldexp(1.0, -4), std::ldexp(1.0, -10));
  return (half_step + std::max(0.0, scaled - 448.0)) * block_scale;
}

double Nvfp4Bound(float x, float unit) {  // unit: what one e2m1 step of 1 is worth
  const double scaled = std::fabs(x) / unit;
  const double half_step = scaled < 2 ? 0.25 : scaled < 4 ? 0.5 : 1.0;
  return (half_step + std::max(0.0, scaled - 6.0)) * unit * (1 + 1e-5);
}

TEST(BlockScaledReference, RandomTensorsRoundTripWithinEachFormatsError) {
  std::mt19937 rng(44);
  std::lognormal_distribution<float> magnitude(0.0f, 3.0f);
  for (const auto& [rows, cols] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 31}, {5, 33}, {129, 70}, {7, 256}}) {
    for (ScaleLayout layout : {ScaleLayout::kRowMajor, ScaleLayout::kSwizzled128x4}) {
      std::vector<float> x(rows * cols);
      for (float& v : x) v = (rng() % 2 ? -1.0f : 1.0f) * magnitude(rng) * 1e-3f;
      for (BlockFormat format : {BlockFormat::kMxfp8, BlockFormat::kNvfp4}) {
        std::vector<uint8_t> q(rows * ValueBytesPerRow(format, cols));
        const ScaleShape shape = ScaleShapeFor(format, layout, rows, cols);
        std::vector<uint8_t> s(shape.bytes());
        float global = 1.0f;
        const Status st =
            format == BlockFormat::kMxfp8
                ? QuantizeMxfp8(DType::kFloat32, x.data(), rows, cols, q.data(), s.data(), layout)
                : QuantizeNvfp4(DType::kFloat32, x.data(), rows, cols, q.data(), s.data(), &global,
                                layout);
        ASSERT_TRUE(st.ok()) << st.message();
        std::vector<float> back(x.size());
        ASSERT_TRUE(DequantizeBlockScaled(format, q.data(), s.data(), global, rows, cols, layout,
                                          back.data())
                        .ok());
        float amax = 0;
        for (float v : x) amax = std::max(amax, std::fabs(v));
        const Nvfp4TensorScale tensor = Nvfp4TensorScaleFor(amax);
        // The scales themselves, from the rules stated independently: MXFP8's floor(log2 amax)
        // - 8 by ilogb, NVFP4's global scale amax / (6 * 448).
        for (int64_t r = 0; r < rows && format == BlockFormat::kMxfp8; ++r) {
          for (int64_t b = 0; b * 32 < cols; ++b) {
            float block_amax = 0;
            for (int64_t c = b * 32; c < std::min(cols, b * 32 + 32); ++c) {
              block_amax = std::max(block_amax, std::fabs(x[r * cols + c]));
            }
            const int want =
                block_amax == 0 ? 0 : std::clamp(std::ilogb(block_amax) - 8, -127, 127) + 127;
            ASSERT_EQ(s[ScaleOffset(layout, shape, r, b)], want) << r << "," << b;
          }
        }
        if (format == BlockFormat::kNvfp4) {
          EXPECT_EQ(global, amax / 2688.0f);
        }
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            const uint8_t sb = s[ScaleOffset(layout, shape, r, c / BlockSize(format))];
            const float xv = x[r * cols + c];
            const double bound = format == BlockFormat::kMxfp8
                                     ? Mxfp8Bound(xv, E8M0ToFloat(sb))
                                     : Nvfp4Bound(xv, E4M3FNToFloat(sb) / tensor.encode);
            ASSERT_LE(std::fabs(back[r * cols + c] - xv), bound)
                << "format " << int(format) << " [" << rows << "x" << cols << "] at " << r << ","
                << c << " x=" << xv;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace weightsync::cuda::reference
