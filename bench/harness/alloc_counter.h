// Heap allocation counting for the CLI process. alloc_counter.cc replaces malloc, calloc, realloc,
// free and the aligned variants with wrappers that count and then call glibc's own allocator
// (__libc_malloc and friends). libstdc++'s operator new calls malloc, so `new` is counted too.
//
// Two counts: one for the whole process (every thread) and one per thread (thread_local), so a
// benchmark can attribute allocations to the calls it measures while other threads run.
#pragma once

#include <cstdint>

namespace weightsync::bench {

struct AllocCounts {
  uint64_t allocations = 0;  // successful malloc/calloc/realloc/aligned calls (new included)
  uint64_t bytes = 0;        // bytes requested by them
  AllocCounts operator-(const AllocCounts& o) const {
    return {allocations - o.allocations, bytes - o.bytes};
  }
};

// Every thread of this process.
AllocCounts ProcessAllocations();
// The calling thread only.
AllocCounts ThreadAllocations();

// True if the hooks are live: performs a heap allocation and checks that it was counted. A
// figure measured with inactive hooks would read 0 and prove nothing.
bool AllocCounterActive();

}  // namespace weightsync::bench
