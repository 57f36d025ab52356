#include "util/address_space.h"

#include <unistd.h>

#include <cstdio>

namespace weightsync::util {

uint64_t AddressSpaceInUse() {
  unsigned long long pages = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%llu", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  return pages * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace weightsync::util
