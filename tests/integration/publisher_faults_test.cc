// Multi-process fault tests: the publisher runs in its own process (tests/helpers/publisher_main),
// is SIGKILLed or SIGSTOPped at a chosen moment, and the subscriber must report a typed error
// within its deadline with nothing lost (RELIABILITY.md N1–N4).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <thread>

#include "testing/publisher_process.h"
#include "testing/test_util.h"
#include "util/fail_point.h"

namespace weightsync {
namespace {

using testing::SyntheticModel;
using util::FailAction;
using util::FailPoints;
using Clock = std::chrono::steady_clock;

constexpr int kTensors = 24;
// Large enough (about 40 MB) that a step's bytes do not fit in loopback socket buffers.
constexpr int64_t kElements = 600000;
// A 40 MB step must fit in the deadline under a sanitizer too (5–15× slower, on a shared machine);
// the slack allowed past a deadline grows with it.
constexpr auto kTimeout = std::chrono::milliseconds(testing::kUnderSanitizer ? 10000 : 2000);
constexpr auto kSlack = std::chrono::milliseconds(testing::kUnderSanitizer ? 2000 : 500);

enum class Transport { kShm, kTcp };
struct Param {
  UpdateMode mode;
  Transport transport;
};

class PublisherFaults : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    FailPoints::DisarmAll();
    baseline_ = ReadLedger();
    ASSERT_NO_FATAL_FAILURE(publisher_.Start(GetParam().transport == Transport::kShm
                                                 ? testing::UniqueEndpoint("faults")
                                                 : std::string("tcp://127.0.0.1:0")));
    // The subscriber's destinations mirror the publisher's synthetic model.
    like_ = model_.Tensors();
    storage_ = SyntheticModel::PoisonedStorage(like_);
    dst_ = SyntheticModel::Views(like_, storage_);
    SubscriberOptions o;
    o.endpoint = publisher_.endpoint();
    o.mode = GetParam().mode;
    o.verify = true;
    o.timeout = kTimeout;
    ASSERT_OK_AND_ASSIGN(sub_, Subscriber::Create(o));
    ASSERT_OK(sub_->Register(dst_));
  }
  void TearDown() override { FailPoints::DisarmAll(); }

  // tcp://127.0.0.1:0 becomes the bound port; a restarted publisher reuses it.
  void RestartPublisher() { ASSERT_NO_FATAL_FAILURE(publisher_.Start(publisher_.endpoint())); }
  void Publish(int64_t step) { ASSERT_NO_FATAL_FAILURE(publisher_.Publish(step)); }
  void UpdateTo(int64_t step) {
    auto stats = sub_->Update(step);
    ASSERT_TRUE(stats.ok()) << stats.status();
    std::string why;
    ASSERT_TRUE(SyntheticModel::Holds(dst_, step, &why)) << why;
  }
  void ExpectLedgerAtBaseline() {
    LedgerSnapshot now = ReadLedger();
    EXPECT_TRUE(now.SameLiveCounts(baseline_))
        << "ledger " << now.ToString() << " vs baseline " << baseline_.ToString();
  }

  SyntheticModel model_{kTensors, kElements};
  LedgerSnapshot baseline_;
  testing::PublisherProcess publisher_{"publisher",
                                       {std::to_string(kTensors), std::to_string(kElements)}};
  std::vector<NamedTensor> like_, dst_;
  std::vector<std::vector<uint8_t>> storage_;
  std::unique_ptr<Subscriber> sub_;
};

