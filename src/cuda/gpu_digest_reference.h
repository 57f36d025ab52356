// The GPU digest of a byte range, defined here and computed here on the CPU, so that a CPU peer
// can check what a GPU computed (kernels.cu computes the same value on a device).
//
// Definition (all arithmetic modulo 2^64; Mix64 is the SplitMix64 finalizer, a bijection):
//   Mix64(z):  z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB;
//              z ^= z >> 31
//   The range of n bytes is cut into chunks of 65536 bytes; chunk c holds bytes
//   [65536 c, min(65536 (c + 1), n)), length L_c; there are ceil(n / 65536) chunks.
//   Chunk c is read as little-endian 8-byte words w_0 .. w_{ceil(L_c/8)-1}, the last one padded
//   with zero bytes:
//     chunk_hash(c) = Mix64( (sum_i Mix64(w_i ^ (i * kGpuDigestWordKey))) + L_c )
//   and the range's digest is
//     digest = Mix64( (sum_c Mix64(chunk_hash(c) ^ (c * kGpuDigestChunkKey)))
//                     + Mix64(n ^ kGpuDigestSeed) )
// Sums commute, so a GPU computes them in any order and still gets exactly this value; the keys
// bind each word and chunk to its position. Every step from one word to the digest is a bijection
// of that word's term, so flipping any single bit always changes the digest (and its chunk hash).
// It detects accidents (torn copies, wrong offsets, stale buffers), not adversaries.
#pragma once

#include <cstddef>
#include <cstdint>

namespace weightsync::cuda {

inline constexpr uint64_t kGpuDigestChunkBytes = 65536;
inline constexpr uint64_t kGpuDigestWordKey = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio
inline constexpr uint64_t kGpuDigestChunkKey = 0xD6E8FEB86659FD93ull;
inline constexpr uint64_t kGpuDigestSeed = 0x5753475055444731ull;  // "WSGPUDG1"

constexpr uint64_t GpuDigestMix64(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z;
}

constexpr uint64_t GpuDigestChunkCount(uint64_t bytes) {
  return (bytes + kGpuDigestChunkBytes - 1) / kGpuDigestChunkBytes;
}

// chunk_hash of one chunk of `length` (1 .. 65536) bytes.
uint64_t GpuDigestChunkHash(const uint8_t* chunk, uint64_t length);

// The digest from the chunk hashes of a range of `bytes` bytes (GpuDigestChunkCount(bytes) of
// them, in order).
uint64_t GpuDigestCombine(const uint64_t* chunk_hashes, uint64_t bytes);

// The digest of `bytes` bytes at `data`.
uint64_t GpuDigest(const void* data, uint64_t bytes);

// The same digest of a range fed in pieces, in order, cut anywhere (a ring's buckets cut a
// segment where they end): Finish() == GpuDigest of the concatenation. The sums commute, so a
// piece only adds its words' and chunks' terms; a word cut between pieces waits here.
class GpuDigestStream {
 public:
  void Reset() { *this = GpuDigestStream(); }
  void Update(const void* data, uint64_t bytes);
  uint64_t Finish() const;

 private:
  void CloseChunkIfFull();  // once the current chunk's 65536 bytes are in

  uint64_t bytes_ = 0;       // fed so far
  uint64_t chunks_sum_ = 0;  // the terms of the chunks closed so far
  uint64_t words_sum_ = 0;   // the terms of the current chunk's whole words so far
  uint64_t pending_ = 0;     // the bytes of a word not yet whole (little-endian, low bytes first)
};

}  // namespace weightsync::cuda
