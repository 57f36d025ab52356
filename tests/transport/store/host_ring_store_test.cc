// The host ring store (host_ring_store.cc) on its own, over a real memfd: a fill puts exactly the
// version's bytes [b × bucket, (b + 1) × bucket) into its slot, tensors cut at bucket edges; a
// fill outside the ring, a ring of one bucket, and a version needing more than kMaxVersionBuckets
// buckets are refused naming the numbers. Without local readers (a tcp publisher) it allocates no
// bucket: the same geometry and digests, nothing to fill.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "plan/plan.h"
#include "testing/test_util.h"
#include "transport/store/version_store.h"

namespace weightsync::transport::store {
namespace {

constexpr uint64_t kBucket = 4096;

PublishedTensor Tensor(const std::string& name, const uint8_t* source, uint64_t offset,
                       uint64_t bytes) {
  PublishedTensor t;
  t.placement.spec = {name, DType::kUInt8, {static_cast<int64_t>(bytes)}, bytes};
  t.placement.offset = offset;
  t.source = source;
  return t;
}

class HostRingStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Two tensors at version offsets 0 and 6000 (the second straddles buckets 1 and 2).
    a_.resize(5000);
    b_.resize(6000);
    std::iota(a_.begin(), a_.end(), uint8_t{1});
    std::iota(b_.begin(), b_.end(), uint8_t{101});
    layout_.tensors = {Tensor("a", a_.data(), 0, a_.size()), Tensor("b", b_.data(), 6000, 6000)};
    layout_.slot_bytes = 12000;
    layout_.segment_bytes = 1024;
    layout_.copy_threads = 2;
    layout_.ring_slots = 2;
    layout_.ring_bucket_bytes = kBucket;
    ASSERT_OK_AND_ASSIGN(store_, NewHostRingStore(testing::UniqueEndpoint("ring-store")));
  }
  // The version's bytes as the tensors place them (zero between them).
  std::vector<uint8_t> Version() const {
    std::vector<uint8_t> v(3 * kBucket, 0);
    std::memcpy(v.data(), a_.data(), a_.size());
    std::memcpy(v.data() + 6000, b_.data(), b_.size());
    return v;
  }

  std::vector<uint8_t> a_, b_;
  StoreLayout layout_;
  std::unique_ptr<VersionStore> store_;
};

TEST_F(HostRingStoreTest, EachFillPutsExactlyItsBucketOfTheVersionIntoItsSlot) {
  wire::Welcome welcome;
  ASSERT_OK(store_->Freeze(layout_, &welcome));
  ASSERT_EQ(welcome.version_buckets, 3u);
  ASSERT_EQ(welcome.slot_bytes, kBucket);
  const std::vector<uint8_t> version = Version();
  for (uint32_t b = 0; b < 3; ++b) {
    ASSERT_OK(store_->FillBucket(b, b % 2));
    const uint8_t* slot = store_->base() + welcome.slots_offset + (b % 2) * kBucket;
    // Bytes no tensor covers are whatever the slot held; compare the covered ones.
    for (uint64_t i = 0; i < kBucket; ++i) {
      const uint64_t at = b * kBucket + i;
      const bool covered = at < a_.size() || (at >= 6000 && at < 12000);
      if (covered) {
        ASSERT_EQ(slot[i], version[at]) << "bucket " << b << " byte " << i;
      }
    }
  }
}

// Tied weights: a tensor registered under a second name shares its original's place in the
// version, and a pass through the ring copies its bytes once, not once per name.
TEST_F(HostRingStoreTest, ATiedTensorIsFilledOnceAndServedUnderBothNames) {
  PublishedTensor tied = Tensor("a_tied", a_.data(), 0, a_.size());
  tied.alias_of = 0;
  layout_.tensors.push_back(tied);
  wire::Welcome welcome;
  ASSERT_OK(store_->Freeze(layout_, &welcome));
  EXPECT_EQ(store_->fill_bytes(), a_.size() + b_.size()) << "the tied tensor is filled twice";
  ASSERT_EQ(welcome.tensors.size(), 3u);
  EXPECT_EQ(welcome.tensors[2].offset, welcome.tensors[0].offset);
  const std::vector<uint8_t> version = Version();
  for (uint32_t b = 0; b < 3; ++b) {
    ASSERT_OK(store_->FillBucket(b, b % 2));
    const uint8_t* slot = store_->base() + welcome.slots_offset + (b % 2) * kBucket;
    for (uint64_t i = 0; i < kBucket && b * kBucket + i < a_.size(); ++i) {
      ASSERT_EQ(slot[i], version[b * kBucket + i]) << "bucket " << b << " byte " << i;
    }
  }
  // One digest per segment of each name: the tied name's digests are its original's.
  std::vector<uint64_t> digests(store_->digest_count());
  ASSERT_OK(store_->Publish(0, digests, nullptr, nullptr, util::Deadline(std::chrono::seconds(5))));
  const uint64_t a_segments = (a_.size() + 1023) / 1024, b_segments = (b_.size() + 1023) / 1024;
  ASSERT_EQ(digests.size(), 2 * a_segments + b_segments);
  for (uint64_t k = 0; k < a_segments; ++k) {
    EXPECT_EQ(digests[a_segments + b_segments + k], digests[k]) << "segment " << k;
  }
}

