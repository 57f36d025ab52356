// CPU-only build: CUDA IPC answers Unavailable.
#include "cuda/ipc.h"

#if !WS_WITH_CUDA

namespace weightsync::cuda {
namespace {
Status NoCuda() { return Status::Unavailable("built without CUDA: no CUDA IPC"); }
}  // namespace

Result<AllocationRange> AllocationOf(const void*) { return NoCuda(); }
Result<IpcHandle> ExportIpcHandle(const void*) { return NoCuda(); }
Result<std::optional<VmmChunk>> VmmChunkAt(const void*) { return NoCuda(); }
Result<RetainedChunk> RetainedChunk::Retain(const VmmChunk&) { return NoCuda(); }
RetainedChunk& RetainedChunk::operator=(RetainedChunk&&) noexcept { return *this; }
RetainedChunk::~RetainedChunk() = default;
Result<util::UniqueFd> RetainedChunk::ExportFd() const { return NoCuda(); }
Status RetainedChunk::Close() { return Status::Ok(); }
Result<ImportedChunks> ImportedChunks::Import(std::span<const int>, std::span<const uint64_t>,
                                              int) {
  return NoCuda();
}
ImportedChunks& ImportedChunks::operator=(ImportedChunks&&) noexcept { return *this; }
ImportedChunks::~ImportedChunks() = default;
Status ImportedChunks::Close() { return Status::Ok(); }
Result<IpcMapping> IpcMapping::Open(const IpcHandle&, int) { return NoCuda(); }
IpcMapping& IpcMapping::operator=(IpcMapping&&) noexcept { return *this; }
IpcMapping::~IpcMapping() = default;
Status IpcMapping::Close() { return Status::Ok(); }

}  // namespace weightsync::cuda

#endif  // !WS_WITH_CUDA
