// The chunk change mask (delta/change_mask.h): the vector and the word kernels agree with an
// element-by-element comparison at every element size, chunk length and density, so the kernel
// a CPU without SSE2 runs is tested here too.
#include "delta/change_mask.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace weightsync::delta {
namespace {

ChunkMask Reference(const uint8_t* base, const uint8_t* next, uint32_t elements, uint32_t e) {
  ChunkMask mask{};
  for (uint32_t i = 0; i < elements; ++i) {
    if (std::memcmp(base + i * e, next + i * e, e) != 0) mask[i / 64] |= uint64_t{1} << (i % 64);
  }
  return mask;
}

TEST(ChangeMask, BothKernelsMarkExactlyTheElementsThatDiffer) {
  std::mt19937_64 rng(5);
  for (const uint32_t e : {1u, 2u, 4u, 8u, 16u, 3u}) {
    for (const uint32_t elements : {256u, 255u, 64u, 63u, 1u, 0u, 130u}) {
      for (const double density : {0.0, 0.01, 0.3, 1.0}) {
        std::vector<uint8_t> base(kChunkElements * e);
        for (auto& b : base) b = static_cast<uint8_t>(rng());
        std::vector<uint8_t> next = base;
        std::bernoulli_distribution pick(density);
        for (uint32_t i = 0; i < kChunkElements; ++i) {
          // One byte anywhere in the element, so each lane position of a word is exercised.
          if (pick(rng)) next[i * e + rng() % e] ^= static_cast<uint8_t>(1 + rng() % 255);
        }
        const ChunkMask expected = Reference(base.data(), next.data(), elements, e);
        for (const MaskKernel kernel : {MaskKernel::kVector, MaskKernel::kWords}) {
          ChunkMask mask;
          mask.fill(~uint64_t{0});  // stale bits must be cleared
          ChangeMask(base.data(), next.data(), elements, e, mask, kernel);
          EXPECT_EQ(mask, expected)
              << "element bytes " << e << ", " << elements << " elements, density " << density
              << ", kernel " << static_cast<int>(kernel);
        }
      }
    }
  }
}

TEST(ChangeMask, EveryLaneOfAWordIsSeenOnItsOwn) {
  // One changed bit at each bit position of the first 8 bytes: the word kernel's lane fold must
  // map each to its own element.
  for (const uint32_t e : {1u, 2u, 4u, 8u}) {
    for (uint32_t bit = 0; bit < 64; ++bit) {
      std::vector<uint8_t> base(kChunkElements * e, 0);
      std::vector<uint8_t> next = base;
      next[bit / 8] = static_cast<uint8_t>(1u << (bit % 8));
      for (const MaskKernel kernel : {MaskKernel::kVector, MaskKernel::kWords}) {
        ChunkMask mask;
        ChangeMask(base.data(), next.data(), kChunkElements, e, mask, kernel);
        EXPECT_EQ(mask[0], uint64_t{1} << (bit / (8 * e))) << e << " bytes, bit " << bit;
        EXPECT_EQ(mask[1] | mask[2] | mask[3], 0u);
      }
    }
  }
}

}  // namespace
}  // namespace weightsync::delta
