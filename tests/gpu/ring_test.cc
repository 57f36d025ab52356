// The GPU ring (PublisherOptions::ring_buckets with CUDA tensors, label gpu) beyond the
// conformance suite's cuda-ipc-ring rows: a publisher process of a 40 MB model on cuda:0 keeps a
// ring of two 1 MiB buckets instead of two slots of the model (GPU memory measured around its
// first publish, against an arena publisher of the same model), and subscribers in this process
// (cuda:1, or cuda:0 with one GPU) stream each version through it bucket by bucket, bit-exact and
// verified; three subscribers updating together share the ring; the trainer's write waits for a
// reader inside the ring; a reader stalled holding a bucket is revoked within the publisher's
// timeout with its old weights intact (staged) while the other one completes.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/vmm.h"
#include "gpu/gpu_test_util.h"
#include "testing/publisher_process.h"
#include "testing/test_util.h"
#include "testing/transport_modes.h"
#include "transport/store/version_store.h"
#include "util/fail_point.h"

namespace weightsync {
namespace {

using Clock = std::chrono::steady_clock;
using testing::SyntheticModel;
using util::FailAction;
using util::FailPoints;

constexpr int kTensors = 12;
constexpr int64_t kElements = 1 << 20;  // about 40 MB a step
constexpr uint64_t kBucket = 1 << 20;
constexpr int kPublisherTimeoutMs = 800;

class GpuRing : public ::testing::TestWithParam<UpdateMode> {
 protected:
  void SetUp() override {
    WS_SKIP_WITHOUT_GPU();
    FailPoints::DisarmAll();
    device_ = cuda::DeviceCount() > 1 ? 1 : 0;
    ASSERT_OK(cuda::SetDevice(device_));
    like_ = model_.Tensors();
    ASSERT_GE(model_.total_bytes(), 10 * kBucket) << "the model must span ten buckets";
  }
  void TearDown() override { FailPoints::DisarmAll(); }

  std::unique_ptr<testing::PublisherProcess> StartPublisher(bool ring) {
    std::vector<std::string> env = {"WS_TEST_TIMEOUT_MS=" + std::to_string(kPublisherTimeoutMs)};
    if (ring) env.push_back("WS_TEST_RING=2:" + std::to_string(kBucket));
    return cuda::testing::StartGpuPublisher(kTensors, kElements, std::move(env),
                                            ring ? "gpu-ring" : "gpu-arena");
  }
  std::unique_ptr<Subscriber> Connect(const testing::PublisherProcess& publisher,
                                      std::vector<NamedTensor>* dst,
                                      std::vector<cuda::DeviceBuffer>* buffers) {
    return cuda::testing::ConnectVerifying(publisher.endpoint(), GetParam(), like_, device_, dst,
                                           buffers);
  }
  std::string Holds(const std::vector<NamedTensor>& dst, int64_t step) {
    std::string why;
    return cuda::testing::DestinationsHold(dst, like_, step, &why) ? "" : why;
  }

