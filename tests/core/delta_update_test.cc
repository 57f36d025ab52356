// Delta updates end to end (docs/deltas.md): a host publisher and subscribers in one process over
// real tcp loopback. The trainer changes a chosen fraction of its elements per step; every update
// must leave the destinations byte for byte equal to the trainer's tensors, whether the step came
// as deltas or whole, and must come whole whenever the subscriber does not hold exactly the base.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include "testing/sparse_trainer.h"
#include "testing/test_util.h"
#include "util/fail_point.h"

namespace weightsync {
namespace {

using testing::SparseTrainer;
using util::FailAction;
using util::FailPoints;

class DeltaUpdate : public ::testing::TestWithParam<UpdateMode> {
 protected:
  void SetUp() override { FailPoints::DisarmAll(); }
  void TearDown() override { FailPoints::DisarmAll(); }

  void StartPublisher(DeltaMode delta = DeltaMode::kAuto, int slots = 2,
                      const std::string& lineage = "", int64_t resume_from = -1,
                      bool tied = false) {
    PublisherOptions o;
    o.lineage = lineage;
    o.resume_from_step = resume_from;
    o.endpoint = endpoint_.empty() ? std::string("tcp://127.0.0.1:0") : endpoint_;
    o.slots = slots;
    o.segment_bytes = 4096;  // many segments even for a small model
    o.timeout = publisher_timeout_;
    o.delta = delta;
    ASSERT_OK_AND_ASSIGN(publisher_, Publisher::Create(o));
    std::vector<NamedTensor> tensors = trainer_.Tensors();
    if (tied) tensors.push_back(trainer_.Tied());
    ASSERT_OK(publisher_->Register(tensors));
    endpoint_ = publisher_->endpoint();
  }
  // `wait`: Publish returns once its deltas are encoded too, and its stats count them.
  PublishStats Publish(int64_t step, double fraction, bool wait = true) {
    if (step > 1) trainer_.Step(fraction);
    PublishOptions options;
    options.wait_for_deltas = wait;
    auto r = publisher_->Publish(step, options);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : PublishStats{};
  }
  std::unique_ptr<Subscriber> Connect(std::vector<std::vector<uint8_t>>& storage, bool delta = true,
                                      bool verify = false,
                                      LineagePolicy lineage_policy = LineagePolicy::kFollow,
                                      const std::vector<NamedTensor>& more = {}) {
    SubscriberOptions o;
    o.lineage_policy = lineage_policy;
    o.endpoint = endpoint_;
    o.mode = GetParam();
    o.verify = verify;
    o.delta = delta;
    o.timeout = subscriber_timeout_;
    std::vector<NamedTensor> views = trainer_.Views(storage);
    views.insert(views.end(), more.begin(), more.end());
    return testing::NewSubscriber(o, views);
  }

