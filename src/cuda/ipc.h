// CUDA IPC of ordinary allocations: what zero-copy publishing exports and subscribers open. A
// publisher's own tensors (PyTorch's caching allocator, cudaMalloc) are sub-ranges of larger
// allocations; each allocation is exported once by the handle of its base (as PyTorch's own
// reductions do) and opened once per process. Handles are bearer secrets: whoever holds one on
// this host can map the memory, so they travel only over the uid-checked local socket and are
// never logged.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "util/unique_fd.h"
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

// cuMem (VMM) memory, e.g. PyTorch's expandable segments: one reserved address range into which
// many cuMem allocations ("chunks", 2 or 20 MiB pages for PyTorch) are mapped back to back. The
// driver's address range of such a pointer is the whole reservation, and it has no CUDA IPC
// handle; each chunk is exported as a POSIX fd instead (as PyTorch's own reductions do), which
// works when the allocation was created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (PyTorch's
// default). The fds are bearer secrets like IPC handles.
struct VmmChunk {
  const uint8_t* base = nullptr;  // where the chunk is mapped
  uint64_t bytes = 0;
};
// The cuMem chunk mapped at `p`; nullopt when `p` is not cuMem memory (cudaMalloc memory, say).
Result<std::optional<VmmChunk>> VmmChunkAt(const void* p);

// A chunk's allocation, retained (cuMemRetainAllocationHandle) while a publisher exports it.
class RetainedChunk {
 public:
  RetainedChunk() = default;
  static Result<RetainedChunk> Retain(const VmmChunk& chunk);
  RetainedChunk(RetainedChunk&& o) noexcept { *this = static_cast<RetainedChunk&&>(o); }
  RetainedChunk& operator=(RetainedChunk&& o) noexcept;
  ~RetainedChunk();  // Close(), logging a failure

  // A fresh POSIX fd for one subscriber; the driver's reason when the allocation cannot export one.
  Result<util::UniqueFd> ExportFd() const;
  Status Close();  // releases the retained handle

 private:
  uint64_t handle_ = 0;
};

// A publisher's cuMem chunks mapped into this process back to back, as one range readable and
// writable by `device` (only reads happen). Imported from the fds RetainedChunk exported.
class ImportedChunks {
 public:
  ImportedChunks() = default;
  // fds[i] holds chunk i of chunk_bytes[i] bytes; the fds stay the caller's.
  static Result<ImportedChunks> Import(std::span<const int> fds,
                                       std::span<const uint64_t> chunk_bytes, int device);
  ImportedChunks(ImportedChunks&& o) noexcept { *this = static_cast<ImportedChunks&&>(o); }
  ImportedChunks& operator=(ImportedChunks&& o) noexcept;
  ~ImportedChunks();  // Close(), logging a failure

  uint8_t* data() const { return reinterpret_cast<uint8_t*>(va_); }
  uint64_t size() const { return size_; }
  Status Close();  // unmaps every chunk, frees the range, releases the handles

 private:
  uint64_t va_ = 0;
  uint64_t size_ = 0;
  std::vector<uint64_t> handles_;  // as mapped, in order
  std::vector<uint64_t> sizes_;
  bool counted_ = false;  // in the ledger (a whole import)
};

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
