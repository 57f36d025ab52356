// CUDA side of vmm.h. Driver entry points come through the static runtime
// (cudaGetDriverEntryPointByVersion), so nothing links libcuda and binaries still start where no
// driver is installed.
#include <cuda.h>
#include <cuda_runtime.h>

// The explicit moves in `return std::move(x)` are needed by nvcc's front end, redundant to g++'s.
#pragma GCC diagnostic ignored "-Wredundant-move"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

#include "cuda/ipc.h"
#include "cuda/kernels.h"
#include "cuda/vmm.h"
#include "util/fail_point.h"
#include "util/ledger.h"
#include "util/logging.h"
#include "util/poll_backoff.h"

namespace weightsync::cuda {
namespace {

using util::LedgerAdd;
using util::LedgerItem;

struct Driver {
  decltype(&cuMemCreate) MemCreate = nullptr;
  decltype(&cuMemRelease) MemRelease = nullptr;
  decltype(&cuMemAddressReserve) MemAddressReserve = nullptr;
  decltype(&cuMemAddressFree) MemAddressFree = nullptr;
  decltype(&cuMemMap) MemMap = nullptr;
  decltype(&cuMemUnmap) MemUnmap = nullptr;
  decltype(&cuMemSetAccess) MemSetAccess = nullptr;
  decltype(&cuMemExportToShareableHandle) MemExportToShareableHandle = nullptr;
  decltype(&cuMemImportFromShareableHandle) MemImportFromShareableHandle = nullptr;
  decltype(&cuMemGetAllocationGranularity) MemGetAllocationGranularity = nullptr;
  decltype(&cuGetErrorName) GetErrorName = nullptr;
  decltype(&cuMemGetAllocationPropertiesFromHandle) MemGetAllocationPropertiesFromHandle = nullptr;
  decltype(&cuMemGetAccess) MemGetAccess = nullptr;
  decltype(&cuPointerGetAttribute) PointerGetAttribute = nullptr;
  decltype(&cuDeviceGet) DeviceGet = nullptr;
  decltype(&cuDevicePrimaryCtxGetState) DevicePrimaryCtxGetState = nullptr;
  decltype(&cuMemRetainAllocationHandle) MemRetainAllocationHandle = nullptr;
  decltype(&cuMemGetAddressRange) MemGetAddressRange = nullptr;
  Status status;
};

template <typename F>
Status Load(const char* name, F* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q);
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || p == nullptr) {
    return Status::Unavailable("CUDA driver entry point ", name, " not found (",
                               cudaGetErrorString(e), ")");
  }
  *fn = reinterpret_cast<F>(p);
  return Status::Ok();
}

const Driver& GetDriver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    Status s;
    s.Update(Load("cuMemCreate", &d.MemCreate));
    s.Update(Load("cuMemRelease", &d.MemRelease));
    s.Update(Load("cuMemAddressReserve", &d.MemAddressReserve));
    s.Update(Load("cuMemAddressFree", &d.MemAddressFree));
    s.Update(Load("cuMemMap", &d.MemMap));
    s.Update(Load("cuMemUnmap", &d.MemUnmap));
    s.Update(Load("cuMemSetAccess", &d.MemSetAccess));
    s.Update(Load("cuMemExportToShareableHandle", &d.MemExportToShareableHandle));
    s.Update(Load("cuMemImportFromShareableHandle", &d.MemImportFromShareableHandle));
    s.Update(Load("cuMemGetAllocationGranularity", &d.MemGetAllocationGranularity));
    s.Update(Load("cuGetErrorName", &d.GetErrorName));
    s.Update(
        Load("cuMemGetAllocationPropertiesFromHandle", &d.MemGetAllocationPropertiesFromHandle));
    s.Update(Load("cuMemGetAccess", &d.MemGetAccess));
    s.Update(Load("cuPointerGetAttribute", &d.PointerGetAttribute));
    s.Update(Load("cuDeviceGet", &d.DeviceGet));
    s.Update(Load("cuDevicePrimaryCtxGetState", &d.DevicePrimaryCtxGetState));
    s.Update(Load("cuMemRetainAllocationHandle", &d.MemRetainAllocationHandle));
    s.Update(Load("cuMemGetAddressRange", &d.MemGetAddressRange));
    d.status = s;
  });
  return d;
}

Status DriverError(CUresult r, const char* what) {
  const char* name = "unknown";
  if (GetDriver().GetErrorName) GetDriver().GetErrorName(r, &name);
  StatusCode code =
      r == CUDA_ERROR_OUT_OF_MEMORY ? StatusCode::kResourceExhausted : StatusCode::kIoError;
  return Status(code, std::string(what) + ": " + name + " (CUresult " + std::to_string(r) + ")");
}

