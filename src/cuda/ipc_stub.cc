// CPU-only build: CUDA IPC answers Unavailable.
#include "cuda/ipc.h"

#if !WS_WITH_CUDA

namespace weightsync::cuda {
namespace {
Status NoCuda() { return Status::Unavailable("built without CUDA: no CUDA IPC"); }
}  // namespace

Result<AllocationRange> AllocationOf(const void*) { return NoCuda(); }
Result<IpcHandle> ExportIpcHandle(const void*) { return NoCuda(); }
Result<IpcMapping> IpcMapping::Open(const IpcHandle&, int) { return NoCuda(); }
IpcMapping& IpcMapping::operator=(IpcMapping&&) noexcept { return *this; }
IpcMapping::~IpcMapping() = default;
Status IpcMapping::Close() { return Status::Ok(); }

}  // namespace weightsync::cuda

#endif  // !WS_WITH_CUDA
