// Bounded staging: a host publisher with a ring of buckets (PublisherOptions::ring_buckets) over a
// real Unix socket and a real memfd ring. A model ten times one bucket arrives bit-exact through
// two buckets, staged and in place, verified; several subscribers share a round; the trainer's
// write is fenced; a failed fill and a stalled reader end only their reads, with the old weights
// intact; what a ring cannot do is refused up front.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "cuda/device.h"
#include "testing/local_pair.h"
#include "testing/publisher_process.h"
#include "testing/test_util.h"
#include "testing/transport_modes.h"
#include "util/fail_point.h"

namespace weightsync {
namespace {

using std::chrono::milliseconds;
using testing::SyntheticModel;
using util::FailAction;
using util::FailPoints;

constexpr uint64_t kBucket = 64 << 10;

class Ring : public ::testing::TestWithParam<UpdateMode> {
 protected:
  void SetUp() override { FailPoints::DisarmAll(); }
  void TearDown() override { FailPoints::DisarmAll(); }

  // 10 tensors of 8 KiB..: about ten buckets of 64 KiB, tensors straddling bucket edges.
  void Start(milliseconds timeout = milliseconds(5000)) {
    PublisherOptions o;
    o.endpoint = testing::UniqueEndpoint("ring");
    o.ring_buckets = 2;
    o.ring_bucket_bytes = kBucket;
    o.segment_bytes = 4096;
    o.timeout = timeout;
    ASSERT_OK_AND_ASSIGN(pub_, Publisher::Create(o));
    ASSERT_OK(pub_->Register(tensors_));
    ASSERT_GE(model_.total_bytes(), 10 * kBucket) << "the model must span ten buckets";
  }
  std::unique_ptr<Subscriber> Connect(std::vector<NamedTensor>& views) {
    SubscriberOptions o;
    o.endpoint = pub_->endpoint();
    o.mode = GetParam();
    o.verify = true;
    o.timeout = milliseconds(testing::kUnderSanitizer ? 20000 : 8000);
    return testing::NewSubscriber(o, views);
  }
  Status Write(int64_t step) {
    WS_RETURN_IF_ERROR(pub_->BeginWrite());
    model_.Fill(step);
    return pub_->Publish(step).status();
  }

  // Step 1 received, step 2 published; the update of step 2 with `fail_point` flipped once is a
  // protocol error naming `what` and `expected`, commits nothing, and the next update lands step 2.
  void ExpectAFlippedFrameFailsStepTwoThenItLands(const char* fail_point, const char* what,
                                                  const char* expected) {
    Start();
    auto storage = SyntheticModel::PoisonedStorage(tensors_);
    auto dst = SyntheticModel::Views(tensors_, storage);
    auto sub = Connect(dst);
    ASSERT_OK(Write(1));
    ASSERT_OK(sub->Update());
    ASSERT_OK(Write(2));
    FailPoints::Arm(fail_point, FailAction::kFlip, 0, 1);
    EXPECT_STATUS_IS(kProtocolError, sub->Update().status(), what, expected);
    EXPECT_EQ(FailPoints::Hits(fail_point), 1) << "the fault never fired";
    EXPECT_EQ(sub->committed_step(), 1);
    ASSERT_OK(sub->Update());
    std::string why;
    EXPECT_TRUE(SyntheticModel::Holds(dst, 2, &why)) << why;
  }

  SyntheticModel model_{10, 20000};
  std::vector<NamedTensor> tensors_ = model_.Tensors();
  std::unique_ptr<Publisher> pub_;
};

TEST_P(Ring, AModelTenTimesABucketArrivesBitExactThroughTwoBuckets) {
  Start();
  auto storage = SyntheticModel::PoisonedStorage(tensors_);
  auto dst = SyntheticModel::Views(tensors_, storage);
  auto sub = Connect(dst);
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_OK(Write(step));
    ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub->Update());
    EXPECT_EQ(stats.step, step);
    std::string why;
    EXPECT_TRUE(SyntheticModel::Holds(dst, step, &why)) << "step " << step << ": " << why;
  }
}

