// nccl end to end (label gpu; needs 2 CUDA devices and libnccl, skips otherwise): a publisher
// process (tests/helpers/gpu_publisher_main.cc) keeps CUDA tensors and its GPU arena on cuda:0 and
// listens on tcp://127.0.0.1:0 with a token; this process subscribes into CUDA destinations on
// cuda:1. The tcp connection is the authenticated control channel, the bytes move over a
// two-rank NCCL communicator created once per handle. Bit-exact round trips (bf16, fp32 and the
// synthetic model's other dtypes) into poisoned destinations with one live communicator, 100
// steps on one communicator, a publisher SIGKILLed mid-transfer (typed error within the
// deadline, nothing committed, communicator aborted, the next update rebuilds it), a stalled
// subscriber timed out by the publisher (which aborts, unpins and keeps serving), two subscribers
// served at once, and sleep/wake cycles that rebuild the communicator. Corruption caught on the
// GPU is the conformance suite's nccl rows (tests/gpu/conformance_test.cc). NVLink multicast
// stays off (NCCL_NVLS_ENABLE=0).
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <new>
#include <thread>

#include "cuda/device.h"
#include "cuda/nccl_link.h"
#include "cuda/vmm.h"
#include "gpu/gpu_test_util.h"
#include "testing/test_util.h"
#include "util/fail_point.h"

// Counts host heap allocations (g_new_calls) to show a steady update makes none.
#include "testing/count_new.inc"
#include "testing/transport_modes.h"

namespace weightsync {
namespace {

using Clock = std::chrono::steady_clock;
using testing::ChildProcess;
using testing::SyntheticModel;
using util::FailAction;
using util::FailPoints;

constexpr int kTensors = 24;
constexpr int64_t kElements = 200000;
constexpr char kToken[] = "nccl test token, 32 bytes long..";
constexpr auto kTimeout = std::chrono::milliseconds(5000);

class Nccl : public ::testing::TestWithParam<UpdateMode> {
 protected:
  static void SetUpTestSuite() {
    // Before NCCL reads its environment (the first communicator): never NVLink multicast.
    ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  }

  void SetUp() override {
    WS_SKIP_WITHOUT_GPU();
    if (cuda::DeviceCount() < 2)
      GTEST_SKIP() << "needs 2 CUDA devices, found " << cuda::DeviceCount();
    if (Status s = cuda::nccl::NcclAvailable(); !s.ok()) GTEST_SKIP() << "needs NCCL: " << s;
    FailPoints::DisarmAll();
    StartPublisher("tcp://127.0.0.1:0");
    like_ = model_.Tensors();
    AllocateDestinations(&dst_, &buffers_);
    if (HasFatalFailure()) return;
    baseline_ = ReadLedger();
    live_baseline_ = cuda::nccl::LiveCommunicators();
  }

  // Starts the publisher on `endpoint` (replacing one already running); endpoint_ becomes the
  // address it bound.
  void StartPublisher(const std::string& endpoint, int tensors = kTensors,
                      int64_t elements = kElements) {
    publisher_ =
        ChildProcess::Spawn({testing::HelperPath("gpu_publisher"), endpoint,
                             std::to_string(tensors), std::to_string(elements), "0"},
                            {"NCCL_NVLS_ENABLE=0", std::string("WEIGHTSYNC_TOKEN=") + kToken});
    std::string ready = publisher_.ReadLine(60000);
    ASSERT_EQ(ready.rfind("ready tcp://127.0.0.1:", 0), 0u) << ready;
    endpoint_ = ready.substr(6);
  }
  void Publish(int64_t step) {
    ASSERT_EQ(publisher_.Command("publish " + std::to_string(step)), "ok " + std::to_string(step));
  }
  std::unique_ptr<Subscriber> Connect(bool verify = true,
                                      std::chrono::milliseconds timeout = kTimeout,
                                      const std::vector<NamedTensor>* dst = nullptr) {
    SubscriberOptions o;
    o.endpoint = endpoint_;
    o.token = kToken;
    o.mode = GetParam();
    o.verify = verify;
    o.timeout = timeout;
    return testing::NewSubscriber(o, dst != nullptr ? *dst : dst_);
  }
  // Poison-filled CUDA destinations on cuda:1 shaped like the model.
  void AllocateDestinations(std::vector<NamedTensor>* dst, std::vector<cuda::DeviceBuffer>* keep) {
    ASSERT_OK(cuda::SetDevice(1));
    ASSERT_OK_AND_ASSIGN(*dst, cuda::testing::PoisonedDestinations(like_, 1, keep));
  }
  // Downloads every destination and compares it with the model at `step`.
  bool Holds(int64_t step, std::string* why, const std::vector<NamedTensor>* dst = nullptr) {
    return cuda::testing::DestinationsHold(dst != nullptr ? *dst : dst_, like_, step, why);
  }