TEST_P(PublisherFaults, KilledMidCopyGivesPeerLostAndKeepsOldVersion) {
  Publish(1);
  UpdateTo(1);
  const std::vector<uint64_t> before = testing::Digests(dst_);
  Publish(2);

  // Hold the subscriber just before its copy of step 2, then kill the publisher.
  FailPoints::Arm("subscriber.before_copy", FailAction::kSleep, 300, 1);
  std::thread killer([&] {
    if (testing::WaitForFailPointHits("subscriber.before_copy")) {
      publisher_.process().Signal(SIGKILL);
    }
  });
  auto t0 = Clock::now();
  auto stats = sub_->Update(2);
  auto elapsed = Clock::now() - t0;
  killer.join();

  ASSERT_EQ(FailPoints::Hits("subscriber.before_copy"), 1) << "the copy was never paused";
  int status = publisher_.process().Wait();
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "publisher not killed";
  ASSERT_STATUS_IS(kPeerLost, stats, "step 2");
  EXPECT_LT(elapsed, kTimeout);
  EXPECT_EQ(sub_->committed_step(), 1);
  if (GetParam().mode == UpdateMode::kStaged) {
    EXPECT_TRUE(sub_->weights_valid());
    EXPECT_EQ(testing::Digests(dst_), before) << "staged update changed committed weights";
  } else {
    EXPECT_FALSE(sub_->weights_valid());
    EXPECT_STATUS_IS(kPeerLost, stats, "invalid");
  }
  ExpectLedgerAtBaseline();

  // A new publisher on the same endpoint: the next update rebuilds the handle and succeeds.
  RestartPublisher();
  Publish(3);
  auto again = sub_->Update(3);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->handle_created);
  EXPECT_EQ(again->prepare_count, 2u);
  EXPECT_TRUE(sub_->weights_valid());
  std::string why;
  EXPECT_TRUE(SyntheticModel::Holds(dst_, 3, &why)) << why;
}

TEST_P(PublisherFaults, StoppedPublisherTimesOutWithinDeadline) {
  Publish(1);
  UpdateTo(1);
  const std::vector<uint64_t> before = testing::Digests(dst_);
  Publish(2);
  ASSERT_TRUE(publisher_.process().Stop()) << "publisher did not stop";
  auto t0 = Clock::now();
  auto stats = sub_->Update(2);
  auto elapsed = Clock::now() - t0;
  publisher_.process().Signal(SIGCONT);
  ASSERT_STATUS_IS(kTimeout, stats);
  EXPECT_GE(elapsed, kTimeout - std::chrono::milliseconds(50));
  EXPECT_LT(elapsed, kTimeout + kSlack);
  EXPECT_EQ(testing::Digests(dst_), before);  // nothing was copied: the step never began
  EXPECT_TRUE(sub_->weights_valid());
  ExpectLedgerAtBaseline();
  // The publisher runs again: the next update re-prepares and succeeds.
  auto again = sub_->Update(2);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->handle_created);
}

TEST_P(PublisherFaults, PublisherGoneBeforeUpdateIsNotFoundThenRecovers) {
  Publish(1);
  UpdateTo(1);
  publisher_.process().Signal(SIGKILL);
  publisher_.process().Wait();
  // The connection from step 1 is gone (PeerLost on the reused handle), so the update prepares
  // again — and nobody serves the endpoint now: it fails clearly within the deadline.
  auto t0 = Clock::now();
  auto stats = sub_->Update();
  EXPECT_LT(Clock::now() - t0, kTimeout + kSlack);
  ASSERT_STATUS_IS(kNotFound, stats);
  ExpectLedgerAtBaseline();
  auto none = sub_->Update();
  ASSERT_STATUS_IS(kNotFound, none);
  RestartPublisher();
  Publish(5);
  UpdateTo(5);
}

INSTANTIATE_TEST_SUITE_P(ModesAndTransports, PublisherFaults,
                         ::testing::Values(Param{UpdateMode::kStaged, Transport::kShm},
                                           Param{UpdateMode::kInPlace, Transport::kShm},
                                           Param{UpdateMode::kStaged, Transport::kTcp},
                                           Param{UpdateMode::kInPlace, Transport::kTcp}),
                         [](const auto& info) {
                           return std::string(info.param.transport == Transport::kShm ? "shm_"
                                                                                      : "tcp_") +
                                  (info.param.mode == UpdateMode::kStaged ? "staged" : "in_place");
                         });

}  // namespace
}  // namespace weightsync
