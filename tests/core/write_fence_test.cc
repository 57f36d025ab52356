// Writing arena-allocated tensors while subscribers read them: BeginWrite() waits for readers, but
// never longer than the publisher's timeout. A reader that outlasts it has its read revoked: it
// gets a typed error at the end of its step, commits nothing (staged: its old weights stay), and
// its next update lands the new version. Real sockets and shared memory; a fail point holds the
// subscriber inside its step, pinned.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "testing/publisher_process.h"
#include "testing/test_util.h"
#include "testing/transport_modes.h"
#include "util/fail_point.h"

namespace weightsync {
namespace {

using Clock = std::chrono::steady_clock;
using util::FailAction;
using util::FailPoints;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

class WriteFence : public ::testing::TestWithParam<testing::TransportMode> {
 protected:
  void SetUp() override { FailPoints::DisarmAll(); }
  void TearDown() override { FailPoints::DisarmAll(); }

  // A publisher whose one tensor of `elements` floats lives in its arena (Allocate), or in the
  // trainer's memory (`registered`: Publish copies it into a slot).
  void Start(std::chrono::milliseconds timeout, int64_t elements, bool registered = false) {
    elements_ = elements;
    PublisherOptions o;
    o.endpoint = GetParam().tcp ? "tcp://127.0.0.1:0" : testing::UniqueEndpoint("fence");
    o.timeout = timeout;
    ASSERT_OK_AND_ASSIGN(pub_, Publisher::Create(o));
    if (registered) {
      own_.assign(elements, 0.0f);
      w_ = own_.data();
      ASSERT_OK(pub_->Register({{"w", {w_, DType::kFloat32, {elements}}}}));
    } else {
      ASSERT_OK_AND_ASSIGN(TensorView w, pub_->Allocate("w", DType::kFloat32, {elements}));
      w_ = static_cast<float*>(w.data);
    }
    dst_.assign(elements, -1.0f);
    SubscriberOptions so;
    so.endpoint = pub_->endpoint();
    so.mode = GetParam().mode;
    so.timeout = std::chrono::milliseconds(testing::kUnderSanitizer ? 20000 : 8000);
    sub_ = testing::NewSubscriber(so, {{"w", {dst_.data(), DType::kFloat32, {elements}}}});
  }
  // The trainer's write of `step`: BeginWrite, then every element, then Publish.
  Result<PublishStats> Write(int64_t step) {
    WS_RETURN_IF_ERROR(pub_->BeginWrite());
    for (int64_t i = 0; i < elements_; ++i) w_[i] = static_cast<float>(step * 1000 + i % 1000);
    return pub_->Publish(step);
  }
  bool Holds(int64_t step) const {
    for (int64_t i = 0; i < elements_; ++i) {
      if (dst_[i] != static_cast<float>(step * 1000 + i % 1000)) return false;
    }
    return true;
  }