  SyntheticModel model_{kTensors, kElements};
  std::string endpoint_;
  ChildProcess publisher_;
  std::vector<NamedTensor> like_, dst_;
  std::vector<cuda::DeviceBuffer> buffers_;
  LedgerSnapshot baseline_;
  int64_t live_baseline_ = 0;
};

TEST_P(Nccl, RoundTripIsBitExactIntoPoisonedDestinations) {
  // The model cycles through bf16, fp32, fp16, int8, fp8, int64, bool and uint16 tensors.
  ASSERT_EQ(like_[0].view.dtype, DType::kBFloat16);
  ASSERT_EQ(like_[1].view.dtype, DType::kFloat32);
  Publish(1);
  auto sub = Connect();
  auto stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats->verified);
  EXPECT_TRUE(stats->handle_created);
  EXPECT_EQ(stats->bytes, model_.total_bytes());
  EXPECT_EQ(cuda::nccl::LiveCommunicators(), live_baseline_ + 1);
  std::string why;
  EXPECT_TRUE(Holds(1, &why)) << why;
  Publish(2);
  auto second = sub->Update();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->handle_created);
  EXPECT_TRUE(Holds(2, &why)) << why;
  ASSERT_OK(sub->Close());
  EXPECT_EQ(cuda::nccl::LiveCommunicators(), live_baseline_);
  LedgerSnapshot now;
  EXPECT_TRUE(testing::LedgerSettlesTo(baseline_, &now)) << now.ToString();
}

TEST_P(Nccl, HundredStepsOnOneCommunicator) {
  auto sub = Connect(/*verify=*/true);
  int64_t allocations_in_updates = 0;
  size_t free_before = 0, total = 0, free_after = 0;
  double seconds = 0;
  for (int step = 1; step <= 100; ++step) {
    Publish(step);
    int64_t before = g_new_calls.load();
    auto stats = sub->Update(step);
    int64_t after = g_new_calls.load();
    ASSERT_TRUE(stats.ok()) << "step " << step << ": " << stats.status();
    ASSERT_EQ(stats->handle_created, step == 1) << "step " << step;
    ASSERT_EQ(stats->prepare_count, 1u);
    if (step > 10) {
      allocations_in_updates += after - before;
      seconds += stats->seconds;
    }
    if (step == 10) ASSERT_OK(cuda::MemInfo(&free_before, &total));
  }
  ASSERT_OK(cuda::MemInfo(&free_after, &total));
  std::cout << "  90 steady nccl updates of " << model_.total_bytes()
            << " bytes: " << seconds / 90 * 1e3 << " ms each, " << allocations_in_updates
            << " host allocations in all\n";
  EXPECT_EQ(allocations_in_updates, 0) << "host heap allocations in 90 steady updates";
  EXPECT_EQ(free_before, free_after) << "GPU memory changed over 90 steady updates";
  EXPECT_EQ(cuda::nccl::LiveCommunicators(), live_baseline_ + 1);
  std::string why;
  EXPECT_TRUE(Holds(100, &why)) << why;
}

TEST_P(Nccl, PublisherKilledMidTransferIsATypedErrorAndTheNextUpdateRebuilds) {
  Publish(1);
  auto sub = Connect();
  ASSERT_OK(sub->Update());
  Publish(2);
  const int64_t aborted_before = cuda::nccl::AbortedCommunicators();
  // The subscriber holds before posting its receives; meanwhile the publisher has answered
  // step_begin and is blocked in its grouped ncclBroadcast. It is killed there.
  FailPoints::Arm("subscriber.before_copy", FailAction::kSleep, 1000, 1);
  std::atomic<bool> killed{false};
  std::thread killer([&] {
    while (FailPoints::Hits("subscriber.before_copy") == 0) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    publisher_.Signal(SIGKILL);
    killed = true;
  });
  auto t0 = Clock::now();
  auto stats = sub->Update();
  auto elapsed = Clock::now() - t0;
  killer.join();
  ASSERT_TRUE(killed);
  int status = publisher_.Wait();
  ASSERT_TRUE(WIFSIGNALED(status));
  ASSERT_EQ(FailPoints::Hits("subscriber.before_copy"), 1);
  ASSERT_FALSE(stats.ok());
  const Status& s = stats.status();
  EXPECT_TRUE(s.code() == StatusCode::kPeerLost || s.code() == StatusCode::kTimeout) << s;
  std::cout << "  after the kill: " << s << " in "
            << std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count() << " ms\n";
  EXPECT_LT(elapsed, kTimeout + std::chrono::seconds(3)) << s;
  EXPECT_NE(s.message().find("step 2"), std::string::npos) << s;
  EXPECT_NE(s.message().find("communicator aborted"), std::string::npos) << s;
  EXPECT_GT(cuda::nccl::AbortedCommunicators(), aborted_before);
  EXPECT_EQ(cuda::nccl::LiveCommunicators(), live_baseline_);
  std::string why;
  if (GetParam() == UpdateMode::kStaged) {
    EXPECT_TRUE(Holds(1, &why)) << why;  // old weights intact
    EXPECT_TRUE(sub->weights_valid());
  } else {
    EXPECT_FALSE(sub->weights_valid());
  }
  EXPECT_EQ(sub->committed_step(), 1);
  LedgerSnapshot now;
  EXPECT_TRUE(testing::LedgerSettlesTo(baseline_, &now)) << now.ToString();

  // A new publisher on the same address; the next update builds a new communicator.
  const std::string address = endpoint_;
  StartPublisher(address);
  ASSERT_EQ(endpoint_, address);
  Publish(3);
  auto again = sub->Update();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->handle_created);
  EXPECT_EQ(again->step, 3);
  EXPECT_TRUE(Holds(3, &why)) << why;
  EXPECT_TRUE(sub->weights_valid());
  EXPECT_EQ(cuda::nccl::LiveCommunicators(), live_baseline_ + 1);
}

