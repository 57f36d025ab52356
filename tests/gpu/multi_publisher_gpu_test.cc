// Two GPU publishers, one subscriber (label gpu): two trainer ranks on cuda:0 and cuda:1, each
// holding every other tensor of the synthetic model in its GPU arena; the subscriber on cuda:1
// takes both halves over cuda-ipc (one handle per publisher, both shares moving at once) into
// poisoned destinations, staged and in place, bit-exact step after step, prepared once.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/vmm.h"
#include "gpu/gpu_test_util.h"
#include "testing/test_util.h"
#include "testing/transport_modes.h"

namespace weightsync {
namespace {

using testing::ChildProcess;
using testing::SyntheticModel;

constexpr int kTensors = 24;
constexpr int64_t kElements = 200000;

class GpuMultiPublisher : public ::testing::TestWithParam<UpdateMode> {
 protected:
  void SetUp() override {
    WS_SKIP_WITHOUT_GPU();
    const int devices = cuda::DeviceCount();
    for (int rank = 0; rank < 2; ++rank) {
      const std::string asked = testing::UniqueEndpoint("gpurank" + std::to_string(rank));
      ranks_[rank] =
          ChildProcess::Spawn({testing::HelperPath("gpu_publisher"), asked,
                               std::to_string(kTensors), std::to_string(kElements),
                               std::to_string(rank % devices), "2", std::to_string(rank) + "/2"});
      const std::string ready = ranks_[rank].ReadLine(60000);
      ASSERT_EQ(ready, "ready " + asked);
      endpoints_[rank] = asked;
    }
    device_ = devices - 1;
    ASSERT_OK(cuda::SetDevice(device_));
    like_ = model_.Tensors();
    ASSERT_OK_AND_ASSIGN(dst_, cuda::testing::PoisonedDestinations(like_, device_, &buffers_));
  }
  bool Holds(int64_t step, std::string* why) {
    return cuda::testing::DestinationsHold(dst_, like_, step, why);
  }

  int device_ = 0;
  SyntheticModel model_{kTensors, kElements};
  ChildProcess ranks_[2];
  std::string endpoints_[2];
  std::vector<NamedTensor> like_, dst_;
  std::vector<cuda::DeviceBuffer> buffers_;
};

TEST_P(GpuMultiPublisher, HalvesFromTwoGpusArriveBitExactWithOnePrepare) {
  SubscriberOptions o;
  o.endpoints = {endpoints_[0], endpoints_[1]};
  o.mode = GetParam();
  o.verify = true;
  o.timeout = std::chrono::milliseconds(10000);
  auto sub = Subscriber::Create(o);
  ASSERT_TRUE(sub.ok()) << sub.status();
  ASSERT_OK((*sub)->Register(dst_));
  for (int64_t step = 1; step <= 20; ++step) {
    for (auto& rank : ranks_) {
      ASSERT_EQ(rank.Command("publish " + std::to_string(step)), "ok " + std::to_string(step));
    }
    auto r = (*sub)->Update();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step, step);
    EXPECT_EQ(r->tensors, static_cast<uint64_t>(kTensors));
    EXPECT_EQ(r->prepare_count, 1u);
    std::string why;
    ASSERT_TRUE(Holds(step, &why)) << why;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, GpuMultiPublisher, testing::BothUpdateModes(),
                         testing::UpdateModeName);

}  // namespace
}  // namespace weightsync