  const std::chrono::milliseconds timeout_{testing::kUnderSanitizer ? 1000 : 500};
  int64_t elements_ = 0;
  std::unique_ptr<Publisher> pub_;
  float* w_ = nullptr;
  std::vector<float> own_;  // registered: the trainer's own tensor
  std::vector<float> dst_;
  std::unique_ptr<Subscriber> sub_;
};

// shm: the subscriber reads the arena itself, so a subscriber held inside its step holds its pin.
TEST_P(WriteFence, BeginWriteWaitsForAReaderAndTheReaderGetsTheVersionItAskedFor) {
  if (GetParam().tcp)
    GTEST_SKIP() << "over tcp the publisher unpins once its socket took the bytes";
  Start(std::chrono::milliseconds(5000), 1 << 16);
  ASSERT_OK(Write(1));
  ASSERT_OK(sub_->Update());
  ASSERT_OK(Write(2));
  FailPoints::Arm("subscriber.before_copy", FailAction::kSleep, 400, 1);
  auto update = std::async(std::launch::async, [&] { return sub_->Update(); });
  ASSERT_TRUE(testing::WaitForFailPointHits("subscriber.before_copy"));
  const auto t0 = Clock::now();
  ASSERT_OK(pub_->BeginWrite());  // held until the subscriber finished reading step 2
  const double waited = SecondsSince(t0);
  ASSERT_OK(update.get());
  EXPECT_TRUE(Holds(2)) << "the write did not wait: the reader saw the trainer's next bytes";
  EXPECT_GT(waited, 0.2);
  for (int64_t i = 0; i < elements_; ++i) w_[i] = static_cast<float>(3000 + i % 1000);
  ASSERT_OK_AND_ASSIGN(PublishStats stats, pub_->Publish(3));
  EXPECT_GT(stats.wait_for_readers_seconds, 0.2);
  EXPECT_EQ(stats.revoked_reads, 0);
  ASSERT_OK(sub_->Update());
  EXPECT_TRUE(Holds(3));
}

// A revoked tcp read keeps sending what the trainer now writes (its result is discarded: the
// subscriber gets the revocation instead of the step's end). ThreadSanitizer sees that send, in
// this process, as a race on every write, and slows each to a crawl: the tcp rows skip under it
// (the shm rows, and every row under ASan, run).
#define WS_SKIP_TCP_REVOCATION_UNDER_TSAN()                                                  \
  do {                                                                                       \
    if (GetParam().tcp && testing::kUnderThreadSanitizer) {                                  \
      GTEST_SKIP() << "tcp revocation races by design with the trainer's write (see above)"; \
    }                                                                                        \
  } while (0)

TEST_P(WriteFence, AStalledReaderIsRevokedWithinTheDeadlineAndCommitsNothing) {
  WS_SKIP_TCP_REVOCATION_UNDER_TSAN();
  // Over tcp the publisher streams from its arena itself: a tensor larger than the loopback
  // socket buffers keeps that send (and its pin) open while the subscriber is held.
  Start(timeout_, GetParam().tcp ? (40 << 20) / 4 : 1 << 16);
  ASSERT_OK(Write(1));
  ASSERT_OK(sub_->Update());
  ASSERT_OK(Write(2));
  const int hold_ms = testing::kUnderSanitizer ? 4000 : 2500;
  FailPoints::Arm("subscriber.before_copy", FailAction::kSleep, hold_ms, 1);
  auto update = std::async(std::launch::async, [&] { return sub_->Update(); });
  ASSERT_TRUE(testing::WaitForFailPointHits("subscriber.before_copy"));
  const auto t0 = Clock::now();
  ASSERT_OK_AND_ASSIGN(PublishStats stats, Write(3));  // does not wait for the stalled reader
  const double waited = SecondsSince(t0);
  EXPECT_LT(waited, hold_ms / 1000.0 * 0.8) << "BeginWrite waited for the stalled reader";
  EXPECT_EQ(stats.revoked_reads, 1);
  EXPECT_GE(stats.wait_for_readers_seconds, 0.9 * timeout_.count() / 1000.0);
  Result<UpdateStats> stalled = update.get();
  ASSERT_FALSE(stalled.ok()) << "a revoked read was committed";
  EXPECT_STATUS_IS(kTimeout, stalled, "the read of step 2 was revoked",
                   "nothing it read may be committed");
  EXPECT_EQ(sub_->committed_step(), 1);
  if (GetParam().mode == UpdateMode::kStaged) {
    EXPECT_TRUE(sub_->weights_valid());
    EXPECT_TRUE(Holds(1)) << "staged: the old weights changed";
  } else {
    EXPECT_FALSE(sub_->weights_valid());
  }
  ASSERT_OK_AND_ASSIGN(UpdateStats again, sub_->Update());
  EXPECT_EQ(again.step, 3);
  EXPECT_TRUE(Holds(3));
  EXPECT_TRUE(sub_->weights_valid());
}

// A reader slower than the publisher's timeout keeps its version as long as it waits itself,
// while the publisher needs nothing of it; once Publish needs its slot, it loses it (revoked).
TEST_P(WriteFence, ASlowReaderKeepsItsVersionUntilThePublisherNeedsTheSlot) {
  WS_SKIP_TCP_REVOCATION_UNDER_TSAN();
  Start(timeout_, GetParam().tcp ? (40 << 20) / 4 : 1 << 16, /*registered=*/true);
  ASSERT_OK(Write(1));
  ASSERT_OK(sub_->Update());
  ASSERT_OK(Write(2));
  const int hold_ms = 3 * static_cast<int>(timeout_.count());
  FailPoints::Arm("subscriber.before_copy", FailAction::kSleep, hold_ms, 1);
  ASSERT_OK_AND_ASSIGN(UpdateStats slow, sub_->Update());  // nobody needed step 2's slot
  EXPECT_EQ(slow.step, 2);
  EXPECT_TRUE(Holds(2));
  // Now the trainer publishes twice while the reader is held: the second Publish needs the slot
  // the reader pins and takes it after its timeout.
  ASSERT_OK(Write(3));
  FailPoints::Arm("subscriber.before_copy", FailAction::kSleep, hold_ms, 1);
  auto update = std::async(std::launch::async, [&] { return sub_->Update(3); });
  ASSERT_TRUE(testing::WaitForFailPointHits("subscriber.before_copy", 2));
  ASSERT_OK(Write(4));  // the other slot
  const auto t0 = Clock::now();
  ASSERT_OK_AND_ASSIGN(PublishStats taken, Write(5));  // step 3's slot, pinned by the reader
  EXPECT_LT(SecondsSince(t0), hold_ms / 1000.0 * 0.8);
  EXPECT_EQ(taken.revoked_reads, 1);
  EXPECT_STATUS_IS(kTimeout, update.get(), "the read of step 3 was revoked");
  ASSERT_OK_AND_ASSIGN(UpdateStats latest, sub_->Update());
  EXPECT_EQ(latest.step, 5);
  EXPECT_TRUE(Holds(5));
}

// With one slot, Publish waits for the reader of the version it replaces; a subscriber arriving
// meanwhile is not handed that version (it would be revoked): it waits and gets the new one.
TEST_P(WriteFence, OneSlotANewReaderWaitsForTheVersionBeingWrittenInsteadOfPinningTheOld) {
  PublisherOptions o;
  o.endpoint = GetParam().tcp ? "tcp://127.0.0.1:0" : testing::UniqueEndpoint("fence-one");
  o.timeout = std::chrono::milliseconds(testing::kUnderSanitizer ? 20000 : 5000);
  o.slots = 1;
  ASSERT_OK_AND_ASSIGN(pub_, Publisher::Create(o));
  elements_ = GetParam().tcp ? (40 << 20) / 4 : 1 << 16;
  own_.assign(elements_, 0.0f);
  w_ = own_.data();
  ASSERT_OK(pub_->Register({{"w", {w_, DType::kFloat32, {elements_}}}}));
  dst_.assign(elements_, -1.0f);
  std::vector<float> other(elements_, -1.0f);
  SubscriberOptions so;
  so.endpoint = pub_->endpoint();
  so.mode = GetParam().mode;
  so.timeout = std::chrono::milliseconds(testing::kUnderSanitizer ? 20000 : 8000);
  sub_ = testing::NewSubscriber(so, {{"w", {dst_.data(), DType::kFloat32, {elements_}}}});
  auto late = testing::NewSubscriber(so, {{"w", {other.data(), DType::kFloat32, {elements_}}}});
  ASSERT_OK(Write(1));
  ASSERT_OK(sub_->Update());
  ASSERT_OK(late->Update());
  ASSERT_OK(Write(2));
  FailPoints::Arm("subscriber.before_copy", FailAction::kSleep, 600, 1);
  auto held = std::async(std::launch::async, [&] { return sub_->Update(); });  // pins step 2
  ASSERT_TRUE(testing::WaitForFailPointHits("subscriber.before_copy"));
  for (int64_t i = 0; i < elements_; ++i) w_[i] = static_cast<float>(3000 + i % 1000);
  auto publish = std::async(std::launch::async, [&] { return pub_->Publish(3); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // Publish is waiting now
  ASSERT_OK_AND_ASSIGN(UpdateStats arrived, late->Update());
  EXPECT_EQ(arrived.step, 3)
      << "a reader arriving while Publish waited got the version it replaces";
  ASSERT_OK_AND_ASSIGN(UpdateStats first, held.get());
  EXPECT_EQ(first.step, 2);
  ASSERT_OK_AND_ASSIGN(PublishStats stats, publish.get());
  EXPECT_EQ(stats.revoked_reads, 0);
  for (int64_t i = 0; i < elements_; ++i) {
    ASSERT_EQ(other[i], static_cast<float>(3000 + i % 1000)) << i;
  }
}

TEST(WriteFenceOptions, SegmentBytesHoldWholeElementsOfEveryDtype) {
  PublisherOptions o;
  o.endpoint = testing::UniqueEndpoint("fence-seg");
  o.segment_bytes = 4100;
  EXPECT_STATUS_IS(kInvalidArgument, Publisher::Create(o).status(),
                   "PublisherOptions.segment_bytes = 4100", "a multiple of 8");
  o.segment_bytes = 4104;
  ASSERT_OK(Publisher::Create(o).status());
}

// Without arena-allocated tensors subscribers read copies in slots: nothing to fence.
TEST(WriteFenceRegistered, BeginWriteReturnsAtOnceWhenEveryTensorIsRegistered) {
  PublisherOptions o;
  o.endpoint = testing::UniqueEndpoint("fence-reg");
  o.timeout = std::chrono::milliseconds(5000);
  ASSERT_OK_AND_ASSIGN(auto pub, Publisher::Create(o));
  std::vector<float> w(1024, 1.0f), dst(1024, 0.0f);
  ASSERT_OK(pub->Register({{"w", {w.data(), DType::kFloat32, {1024}}}}));
  ASSERT_OK(pub->Publish(1));
  SubscriberOptions so;
  so.endpoint = o.endpoint;
  auto sub = testing::NewSubscriber(so, {{"w", {dst.data(), DType::kFloat32, {1024}}}});
  FailPoints::Arm("subscriber.before_copy", FailAction::kSleep, 1000, 1);
  auto update = std::async(std::launch::async, [&] { return sub->Update(); });
  ASSERT_TRUE(testing::WaitForFailPointHits("subscriber.before_copy"));
  const auto t0 = Clock::now();
  ASSERT_OK(pub->BeginWrite());
  EXPECT_LT(SecondsSince(t0), 0.5);
  ASSERT_OK(update.get());
  FailPoints::DisarmAll();
  EXPECT_EQ(dst[7], 1.0f);
}

INSTANTIATE_TEST_SUITE_P(Modes, WriteFence, testing::AllTransportModes(),
                         testing::TransportModeName);

}  // namespace
}  // namespace weightsync
