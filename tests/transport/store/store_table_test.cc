// The store table (store/store_table.h): which store a publisher's tensors and options choose —
// zero-copy and rings before the arenas, GPU rows for CUDA tensors — and that the host arena row
// takes the host store made at Create (its Allocate()d tensors live there). The GPU rows' stores
// themselves are the GPU suites'; here only the choice.
#include "transport/store/store_table.h"

#include <gtest/gtest.h>

#include <set>

#include "testing/test_util.h"

namespace weightsync::transport::store {
namespace {

std::string Chosen(const PublisherOptions& options, int device,
                   std::unique_ptr<VersionStore>* host_store) {
  Result<const StoreEntry*> entry = ChooseStore({&options, device, "t", host_store});
  return entry.ok() ? std::string((*entry)->name) : entry.status().ToString();
}

TEST(StoreTable, EachCombinationChoosesItsRow) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionStore> host,
                       NewHostStore(testing::UniqueEndpoint("store-table")));
  PublisherOptions plain, zero_copy, ring;
  zero_copy.zero_copy = true;
  ring.ring_buckets = 2;
  EXPECT_EQ(Chosen(plain, -1, &host), "host-arena");
  EXPECT_EQ(Chosen(plain, 0, &host), "gpu-arena");
  EXPECT_EQ(Chosen(zero_copy, 0, &host), "zero-copy");
  EXPECT_EQ(Chosen(ring, -1, &host), "host-ring");
  EXPECT_EQ(Chosen(ring, 1, &host), "gpu-ring");
  // Zero-copy host tensors are refused at Register; the table has no row for them either way but
  // the host arena's, which an Allocate() publisher uses.
  EXPECT_EQ(Chosen(zero_copy, -1, &host), "host-arena");
}

TEST(StoreTable, TheHostArenaRowTakesTheHostStoreMadeAtCreate) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionStore> host,
                       NewHostStore(testing::UniqueEndpoint("store-table")));
  VersionStore* made = host.get();
  PublisherOptions plain;
  StoreRequest request{&plain, -1, "t", &host};
  ASSERT_OK_AND_ASSIGN(const StoreEntry* entry, ChooseStore(request));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionStore> store, entry->make(request));
  EXPECT_EQ(store.get(), made);
  EXPECT_EQ(host, nullptr);
  // Gone, it cannot be chosen again: named, not a null store.
  EXPECT_STATUS_IS(kNotSupported, ChooseStore(request), "no store holds host tensors",
                   "the host store is gone");
  EXPECT_FALSE(entry->versions_are_the_tensors);
  ASSERT_OK(store->Close());
}

TEST(StoreTable, RowsAreNamedOnceAndTheSharedOnesAreTheTensorStores) {
  std::set<std::string_view> names;
  for (const StoreEntry& e : StoreTable()) {
    EXPECT_TRUE(names.insert(e.name).second) << e.name;
    EXPECT_FALSE(e.holds.empty()) << e.name;
    const bool shared = e.name == "zero-copy" || e.name == "host-ring" || e.name == "gpu-ring";
    EXPECT_EQ(e.versions_are_the_tensors, shared) << e.name;
  }
  EXPECT_EQ(names.size(), 5u);
}

}  // namespace
}  // namespace weightsync::transport::store
