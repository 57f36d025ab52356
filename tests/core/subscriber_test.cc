// Subscriber semantics with an in-process publisher: validation lists every mismatch, corruption
// is caught and nothing is committed, release failures are reported, sleep re-prepares, steps only
// move forward, concurrent updates are refused, several subscribers share one publisher.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "cuda/device.h"
#include "testing/local_pair.h"
#include "util/fail_point.h"

namespace weightsync {
namespace {

using testing::LocalPair;
using testing::SyntheticModel;
using util::FailAction;
using util::FailPoints;

class SubscriberTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FailPoints::DisarmAll();
    baseline_ = ReadLedger();
  }
  void TearDown() override { FailPoints::DisarmAll(); }
  static void ExpectLedgerAt(const LedgerSnapshot& expected) {
    LedgerSnapshot now;
    EXPECT_TRUE(testing::LedgerSettlesTo(expected, &now))
        << "ledger " << now.ToString() << " vs expected " << expected.ToString();
  }
  void ExpectLedgerAtBaseline() { ExpectLedgerAt(baseline_); }
  LedgerSnapshot baseline_;
};

TEST_F(SubscriberTest, ManifestWithThreeProblemsListsAllThree) {
  LocalPair p;
  p.Start();
  p.Publish(1);
  // Destination set: drop tensor 0, change tensor 1's dtype and tensor 2's shape.
  std::vector<NamedTensor> views(p.dst.begin() + 1, p.dst.end());
  views[0].view.dtype = views[0].view.dtype == DType::kFloat32 ? DType::kInt32 : DType::kFloat32;
  views[1].view.shape = {static_cast<int64_t>(*views[1].view.NumElements())};  // flattened
  // Keep byte sizes within the storage: flattening keeps the element count.
  auto sub = p.ConnectWith(views);
  auto stats = sub->Update();
  ASSERT_STATUS_IS(kInvalidArgument, stats);
  const std::string& msg = stats.status().message();
  EXPECT_NE(msg.find("3 mismatch"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'" + p.dst[0].name + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'" + p.dst[1].name + "': dtype mismatch"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'" + p.dst[2].name + "': shape mismatch"), std::string::npos) << msg;
  EXPECT_EQ(sub->committed_step(), -1);
  sub.reset();
  p.publisher.reset();
  ExpectLedgerAtBaseline();
}

TEST_F(SubscriberTest, SubsetPolicyTakesOnlyRegisteredTensors) {
  LocalPair p;
  p.Start();
  p.Publish(4);
  std::vector<NamedTensor> views(p.dst.begin() + 3, p.dst.begin() + 7);
  auto sub = p.ConnectWith(views, UpdateMode::kStaged, true, MatchPolicy::kSubset);
  auto stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->tensors, 4u);
  std::string why;
  EXPECT_TRUE(SyntheticModel::Holds(views, 4, &why)) << why;
  // Tensors outside the subset stay poisoned.
  EXPECT_EQ(static_cast<uint8_t*>(p.dst[0].view.data)[0], 0xFF);
}

TEST_F(SubscriberTest, BitFlipNamesTheTensorAndCommitsNothing) {
  LocalPair p;
  p.Start();
  p.Publish(1);
  auto sub = p.Connect(UpdateMode::kStaged, /*verify=*/true);
  ASSERT_OK(sub->Update());
  const auto before = testing::Digests(p.dst);
  p.Publish(2);
  FailPoints::Arm("subscriber.flip_received", FailAction::kFlip, 0, 1);
  auto stats = sub->Update();
  ASSERT_EQ(FailPoints::Hits("subscriber.flip_received"), 1) << "bit flip never injected";
  ASSERT_STATUS_IS(kCorruption, stats, "tensor 'layers.", "nothing committed");
  EXPECT_EQ(testing::Digests(p.dst), before);
  EXPECT_EQ(sub->committed_step(), 1);
  // The handle was reset; the next update rebuilds it and succeeds.
  auto again = sub->Update();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->handle_created);
  std::string why;
  EXPECT_TRUE(SyntheticModel::Holds(p.dst, 2, &why)) << why;
}

