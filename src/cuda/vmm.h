// GPU memory shared between processes on one host, through the CUDA virtual memory management
// API: the exporter creates a cuMem allocation whose handle is a POSIX fd, passes the fd over the
// Unix socket (SCM_RIGHTS, like a memfd), and the importer maps it into its own address space for
// its own device. Prepared once per transfer handle; nothing here runs per step except CopyQueue.
//
// The fd is a bearer capability: it is only ever passed to the uid-checked peer and never logged.
// Host code with no CUDA headers; in a CPU-only build every call returns Unavailable.
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "cuda/copy_batch.h"
#include "util/deadline.h"
#include "util/unique_fd.h"
#include "weightsync/status.h"

namespace weightsync::cuda {

class PreparedCopyGroup;  // cuda/kernels.h

// Device memory on `device` from cuMemCreate (POSIX-fd exportable), mapped read-write there. In
// the ledger as a segment, a mapping, mapped_bytes and device_bytes until Close.
class ExportedAllocation {
 public:
  ExportedAllocation() = default;
  // `bytes` is rounded up to the allocation granularity.
  static Result<ExportedAllocation> Create(int device, uint64_t bytes);
  ExportedAllocation(ExportedAllocation&& o) noexcept { *this = std::move(o); }
  ExportedAllocation& operator=(ExportedAllocation&& o) noexcept;
  ~ExportedAllocation();

  uint8_t* data() const { return reinterpret_cast<uint8_t*>(va_); }  // a device pointer
  uint64_t size() const { return size_; }
  int device() const { return device_; }
  // A fresh fd for the allocation (one per peer).
  Result<util::UniqueFd> ExportFd() const;
  Status Close();  // unmap, free the address range, release the allocation

 private:
  uint64_t va_ = 0;
  uint64_t size_ = 0;
  uint64_t handle_ = 0;
  int device_ = -1;
};

// cuMem memory laid out as PyTorch's expandable segments lay it: allocations ("chunks") of
// `chunk_bytes` each (0: the minimum granularity, 2 MiB on H200; PyTorch uses 2 MiB pages for
// small blocks and 20 MiB for large ones), mapped back to back into one reserved range,
// read-write on `device`, at least `bytes` in all. `exportable`: created with
// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (PyTorch's default); without it the memory cannot be
// shared with another process. For tests and benchmarks of zero-copy publishing (the caller's
// memory: not in the ledger).
class ChunkedAllocation {
 public:
  ChunkedAllocation() = default;
  static Result<ChunkedAllocation> Create(int device, uint64_t bytes, bool exportable = true,
                                          uint64_t chunk_bytes = 0);
  ChunkedAllocation(ChunkedAllocation&& o) noexcept { *this = std::move(o); }
  ChunkedAllocation& operator=(ChunkedAllocation&& o) noexcept;
  ~ChunkedAllocation();

  uint8_t* data() const { return reinterpret_cast<uint8_t*>(va_); }  // a device pointer
  uint64_t size() const { return chunk_bytes_ * handles_.size(); }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  size_t chunks() const { return handles_.size(); }
  Status Close();

 private:
  uint64_t va_ = 0;
  uint64_t reserved_ = 0;
  uint64_t chunk_bytes_ = 0;
  std::vector<uint64_t> handles_;  // mapped in order
};

// Host memory pinned for the copy engines (cudaHostRegister), once per handle: copies from it run
// asynchronously at the link's DMA rate, where pageable memory is staged through the driver's own
// bounce buffers. Unregistered on Close, before the memory is unmapped.
class HostRegistration {
 public:
  HostRegistration() = default;
  // `read_only`: the range is mapped PROT_READ (needs cudaHostRegisterReadOnly, which the device
  // must support; Unavailable says so when it does not). Memory already registered, even in part
  // (by the application or another handle), is Unavailable too: pins are never shared, so nobody
  // unpins memory another's copies still read. Zero bytes: an empty registration.
  static Result<HostRegistration> Register(const void* data, uint64_t bytes, bool read_only);
  HostRegistration(HostRegistration&& o) noexcept { *this = std::move(o); }
  HostRegistration& operator=(HostRegistration&& o) noexcept;
  ~HostRegistration();

  bool registered() const { return data_ != nullptr; }
  uint64_t size() const { return size_; }
  Status Close();  // cudaHostUnregister; idempotent

 private:
  void* data_ = nullptr;
  uint64_t size_ = 0;
};

// A peer's allocation mapped into this process for `device` (read-write access: copies may use
// it as source; nothing writes it).
class ImportedAllocation {
 public:
  ImportedAllocation() = default;
  static Result<ImportedAllocation> Import(int fd, uint64_t bytes, int device);
  ImportedAllocation(ImportedAllocation&& o) noexcept { *this = std::move(o); }
  ImportedAllocation& operator=(ImportedAllocation&& o) noexcept;
  ~ImportedAllocation();

  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(va_); }
  uint64_t size() const { return size_; }
  // The device the memory lives on, in this process's numbering; -1 when the driver does not say.
  int owner_device() const { return owner_device_; }
  // Lets `device` (besides the one it was imported for) use the mapping, read-write like the
  // first (one mapping has one protection); kernels there only read it.
  Status GrantAccess(int device);
  Status Close();

 private:
  uint64_t va_ = 0;
  uint64_t size_ = 0;
  uint64_t handle_ = 0;
  int owner_device_ = -1;
};

