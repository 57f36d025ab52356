// Digests: xxHash3 (libxxhash), fast enough to verify every byte of an update.
#pragma once

#include <cstddef>
#include <cstdint>

namespace weightsync::util {

uint64_t Hash64(const void* data, size_t bytes);

}  // namespace weightsync::util