TEST_F(SubscriberTest, PublisherSideCorruptionIsCaughtInPlaceAndMarksInvalid) {
  LocalPair p;
  p.Start();
  FailPoints::Arm("publisher.corrupt_after_digest", FailAction::kFlip, 0, 1);
  p.Publish(1);
  ASSERT_EQ(FailPoints::Hits("publisher.corrupt_after_digest"), 1);
  auto sub = p.Connect(UpdateMode::kInPlace, /*verify=*/true);
  auto stats = sub->Update();
  ASSERT_STATUS_IS(kCorruption, stats);
  EXPECT_FALSE(sub->weights_valid());
  p.Publish(2);
  ASSERT_OK(sub->Update());
  EXPECT_TRUE(sub->weights_valid());
}

TEST_F(SubscriberTest, ReleaseFailureIsLoggedWithCauseAndTheRestReleased) {
  LocalPair p;
  p.Start();
  p.Publish(1);
  const LedgerSnapshot with_publisher = ReadLedger();
  auto sub = p.Connect();
  ASSERT_OK(sub->Update());
  testing::LogCapture logs;
  FailPoints::Arm("shm.munmap", FailAction::kError, 0, 1);
  Status s = sub->Sleep();
  ASSERT_EQ(FailPoints::Hits("shm.munmap"), 1) << "release failure never injected";
  EXPECT_STATUS_IS(kIoError, s, "munmap", "errno");  // errno: the cause
  EXPECT_TRUE(logs.Contains("munmap arena of publisher")) << "release failure not logged";
  // Connection, handle, staging and threads were still released.
  ExpectLedgerAt(with_publisher);
  EXPECT_EQ(ReadLedger().release_failures, with_publisher.release_failures + 1);
}

TEST_F(SubscriberTest, SleepReleasesAndNextUpdateReprepares) {
  LocalPair p;
  p.Start();
  p.Publish(1);
  const LedgerSnapshot with_publisher = ReadLedger();
  auto sub = p.Connect();
  for (int cycle = 1; cycle <= 20; ++cycle) {
    if (cycle > 1) p.Publish(cycle);
    auto stats = sub->Update();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_TRUE(stats->handle_created);
    EXPECT_EQ(stats->prepare_count, static_cast<uint64_t>(cycle));
    EXPECT_GT(ReadLedger().mappings, with_publisher.mappings);
    ASSERT_OK(sub->Sleep());
    ExpectLedgerAt(with_publisher);
  }
}

TEST_F(SubscriberTest, StepsOnlyMoveForward) {
  LocalPair p;
  p.Start(/*slots=*/2);
  auto sub = p.Connect();
  p.Publish(5);
  ASSERT_OK(sub->Update(5));
  ASSERT_STATUS_IS(kFailedPrecondition, sub->Update(5));
  ASSERT_STATUS_IS(kFailedPrecondition, sub->Update(3));
  p.Publish(6);
  p.Publish(7);
  p.Publish(8);
  // Step 6 was overwritten (two slots hold 7 and 8).
  auto gone = sub->Update(6);
  ASSERT_STATUS_IS(kNotFound, gone, "no longer held");
  auto latest = sub->Update();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 8);
  // Already at the latest: nothing moves.
  auto same = sub->Update();
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_TRUE(same->up_to_date);
  EXPECT_EQ(same->bytes, 0u);
  // Publisher refuses to go backwards too.
  ASSERT_STATUS_IS(kFailedPrecondition, p.publisher->Publish(8), "steps must increase");
}

TEST_F(SubscriberTest, FutureStepTimesOutClearly) {
  LocalPair p;
  p.Start();
  p.Publish(1);
  SubscriberOptions o;
  o.endpoint = p.endpoint;
  o.timeout = std::chrono::milliseconds(300);
  auto sub = std::move(Subscriber::Create(o)).value();
  ASSERT_OK(sub->Register(p.dst));
  auto stats = sub->Update(9);
  ASSERT_STATUS_IS(kTimeout, stats, "9");
}