TEST_P(Ring, SubscribersUpdatingTogetherShareTheRingAndEachGetsEveryByte) {
  Start();
  constexpr int kSubscribers = 3;
  std::vector<std::vector<std::vector<uint8_t>>> storage(kSubscribers);
  std::vector<std::vector<NamedTensor>> dst(kSubscribers);
  std::vector<std::unique_ptr<Subscriber>> subs;
  for (int i = 0; i < kSubscribers; ++i) {
    storage[i] = SyntheticModel::PoisonedStorage(tensors_);
    dst[i] = SyntheticModel::Views(tensors_, storage[i]);
    subs.push_back(Connect(dst[i]));
  }
  for (int64_t step = 1; step <= 2; ++step) {
    ASSERT_OK(Write(step));
    std::vector<std::future<Result<UpdateStats>>> updates;
    for (auto& s : subs) {
      updates.push_back(std::async(std::launch::async, [&s] { return s->Update(); }));
    }
    for (int i = 0; i < kSubscribers; ++i) {
      Status s = updates[i].get().status();
      ASSERT_TRUE(s.ok()) << "subscriber " << i << ": " << s;
      std::string why;
      EXPECT_TRUE(SyntheticModel::Holds(dst[i], step, &why)) << "subscriber " << i << ": " << why;
    }
  }
}

TEST_P(Ring, BeginWriteWaitsForAReaderStreamingTheRing) {
  Start();
  auto storage = SyntheticModel::PoisonedStorage(tensors_);
  auto dst = SyntheticModel::Views(tensors_, storage);
  auto sub = Connect(dst);
  ASSERT_OK(Write(1));
  ASSERT_OK(sub->Update());
  ASSERT_OK(Write(2));
  FailPoints::Arm("subscriber.before_copy", FailAction::kSleep, 300, 1);
  auto update = std::async(std::launch::async, [&] { return sub->Update(); });
  ASSERT_TRUE(testing::WaitForFailPointHits("subscriber.before_copy"));
  ASSERT_OK(pub_->BeginWrite());  // held until the subscriber streamed all of step 2
  ASSERT_OK(update.get().status());
  std::string why;
  EXPECT_TRUE(SyntheticModel::Holds(dst, 2, &why)) << "the write did not wait: " << why;
  model_.Fill(3);
  ASSERT_OK(pub_->Publish(3).status());
  ASSERT_OK(sub->Update());
  EXPECT_TRUE(SyntheticModel::Holds(dst, 3, &why)) << why;
}

TEST_P(Ring, AFailedFillFailsTheUpdateAndTheNextOneLandsIt) {
  Start();
  auto storage = SyntheticModel::PoisonedStorage(tensors_);
  auto dst = SyntheticModel::Views(tensors_, storage);
  auto sub = Connect(dst);
  ASSERT_OK(Write(1));
  ASSERT_OK(sub->Update());
  ASSERT_OK(Write(2));
  // The second bucket's fill fails: the subscriber has copied the first bucket of step 2.
  FailPoints::Arm("publisher.ring_fill", FailAction::kError, 0, 1);
  Result<UpdateStats> failed = sub->Update();
  EXPECT_STATUS_IS(kInternal, failed.status(), "ring fill of step 2", "publisher.ring_fill");
  EXPECT_EQ(sub->committed_step(), 1);
  std::string why;
  if (GetParam() == UpdateMode::kStaged) {
    EXPECT_TRUE(SyntheticModel::Holds(dst, 1, &why)) << "staged weights changed: " << why;
  } else {
    EXPECT_FALSE(sub->weights_valid());
  }
  ASSERT_OK(sub->Update());
  EXPECT_TRUE(SyntheticModel::Holds(dst, 2, &why)) << why;
}

