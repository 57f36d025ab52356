// Version identity across trainer restarts: a subscriber tells versions apart by (lineage,
// publisher session, step), never by the step number alone. A restarted trainer that publishes a
// step number the subscriber already holds, or a lower one, is applied (LineagePolicy::kFollow) or
// refused with a clear error (kStrict), in one update (a handle whose publisher went away prepares
// again); a stale request keeps the prepared handle; a publisher
// that misreports the step it pinned is a protocol error that commits nothing. Also: a subscriber
// waits for a step with its own deadline, not the publisher's. Real publishers over real Unix
// sockets + shared memory, and over TCP loopback.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "testing/test_util.h"
#include "testing/transport_modes.h"
#include "util/fail_point.h"

namespace weightsync {
namespace {

using testing::SyntheticModel;
using util::FailAction;
using util::FailPoints;
using Clock = std::chrono::steady_clock;

// Content of a step of the restarted trainer: different bytes under a step number the subscriber
// may already hold.
constexpr int64_t kRestartedContent = 1000;

class Lineage : public ::testing::TestWithParam<testing::TransportMode> {
 protected:
  void SetUp() override { FailPoints::DisarmAll(); }
  void TearDown() override { FailPoints::DisarmAll(); }

  // A publisher (a trainer process) on the test's endpoint; the first one picks the endpoint (a
  // free tcp port), later ones (restarts) take the same.
  void StartPublisher(const std::string& lineage = "", int64_t resume_from = -1,
                      std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
    PublisherOptions o;
    o.endpoint = !endpoint_.empty() ? endpoint_
                 : GetParam().tcp   ? std::string("tcp://127.0.0.1:0")
                                    : testing::UniqueEndpoint("lineage");
    o.segment_bytes = 4096;
    o.timeout = timeout;
    o.lineage = lineage;
    o.resume_from_step = resume_from;
    ASSERT_OK_AND_ASSIGN(publisher_, Publisher::Create(o));
    ASSERT_OK(publisher_->Register(model_.Tensors()));
    endpoint_ = publisher_->endpoint();
  }
  // The trainer dies (its sessions end) and comes back.
  void RestartPublisher(const std::string& lineage = "", int64_t resume_from = -1) {
    publisher_.reset();
    StartPublisher(lineage, resume_from);
  }
  void Publish(int64_t step, int64_t content) {
    model_.Fill(content);
    auto r = publisher_->Publish(step);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  std::unique_ptr<Subscriber> Connect(
      LineagePolicy policy = LineagePolicy::kFollow,
      std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
    SubscriberOptions o;
    o.endpoint = endpoint_;
    o.mode = GetParam().mode;
    o.verify = true;
    o.timeout = timeout;
    o.lineage_policy = policy;
    return testing::NewSubscriber(o, dst_);
  }
  bool Holds(int64_t content, std::string* why) {
    return SyntheticModel::Holds(dst_, content, why);
  }

  SyntheticModel model_{12, 3000};
  std::vector<NamedTensor> tensors_ = model_.Tensors();
  std::vector<std::vector<uint8_t>> storage_ = SyntheticModel::PoisonedStorage(tensors_);
  std::vector<NamedTensor> dst_ = SyntheticModel::Views(tensors_, storage_);
  std::unique_ptr<Publisher> publisher_;
  std::string endpoint_;
};

TEST_P(Lineage, ARestartedTrainerRepublishingTheSameStepIsApplied) {
  StartPublisher();
  auto sub = Connect();
  for (int64_t step = 1; step <= 5; ++step) {
    Publish(step, step);
    ASSERT_OK(sub->Update());
  }
  const std::string first_lineage = sub->committed_lineage();
  EXPECT_EQ(first_lineage, publisher_->lineage());

  // Dies after step 5, restarts from its step-4 checkpoint, publishes a new step 5.
  RestartPublisher();
  Publish(5, kRestartedContent);
  // One update: the handle prepared against the dead publisher fails its first request, and
  // the update prepares again against the new one.
  Result<UpdateStats> stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats->handle_created);
  EXPECT_EQ(stats->prepare_count, 2u);
  EXPECT_EQ(stats->step, 5);
  EXPECT_FALSE(stats->up_to_date) << "the new step 5 is not the version the subscriber held";
  EXPECT_TRUE(stats->lineage_changed);
  EXPECT_GT(stats->bytes, 0u);
  EXPECT_EQ(stats->lineage.view(), publisher_->lineage());
  EXPECT_NE(sub->committed_lineage(), first_lineage);
  std::string why;
  EXPECT_TRUE(Holds(kRestartedContent, &why)) << why;

