#include "cuda/gpu_digest_reference.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace weightsync::cuda {

static_assert(std::endian::native == std::endian::little,
              "the digest reads words little-endian, as the GPU does; add a byte swap here");

uint64_t GpuDigestChunkHash(const uint8_t* chunk, uint64_t length) {
  uint64_t sum = 0;
  const uint64_t full = length / 8;
  for (uint64_t i = 0; i < full; ++i) {
    uint64_t w;
    std::memcpy(&w, chunk + 8 * i, 8);  // little-endian host (static_assert above)
    sum += GpuDigestMix64(w ^ (i * kGpuDigestWordKey));
  }
  if (length % 8 != 0) {
    uint64_t w = 0;  // zero padding past the end
    std::memcpy(&w, chunk + 8 * full, length % 8);
    sum += GpuDigestMix64(w ^ (full * kGpuDigestWordKey));
  }
  return GpuDigestMix64(sum + length);
}

uint64_t GpuDigestCombine(const uint64_t* chunk_hashes, uint64_t bytes) {
  uint64_t sum = 0;
  const uint64_t chunks = GpuDigestChunkCount(bytes);
  for (uint64_t c = 0; c < chunks; ++c) {
    sum += GpuDigestMix64(chunk_hashes[c] ^ (c * kGpuDigestChunkKey));
  }
  return GpuDigestMix64(sum + GpuDigestMix64(bytes ^ kGpuDigestSeed));
}

uint64_t GpuDigest(const void* data, uint64_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t sum = 0;
  const uint64_t chunks = GpuDigestChunkCount(bytes);
  for (uint64_t c = 0; c < chunks; ++c) {
    const uint64_t at = c * kGpuDigestChunkBytes;
    const uint64_t h = GpuDigestChunkHash(p + at, std::min(kGpuDigestChunkBytes, bytes - at));
    sum += GpuDigestMix64(h ^ (c * kGpuDigestChunkKey));
  }
  return GpuDigestMix64(sum + GpuDigestMix64(bytes ^ kGpuDigestSeed));
}

}  // namespace weightsync::cuda