  SparseTrainer trainer_;
  std::string endpoint_;
  std::unique_ptr<Publisher> publisher_;
  std::vector<std::vector<uint8_t>> dst_ = trainer_.Poisoned();
  std::chrono::milliseconds publisher_timeout_{5000}, subscriber_timeout_{5000};
};

TEST_P(DeltaUpdate, AThousandStepsLandExactlyWhateverFractionChanged) {
  StartPublisher();
  Publish(1, 0);
  auto sub = Connect(dst_);
  auto first = sub->Update();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->delta_base_step, -1);  // nothing to diff against yet
  EXPECT_EQ(first->received_bytes, first->bytes);
  ASSERT_TRUE(trainer_.HeldBy(dst_));
  const double fractions[] = {0.01, 0, 0.02, 0.3, 1.0, 0.001, 0.05};
  int64_t step = 1;
  // 1,001 steps, each fraction in turn; every other Publish returns before its deltas are
  // encoded (the default), the update waiting for them.
  for (int round = 0; round < 143; ++round) {
    for (double fraction : fractions) {
      SCOPED_TRACE("step " + std::to_string(step + 1) + ", fraction " + std::to_string(fraction));
      ++step;
      const bool wait = step % 2 == 0;
      const PublishStats published = Publish(step, fraction, wait);
      EXPECT_EQ(published.delta_base_step, step - 1);
      if (wait) {
        EXPECT_FALSE(published.delta_pending);
      }
      auto stats = sub->Update();
      ASSERT_TRUE(stats.ok()) << stats.status();
      ASSERT_EQ(stats->step, step);
      ASSERT_TRUE(trainer_.HeldBy(dst_));
      EXPECT_EQ(stats->delta_base_step, step - 1);
      EXPECT_EQ(stats->bytes, trainer_.total_bytes());
      if (fraction <= 0.02) {
        // Sparse: most segments as deltas, far fewer bytes than the model.
        EXPECT_GT(stats->delta_segments, 0u);
        // The buffer the deltas came in is extra memory, in place too, reported by the update
        // that grew it.
        if (fraction > 0) {
          EXPECT_GT(stats->staging_bytes, first->staging_bytes);
        }
        EXPECT_LT(stats->received_bytes, stats->bytes / 4);
        if (!published.delta_pending) {
          EXPECT_EQ(stats->delta_segments, published.delta_segments);
        }
      }
      if (fraction >= 0.3) {
        // Dense: a quarter of a segment cannot hold its delta, so it comes whole.
        EXPECT_EQ(stats->delta_segments, 0u);
        EXPECT_EQ(stats->received_bytes, stats->bytes);
      }
    }
  }
}

// The publisher diffs each version against the one before it: a subscriber that missed a step
// holds neither, so it gets the step whole, and deltas again from then on.
TEST_P(DeltaUpdate, AMissedStepComesWholeThenDeltasResume) {
  StartPublisher(DeltaMode::kAuto, /*slots=*/3);
  Publish(1, 0);
  auto sub = Connect(dst_);
  ASSERT_OK(sub->Update().status());
  Publish(2, 0.01);
  Publish(3, 0.01);
  auto missed = sub->Update();
  ASSERT_TRUE(missed.ok()) << missed.status();
  EXPECT_EQ(missed->step, 3);
  EXPECT_EQ(missed->delta_base_step, -1);
  EXPECT_EQ(missed->received_bytes, missed->bytes);
  ASSERT_TRUE(trainer_.HeldBy(dst_));
  Publish(4, 0.01);
  auto next = sub->Update();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->delta_base_step, 3);
  EXPECT_LT(next->received_bytes, next->bytes / 4);
  ASSERT_TRUE(trainer_.HeldBy(dst_));
}

// A subscriber that joins late holds nothing: whole first, then deltas, beside one that had
// every step.
TEST_P(DeltaUpdate, ALateJoinerComesWholeBesideOneThatTakesDeltas) {
  StartPublisher();
  Publish(1, 0);
  auto early = Connect(dst_);
  ASSERT_OK(early->Update().status());
  for (int64_t step = 2; step <= 5; ++step) {
    Publish(step, 0.01);
    ASSERT_OK(early->Update().status());
  }
  std::vector<std::vector<uint8_t>> late_dst = trainer_.Poisoned();
  auto late = Connect(late_dst);
  auto joined = late->Update();
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->step, 5);
  EXPECT_EQ(joined->delta_base_step, -1);
  ASSERT_TRUE(trainer_.HeldBy(late_dst));
  Publish(6, 0.01);
  for (Subscriber* sub : {early.get(), late.get()}) {
    auto stats = sub->Update();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->delta_base_step, 5);
  }
  EXPECT_TRUE(trainer_.HeldBy(dst_));
  EXPECT_TRUE(trainer_.HeldBy(late_dst));
}

