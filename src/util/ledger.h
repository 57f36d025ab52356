// Internal side of the resource ledger (include/weightsync/ledger.h): counters bumped by the RAII
// owners of each resource. Relaxed atomics: counts are read by tests after operations complete.
#pragma once

#include <atomic>
#include <cstdint>

namespace weightsync::util {

enum class LedgerItem {
  kFds,
  kSegments,
  kMappings,
  kMappedBytes,
  kThreads,
  kStagingBytes,
  kPinnedBytes,
  kDeviceBytes,
  kHandles,
  kConnections,
  kRetainedAllocations,
  kReleaseFailures,
  kCount
};

void LedgerAdd(LedgerItem item, int64_t delta);

}  // namespace weightsync::util
