// cuda-ipc beyond the conformance suite (label gpu): a publisher process keeps CUDA tensors and
// its GPU arena on cuda:0; this process subscribes into CUDA destinations on cuda:1 (cuda:0 when
// there is one GPU). A prepared handle reused over a thousand steps with no host allocation and
// flat GPU memory, and a hundred sleep/wake cycles that return GPU memory (measured before the
// first prepare) and the ledger to baseline. Round trips, corruption caught on the GPU and the
// exporter's death are the conformance suite's cuda-ipc rows (tests/gpu/conformance_test.cc).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <new>

#include "cuda/device.h"
#include "cuda/vmm.h"
#include "gpu/gpu_test_util.h"
#include "testing/test_util.h"
#include "util/fail_point.h"

// Counts host heap allocations (g_new_calls) to show a steady update makes none.
#include "testing/count_new.inc"
#include "testing/transport_modes.h"

namespace weightsync {
namespace {

using testing::ChildProcess;
using testing::SyntheticModel;
using util::FailPoints;

constexpr int kTensors = 24;
constexpr int64_t kElements = 200000;

class CudaIpc : public ::testing::TestWithParam<UpdateMode> {
 protected:
  void SetUp() override {
    WS_SKIP_WITHOUT_GPU();
    FailPoints::DisarmAll();
    sub_device_ = cuda::DeviceCount() > 1 ? 1 : 0;
    endpoint_ = testing::UniqueEndpoint("cudaipc");
    StartPublisher();
    ASSERT_OK(cuda::SetDevice(sub_device_));
    like_ = model_.Tensors();
    ASSERT_OK_AND_ASSIGN(dst_, cuda::testing::PoisonedDestinations(like_, sub_device_, &buffers_));
    baseline_ = ReadLedger();
  }

  void StartPublisher() {
    publisher_ = ChildProcess::Spawn({testing::HelperPath("gpu_publisher"), endpoint_,
                                      std::to_string(kTensors), std::to_string(kElements), "0"});
    std::string ready = publisher_.ReadLine(60000);
    ASSERT_EQ(ready, "ready " + endpoint_);
  }
  void Publish(int64_t step) {
    ASSERT_EQ(publisher_.Command("publish " + std::to_string(step)), "ok " + std::to_string(step));
  }
  std::unique_ptr<Subscriber> Connect(bool verify = true) {
    SubscriberOptions o;
    o.endpoint = endpoint_;
    o.mode = GetParam();
    o.verify = verify;
    o.timeout = std::chrono::milliseconds(5000);
    return testing::NewSubscriber(o, dst_);
  }
  // Downloads every destination and compares it with the model at `step`.
  bool Holds(int64_t step, std::string* why) {
    return cuda::testing::DestinationsHold(dst_, like_, step, why);
  }

  int sub_device_ = 0;
  SyntheticModel model_{kTensors, kElements};
  std::string endpoint_;
  ChildProcess publisher_;
  std::vector<NamedTensor> like_, dst_;
  std::vector<cuda::DeviceBuffer> buffers_;
  LedgerSnapshot baseline_;
};

TEST_P(CudaIpc, ThousandStepsPreparedOnceWithoutHostAllocation) {
  auto sub = Connect(/*verify=*/true);
  int64_t allocations_in_updates = 0;
  size_t free_before = 0, total = 0, free_after = 0;
  for (int step = 1; step <= 1000; ++step) {
    Publish(step);
    int64_t before = g_new_calls.load();
    auto stats = sub->Update(step);
    int64_t after = g_new_calls.load();
    ASSERT_TRUE(stats.ok()) << stats.status();
    ASSERT_EQ(stats->handle_created, step == 1);
    if (step > 10) allocations_in_updates += after - before;
    if (step == 10) ASSERT_OK(cuda::MemInfo(&free_before, &total));
  }
  ASSERT_OK(cuda::MemInfo(&free_after, &total));
  EXPECT_EQ(allocations_in_updates, 0) << "host heap allocations in 990 steady updates";
  EXPECT_EQ(free_before, free_after) << "GPU memory changed over 990 steady updates";
  std::string why;
  EXPECT_TRUE(Holds(1000, &why)) << why;
}

TEST_P(CudaIpc, HundredSleepWakeCyclesReturnToBaseline) {
  Publish(1);
  size_t free0 = 0, total = 0;
  ASSERT_OK(cuda::MemInfo(&free0, &total));
  auto sub = Connect();
  for (int cycle = 0; cycle < 100; ++cycle) {
    auto stats = sub->Update();  // the first prepares and copies; later ones find it current
    ASSERT_TRUE(stats.ok()) << stats.status();
    ASSERT_OK(sub->Sleep());
    LedgerSnapshot now;
    ASSERT_TRUE(testing::LedgerSettlesTo(baseline_, &now)) << now.ToString();
  }
  size_t free1 = 0;
  ASSERT_OK(cuda::MemInfo(&free1, &total));
  EXPECT_EQ(free0, free1) << "GPU memory not returned after 100 sleep/wake cycles";
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaIpc, testing::BothUpdateModes(), testing::UpdateModeName);

}  // namespace
}  // namespace weightsync
