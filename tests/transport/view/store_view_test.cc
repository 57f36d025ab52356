// Each host store shape through its view (view/store_view.h), over a real memfd written by the
// publisher's own store: where a version's bytes lie unit by unit — an arena's slots and its
// direct region, a ring's buckets cut at their edges — and how a step's unit is chosen. (A ring's
// step runs its handshake on a link: tests/core/ring_test.cc; the GPU shapes:
// tests/gpu/store_view_test.cc.)
#include "transport/view/store_view.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <numeric>

#include "testing/test_util.h"
#include "transport/store/version_store.h"

namespace weightsync::transport::view {
namespace {

using store::PublishedTensor;

PublishedTensor Tensor(const std::string& name, const uint8_t* source, uint64_t offset,
                       uint64_t bytes, wire::Region region = wire::Region::kSlot) {
  PublishedTensor t;
  t.placement.spec = {name, DType::kUInt8, {static_cast<int64_t>(bytes)}, bytes};
  t.placement.region = region;
  t.placement.offset = offset;
  t.source = source;
  return t;
}

// The bytes the pieces point at, concatenated.
std::vector<uint8_t> Read(const std::vector<Piece>& pieces) {
  std::vector<uint8_t> out;
  for (const Piece& p : pieces) out.insert(out.end(), p.src, p.src + p.bytes);
  return out;
}

Result<std::unique_ptr<StoreView>> Map(const store::VersionStore& store,
                                       const wire::Welcome& welcome) {
  return MapHostStore(welcome, util::UniqueFd(::dup(store.fd())), nullptr);
}

TEST(HostArenaView, EachSlotIsAUnitAndTheDirectRegionIsSharedByAll) {
  std::vector<uint8_t> a(5000), b(300);
  std::iota(a.begin(), a.end(), uint8_t{1});
  ASSERT_OK_AND_ASSIGN(auto store, store::NewHostStore(testing::UniqueEndpoint("view")));
  ASSERT_OK_AND_ASSIGN(uint64_t direct, store->AllocateDirect(b.size()));
  std::memset(store->direct_base() + direct, 0x5A, b.size());
  store::StoreLayout layout;
  layout.tensors = {Tensor("a", a.data(), 0, a.size()),
                    Tensor("b", nullptr, direct, b.size(), wire::Region::kDirect)};
  layout.slot_bytes = a.size();
  layout.slots = 2;
  layout.segment_bytes = 1024;
  wire::Welcome welcome;
  ASSERT_OK(store->Freeze(layout, &welcome));
  std::vector<uint64_t> digests(store->digest_count());
  ASSERT_OK(store->Publish(0, digests, nullptr, nullptr, util::Deadline(std::chrono::seconds(5))));
  a[0] = 99;  // slot 1 holds the later version
  ASSERT_OK(store->Publish(1, digests, nullptr, nullptr, util::Deadline(std::chrono::seconds(5))));
  ASSERT_OK_AND_ASSIGN(auto view, Map(*store, welcome));
  EXPECT_EQ(view->units(), 2u);
  EXPECT_FALSE(view->streamed());
  EXPECT_EQ(view->host_memory().size(), welcome.arena_bytes);
  for (uint32_t unit : {0u, 1u}) {
    std::vector<Piece> pieces;
    view->Cut(unit, wire::Region::kSlot, 0, a.size(), 0, &pieces);
    ASSERT_EQ(pieces.size(), 1u);
    EXPECT_EQ(pieces[0].src, view->SlotBase(unit));
    const std::vector<uint8_t> got = Read(pieces);
    EXPECT_EQ(got[0], unit == 0 ? 1 : 99) << "unit " << unit;
    EXPECT_TRUE(std::equal(got.begin() + 1, got.end(), a.begin() + 1));
    // The direct region is the same bytes whatever the unit.
    pieces.clear();
    view->Cut(unit, wire::Region::kDirect, direct, b.size(), 0, &pieces);
    EXPECT_EQ(Read(pieces), std::vector<uint8_t>(b.size(), 0x5A));
  }
  // Cut into pieces of at most 2000 bytes, each `at` where it starts in the range.
  std::vector<Piece> pieces;
  view->Cut(0, wire::Region::kSlot, 100, 4500, 2000, &pieces);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[1].at, 2000u);
  EXPECT_EQ(pieces[2].bytes, 500u);
  EXPECT_EQ(pieces[1].src, view->SlotBase(0) + 2100);
  // A step's unit is the slot the publisher named; one it does not have is refused.
  uint32_t read = 99;
  ASSERT_OK(view->Step({7, 1}, util::Deadline(std::chrono::seconds(1)), [&](uint32_t unit) {
    read = unit;
    return Status::Ok();
  }));
  EXPECT_EQ(read, 1u);
  EXPECT_STATUS_IS(kProtocolError,
                   view->Step({7, 2}, util::Deadline(std::chrono::seconds(1)),
                              [](uint32_t) { return Status::Ok(); }),
                   "step 7 in slot 2 but the arena has 2 slots");
  EXPECT_EQ(view->Describe(), ", host arena");
  ASSERT_OK(view->Release());
  ASSERT_OK(view->Release());  // idempotent
  ASSERT_OK(store->Close());
}

TEST(HostRingView, EachBucketIsAUnitHoldingOnlyItsPartOfTheVersion) {
  // Tensors at version offsets 0 and 6000 in buckets of 4096 (the second straddles buckets 1, 2).
  std::vector<uint8_t> a(5000), b(6000);
  std::iota(a.begin(), a.end(), uint8_t{1});
  std::iota(b.begin(), b.end(), uint8_t{101});
  store::StoreLayout layout;
  layout.tensors = {Tensor("a", a.data(), 0, a.size()), Tensor("b", b.data(), 6000, b.size())};
  layout.slot_bytes = 12000;
  layout.segment_bytes = 1024;
  layout.ring_slots = 2;
  layout.ring_bucket_bytes = 4096;
  ASSERT_OK_AND_ASSIGN(auto store, store::NewHostRingStore(testing::UniqueEndpoint("ringview")));
  wire::Welcome welcome;
  ASSERT_OK(store->Freeze(layout, &welcome));
  ASSERT_EQ(welcome.version_buckets, 3u);
  ASSERT_OK_AND_ASSIGN(auto view, Map(*store, welcome));
  EXPECT_EQ(view->units(), 3u);
  EXPECT_TRUE(view->streamed());
  EXPECT_EQ(view->SlotBase(0), nullptr) << "a bucket is gone once read";
  // Bucket 1 holds a[4096..5000) and b[0..2192); bucket 2 the rest of b.
  ASSERT_OK(store->FillBucket(1, 1));
  std::vector<Piece> pieces;
  view->Cut(1, wire::Region::kSlot, 0, a.size(), 0, &pieces);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].at, 4096u);
  EXPECT_EQ(Read(pieces), std::vector<uint8_t>(a.begin() + 4096, a.end()));
  pieces.clear();
  view->Cut(1, wire::Region::kSlot, 6000, b.size(), 0, &pieces);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].at, 0u);
  EXPECT_EQ(Read(pieces), std::vector<uint8_t>(b.begin(), b.begin() + (8192 - 6000)));
  ASSERT_OK(store->FillBucket(2, 0));
  pieces.clear();
  view->Cut(2, wire::Region::kSlot, 6000, b.size(), 1000, &pieces);  // cut in pieces too
  ASSERT_EQ(pieces.size(), 4u);
  EXPECT_EQ(pieces[0].at, 8192u - 6000);
  EXPECT_EQ(Read(pieces), std::vector<uint8_t>(b.begin() + (8192 - 6000), b.end()));
  // A unit holds nothing of a range in other buckets, nor of a direct region.
  pieces.clear();
  view->Cut(2, wire::Region::kSlot, 0, a.size(), 0, &pieces);
  view->Cut(0, wire::Region::kDirect, 0, 10, 0, &pieces);
  EXPECT_TRUE(pieces.empty());
  EXPECT_EQ(view->Describe(), ", a ring of 2 host buckets of 4096 bytes (3 a version)");
  ASSERT_OK(view->Release());
  ASSERT_OK(store->Close());
}

TEST(HostStoreView, AMappingOfTheWrongSizeIsRefusedNamingBoth) {
  wire::Welcome welcome;
  welcome.arena_kind = wire::ArenaKind::kHostMemfd;
  welcome.arena_bytes = 1 << 20;
  util::UniqueFd other(::memfd_create("not-the-store", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(other.valid());
  ASSERT_EQ(::ftruncate(other.get(), 4096), 0);
  EXPECT_STATUS_IS(kProtocolError, MapHostStore(welcome, std::move(other), nullptr),
                   "received segment is 4096 bytes, welcome says 1048576");
}

}  // namespace
}  // namespace weightsync::transport::view