Status RuntimeError(cudaError_t e, const char* what) {
  // Returned, so taken off the runtime's last-error slot: a caller that recovers (e.g. falls back
  // from the publisher's GPU) must not leave it for the application's next error check.
  (void)cudaGetLastError();
  StatusCode code = e == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted
                    : (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
                        ? StatusCode::kUnavailable
                        : StatusCode::kIoError;
  return Status(code,
                std::string(what) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

#define WS_CU(call, what)                                       \
  do {                                                          \
    CUresult ws_r_ = (call);                                    \
    if (ws_r_ != CUDA_SUCCESS) return DriverError(ws_r_, what); \
  } while (0)
#define WS_CUDART(call, what)                                   \
  do {                                                          \
    cudaError_t ws_e_ = (call);                                 \
    if (ws_e_ != cudaSuccess) return RuntimeError(ws_e_, what); \
  } while (0)

CUmemAllocationProp PropFor(int device) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

// Unmaps and frees whatever of (va, size, handle) is set; reports the first failure.
Status Unmap(uint64_t va, uint64_t size, uint64_t handle) {
  const Driver& d = GetDriver();
  Status result;
  if (va != 0 && handle != 0) {
    CUresult r = d.MemUnmap(va, size);
    if (r != CUDA_SUCCESS) result.Update(DriverError(r, "cuMemUnmap"));
  }
  if (va != 0) {
    CUresult r = d.MemAddressFree(va, size);
    if (r != CUDA_SUCCESS) result.Update(DriverError(r, "cuMemAddressFree"));
  }
  if (handle != 0) {
    CUresult r = d.MemRelease(handle);
    if (r != CUDA_SUCCESS) result.Update(DriverError(r, "cuMemRelease"));
  }
  if (!result.ok()) LedgerAdd(LedgerItem::kReleaseFailures, 1);
  return result;
}

// Reserves address space, maps `handle` there and grants `device` read-write access.
Status MapFor(uint64_t handle, uint64_t size, int device, uint64_t* va_out) {
  const Driver& d = GetDriver();
  CUdeviceptr va = 0;
  WS_CU(d.MemAddressReserve(&va, size, 0, 0, 0), "cuMemAddressReserve");
  CUresult r = d.MemMap(va, size, 0, handle, 0);
  if (r != CUDA_SUCCESS) {
    d.MemAddressFree(va, size);
    return DriverError(r, "cuMemMap");
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = d.MemSetAccess(va, size, &access, 1);
  if (r != CUDA_SUCCESS) {
    d.MemUnmap(va, size);
    d.MemAddressFree(va, size);
    return DriverError(r, "cuMemSetAccess");
  }
  *va_out = va;
  return Status::Ok();
}

}  // namespace

Status SetDevice(int device) {
  WS_CUDART(cudaSetDevice(device), "cudaSetDevice");
  return Status::Ok();
}

Result<HostRegistration> HostRegistration::Register(const void* data, uint64_t bytes,
                                                    bool read_only) {
  HostRegistration r;
  if (bytes == 0) return std::move(r);
  unsigned int flags = cudaHostRegisterPortable;  // usable from every device of the process
  if (read_only) {
    int device = 0, supported = 0;
    WS_CUDART(cudaGetDevice(&device), "cudaGetDevice");
    WS_CUDART(cudaDeviceGetAttribute(&supported, cudaDevAttrHostRegisterReadOnlySupported, device),
              "cudaDeviceGetAttribute(HostRegisterReadOnlySupported)");
    if (supported == 0) {
      return Status::Unavailable("cuda:", device,
                                 " cannot pin read-only host memory "
                                 "(cudaDevAttrHostRegisterReadOnlySupported is 0)");
    }
    flags |= cudaHostRegisterReadOnly;
  }
  cudaError_t e = cudaHostRegister(const_cast<void*>(data), bytes, flags);
  if (e == cudaErrorHostMemoryAlreadyRegistered) {
    // Some of it is pinned by someone else (the application, another handle). Not ours to rely
    // on: they may unpin it while our copies run, and the rest of the range is not pinned.
    (void)cudaGetLastError();
    return Status::Unavailable("host memory at ", data, " (", bytes,
                               " bytes) is already registered with CUDA, at least in part, by "
                               "the application or another handle");
  }
  if (e != cudaSuccess) return RuntimeError(e, "cudaHostRegister");
  r.data_ = const_cast<void*>(data);
  r.size_ = bytes;
  LedgerAdd(LedgerItem::kPinnedBytes, static_cast<int64_t>(bytes));
  return std::move(r);
}

HostRegistration& HostRegistration::operator=(HostRegistration&& o) noexcept {
  if (this != &o) {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda-ipc") << "cleanup: " << s;
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

HostRegistration::~HostRegistration() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda-ipc") << "cleanup: " << s;
}

Status HostRegistration::Close() {
  if (data_ == nullptr) return Status::Ok();
  LedgerAdd(LedgerItem::kPinnedBytes, -static_cast<int64_t>(std::exchange(size_, 0)));
  WS_CUDART(cudaHostUnregister(std::exchange(data_, nullptr)), "cudaHostUnregister");
  return Status::Ok();
}

Result<int> CurrentDevice() {
  int device = -1;
  WS_CUDART(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

ScopedDevice::ScopedDevice() {
  if (cudaGetDevice(&saved_) != cudaSuccess) {
    (void)cudaGetLastError();
    saved_ = -1;
  }
}

ScopedDevice::~ScopedDevice() {
  if (saved_ < 0) return;
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now == saved_) return;
  // Making a device current creates its primary context (hundreds of MiB of its memory). A caller
  // whose device has none never used it (cudaGetDevice's default of 0, say): giving it "back" would
  // cost that memory for nothing, so the caller is left on the device the work ran on.
  const Driver& d = GetDriver();
  CUdevice dev = 0;
  unsigned int flags = 0;
  int active = 0;
  if (!d.status.ok() || d.DeviceGet(&dev, saved_) != CUDA_SUCCESS ||
      d.DevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS || active == 0) {
    (void)cudaGetLastError();
    return;
  }
  if (cudaSetDevice(saved_) != cudaSuccess) (void)cudaGetLastError();
}

Status EnablePeerAccess(int device, int peer) {
  ScopedDevice restore;
  WS_RETURN_IF_ERROR(SetDevice(device));
  // Already enabled (by us or the application) is success; CUDA reports it as an error, which
  // compute-sanitizer lists as an API error (the one it finds in the GPU tests).
  cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
    return Status::Ok();
  }
  if (e != cudaSuccess) return RuntimeError(e, "cudaDeviceEnablePeerAccess");
  return Status::Ok();
}

namespace {

// Whether a kernel on `device` may write the one byte at `p` (see DeviceCanWrite).
Result<bool> DeviceCanWriteByte(int device, CUdeviceptr p) {
  const Driver& d = GetDriver();
  int legacy = 0;
  WS_CU(d.PointerGetAttribute(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p),
        "cuPointerGetAttribute");
  if (legacy) {
    // cudaMalloc memory: reachable from a peer once peer access is enabled (or it is local).
    int owner = -1;
    WS_CU(d.PointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p),
          "cuPointerGetAttribute");
    if (owner == device) return true;
    int can = 0;
    WS_CUDART(cudaDeviceCanAccessPeer(&can, device, owner), "cudaDeviceCanAccessPeer");
    return can != 0;
  }
  // A cuMem (VMM) mapping, e.g. PyTorch's expandable segments: only the access its owner set,
  // which may differ from one mapped chunk to the next.
  CUmemLocation where{};
  where.type = CU_MEM_LOCATION_TYPE_DEVICE;
  where.id = device;
  unsigned long long flags = 0;
  if (d.MemGetAccess(&flags, &where, p) != CUDA_SUCCESS) return false;
  return flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

}  // namespace

Result<bool> DeviceCanWrite(int device, const void* ptr, uint64_t bytes) {
  WS_RETURN_IF_ERROR(GetDriver().status);
  if (bytes == 0) return true;
  const auto first = reinterpret_cast<CUdeviceptr>(ptr);
  WS_ASSIGN_OR_RETURN(bool head, DeviceCanWriteByte(device, first));
  if (!head || bytes == 1) return head;
  return DeviceCanWriteByte(device, first + bytes - 1);
}

// Declared in ipc.h; here for the driver entry points.
Result<AllocationRange> AllocationOf(const void* p) {
  const Driver& d = GetDriver();
  WS_RETURN_IF_ERROR(d.status);
  const auto at = reinterpret_cast<CUdeviceptr>(p);
  CUdeviceptr base = 0;
  size_t bytes = 0;
  WS_CU(d.PointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, at),
        "cuPointerGetAttribute(RANGE_START_ADDR)");
  WS_CU(d.PointerGetAttribute(&bytes, CU_POINTER_ATTRIBUTE_RANGE_SIZE, at),
        "cuPointerGetAttribute(RANGE_SIZE)");
  return AllocationRange{reinterpret_cast<const uint8_t*>(base), bytes};
}

Status MemInfo(size_t* free_bytes, size_t* total_bytes) {
  WS_CUDART(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
  return Status::Ok();
}

Result<ExportedAllocation> ExportedAllocation::Create(int device, uint64_t bytes) {
  WS_RETURN_IF_ERROR(SetDevice(device));
  const Driver& d = GetDriver();
  WS_RETURN_IF_ERROR(d.status);
  CUmemAllocationProp prop = PropFor(device);
  size_t granularity = 0;
  WS_CU(d.MemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        "cuMemGetAllocationGranularity");
  ExportedAllocation a;
  a.device_ = device;
  a.size_ = (std::max<uint64_t>(bytes, 1) + granularity - 1) / granularity * granularity;
  CUmemGenericAllocationHandle handle = 0;
  WS_CU(d.MemCreate(&handle, a.size_, &prop, 0), "cuMemCreate");
  a.handle_ = handle;
  Status s = MapFor(handle, a.size_, device, &a.va_);
  if (!s.ok()) {
    d.MemRelease(handle);
    a.handle_ = 0;
    return s;
  }
  LedgerAdd(LedgerItem::kSegments, 1);
  LedgerAdd(LedgerItem::kMappings, 1);
  LedgerAdd(LedgerItem::kMappedBytes, static_cast<int64_t>(a.size_));
  LedgerAdd(LedgerItem::kDeviceBytes, static_cast<int64_t>(a.size_));  // the memory is ours
  return std::move(a);  // nvcc's front end does not apply C++20's implicit move here
}

ExportedAllocation& ExportedAllocation::operator=(ExportedAllocation&& o) noexcept {
  if (this != &o) {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda-ipc") << "cleanup: " << s;
    va_ = std::exchange(o.va_, 0);
    size_ = std::exchange(o.size_, 0);
    handle_ = std::exchange(o.handle_, 0);
    device_ = std::exchange(o.device_, -1);
  }
  return *this;
}

ExportedAllocation::~ExportedAllocation() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda-ipc") << "cleanup: " << s;
}

Result<util::UniqueFd> ExportedAllocation::ExportFd() const {
  int fd = -1;
  WS_CU(GetDriver().MemExportToShareableHandle(&fd, handle_,
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        "cuMemExportToShareableHandle");
  return util::UniqueFd(fd);
}

Status ExportedAllocation::Close() {
  if (handle_ == 0 && va_ == 0) return Status::Ok();
  Status s = Unmap(std::exchange(va_, 0), size_, std::exchange(handle_, 0));
  LedgerAdd(LedgerItem::kSegments, -1);
  LedgerAdd(LedgerItem::kMappings, -1);
  LedgerAdd(LedgerItem::kMappedBytes, -static_cast<int64_t>(size_));
  LedgerAdd(LedgerItem::kDeviceBytes, -static_cast<int64_t>(std::exchange(size_, 0)));
  return s.WithContext("GPU arena on cuda:" + std::to_string(device_));
}

Result<ImportedAllocation> ImportedAllocation::Import(int fd, uint64_t bytes, int device) {
  WS_RETURN_IF_ERROR(SetDevice(device));
  const Driver& d = GetDriver();
  WS_RETURN_IF_ERROR(d.status);
  ImportedAllocation a;
  CUmemGenericAllocationHandle handle = 0;
  // The driver takes the fd number through a void*; it does not take ownership of it.
  WS_CU(d.MemImportFromShareableHandle(&handle, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        "cuMemImportFromShareableHandle");
  a.handle_ = handle;
  a.size_ = bytes;
  // Where the memory physically is, in this process's device numbering (unknown: -1).
  CUmemAllocationProp prop{};
  if (d.MemGetAllocationPropertiesFromHandle(&prop, handle) == CUDA_SUCCESS &&
      prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    a.owner_device_ = prop.location.id;
  }
  Status s = MapFor(handle, bytes, device, &a.va_);
  if (!s.ok()) {
    d.MemRelease(handle);
    a.handle_ = 0;
    return s.WithContext("mapping the publisher's GPU arena (" + std::to_string(bytes) +
                         " bytes) for cuda:" + std::to_string(device));
  }
  LedgerAdd(LedgerItem::kSegments, 1);
  LedgerAdd(LedgerItem::kMappings, 1);
  LedgerAdd(LedgerItem::kMappedBytes, static_cast<int64_t>(bytes));
  return std::move(a);
}

ImportedAllocation& ImportedAllocation::operator=(ImportedAllocation&& o) noexcept {
  if (this != &o) {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda-ipc") << "cleanup: " << s;
    va_ = std::exchange(o.va_, 0);
    size_ = std::exchange(o.size_, 0);
    handle_ = std::exchange(o.handle_, 0);
    owner_device_ = std::exchange(o.owner_device_, -1);
  }
  return *this;
}

Status ImportedAllocation::GrantAccess(int device) {
  const Driver& d = GetDriver();
  WS_RETURN_IF_ERROR(d.status);
  if (va_ == 0) return Status::FailedPrecondition("cuda-ipc: granting access to an unmapped arena");
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  // Read-write like the first device's: one mapping has one protection (only reads happen).
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  WS_CU(d.MemSetAccess(va_, size_, &access, 1), "cuMemSetAccess (a second device)");
  return Status::Ok();
}

ImportedAllocation::~ImportedAllocation() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda-ipc") << "cleanup: " << s;
}

Status ImportedAllocation::Close() {
  if (handle_ == 0 && va_ == 0) return Status::Ok();
  Status s = Unmap(std::exchange(va_, 0), size_, std::exchange(handle_, 0));
  if (util::FailPoints::Check("cuda_ipc.unmap").action == util::FailAction::kError) {
    s.Update(Status::IoError("cuMemUnmap: injected failure at fail point 'cuda_ipc.unmap'"));
  }
  LedgerAdd(LedgerItem::kSegments, -1);
  LedgerAdd(LedgerItem::kMappings, -1);
  LedgerAdd(LedgerItem::kMappedBytes, -static_cast<int64_t>(std::exchange(size_, 0)));
  return s.WithContext("publisher's GPU arena mapping");
}

Result<CopyQueue> CopyQueue::Create(int device) {
  WS_RETURN_IF_ERROR(SetDevice(device));
  CopyQueue q;
  q.device_ = device;
  cudaStream_t stream;
  WS_CUDART(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  q.stream_ = stream;
  cudaEvent_t event;
  WS_CUDART(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  q.event_ = event;
  WS_CUDART(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  q.after_event_ = event;
  return std::move(q);
}

CopyQueue& CopyQueue::operator=(CopyQueue&& o) noexcept {
  if (this != &o) {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda-ipc") << "cleanup: " << s;
    stream_ = std::exchange(o.stream_, nullptr);
    event_ = std::exchange(o.event_, nullptr);
    after_event_ = std::exchange(o.after_event_, nullptr);
    device_ = std::exchange(o.device_, -1);
    side_ = std::exchange(o.side_, {});
    joined_ = std::exchange(o.joined_, {});
    fork_ = std::exchange(o.fork_, nullptr);
    side_count_ = std::exchange(o.side_count_, 0);
  }
  return *this;
}

CopyQueue::~CopyQueue() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda-ipc") << "cleanup: " << s;
}

Status CopyQueue::Enqueue(void* dst, const void* src, uint64_t bytes) {
  if (bytes == 0) return Status::Ok();
  WS_CUDART(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream_)),
            "cudaMemcpyAsync");
  return Status::Ok();
}

namespace {

// `count` copies on `stream` in one cudaMemcpyBatchAsync; one by one where that is unsupported.
Status BatchOn(cudaStream_t stream, void* const* dsts, const void* const* srcs, const size_t* sizes,
               size_t count) {
  if (count == 0) return Status::Ok();
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t attr_index = 0;
  cudaError_t e = cudaMemcpyBatchAsync(dsts, srcs, sizes, count, &attr, &attr_index, 1, stream);
  if (e == cudaErrorNotSupported || e == cudaErrorInvalidValue) {
    (void)cudaGetLastError();  // clear it; copy one by one instead
    for (size_t i = 0; i < count; ++i) {
      if (sizes[i] == 0) continue;
      WS_CUDART(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDefault, stream),
                "cudaMemcpyAsync");
    }
    return Status::Ok();
  }
  if (e != cudaSuccess) return RuntimeError(e, "cudaMemcpyBatchAsync");
  return Status::Ok();
}

}  // namespace

Status CopyQueue::EnqueueBatch(void* const* dsts, const void* const* srcs, const size_t* sizes,
                               size_t count) {
  return BatchOn(static_cast<cudaStream_t>(stream_), dsts, srcs, sizes, count);
}

Status CopyQueue::EnsureLanes() {
  if (side_count_ == side_.size()) return Status::Ok();
  WS_RETURN_IF_ERROR(SetDevice(device_));
  if (fork_ == nullptr) {
    cudaEvent_t event;
    WS_CUDART(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
              "cudaEventCreate (forking the copy lanes)");
    fork_ = event;
  }
  // One lane at a time, so that a failure keeps (and Close destroys) the lanes made before it.
  while (side_count_ < side_.size()) {
    cudaStream_t stream;
    WS_CUDART(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
              "cudaStreamCreate (a copy lane)");
    cudaEvent_t event;
    if (cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
        e != cudaSuccess) {
      if (cudaError_t d = cudaStreamDestroy(stream); d != cudaSuccess) {
        WS_LOG(WARN, "cuda-ipc") << "cleanup: "
                                 << RuntimeError(d, "cudaStreamDestroy (a copy lane)");
      }
      return RuntimeError(e, "cudaEventCreate (joining a copy lane)");
    }
    side_[side_count_] = stream;
    joined_[side_count_] = event;
    ++side_count_;
  }
  return Status::Ok();
}

Status CopyQueue::EnqueueOnLanes(const CopyBatch& batch, const LaneCuts& cuts,
                                 PreparedCopyGroup* small) {
  WS_RETURN_IF_ERROR(EnsureLanes());
  const auto main = static_cast<cudaStream_t>(stream_);
  const auto fork = static_cast<cudaEvent_t>(fork_);
  void* const* dsts = batch.dsts().data();
  const void* const* srcs = batch.srcs().data();
  const size_t* sizes = batch.sizes().data();
  WS_CUDART(cudaEventRecord(fork, main), "cudaEventRecord (forking the copy lanes)");
  if (small != nullptr) WS_RETURN_IF_ERROR(small->Launch());
  // Run 0 on the queue's stream before any join: enqueued after the joins it would wait for
  // every side lane to finish and run alone (measured: 0.92x a flat copy instead of 0.96x).
  WS_RETURN_IF_ERROR(BatchOn(main, dsts, srcs, sizes, cuts.begin[1]));
  for (size_t r = 1; r < cuts.count; ++r) {
    const auto lane = static_cast<cudaStream_t>(side_[r - 1]);
    const auto joined = static_cast<cudaEvent_t>(joined_[r - 1]);
    if (cudaError_t e = cudaStreamWaitEvent(lane, fork, 0); e != cudaSuccess) {
      return RuntimeError(e, "cudaStreamWaitEvent (a copy lane waiting for its fork)");
    }
    const size_t b = cuts.begin[r];
    Status sent = BatchOn(lane, dsts + b, srcs + b, sizes + b, cuts.begin[r + 1] - b);
    // Joined even when its copies did not all go out: those that did then order before what is
    // enqueued next, and a Drain of the queue's stream covers them.
    cudaError_t e = cudaEventRecord(joined, lane);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(main, joined, 0);
    if (e != cudaSuccess) sent.Update(RuntimeError(e, "joining a copy lane"));
    WS_RETURN_IF_ERROR(sent);
  }
  return Status::Ok();
}

Status CopyQueue::EnqueueBatch(const CopyBatch& batch, PreparedCopyGroup* small) {
  const std::vector<size_t>& sizes = batch.sizes();
  const LaneCuts cuts =
      CutIntoLanes(sizes, batch.bytes() >= kLaneMinBytes ? kCopyLanes : size_t{1});
  if (cuts.count > 1) {
    WS_RETURN_IF_ERROR(EnqueueOnLanes(batch, cuts, small));
  } else {
    WS_RETURN_IF_ERROR(
        EnqueueBatch(batch.dsts().data(), batch.srcs().data(), sizes.data(), sizes.size()));
    if (small != nullptr) WS_RETURN_IF_ERROR(small->Launch());
  }
  for (const StridedCopy& g : batch.strided()) {
    WS_CUDART(cudaMemcpy2DAsync(g.dst, g.dst_pitch, g.src, g.src_pitch, g.width, g.height,
                                cudaMemcpyDefault, static_cast<cudaStream_t>(stream_)),
              "cudaMemcpy2DAsync");
  }
  return Status::Ok();
}

Status CopyQueue::Wait(const util::Deadline& deadline) {
  WS_CUDART(cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(stream_)),
            "cudaEventRecord");
  // Polled, not blocked on, so that the deadline and a cancel bound it. A GPU ring update waits
  // once per bucket on each side (~0.1-1 ms on the GPU) and a same-GPU model copy takes a few
  // ms: PollBackoff spins for the first 2 ms (a core busy that long per wait, the trainer's too
  // for a GPU ring's fill), then sleeps slices of ~1/256 of the time waited, so a wait
  // overshoots its copies by tens of microseconds, not the ~100 us a plain 50 us sleep costs.
  util::PollBackoff backoff;
  while (true) {
    cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event_));
    if (e == cudaSuccess) return Status::Ok();
    if (e != cudaErrorNotReady) return RuntimeError(e, "waiting for GPU copies");
    if (deadline.expired()) {
      return Status::Timeout("GPU copies on cuda:", device_, " did not finish before the deadline");
    }
    if (deadline.cancelled()) {
      // The copies may still run; the handle is destroyed after this error, and its release
      // synchronizes the stream before anything it points at is freed.
      return Status::Cancelled("waiting for GPU copies on cuda:", device_, ": cancelled");
    }
    backoff.Pause();
  }
}

