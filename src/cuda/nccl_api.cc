#include "cuda/nccl_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "util/knobs.h"

namespace weightsync::cuda::nccl {
namespace {

constexpr const char* kEntryNames[] = {
#define WS_NCCL_ENTRY_NAME(index, symbol) #symbol,
    WS_NCCL_ENTRY_POINTS(WS_NCCL_ENTRY_NAME)
#undef WS_NCCL_ENTRY_NAME
};
static_assert(sizeof(kEntryNames) / sizeof(kEntryNames[0]) == NcclLibrary::kEntryCount);

std::string LoaderError() {
  const char* e = ::dlerror();
  return e != nullptr ? e : "unknown dynamic loader error";
}

}  // namespace

std::string NcclVersionString(int code) {
  // NCCL_VERSION(X, Y, Z): X·1000 + Y·100 + Z up to 2.8, X·10000 + Y·100 + Z from 2.9 on.
  int major = code >= 10000 ? code / 10000 : code / 1000;
  int minor = code >= 10000 ? (code % 10000) / 100 : (code % 1000) / 100;
  int patch = code % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

std::string NcclLibraryName() {
  return util::KnobValue(util::Knob::kNcclLibrary)
      .value_or(std::string(util::Describe(util::Knob::kNcclLibrary).default_value));
}

Result<std::unique_ptr<NcclLibrary>> OpenNcclLibrary(const std::string& library) {
  // RTLD_LOCAL: NCCL's symbols stay out of the global namespace (a framework in the same process
  // may load its own copy); RTLD_NOW: a broken library fails here, not at a later call.
  ::dlerror();
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return Status::Unavailable("NCCL library '", library, "' could not be loaded (", LoaderError(),
                               "); install NCCL ", NcclVersionString(kMinNcclVersionCode),
                               " or newer, or point WEIGHTSYNC_NCCL_LIBRARY at libnccl.so.2");
  }
  auto lib = std::make_unique<NcclLibrary>();
  lib->handle = handle;
  for (int i = 0; i < NcclLibrary::kEntryCount; ++i) {
    ::dlerror();
    lib->entry[i] = ::dlsym(handle, kEntryNames[i]);
    if (lib->entry[i] == nullptr) {
      std::string why = LoaderError();
      ::dlclose(handle);
      return Status::Unavailable("NCCL library '", library, "' lacks the symbol ", kEntryNames[i],
                                 " (", why, "): not an NCCL library, or one older than ",
                                 NcclVersionString(kMinNcclVersionCode));
    }
  }
  Dl_info info{};
  lib->path =
      ::dladdr(lib->entry[NcclLibrary::kGetVersion], &info) != 0 && info.dli_fname != nullptr
          ? info.dli_fname
          : library;
  // ncclResult_t is a C enum, int-sized and returned like an int on every ABI we build for.
  using GetVersionFn = int (*)(int*);
  int code = 0;
  int r = reinterpret_cast<GetVersionFn>(lib->entry[NcclLibrary::kGetVersion])(&code);
  if (r != 0 || code <= 0) {
    ::dlclose(handle);
    return Status::Unavailable("NCCL library '", lib->path, "': ncclGetVersion failed (ncclResult ",
                               r, ")");
  }
  if (code < kMinNcclVersionCode) {
    ::dlclose(handle);
    return Status::Unavailable("NCCL library '", lib->path, "' is version ",
                               NcclVersionString(code), "; the nccl transport needs ",
                               NcclVersionString(kMinNcclVersionCode), " or newer");
  }
  lib->version_code = code;
  return lib;
}

Result<const NcclLibrary*> Nccl() {
  // Loaded once and kept for the life of the process (never dlclose'd: communicators, NCCL's
  // proxy threads and its atexit handlers may outlive any one user).
  static std::once_flag once;
  static const NcclLibrary* library = nullptr;
  static Status* failure = nullptr;
  std::call_once(once, [] {
    auto lib = OpenNcclLibrary(NcclLibraryName());
    if (lib.ok()) {
      library = std::move(lib).value().release();
    } else {
      failure = new Status(lib.status());
    }
  });
  if (library != nullptr) return library;
  return *failure;
}

}  // namespace weightsync::cuda::nccl