// A restarted trainer numbers its steps again from a checkpoint: its step 2 is not the step 2 the
// subscriber holds, and its delta of step 3 is against its own step 2. The subscriber must not
// ask for (or apply) a delta across the restart — even under the strict lineage policy, where the
// committed step number still orders the restarted session's steps.
TEST_P(DeltaUpdate, NoDeltaAcrossAPublisherRestart) {
  for (LineagePolicy policy : {LineagePolicy::kFollow, LineagePolicy::kStrict}) {
    SCOPED_TRACE(policy == LineagePolicy::kStrict ? "strict" : "follow");
    publisher_.reset();
    endpoint_.clear();
    dst_ = trainer_.Poisoned();
    StartPublisher(DeltaMode::kAuto, 2, "rl-run");
    Publish(1, 0);
    auto sub = Connect(dst_, /*delta=*/true, /*verify=*/false, policy);
    ASSERT_OK(sub->Update().status());
    Publish(2, 0.01);
    ASSERT_OK(sub->Update().status());
    // The trainer dies and resumes from its step-1 checkpoint with other bytes (another run of
    // the same seed would differ the same way).
    publisher_.reset();
    trainer_.Step(0.01);
    StartPublisher(DeltaMode::kAuto, 2, "rl-run", /*resume_from=*/1);
    Publish(2, 0);  // what the new session calls step 2
    Publish(3, 0.01);
    auto stats = sub->Update();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->step, 3);
    EXPECT_TRUE(stats->lineage_changed);
    EXPECT_EQ(stats->delta_base_step, -1);
    ASSERT_TRUE(trainer_.HeldBy(dst_));
  }
}

// After sleep() the handle is prepared again and the first step comes whole in both modes: staged,
// the new shadow holds nothing; in place, the engine may have dropped and reloaded its weights
// at the same addresses while asleep. Deltas resume from the next step.
TEST_P(DeltaUpdate, AfterSleepTheFirstStepComesWhole) {
  StartPublisher();
  Publish(1, 0);
  auto sub = Connect(dst_);
  ASSERT_OK(sub->Update().status());
  ASSERT_OK(sub->Sleep());
  Publish(2, 0.01);
  auto stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats->handle_created);
  EXPECT_EQ(stats->delta_base_step, -1);
  ASSERT_TRUE(trainer_.HeldBy(dst_));
  Publish(3, 0.01);
  stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->delta_base_step, 2);
  ASSERT_TRUE(trainer_.HeldBy(dst_));
}

// A publisher that claims a base it did not encode against: refused before any byte lands (staged:
// the old weights stay), and the next update comes whole, even with the publisher still lying.
TEST_P(DeltaUpdate, AWrongBaseIsRefusedAndTheNextUpdateComesWhole) {
  StartPublisher();
  Publish(1, 0);
  auto sub = Connect(dst_);
  ASSERT_OK(sub->Update().status());
  const auto held = dst_;
  Publish(2, 0.01);
  FailPoints::Arm("publisher.delta_wrong_base", FailAction::kFlip);
  auto refused = sub->Update();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kCorruption) << refused.status();
  EXPECT_NE(refused.status().message().find("not applied"), std::string::npos) << refused.status();
  EXPECT_GE(FailPoints::Hits("publisher.delta_wrong_base"), 1);
  EXPECT_EQ(sub->committed_step(), 1);
  if (GetParam() == UpdateMode::kStaged) {
    EXPECT_EQ(dst_, held);
    EXPECT_TRUE(sub->weights_valid());
  }
  auto whole = sub->Update();
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->step, 2);
  EXPECT_EQ(whole->delta_base_step, -1);
  ASSERT_TRUE(trainer_.HeldBy(dst_));
}

// Verification checks what the deltas rebuilt, not what came on the wire.
TEST_P(DeltaUpdate, VerificationCatchesAFlippedBitInWhatTheDeltasRebuilt) {
  StartPublisher();
  Publish(1, 0);
  auto sub = Connect(dst_, /*delta=*/true, /*verify=*/true);
  ASSERT_OK(sub->Update().status());
  Publish(2, 0.01);
  FailPoints::Arm("subscriber.flip_received", FailAction::kFlip, 0, 1);
  auto flipped = sub->Update();
  ASSERT_FALSE(flipped.ok());
  EXPECT_EQ(flipped.status().code(), StatusCode::kCorruption) << flipped.status();
  EXPECT_EQ(FailPoints::Hits("subscriber.flip_received"), 1);
  auto again = sub->Update();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->verified);
  ASSERT_TRUE(trainer_.HeldBy(dst_));
  Publish(3, 0.01);
  auto verified = sub->Update();
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_TRUE(verified->verified);
  EXPECT_EQ(verified->delta_base_step, 2);
  EXPECT_TRUE(trainer_.HeldBy(dst_));
}

