// How much virtual address space this process uses (/proc/self/statm, total size × page size):
// what RLIMIT_AS counts. The arena sizes its reservation from it under a limit; tests set limits
// relative to it (sanitizers map terabytes of shadow before main). 0 if unreadable.
#pragma once

#include <cstdint>

namespace weightsync::util {

uint64_t AddressSpaceInUse();

}  // namespace weightsync::util