Status CopyQueue::Drain() {
  if (stream_ == nullptr) return Status::Ok();
  WS_RETURN_IF_ERROR(SetDevice(device_));
  WS_CUDART(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "cudaStreamSynchronize");
  // The lanes are joined into stream_ after every batch; synchronized too all the same, for a
  // batch whose join failed (its error was returned; its copies may still run).
  for (size_t i = 0; i < side_count_; ++i) {
    WS_CUDART(cudaStreamSynchronize(static_cast<cudaStream_t>(side_[i])),
              "cudaStreamSynchronize (a copy lane)");
  }
  return Status::Ok();
}

Status CopyQueue::SignalTo(void* waiting_stream) {
  WS_RETURN_IF_ERROR(SetDevice(device_));
  WS_CUDART(cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(stream_)),
            "cudaEventRecord");
  WS_CUDART(cudaStreamWaitEvent(static_cast<cudaStream_t>(waiting_stream),
                                static_cast<cudaEvent_t>(event_), 0),
            "cudaStreamWaitEvent (across devices)");
  return Status::Ok();
}

Status CopyQueue::WaitFor(void* stream) {
  WS_RETURN_IF_ERROR(SetDevice(device_));
  WS_CUDART(
      cudaEventRecord(static_cast<cudaEvent_t>(after_event_), static_cast<cudaStream_t>(stream)),
      "cudaEventRecord (the caller's stream)");
  WS_CUDART(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_),
                                static_cast<cudaEvent_t>(after_event_), 0),
            "cudaStreamWaitEvent");
  return Status::Ok();
}