TEST_P(Ring, AReaderStalledInsideTheRingIsRevokedWithinTheTimeoutAndCommitsNothing) {
  const milliseconds timeout(testing::kUnderSanitizer ? 1000 : 400);
  Start(timeout);
  auto s1 = SyntheticModel::PoisonedStorage(tensors_);
  auto d1 = SyntheticModel::Views(tensors_, s1);
  auto s2 = SyntheticModel::PoisonedStorage(tensors_);
  auto d2 = SyntheticModel::Views(tensors_, s2);
  auto fast = Connect(d1);
  auto stalled = Connect(d2);
  ASSERT_OK(Write(1));
  ASSERT_OK(fast->Update());
  ASSERT_OK(stalled->Update());
  ASSERT_OK(Write(2));
  // The stalled subscriber's copy of the first bucket sleeps far past the publisher's timeout:
  // the other one's third bucket needs its slot.
  FailPoints::Arm("subscriber.ring_bucket", FailAction::kSleep,
                  testing::kUnderSanitizer ? 6000 : 3000, 1);
  auto held = std::async(std::launch::async, [&] { return stalled->Update(); });
  ASSERT_TRUE(testing::WaitForFailPointHits("subscriber.ring_bucket"));
  Result<UpdateStats> went_on = fast->Update();
  ASSERT_TRUE(went_on.ok()) << "one stalled reader stalled the round: " << went_on.status();
  std::string why;
  EXPECT_TRUE(SyntheticModel::Holds(d1, 2, &why)) << why;
  Result<UpdateStats> revoked = held.get();
  EXPECT_STATUS_IS(kTimeout, revoked.status(), "held a ring bucket longer");
  EXPECT_EQ(stalled->committed_step(), 1);
  if (GetParam() == UpdateMode::kStaged) {
    EXPECT_TRUE(SyntheticModel::Holds(d2, 1, &why)) << "staged weights changed: " << why;
  }
}

// BeginWrite past the timeout revokes a reader stalled inside the ring as a ring member, not only
// as a holder of the version: the ring stops serving it, so no bucket is filled from tensors the
// trainer is writing (in place, those bytes would land in the live weights).
TEST_P(Ring, BeginWritePastTheTimeoutRevokesAReaderInTheRingAndFillsNothingAfter) {
  const milliseconds timeout(testing::kUnderSanitizer ? 1000 : 400);
  Start(timeout);
  auto storage = SyntheticModel::PoisonedStorage(tensors_);
  auto dst = SyntheticModel::Views(tensors_, storage);
  auto sub = Connect(dst);
  ASSERT_OK(Write(1));
  ASSERT_OK(sub->Update());
  ASSERT_OK(Write(2));
  // The reader stalls on its first bucket well past the publisher's timeout.
  FailPoints::Arm("subscriber.ring_bucket", FailAction::kSleep, 4 * timeout.count(), 1);
  auto held = std::async(std::launch::async, [&] { return sub->Update(); });
  ASSERT_TRUE(testing::WaitForFailPointHits("subscriber.ring_bucket"));
  ASSERT_OK(pub_->BeginWrite());                                  // waits the timeout, then revokes
  FailPoints::Arm("publisher.ring_fill", FailAction::kSleep, 0);  // counts fills from here
  model_.Fill(3);                                                 // the trainer writes
  Result<UpdateStats> revoked = held.get();
  EXPECT_FALSE(revoked.ok()) << "a revoked read committed";
  EXPECT_EQ(FailPoints::Hits("publisher.ring_fill"), 0)
      << "the revoked reader's ring kept filling buckets from tensors being written";
  EXPECT_EQ(sub->committed_step(), 1);
  std::string why;
  if (GetParam() == UpdateMode::kStaged) {
    EXPECT_TRUE(SyntheticModel::Holds(dst, 1, &why)) << "staged weights changed: " << why;
  } else {
    EXPECT_FALSE(sub->weights_valid());
  }
  FailPoints::DisarmAll();
  ASSERT_OK(pub_->Publish(3).status());
  ASSERT_OK(sub->Update());
  EXPECT_TRUE(SyntheticModel::Holds(dst, 3, &why)) << why;
}

// Tied weights through the ring: a tensor registered under two names reaches both destinations
// bit-exact, staged and in place (its bytes fill the ring once: host_ring_store_test).
TEST_P(Ring, TiedWeightsArriveUnderBothNames) {
  tensors_.push_back({"layers.0.tied", tensors_[0].view});
  Start();
  auto storage = SyntheticModel::PoisonedStorage(tensors_);
  auto dst = SyntheticModel::Views(tensors_, storage);
  auto sub = Connect(dst);
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_OK(Write(step));
    ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub->Update());
    EXPECT_TRUE(stats.verified);
    std::string why;
    EXPECT_TRUE(SyntheticModel::Holds(dst, step, &why)) << why;
  }
}

