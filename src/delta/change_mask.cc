#include "delta/change_mask.h"

#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace weightsync::delta {
namespace {

// Bit k of the result: lane k (of 8 / kBytes lanes of kBytes each) of `x` is not zero. Each lane
// is folded onto its lowest bit, then the lowest bits are gathered with one multiply whose
// partial products never collide, so no carry reaches the result bits.
template <uint32_t kBytes>
uint64_t NonZeroLanes(uint64_t x) {
  if constexpr (kBytes == 8) {
    return x != 0;
  } else {
    constexpr uint32_t kBits = 8 * kBytes;
    constexpr uint32_t kLanes = 8 / kBytes;
    for (uint32_t shift = kBits / 2; shift >= 1; shift /= 2) x |= x >> shift;
    uint64_t lowest = 0;
    uint64_t magic = 0;  // lane k's bit (k * kBits) lands on bit 64 - kLanes + k
    for (uint32_t k = 0; k < kLanes; ++k) {
      lowest |= uint64_t{1} << (k * kBits);
      magic |= uint64_t{1} << (64 - kLanes + k - k * kBits);
    }
    return ((x & lowest) * magic) >> (64 - kLanes);
  }
}

#if defined(__SSE2__)
// 16 elements of kBytes (1, 2 or 4) per step: compare, narrow the lane masks to bytes, take one
// bit per byte. SSE2 is part of x86-64 itself, so no dispatch is needed.
template <uint32_t kBytes>
uint32_t Differs16(const uint8_t* base, const uint8_t* next) {
  auto equal = [&](uint32_t block) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(base) + block);
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(next) + block);
    if constexpr (kBytes == 1) return _mm_cmpeq_epi8(a, b);
    if constexpr (kBytes == 2) return _mm_cmpeq_epi16(a, b);
    if constexpr (kBytes == 4) return _mm_cmpeq_epi32(a, b);
  };
  __m128i bytes;
  if constexpr (kBytes == 1) {
    bytes = equal(0);
  } else if constexpr (kBytes == 2) {
    bytes = _mm_packs_epi16(equal(0), equal(1));
  } else {
    bytes =
        _mm_packs_epi16(_mm_packs_epi32(equal(0), equal(1)), _mm_packs_epi32(equal(2), equal(3)));
  }
  return ~static_cast<uint32_t>(_mm_movemask_epi8(bytes)) & 0xFFFF;
}
#endif

// Sets bit i of `mask` where element i of the chunk differs, 64 elements into one register word.
// A loop setting one bit per element costs about 5x more; one over 8-byte words with a skip for
// equal words sits between the two.
template <typename T>
void MaskOf(const uint8_t* base, const uint8_t* next, uint32_t elements,
            [[maybe_unused]] MaskKernel kernel, ChunkMask& mask) {
  constexpr uint32_t kLanes = 8 / sizeof(T);
  uint32_t i = 0;
  for (; i + 64 <= elements; i += 64) {
    uint64_t bits = 0;
#if defined(__SSE2__)
    if constexpr (sizeof(T) <= 4) {
      if (kernel == MaskKernel::kVector) {
        for (uint32_t j = 0; j < 64; j += 16) {
          bits |=
              uint64_t{Differs16<sizeof(T)>(base + (i + j) * sizeof(T), next + (i + j) * sizeof(T))}
              << j;
        }
        mask[i / 64] = bits;
        continue;
      }
    }
#endif
    for (uint32_t j = 0; j < 64; j += kLanes) {
      uint64_t a;
      uint64_t b;
      std::memcpy(&a, base + (i + j) * sizeof(T), 8);
      std::memcpy(&b, next + (i + j) * sizeof(T), 8);
      if (a != b) bits |= NonZeroLanes<sizeof(T)>(a ^ b) << j;
    }
    mask[i / 64] = bits;
  }
  for (; i < elements; ++i) {  // a last chunk's tail
    T a;
    T b;
    std::memcpy(&a, base + i * sizeof(T), sizeof(T));
    std::memcpy(&b, next + i * sizeof(T), sizeof(T));
    mask[i / 64] |= static_cast<uint64_t>(a != b) << (i % 64);
  }
}

void MaskOfBytes(const uint8_t* base, const uint8_t* next, uint32_t elements,
                 uint32_t element_bytes, ChunkMask& mask) {
  for (uint32_t i = 0; i < elements; ++i) {
    const bool differs =
        std::memcmp(base + i * element_bytes, next + i * element_bytes, element_bytes) != 0;
    mask[i / 64] |= static_cast<uint64_t>(differs) << (i % 64);
  }
}

}  // namespace

void ChangeMask(const uint8_t* base, const uint8_t* next, uint32_t elements, uint32_t element_bytes,
                ChunkMask& mask, MaskKernel kernel) {
  mask.fill(0);
  switch (element_bytes) {
    case 1:
      return MaskOf<uint8_t>(base, next, elements, kernel, mask);
    case 2:
      return MaskOf<uint16_t>(base, next, elements, kernel, mask);
    case 4:
      return MaskOf<uint32_t>(base, next, elements, kernel, mask);
    case 8:
      return MaskOf<uint64_t>(base, next, elements, kernel, mask);
    default:
      return MaskOfBytes(base, next, elements, element_bytes, mask);
  }
}

}  // namespace weightsync::delta