TEST_F(SubscriberTest, CancelStopsABlockedUpdatePromptly) {
  LocalPair p;
  p.Start();
  p.Publish(1);
  auto sub = p.Connect();
  ASSERT_OK(sub->Update());
  // Step 7 is never published: the update would wait its whole 5 s deadline.
  auto t0 = std::chrono::steady_clock::now();
  std::chrono::steady_clock::duration cancelled_after{};
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cancelled_after = std::chrono::steady_clock::now() - t0;
    EXPECT_OK(sub->Cancel());
  });
  auto stats = sub->Update(7);
  auto elapsed = std::chrono::steady_clock::now() - t0;
  canceller.join();
  ASSERT_STATUS_IS(kCancelled, stats);
  EXPECT_LT(elapsed - cancelled_after, std::chrono::milliseconds(200));
  EXPECT_EQ(sub->committed_step(), 1);
  EXPECT_TRUE(sub->weights_valid());
  // A cancel does not stick: the next update runs normally.
  p.Publish(2);
  auto again = sub->Update();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->step, 2);
}

// An engine shutting down calls close() while another thread's update waits for a step: the
// update is cancelled at once instead of holding the close for its whole timeout (5 s here).
TEST_F(SubscriberTest, CloseCancelsAnUpdateWaitingOnAnotherThread) {
  LocalPair p;
  p.Start();
  p.Publish(1);
  auto sub = p.Connect();
  ASSERT_OK(sub->Update());
  Result<UpdateStats> blocked = Status::Internal("not run");
  std::thread updater([&] { blocked = sub->Update(7); });  // never published
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_OK(sub->Close());
  const auto close_took = std::chrono::steady_clock::now() - t0;
  updater.join();
  ASSERT_STATUS_IS(kCancelled, blocked);
  EXPECT_LT(close_took, std::chrono::seconds(2)) << "Close waited for the update's deadline";
  EXPECT_EQ(sub->committed_step(), 1);
  EXPECT_TRUE(sub->weights_valid());
  std::string why;
  EXPECT_TRUE(SyntheticModel::Holds(p.dst, 1, &why)) << why;  // staged: the old weights stay
  ASSERT_STATUS_IS(kFailedPrecondition, sub->Update(), "closed");
}

// In place, mid-copy: each copy worker stops before its next segment, so the copy ends within a
// segment per worker of the cancel, and the weights are marked invalid (bytes had moved).
TEST_F(SubscriberTest, CloseStopsAnInPlaceCopyWithinASegmentAndMarksTheWeightsInvalid) {
  LocalPair p;
  p.model = SyntheticModel(12, 30000);
  p.tensors = p.model.Tensors();
  p.storage = SyntheticModel::PoisonedStorage(p.tensors);
  p.dst = SyntheticModel::Views(p.tensors, p.storage);
  p.Start();
  p.Publish(1);
  auto sub = p.Connect(UpdateMode::kInPlace, /*verify=*/false);
  ASSERT_OK(sub->Update());
  p.Publish(2);
  const uint64_t segments = p.model.total_bytes() / 4096;  // LocalPair: 4 KiB segments
  ASSERT_GT(segments, 200u);
  FailPoints::Arm("host_landing.after_segment", FailAction::kSleep, 20);  // a 2 s copy at least
  Result<UpdateStats> update = Status::Internal("not run");
  std::thread updater([&] { update = sub->Update(2); });
  while (FailPoints::Hits("host_landing.after_segment") < 4) std::this_thread::yield();
  ASSERT_OK(sub->Close());
  updater.join();
  const int64_t copied = FailPoints::Hits("host_landing.after_segment");
  FailPoints::DisarmAll();
  ASSERT_STATUS_IS(kCancelled, update, "cancelled");
  EXPECT_LT(copied, 4 + 2 * 4) << "segments copied after the cancel: at most one per worker";
  EXPECT_FALSE(sub->weights_valid());
  EXPECT_EQ(sub->committed_step(), 1);
}