TEST_P(Ring, ABucketAnnouncedInAnotherSlotThanItsOwnIsAProtocolErrorAndNothingIsCommitted) {
  ExpectAFlippedFrameFailsStepTwoThenItLands("publisher.ring_bad_slot", "ring bucket 0 in slot 1",
                                             "expected slot 0 of the ring's 2");
}

TEST_P(Ring, ADoneForAnotherBucketEndsTheSessionAndNothingIsCommitted) {
  ExpectAFlippedFrameFailsStepTwoThenItLands("subscriber.ring_bad_done",
                                             "ring_bucket_done for step 2 bucket 1",
                                             "expected step 2 bucket 0");
}

INSTANTIATE_TEST_SUITE_P(Modes, Ring, testing::BothUpdateModes(), testing::UpdateModeName);

TEST(RingOptions, WhatARingCannotDoIsRefusedUpFront) {
  PublisherOptions o;
  o.endpoint = testing::UniqueEndpoint("ring-opts");
  o.ring_buckets = 1;
  EXPECT_STATUS_IS(kInvalidArgument, Publisher::Create(o).status(), "ring_buckets = 1", "2..");
  o.ring_buckets = 65;
  EXPECT_STATUS_IS(kInvalidArgument, Publisher::Create(o).status(), "ring_buckets = 65", "2..64");
  o.ring_buckets = 0;
  o.ring_bucket_bytes = 1 << 20;
  EXPECT_STATUS_IS(kInvalidArgument, Publisher::Create(o).status(), "without ring_buckets");
  o.ring_buckets = 2;
  o.zero_copy = true;
  EXPECT_STATUS_IS(kInvalidArgument, Publisher::Create(o).status(), "choose one");
  o.zero_copy = false;
  ASSERT_OK_AND_ASSIGN(auto pub, Publisher::Create(o));
  EXPECT_STATUS_IS(kFailedPrecondition, pub->Allocate("a", DType::kFloat32, {4}).status(),
                   "ring publisher");
}

// A first Publish that fails after the ring store was made (fail point publisher.freeze) releases
// the ring's shared memory at once, not at the retry or Close; the retry makes it again and
// delivers.
TEST(RingOptions, AFailedFirstPublishReleasesTheRingAndTheRetryDelivers) {
  util::FailPoints::DisarmAll();
  testing::LocalPair pair;
  pair.ring_buckets = 2;
  pair.ring_bucket_bytes = 16384;
  pair.Start();
  const LedgerSnapshot before = ReadLedger();
  util::FailPoints::Arm("publisher.freeze", util::FailAction::kError, 0, 1);
  pair.model.Fill(1);
  ASSERT_STATUS_IS(kInternal, pair.publisher->Publish(1));
  ASSERT_EQ(util::FailPoints::Hits("publisher.freeze"), 1) << "fault never injected";
  const LedgerSnapshot after = ReadLedger();
  EXPECT_EQ(after.segments, before.segments) << after.ToString() << " vs " << before.ToString();
  EXPECT_EQ(after.mapped_bytes, before.mapped_bytes)
      << after.ToString() << " vs " << before.ToString();
  pair.Publish(1);
  EXPECT_GT(ReadLedger().mapped_bytes, before.mapped_bytes) << "the retry maps the ring again";
  auto sub = pair.Connect();
  ASSERT_OK_AND_ASSIGN(UpdateStats got, sub->Update());
  EXPECT_EQ(got.path, "shm-ring");
  std::string why;
  EXPECT_TRUE(testing::SyntheticModel::Holds(pair.dst, 1, &why)) << why;
}

