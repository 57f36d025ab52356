#include "harness/pattern.h"

#include <cstring>

// Header-only use of xxHash (the library links libxxhash privately).
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace weightsync::bench {
namespace {

constexpr uint64_t kStride = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kChunkBytes = 64 * 1024;  // fits in L2 with room to spare

uint64_t Seed(uint32_t tensor, int64_t step) {
  // splitmix64 finalizer: neighbouring (tensor, step) pairs get unrelated seeds.
  uint64_t z = (uint64_t{tensor} << 32) ^ static_cast<uint64_t>(step) ^ 0x5EED5EED5EEDull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Writes words [first_word, first_word + bytes / 8) plus a partial tail word.
void FillFrom(uint64_t seed, uint64_t first_word, uint8_t* out, uint64_t bytes) {
  uint64_t x = seed + first_word * kStride;
  uint64_t words = bytes / 8;
  for (uint64_t j = 0; j < words; ++j) {
    std::memcpy(out + 8 * j, &x, 8);
    x += kStride;
  }
  if (uint64_t tail = bytes % 8; tail != 0) std::memcpy(out + 8 * words, &x, tail);
}

}  // namespace

void FillPattern(uint32_t tensor, int64_t step, uint8_t* out, uint64_t bytes) {
  FillFrom(Seed(tensor, step), 0, out, bytes);
}

uint64_t ExpectedDigest(uint32_t tensor, int64_t step, uint64_t bytes) {
  alignas(64) uint8_t chunk[kChunkBytes];  // stack: no heap, no shared state between threads
  XXH3_state_t state;                      // on the stack: XXH3_createState would allocate
  XXH3_64bits_reset(&state);
  const uint64_t seed = Seed(tensor, step);
  for (uint64_t off = 0; off < bytes; off += kChunkBytes) {
    uint64_t n = bytes - off < kChunkBytes ? bytes - off : kChunkBytes;
    FillFrom(seed, off / 8, chunk, n);  // kChunkBytes is a multiple of 8
    XXH3_64bits_update(&state, chunk, n);
  }
  return XXH3_64bits_digest(&state);
}

uint64_t Digest(const void* data, uint64_t bytes) { return XXH3_64bits(data, bytes); }

}  // namespace weightsync::bench