// In place, a failed update leaves the destinations holding neither version: no delta applies to
// them. Here they hold step 3 (the copy landed, the commit failed) and the subscriber then asks
// for step 2, whose delta is against step 1, the committed one — applied to step 3's bytes it
// would leave the elements step 3 changed wrong.
TEST_P(DeltaUpdate, NoDeltaOntoWeightsAFailedUpdateLeftInvalid) {
  if (GetParam() != UpdateMode::kInPlace) GTEST_SKIP() << "staged keeps the weights intact";
  StartPublisher(DeltaMode::kAuto, /*slots=*/3);
  Publish(1, 0);
  auto sub = Connect(dst_);
  ASSERT_OK(sub->Update().status());
  Publish(2, 0.05);
  const auto step2 = trainer_.Snapshot();
  Publish(3, 0.05);
  FailPoints::Arm("subscriber.before_commit", FailAction::kError, 0, 1);
  ASSERT_FALSE(sub->Update().ok());
  EXPECT_EQ(FailPoints::Hits("subscriber.before_commit"), 1);
  EXPECT_FALSE(sub->weights_valid());
  UpdateOptions two;
  two.step = 2;
  auto stats = sub->Update(two);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->delta_base_step, -1);
  EXPECT_EQ(dst_, step2);
}

TEST_P(DeltaUpdate, EitherSideCanTurnDeltasOff) {
  for (bool subscriber_side : {true, false}) {
    SCOPED_TRACE(subscriber_side ? "SubscriberOptions::delta false" : "DeltaMode::kOff");
    publisher_.reset();
    endpoint_.clear();
    StartPublisher(subscriber_side ? DeltaMode::kAuto : DeltaMode::kOff);
    dst_ = trainer_.Poisoned();
    Publish(1, 0);
    auto sub = Connect(dst_, /*delta=*/!subscriber_side);
    ASSERT_OK(sub->Update().status());
    const PublishStats published = Publish(2, 0.01);
    EXPECT_EQ(published.delta_base_step, subscriber_side ? 1 : -1);
    auto stats = sub->Update();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->delta_base_step, -1);
    EXPECT_EQ(stats->delta_segments, 0u);
    EXPECT_EQ(stats->received_bytes, stats->bytes);
    EXPECT_TRUE(trainer_.HeldBy(dst_));
  }
}

// kAlways encodes every segment, dense ones too (their deltas larger than the segment): they
// still land exactly.
TEST_P(DeltaUpdate, EverySegmentAsADeltaEvenWhenLargerThanTheSegment) {
  StartPublisher(DeltaMode::kAlways);
  Publish(1, 0);
  auto sub = Connect(dst_, /*delta=*/true, /*verify=*/true);
  ASSERT_OK(sub->Update().status());
  for (int64_t step = 2; step <= 4; ++step) {
    const PublishStats published = Publish(step, step == 3 ? 1.0 : 0.5);
    EXPECT_EQ(published.whole_segments, 0u);
    auto stats = sub->Update();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->delta_segments, published.delta_segments);
    // Every element changed: every chunk whole, plus its directory byte.
    if (step == 3) {
      EXPECT_GT(stats->received_bytes, stats->bytes);
    }
    ASSERT_TRUE(trainer_.HeldBy(dst_));
  }
}

