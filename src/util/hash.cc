#include "util/hash.h"

#include <cstring>

// XXH3_state_t on the stack (no allocation per segment).
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

namespace weightsync::util {
namespace {
// Small enough that a copied chunk is still in L2 when it is hashed, large enough that the
// streaming hash's per-call cost vanishes.
constexpr size_t kChunkBytes = 64 << 10;
}  // namespace

uint64_t Hash64(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

uint64_t CopyAndHash64(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  if (bytes <= kChunkBytes) {
    std::memcpy(d, s, bytes);
    return XXH3_64bits(d, bytes);
  }
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  for (size_t done = 0; done < bytes; done += kChunkBytes) {
    const size_t n = bytes - done < kChunkBytes ? bytes - done : kChunkBytes;
    std::memcpy(d + done, s + done, n);
    XXH3_64bits_update(&state, d + done, n);
  }
  return XXH3_64bits_digest(&state);
}

static_assert(sizeof(XXH3_state_t) <= sizeof(Hash64Stream) && alignof(XXH3_state_t) <= 64,
              "Hash64Stream's buffer must hold an XXH3_state_t");

Hash64Stream::Hash64Stream() {
  XXH3_INITSTATE(reinterpret_cast<XXH3_state_t*>(state_));
  Reset();
}

void Hash64Stream::Reset() { XXH3_64bits_reset(reinterpret_cast<XXH3_state_t*>(state_)); }

void Hash64Stream::Update(const void* data, size_t bytes) {
  XXH3_64bits_update(reinterpret_cast<XXH3_state_t*>(state_), data, bytes);
}

uint64_t Hash64Stream::Finish() const {
  return XXH3_64bits_digest(reinterpret_cast<const XXH3_state_t*>(state_));
}

}  // namespace weightsync::util
