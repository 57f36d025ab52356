#include "util/ledger.h"

#include <sstream>

#include "weightsync/ledger.h"

namespace weightsync {
namespace util {
namespace {
std::atomic<int64_t> g_counts[static_cast<int>(LedgerItem::kCount)];
}  // namespace

void LedgerAdd(LedgerItem item, int64_t delta) {
  // Relaxed: counters are statistics read after the operations they count have completed.
  g_counts[static_cast<int>(item)].fetch_add(delta, std::memory_order_relaxed);
}

}  // namespace util

LedgerSnapshot ReadLedger() {
  using util::LedgerItem;
  auto get = [](LedgerItem i) {
    return util::g_counts[static_cast<int>(i)].load(std::memory_order_relaxed);
  };
  LedgerSnapshot s;
  s.fds = get(LedgerItem::kFds);
  s.segments = get(LedgerItem::kSegments);
  s.mappings = get(LedgerItem::kMappings);
  s.mapped_bytes = get(LedgerItem::kMappedBytes);
  s.threads = get(LedgerItem::kThreads);
  s.staging_bytes = get(LedgerItem::kStagingBytes);
  s.pinned_bytes = get(LedgerItem::kPinnedBytes);
  s.device_bytes = get(LedgerItem::kDeviceBytes);
  s.handles = get(LedgerItem::kHandles);
  s.connections = get(LedgerItem::kConnections);
  s.retained_allocations = get(LedgerItem::kRetainedAllocations);
  s.release_failures = get(LedgerItem::kReleaseFailures);
  return s;
}

bool LedgerSnapshot::SameLiveCounts(const LedgerSnapshot& o) const {
  return fds == o.fds && segments == o.segments && mappings == o.mappings &&
         mapped_bytes == o.mapped_bytes && threads == o.threads &&
         staging_bytes == o.staging_bytes && pinned_bytes == o.pinned_bytes &&
         device_bytes == o.device_bytes && handles == o.handles && connections == o.connections &&
         retained_allocations == o.retained_allocations;
}

std::string LedgerSnapshot::ToString() const {
  std::ostringstream os;
  os << "fds=" << fds << " segments=" << segments << " mappings=" << mappings
     << " mapped_bytes=" << mapped_bytes << " threads=" << threads
     << " staging_bytes=" << staging_bytes << " pinned_bytes=" << pinned_bytes
     << " device_bytes=" << device_bytes << " handles=" << handles << " connections=" << connections
     << " retained_allocations=" << retained_allocations
     << " release_failures=" << release_failures;
  return os.str();
}

}  // namespace weightsync
