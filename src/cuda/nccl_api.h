// NCCL, loaded at run time. weightsync never links libnccl: every binary must start on a machine
// without NCCL, a driver or a GPU. The library is opened with dlopen the first time the nccl
// transport is asked for, and its entry points are resolved by name into a table.
//
// Host code with no NCCL or CUDA headers (it builds in every configuration): the table holds
// untyped addresses; nccl_link.cu, the only user, gives them their types from <nccl.h>.
//
// Library: $WEIGHTSYNC_NCCL_LIBRARY (a path or a soname) if set, else "libnccl.so.2" through the
// dynamic loader's search path (LD_LIBRARY_PATH, ld.so.cache).
#pragma once

#include <memory>
#include <string>

#include "weightsync/status.h"

namespace weightsync::cuda::nccl {

// Every NCCL entry point weightsync calls (X-macro: table index, dlsym name).
#define WS_NCCL_ENTRY_POINTS(X)                 \
  X(GetVersion, ncclGetVersion)                 \
  X(GetErrorString, ncclGetErrorString)         \
  X(GetLastError, ncclGetLastError)             \
  X(GetUniqueId, ncclGetUniqueId)               \
  X(CommInitRankConfig, ncclCommInitRankConfig) \
  X(CommGetAsyncError, ncclCommGetAsyncError)   \
  X(CommAbort, ncclCommAbort)                   \
  X(GroupStart, ncclGroupStart)                 \
  X(GroupEnd, ncclGroupEnd)                     \
  X(Broadcast, ncclBroadcast)

// Oldest NCCL the transport accepts: non-blocking communicators with ncclConfig_t,
// ncclCommGetAsyncError, ncclRemoteError and grouped broadcasts all behave as we rely on from 2.18.
inline constexpr int kMinNcclVersionCode = 21800;  // NCCL_VERSION(2, 18, 0)

struct NcclLibrary {
  enum Entry : int {
#define WS_NCCL_ENTRY_ENUM(index, symbol) k##index,
    WS_NCCL_ENTRY_POINTS(WS_NCCL_ENTRY_ENUM)
#undef WS_NCCL_ENTRY_ENUM
        kEntryCount
  };
  void* handle = nullptr;         // from dlopen; never closed once loaded (see Nccl())
  void* entry[kEntryCount] = {};  // resolved addresses, by Entry
  std::string path;               // the file the loader actually opened
  int version_code = 0;           // ncclGetVersion, e.g. 22809 for 2.28.9
};

// Opens `library` and resolves every entry point, then asks its version. Unavailable names the
// library and the loader's reason, or the first missing symbol, or a version older than
// kMinNcclVersionCode. On failure nothing stays loaded.
Result<std::unique_ptr<NcclLibrary>> OpenNcclLibrary(const std::string& library);

// The process-wide library, opened once from $WEIGHTSYNC_NCCL_LIBRARY or "libnccl.so.2"; the
// outcome (library or error) is cached for the life of the process. The library is never
// unloaded: communicators and NCCL's own threads may outlive any one user.
Result<const NcclLibrary*> Nccl();

// The library name Nccl() opens.
std::string NcclLibraryName();

// "2.28.9" for 22809 (NCCL_VERSION_CODE encoding, major·10000 + minor·100 + patch).
std::string NcclVersionString(int version_code);

}  // namespace weightsync::cuda::nccl