  // Within the new session, steps compare again: the same step is up to date.
  stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats->up_to_date);
  EXPECT_FALSE(stats->lineage_changed);
}

TEST_P(Lineage, ARestartResumingFromAnOlderStepIsAppliedUnderTheSameLineage) {
  StartPublisher("run-7");
  auto sub = Connect();
  for (int64_t step = 1; step <= 5; ++step) Publish(step, step);
  ASSERT_OK(sub->Update());
  ASSERT_EQ(sub->committed_step(), 5);

  // The trainer resumes lineage run-7 from its step-3 checkpoint: its next step is 4.
  RestartPublisher("run-7", /*resume_from=*/3);
  EXPECT_STATUS_IS(kFailedPrecondition, publisher_->Publish(3),
                   "step 3 is not after step 3, which this publisher resumes lineage 'run-7' from");
  Publish(4, kRestartedContent);
  Result<UpdateStats> stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->step, 4);
  EXPECT_TRUE(stats->lineage_changed);
  EXPECT_EQ(stats->lineage.view(), "run-7");
  EXPECT_EQ(sub->committed_step(), 4);
  std::string why;
  EXPECT_TRUE(Holds(kRestartedContent, &why)) << why;
  // And it goes on from there.
  Publish(5, kRestartedContent + 5);
  stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->step, 5);
  EXPECT_FALSE(stats->up_to_date);
  EXPECT_FALSE(stats->lineage_changed);
  EXPECT_TRUE(Holds(kRestartedContent + 5, &why)) << why;
}

TEST_P(Lineage, StrictPolicyKeepsStepsMovingForwardAcrossRestarts) {
  StartPublisher("run-8");
  auto sub = Connect(LineagePolicy::kStrict);
  for (int64_t step = 1; step <= 5; ++step) Publish(step, step);
  ASSERT_OK(sub->Update());
  const auto before = testing::Digests(dst_);

  // Same lineage, restarted at step 5 again: not newer than what is held — refused, not
  // "up to date", weights untouched.
  RestartPublisher("run-8", /*resume_from=*/4);
  Publish(5, kRestartedContent);
  Result<UpdateStats> stats = sub->Update();
  ASSERT_STATUS_IS(kFailedPrecondition, stats, "restarted lineage 'run-8'",
                   "not newer than the committed step 5");
  EXPECT_EQ(testing::Digests(dst_), before);
  EXPECT_EQ(sub->committed_step(), 5);
  EXPECT_TRUE(sub->weights_valid());
  // The refusal kept the handle; once the restarted trainer passes step 5 it is applied.
  Publish(6, kRestartedContent + 6);
  stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_FALSE(stats->handle_created);
  EXPECT_EQ(stats->step, 6);
  EXPECT_TRUE(stats->lineage_changed);
  std::string why;
  EXPECT_TRUE(Holds(kRestartedContent + 6, &why)) << why;

  // Another lineage: refused, naming both, until an update asks for it.
  RestartPublisher("other-run");
  Publish(1, kRestartedContent + 1);
  stats = sub->Update();
  ASSERT_STATUS_IS(kFailedPrecondition, stats, "lineage 'other-run' (committed: 'run-8')",
                   "accept_new_lineage");
  EXPECT_EQ(sub->committed_step(), 6);
  EXPECT_TRUE(Holds(kRestartedContent + 6, &why)) << why;
  stats = sub->Update(UpdateOptions{.accept_new_lineage = true});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_FALSE(stats->handle_created) << "the refusal kept the prepared handle";
  EXPECT_EQ(stats->step, 1);
  EXPECT_EQ(stats->lineage.view(), "other-run");
  EXPECT_TRUE(Holds(kRestartedContent + 1, &why)) << why;
}

TEST_P(Lineage, AStaleStepRequestIsRefusedAndKeepsThePreparedHandle) {
  StartPublisher();
  auto sub = Connect();
  for (int64_t step = 1; step <= 5; ++step) Publish(step, step);
  ASSERT_OK(sub->Update());
  Result<UpdateStats> stats = sub->Update(3);
  ASSERT_STATUS_IS(kFailedPrecondition, stats, "not newer than the committed step 5");
  Publish(6, 6);
  stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_FALSE(stats->handle_created) << "a refused request must not cost the handle";
  EXPECT_EQ(stats->prepare_count, 1u);
}

TEST_P(Lineage, APublisherOfferingAStepOlderThanTheCommittedOneIsAProtocolError) {
  StartPublisher();
  auto sub = Connect();
  Publish(1, 1);
  Publish(2, 2);
  ASSERT_OK(sub->Update());
  const auto before = testing::Digests(dst_);
  Publish(3, 3);
  FailPoints::Arm("publisher.offer_older_step", FailAction::kFlip, 0, 1);
  Result<UpdateStats> stats = sub->Update();
  ASSERT_EQ(FailPoints::Hits("publisher.offer_older_step"), 1) << "fault never injected";
  ASSERT_STATUS_IS(kProtocolError, stats, "publisher offered step 1");
  EXPECT_EQ(sub->committed_step(), 2);
  EXPECT_TRUE(sub->weights_valid());
  EXPECT_EQ(testing::Digests(dst_), before);
  // The next update rebuilds the handle and takes step 3.
  stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats->handle_created);
  std::string why;
  EXPECT_TRUE(Holds(3, &why)) << why;
}

