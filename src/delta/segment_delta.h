// The delta encoding of one segment: the elements of a new version that differ from its base, and
// where they go. An RL step changes 1-3% of the published bf16 elements (issue 41), spread
// through every tensor, so the encoding must cost little per changed element and must let a GPU
// find any chunk's data with prefix sums (no sequential parse):
//
//   [directory: one code per chunk of 256 elements][values][index]
//
//   code 0          the chunk is unchanged: no values, no index
//   code 1..32      k = code elements changed: k values, k one-byte offsets (increasing)
//   code kBitmap    a 32-byte bitmap of the changed elements, one value per set bit
//   code kWhole     every element of the chunk, no index
//
// The encoder takes, per chunk, whichever costs fewest bytes (list below 32 changes, bitmap up to
// 256 - 32 / element_bytes, whole above), and the whole segment only when the delta would not be
// smaller (Encode returns nullopt). Values come before the index so the encoder writes them in
// place; the index size follows from the directory alone. Values are the new elements, not XORs:
// applying a delta twice is harmless, and a delta applied to the wrong base is caught by the
// digest of the full new version (docs/deltas.md has the measurements behind these choices).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "delta/change_mask.h"
#include "weightsync/dtype.h"
#include "weightsync/status.h"

namespace weightsync::delta {

inline constexpr uint32_t kBitmapBytes = kChunkElements / 8;
inline constexpr uint8_t kMaxListed = 32;  // codes 1..kMaxListed list their offsets
inline constexpr uint8_t kBitmap = 0xFE;
inline constexpr uint8_t kWhole = 0xFF;
// Elements are compared as units of this many bytes at most (complex128 is 16).
inline constexpr uint32_t kMaxElementBytes = 16;

// The unit a tensor of `dtype` is compared in: its element, or a byte for sub-byte dtypes (two
// float4 values change together). Publisher and subscriber both cut by it.
inline uint32_t ElementBytes(DType dtype) {
  const uint8_t bits = Info(dtype).bits;
  return bits >= 8 ? bits / 8u : 1u;
}

inline uint64_t ChunkCount(uint64_t elements) {
  return (elements + kChunkElements - 1) / kChunkElements;
}
// PublisherOptions::delta kAuto: a segment goes as its delta only when the delta is at most this
// fraction of it (1 / kAutoRoomDivisor); else whole. The host store sizes its delta room by it
// and `weightsync plan-sim` prices by it, so the two agree.
inline constexpr uint64_t kAutoRoomDivisor = 4;

// The largest delta of a segment of `segment_bytes`: every chunk whole, plus its directory.
inline uint64_t MaxDeltaBytes(uint64_t segment_bytes, uint32_t element_bytes) {
  return segment_bytes + ChunkCount(segment_bytes / element_bytes);
}

// What a chunk of `length` elements, `changed` of them changed, costs in a delta besides its
// directory byte, in the form the encoder picks (written to *code: 0, 1..kMaxListed, kBitmap or
// kWhole). The encoder and the size model below both use it, so they cannot drift apart.
uint64_t ChunkCost(uint32_t changed, uint32_t length, uint32_t element_bytes, uint8_t* code);

// The expected bytes of a delta per element of `element_bytes` when each element changes with
// probability `fraction`, independently (binomial per chunk of 256), capped at `element_bytes`
// (the segment goes whole). A model for planning (`weightsync plan-sim --changed-fraction`);
// changes that cluster cost less, as every chunk left unchanged costs one byte.
double ExpectedDeltaBytesPerElement(double fraction, uint32_t element_bytes);
// What an element costs on the wire from a kAuto publisher: the model above, or the element itself
// where the delta is more than the kAuto room allows (segments of millions of elements stay close
// to the expectation, so the rule applies to all of them alike).
double ExpectedWireBytesPerElement(double fraction, uint32_t element_bytes);

struct Encoded {
  uint64_t bytes = 0;             // of the delta written
  uint64_t changed_elements = 0;  // elements that differ from the base
};

// Encodes segments; keeps its index scratch between calls, so a steady step allocates nothing.
class SegmentEncoder {
 public:
  // kWords: the comparison kernel of CPUs without SSE2, for the tests and the benchmark.
  explicit SegmentEncoder(MaskKernel kernel = MaskKernel::kVector) : kernel_(kernel) {}

  // Writes the delta of `next` against `base` into `out`, or returns nullopt when it would not
  // fit in out.size() bytes (pass the segment's size: then nullopt means "send it whole").
  // `base` and `next` have the same size, a multiple of `element_bytes` (1..kMaxElementBytes);
  // other sizes return nullopt too.
  std::optional<Encoded> Encode(std::span<const uint8_t> base, std::span<const uint8_t> next,
                                uint32_t element_bytes, std::span<uint8_t> out);
  // Sizes the scratch for an `out` of up to `out_bytes` (the index never outgrows `out`): Encode
  // then allocates nothing.
  void Reserve(uint64_t out_bytes) { index_.reserve(out_bytes); }

 private:
  MaskKernel kernel_;
  std::vector<uint8_t> index_;
};

// What a delta holds, after checking that it is well formed for a segment of `segment_bytes`.
struct DeltaShape {
  uint64_t changed_elements = 0;  // values it carries (whole chunks count all their elements)
  uint64_t value_bytes = 0;
  uint64_t index_bytes = 0;
};

// Checks every directory code, offset and bitmap bit against a segment of `segment_bytes` and
// that the values fill the rest exactly. ProtocolError naming the first fault.
Result<DeltaShape> CheckDelta(std::span<const uint8_t> delta, uint64_t segment_bytes,
                              uint32_t element_bytes);

// Writes the delta's values into `segment` (which holds the base) after CheckDelta accepted it:
// a delta that is not well formed writes nothing.
Status ApplyDelta(std::span<const uint8_t> delta, uint32_t element_bytes,
                  std::span<uint8_t> segment);
// The same for a delta CheckDelta already accepted for this segment size and element size
// (`shape` is what it returned): no second parse, when the check ran earlier for all of a step.
void ApplyCheckedDelta(std::span<const uint8_t> delta, const DeltaShape& shape,
                       uint32_t element_bytes, std::span<uint8_t> segment);

}  // namespace weightsync::delta