  int device_ = 0;
  SyntheticModel model_{kTensors, kElements};
  std::vector<NamedTensor> like_;
};

TEST_P(GpuRing, TwoBucketsStreamAModelFortyTimesTheirSizeBitExact) {
  int64_t arena_extra = 0, ring_extra = 0;
  auto arena = StartPublisher(/*ring=*/false);
  ASSERT_NO_FATAL_FAILURE(cuda::testing::ExtraAcrossFirstPublish(*arena, &arena_extra));
  arena.reset();
  auto ring = StartPublisher(/*ring=*/true);
  ASSERT_NO_FATAL_FAILURE(cuda::testing::ExtraAcrossFirstPublish(*ring, &ring_extra));
  EXPECT_GE(arena_extra, static_cast<int64_t>(2 * model_.total_bytes())) << "two slots";
  EXPECT_LE(ring_extra, static_cast<int64_t>(2 * kBucket) + (64ll << 20))
      << "the ring (2 buckets) plus digest scratch and a stream";

  std::vector<NamedTensor> dst;
  std::vector<cuda::DeviceBuffer> buffers;
  auto sub = Connect(*ring, &dst, &buffers);
  for (int64_t step = 1; step <= 3; ++step) {
    if (step > 1) {
      ASSERT_NO_FATAL_FAILURE(ring->Publish(step));
    }
    ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub->Update());
    EXPECT_EQ(stats.path, "cuda-ipc-ring");
    EXPECT_EQ(stats.step, step);
    EXPECT_TRUE(stats.verified);
    EXPECT_EQ(stats.bytes, model_.total_bytes());
    EXPECT_EQ(stats.prepare_count, 1u);
    EXPECT_EQ(Holds(dst, step), "") << "step " << step;
  }
}

TEST_P(GpuRing, SubscribersUpdatingTogetherShareTheRingAndEachGetsEveryByte) {
  auto pub = StartPublisher(/*ring=*/true);
  constexpr int kSubscribers = 3;
  std::vector<std::vector<NamedTensor>> dst(kSubscribers);
  std::vector<std::vector<cuda::DeviceBuffer>> buffers(kSubscribers);
  std::vector<std::unique_ptr<Subscriber>> subs;
  for (int i = 0; i < kSubscribers; ++i) subs.push_back(Connect(*pub, &dst[i], &buffers[i]));
  for (int64_t step = 1; step <= 2; ++step) {
    ASSERT_NO_FATAL_FAILURE(pub->Publish(step));
    std::vector<std::future<Result<UpdateStats>>> updates;
    for (auto& s : subs) {
      updates.push_back(std::async(std::launch::async, [&s] { return s->Update(); }));
    }
    for (int i = 0; i < kSubscribers; ++i) {
      Status s = updates[i].get().status();
      ASSERT_TRUE(s.ok()) << "subscriber " << i << ": " << s;
      EXPECT_EQ(Holds(dst[i], step), "") << "subscriber " << i << ", step " << step;
    }
  }
}

// The publisher's publish of step 3 begins with BeginWrite: it waits while this subscriber holds
// a bucket of step 2, and the subscriber verifies and holds step 2 exactly.
TEST_P(GpuRing, TheTrainersWriteWaitsForAReaderInsideTheRing) {
  auto pub = StartPublisher(/*ring=*/true);
  std::vector<NamedTensor> dst;
  std::vector<cuda::DeviceBuffer> buffers;
  auto sub = Connect(*pub, &dst, &buffers);
  ASSERT_NO_FATAL_FAILURE(pub->Publish(1));
  ASSERT_OK(sub->Update());
  ASSERT_NO_FATAL_FAILURE(pub->Publish(2));
  FailPoints::Arm("subscriber.ring_bucket", FailAction::kSleep, kPublisherTimeoutMs / 2, 1);
  auto update = std::async(std::launch::async, [&] { return sub->Update(); });
  ASSERT_TRUE(testing::WaitForFailPointHits("subscriber.ring_bucket"));
  const auto t0 = Clock::now();
  ASSERT_NO_FATAL_FAILURE(pub->Publish(3));
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_OK_AND_ASSIGN(UpdateStats read, update.get());
  EXPECT_EQ(read.step, 2);
  EXPECT_EQ(Holds(dst, 2), "") << "the write did not wait: the reader saw the trainer's next bytes";
  EXPECT_GT(waited, 0.25 * kPublisherTimeoutMs / 1000.0) << "the write never waited";
  ASSERT_OK_AND_ASSIGN(UpdateStats next, sub->Update());
  EXPECT_EQ(next.step, 3);
  EXPECT_EQ(Holds(dst, 3), "");
}

TEST_P(GpuRing, AReaderStalledHoldingABucketIsRevokedWhileTheOtherCompletes) {
  auto pub = StartPublisher(/*ring=*/true);
  std::vector<NamedTensor> d1, d2;
  std::vector<cuda::DeviceBuffer> b1, b2;
  auto fast = Connect(*pub, &d1, &b1);
  auto stalled = Connect(*pub, &d2, &b2);
  ASSERT_NO_FATAL_FAILURE(pub->Publish(1));
  ASSERT_OK(fast->Update());
  ASSERT_OK(stalled->Update());
  ASSERT_NO_FATAL_FAILURE(pub->Publish(2));
  // The stalled subscriber sleeps on its first bucket far past the publisher's timeout: the
  // other one's third bucket needs that slot.
  FailPoints::Arm("subscriber.ring_bucket", FailAction::kSleep, 4 * kPublisherTimeoutMs, 1);
  auto held = std::async(std::launch::async, [&] { return stalled->Update(); });
  ASSERT_TRUE(testing::WaitForFailPointHits("subscriber.ring_bucket"));
  Result<UpdateStats> went_on = fast->Update();
  ASSERT_TRUE(went_on.ok()) << "one stalled reader stalled the round: " << went_on.status();
  EXPECT_EQ(Holds(d1, 2), "");
  Result<UpdateStats> revoked = held.get();
  EXPECT_STATUS_IS(kTimeout, revoked.status(), "held a ring bucket longer");
  EXPECT_EQ(stalled->committed_step(), 1);
  if (GetParam() == UpdateMode::kStaged) {
    EXPECT_EQ(Holds(d2, 1), "") << "staged: the old weights stay";
  } else {
    EXPECT_FALSE(stalled->weights_valid());
  }
  ASSERT_OK_AND_ASSIGN(UpdateStats next, stalled->Update());
  EXPECT_EQ(next.step, 2);
  EXPECT_EQ(Holds(d2, 2), "");
}

// The store on its own (gpu_ring_store.cc): a fill puts exactly its bucket of the version into
// its slot; a fill of another slot or past the version is refused; a version needing more buckets
// than a GPU ring prepares is refused naming the limit; after Close nothing runs, and the store
// freezes again from scratch.
TEST(GpuRingStore, AFillHoldsItsBucketAndWhatCannotBeFilledIsRefused) {
  WS_SKIP_WITHOUT_GPU();
  ASSERT_OK(cuda::SetDevice(0));
  constexpr uint64_t kBytes = 10000, kStoreBucket = 4096;
  std::vector<uint8_t> host(kBytes);
  for (uint64_t i = 0; i < kBytes; ++i) host[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer tensor, cuda::testing::Upload(host));
  transport::store::StoreLayout layout;
  transport::store::PublishedTensor t;
  t.placement.spec = {"w", DType::kUInt8, {static_cast<int64_t>(kBytes)}, kBytes};
  t.source = tensor.as<uint8_t>();
  layout.tensors = {t};
  layout.slot_bytes = kBytes;
  layout.segment_bytes = 4096;
  layout.ring_slots = 2;
  layout.ring_bucket_bytes = kStoreBucket;
  ASSERT_OK_AND_ASSIGN(auto store, transport::store::NewGpuRingStore(0));
  wire::Welcome welcome;
  ASSERT_OK(store->Freeze(layout, &welcome));
  ASSERT_EQ(welcome.version_buckets, 3u);
  ASSERT_EQ(welcome.arena_kind, wire::ArenaKind::kCudaRing);
  EXPECT_GE(store->held_bytes(), 2 * kStoreBucket);
  EXPECT_STATUS_IS(kInvalidArgument, store->FillBucket(1, 0), "bucket 1 into slot 0",
                   "bucket b in slot b % 2");
  EXPECT_STATUS_IS(kInvalidArgument, store->FillBucket(3, 1), "bucket 3 into slot 1");
  // The ring's memory, read through an import of its fd as a subscriber would.
  ASSERT_OK_AND_ASSIGN(cuda::ImportedAllocation ring,
                       cuda::ImportedAllocation::Import(store->fd(), welcome.arena_bytes, 0));
  for (uint32_t b = 0; b < 3; ++b) {
    ASSERT_OK(store->FillBucket(b, b % 2));
    const uint64_t n = std::min<uint64_t>(kStoreBucket, kBytes - b * kStoreBucket);
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> got,
                         cuda::testing::Download<uint8_t>(ring.data() + (b % 2) * kStoreBucket, n));
    EXPECT_TRUE(std::equal(got.begin(), got.end(), host.begin() + b * kStoreBucket))
        << "bucket " << b;
  }
  ASSERT_OK(ring.Close());
  ASSERT_OK(store->Close());
  EXPECT_STATUS_IS(kFailedPrecondition, store->FillBucket(0, 0), "closed");
  EXPECT_EQ(store->version_buckets(), 0u);
  ASSERT_OK(store->Freeze(layout, &welcome));  // a closed store freezes again
  ASSERT_OK(store->FillBucket(0, 0));
  // More buckets than a GPU ring prepares.
  layout.slot_bytes = 4097 * kStoreBucket;
  layout.tensors[0].placement.spec.nbytes = layout.slot_bytes;  // never read: refused first
  EXPECT_STATUS_IS(kInvalidArgument, store->Freeze(layout, &welcome), "needs 4097 buckets",
                   "more than 4096");
  // Over tcp no bucket is allocated and none prepared, so the bound is not theirs to set; a fill
  // (no session asks for one there) finds no bucket.
  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer large, cuda::DeviceBuffer::Allocate(layout.slot_bytes));
  layout.tensors[0].source = large.as<uint8_t>();
  layout.local_readers = false;
  ASSERT_OK(store->Freeze(layout, &welcome));
  EXPECT_EQ(welcome.version_buckets, 4097u);
  EXPECT_EQ(store->held_bytes(), 0u);
  EXPECT_STATUS_IS(kFailedPrecondition, store->FillBucket(0, 0), "no buckets");
  ASSERT_OK(store->Close());
}

