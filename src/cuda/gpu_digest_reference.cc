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

void GpuDigestStream::CloseChunkIfFull() {
  if (bytes_ % kGpuDigestChunkBytes != 0) return;
  const uint64_t chunk = bytes_ / kGpuDigestChunkBytes - 1;
  const uint64_t hash = GpuDigestMix64(words_sum_ + kGpuDigestChunkBytes);
  chunks_sum_ += GpuDigestMix64(hash ^ (chunk * kGpuDigestChunkKey));
  words_sum_ = 0;
}

void GpuDigestStream::Update(const void* data, uint64_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  // A word begun by the last piece first, byte by byte.
  while (bytes > 0 && bytes_ % 8 != 0) {
    pending_ |= uint64_t{*p++} << (8 * (bytes_ % 8));
    --bytes;
    if (++bytes_ % 8 == 0) {
      const uint64_t index = (bytes_ - 8) % kGpuDigestChunkBytes / 8;
      words_sum_ += GpuDigestMix64(pending_ ^ (index * kGpuDigestWordKey));
      pending_ = 0;
      CloseChunkIfFull();
    }
  }
  // Whole words, a chunk's worth at a time (the hot loop: as GpuDigestChunkHash's).
  while (bytes >= 8) {
    const uint64_t first = bytes_ % kGpuDigestChunkBytes / 8;
    const uint64_t words = std::min(bytes / 8, kGpuDigestChunkBytes / 8 - first);
    uint64_t sum = 0;
    for (uint64_t i = 0; i < words; ++i) {
      uint64_t w;
      std::memcpy(&w, p + 8 * i, 8);  // little-endian host (static_assert above)
      sum += GpuDigestMix64(w ^ ((first + i) * kGpuDigestWordKey));
    }
    words_sum_ += sum;
    bytes_ += 8 * words;
    p += 8 * words;
    bytes -= 8 * words;
    CloseChunkIfFull();
  }
  for (; bytes > 0; --bytes) pending_ |= uint64_t{*p++} << (8 * (bytes_++ % 8));
}

uint64_t GpuDigestStream::Finish() const {
  uint64_t words = words_sum_;
  uint64_t chunks = chunks_sum_;
  if (bytes_ % 8 != 0) {  // the last word, zero-padded
    const uint64_t index = bytes_ / 8 * 8 % kGpuDigestChunkBytes / 8;
    words += GpuDigestMix64(pending_ ^ (index * kGpuDigestWordKey));
  }
  if (const uint64_t length = bytes_ % kGpuDigestChunkBytes; length != 0) {  // the last chunk
    const uint64_t chunk = bytes_ / kGpuDigestChunkBytes;
    chunks += GpuDigestMix64(GpuDigestMix64(words + length) ^ (chunk * kGpuDigestChunkKey));
  }
  return GpuDigestMix64(chunks + GpuDigestMix64(bytes_ ^ kGpuDigestSeed));
}

}  // namespace weightsync::cuda