// A ring publisher over tcp sends the version from its tensors (the ring is for local readers):
// BeginWrite waits until the socket has taken every byte of a read in progress, so the reader
// gets the version it asked for, verified, while the trainer's next write waits. 32 MB is more
// than the socket buffers hold; the subscriber sleeps before reading it (fail point
// tcp.before_data), so the session is still sending when BeginWrite is called.
TEST(RingOverTcp, BeginWriteWaitsUntilTheSocketTookTheVersion) {
  util::FailPoints::DisarmAll();
  PublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:0";
  o.ring_buckets = 2;
  o.ring_bucket_bytes = 1 << 20;
  o.timeout = milliseconds(testing::kUnderSanitizer ? 20000 : 10000);
  ASSERT_OK_AND_ASSIGN(auto pub, Publisher::Create(o));
  constexpr int64_t kElements = 8 << 20;
  std::vector<float> w(kElements);
  auto write = [&](int64_t step) {
    for (int64_t i = 0; i < kElements; ++i) w[i] = static_cast<float>(step * 1000 + i % 1000);
  };
  ASSERT_OK(pub->Register({{"w", {w.data(), DType::kFloat32, {kElements}}}}));
  write(1);
  ASSERT_OK(pub->Publish(1).status());
  std::vector<float> dst(kElements, -1.0f);
  SubscriberOptions so;
  so.endpoint = pub->endpoint();
  so.verify = true;
  so.timeout = milliseconds(testing::kUnderSanitizer ? 20000 : 10000);
  auto sub = testing::NewSubscriber(so, {{"w", {dst.data(), DType::kFloat32, {kElements}}}});
  util::FailPoints::Arm("tcp.before_data", util::FailAction::kSleep, 600, 1);
  auto update = std::async(std::launch::async, [&] { return sub->Update(); });
  ASSERT_TRUE(testing::WaitForFailPointHits("tcp.before_data"));
  ASSERT_OK(pub->BeginWrite());  // the session is still sending step 1 from `w`
  write(2);
  ASSERT_OK_AND_ASSIGN(PublishStats published, pub->Publish(2));
  // The subscriber slept 600 ms before reading: BeginWrite waited for most of it.
  EXPECT_GT(published.wait_for_readers_seconds, 0.2) << "BeginWrite did not wait for the reader";
  EXPECT_EQ(published.revoked_reads, 0);
  ASSERT_OK_AND_ASSIGN(UpdateStats got, update.get());
  EXPECT_EQ(got.path, "tcp");
  EXPECT_EQ(got.step, 1);
  EXPECT_TRUE(got.verified);
  for (int64_t i = 0; i < kElements; ++i) {
    ASSERT_EQ(dst[i], static_cast<float>(1000 + i % 1000)) << i;
  }
  ASSERT_OK_AND_ASSIGN(UpdateStats next, sub->Update());
  EXPECT_EQ(next.step, 2);
  EXPECT_EQ(dst[kElements - 1], static_cast<float>(2000 + (kElements - 1) % 1000));
  util::FailPoints::DisarmAll();
}

// A host ring into CUDA tensors takes the host-to-gpu-ring path (tests/gpu/host_to_gpu_test.cc
// runs it); on a machine without a CUDA device the subscriber is told that is what is missing,
// before anything is read.
TEST(RingOptions, ARingSubscriberIntoCudaTensorsWithoutADeviceIsToldWhatIsMissing) {
  if (cuda::CudaAvailable().ok()) GTEST_SKIP() << "a CUDA device: tests/gpu runs this path";
  PublisherOptions o;
  o.endpoint = testing::UniqueEndpoint("ring-cuda");
  o.ring_buckets = 2;
  ASSERT_OK_AND_ASSIGN(auto pub, Publisher::Create(o));
  std::vector<float> w(1024, 1.0f);
  ASSERT_OK(pub->Register({{"w", {w.data(), DType::kFloat32, {1024}}}}));
  ASSERT_OK(pub->Publish(1).status());
  std::vector<float> dst(1024);
  SubscriberOptions so;
  so.endpoint = pub->endpoint();
  so.timeout = milliseconds(3000);
  auto sub = testing::NewSubscriber(
      so, {{"w", {dst.data(), DType::kFloat32, {1024}, Device{Device::Kind::kCUDA, 0}}}});
  EXPECT_STATUS_IS(kUnavailable, sub->Update().status(),
                   "keeps its arena in host memory and the destinations are CUDA tensors");
  EXPECT_EQ(sub->committed_step(), -1);
}

}  // namespace
}  // namespace weightsync
