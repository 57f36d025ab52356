// BucketRing on its own: which member fills, when a slot may be refilled, who may join a round,
// and how stragglers and failed fills end a member's read. The fill is a recording fake; the
// end-to-end ring (real sockets, a real memfd ring) is tests/core/ring_test.cc.
#include "transport/store/bucket_ring.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "testing/status_matchers.h"

namespace weightsync::transport::store {
namespace {

using std::chrono::milliseconds;

const auto kNever = [] { return false; };
util::Deadline Soon(int ms = 2000) { return util::Deadline(milliseconds(ms)); }

struct Recorder {
  std::mutex mu;
  std::vector<std::pair<uint32_t, uint32_t>> fills;  // (bucket, slot)
  Status next = Status::Ok();
  BucketRing::Fill fill() {
    return [this](uint32_t bucket, uint32_t slot) {
      std::lock_guard<std::mutex> lock(mu);
      fills.emplace_back(bucket, slot);
      return next;
    };
  }
};

TEST(BucketRing, OneReaderStreamsEveryBucketInOrderThroughTheSlots) {
  Recorder r;
  BucketRing ring(2, 5, 4, milliseconds(1000), r.fill());
  ASSERT_OK_AND_ASSIGN(int m, ring.Join(7, Soon(), kNever));
  for (uint32_t b = 0; b < 5; ++b) {
    ASSERT_OK_AND_ASSIGN(uint32_t slot, ring.Await(m, b, Soon()));
    EXPECT_EQ(slot, b % 2);
    ASSERT_OK(ring.Release(m, b));
  }
  ASSERT_OK(ring.Leave(m));
  ASSERT_EQ(r.fills.size(), 5u);
  for (uint32_t b = 0; b < 5; ++b) EXPECT_EQ(r.fills[b], std::make_pair(b, b % 2));
}

TEST(BucketRing, ASlotIsRefilledOnlyOnceEveryMemberReleasedWhatItHeld) {
  Recorder r;
  BucketRing ring(2, 4, 4, milliseconds(5000), r.fill());
  ASSERT_OK_AND_ASSIGN(int a, ring.Join(1, Soon(), kNever));
  ASSERT_OK_AND_ASSIGN(int b, ring.Join(1, Soon(), kNever));
  for (uint32_t k = 0; k < 2; ++k) {
    ASSERT_OK(ring.Await(a, k, Soon()).status());
    ASSERT_OK(ring.Await(b, k, Soon()).status());
  }
  ASSERT_OK(ring.Release(a, 0));
  // Bucket 2 goes into slot 0, which b still reads: a's fill waits for it.
  auto filled = std::async(std::launch::async, [&] { return ring.Await(a, 2, Soon()); });
  EXPECT_EQ(filled.wait_for(milliseconds(200)), std::future_status::timeout)
      << "slot 0 was refilled while a member still read bucket 0";
  ASSERT_OK(ring.Release(b, 0));
  ASSERT_OK_AND_ASSIGN(uint32_t slot, filled.get());
  EXPECT_EQ(slot, 0u);
  EXPECT_EQ(r.fills.size(), 3u) << "each bucket is filled once for the whole round";
  ASSERT_OK(ring.Leave(a));
  ASSERT_OK(ring.Leave(b));
}

TEST(BucketRing, ALateReaderWaitsForTheNextRoundOnceASlotWasRefilled) {
  Recorder r;
  BucketRing ring(2, 4, 4, milliseconds(5000), r.fill());
  ASSERT_OK_AND_ASSIGN(int a, ring.Join(1, Soon(), kNever));
  for (uint32_t k = 0; k < 3; ++k) {  // bucket 2 refilled slot 0: bucket 0 is gone
    ASSERT_OK(ring.Await(a, k, Soon()).status());
    ASSERT_OK(ring.Release(a, k));
  }
  auto late = std::async(std::launch::async, [&] { return ring.Join(1, Soon(), kNever); });
  EXPECT_EQ(late.wait_for(milliseconds(200)), std::future_status::timeout)
      << "a reader joined a round whose first bucket the ring no longer holds";
  ASSERT_OK(ring.Await(a, 3, Soon()).status());
  ASSERT_OK(ring.Release(a, 3));
  ASSERT_OK(ring.Leave(a));
  ASSERT_OK_AND_ASSIGN(int l, late.get());
  ASSERT_OK(ring.Await(l, 0, Soon()).status());
  EXPECT_EQ(r.fills.back(), std::make_pair(0u, 0u)) << "the new round starts from bucket 0";
  ASSERT_OK(ring.Leave(l));
}

TEST(BucketRing, AReaderArrivingWhileNoSlotWasRefilledJoinsTheRound) {
  Recorder r;
  BucketRing ring(3, 5, 4, milliseconds(5000), r.fill());
  ASSERT_OK_AND_ASSIGN(int a, ring.Join(1, Soon(), kNever));
  ASSERT_OK(ring.Await(a, 0, Soon()).status());
  ASSERT_OK(ring.Await(a, 1, Soon()).status());
  ASSERT_OK_AND_ASSIGN(int b, ring.Join(1, Soon(), kNever));
  for (uint32_t k = 0; k < 5; ++k) {
    ASSERT_OK(ring.Await(b, k, Soon()).status());
    ASSERT_OK(ring.Release(b, k));
    if (k + 1 < 5) ASSERT_OK(ring.Release(a, k));
    if (k + 2 < 5) ASSERT_OK(ring.Await(a, k + 2, Soon()).status());
  }
  EXPECT_EQ(r.fills.size(), 5u);
  ASSERT_OK(ring.Leave(a));
  ASSERT_OK(ring.Leave(b));
}

// With every slot filled, the next fill waits for bucket 0's slot, which a stalled member holds.
// A reader joining then holds that slot from its first moment: it is given the publisher's timeout
// from its join, not from when the waiting member began to wait.
TEST(BucketRing, AReaderJoiningWhileOthersWaitForItsFirstSlotGetsTheWholeTimeout) {
  Recorder r;
  BucketRing ring(2, 4, 4, milliseconds(600), r.fill());
  ASSERT_OK_AND_ASSIGN(int a, ring.Join(1, Soon(), kNever));
  ASSERT_OK_AND_ASSIGN(int stalled, ring.Join(1, Soon(), kNever));
  ASSERT_OK(ring.Await(stalled, 0, Soon()).status());  // and never released
  for (uint32_t k = 0; k < 2; ++k) {
    ASSERT_OK(ring.Await(a, k, Soon()).status());
    ASSERT_OK(ring.Release(a, k));
  }
  auto waiter = std::async(std::launch::async, [&] { return ring.Await(a, 2, Soon(5000)); });
  std::this_thread::sleep_for(milliseconds(400));
  ASSERT_OK_AND_ASSIGN(int b, ring.Join(1, Soon(), kNever));
  std::this_thread::sleep_for(milliseconds(350));  // `a` has waited 750 ms, `b` held 350
  Result<uint32_t> first = ring.Await(b, 0, Soon());
  ASSERT_TRUE(first.ok()) << "a reader that just joined was revoked: " << first.status();
  ASSERT_OK(ring.Release(b, 0));
  ASSERT_OK(waiter.get().status());
  EXPECT_STATUS_IS(kTimeout, ring.Leave(stalled), "held a ring bucket");
  ASSERT_OK(ring.Leave(a));
  for (uint32_t k = 1; k < 4; ++k) {
    ASSERT_OK(ring.Await(b, k, Soon()).status());
    ASSERT_OK(ring.Release(b, k));
  }
  ASSERT_OK(ring.Leave(b));
}

// A revoked reader whose session has not left yet (it waits on its subscriber) holds nothing:
// the round ends without it and the next one starts.
TEST(BucketRing, ARevokedReaderThatHasNotLeftDoesNotHoldUpTheNextRound) {
  Recorder r;
  BucketRing ring(2, 3, 4, milliseconds(100), r.fill());
  ASSERT_OK_AND_ASSIGN(int fast, ring.Join(1, Soon(), kNever));
  ASSERT_OK_AND_ASSIGN(int stalled, ring.Join(1, Soon(), kNever));
  ASSERT_OK(ring.Await(stalled, 0, Soon()).status());
  for (uint32_t k = 0; k < 3; ++k) {  // bucket 2 revokes `stalled`
    ASSERT_OK(ring.Await(fast, k, Soon()).status());
    ASSERT_OK(ring.Release(fast, k));
  }
  ASSERT_OK(ring.Leave(fast));
  ASSERT_OK_AND_ASSIGN(int next, ring.Join(2, Soon(500), kNever));
  ASSERT_OK(ring.Await(next, 0, Soon()).status());
  EXPECT_STATUS_IS(kTimeout, ring.Leave(stalled), "the read of step 1", "held a ring bucket");
  ASSERT_OK(ring.Release(next, 0));
  ASSERT_OK(ring.Leave(next));
}

TEST(BucketRing, AReaderHoldingASlotPastTheTimeoutIsRevokedAndTheOthersGoOn) {
  Recorder r;
  BucketRing ring(2, 3, 4, milliseconds(150), r.fill());
  ASSERT_OK_AND_ASSIGN(int fast, ring.Join(1, Soon(), kNever));
  ASSERT_OK_AND_ASSIGN(int stalled, ring.Join(1, Soon(), kNever));
  ASSERT_OK(ring.Await(stalled, 0, Soon()).status());  // and never released
  ASSERT_OK(ring.Await(fast, 0, Soon()).status());
  ASSERT_OK(ring.Release(fast, 0));
  ASSERT_OK(ring.Await(fast, 1, Soon()).status());
  ASSERT_OK(ring.Release(fast, 1));
  ASSERT_OK(ring.Await(fast, 2, Soon()).status());  // waits ~150 ms, then revokes `stalled`
  ASSERT_OK(ring.Release(fast, 2));
  ASSERT_OK(ring.Leave(fast));
  EXPECT_STATUS_IS(kTimeout, ring.Release(stalled, 0), "held a ring bucket longer",
                   "nothing it read may be committed");
  EXPECT_STATUS_IS(kTimeout, ring.Leave(stalled), "revoked");
}

// Nobody else in its round needs its slot, but a reader waits to start the next round: the
// stalled member gets the same timeout, and the next round starts.
TEST(BucketRing, AReaderWaitingForTheNextRoundRevokesAMemberStalledOnABucket) {
  Recorder r;
  BucketRing ring(2, 4, 4, milliseconds(150), r.fill());
  ASSERT_OK_AND_ASSIGN(int stalled, ring.Join(1, Soon(), kNever));
  ASSERT_OK(ring.Await(stalled, 0, Soon()).status());  // holds bucket 0, never releases it
  ASSERT_OK_AND_ASSIGN(int next, ring.Join(2, Soon(), kNever));  // waits ~150 ms, then revokes
  ASSERT_OK(ring.Await(next, 0, Soon()).status());
  EXPECT_EQ(r.fills.size(), 2u) << "the next round filled bucket 0 again";
  EXPECT_STATUS_IS(kTimeout, ring.Release(stalled, 0), "held a ring bucket longer");
  EXPECT_STATUS_IS(kTimeout, ring.Leave(stalled), "revoked");
  ASSERT_OK(ring.Release(next, 0));
  ASSERT_OK(ring.Leave(next));
}

TEST(BucketRing, RevokeAllFailsEveryMemberAndAFreshRoundStartsAfterwards) {
  Recorder r;
  BucketRing ring(2, 3, 4, milliseconds(5000), r.fill());
  ASSERT_OK_AND_ASSIGN(int a, ring.Join(1, Soon(), kNever));
  ASSERT_OK(ring.Await(a, 0, Soon()).status());
  EXPECT_EQ(ring.RevokeAll(), 1);
  EXPECT_STATUS_IS(kTimeout, ring.Await(a, 1, Soon()).status(), "took its tensors back");
  EXPECT_STATUS_IS(kTimeout, ring.Leave(a), "revoked");
  ASSERT_OK_AND_ASSIGN(int b, ring.Join(2, Soon(), kNever));
  ASSERT_OK(ring.Await(b, 0, Soon()).status());
  ASSERT_OK(ring.Leave(b));
}

TEST(BucketRing, AFailedFillEndsTheRoundForEveryMemberWithItsReason) {
  Recorder r;
  BucketRing ring(2, 3, 4, milliseconds(5000), r.fill());
  ASSERT_OK_AND_ASSIGN(int a, ring.Join(1, Soon(), kNever));
  ASSERT_OK_AND_ASSIGN(int b, ring.Join(1, Soon(), kNever));
  r.next = Status::Internal("disk on fire");
  EXPECT_STATUS_IS(kInternal, ring.Await(a, 0, Soon()).status(), "disk on fire");
  EXPECT_STATUS_IS(kInternal, ring.Await(b, 0, Soon()).status(), "disk on fire");
  EXPECT_FALSE(ring.Leave(a).ok());
  EXPECT_FALSE(ring.Leave(b).ok());
}

TEST(BucketRing, BucketsMustBeReleasedInOrderAndAskedForWithinTheVersion) {
  Recorder r;
  BucketRing ring(2, 3, 4, milliseconds(5000), r.fill());
  ASSERT_OK_AND_ASSIGN(int a, ring.Join(1, Soon(), kNever));
  ASSERT_OK(ring.Await(a, 0, Soon()).status());
  ASSERT_OK(ring.Await(a, 1, Soon()).status());
  EXPECT_STATUS_IS(kInternal, ring.Release(a, 1), "out of order");
  EXPECT_STATUS_IS(kInvalidArgument, ring.Await(a, 3, Soon()).status(), "bucket 3");
  ASSERT_OK(ring.Leave(a));
}

TEST(BucketRing, AReaderBeyondThePlacesTheRingWasSizedForIsRefusedAndAPlaceLeftIsReused) {
  Recorder r;
  BucketRing ring(2, 3, 2, milliseconds(5000), r.fill());
  ASSERT_OK_AND_ASSIGN(int a, ring.Join(1, Soon(), kNever));
  ASSERT_OK_AND_ASSIGN(int b, ring.Join(1, Soon(), kNever));
  EXPECT_STATUS_IS(kResourceExhausted, ring.Join(1, Soon(), kNever).status(),
                   "all 2 reader places are taken");
  ASSERT_OK(ring.Leave(b));
  ASSERT_OK_AND_ASSIGN(int c, ring.Join(1, Soon(), kNever));
  EXPECT_EQ(c, b) << "the place left is taken again";
  ASSERT_OK(ring.Leave(a));
  ASSERT_OK(ring.Leave(c));
}

TEST(BucketRing, ABucketAskedForBeforeTheNextOneToFillIsRefused) {
  Recorder r;
  BucketRing ring(2, 4, 4, milliseconds(5000), r.fill());
  ASSERT_OK_AND_ASSIGN(int a, ring.Join(1, Soon(), kNever));
  EXPECT_STATUS_IS(kInternal, ring.Await(a, 1, Soon()).status(),
                   "bucket 1 asked for before bucket 0");
  EXPECT_TRUE(r.fills.empty()) << "nothing was filled for it";
  ASSERT_OK(ring.Leave(a));
}

TEST(BucketRing, AJoinWaitingForAnotherRoundGivesUpAtItsDeadline) {
  Recorder r;
  BucketRing ring(2, 4, 4, milliseconds(5000), r.fill());
  ASSERT_OK_AND_ASSIGN(int a, ring.Join(1, Soon(), kNever));
  EXPECT_STATUS_IS(kTimeout, ring.Join(2, Soon(100), kNever).status(), "still under way");
  ASSERT_OK(ring.Leave(a));
}

}  // namespace
}  // namespace weightsync::transport::store