// Staged, a step that came as deltas is committed by writing what changed into the weights (they
// hold the committed version, as the shadow did), not by copying the whole shadow: a byte the
// engine changed behind weightsync's back stays changed — until a weights check finds it, after
// which the next update rewrites everything.
TEST_P(DeltaUpdate, AStagedCommitWritesOnlyWhatChanged) {
  if (GetParam() != UpdateMode::kStaged) GTEST_SKIP() << "in place writes the weights directly";
  StartPublisher();
  Publish(1, 0);
  auto sub = Connect(dst_);
  ASSERT_OK(sub->Update().status());
  dst_[1][8] ^= 0xFF;  // layers.0.b, which step 2 leaves as it is
  Publish(2, 0);
  auto stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->delta_base_step, 1);
  EXPECT_FALSE(trainer_.HeldBy(dst_));  // the commit did not copy the whole shadow
  dst_[1][8] ^= 0xFF;
  EXPECT_TRUE(trainer_.HeldBy(dst_));  // and wrote everything else
  dst_[1][8] ^= 0xFF;
  auto check = sub->CheckWeights();
  ASSERT_FALSE(check.ok());
  EXPECT_EQ(check.status().code(), StatusCode::kCorruption) << check.status();
  EXPECT_NE(check.status().message().find("layers.0.b"), std::string::npos) << check.status();
  Publish(3, 0.01);
  stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->delta_base_step, -1);
  EXPECT_TRUE(trainer_.HeldBy(dst_));
}

// A sharded trainer: two tcp publishers, each holding part of the model. Each proves its own base
// by its own digests and sends its own deltas; the update commits both shares.
TEST_P(DeltaUpdate, EachPublisherOfAShardedTrainerSendsItsShareAsDeltas) {
  const std::vector<NamedTensor> all = trainer_.Tensors();
  std::vector<std::unique_ptr<Publisher>> publishers;
  std::vector<std::string> endpoints;
  for (int rank = 0; rank < 2; ++rank) {
    PublisherOptions o;
    o.endpoint = "tcp://127.0.0.1:0";
    o.segment_bytes = 4096;
    o.timeout = std::chrono::milliseconds(5000);
    o.lineage = "sharded";
    ASSERT_OK_AND_ASSIGN(auto publisher, Publisher::Create(o));
    // Rank 0: the first two tensors; rank 1: the rest.
    ASSERT_OK(publisher->Register(rank == 0
                                      ? std::vector<NamedTensor>(all.begin(), all.begin() + 2)
                                      : std::vector<NamedTensor>(all.begin() + 2, all.end())));
    endpoints.push_back(publisher->endpoint());
    publishers.push_back(std::move(publisher));
  }
  SubscriberOptions o;
  o.endpoints = endpoints;
  o.mode = GetParam();
  o.verify = true;
  o.timeout = std::chrono::milliseconds(5000);
  auto sub = testing::NewSubscriber(o, trainer_.Views(dst_));
  for (int64_t step = 1; step <= 4; ++step) {
    if (step > 1) trainer_.Step(0.01);
    uint32_t encoded = 0;
    for (auto& publisher : publishers) {
      PublishOptions wait;
      wait.wait_for_deltas = true;
      auto published = publisher->Publish(step, wait);
      ASSERT_TRUE(published.ok()) << published.status();
      encoded += published->delta_segments;
    }
    auto stats = sub->Update();
    ASSERT_TRUE(stats.ok()) << stats.status();
    ASSERT_TRUE(trainer_.HeldBy(dst_));
    EXPECT_TRUE(stats->verified);
    EXPECT_EQ(stats->delta_base_step, step == 1 ? -1 : step - 1);
    EXPECT_EQ(stats->delta_segments, encoded);
    if (step > 1) {
      EXPECT_LT(stats->received_bytes, stats->bytes / 4);
    }
  }
}

// A publisher's tied tensor is its original's segments: a subscriber that keeps the two names in
// separate memory gets the original's deltas for both, and verification agrees.
TEST_P(DeltaUpdate, ATiedTensorTakesItsOriginalsDeltas) {
  StartPublisher(DeltaMode::kAuto, 2, "", -1, /*tied=*/true);
  Publish(1, 0);
  std::vector<uint8_t> head(trainer_.First().size(), 0xFF);
  const NamedTensor tied = trainer_.Tied();
  auto sub = Connect(dst_, /*delta=*/true, /*verify=*/true, LineagePolicy::kFollow,
                     {{tied.name, TensorView{head.data(), tied.view.dtype, tied.view.shape}}});
  ASSERT_OK(sub->Update().status());
  for (int64_t step = 2; step <= 4; ++step) {
    Publish(step, 0.01);
    auto stats = sub->Update();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_TRUE(stats->verified);
    EXPECT_EQ(stats->delta_base_step, step - 1);
    EXPECT_LT(stats->received_bytes, stats->bytes / 4);
    ASSERT_TRUE(trainer_.HeldBy(dst_));
    ASSERT_EQ(head, trainer_.First());
  }
}

