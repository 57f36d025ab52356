// CUDA IPC of ordinary allocations: what zero-copy publishing exports and subscribers open. A
// publisher's own tensors (PyTorch's caching allocator, cudaMalloc) are sub-ranges of larger
// allocations; each allocation is exported once by the handle of its base (as PyTorch's own
// reductions do) and opened once per process. Handles are bearer secrets: whoever holds one on
// this host can map the memory, so they travel only over the uid-checked local socket and are
// never logged.
#pragma once

#include <array>
#include <cstdint>

#include "weightsync/status.h"

namespace weightsync::cuda {

inline constexpr size_t kIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)
using IpcHandle = std::array<uint8_t, kIpcHandleBytes>;

// The allocation device pointer `p` lies in: its base and size (the driver's address range).
struct AllocationRange {
  const uint8_t* base = nullptr;
  uint64_t bytes = 0;
};
Result<AllocationRange> AllocationOf(const void* p);

// The IPC handle of the allocation starting at `base` (cudaIpcGetMemHandle). cuMem (VMM)
// allocations, e.g. PyTorch's expandable segments, have none: the driver's reason is kept in the
// error.
Result<IpcHandle> ExportIpcHandle(const void* base);

// A publisher's allocation opened in this process for one device (cudaIpcOpenMemHandle from that
// device's context, peer access enabled lazily when it is another GPU's). Openings are shared and
// counted per (handle, device), as PyTorch does (older drivers refused a second open of one handle
// in a context): every IpcMapping of the same handle on the same device (two subscribers of one
// publisher in one process) holds the same mapping, closed from that device's context when the
// last one is. Each reference counts as a mapping in the ledger.
class IpcMapping {
 public:
  IpcMapping() = default;
  // Opens (or shares) `handle` from a context of `device`.
  static Result<IpcMapping> Open(const IpcHandle& handle, int device);
  IpcMapping(IpcMapping&& o) noexcept { *this = static_cast<IpcMapping&&>(o); }
  IpcMapping& operator=(IpcMapping&& o) noexcept;
  ~IpcMapping();  // Close(), logging a failure

  uint8_t* data() const { return data_; }
  Status Close();  // drops this reference; the last one closes the mapping

 private:
  uint8_t* data_ = nullptr;
  IpcHandle handle_{};
  int device_ = -1;
};

}  // namespace weightsync::cuda
