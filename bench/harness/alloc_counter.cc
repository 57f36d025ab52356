// Replaces the C allocation functions for this executable (glibc supports this: "Replacing
// malloc" in its manual). Each wrapper counts, then calls glibc's allocator, so memory from
// either path may be freed by the other. Nothing here may allocate.
//
// Under ASan or TSan the sanitizer owns malloc: replacing it would bypass (TSan) or crash (ASan,
// before its runtime is initialized). There the sanitizer's own allocation hook counts instead.
#include "harness/alloc_counter.h"

#include <cstddef>

// GCC defines __SANITIZE_*__; clang (the ASan build's compiler, scripts/ci_sanitizers.sh) has
// __has_feature instead.
#if defined(__has_feature)
#define WS_ALLOC_COUNTER_HAS_FEATURE(x) __has_feature(x)
#else
#define WS_ALLOC_COUNTER_HAS_FEATURE(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || \
    WS_ALLOC_COUNTER_HAS_FEATURE(address_sanitizer) ||               \
    WS_ALLOC_COUNTER_HAS_FEATURE(thread_sanitizer)
#define WS_ALLOC_COUNTER_SANITIZER_HOOKS 1
// From the sanitizer runtimes' common interface (GCC ships no header for it).
extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void*,
                                                                             std::size_t),
                                                         void (*free_hook)(const volatile void*));
#else
#define WS_ALLOC_COUNTER_SANITIZER_HOOKS 0
#endif

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <memory>

extern "C" {
void* __libc_malloc(size_t size);
void* __libc_calloc(size_t count, size_t size);
void* __libc_realloc(void* ptr, size_t size);
void* __libc_memalign(size_t alignment, size_t size);
void* __libc_valloc(size_t size);
void* __libc_pvalloc(size_t size);
void __libc_free(void* ptr);
}

namespace weightsync::bench {
namespace {

// Relaxed: counters are read after the measured calls returned (a join or a lock in between
// orders them); no other memory is published through them.
std::atomic<uint64_t> g_allocations{0};
std::atomic<uint64_t> g_bytes{0};
// Trivial thread_locals in the executable use static TLS: reading them never allocates.
thread_local uint64_t t_allocations = 0;
thread_local uint64_t t_bytes = 0;

inline void* Count(void* p, size_t bytes) {
  if (p != nullptr) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
    g_bytes.fetch_add(bytes, std::memory_order_relaxed);
    ++t_allocations;
    t_bytes += bytes;
  }
  return p;
}

}  // namespace

AllocCounts ProcessAllocations() {
  return {g_allocations.load(std::memory_order_relaxed), g_bytes.load(std::memory_order_relaxed)};
}

AllocCounts ThreadAllocations() { return {t_allocations, t_bytes}; }

#if WS_ALLOC_COUNTER_SANITIZER_HOOKS
namespace {
void OnMalloc(const volatile void* p, size_t size) { Count(const_cast<void*>(p), size); }
void OnFree(const volatile void*) {}
// Installed before main(): the CLI's measurements happen later.
[[maybe_unused]] const int g_hooks_installed =
    __sanitizer_install_malloc_and_free_hooks(&OnMalloc, &OnFree);
}  // namespace
#endif

bool AllocCounterActive() {
  AllocCounts before = ThreadAllocations();
  // A volatile pointer keeps the compiler from eliding the new/delete pair.
  auto* volatile probe = new int(42);
  delete probe;
  return ThreadAllocations().allocations > before.allocations;
}

}  // namespace weightsync::bench

#if !WS_ALLOC_COUNTER_SANITIZER_HOOKS
using weightsync::bench::Count;

extern "C" {

void* malloc(size_t size) { return Count(__libc_malloc(size), size); }
void* calloc(size_t count, size_t size) { return Count(__libc_calloc(count, size), count * size); }
void* realloc(void* ptr, size_t size) { return Count(__libc_realloc(ptr, size), size); }
void free(void* ptr) { __libc_free(ptr); }
void* memalign(size_t alignment, size_t size) {
  return Count(__libc_memalign(alignment, size), size);
}
void* aligned_alloc(size_t alignment, size_t size) {
  return Count(__libc_memalign(alignment, size), size);
}
int posix_memalign(void** out, size_t alignment, size_t size) {
  if (alignment % sizeof(void*) != 0 || (alignment & (alignment - 1)) != 0) return EINVAL;
  void* p = Count(__libc_memalign(alignment, size), size);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
void* valloc(size_t size) { return Count(__libc_valloc(size), size); }
void* pvalloc(size_t size) { return Count(__libc_pvalloc(size), size); }

}  // extern "C"
#endif  // !WS_ALLOC_COUNTER_SANITIZER_HOOKS
