// The CUDA runtime as the rest of weightsync sees it: is a device there, device memory, streams,
// copies. Host code with no CUDA headers, so every caller builds in a CPU-only build; there each
// call returns Unavailable("built without CUDA").
//
// The runtime is linked statically (cudart_static), which loads the driver (libcuda) only when
// the first call needs it: a binary runs on a machine without a driver, and the calls then fail
// with Unavailable("no CUDA device: ...").
#pragma once

#include <cstdint>
#include <utility>

#include "weightsync/status.h"

namespace weightsync::cuda {

// A cudaStream_t (nullptr: the legacy default stream), kept opaque so headers need no CUDA.
using StreamHandle = void*;

// True when this build has the GPU data plane (WS_WITH_CUDA).
bool BuiltWithCuda();

// OK when at least one CUDA device can be used; otherwise Unavailable("no CUDA device: <reason>")
// (no driver, no device, driver too old), or Unavailable("built without CUDA"). The first call
// initializes the runtime; the answer is cached for the life of the process.
Status CudaAvailable();

// Number of usable devices; 0 when CudaAvailable() is not OK.
int DeviceCount();

// Device memory from cudaMalloc on the current device. Close() frees it and reports. Counted in
// the ledger's device_bytes while it holds the memory (until Close, or Release to a caller).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static Result<DeviceBuffer> Allocate(uint64_t bytes);
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  ~DeviceBuffer();

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  uint64_t size() const { return size_; }
  Status Close();
  // Gives the memory up to the caller, who frees it with FreeDevice(): the caller's from here on,
  // out of the ledger's device_bytes (as weightsync::DeviceMemory is).
  void* Release();

 private:
  void* data_ = nullptr;
  uint64_t size_ = 0;
};
// Frees memory DeviceBuffer::Release() gave up (cudaFree; nullptr is fine).
Status FreeDevice(void* device_ptr);

// A non-blocking stream (cudaStreamNonBlocking) on the current device.
class Stream {
 public:
  Stream() = default;
  static Result<Stream> Create();
  Stream(Stream&& o) noexcept { *this = std::move(o); }
  Stream& operator=(Stream&& o) noexcept;
  ~Stream();

  StreamHandle handle() const { return handle_; }
  Status Synchronize();
  Status Close();

 private:
  StreamHandle handle_ = nullptr;
};

// Synchronous copies between host memory and device memory (cudaMemcpy; pageable host memory is
// fine). They order after all work on the legacy default stream; synchronize a Stream first.
Status CopyToDevice(void* device_dst, const void* host_src, uint64_t bytes);
Status CopyToHost(void* host_dst, const void* device_src, uint64_t bytes);
Status MemsetDevice(void* device_dst, uint8_t value, uint64_t bytes);
// Waits for all work on the current device.
Status DeviceSynchronize();

}  // namespace weightsync::cuda
