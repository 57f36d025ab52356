// GPU blockwise fp8 (e4m3fn) quantization of bf16 matrices against the CPU reference.
// Expected: bit-exact values and scales. Both sides compute q = e4m3fn_rn_satfinite(x / scale)
// with an IEEE float32 division (the kernel uses __fdiv_rn and the cvt.rn.satfinite instruction;
// the reference divides in float32 and rounds to nearest even), and the same scale rule. The only
// tolerated difference: a NaN input gives a NaN code on both sides.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cuda/kernels.h"
#include "cuda/transform_reference.h"
#include "gpu/gpu_test_util.h"

namespace weightsync::cuda {
namespace {

using testing::Download;
using testing::Upload;

// Values of very different magnitudes per 128x128 block (one block in five all zero), so scales
// span many binades and small values hit e4m3 subnormals.
std::vector<uint16_t> RandomMatrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> x(rows * cols);
  const int64_t bcols = Fp8ScaleCols(cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t block = (r / 128) * bcols + c / 128;
      const int binade = int((block * 37) % 40) - 20;
      float v = block % 5 == 3 ? 0.0f : std::ldexp(normal(rng), binade);
      x[r * cols + c] = reference::FloatToBFloat16(v);
    }
  }
  return x;
}

// Quantizes on the GPU (x and q placed `x_offset` / `q_offset` elements into their buffers) and on
// the CPU; expects identical codes and scales, and the error bound on the GPU's values.
void CheckQuantize(const std::vector<uint16_t>& x, int64_t rows, int64_t cols,
                   Fp8ScaleFormat format, int64_t x_offset = 0, int64_t q_offset = 0) {
  SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) +
               (format == Fp8ScaleFormat::kE8M0 ? " e8m0" : " f32") + " offsets " +
               std::to_string(x_offset) + "/" + std::to_string(q_offset));
  const int64_t n = rows * cols;
  const int64_t nscales = Fp8ScaleRows(rows) * Fp8ScaleCols(cols);
  const int64_t scale_bytes = format == Fp8ScaleFormat::kE8M0 ? 1 : 4;

  std::vector<uint16_t> padded(x_offset, 0);
  padded.insert(padded.end(), x.begin(), x.end());
  Result<DeviceBuffer> d_x = Upload(padded);
  ASSERT_OK(d_x);
  Result<DeviceBuffer> d_q = DeviceBuffer::Allocate(n + q_offset);
  ASSERT_OK(d_q);
  Result<DeviceBuffer> d_s = DeviceBuffer::Allocate(nscales * scale_bytes);
  ASSERT_OK(d_s);
  ASSERT_OK(MemsetDevice(d_q->data(), 0xAA, n + q_offset));
  Result<PreparedLaunch> quant =
      PrepareQuantizeFp8(d_x->as<uint16_t>() + x_offset, d_q->as<uint8_t>() + q_offset, d_s->data(),
                         rows, cols, format, nullptr);
  ASSERT_OK(quant);
  ASSERT_OK(quant->Launch());
  ASSERT_OK(DeviceSynchronize());
  Result<std::vector<uint8_t>> q = Download<uint8_t>(d_q->data(), n + q_offset);
  ASSERT_OK(q);
  Result<std::vector<uint8_t>> s = Download<uint8_t>(d_s->data(), nscales * scale_bytes);
  ASSERT_OK(s);
  for (int64_t i = 0; i < q_offset; ++i) ASSERT_EQ((*q)[i], 0xAA) << "wrote before the output";

  std::vector<uint8_t> ref_q(n);
  std::vector<uint8_t> ref_s(nscales * scale_bytes);
  ASSERT_OK(reference::QuantizeFp8(x.data(), rows, cols, ref_q.data(), ref_s.data(), format));

  EXPECT_EQ(*s, ref_s) << "scales differ";
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t g = (*q)[q_offset + i], r = ref_q[i];
    if (g == r || ((g & 0x7F) == 0x7F && (r & 0x7F) == 0x7F)) continue;
    if (++mismatches <= 5) {
      ADD_FAILURE() << "element " << i << " (row " << i / cols << ", col " << i % cols
                    << "): x = " << reference::BFloat16ToFloat(x[i]) << ", gpu 0x" << std::hex
                    << int(g) << ", reference 0x" << int(r);
    }
  }
  EXPECT_EQ(mismatches, 0);

  // |dequant - x| <= max(2^-4 |x|, 2^-10 scale) (half an e4m3 ulp relative; half the subnormal
  // step 2^-9 absolute), with 2^-20 slack for the float32 roundings of x / scale and q * scale.
  const int64_t bcols = Fp8ScaleCols(cols);
  for (int64_t i = 0; i < n; ++i) {
    const float xv = reference::BFloat16ToFloat(x[i]);
    if (!std::isfinite(xv)) continue;
    const int64_t b = (i / cols / 128) * bcols + (i % cols) / 128;
    float scale;
    if (format == Fp8ScaleFormat::kE8M0) {
      scale = reference::E8M0ToFloat((*s)[b]);
    } else {
      std::memcpy(&scale, s->data() + 4 * b, 4);
    }
    if (!std::isfinite(scale)) continue;  // a block holding ±inf: no bound to speak of
    // In double: near the top of the float range an e8m0 scale rounded up can make q * scale
    // overflow float32 (bf16 max 0x7F7F quantizes to 256 * 2^120 = 2^128).
    const double deq = double(reference::E4M3FNToFloat((*q)[q_offset + i])) * double(scale);
    const double bound =
        std::max(std::ldexp(std::fabs(double(xv)), -4), std::ldexp(double(scale), -10)) *
        (1 + std::ldexp(1.0, -20));
    ASSERT_LE(std::fabs(deq - xv), bound) << "element " << i << " x " << xv;
  }
}

