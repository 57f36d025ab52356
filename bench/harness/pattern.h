// The demo's deterministic weights: the bytes of tensor i at step s are a pure function of (i, s),
// so the publisher writes them and the subscriber recomputes what it must have received without
// the two processes exchanging anything but step numbers.
//
// Word j (8 bytes, little-endian) of tensor i at step s is Seed(i, s) + j × 0x9E3779B97F4A7C15:
// every word of every tensor changes every step, and filling is one add and one store per word.
#pragma once

#include <cstdint>

namespace weightsync::bench {

// Writes the first `bytes` bytes of tensor `tensor` at `step` into `out`.
void FillPattern(uint32_t tensor, int64_t step, uint8_t* out, uint64_t bytes);

// xxHash3-64 of the bytes FillPattern would write, computed independently of any buffer the
// transfer touched: the pattern is generated in small cache-resident chunks and hashed as a
// stream. Equals util::Hash64 of a correctly received tensor.
uint64_t ExpectedDigest(uint32_t tensor, int64_t step, uint64_t bytes);

// xxHash3-64 of `bytes` bytes at `data` (the same function weightsync's digests use).
uint64_t Digest(const void* data, uint64_t bytes);

}  // namespace weightsync::bench
