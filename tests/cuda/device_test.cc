// What the GPU data plane says on a machine without a GPU (or in a build without CUDA): every call
// answers Unavailable with its reason, nothing crashes, and the binary started at all (the CUDA
// runtime is linked statically; no libcuda is needed to load it). On a GPU machine the same tests
// check that the answers are OK.
#include "cuda/device.h"

#include <gtest/gtest.h>

#include "cuda/kernels.h"
#include "testing/test_util.h"

namespace weightsync::cuda {
namespace {

TEST(CudaDeviceTest, BuildFlagMatchesTheLibrary) { EXPECT_EQ(BuiltWithCuda(), WS_WITH_CUDA != 0); }

TEST(CudaDeviceTest, AvailableOrUnavailableWithAReason) {
  Status s = CudaAvailable();
  if (s.ok()) {
    EXPECT_GT(DeviceCount(), 0);
    return;
  }
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_EQ(DeviceCount(), 0);
  if (BuiltWithCuda()) {
    EXPECT_EQ(s.message().rfind("no CUDA device: ", 0), 0u) << s;
  } else {
    EXPECT_EQ(s.message(), "built without CUDA");
  }
  // Asked again: the same answer (cached), still no crash.
  EXPECT_EQ(CudaAvailable().ToString(), s.ToString());
}

TEST(CudaDeviceTest, EveryEntryPointIsUnavailableWithoutADevice) {
  if (CudaAvailable().ok()) GTEST_SKIP() << "a CUDA device is present; tests/gpu covers it";
  ASSERT_STATUS_IS(kUnavailable, DeviceBuffer::Allocate(1024));
  ASSERT_STATUS_IS(kUnavailable, Stream::Create());
  uint8_t host[16] = {};
  int fake_device_memory = 0;
  ASSERT_STATUS_IS(kUnavailable,
                   PrepareCast(DType::kBFloat16, DType::kFloat32, host, host, 4, nullptr));
  ASSERT_STATUS_IS(kUnavailable,
                   PrepareQuantizeFp8(host, host, host, 2, 2, Fp8ScaleFormat::kE8M0, nullptr));
  uint64_t words[kArgProbeWords] = {};
  ASSERT_STATUS_IS(kUnavailable, PrepareDigest(host, 16, words, 1, words, nullptr));
  ASSERT_STATUS_IS(kUnavailable, PrepareCopy(host, &fake_device_memory, 4, nullptr));
  ASSERT_STATUS_IS(kUnavailable, PrepareArgProbe(words, nullptr));
  // Unsupported cast pairs are rejected by name whatever the machine.
  Result<KernelId> bad = CastKernelFor(DType::kInt8, DType::kFloat32);
  ASSERT_STATUS_IS(kInvalidArgument, bad);
  EXPECT_EQ(bad.status().message(),
            "cast: no kernel from int8 to float32 (casts go between float32, float16 and "
            "bfloat16)");
}

TEST(CudaDeviceTest, UnpreparedLaunchFailsCleanly) {
  PreparedLaunch none;
  EXPECT_FALSE(none.valid());
  Status s = none.Launch();
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace weightsync::cuda
