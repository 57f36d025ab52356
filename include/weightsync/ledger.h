// The resource ledger: live counts of everything weightsync holds in this process. Tests compare it
// with a baseline after every fault; `weightsync info` prints it.
#pragma once

#include <cstdint>
#include <string>

namespace weightsync {

struct LedgerSnapshot {
  int64_t fds = 0;       // file descriptors owned (sockets, memfds)
  int64_t segments = 0;  // shared-memory segments created or imported
  int64_t mappings = 0;  // live mmap regions
  int64_t mapped_bytes = 0;
  int64_t threads = 0;        // threads started and not yet joined
  int64_t staging_bytes = 0;  // shadow / landing buffers of subscribers, host or device
  int64_t pinned_bytes = 0;   // host memory page-locked for the copy engines (cudaHostRegister)
  // GPU memory weightsync allocated for itself and still holds, on any device: cudaMalloc buffers
  // (device staging, digests, launch tables) and the cuMem arenas and rings a publisher exports.
  // Device staging is in staging_bytes too, an exported arena in mapped_bytes too. Not counted:
  // memory handed to the caller (weightsync::DeviceMemory, Python's allocate(device=...)) and a
  // peer's memory mapped here (mappings / mapped_bytes).
  int64_t device_bytes = 0;
  int64_t handles = 0;      // prepared transfer handles
  int64_t connections = 0;  // live control connections (both roles)
  // The caller's GPU allocations kept alive by weightsync: cuMem allocations a zero-copy publisher
  // retained (cuMemRetainAllocationHandle) to export them. Their memory stays allocated until the
  // publisher releases them (a new prepare, Close, destruction), even if the caller frees it.
  int64_t retained_allocations = 0;
  int64_t release_failures = 0;  // cumulative: cleanups that failed (and were logged)

  // Compares the live counts (not the cumulative ones).
  bool SameLiveCounts(const LedgerSnapshot& other) const;
  std::string ToString() const;
};

LedgerSnapshot ReadLedger();

}  // namespace weightsync