Status CopyQueue::Close() {
  Status result;
  for (size_t i = std::exchange(side_count_, 0); i-- > 0;) {
    cudaError_t e = cudaStreamDestroy(static_cast<cudaStream_t>(std::exchange(side_[i], nullptr)));
    if (e != cudaSuccess) result.Update(RuntimeError(e, "cudaStreamDestroy (a copy lane)"));
    e = cudaEventDestroy(static_cast<cudaEvent_t>(std::exchange(joined_[i], nullptr)));
    if (e != cudaSuccess) result.Update(RuntimeError(e, "cudaEventDestroy (a copy lane)"));
  }
  if (fork_ != nullptr) {
    cudaError_t e = cudaEventDestroy(static_cast<cudaEvent_t>(std::exchange(fork_, nullptr)));
    if (e != cudaSuccess) result.Update(RuntimeError(e, "cudaEventDestroy (copy-lane fork)"));
  }
  if (after_event_ != nullptr) {
    cudaError_t e =
        cudaEventDestroy(static_cast<cudaEvent_t>(std::exchange(after_event_, nullptr)));
    if (e != cudaSuccess) result.Update(RuntimeError(e, "cudaEventDestroy"));
  }
  if (event_ != nullptr) {
    cudaError_t e = cudaEventDestroy(static_cast<cudaEvent_t>(std::exchange(event_, nullptr)));
    if (e != cudaSuccess) result.Update(RuntimeError(e, "cudaEventDestroy"));
  }
  if (stream_ != nullptr) {
    cudaError_t e = cudaStreamDestroy(static_cast<cudaStream_t>(std::exchange(stream_, nullptr)));
    if (e != cudaSuccess) result.Update(RuntimeError(e, "cudaStreamDestroy"));
  }
  return result;
}

