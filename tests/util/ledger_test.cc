// The resource ledger's snapshot has one field per counter: each read from its own counter, each
// in ToString(), each live one compared by SameLiveCounts() (the baseline checks of every fault
// test) and the cumulative release_failures not. A field added to LedgerSnapshot without a row
// here fails the size check.
#include "util/ledger.h"

#include <gtest/gtest.h>

#include <iterator>
#include <string>

#include "weightsync/ledger.h"

namespace weightsync::util {
namespace {

struct Field {
  LedgerItem item;
  int64_t LedgerSnapshot::*member;
  const char* name;
  bool live;  // compared by SameLiveCounts
};

constexpr Field kFields[] = {
    {LedgerItem::kFds, &LedgerSnapshot::fds, "fds", true},
    {LedgerItem::kSegments, &LedgerSnapshot::segments, "segments", true},
    {LedgerItem::kMappings, &LedgerSnapshot::mappings, "mappings", true},
    {LedgerItem::kMappedBytes, &LedgerSnapshot::mapped_bytes, "mapped_bytes", true},
    {LedgerItem::kThreads, &LedgerSnapshot::threads, "threads", true},
    {LedgerItem::kStagingBytes, &LedgerSnapshot::staging_bytes, "staging_bytes", true},
    {LedgerItem::kPinnedBytes, &LedgerSnapshot::pinned_bytes, "pinned_bytes", true},
    {LedgerItem::kDeviceBytes, &LedgerSnapshot::device_bytes, "device_bytes", true},
    {LedgerItem::kHandles, &LedgerSnapshot::handles, "handles", true},
    {LedgerItem::kConnections, &LedgerSnapshot::connections, "connections", true},
    {LedgerItem::kRetainedAllocations, &LedgerSnapshot::retained_allocations,
     "retained_allocations", true},
    {LedgerItem::kReleaseFailures, &LedgerSnapshot::release_failures, "release_failures", false},
};

TEST(Ledger, EverySnapshotFieldHasACounter) {
  static_assert(std::size(kFields) == static_cast<size_t>(LedgerItem::kCount));
  EXPECT_EQ(sizeof(LedgerSnapshot), std::size(kFields) * sizeof(int64_t))
      << "a LedgerSnapshot field without a row in kFields";
}

TEST(Ledger, EachCounterIsReadIntoItsOwnField) {
  for (const Field& f : kFields) {
    const LedgerSnapshot before = ReadLedger();
    LedgerAdd(f.item, 7);
    const LedgerSnapshot during = ReadLedger();
    LedgerAdd(f.item, -7);
    for (const Field& g : kFields) {
      EXPECT_EQ(during.*g.member - before.*g.member, &f == &g ? 7 : 0)
          << "adding to " << f.name << " moved " << g.name;
    }
    EXPECT_EQ(ReadLedger().*f.member, before.*f.member) << f.name;
  }
}

TEST(Ledger, LiveFieldsAreComparedAndAllArePrinted) {
  for (const Field& f : kFields) {
    LedgerSnapshot a, b;
    b.*f.member = 3;
    EXPECT_EQ(a.SameLiveCounts(b), !f.live) << f.name;
    EXPECT_NE(b.ToString().find(std::string(f.name) + "=3"), std::string::npos)
        << f.name << " missing from " << b.ToString();
  }
}

}  // namespace
}  // namespace weightsync::util
