// The GPU store shapes through their views (view/store_view.h): a GPU arena and a GPU ring, each
// made by the publisher's own store on cuda:0 and imported here from its fd as a subscriber does
// (ImportGpuStore) — where a version's bytes lie unit by unit, read back from the device. (The
// zero-copy view opens another process's allocations: the conformance suite's zero-copy rows.)
#include "transport/view/store_view.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <numeric>

#include "gpu/gpu_test_util.h"
#include "transport/store/version_store.h"

namespace weightsync::transport::view {
namespace {

store::PublishedTensor Tensor(const std::string& name, const uint8_t* source, uint64_t offset,
                              uint64_t bytes) {
  store::PublishedTensor t;
  t.placement.spec = {name, DType::kUInt8, {static_cast<int64_t>(bytes)}, bytes};
  t.placement.offset = offset;
  t.source = source;
  return t;
}

std::vector<uint8_t> ReadBack(const std::vector<Piece>& pieces) {
  std::vector<uint8_t> out;
  for (const Piece& p : pieces) {
    auto bytes = cuda::testing::Download<uint8_t>(p.src, p.bytes);
    EXPECT_OK(bytes);
    if (bytes.ok()) out.insert(out.end(), bytes->begin(), bytes->end());
  }
  return out;
}

TEST(GpuArenaView, EachSlotIsAUnitOnTheStoresGpu) {
  WS_SKIP_WITHOUT_GPU();
  ASSERT_OK(cuda::SetDevice(0));
  std::vector<uint8_t> host(10000);
  std::iota(host.begin(), host.end(), uint8_t{3});
  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer tensor, cuda::testing::Upload(host));
  store::StoreLayout layout;
  layout.tensors = {Tensor("w", tensor.as<uint8_t>(), 0, host.size())};
  layout.slot_bytes = host.size();
  layout.slots = 2;
  layout.segment_bytes = 4096;
  ASSERT_OK_AND_ASSIGN(auto store, store::NewGpuStore(0));
  wire::Welcome welcome;
  ASSERT_OK(store->Freeze(layout, &welcome));
  std::vector<uint64_t> digests(store->digest_count());
  for (uint32_t slot : {0u, 1u}) {
    ASSERT_OK(
        store->Publish(slot, digests, nullptr, nullptr, util::Deadline(std::chrono::seconds(5))));
  }
  ASSERT_OK_AND_ASSIGN(
      auto view, ImportGpuStore(welcome, util::UniqueFd(::dup(store->fd())), nullptr, 0, nullptr));
  EXPECT_EQ(view->units(), 2u);
  EXPECT_FALSE(view->streamed());
  EXPECT_TRUE(view->host_memory().empty());
  EXPECT_EQ(view->owner_device(), 0);
  for (uint32_t unit : {0u, 1u}) {
    std::vector<Piece> pieces;
    view->Cut(unit, wire::Region::kSlot, 0, host.size(), 4096, &pieces);
    ASSERT_EQ(pieces.size(), 3u);
    EXPECT_EQ(pieces[0].src, view->SlotBase(unit));
    EXPECT_EQ(ReadBack(pieces), host) << "unit " << unit;
  }
  EXPECT_EQ(view->Describe(), ", GPU arena from cuda:0");
  ASSERT_OK(view->Release());
  ASSERT_OK(store->Close());
}

TEST(GpuRingView, EachBucketIsAUnitHoldingOnlyItsPartOfTheVersion) {
  WS_SKIP_WITHOUT_GPU();
  ASSERT_OK(cuda::SetDevice(0));
  std::vector<uint8_t> host(10000);
  std::iota(host.begin(), host.end(), uint8_t{7});
  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer tensor, cuda::testing::Upload(host));
  store::StoreLayout layout;
  layout.tensors = {Tensor("w", tensor.as<uint8_t>(), 0, host.size())};
  layout.slot_bytes = host.size();
  layout.segment_bytes = 4096;
  layout.ring_slots = 2;
  layout.ring_bucket_bytes = 4096;
  ASSERT_OK_AND_ASSIGN(auto store, store::NewGpuRingStore(0));
  wire::Welcome welcome;
  ASSERT_OK(store->Freeze(layout, &welcome));
  ASSERT_EQ(welcome.version_buckets, 3u);
  ASSERT_OK_AND_ASSIGN(
      auto view, ImportGpuStore(welcome, util::UniqueFd(::dup(store->fd())), nullptr, 0, nullptr));
  EXPECT_EQ(view->units(), 3u);
  EXPECT_TRUE(view->streamed());
  EXPECT_EQ(view->SlotBase(0), nullptr);
  for (uint32_t b = 0; b < 3; ++b) {
    ASSERT_OK(store->FillBucket(b, b % 2));
    std::vector<Piece> pieces;
    view->Cut(b, wire::Region::kSlot, 0, host.size(), 0, &pieces);
    ASSERT_EQ(pieces.size(), 1u) << "bucket " << b;
    EXPECT_EQ(pieces[0].at, b * 4096u);
    const uint64_t end = std::min<uint64_t>(host.size(), (b + 1) * 4096u);
    EXPECT_EQ(ReadBack(pieces), std::vector<uint8_t>(host.begin() + b * 4096, host.begin() + end))
        << "bucket " << b;
  }
  EXPECT_EQ(view->Describe(), ", a ring of 2 GPU buckets of 4096 bytes (3 a version) on cuda:0");
  ASSERT_OK(view->Release());
  ASSERT_OK(store->Close());
}

}  // namespace
}  // namespace weightsync::transport::view