Result<std::optional<VmmChunk>> VmmChunkAt(const void* p) {
  const Driver& d = GetDriver();
  WS_RETURN_IF_ERROR(d.status);
  CUmemGenericAllocationHandle handle = 0;
  // Only cuMem memory has an allocation handle to retain. cudaMalloc memory answers invalid value
  // (measured); other kinds (pools, managed memory) may answer otherwise, and all of them are
  // "not cuMem" here: the caller then tries a CUDA IPC handle, whose error says what failed.
  if (d.MemRetainAllocationHandle(&handle, const_cast<void*>(p)) != CUDA_SUCCESS) {
    return std::optional<VmmChunk>();
  }
  WS_CU(d.MemRelease(handle), "cuMemRelease (a retained handle)");
  CUdeviceptr base = 0;
  size_t bytes = 0;
  // The mapping that holds `p` (cuPointerGetAttribute's range would be the whole reservation).
  WS_CU(d.MemGetAddressRange(&base, &bytes, reinterpret_cast<CUdeviceptr>(p)),
        "cuMemGetAddressRange");
  return std::optional<VmmChunk>(VmmChunk{reinterpret_cast<const uint8_t*>(base), bytes});
}

Result<RetainedChunk> RetainedChunk::Retain(const VmmChunk& chunk) {
  const Driver& d = GetDriver();
  WS_RETURN_IF_ERROR(d.status);
  CUmemGenericAllocationHandle handle = 0;
  WS_CU(d.MemRetainAllocationHandle(&handle, const_cast<uint8_t*>(chunk.base)),
        "cuMemRetainAllocationHandle");
  RetainedChunk r;
  r.handle_ = handle;
  LedgerAdd(LedgerItem::kRetainedAllocations, 1);
  return std::move(r);
}

