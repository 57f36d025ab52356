// The fp8 quantization kernel's arithmetic, replayed on the CPU with CUDA's own host conversion
// (cuda_fp8.h) and IEEE float division: amax over |x| ignoring NaN, scale = amax / 448, q =
// e4m3_satfinite(x / scale). It must equal cuda::reference::QuantizeFp8 bit for bit, also on
// random bit patterns (infinities, NaNs, subnormals) — the inputs on which the GPU pipeline test
// (tests/gpu/convert_test.cc) disagreed. Runs without a GPU; needs the CUDA headers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "cuda/transform_reference.h"
#include "testing/test_util.h"

#if __has_include(<cuda_fp8.h>)
#include <cuda_fp8.h>
#define WS_HAVE_CUDA_FP8_HEADER 1
#endif

namespace weightsync::cuda {
namespace {

#ifdef WS_HAVE_CUDA_FP8_HEADER
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// QuantizeFp8Kernel<kFloat32>'s arithmetic (src/cuda/kernels.cu), element by element.
void EmulateKernel(const uint16_t* x, int64_t rows, int64_t cols, uint8_t* q, float* scales) {
  const int64_t tile_cols = Fp8ScaleCols(cols);
  for (int64_t tr = 0; tr < Fp8ScaleRows(rows); ++tr) {
    for (int64_t tc = 0; tc < tile_cols; ++tc) {
      const int64_t r1 = std::min(rows, (tr + 1) * 128), c1 = std::min(cols, (tc + 1) * 128);
      float amax = 0.0f;
      for (int64_t r = tr * 128; r < r1; ++r) {
        for (int64_t c = tc * 128; c < c1; ++c) {
          const float v = FromBits((uint32_t(x[r * cols + c]) & 0x7FFFu) << 16);
          if (v > amax) amax = v;  // fmaxf on the device: every NaN ignored
        }
      }
      const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
      scales[tr * tile_cols + tc] = s;
      for (int64_t r = tr * 128; r < r1; ++r) {
        for (int64_t c = tc * 128; c < c1; ++c) {
          const float v = FromBits(uint32_t(x[r * cols + c]) << 16) / s;
          q[r * cols + c] = static_cast<uint8_t>(
              __nv_cvt_float2_to_fp8x2(make_float2(v, 0.0f), __NV_SATFINITE, __NV_E4M3) & 0xFF);
        }
      }
    }
  }
}
#endif

TEST(Fp8KernelArithmetic, MatchesTheReferenceOnRandomBitPatterns) {
#ifndef WS_HAVE_CUDA_FP8_HEADER
  GTEST_SKIP() << "needs the CUDA headers (cuda_fp8.h) for CUDA's host fp8 conversion";
#else
  // The shape and bytes of the tensor the GPU pipeline test quantizes (layers.8.weight), plus a
  // square one with full and partial blocks in both directions.
  for (auto [rows, cols, tensor] : {std::tuple<int64_t, int64_t, int>{2, 70005, 8},
                                    std::tuple<int64_t, int64_t, int>{300, 260, 16}}) {
    for (int64_t step = 1; step <= 3; ++step) {
      std::vector<uint8_t> bytes(rows * cols * 2);
      weightsync::testing::SyntheticModel::Pattern(tensor, step, bytes.data(), bytes.size());
      const auto* x = reinterpret_cast<const uint16_t*>(bytes.data());
      const size_t nscales = Fp8ScaleRows(rows) * Fp8ScaleCols(cols);
      std::vector<uint8_t> ref_q(rows * cols), emu_q(rows * cols);
      std::vector<float> ref_s(nscales), emu_s(nscales);
      ASSERT_TRUE(reference::QuantizeFp8(x, rows, cols, ref_q.data(), ref_s.data(),
                                         Fp8ScaleFormat::kFloat32)
                      .ok());
      EmulateKernel(x, rows, cols, emu_q.data(), emu_s.data());
      EXPECT_EQ(std::memcmp(ref_s.data(), emu_s.data(), nscales * 4), 0) << "scales differ";
      size_t differ = 0;
      for (size_t i = 0; i < ref_q.size(); ++i) differ += ref_q[i] != emu_q[i];
      EXPECT_EQ(differ, 0u) << rows << "x" << cols << " step " << step;
    }
  }
#endif
}

}  // namespace
}  // namespace weightsync::cuda