TEST(GpuFp8QuantizeTest, MatchesReferenceBitExactOnAwkwardShapes) {
  WS_SKIP_WITHOUT_GPU();
  const int64_t shapes[][2] = {{1, 1},     {1, 8},     {3, 5},      {127, 129}, {128, 128},
                               {129, 128}, {256, 384}, {257, 8},    {129, 131}, {300, 1000},
                               {1000, 24}, {2, 4096},  {1024, 4096}};
  uint32_t seed = 1;
  for (const auto& shape : shapes) {
    const std::vector<uint16_t> x = RandomMatrix(shape[0], shape[1], seed++);
    CheckQuantize(x, shape[0], shape[1], Fp8ScaleFormat::kFloat32);
    CheckQuantize(x, shape[0], shape[1], Fp8ScaleFormat::kE8M0);
  }
}

TEST(GpuFp8QuantizeTest, UnalignedBuffersTakeTheElementwisePath) {
  WS_SKIP_WITHOUT_GPU();
  const std::vector<uint16_t> x = RandomMatrix(200, 264, 99);
  CheckQuantize(x, 200, 264, Fp8ScaleFormat::kFloat32, /*x_offset=*/1, /*q_offset=*/0);
  CheckQuantize(x, 200, 264, Fp8ScaleFormat::kE8M0, /*x_offset=*/0, /*q_offset=*/3);
  CheckQuantize(x, 200, 264, Fp8ScaleFormat::kE8M0, /*x_offset=*/8, /*q_offset=*/8);
}

TEST(GpuFp8QuantizeTest, SaturationZerosAndNonFinite) {
  WS_SKIP_WITHOUT_GPU();
  // Block 0: ordinary values plus a NaN (ignored by amax, encoded as NaN). Block 1: ±inf (scale
  // inf in float32 mode, 2^127 in e8m0). Block 2: all zero (scale 1). Block 3: the largest bf16.
  const int64_t rows = 2, cols = 512;
  std::vector<uint16_t> x(rows * cols, 0);
  for (int64_t c = 0; c < 128; ++c) x[c] = reference::FloatToBFloat16(float(c) - 64.0f);
  x[5] = 0x7FC0;  // NaN
  for (int64_t c = 128; c < 256; ++c) x[c] = reference::FloatToBFloat16(1.0f);
  x[130] = 0x7F80;                                    // +inf
  x[cols + 131] = 0xFF80;                             // -inf
  for (int64_t c = 384; c < 512; ++c) x[c] = 0x7F7F;  // largest finite bf16
  x[cols + 400] = 0xFF7F;
  CheckQuantize(x, rows, cols, Fp8ScaleFormat::kFloat32);
  CheckQuantize(x, rows, cols, Fp8ScaleFormat::kE8M0);
}

TEST(GpuFp8QuantizeTest, ShapeRewrittenInPlace) {
  WS_SKIP_WITHOUT_GPU();
  // The kernel loops over blocks, so one prepared launch serves a smaller matrix after its rows and
  // cols are rewritten in place.
  const std::vector<uint16_t> big = RandomMatrix(256, 256, 5);
  const std::vector<uint16_t> small(big.begin(), big.begin() + 130 * 200);
  Result<DeviceBuffer> d_x = Upload(big);
  ASSERT_OK(d_x);
  Result<DeviceBuffer> d_q = DeviceBuffer::Allocate(big.size());
  ASSERT_OK(d_q);
  Result<DeviceBuffer> d_s = DeviceBuffer::Allocate(4 * 4);
  ASSERT_OK(d_s);
  Result<PreparedLaunch> quant = PrepareQuantizeFp8(d_x->data(), d_q->data(), d_s->data(), 256, 256,
                                                    Fp8ScaleFormat::kE8M0, nullptr);
  ASSERT_OK(quant);
  ASSERT_OK(quant->Launch());
  ASSERT_OK(quant->args().SetChecked(QuantizeFp8Args::kRows, int64_t{130}));
  ASSERT_OK(quant->args().SetChecked(QuantizeFp8Args::kCols, int64_t{200}));
  ASSERT_OK(quant->Launch());
  ASSERT_OK(DeviceSynchronize());
  Result<std::vector<uint8_t>> q = Download<uint8_t>(d_q->data(), 130 * 200);
  ASSERT_OK(q);
  Result<std::vector<uint8_t>> s = Download<uint8_t>(d_s->data(), 4);
  ASSERT_OK(s);
  std::vector<uint8_t> ref_q(130 * 200), ref_s(4);
  ASSERT_OK(reference::QuantizeFp8(small.data(), 130, 200, ref_q.data(), ref_s.data(),
                                   Fp8ScaleFormat::kE8M0));
  EXPECT_EQ(*q, ref_q);
  EXPECT_EQ(*s, ref_s);
}

}  // namespace
}  // namespace weightsync::cuda
