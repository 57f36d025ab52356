#include "weightsync/cuda.h"

#include <utility>

#include "cuda/device.h"
#include "cuda/vmm.h"
#include "util/logging.h"

namespace weightsync {

Status CudaStatus() { return gpu::CudaAvailable(); }

int CudaDeviceCount() { return gpu::DeviceCount(); }

Result<DeviceMemory> DeviceMemory::Allocate(int device, uint64_t bytes) {
  WS_RETURN_IF_ERROR(gpu::CudaAvailable());
  if (device < 0 || device >= gpu::DeviceCount()) {
    return Status::InvalidArgument("cuda:", device, " does not exist (", gpu::DeviceCount(),
                                   " CUDA device(s) visible)");
  }
  gpu::ScopedDevice restore;  // the caller's device stays current
  WS_RETURN_IF_ERROR(gpu::SetDevice(device));
  WS_ASSIGN_OR_RETURN(gpu::DeviceBuffer buffer, gpu::DeviceBuffer::Allocate(bytes));
  WS_RETURN_IF_ERROR(gpu::MemsetDevice(buffer.data(), 0, bytes));
  DeviceMemory memory;
  memory.size_ = buffer.size();
  memory.data_ = buffer.Release();
  memory.device_ = device;
  return Result<DeviceMemory>(std::move(memory));
}

DeviceMemory::DeviceMemory(DeviceMemory&& o) noexcept { *this = std::move(o); }

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& o) noexcept {
  if (this != &o) {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda") << "device memory cleanup: " << s;
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    device_ = std::exchange(o.device_, -1);
  }
  return *this;
}

DeviceMemory::~DeviceMemory() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda") << "device memory cleanup: " << s;
}

Status DeviceMemory::Close() {
  size_ = 0;
  device_ = -1;
  return gpu::FreeDevice(std::exchange(data_, nullptr))
      .WithContext("freeing weightsync::DeviceMemory");
}

}  // namespace weightsync