// Tied weights: a tensor registered under a second name is placed at its original's offset, and a
// pass through the GPU ring copies its bytes once.
TEST(GpuRingStore, ATiedTensorIsFilledOnce) {
  WS_SKIP_WITHOUT_GPU();
  ASSERT_OK(cuda::SetDevice(0));
  constexpr uint64_t kBytes = 10000;
  std::vector<uint8_t> host(kBytes, 7);
  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer tensor, cuda::testing::Upload(host));
  transport::store::StoreLayout layout;
  transport::store::PublishedTensor t;
  t.placement.spec = {"w", DType::kUInt8, {static_cast<int64_t>(kBytes)}, kBytes};
  t.source = tensor.as<uint8_t>();
  transport::store::PublishedTensor tied = t;
  tied.placement.spec.name = "w_tied";
  tied.alias_of = 0;
  layout.tensors = {t, tied};
  layout.slot_bytes = kBytes;
  layout.segment_bytes = 4096;
  layout.ring_slots = 2;
  layout.ring_bucket_bytes = 4096;
  ASSERT_OK_AND_ASSIGN(auto store, transport::store::NewGpuRingStore(0));
  wire::Welcome welcome;
  ASSERT_OK(store->Freeze(layout, &welcome));
  EXPECT_EQ(store->fill_bytes(), kBytes) << "the tied tensor is filled twice";
  for (uint32_t b = 0; b < welcome.version_buckets; ++b) ASSERT_OK(store->FillBucket(b, b % 2));
  ASSERT_OK(store->Close());
}

