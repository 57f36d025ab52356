// CUDA side of ipc.h (AllocationOf lives in vmm.cu, beside the driver entry points).
#include <cuda_runtime.h>

// The explicit moves in `return std::move(x)` are needed by nvcc's front end, redundant to g++'s.
#pragma GCC diagnostic ignored "-Wredundant-move"

#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/ipc.h"
#include "cuda/vmm.h"
#include "util/ledger.h"
#include "util/logging.h"

namespace weightsync::cuda {
namespace {

using util::LedgerAdd;
using util::LedgerItem;

// Every (handle, device) this process has open: the mapping and how many IpcMappings share it.
struct Opened {
  uint8_t* data = nullptr;
  int references = 0;
};
using OpenKey = std::pair<IpcHandle, int>;
// Both outlive static destructors: a mapping may be closed by a subscriber torn down at exit.
std::mutex& OpenedMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::map<OpenKey, Opened>& OpenedHandles() {
  static auto* opened = new std::map<OpenKey, Opened>();
  return *opened;
}

}  // namespace

Result<IpcHandle> ExportIpcHandle(const void* base) {
  cudaIpcMemHandle_t h{};
  WS_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&h, const_cast<void*>(base)),
                          "cudaIpcGetMemHandle (memory from cuMem, e.g. PyTorch's expandable "
                          "segments, has no CUDA IPC handle)");
  IpcHandle out;
  static_assert(sizeof(h) == kIpcHandleBytes);
  std::memcpy(out.data(), &h, sizeof(h));
  return out;
}

Result<IpcMapping> IpcMapping::Open(const IpcHandle& handle, int device) {
  std::lock_guard<std::mutex> lock(OpenedMutex());
  const OpenKey key{handle, device};
  Opened& opened = OpenedHandles()[key];
  if (opened.references == 0) {
    ScopedDevice restore;
    const Status current = SetDevice(device);
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof(h));
    void* p = nullptr;
    const cudaError_t e =
        current.ok() ? cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess) : cudaSuccess;
    if (!current.ok() || e != cudaSuccess) {
      OpenedHandles().erase(key);
      if (!current.ok()) return current;
      return CudaErrorStatus(e, "cudaIpcOpenMemHandle on cuda:", device);
    }
    opened.data = static_cast<uint8_t*>(p);
  }
  ++opened.references;
  LedgerAdd(LedgerItem::kMappings, 1);
  IpcMapping m;
  m.data_ = opened.data;
  m.handle_ = handle;
  m.device_ = device;
  return std::move(m);
}

IpcMapping& IpcMapping::operator=(IpcMapping&& o) noexcept {
  if (this != &o) {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda-ipc") << "IPC mapping: " << s;
    data_ = o.data_;
    handle_ = o.handle_;
    device_ = o.device_;
    o.data_ = nullptr;
  }
  return *this;
}

IpcMapping::~IpcMapping() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda-ipc") << "IPC mapping: " << s;
}

Status IpcMapping::Close() {
  if (data_ == nullptr) return Status::Ok();
  data_ = nullptr;
  LedgerAdd(LedgerItem::kMappings, -1);
  std::lock_guard<std::mutex> lock(OpenedMutex());
  auto it = OpenedHandles().find({handle_, device_});
  if (it == OpenedHandles().end()) {
    LedgerAdd(LedgerItem::kReleaseFailures, 1);
    return Status::Internal("IPC mapping on cuda:", device_, " closed more often than opened");
  }
  if (--it->second.references > 0) return Status::Ok();
  void* p = it->second.data;
  OpenedHandles().erase(it);
  // Closed from the context that opened it.
  ScopedDevice restore;
  const Status current = SetDevice(device_);
  const cudaError_t e = current.ok() ? cudaIpcCloseMemHandle(p) : cudaSuccess;
  if (current.ok() && e == cudaSuccess) return Status::Ok();
  LedgerAdd(LedgerItem::kReleaseFailures, 1);
  if (!current.ok()) return current;
  return CudaErrorStatus(e, "cudaIpcCloseMemHandle on cuda:", device_);
}

}  // namespace weightsync::cuda
