#include "util/hash.h"

#include <xxhash.h>

namespace weightsync::util {

uint64_t Hash64(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

}  // namespace weightsync::util
