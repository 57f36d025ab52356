// A publisher of CUDA tensors (GPU arena, cuda:0, in a child process) and a subscriber whose
// destinations are in host memory: the copy engines of the arena's GPU write the pinned landing
// ranges (src/transport/path/gpu_to_host_path.*). What the conformance suite's gpu-to-host rows
// (tests/gpu/conformance_test.cc: round trips, corruption caught against the publisher's GPU
// digests, the publisher's death) do not cover: the landing ranges pinned, and sleep/wake cycles
// that unpin and unmap back to the ledger's baseline.
#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"
#include "testing/test_util.h"
#include "util/fail_point.h"

namespace weightsync {
namespace {

using testing::ChildProcess;
using testing::SyntheticModel;

constexpr int kTensors = 16;
constexpr int64_t kElements = 100000;

class GpuToHost : public ::testing::TestWithParam<UpdateMode> {
 protected:
  void SetUp() override {
    WS_SKIP_WITHOUT_GPU();
    util::FailPoints::DisarmAll();
    endpoint_ = testing::UniqueEndpoint("gputohost");
    publisher_ = ChildProcess::Spawn({testing::HelperPath("gpu_publisher"), endpoint_,
                                      std::to_string(kTensors), std::to_string(kElements), "0"});
    ASSERT_EQ(publisher_.ReadLine(60000), "ready " + endpoint_);
  }
  void TearDown() override { util::FailPoints::DisarmAll(); }

  void Publish(int64_t step) {
    ASSERT_EQ(publisher_.Command("publish " + std::to_string(step)), "ok " + std::to_string(step));
  }
  std::unique_ptr<Subscriber> Connect(bool verify) {
    SubscriberOptions o;
    o.endpoint = endpoint_;
    o.mode = GetParam();
    o.verify = verify;
    o.timeout = std::chrono::milliseconds(10000);
    return testing::NewSubscriber(o, dst_);
  }
  std::string Holds(int64_t step) {
    std::string why;
    return SyntheticModel::Holds(dst_, step, &why) ? "" : why;
  }

  SyntheticModel model_{kTensors, kElements};
  std::vector<NamedTensor> like_ = model_.Tensors();
  std::vector<std::vector<uint8_t>> storage_ = SyntheticModel::PoisonedStorage(like_);
  std::vector<NamedTensor> dst_ = SyntheticModel::Views(like_, storage_);
  std::string endpoint_;
  ChildProcess publisher_;
};

// The copy engines write page-locked memory: the landing ranges are pinned at prepare (the
// round trips themselves are the conformance suite's).
TEST_P(GpuToHost, TheLandingRangesArePinned) {
  testing::LogCapture log;
  auto sub = Connect(/*verify=*/true);
  Publish(1);
  ASSERT_OK(sub->Update());
  EXPECT_EQ(Holds(1), "");
  EXPECT_TRUE(
      log.Contains("GPU arena from cuda:0 into host memory by the copy engines of cuda:0, pinned"))
      << "no prepare line saying the landing ranges were pinned";
}

TEST_P(GpuToHost, SleepAndWakeCyclesReturnToBaseline) {
  auto sub = Connect(/*verify=*/false);
  const LedgerSnapshot before = ReadLedger();
  ASSERT_NO_FATAL_FAILURE(cuda::testing::SleepWakeCyclesPinAndReturnToBaseline(
      *sub, 20, before, [&](int64_t step) { Publish(step); }));
  EXPECT_EQ(Holds(20), "");
}

INSTANTIATE_TEST_SUITE_P(Modes, GpuToHost,
                         ::testing::Values(UpdateMode::kStaged, UpdateMode::kInPlace),
                         [](const auto& info) {
                           return std::string(info.param == UpdateMode::kStaged ? "staged"
                                                                                : "in_place");
                         });

}  // namespace
}  // namespace weightsync