// Close() marks the subscriber closing before it waits for the update lock: an update that starts
// in that window is refused at once rather than clearing the cancel and running its full course.
TEST_F(SubscriberTest, AnUpdateStartingWhileCloseIsUnderWayIsRefused) {
  LocalPair p;
  p.Start();
  p.Publish(1);
  auto sub = p.Connect();
  ASSERT_OK(sub->Update());
  FailPoints::Arm("subscriber.closing", FailAction::kSleep, 500, 1);
  std::thread closer([&] { EXPECT_OK(sub->Close()); });
  while (FailPoints::Hits("subscriber.closing") == 0) std::this_thread::yield();
  const auto t0 = std::chrono::steady_clock::now();
  Result<UpdateStats> refused = sub->Update(9);  // 9: never published
  const auto took = std::chrono::steady_clock::now() - t0;
  closer.join();
  ASSERT_STATUS_IS(kFailedPrecondition, refused, "closed");
  EXPECT_LT(took, std::chrono::seconds(2));
}

// Every call after Close() is refused the same way, Sleep() included.
TEST_F(SubscriberTest, EveryCallAfterCloseIsRefused) {
  LocalPair p;
  p.Start();
  p.Publish(1);
  auto sub = p.Connect();
  ASSERT_OK(sub->Update());
  ASSERT_OK(sub->Close());
  ASSERT_OK(sub->Close());  // idempotent
  ASSERT_STATUS_IS(kFailedPrecondition, sub->Update(), "closed");
  ASSERT_STATUS_IS(kFailedPrecondition, sub->Sleep(), "closed");
  ASSERT_STATUS_IS(kFailedPrecondition, sub->PublishedManifest(), "closed");
  ASSERT_STATUS_IS(kFailedPrecondition, sub->Register(p.dst), "closed");
  ASSERT_STATUS_IS(kFailedPrecondition, sub->Unregister({"layers.0.weight"}), "closed");
}

// Two threads publishing the same step: one wins, the other is told its step is stale with the
// code a subscriber's stale step gets (FailedPrecondition), not InvalidArgument.
TEST_F(SubscriberTest, APublishThatLosesARaceForItsStepIsFailedPrecondition) {
  LocalPair p;
  p.Start();
  p.Publish(1);
  for (int round = 0; round < 20; ++round) {
    const int64_t step = 2 + round;
    Result<PublishStats> a = Status::Internal("not run"), b = Status::Internal("not run");
    std::thread ta([&] { a = p.publisher->Publish(step); });
    std::thread tb([&] { b = p.publisher->Publish(step); });
    ta.join();
    tb.join();
    ASSERT_NE(a.ok(), b.ok()) << a.status() << " / " << b.status();
    ASSERT_STATUS_IS(kFailedPrecondition, a.ok() ? b : a, "steps must increase");
  }
}

TEST_F(SubscriberTest, ConcurrentUpdateIsBusy) {
  LocalPair p;
  p.Start();
  p.Publish(1);
  auto sub = p.Connect();
  FailPoints::Arm("shm.after_copy", FailAction::kSleep, 300, 1);
  std::thread first([&] { EXPECT_OK(sub->Update()); });
  while (FailPoints::Hits("shm.after_copy") == 0) std::this_thread::yield();
  ASSERT_STATUS_IS(kBusy, sub->Update());
  ASSERT_STATUS_IS(kBusy, sub->Sleep());
  first.join();
  EXPECT_EQ(sub->committed_step(), 1);
}

TEST_F(SubscriberTest, TwoSubscribersOnePublisher) {
  LocalPair p;
  p.Start();
  auto storage_b = SyntheticModel::PoisonedStorage(p.tensors);
  auto dst_b = SyntheticModel::Views(p.tensors, storage_b);
  auto a = p.Connect(UpdateMode::kStaged);
  auto b = p.ConnectWith(dst_b, UpdateMode::kInPlace);
  for (int step = 1; step <= 50; ++step) {
    p.Publish(step);
    std::thread ta([&] { EXPECT_OK(a->Update(step)); });
    std::thread tb([&] { EXPECT_OK(b->Update(step)); });
    ta.join();
    tb.join();
  }
  std::string why;
  EXPECT_TRUE(SyntheticModel::Holds(p.dst, 50, &why)) << why;
  EXPECT_TRUE(SyntheticModel::Holds(dst_b, 50, &why)) << why;
}

