// The GPU as an application of weightsync sees it: whether the GPU data plane can be used here,
// and device memory the caller owns (e.g. tensors a subscriber allocates for an engine).
// Callable in every build; in one without CUDA, or on a machine without a usable device, the
// calls answer Unavailable saying why.
#pragma once

#include <cstdint>

#include "weightsync/status.h"

namespace weightsync {

// Ok when this build has the GPU data plane and at least one CUDA device can be used; otherwise
// Unavailable naming the reason ("built without CUDA", no driver, no device, driver too old).
Status CudaStatus();
// Usable CUDA devices; 0 when CudaStatus() is not Ok.
int CudaDeviceCount();

// Device memory (cudaMalloc) on one device, owned by the caller. Close() frees it and reports;
// the destructor frees it too, logging a failure.
class DeviceMemory {
 public:
  // `bytes` zero-filled bytes on CUDA device `device`. The caller's current device is kept.
  static Result<DeviceMemory> Allocate(int device, uint64_t bytes);
  DeviceMemory() = default;
  DeviceMemory(DeviceMemory&& o) noexcept;
  DeviceMemory& operator=(DeviceMemory&& o) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory();

  void* data() const { return data_; }
  uint64_t size() const { return size_; }
  int device() const { return device_; }
  Status Close();

 private:
  void* data_ = nullptr;
  uint64_t size_ = 0;
  int device_ = -1;
};

}  // namespace weightsync
