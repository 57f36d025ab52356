// VersionSlots on its own (store/version_slots.h): which slot a write takes, what a pin gets
// (the latest, a step asked for, "up to date", stale and vanished steps), revocation past the
// timeout (the reader's Unpin says so and gets no digests), the write fence on shared tensors, and
// Close ending every wait. Threads stand in for the trainer and the sessions.
#include "transport/store/version_slots.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "testing/test_util.h"

namespace weightsync::transport::store {
namespace {

using std::chrono::milliseconds;

const std::function<bool()> kStay = [] { return false; };

wire::UpdateRequest Ask(int64_t step, int64_t after = -1, uint64_t wait_ms = 2000) {
  return {step, after, wait_ms};
}
util::Deadline Within(milliseconds ms = milliseconds(2000)) { return util::Deadline(ms); }

// Writes `step` into a slot, its digests all `step`.
uint32_t Write(VersionSlots& slots, int64_t step, WaitCost* cost = nullptr) {
  WaitCost ignored;
  const uint32_t k = slots.TakeForWrite(step, cost ? cost : &ignored);
  for (uint64_t& d : slots.digests(k)) d = static_cast<uint64_t>(step);
  slots.Published(k, step);
  return k;
}

TEST(VersionSlots, APinGetsTheLatestOrTheStepAskedForAndUnpinsWithItsDigests) {
  VersionSlots slots;
  slots.Arm(2, 3, /*shared=*/false, nullptr, milliseconds(500), "test");
  EXPECT_EQ(slots.latest_step(), -1);
  const uint32_t first = Write(slots, 1);
  const uint32_t second = Write(slots, 2);
  EXPECT_NE(first, second) << "the latest slot is kept while another is free";
  EXPECT_EQ(slots.latest_step(), 2);
  ASSERT_OK_AND_ASSIGN(Pin latest, slots.Acquire(Ask(-1), Within(), kStay));
  EXPECT_EQ(latest.begin.step, 2);
  ASSERT_OK_AND_ASSIGN(Pin older, slots.Acquire(Ask(1), Within(), kStay));
  EXPECT_EQ(older.begin.step, 1);
  wire::StepEnd end;
  ASSERT_OK(slots.Unpin(older, &end));
  EXPECT_EQ(end.step, 1);
  EXPECT_EQ(end.digests, (std::vector<uint64_t>{1, 1, 1}));
  ASSERT_OK(slots.Unpin(latest, &end));
  EXPECT_EQ(end.digests, (std::vector<uint64_t>{2, 2, 2}));
}

TEST(VersionSlots, UpToDateStaleAndVanishedStepsAreAnsweredAtOnce) {
  VersionSlots slots;
  slots.Arm(2, 1, false, nullptr, milliseconds(500), "test");
  for (int64_t step = 1; step <= 3; ++step) Write(slots, step);
  ASSERT_OK_AND_ASSIGN(Pin same, slots.Acquire(Ask(-1, /*after=*/3), Within(), kStay));
  EXPECT_EQ(same.begin.step, 3);
  EXPECT_EQ(same.begin.slot, wire::kNoSlot) << "up to date pins nothing";
  EXPECT_STATUS_IS(kFailedPrecondition, slots.Acquire(Ask(2, 2), Within(), kStay), "stale");
  EXPECT_STATUS_IS(kNotFound, slots.Acquire(Ask(1), Within(), kStay), "no longer held");
  EXPECT_STATUS_IS(kFailedPrecondition, slots.Acquire(Ask(-1, 9), Within(), kStay),
                   "subscriber has step 9 but the publisher's latest is 3");
  EXPECT_STATUS_IS(kTimeout, slots.Acquire(Ask(7), Within(milliseconds(100)), kStay),
                   "step 7 not available");
  EXPECT_STATUS_IS(kPeerLost, slots.Acquire(Ask(7), Within(), [] { return true; }));
}

// A reader past the timeout is revoked so the trainer can reuse its slot: its Unpin is a Timeout
// and carries no digests, and the write reports what it cost.
TEST(VersionSlots, AWriteRevokesAReaderOfTheSlotItNeedsPastTheTimeout) {
  VersionSlots slots;
  slots.Arm(1, 1, false, nullptr, milliseconds(200), "test");
  Write(slots, 1);
  ASSERT_OK_AND_ASSIGN(Pin held, slots.Acquire(Ask(-1), Within(), kStay));
  WaitCost cost;
  Write(slots, 2, &cost);  // one slot: it must take the reader's
  EXPECT_EQ(cost.revoked, 1);
  EXPECT_GE(cost.seconds, 0.15);
  wire::StepEnd end;
  EXPECT_STATUS_IS(kTimeout, slots.Unpin(held, &end), "the read of step 1 was revoked",
                   "nothing it read may be committed");
  EXPECT_TRUE(end.digests.empty());
  ASSERT_OK_AND_ASSIGN(Pin next, slots.Acquire(Ask(-1), Within(), kStay));
  EXPECT_EQ(next.begin.step, 2);
  ASSERT_OK(slots.Unpin(next, &end));
}

// A reader that finishes in time is waited for, not revoked.
TEST(VersionSlots, AWriteWaitsForAReaderThatFinishesInTime) {
  VersionSlots slots;
  slots.Arm(1, 1, false, nullptr, milliseconds(5000), "test");
  Write(slots, 1);
  ASSERT_OK_AND_ASSIGN(Pin held, slots.Acquire(Ask(-1), Within(), kStay));
  std::thread reader([&] {
    std::this_thread::sleep_for(milliseconds(100));
    wire::StepEnd end;
    EXPECT_OK(slots.Unpin(held, &end));
  });
  WaitCost cost;
  Write(slots, 2, &cost);
  reader.join();
  EXPECT_EQ(cost.revoked, 0);
  EXPECT_GE(cost.seconds, 0.05);
}

// Shared tensors (read where they are): BeginWrite stops new readers, waits for the current ones
// (revoking them past the timeout), and no version describes the tensors until the next publish.
TEST(VersionSlots, BeginWriteFencesSharedTensorsUntilTheNextPublish) {
  VersionSlots slots;
  slots.Arm(1, 1, /*shared=*/true, nullptr, milliseconds(200), "test");
  Write(slots, 1);
  ASSERT_OK_AND_ASSIGN(Pin held, slots.Acquire(Ask(-1), Within(), kStay));
  WaitCost cost;
  slots.BeginWrite(&cost);
  EXPECT_EQ(cost.revoked, 1);
  wire::StepEnd end;
  EXPECT_STATUS_IS(kTimeout, slots.Unpin(held, &end), "revoked");
  // Fenced: a new reader waits for the next version instead of reading the tensors mid-write.
  auto waiting = std::async(std::launch::async, [&] {
    return slots.Acquire(Ask(-1), Within(milliseconds(3000)), kStay);
  });
  EXPECT_EQ(waiting.wait_for(milliseconds(150)), std::future_status::timeout);
  Write(slots, 2);
  ASSERT_OK_AND_ASSIGN(Pin fresh, waiting.get());
  EXPECT_EQ(fresh.begin.step, 2);
  ASSERT_OK(slots.Unpin(fresh, &end));
}

// Copied tensors: a write never touches what a reader reads, so BeginWrite waits for nobody.
TEST(VersionSlots, BeginWriteOnCopiedTensorsWaitsForNobody) {
  VersionSlots slots;
  slots.Arm(2, 1, /*shared=*/false, nullptr, milliseconds(5000), "test");
  Write(slots, 1);
  ASSERT_OK_AND_ASSIGN(Pin held, slots.Acquire(Ask(-1), Within(), kStay));
  WaitCost cost;
  slots.BeginWrite(&cost);
  EXPECT_EQ(cost.revoked, 0);
  EXPECT_LT(cost.seconds, 0.05);
  wire::StepEnd end;
  ASSERT_OK(slots.Unpin(held, &end));
}

TEST(VersionSlots, AFailedWriteLeavesTheSlotEmptyAndReusable) {
  VersionSlots slots;
  slots.Arm(1, 1, false, nullptr, milliseconds(500), "test");
  WaitCost cost;
  const uint32_t k = slots.TakeForWrite(1, &cost);
  slots.WriteFailed(k);
  EXPECT_EQ(slots.latest_step(), -1);
  EXPECT_STATUS_IS(kTimeout, slots.Acquire(Ask(-1), Within(milliseconds(100)), kStay));
  EXPECT_EQ(Write(slots, 1), k);
}

TEST(VersionSlots, CloseEndsEveryWait) {
  VersionSlots slots;
  slots.Arm(1, 1, false, nullptr, milliseconds(500), "test");
  auto waiting = std::async(
      std::launch::async, [&] { return slots.Acquire(Ask(5), Within(milliseconds(5000)), kStay); });
  std::this_thread::sleep_for(milliseconds(50));
  slots.Close();
  EXPECT_STATUS_IS(kUnavailable, waiting.get(), "closed");
  EXPECT_STATUS_IS(kUnavailable, slots.Acquire(Ask(-1), Within(), kStay));
}

TEST(VersionSlots, WithoutARingBucketsAreRefused) {
  VersionSlots slots;
  slots.Arm(1, 1, false, nullptr, milliseconds(500), "test");
  EXPECT_FALSE(slots.has_ring());
  EXPECT_STATUS_IS(kFailedPrecondition, slots.AwaitBucket(Pin{}, 0, Within()), "no ring");
  EXPECT_STATUS_IS(kFailedPrecondition, slots.ReleaseBucket(Pin{}, 0), "no ring");
}

// Cut-through (Streaming): a version still landing is the latest at once for readers of the whole
// version (tcp), who get its progress and no digests until it is Published; readers of the mapped
// store wait until it is whole; a stream given up makes the version before it the latest again.
TEST(VersionSlots, AStreamingVersionIsPinnedWholeOnlyAndGivenUpRevertsToTheOneBefore) {
  VersionSlots slots;
  slots.Arm(2, 2, false, nullptr, milliseconds(500), "test");
  Write(slots, 1);
  StreamProgress progress;
  WaitCost cost;
  const uint32_t k = slots.TakeForWrite(2, &cost);
  progress.Begin(2, {100});
  slots.Streaming(k, 2, &progress);
  EXPECT_EQ(slots.latest_step(), 2);
  ASSERT_OK_AND_ASSIGN(Pin whole, slots.Acquire(Ask(-1, 1), Within(), kStay, /*whole=*/true));
  EXPECT_EQ(whole.begin.step, 2);
  EXPECT_EQ(whole.progress, &progress);
  // A reader of the mapped store does not get it while it lands.
  auto mapped = slots.Acquire(Ask(-1, 1, 100), Within(milliseconds(100)), kStay);
  ASSERT_FALSE(mapped.ok());
  EXPECT_EQ(mapped.status().code(), StatusCode::kTimeout) << mapped.status();
  wire::StepEnd end;
  EXPECT_EQ(slots.Unpin(whole, &end).code(), StatusCode::kUnavailable) << "no digests yet";
  // Given up: step 1 is the latest again, whole, with its digests.
  progress.Fail(Status::Unavailable("the relay's update failed"));
  slots.StreamFailed(k);
  EXPECT_EQ(slots.latest_step(), 1);
  ASSERT_OK_AND_ASSIGN(Pin one, slots.Acquire(Ask(-1), Within(), kStay));
  EXPECT_EQ(one.begin.step, 1);
  EXPECT_EQ(one.progress, nullptr);
  ASSERT_OK(slots.Unpin(one, &end));
  EXPECT_EQ(end.digests, (std::vector<uint64_t>{1, 1}));
  // A stream given up revokes whoever pinned it: nothing read may be committed.
  const uint32_t retry = slots.TakeForWrite(2, &cost);
  progress.Begin(2, {100});
  slots.Streaming(retry, 2, &progress);
  ASSERT_OK_AND_ASSIGN(Pin lost, slots.Acquire(Ask(-1, 1), Within(), kStay, /*whole=*/true));
  slots.StreamFailed(retry);
  EXPECT_EQ(slots.Unpin(lost, &end).code(), StatusCode::kTimeout);
  // Streamed again and published: every reader gets it whole with its digests.
  const uint32_t again = slots.TakeForWrite(2, &cost);
  progress.Begin(2, {100});
  slots.Streaming(again, 2, &progress);
  auto waiting =
      std::async(std::launch::async, [&] { return slots.Acquire(Ask(-1, 1), Within(), kStay); });
  EXPECT_EQ(waiting.wait_for(milliseconds(100)), std::future_status::timeout);
  for (uint64_t& d : slots.digests(again)) d = 2;
  slots.Published(again, 2);
  ASSERT_OK_AND_ASSIGN(Pin two, waiting.get());
  EXPECT_EQ(two.begin.step, 2);
  EXPECT_EQ(two.progress, nullptr);
  ASSERT_OK(slots.Unpin(two, &end));
  EXPECT_EQ(end.digests, (std::vector<uint64_t>{2, 2}));
}

// TakeIdle (cut-through) never waits: it takes a slot nobody reads that is not the latest, or
// none.
TEST(VersionSlots, TakeIdleTakesOnlyASlotNobodyReads) {
  VersionSlots slots;
  slots.Arm(2, 1, false, nullptr, milliseconds(500), "test");
  Write(slots, 1);
  const uint32_t second = Write(slots, 2);
  ASSERT_OK_AND_ASSIGN(Pin old, slots.Acquire(Ask(1), Within(), kStay));
  EXPECT_EQ(slots.TakeIdle(), -1) << "the other slot is read, and the latest is kept";
  wire::StepEnd end;
  ASSERT_OK(slots.Unpin(old, &end));
  const int idle = slots.TakeIdle();
  ASSERT_GE(idle, 0);
  EXPECT_NE(static_cast<uint32_t>(idle), second);
  EXPECT_EQ(slots.latest_step(), 2);
}

}  // namespace
}  // namespace weightsync::transport::store