TEST_F(SubscriberTest, ArenaAllocatedTensorsPublishWithoutCopy) {
  std::string endpoint = testing::UniqueEndpoint("arena");
  PublisherOptions po;
  po.endpoint = endpoint;
  auto pub = std::move(Publisher::Create(po)).value();
  auto w = pub->Allocate("w", DType::kFloat32, {256, 64});
  ASSERT_TRUE(w.ok()) << w.status();
  auto b = pub->Allocate("b", DType::kBFloat16, {64});
  ASSERT_TRUE(b.ok()) << b.status();
  std::vector<float> dw(256 * 64, -1.0f);
  std::vector<uint16_t> db(64, 0xFFFF);
  SubscriberOptions so;
  so.endpoint = endpoint;
  so.verify = true;
  auto sub = std::move(Subscriber::Create(so)).value();
  ASSERT_OK(sub->Register({{"w", {dw.data(), DType::kFloat32, {256, 64}}},
                           {"b", {db.data(), DType::kBFloat16, {64}}}}));
  for (int step = 1; step <= 3; ++step) {
    ASSERT_OK(pub->BeginWrite());
    auto* pw = static_cast<float*>(w->data);
    for (int i = 0; i < 256 * 64; ++i) pw[i] = step * 1000.0f + i;
    auto* pb = static_cast<uint16_t*>(b->data);
    for (int i = 0; i < 64; ++i) pb[i] = static_cast<uint16_t>(step * 100 + i);
    auto ps = pub->Publish(step);
    ASSERT_TRUE(ps.ok()) << ps.status();
    EXPECT_EQ(ps->bytes_copied, 0u);
    ASSERT_OK(sub->Update());
    EXPECT_EQ(dw[77], step * 1000.0f + 77);
    EXPECT_EQ(db[5], step * 100 + 5);
  }
}

// A host arena into CUDA destinations goes through the copy engines (tests/gpu/host_to_gpu_test.cc
// on a GPU). Without one the update says what it needed; destinations split between the host and a
// GPU are refused first, naming one, whatever the machine.
TEST_F(SubscriberTest, HostArenaIntoCudaDestinationsSaysWhatItNeeds) {
  LocalPair p;
  p.Start();
  p.Publish(1);
  std::vector<NamedTensor> mixed = p.dst;
  for (size_t i = 1; i < mixed.size(); ++i) mixed[i].view.device = {Device::Kind::kCUDA, 0};
  {
    auto sub = p.ConnectWith(mixed);
    auto stats = sub->Update();
    // A fact of the path table: no data path delivers into host and CUDA memory at once.
    ASSERT_STATUS_IS(kNotSupported, stats,
                     "'" + p.dst[0].name + "' is on cpu, '" + p.dst[1].name + "' is on cuda:0",
                     "into host and CUDA memory at once");
    EXPECT_EQ(sub->committed_step(), -1);
    EXPECT_TRUE(sub->weights_valid());
  }
  if (!cuda::CudaAvailable().ok()) {
    std::vector<NamedTensor> on_gpu = p.dst;
    for (auto& t : on_gpu) t.view.device = {Device::Kind::kCUDA, 0};
    auto sub = p.ConnectWith(on_gpu);
    auto stats = sub->Update();
    ASSERT_STATUS_IS(kUnavailable, stats,
                     "keeps its arena in host memory and the destinations are CUDA tensors");
    EXPECT_EQ(sub->committed_step(), -1);
  }
  p.publisher.reset();
  ExpectLedgerAtBaseline();
}

}  // namespace
}  // namespace weightsync