TEST_P(Lineage, ASubscriberWaitsForAStepWithItsOwnDeadline) {
  // The publisher's timeout is 1 s, the subscriber's 8 s; the step comes after 2.5 s, first on a
  // connection that waits for the publisher's first Publish, then on a prepared handle.
  StartPublisher("", -1, std::chrono::milliseconds(1000));
  auto sub = Connect(LineagePolicy::kFollow, std::chrono::milliseconds(8000));
  for (int64_t step : {1, 2}) {
    std::thread late([&, step] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      Publish(step, step);
    });
    const auto t0 = Clock::now();
    Result<UpdateStats> stats = sub->Update(step);
    late.join();
    ASSERT_TRUE(stats.ok()) << "step " << step << ": " << stats.status();
    EXPECT_EQ(stats->step, step);
    EXPECT_GT(std::chrono::duration<double>(Clock::now() - t0).count(), 2.0);
    std::string why;
    EXPECT_TRUE(Holds(step, &why)) << why;
  }
}

TEST_P(Lineage, APublisherTimeoutWaitingForAStepEndsTheWaitWithAnErrorThatSaysWhy) {
  // The subscriber asks for a step that never comes: its own deadline ends the wait as Timeout
  // (not PeerLost), and the publisher goes on serving.
  StartPublisher("", -1, std::chrono::milliseconds(300));
  auto sub = Connect(LineagePolicy::kFollow, std::chrono::milliseconds(1500));
  Publish(1, 1);
  ASSERT_OK(sub->Update());
  const auto t0 = Clock::now();
  Result<UpdateStats> stats = sub->Update(2);
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_STATUS_IS(kTimeout, stats);
  EXPECT_GT(waited, 1.2) << "ended by the publisher's 0.3 s, not the subscriber's 1.5 s";
  Publish(2, 2);
  ASSERT_OK(sub->Update());
}

INSTANTIATE_TEST_SUITE_P(Transports, Lineage, testing::AllTransportModes(),
                         testing::TransportModeName);

TEST(LineageShm, APublisherNamingASlotPastItsArenaIsAProtocolErrorAndNothingIsWritten) {
  for (UpdateMode mode : {UpdateMode::kStaged, UpdateMode::kInPlace}) {
    SCOPED_TRACE(mode == UpdateMode::kStaged ? "staged" : "in_place");
    FailPoints::DisarmAll();
    SyntheticModel model(12, 3000);
    std::vector<NamedTensor> tensors = model.Tensors();
    auto storage = SyntheticModel::PoisonedStorage(tensors);
    auto dst = SyntheticModel::Views(tensors, storage);
    auto publisher = Publisher::Create({.endpoint = testing::UniqueEndpoint("slot"), .slots = 2});
    ASSERT_TRUE(publisher.ok()) << publisher.status();
    ASSERT_OK((*publisher)->Register(tensors));
    model.Fill(1);
    ASSERT_OK((*publisher)->Publish(1));
    auto sub =
        Subscriber::Create({.endpoint = (*publisher)->endpoint(), .mode = mode, .verify = true});
    ASSERT_TRUE(sub.ok()) << sub.status();
    ASSERT_OK((*sub)->Register(dst));
    ASSERT_OK((*sub)->Update());
    const auto before = testing::Digests(dst);
    model.Fill(2);
    ASSERT_OK((*publisher)->Publish(2));
    FailPoints::Arm("publisher.offer_bad_slot", FailAction::kFlip, 0, 1);
    Result<UpdateStats> stats = (*sub)->Update();
    ASSERT_EQ(FailPoints::Hits("publisher.offer_bad_slot"), 1) << "fault never injected";
    ASSERT_STATUS_IS(kProtocolError, stats, "in slot 2 but the arena has 2 slots");
    EXPECT_EQ((*sub)->committed_step(), 1);
    EXPECT_TRUE((*sub)->weights_valid());
    EXPECT_EQ(testing::Digests(dst), before);
    ASSERT_OK((*sub)->Update());
    std::string why;
    EXPECT_TRUE(SyntheticModel::Holds(dst, 2, &why)) << why;
  }
  FailPoints::DisarmAll();
}

TEST(LineageOptions, ResumingNeedsALineageAndLineagesAreNames) {
  auto p = Publisher::Create({.endpoint = testing::UniqueEndpoint("opt"), .resume_from_step = 4});
  ASSERT_STATUS_IS(kInvalidArgument, p, "needs PublisherOptions.lineage");
  p = Publisher::Create({.endpoint = testing::UniqueEndpoint("opt"), .lineage = "run 1"});
  ASSERT_STATUS_IS(kInvalidArgument, p, "outside [A-Za-z0-9._:-]");
  p = Publisher::Create({.endpoint = testing::UniqueEndpoint("opt")});
  ASSERT_TRUE(p.ok()) << p.status();
  auto q = Publisher::Create({.endpoint = testing::UniqueEndpoint("opt")});
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ((*p)->lineage().size(), 16u);
  EXPECT_NE((*p)->lineage(), (*q)->lineage()) << "each start without a lineage begins a new one";
}

}  // namespace
}  // namespace weightsync