// Over tcp a ring publisher of CUDA tensors allocates no bucket: its sessions' NCCL broadcasts
// read the tensors (the nccl-ring rows of the conformance suite, two GPUs). Its Welcome keeps the
// ring's geometry; a subscriber of host memory is told no path moves it there.
TEST(GpuRingOverTcp, AllocatesNoBucketAndTellsAHostSubscriberWhyNot) {
  WS_SKIP_WITHOUT_GPU();
  ASSERT_OK(cuda::SetDevice(0));
  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer w, cuda::DeviceBuffer::Allocate(4096));
  PublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:0";
  o.ring_buckets = 2;
  o.ring_bucket_bytes = 1024;
  ASSERT_OK_AND_ASSIGN(auto pub, Publisher::Create(o));
  ASSERT_OK(
      pub->Register({{"w", {w.data(), DType::kFloat32, {1024}, Device{Device::Kind::kCUDA, 0}}}}));
  ASSERT_OK_AND_ASSIGN(PublishStats stats, pub->Publish(1));
  EXPECT_EQ(stats.store_bytes, 0u) << "no ring of buckets behind a tcp endpoint";
  std::vector<float> host(1024, -1.0f);
  SubscriberOptions so;
  so.endpoint = pub->endpoint();
  so.timeout = std::chrono::milliseconds(3000);
  auto sub = testing::NewSubscriber(so, {{"w", {host.data(), DType::kFloat32, {1024}}}});
  EXPECT_STATUS_IS(kNotSupported, sub->Update(), "a ring of buckets in GPU memory (cuda:0)",
                   "over tcp into host memory");
  EXPECT_EQ(host[0], -1.0f);
}

INSTANTIATE_TEST_SUITE_P(Modes, GpuRing, testing::BothUpdateModes(), testing::UpdateModeName);

}  // namespace
}  // namespace weightsync
