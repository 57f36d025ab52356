// The GPU digest's definition and CPU implementation (src/cuda/gpu_digest_reference.h): it is what
// the header says, it changes on every single bit flip, and it handles chunk boundaries, lengths
// and alignment.
#include "cuda/gpu_digest_reference.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

namespace weightsync::cuda {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// The definition spelled out again, byte by byte, straight from the header's comment.
uint64_t SpelledOut(const uint8_t* p, uint64_t n) {
  uint64_t outer = 0;
  for (uint64_t c = 0; c * 65536 < n; ++c) {
    const uint64_t len = std::min<uint64_t>(65536, n - c * 65536);
    uint64_t inner = 0;
    for (uint64_t i = 0; i * 8 < len; ++i) {
      uint64_t w = 0;
      for (uint64_t b = 0; b < 8; ++b) {
        const uint64_t at = i * 8 + b;
        if (at < len) w |= uint64_t(p[c * 65536 + at]) << (8 * b);
      }
      inner += GpuDigestMix64(w ^ (i * 0x9E3779B97F4A7C15ull));
    }
    const uint64_t chunk_hash = GpuDigestMix64(inner + len);
    outer += GpuDigestMix64(chunk_hash ^ (c * 0xD6E8FEB86659FD93ull));
  }
  return GpuDigestMix64(outer + GpuDigestMix64(n ^ 0x5753475055444731ull));
}

TEST(GpuDigestReferenceTest, MatchesTheDefinition) {
  const std::vector<uint8_t> data = RandomBytes(3 * 65536 + 4099, 1);
  for (uint64_t n : {0ull, 1ull, 7ull, 8ull, 9ull, 15ull, 16ull, 17ull, 65535ull, 65536ull,
                     65537ull, 2 * 65536ull, 3 * 65536ull + 4099}) {
    EXPECT_EQ(GpuDigest(data.data(), n), SpelledOut(data.data(), n)) << n;
  }
  EXPECT_EQ(GpuDigest(nullptr, 0), GpuDigestMix64(GpuDigestMix64(kGpuDigestSeed)));
  // SplitMix64's finalizer, known value (from the published reference implementation:
  // splitmix64 seeded with 0 returns 0xE220A8397B1DCDAF = Mix64(0x9E3779B97F4A7C15)).
  EXPECT_EQ(GpuDigestMix64(0x9E3779B97F4A7C15ull), 0xE220A8397B1DCDAFull);
}

TEST(GpuDigestReferenceTest, ChunkHashesCombineToTheDigest) {
  const std::vector<uint8_t> data = RandomBytes(5 * 65536 + 3, 2);
  const uint64_t n = data.size();
  std::vector<uint64_t> hashes(GpuDigestChunkCount(n));
  ASSERT_EQ(hashes.size(), 6u);
  for (uint64_t c = 0; c < hashes.size(); ++c) {
    hashes[c] =
        GpuDigestChunkHash(data.data() + c * 65536, std::min<uint64_t>(65536, n - c * 65536));
  }
  EXPECT_EQ(GpuDigestCombine(hashes.data(), n), GpuDigest(data.data(), n));
  EXPECT_EQ(GpuDigestChunkCount(0), 0u);
  EXPECT_EQ(GpuDigestChunkCount(1), 1u);
  EXPECT_EQ(GpuDigestChunkCount(65536), 1u);
  EXPECT_EQ(GpuDigestChunkCount(65537), 2u);
}

TEST(GpuDigestReferenceTest, EverySingleBitFlipChangesTheDigestAndOnlyItsChunkHash) {
  std::vector<uint8_t> data = RandomBytes(2 * 65536 + 13, 3);
  const uint64_t n = data.size();
  const uint64_t base = GpuDigest(data.data(), n);
  std::vector<uint64_t> base_chunks;
  for (uint64_t c = 0; c < GpuDigestChunkCount(n); ++c) {
    base_chunks.push_back(
        GpuDigestChunkHash(data.data() + c * 65536, std::min<uint64_t>(65536, n - c * 65536)));
  }
  // Every bit of: the first 64 bytes, the bytes around each chunk boundary, the tail, and 2000
  // random positions.
  std::set<uint64_t> positions;
  for (uint64_t i = 0; i < 64; ++i) positions.insert(i);
  for (uint64_t b : {65536ull, 2 * 65536ull}) {
    for (uint64_t i = b - 9; i < std::min(n, b + 9); ++i) positions.insert(i);
  }
  for (uint64_t i = n - 13; i < n; ++i) positions.insert(i);
  std::mt19937 rng(4);
  for (int i = 0; i < 2000; ++i) positions.insert(rng() % n);
  for (uint64_t at : positions) {
    for (int bit = 0; bit < 8; ++bit) {
      data[at] ^= uint8_t(1u << bit);
      ASSERT_NE(GpuDigest(data.data(), n), base) << "byte " << at << " bit " << bit;
      const uint64_t c = at / 65536;
      const uint64_t len = std::min<uint64_t>(65536, n - c * 65536);
      ASSERT_NE(GpuDigestChunkHash(data.data() + c * 65536, len), base_chunks[c]);
      if (c + 1 < base_chunks.size()) {
        const uint64_t next_len = std::min<uint64_t>(65536, n - (c + 1) * 65536);
        ASSERT_EQ(GpuDigestChunkHash(data.data() + (c + 1) * 65536, next_len), base_chunks[c + 1]);
      }
      data[at] ^= uint8_t(1u << bit);
    }
  }
  EXPECT_EQ(GpuDigest(data.data(), n), base);
}

TEST(GpuDigestReferenceTest, LengthsAndBoundariesMatter) {
  // Trailing zero bytes are not padding: lengths enter every chunk hash and the digest.
  std::vector<uint8_t> zeros(3 * 65536 + 1, 0);
  std::set<uint64_t> seen;
  for (uint64_t n : {0ull, 1ull, 7ull, 8ull, 9ull, 65535ull, 65536ull, 65537ull, 2 * 65536ull,
                     3 * 65536ull, 3 * 65536ull + 1}) {
    EXPECT_TRUE(seen.insert(GpuDigest(zeros.data(), n)).second) << n;
  }
  const uint8_t abc[4] = {'a', 'b', 'c', 0};
  EXPECT_NE(GpuDigest(abc, 3), GpuDigest(abc, 4));
  EXPECT_NE(GpuDigestChunkHash(abc, 3), GpuDigestChunkHash(abc, 4));

  // Swapping two chunks (or two words) changes the digest: positions are keyed.
  std::vector<uint8_t> data = RandomBytes(2 * 65536, 5);
  const uint64_t before = GpuDigest(data.data(), data.size());
  std::vector<uint8_t> swapped(data.begin() + 65536, data.end());
  swapped.insert(swapped.end(), data.begin(), data.begin() + 65536);
  EXPECT_NE(GpuDigest(swapped.data(), swapped.size()), before);
  std::vector<uint8_t> words = data;
  std::swap_ranges(words.begin(), words.begin() + 8, words.begin() + 8);
  EXPECT_NE(GpuDigest(words.data(), words.size()), before);
}

TEST(GpuDigestReferenceTest, AlignmentDoesNotMatter) {
  const std::vector<uint8_t> data = RandomBytes(65536 + 100, 6);
  std::vector<uint8_t> shifted(data.size() + 16);
  for (size_t off = 0; off < 16; ++off) {
    std::copy(data.begin(), data.end(), shifted.begin() + off);
    EXPECT_EQ(GpuDigest(shifted.data() + off, data.size()), GpuDigest(data.data(), data.size()))
        << off;
  }
}

// A range fed in pieces (a ring's buckets cut segments anywhere): the same digest as in one call,
// for cuts inside words, at word and chunk edges, and empty pieces.
TEST(GpuDigestReferenceTest, StreamInPiecesIsTheOneCallDigest) {
  const std::vector<uint8_t> data = RandomBytes(3 * 65536 + 1003, 7);
  std::mt19937 rng(8);
  for (uint64_t n : {uint64_t{0}, uint64_t{5}, uint64_t{8}, uint64_t{65536}, uint64_t{65541},
                     uint64_t{data.size()}}) {
    const uint64_t whole = GpuDigest(data.data(), n);
    for (int trial = 0; trial < 20; ++trial) {
      GpuDigestStream stream;
      if (trial % 2 == 1) {  // Reset clears what was fed before
        stream.Update(data.data(), 77);
        stream.Reset();
      }
      uint64_t at = 0;
      while (at < n) {
        const uint64_t piece = std::min<uint64_t>(n - at, rng() % (trial < 10 ? 20 : 70000));
        stream.Update(data.data() + at, piece);
        at += piece;
      }
      EXPECT_EQ(stream.Finish(), whole) << n << " bytes, trial " << trial;
    }
  }
  // Cut exactly at every word edge of the first and last words of a chunk.
  for (uint64_t cut : {uint64_t{8}, uint64_t{65528}, uint64_t{65536}, uint64_t{65544}}) {
    GpuDigestStream stream;
    stream.Update(data.data(), cut);
    stream.Update(data.data() + cut, data.size() - cut);
    EXPECT_EQ(stream.Finish(), GpuDigest(data.data(), data.size())) << cut;
  }
  // A flipped bit in a later piece changes the streamed digest.
  std::vector<uint8_t> flipped = data;
  flipped[65540] ^= 1;
  GpuDigestStream a, b;
  a.Update(data.data(), 65537);
  b.Update(flipped.data(), 65537);
  a.Update(data.data() + 65537, 10);
  b.Update(flipped.data() + 65537, 10);
  EXPECT_NE(a.Finish(), b.Finish());
}

}  // namespace
}  // namespace weightsync::cuda