// The encode runs off the trainer's path (docs/deltas.md): Publish returns while it still runs,
// and a subscriber asking for the step's deltas waits for them instead of getting whatever the
// slot's delta held before.
TEST_P(DeltaUpdate, PublishReturnsBeforeItsDeltasAreEncodedAndAnUpdateWaitsForThem) {
  StartPublisher();
  Publish(1, 0);
  auto sub = Connect(dst_, /*delta=*/true, /*verify=*/true);
  ASSERT_OK(sub->Update().status());
  // The encode's first segment takes 1.5 s: far longer than Publish takes to return.
  FailPoints::Arm("publisher.encode", FailAction::kSleep, 1500, /*count=*/1);
  const PublishStats published = Publish(2, 0.01, /*wait=*/false);
  EXPECT_EQ(published.delta_base_step, 1);
  EXPECT_TRUE(published.delta_pending);
  EXPECT_EQ(published.delta_segments, 0u);  // not counted yet
  auto stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(FailPoints::Hits("publisher.encode"), 1);
  EXPECT_EQ(stats->delta_base_step, 1);
  EXPECT_GT(stats->delta_segments, 0u);
  EXPECT_LT(stats->received_bytes, stats->bytes / 4);
  EXPECT_TRUE(stats->verified);
  EXPECT_TRUE(trainer_.HeldBy(dst_));
}

// The next Publish overwrites the slot the running encode diffs against (two slots: the base's):
// it waits for that encode, so a subscriber reading the step being encoded gets exact deltas.
TEST_P(DeltaUpdate, APublishDuringAnEncodeWaitsForItSoTheDeltasStayExact) {
  StartPublisher();
  Publish(1, 0);
  auto sub = Connect(dst_, /*delta=*/true, /*verify=*/false);
  ASSERT_OK(sub->Update().status());
  FailPoints::Arm("publisher.encode", FailAction::kSleep, 800, /*count=*/1);
  Publish(2, 0.01, /*wait=*/false);
  const std::vector<std::vector<uint8_t>> step2 = trainer_.Snapshot();
  Result<UpdateStats> stats = Status::Internal("not run");
  std::thread update([&] { stats = sub->Update(); });
  // Once the subscriber is being sent step 2 (pinned, waiting for its deltas), step 3 rewrites
  // the slot of step 1, the base step 2 is being encoded against.
  EXPECT_TRUE(testing::Eventually([&] {
    const std::vector<MemberInfo> members = publisher_->Members();
    return !members.empty() && members[0].receiving_step == 2;
  }));
  Publish(3, 0.01, /*wait=*/false);
  update.join();
  EXPECT_EQ(FailPoints::Hits("publisher.encode"), 1);  // step 2's encode was held
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->step, 2);
  EXPECT_EQ(stats->delta_base_step, 1);
  EXPECT_GT(stats->delta_segments, 0u);
  EXPECT_EQ(dst_, step2);  // not verified: only the bytes tell a wrong delta
}

