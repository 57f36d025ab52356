// A build without CUDA (WS_WITH_CUDA=0): every call that would need the runtime answers
// Unavailable("built without CUDA"), so callers and tests build and run the same way in both
// builds. With CUDA this file compiles to nothing; device.cu, prepared_launch.cu and kernels.cu
// define these functions instead.
#if !WS_WITH_CUDA

#include "cuda/block_scaled_kernels.h"
#include "cuda/device.h"
#include "cuda/kernels.h"
#include "cuda/prepared_launch.h"

namespace weightsync::cuda {
namespace {
Status NoCuda() { return Status::Unavailable("built without CUDA"); }
}  // namespace

bool BuiltWithCuda() { return false; }
Status CudaAvailable() { return NoCuda(); }
int DeviceCount() { return 0; }

Result<DeviceBuffer> DeviceBuffer::Allocate(uint64_t) { return NoCuda(); }
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  data_ = std::exchange(o.data_, nullptr);
  size_ = std::exchange(o.size_, 0);
  return *this;
}
DeviceBuffer::~DeviceBuffer() = default;
Status DeviceBuffer::Close() { return Status::Ok(); }
// Allocate never succeeds here: nothing is in the ledger's device_bytes to take out.
void* DeviceBuffer::Release() {
  size_ = 0;
  return std::exchange(data_, nullptr);
}

Result<Stream> Stream::Create() { return NoCuda(); }
Stream& Stream::operator=(Stream&& o) noexcept {
  handle_ = std::exchange(o.handle_, nullptr);
  return *this;
}
Stream::~Stream() = default;
Status Stream::Synchronize() { return NoCuda(); }
Status Stream::Close() { return Status::Ok(); }

Status CopyToDevice(void*, const void*, uint64_t) { return NoCuda(); }
Status CopyToHost(void*, const void*, uint64_t) { return NoCuda(); }
Status MemsetDevice(void*, uint8_t, uint64_t) { return NoCuda(); }
Status DeviceSynchronize() { return NoCuda(); }
Status FreeDevice(void* device_ptr) { return device_ptr == nullptr ? Status::Ok() : NoCuda(); }

Status PreparedLaunch::Launch() { return NoCuda(); }

Result<PreparedLaunch> PrepareCast(DType, DType, const void*, void*, uint64_t, StreamHandle) {
  return NoCuda();
}
Result<PreparedLaunch> PrepareQuantizeFp8(const void*, void*, void*, int64_t, int64_t,
                                          Fp8ScaleFormat, StreamHandle) {
  return NoCuda();
}
Result<PreparedFp8Group> PrepareQuantizeFp8Group(std::span<const Fp8GroupTensor>, StreamHandle) {
  return NoCuda();
}
Status PreparedFp8Group::Launch() { return NoCuda(); }
Result<PreparedDigestGroup> PrepareDigestGroup(std::span<const DigestRange>, StreamHandle) {
  return NoCuda();
}
Status PreparedDigestGroup::Launch() { return NoCuda(); }
Result<PreparedCopyGroup> PrepareCopyGroup(std::span<const SingleCopy>, StreamHandle) {
  return NoCuda();
}
Result<PreparedCopyGroup> SplitOffSmallCopies(CopyBatch&, StreamHandle) { return NoCuda(); }
Status PreparedCopyGroup::Launch() { return NoCuda(); }
Result<PreparedDigest> PrepareDigest(const void*, uint64_t, uint64_t*, uint64_t, uint64_t*,
                                     StreamHandle) {
  return NoCuda();
}
Status PreparedDigest::Launch() { return NoCuda(); }
Status PreparedDigest::SetRange(const void*, uint64_t) { return NoCuda(); }
Result<PreparedLaunch> PrepareCopy(const void*, void*, uint64_t, StreamHandle) { return NoCuda(); }
Result<PreparedLaunch> PrepareArgProbe(uint64_t*, StreamHandle) { return NoCuda(); }
Result<PreparedBlockScaledGroup> PrepareQuantizeBlockScaledGroup(std::span<const BlockScaledTensor>,
                                                                 StreamHandle) {
  return NoCuda();
}
Status PreparedBlockScaledGroup::Launch() { return NoCuda(); }

}  // namespace weightsync::cuda

#endif  // !WS_WITH_CUDA
