// The block-scaled references (src/cuda/block_scaled_reference.h) against CUDA's own host
// conversions (cuda_fp4.h, cuda_fp8.h): the e2m1 rounding on every bfloat16 and on random float32
// bit patterns, and MXFP8's shared exponent against the hardware's round-toward-zero e8m0 of the
// amax. These are the conversions the GPU kernels will use, so the kernels can match the
// references bit for bit. Runs without a GPU; needs the CUDA headers (skips without them).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

#include "cuda/block_scaled_reference.h"
#include "cuda/transform_reference.h"

#if __has_include(<cuda_fp4.h>) && __has_include(<cuda_fp8.h>)
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#define WS_HAVE_CUDA_FP4_HEADER 1
#endif

namespace weightsync::cuda::reference {
namespace {

#ifdef WS_HAVE_CUDA_FP4_HEADER
uint8_t CudaE2M1(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest) & 0xF);
}
#endif

TEST(BlockScaledHostConversion, E2M1EqualsCudasConversion) {
#ifndef WS_HAVE_CUDA_FP4_HEADER
  GTEST_SKIP() << "needs the CUDA headers (cuda_fp4.h)";
#else
  for (uint32_t h = 0; h < 65536; ++h) {
    const float x = BFloat16ToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(FloatToE2M1(x), CudaE2M1(x)) << std::hex << h << " = " << x;
  }
  std::mt19937 rng(45);
  std::uniform_real_distribution<float> near(-7.0f, 7.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = i % 2 ? near(rng) : std::bit_cast<float>(static_cast<uint32_t>(rng()));
    ASSERT_EQ(FloatToE2M1(x), CudaE2M1(x)) << x;
  }
#endif
}

TEST(BlockScaledHostConversion, TheMxSharedExponentEqualsCudasE8M0OfTheAmaxLessEight) {
#ifndef WS_HAVE_CUDA_FP4_HEADER
  GTEST_SKIP() << "needs the CUDA headers (cuda_fp8.h)";
#else
  // cvt.rz.satfinite.ue8m0 of a normal float is its biased exponent: floor(log2) + 127.
  std::mt19937 rng(46);
  for (int i = 0; i < 200000; ++i) {
    const float amax = std::fabs(std::bit_cast<float>(static_cast<uint32_t>(rng())));
    if (!std::isnormal(amax)) continue;
    const int e8m0 = __nv_cvt_float_to_e8m0(amax, __NV_SATFINITE, cudaRoundZero);
    ASSERT_EQ(Mxfp8ScaleFor(amax), std::max(e8m0 - 8, 0)) << amax;
  }
#endif
}

}  // namespace
}  // namespace weightsync::cuda::reference
