// device.h with CUDA (WS_WITH_CUDA=1). no_cuda.cc holds the CPU-only build's answers.
#include <cuda_runtime_api.h>

#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "util/ledger.h"
#include "util/logging.h"

namespace weightsync::cuda {
namespace {

using util::LedgerAdd;
using util::LedgerItem;

Status ProbeDevices(int* count) {
  *count = 0;
  const cudaError_t err = cudaGetDeviceCount(count);
  if (err != cudaSuccess) {
    *count = 0;
    (void)cudaGetLastError();
    return Status::Unavailable("no CUDA device: ", cudaGetErrorName(err), ": ",
                               cudaGetErrorString(err));
  }
  if (*count <= 0) {
    *count = 0;
    return Status::Unavailable("no CUDA device: cudaGetDeviceCount found 0 devices");
  }
  return Status::Ok();
}

struct Probe {
  Status status;
  int count = 0;
};

const Probe& DeviceProbe() {
  static const Probe probe = [] {
    int count = 0;
    Status status = ProbeDevices(&count);
    return Probe{std::move(status), count};
  }();
  return probe;
}

}  // namespace

bool BuiltWithCuda() { return true; }

Status CudaAvailable() { return DeviceProbe().status; }

int DeviceCount() { return DeviceProbe().count; }

Result<DeviceBuffer> DeviceBuffer::Allocate(uint64_t bytes) {
  WS_RETURN_IF_ERROR(CudaAvailable());
  DeviceBuffer buffer;
  if (bytes == 0) return Result<DeviceBuffer>(std::move(buffer));
  WS_CUDA_RETURN_IF_ERROR(cudaMalloc(&buffer.data_, bytes), "cudaMalloc of ", bytes, " bytes");
  buffer.size_ = bytes;
  LedgerAdd(LedgerItem::kDeviceBytes, static_cast<int64_t>(bytes));
  return Result<DeviceBuffer>(std::move(buffer));
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda") << "device buffer cleanup: " << s;
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda") << "device buffer cleanup: " << s;
}

Status DeviceBuffer::Close() {
  if (data_ == nullptr) return Status::Ok();
  void* data = std::exchange(data_, nullptr);
  const uint64_t size = std::exchange(size_, 0);
  // Out of the ledger even if the free fails: the buffer no longer holds it either way.
  LedgerAdd(LedgerItem::kDeviceBytes, -static_cast<int64_t>(size));
  WS_CUDA_RETURN_IF_ERROR(cudaFree(data), "cudaFree of ", size, " bytes at ", data);
  return Status::Ok();
}

void* DeviceBuffer::Release() {
  LedgerAdd(LedgerItem::kDeviceBytes, -static_cast<int64_t>(std::exchange(size_, 0)));
  return std::exchange(data_, nullptr);
}

Status FreeDevice(void* device_ptr) {
  if (device_ptr == nullptr) return Status::Ok();
  WS_CUDA_RETURN_IF_ERROR(cudaFree(device_ptr), "cudaFree at ", device_ptr);
  return Status::Ok();
}

Result<Stream> Stream::Create() {
  WS_RETURN_IF_ERROR(CudaAvailable());
  Stream stream;
  cudaStream_t s = nullptr;
  WS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                          "creating a stream");
  stream.handle_ = s;
  return Result<Stream>(std::move(stream));
}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda") << "stream cleanup: " << s;
    handle_ = std::exchange(o.handle_, nullptr);
  }
  return *this;
}

Stream::~Stream() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda") << "stream cleanup: " << s;
}

Status Stream::Synchronize() {
  WS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_)),
                          "synchronizing stream ", handle_);
  return Status::Ok();
}

Status Stream::Close() {
  if (handle_ == nullptr) return Status::Ok();
  auto s = static_cast<cudaStream_t>(std::exchange(handle_, nullptr));
  WS_CUDA_RETURN_IF_ERROR(cudaStreamDestroy(s), "destroying stream ", static_cast<void*>(s));
  return Status::Ok();
}

Status CopyToDevice(void* device_dst, const void* host_src, uint64_t bytes) {
  if (bytes == 0) return Status::Ok();
  WS_CUDA_RETURN_IF_ERROR(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice),
                          "copying ", bytes, " bytes host -> device");
  return Status::Ok();
}

Status CopyToHost(void* host_dst, const void* device_src, uint64_t bytes) {
  if (bytes == 0) return Status::Ok();
  WS_CUDA_RETURN_IF_ERROR(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost),
                          "copying ", bytes, " bytes device -> host");
  return Status::Ok();
}

Status MemsetDevice(void* device_dst, uint8_t value, uint64_t bytes) {
  if (bytes == 0) return Status::Ok();
  WS_CUDA_RETURN_IF_ERROR(cudaMemset(device_dst, value, bytes), "setting ", bytes, " device bytes");
  return Status::Ok();
}

Status DeviceSynchronize() {
  WS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "synchronizing the device");
  return Status::Ok();
}

}  // namespace weightsync::cuda
