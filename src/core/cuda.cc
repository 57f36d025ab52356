#include "weightsync/cuda.h"

#include <utility>

#include "cuda/device.h"
#include "cuda/vmm.h"
#include "util/logging.h"

namespace weightsync {

Status CudaStatus() { return cuda::CudaAvailable(); }

int CudaDeviceCount() { return cuda::DeviceCount(); }

Result<DeviceMemory> DeviceMemory::Allocate(int device, uint64_t bytes) {
  WS_RETURN_IF_ERROR(cuda::CudaAvailable());
  if (device < 0 || device >= cuda::DeviceCount()) {
    return Status::InvalidArgument("cuda:", device, " does not exist (", cuda::DeviceCount(),
                                   " CUDA device(s) visible)");
  }
  cuda::ScopedDevice restore;  // the caller's device stays current
  WS_RETURN_IF_ERROR(cuda::SetDevice(device));
  WS_ASSIGN_OR_RETURN(cuda::DeviceBuffer buffer, cuda::DeviceBuffer::Allocate(bytes));
  WS_RETURN_IF_ERROR(cuda::MemsetDevice(buffer.data(), 0, bytes));
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
  return cuda::FreeDevice(std::exchange(data_, nullptr))
      .WithContext("freeing weightsync::DeviceMemory");
}

}  // namespace weightsync