// Publisher::Deltas() waits for the encode that runs on after Publish, then counts it.
TEST_P(DeltaUpdate, DeltasWaitsForTheEncodeThenCountsIt) {
  StartPublisher();
  Publish(1, 0);
  FailPoints::Arm("publisher.encode", FailAction::kSleep, 300, /*count=*/1);
  const PublishStats published = Publish(2, 0.01, /*wait=*/false);
  EXPECT_TRUE(published.delta_pending);
  ASSERT_OK_AND_ASSIGN(DeltaStats deltas, publisher_->Deltas());
  EXPECT_EQ(FailPoints::Hits("publisher.encode"), 1);
  EXPECT_EQ(deltas.step, 2);
  EXPECT_EQ(deltas.base_step, 1);
  EXPECT_GT(deltas.delta_segments, 0u);
  EXPECT_GT(deltas.changed_bytes, 0u);
  EXPECT_GT(deltas.delta_bytes, deltas.changed_bytes);  // the changed elements and their index
  EXPECT_GT(deltas.encode_seconds, 0);
  // A Publish that waited says the same of its own step.
  const PublishStats waited = Publish(3, 0.01, /*wait=*/true);
  ASSERT_OK_AND_ASSIGN(DeltaStats again, publisher_->Deltas());
  EXPECT_EQ(again.step, 3);
  EXPECT_EQ(waited.delta_segments, again.delta_segments);
  EXPECT_EQ(waited.delta_bytes, again.delta_bytes);
}

// A subscriber that will take the step whole (it asks for deltas against a step it missed the
// next of) never waits for the step's encode: its session sends the step well within a deadline
// shorter than the encode.
TEST_P(DeltaUpdate, ASubscriberTakingTheStepWholeNeverWaitsForItsEncode) {
  // A session's deadline for one step, and the update's: both far shorter than the encode.
  publisher_timeout_ = subscriber_timeout_ = std::chrono::milliseconds(1500);
  StartPublisher();
  Publish(1, 0);
  auto behind = Connect(dst_);
  ASSERT_OK(behind->Update().status());
  Publish(2, 0.01);
  FailPoints::Arm("publisher.encode", FailAction::kSleep, 4000, /*count=*/1);
  Publish(3, 0.01, /*wait=*/false);  // encoded against step 2, which `behind` never had
  // The update starts only once the encode is held: on a loaded machine the encoder thread may
  // reach its fail point after a quick whole update, which would then prove nothing.
  ASSERT_TRUE(testing::Eventually([] { return FailPoints::Hits("publisher.encode") == 1; }));
  testing::LogCapture log;
  auto stats = behind->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->step, 3);
  EXPECT_EQ(stats->delta_base_step, -1);
  EXPECT_TRUE(trainer_.HeldBy(dst_));
  // Whole from the start: not after waiting for the encode (then the session sends it whole too,
  // and says so).
  EXPECT_FALSE(log.Contains("took over half of the session's time"));
}

// An encode that outlasts half of the session's time for the step (the subscriber's wait, which
// its request carries): the session sends the step whole on the time left instead of failing it
// with Timeout, and deltas resume with the next step.
TEST_P(DeltaUpdate, AnEncodeOutlastingHalfTheSessionsTimeSendsTheStepWhole) {
  subscriber_timeout_ = std::chrono::milliseconds(4000);
  StartPublisher();
  Publish(1, 0);
  auto sub = Connect(dst_, /*delta=*/true, /*verify=*/true);
  ASSERT_OK(sub->Update().status());
  FailPoints::Arm("publisher.encode", FailAction::kSleep, 6000, /*count=*/1);
  Publish(2, 0.01, /*wait=*/false);
  testing::LogCapture log;
  auto late = sub->Update();
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(FailPoints::Hits("publisher.encode"), 1);
  EXPECT_EQ(late->step, 2);
  EXPECT_EQ(late->delta_base_step, -1);
  EXPECT_EQ(late->received_bytes, late->bytes);
  EXPECT_TRUE(late->verified);
  EXPECT_TRUE(trainer_.HeldBy(dst_));
  EXPECT_TRUE(log.Contains("step 2 sent whole: its deltas")) << "no line saying why";
  Publish(3, 0.01);  // waits for step 2's encode before it writes
  auto next = sub->Update();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->delta_base_step, 2);
  EXPECT_TRUE(trainer_.HeldBy(dst_));
}

INSTANTIATE_TEST_SUITE_P(Modes, DeltaUpdate,
                         ::testing::Values(UpdateMode::kStaged, UpdateMode::kInPlace),
                         [](const ::testing::TestParamInfo<UpdateMode>& info) {
                           return std::string(info.param == UpdateMode::kStaged ? "Staged"
                                                                                : "InPlace");
                         });

}  // namespace
}  // namespace weightsync