TEST_P(Nccl, StalledSubscriberTimesOutOnThePublisherWhichKeepsServing) {
  // A step far larger than NCCL buffers (a broadcast root is done once its bytes sit in the
  // receiver's buffers, tens of MB: the 21 MB model would not stall the publisher at all), so the
  // publisher really waits on the stalled subscriber: 8 tensors of 40 M elements, about 1.1 GB.
  SyntheticModel big(8, 40'000'000);
  like_ = big.Tensors();
  dst_.clear();
  buffers_.clear();
  AllocateDestinations(&dst_, &buffers_);
  StartPublisher("tcp://127.0.0.1:0", 8, 40'000'000);
  Publish(1);
  auto sub = Connect(/*verify=*/true, /*timeout=*/std::chrono::seconds(20));
  ASSERT_OK(sub->Update());
  Publish(2);
  // The subscriber holds longer than the publisher's 5 s deadline before posting its receives:
  // the publisher's grouped ncclBroadcast times out, it aborts its communicator, unpins the slot
  // and drops the session. When the subscriber finally receives, the connection is gone.
  FailPoints::Arm("subscriber.before_copy", FailAction::kSleep, 6500, 1);
  auto stats = sub->Update();
  ASSERT_EQ(FailPoints::Hits("subscriber.before_copy"), 1);
  ASSERT_STATUS_IS(kPeerLost, stats);
  std::string why;
  if (GetParam() == UpdateMode::kStaged) {
    EXPECT_TRUE(Holds(1, &why)) << why;
  }
  EXPECT_EQ(cuda::nccl::LiveCommunicators(), live_baseline_);
  // Step 4 can only go into step 2's slot: it was unpinned after the abort.
  Publish(3);
  Publish(4);
  auto again = sub->Update();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->handle_created);
  EXPECT_EQ(again->step, 4);
  EXPECT_TRUE(Holds(4, &why)) << why;
}

TEST_P(Nccl, OnePublisherServesTwoSubscribersAtOnce) {
  // Two subscribers (each its own handle, publisher session and two-rank communicator) update
  // the same steps at the same time from two threads.
  std::vector<NamedTensor> other;
  std::vector<cuda::DeviceBuffer> other_buffers;
  AllocateDestinations(&other, &other_buffers);
  auto a = Connect();
  auto b = Connect(/*verify=*/true, kTimeout, &other);
  for (int step = 1; step <= 10; ++step) {
    Publish(step);
    Result<UpdateStats> ra = Status::Internal("not run"), rb = Status::Internal("not run");
    std::thread ta([&] { ra = a->Update(step); });
    std::thread tb([&] { rb = b->Update(step); });
    ta.join();
    tb.join();
    ASSERT_TRUE(ra.ok()) << "step " << step << ": " << ra.status();
    ASSERT_TRUE(rb.ok()) << "step " << step << ": " << rb.status();
    EXPECT_EQ(ra->handle_created, step == 1);
    EXPECT_EQ(rb->handle_created, step == 1);
  }
  EXPECT_EQ(cuda::nccl::LiveCommunicators(), live_baseline_ + 2);
  std::string why;
  EXPECT_TRUE(Holds(10, &why)) << why;
  EXPECT_TRUE(Holds(10, &why, &other)) << why;
}

TEST_P(Nccl, SleepWakeCyclesRebuildTheCommunicatorAndReturnToBaseline) {
  size_t free0 = 0, total = 0;
  auto sub = Connect();
  for (int cycle = 1; cycle <= 3; ++cycle) {
    Publish(cycle);
    auto stats = sub->Update();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_TRUE(stats->handle_created);
    std::string why;
    EXPECT_TRUE(Holds(cycle, &why)) << why;
    ASSERT_OK(sub->Sleep());
    EXPECT_EQ(cuda::nccl::LiveCommunicators(), live_baseline_);
    LedgerSnapshot now;
    ASSERT_TRUE(testing::LedgerSettlesTo(baseline_, &now)) << now.ToString();
    if (cycle == 1) ASSERT_OK(cuda::MemInfo(&free0, &total));
  }
  size_t free1 = 0;
  ASSERT_OK(cuda::MemInfo(&free1, &total));
  EXPECT_EQ(free0, free1) << "GPU memory not returned after sleep/wake cycles";
}

INSTANTIATE_TEST_SUITE_P(Modes, Nccl, testing::BothUpdateModes(), testing::UpdateModeName);

}  // namespace
}  // namespace weightsync