TEST_F(HostRingStoreTest, AFillOutsideTheRingIsRefusedNamingIt) {
  wire::Welcome welcome;
  ASSERT_OK(store_->Freeze(layout_, &welcome));
  EXPECT_STATUS_IS(kInvalidArgument, store_->FillBucket(3, 1), "bucket 3 into slot 1",
                   "3 buckets a version and 2 slots");
  EXPECT_STATUS_IS(kInvalidArgument, store_->FillBucket(0, 2), "bucket 0 into slot 2");
  EXPECT_STATUS_IS(kInvalidArgument, store_->FillBucket(1, 0), "bucket 1 into slot 0",
                   "bucket b in slot b % 2");
}

// A tcp publisher's ring (no local readers): the same geometry in the Welcome, nothing allocated,
// the digests still those of the tensors, and a fill refused naming why.
TEST_F(HostRingStoreTest, WithoutLocalReadersNoBucketIsAllocated) {
  wire::Welcome mapped;
  ASSERT_OK(store_->Freeze(layout_, &mapped));
  std::vector<uint64_t> want(store_->digest_count());
  ASSERT_OK(
      store_->Publish(0, want, nullptr, nullptr, util::Deadline(std::chrono::milliseconds(5000))));
  ASSERT_OK_AND_ASSIGN(auto tcp, NewHostRingStore(testing::UniqueEndpoint("ring-store-tcp")));
  layout_.local_readers = false;
  wire::Welcome welcome;
  ASSERT_OK(tcp->Freeze(layout_, &welcome));
  EXPECT_EQ(tcp->held_bytes(), 0u);
  EXPECT_EQ(tcp->fd(), -1);
  EXPECT_EQ(tcp->base(), nullptr);
  EXPECT_EQ(welcome.version_buckets, mapped.version_buckets);
  EXPECT_EQ(welcome.slot_bytes, kBucket);
  EXPECT_EQ(welcome.slot_count, 2u);
  EXPECT_EQ(welcome.slots_offset, 0u);
  EXPECT_EQ(welcome.arena_bytes, 2 * kBucket) << "the geometry, nothing behind it";
  EXPECT_OK(plan::ValidateLayout(welcome));
  std::vector<uint64_t> got(tcp->digest_count());
  ASSERT_OK(
      tcp->Publish(0, got, nullptr, nullptr, util::Deadline(std::chrono::milliseconds(5000))));
  EXPECT_EQ(got, want);
  EXPECT_STATUS_IS(kFailedPrecondition, tcp->FillBucket(0, 0), "serves tcp",
                   "holds no buckets to fill");
  EXPECT_NE(tcp->Describe().find("none allocated"), std::string::npos) << tcp->Describe();
}

TEST_F(HostRingStoreTest, ARingOfOneBucketIsRefused) {
  layout_.ring_slots = 1;
  wire::Welcome welcome;
  EXPECT_STATUS_IS(kInvalidArgument, store_->Freeze(layout_, &welcome), "a ring of 1 buckets");
}

TEST_F(HostRingStoreTest, AVersionOfMoreBucketsThanTheLimitIsRefusedBeforeAnyWork) {
  // Never read: the count is checked before anything is cut or copied.
  const uint64_t huge = (uint64_t{wire::kMaxVersionBuckets} + 1) * kBucket;
  layout_.tensors = {Tensor("huge", a_.data(), 0, huge)};
  layout_.slot_bytes = huge;
  wire::Welcome welcome;
  EXPECT_STATUS_IS(kInvalidArgument, store_->Freeze(layout_, &welcome), "needs 16777217 buckets",
                   "more than 16777216", "use larger buckets");
}

}  // namespace
}  // namespace weightsync::transport::store
