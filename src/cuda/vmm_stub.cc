// CPU-only build: the GPU memory sharing API answers Unavailable.
#include "cuda/vmm.h"

#if !WS_WITH_CUDA

namespace weightsync::cuda {
namespace {
Status NoCuda() { return Status::Unavailable("built without CUDA: no GPU arena"); }
}  // namespace

Result<ExportedAllocation> ExportedAllocation::Create(int, uint64_t) { return NoCuda(); }
ExportedAllocation& ExportedAllocation::operator=(ExportedAllocation&&) noexcept { return *this; }
ExportedAllocation::~ExportedAllocation() = default;
Result<util::UniqueFd> ExportedAllocation::ExportFd() const { return NoCuda(); }
Status ExportedAllocation::Close() { return Status::Ok(); }

Result<HostRegistration> HostRegistration::Register(const void*, uint64_t, bool) {
  return NoCuda();
}
HostRegistration& HostRegistration::operator=(HostRegistration&&) noexcept { return *this; }
HostRegistration::~HostRegistration() = default;
Status HostRegistration::Close() { return Status::Ok(); }
Result<ImportedAllocation> ImportedAllocation::Import(int, uint64_t, int) { return NoCuda(); }
Result<ChunkedAllocation> ChunkedAllocation::Create(int, uint64_t, bool, uint64_t) {
  return NoCuda();
}
ChunkedAllocation& ChunkedAllocation::operator=(ChunkedAllocation&&) noexcept { return *this; }
ChunkedAllocation::~ChunkedAllocation() = default;
Status ChunkedAllocation::Close() { return Status::Ok(); }
ImportedAllocation& ImportedAllocation::operator=(ImportedAllocation&&) noexcept { return *this; }
ImportedAllocation::~ImportedAllocation() = default;
Status ImportedAllocation::Close() { return Status::Ok(); }
Status ImportedAllocation::GrantAccess(int) { return NoCuda(); }

Result<CopyQueue> CopyQueue::Create(int) { return NoCuda(); }
CopyQueue& CopyQueue::operator=(CopyQueue&&) noexcept { return *this; }
CopyQueue::~CopyQueue() = default;
Status CopyQueue::Enqueue(void*, const void*, uint64_t) { return NoCuda(); }
Status CopyQueue::EnqueueBatch(void* const*, const void* const*, const size_t*, size_t) {
  return NoCuda();
}
Status CopyQueue::EnqueueBatch(const CopyBatch&, PreparedCopyGroup*) { return NoCuda(); }
Status CopyQueue::Wait(const util::Deadline&) { return NoCuda(); }
Status CopyQueue::SignalTo(void*) { return NoCuda(); }
Status CopyQueue::WaitFor(void*) { return NoCuda(); }
Status CopyQueue::Drain() { return Status::Ok(); }
Status CopyQueue::Close() { return Status::Ok(); }
Status SetDevice(int) { return NoCuda(); }
Result<int> CurrentDevice() { return NoCuda(); }
Status MemInfo(size_t*, size_t*) { return NoCuda(); }
Status EnablePeerAccess(int, int) { return NoCuda(); }
Result<bool> DeviceCanWrite(int, const void*, uint64_t) { return NoCuda(); }
ScopedDevice::ScopedDevice() = default;
ScopedDevice::~ScopedDevice() = default;

}  // namespace weightsync::cuda

#endif  // !WS_WITH_CUDA