// Asynchronous copies on one non-blocking stream of `device`, completion by an event, waited for
// with a deadline (the host polls the event, so a stuck copy is a Timeout, not a hang).
//
// Copy lanes: a prepared batch of at least kLaneMinBytes goes out on kCopyLanes streams at once
// (the queue's own and kCopyLanes - 1 side streams, created at the first such batch and kept):
// forked from the queue's stream by an event, each lane's run of copies (CutIntoLanes) in one
// cudaMemcpyBatchAsync, joined back by events, so whatever is enqueued or waited for afterwards
// on the queue's stream orders after all of it. Why: one stream runs its copies one after the
// other with a gap between them; on one H200 the 339 copies of a 7B model (15.2 GB, device to
// device) ran at 0.88x the speed of one flat copy of the same bytes on one stream, 0.92x on two
// lanes, 0.96x on four and 0.97x on eight (bench/copy_kernel_probe.cu,
// bench/results/copy_kernel_probe_1xh200_2026-12-0{3,4}.jsonl). Eight streams cost nothing per
// step; no copy kernel we tried beat 0.92x (docs/gpu.md, "Copy lanes").
class CopyQueue {
 public:
  static constexpr size_t kCopyLanes = kMaxCopyLanes;
  static constexpr uint64_t kLaneMinBytes = uint64_t{64} << 20;

  CopyQueue() = default;
  static Result<CopyQueue> Create(int device);
  CopyQueue(CopyQueue&& o) noexcept { *this = std::move(o); }
  CopyQueue& operator=(CopyQueue&& o) noexcept;
  ~CopyQueue();

  // dst/src: device pointers, peer mappings or host memory (cudaMemcpyDefault, unified addressing).
  Status Enqueue(void* dst, const void* src, uint64_t bytes);
  // Many copies in one call (cudaMemcpyBatchAsync: one driver submission instead of `count`; the
  // arrays are the caller's, prepared once). Falls back to one call per copy where unsupported.
  Status EnqueueBatch(void* const* dsts, const void* const* srcs, const size_t* sizes,
                      size_t count);
  // A prepared batch: its singles in one EnqueueBatch call per copy lane (one lane below
  // kLaneMinBytes), then one cudaMemcpy2DAsync per strided copy. `small` (optional): the copy
  // group of the batch's small copies (SplitOffSmallCopies), prepared on this queue's stream; it
  // is launched there right after the fork, so it runs while the side lanes copy (launched after
  // the batch it would start only once every lane joined).
  Status EnqueueBatch(const CopyBatch& batch, PreparedCopyGroup* small = nullptr);
  // Side streams created so far (0 until a batch needed lanes; then kCopyLanes - 1).
  size_t side_lanes() const { return side_count_; }
  // Records the event and waits until every enqueued copy (and kernel on stream()) is done.
  Status Wait(const util::Deadline& deadline);
  // Makes `waiting_stream` (any device's) wait, on the GPU, for everything enqueued here so far.
  Status SignalTo(void* waiting_stream);
  // Makes what is enqueued here from now on wait, on the GPU, for everything already queued on
  // `stream` (a cudaStream_t of this queue's device; nullptr: the legacy default stream). The
  // host does not block.
  Status WaitFor(void* stream);
  // Blocks until everything enqueued here finished (cudaStreamSynchronize; no deadline: what a
  // release calls before freeing what the work touches).
  Status Drain();
  void* stream() const { return stream_; }  // a cudaStream_t
  int device() const { return device_; }
  Status Close();

 private:
  void* stream_ = nullptr;
  void* event_ = nullptr;
  void* after_event_ = nullptr;  // recorded on another stream by WaitFor
  int device_ = -1;
  // Copy lanes (cudaStream_t, cudaEvent_t): side streams, the fork event recorded on stream_,
  // and one join event per side stream.
  Status EnsureLanes();
  Status EnqueueOnLanes(const CopyBatch& batch, const LaneCuts& cuts, PreparedCopyGroup* small);
  std::array<void*, kCopyLanes - 1> side_{};
  std::array<void*, kCopyLanes - 1> joined_{};
  void* fork_ = nullptr;
  size_t side_count_ = 0;
};

// Makes `device` current on the calling thread.
Status SetDevice(int device);
// The calling thread's current device (cudaGetDevice).
Result<int> CurrentDevice();
// Lets `device` access memory allocated on `peer` directly (cudaDeviceEnablePeerAccess; already
// enabled is fine).
Status EnablePeerAccess(int device, int peer);
// Whether a kernel on `device` may write the `bytes` of device memory at `ptr` (its first and last
// byte are checked): cudaMalloc memory of a peer it can reach (with peer access enabled), or a
// cuMem mapping whose owner granted it read-write access. False, not an error, when it may not.
Result<bool> DeviceCanWrite(int device, const void* ptr, uint64_t bytes);
// Restores the calling thread's current device when it goes out of scope (code that moves between
// devices must not leave the caller on another one, e.g. the publisher's GPU) — unless that device
// has no CUDA context yet (the caller never used it): restoring would create one.
class ScopedDevice {
 public:
  ScopedDevice();
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int saved_ = -1;
};
// Free and total memory of the current device (cudaMemGetInfo).
Status MemInfo(size_t* free_bytes, size_t* total_bytes);

}  // namespace weightsync::cuda