RetainedChunk& RetainedChunk::operator=(RetainedChunk&& o) noexcept {
  if (this != &o) {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda-ipc") << "cleanup: " << s;
    handle_ = std::exchange(o.handle_, 0);
  }
  return *this;
}

RetainedChunk::~RetainedChunk() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda-ipc") << "cleanup: " << s;
}

Result<util::UniqueFd> RetainedChunk::ExportFd() const {
  int fd = -1;
  WS_CU(GetDriver().MemExportToShareableHandle(&fd, handle_,
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        "cuMemExportToShareableHandle");
  util::UniqueFd owned(fd);
  // Not inherited by a program the trainer runs while a subscriber connects.
  if (::fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) return Status::FromErrno(errno, "fcntl(FD_CLOEXEC)");
  return std::move(owned);  // nvcc's front end needs the explicit move
}

Status RetainedChunk::Close() {
  if (handle_ == 0) return Status::Ok();
  // Not held past here either way: a failed release cannot be retried with a forgotten handle.
  LedgerAdd(LedgerItem::kRetainedAllocations, -1);
  const CUresult r = GetDriver().MemRelease(std::exchange(handle_, 0));
  if (r == CUDA_SUCCESS) return Status::Ok();
  LedgerAdd(LedgerItem::kReleaseFailures, 1);
  return DriverError(r, "cuMemRelease (a retained chunk)");
}

Result<ImportedChunks> ImportedChunks::Import(std::span<const int> fds,
                                              std::span<const uint64_t> chunk_bytes, int device) {
  WS_RETURN_IF_ERROR(SetDevice(device));
  const Driver& d = GetDriver();
  WS_RETURN_IF_ERROR(d.status);
  if (fds.size() != chunk_bytes.size() || fds.empty()) {
    return Status::InvalidArgument("cuda-ipc: ", fds.size(), " fds for ", chunk_bytes.size(),
                                   " chunks");
  }
  ImportedChunks m;  // whatever is set when a step fails is released by its destructor
  uint64_t total = 0;
  for (uint64_t bytes : chunk_bytes) total += bytes;  // ValidateLayout bounded the sum
  CUdeviceptr va = 0;
  WS_CU(d.MemAddressReserve(&va, total, 0, 0, 0), "cuMemAddressReserve");
  m.va_ = va;
  m.size_ = total;
  m.handles_.reserve(fds.size());
  m.sizes_.reserve(fds.size());
  uint64_t at = 0;
  for (size_t i = 0; i < fds.size(); ++i) {
    CUmemGenericAllocationHandle handle = 0;
    // The driver takes the fd number through a void*; it does not take ownership of it.
    WS_CU(d.MemImportFromShareableHandle(&handle,
                                         reinterpret_cast<void*>(static_cast<intptr_t>(fds[i])),
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
          "cuMemImportFromShareableHandle (a chunk of the publisher's cuMem memory)");
    // A chunk smaller than the publisher said fails here, not as a fault in a later copy.
    const CUresult r = d.MemMap(va + at, chunk_bytes[i], 0, handle, 0);
    if (r != CUDA_SUCCESS) {
      d.MemRelease(handle);
      return DriverError(r, "cuMemMap (a chunk of the publisher's cuMem memory)");
    }
    m.handles_.push_back(handle);
    m.sizes_.push_back(chunk_bytes[i]);
    at += chunk_bytes[i];
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  WS_CU(d.MemSetAccess(va, total, &access, 1), "cuMemSetAccess");
  LedgerAdd(LedgerItem::kSegments, 1);
  LedgerAdd(LedgerItem::kMappings, 1);
  LedgerAdd(LedgerItem::kMappedBytes, static_cast<int64_t>(total));
  m.counted_ = true;
  return std::move(m);
}

ImportedChunks& ImportedChunks::operator=(ImportedChunks&& o) noexcept {
  if (this != &o) {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda-ipc") << "cleanup: " << s;
    va_ = std::exchange(o.va_, 0);
    size_ = std::exchange(o.size_, 0);
    handles_ = std::move(o.handles_);
    sizes_ = std::move(o.sizes_);
    counted_ = std::exchange(o.counted_, false);
    o.handles_.clear();
    o.sizes_.clear();
  }
  return *this;
}

ImportedChunks::~ImportedChunks() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda-ipc") << "cleanup: " << s;
}

Status ImportedChunks::Close() {
  if (va_ == 0) return Status::Ok();
  const Driver& d = GetDriver();
  Status result;
  uint64_t at = 0;
  for (size_t i = 0; i < handles_.size(); ++i) {
    CUresult r = d.MemUnmap(va_ + at, sizes_[i]);
    if (r != CUDA_SUCCESS) result.Update(DriverError(r, "cuMemUnmap (a chunk)"));
    r = d.MemRelease(handles_[i]);
    if (r != CUDA_SUCCESS) result.Update(DriverError(r, "cuMemRelease (a chunk)"));
    at += sizes_[i];
  }
  const CUresult r = d.MemAddressFree(std::exchange(va_, 0), size_);
  if (r != CUDA_SUCCESS) result.Update(DriverError(r, "cuMemAddressFree"));
  if (!result.ok()) LedgerAdd(LedgerItem::kReleaseFailures, 1);
  if (std::exchange(counted_, false)) {
    LedgerAdd(LedgerItem::kSegments, -1);
    LedgerAdd(LedgerItem::kMappings, -1);
    LedgerAdd(LedgerItem::kMappedBytes, -static_cast<int64_t>(size_));
  }
  size_ = 0;
  handles_.clear();
  sizes_.clear();
  return result.WithContext("the publisher's cuMem memory mapped here");
}

Result<ChunkedAllocation> ChunkedAllocation::Create(int device, uint64_t bytes, bool exportable,
                                                    uint64_t chunk_bytes) {
  WS_RETURN_IF_ERROR(SetDevice(device));
  const Driver& d = GetDriver();
  WS_RETURN_IF_ERROR(d.status);
  CUmemAllocationProp prop = PropFor(device);
  if (!exportable) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  size_t granularity = 0;
  WS_CU(d.MemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity");
  if (chunk_bytes > granularity) {
    granularity = (chunk_bytes + granularity - 1) / granularity * granularity;
  }
  const uint64_t chunks = std::max<uint64_t>((bytes + granularity - 1) / granularity, 1);
  ChunkedAllocation a;  // released by its destructor if a step fails
  a.chunk_bytes_ = granularity;
  CUdeviceptr va = 0;
  WS_CU(d.MemAddressReserve(&va, chunks * granularity, 0, 0, 0), "cuMemAddressReserve");
  a.va_ = va;
  a.reserved_ = chunks * granularity;
  for (uint64_t i = 0; i < chunks; ++i) {
    CUmemGenericAllocationHandle handle = 0;
    WS_CU(d.MemCreate(&handle, granularity, &prop, 0), "cuMemCreate");
    const CUresult r = d.MemMap(va + i * granularity, granularity, 0, handle, 0);
    if (r != CUDA_SUCCESS) {
      d.MemRelease(handle);
      return DriverError(r, "cuMemMap");
    }
    a.handles_.push_back(handle);
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  WS_CU(d.MemSetAccess(va, chunks * granularity, &access, 1), "cuMemSetAccess");
  return std::move(a);
}

ChunkedAllocation& ChunkedAllocation::operator=(ChunkedAllocation&& o) noexcept {
  if (this != &o) {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda") << "cleanup: " << s;
    va_ = std::exchange(o.va_, 0);
    chunk_bytes_ = std::exchange(o.chunk_bytes_, 0);
    reserved_ = std::exchange(o.reserved_, 0);
    handles_ = std::move(o.handles_);
    o.handles_.clear();
  }
  return *this;
}

ChunkedAllocation::~ChunkedAllocation() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda") << "cleanup: " << s;
}

Status ChunkedAllocation::Close() {
  if (va_ == 0) return Status::Ok();
  const Driver& d = GetDriver();
  Status result;
  for (size_t i = 0; i < handles_.size(); ++i) {
    CUresult r = d.MemUnmap(va_ + i * chunk_bytes_, chunk_bytes_);
    if (r != CUDA_SUCCESS) result.Update(DriverError(r, "cuMemUnmap"));
    r = d.MemRelease(handles_[i]);
    if (r != CUDA_SUCCESS) result.Update(DriverError(r, "cuMemRelease"));
  }
  // The whole reservation, mapped or not (a failed Create may have mapped only some chunks).
  const CUresult r = d.MemAddressFree(std::exchange(va_, 0), std::exchange(reserved_, 0));
  if (r != CUDA_SUCCESS) result.Update(DriverError(r, "cuMemAddressFree"));
  handles_.clear();
  return result;
}

}  // namespace weightsync::cuda
