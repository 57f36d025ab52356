// The weights check on the GPU paths (Subscriber::CheckWeights): CUDA destinations digested where
// they lie with the grouped GPU digest kernels (a GPU arena publisher over cuda-ipc), or copied
// back and hashed with xxh3 (a host publisher into CUDA destinations), and host destinations of a
// GPU publisher hashed on the CPU with the GPU digest's CPU implementation. A byte changed on the
// device after the commit is named; the next update restores it.
#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"
#include "testing/publisher_process.h"
#include "testing/test_util.h"
#include "testing/transport_modes.h"

namespace weightsync {
namespace {

using testing::SyntheticModel;

constexpr int kTensors = 8;
constexpr int64_t kElements = 300000;

class GpuWeightsCheck : public ::testing::TestWithParam<UpdateMode> {
 protected:
  void SetUp() override {
    WS_SKIP_WITHOUT_GPU();
    device_ = cuda::DeviceCount() > 1 ? 1 : 0;
    ASSERT_OK(cuda::SetDevice(device_));
  }
  // Flips one byte of a CUDA destination on the device.
  static void FlipOnDevice(const NamedTensor& t, uint64_t at) {
    uint8_t byte = 0;
    ASSERT_OK(cuda::CopyToHost(&byte, static_cast<uint8_t*>(t.view.data) + at, 1));
    byte ^= 0x10;
    ASSERT_OK(cuda::CopyToDevice(static_cast<uint8_t*>(t.view.data) + at, &byte, 1));
  }
  // Checks, corrupts `dst[2]` through `flip`, checks again (Corruption naming it), then restores
  // with an update of the committed step and checks once more.
  void CheckCorruptRestore(Subscriber& sub, const std::vector<NamedTensor>& dst,
                           uint64_t model_bytes, const std::function<void()>& flip,
                           const std::function<bool(int64_t)>& holds) {
    ASSERT_OK_AND_ASSIGN(WeightsCheck check, sub.CheckWeights());
    EXPECT_EQ(check.tensors, dst.size());
    EXPECT_EQ(check.bytes, model_bytes);
    flip();
    ASSERT_STATUS_IS(kCorruption, sub.CheckWeights(), "in 1 of " + std::to_string(dst.size()),
                     "tensor '" + dst[2].name + "'");
    EXPECT_FALSE(sub.weights_valid());
    ASSERT_OK_AND_ASSIGN(UpdateStats restored, sub.Update());
    EXPECT_FALSE(restored.up_to_date);
    EXPECT_TRUE(holds(1));
    ASSERT_OK(sub.CheckWeights());
  }

  int device_ = 0;
  SyntheticModel model_{kTensors, kElements};
  std::vector<NamedTensor> like_ = model_.Tensors();
};

// A GPU arena over cuda-ipc into CUDA destinations: the GPU digest kernels on the destinations'
// device.
TEST_P(GpuWeightsCheck, CudaIpcDestinationsAreCheckedOnTheirGpu) {
  auto publisher = cuda::testing::StartGpuPublisher(kTensors, kElements, {}, "check-ipc");
  ASSERT_NO_FATAL_FAILURE(publisher->Publish(1));
  std::vector<NamedTensor> dst;
  std::vector<cuda::DeviceBuffer> keep;
  auto sub = cuda::testing::ConnectVerifying(publisher->endpoint(), GetParam(), like_, device_,
                                             &dst, &keep);
  ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub->Update());
  EXPECT_EQ(stats.path, "cuda-ipc");
  ASSERT_NO_FATAL_FAILURE(CheckCorruptRestore(
      *sub, dst, model_.total_bytes(), [&] { FlipOnDevice(dst[2], 12345); },
      [&](int64_t step) {
        std::string why;
        return cuda::testing::DestinationsHold(dst, like_, step, &why);
      }));
}

// A host publisher (xxh3 digests) into CUDA destinations: no GPU kernel computes xxh3, so each
// segment is copied back and hashed on the CPU.
TEST_P(GpuWeightsCheck, HostToGpuDestinationsAreCopiedBackAndHashed) {
  PublisherOptions o;
  o.endpoint = testing::UniqueEndpoint("check-h2d");
  ASSERT_OK_AND_ASSIGN(auto pub, Publisher::Create(o));
  ASSERT_OK(pub->Register(like_));
  model_.Fill(1);
  ASSERT_OK(pub->Publish(1));
  std::vector<NamedTensor> dst;
  std::vector<cuda::DeviceBuffer> keep;
  auto sub = cuda::testing::ConnectVerifying(o.endpoint, GetParam(), like_, device_, &dst, &keep);
  ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub->Update());
  EXPECT_EQ(stats.path, "host-to-gpu");
  ASSERT_NO_FATAL_FAILURE(CheckCorruptRestore(
      *sub, dst, model_.total_bytes(), [&] { FlipOnDevice(dst[2], 777); },
      [&](int64_t step) {
        std::string why;
        return cuda::testing::DestinationsHold(dst, like_, step, &why);
      }));
}

// A GPU arena into host destinations: the GPU digest's CPU implementation.
TEST_P(GpuWeightsCheck, GpuToHostDestinationsAreHashedOnTheCpu) {
  auto publisher = cuda::testing::StartGpuPublisher(kTensors, kElements, {}, "check-d2h");
  ASSERT_NO_FATAL_FAILURE(publisher->Publish(1));
  auto storage = SyntheticModel::PoisonedStorage(like_);
  auto dst = SyntheticModel::Views(like_, storage);
  SubscriberOptions o;
  o.endpoint = publisher->endpoint();
  o.mode = GetParam();
  o.timeout = std::chrono::milliseconds(10000);
  auto sub = testing::NewSubscriber(o, dst);
  ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub->Update());
  EXPECT_EQ(stats.path, "gpu-to-host");
  ASSERT_NO_FATAL_FAILURE(CheckCorruptRestore(
      *sub, dst, model_.total_bytes(), [&] { storage[2][4242] ^= 0x10; },
      [&](int64_t step) {
        std::string why;
        return SyntheticModel::Holds(dst, step, &why);
      }));
}

INSTANTIATE_TEST_SUITE_P(Modes, GpuWeightsCheck, testing::BothUpdateModes(),
                         testing::UpdateModeName);

}  // namespace
}  // namespace weightsync
