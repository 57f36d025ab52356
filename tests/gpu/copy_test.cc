// The copy kernel moves exactly the bytes asked for, for every mix of alignments (16-byte vector
// path when source and destination share their alignment modulo 16, bytes otherwise).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "cuda/kernels.h"
#include "gpu/gpu_test_util.h"

namespace weightsync::cuda {
namespace {

using testing::Download;
using testing::Upload;

TEST(GpuCopyTest, ExactBytesAtEveryAlignment) {
  WS_SKIP_WITHOUT_GPU();
  constexpr uint64_t kMax = (1 << 20) + 64;
  std::vector<uint8_t> src(kMax);
  std::mt19937 rng(1);
  for (auto& b : src) b = uint8_t(rng());
  Result<DeviceBuffer> d_src = Upload(src);
  ASSERT_OK(d_src);
  Result<DeviceBuffer> d_dst = DeviceBuffer::Allocate(kMax);
  ASSERT_OK(d_dst);
  for (uint64_t bytes : {0ull, 1ull, 15ull, 16ull, 17ull, 4095ull, 65536ull + 3, 1ull << 20}) {
    for (uint64_t so : {0, 1, 8}) {
      for (uint64_t dof : {0, 1, 8, 17}) {
        SCOPED_TRACE(std::to_string(bytes) + " bytes, offsets " + std::to_string(so) + "/" +
                     std::to_string(dof));
        ASSERT_OK(MemsetDevice(d_dst->data(), 0xEE, kMax));
        Result<PreparedLaunch> copy =
            PrepareCopy(d_src->as<uint8_t>() + so, d_dst->as<uint8_t>() + dof, bytes, nullptr);
        ASSERT_OK(copy);
        ASSERT_OK(copy->Launch());
        Result<std::vector<uint8_t>> out = Download<uint8_t>(d_dst->data(), kMax);
        ASSERT_OK(out);
        for (uint64_t i = 0; i < kMax; ++i) {
          const uint8_t want = (i >= dof && i < dof + bytes) ? src[so + i - dof] : 0xEE;
          ASSERT_EQ((*out)[i], want) << "byte " << i;
        }
      }
    }
  }
}

TEST(GpuCopyTest, RejectsHostMemoryTheDeviceCannotReach) {
  WS_SKIP_WITHOUT_GPU();
  std::vector<uint8_t> host(64);
  Result<DeviceBuffer> d = DeviceBuffer::Allocate(64);
  ASSERT_OK(d);
  Result<PreparedLaunch> copy = PrepareCopy(host.data(), d->data(), 64, nullptr);
  ASSERT_STATUS_IS(kInvalidArgument, copy, "host memory the device cannot reach");
}

}  // namespace
}  // namespace weightsync::cuda
