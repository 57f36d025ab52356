// Which elements of a chunk differ between two versions: the segment encoder's inner loop, which
// reads every published byte twice (base and new), so it must run near memcpy speed.
#pragma once

#include <array>
#include <cstdint>

namespace weightsync::delta {

inline constexpr uint32_t kChunkElements = 256;

// Bit i (word i / 64, bit i % 64) is set where element i differs.
using ChunkMask = std::array<uint64_t, kChunkElements / 64>;

// kVector compares 16 elements per instruction where the CPU has SSE2 (every x86-64) for elements
// of 1, 2 or 4 bytes; kWords compares 8-byte words and skips equal ones, and is what every other
// case (and every other CPU) uses. Both give the same mask; the tests compare them.
enum class MaskKernel { kVector, kWords };

// The mask of the first `elements` (at most kChunkElements) elements of `element_bytes` each;
// bits past them are zero.
void ChangeMask(const uint8_t* base, const uint8_t* next, uint32_t elements, uint32_t element_bytes,
                ChunkMask& mask, MaskKernel kernel = MaskKernel::kVector);

}  // namespace weightsync::delta
