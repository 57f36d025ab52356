#include "delta/segment_delta.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

namespace weightsync::delta {
namespace {

// Calls f(i) for every set bit i of the mask, in increasing order.
template <typename F>
void ForEachBit(const ChunkMask& mask, F&& f) {
  for (uint32_t word = 0; word < kChunkElements / 64; ++word) {
    for (uint64_t bits = mask[word]; bits != 0; bits &= bits - 1) {
      f(word * 64 + static_cast<uint32_t>(std::countr_zero(bits)));
    }
  }
}

uint32_t PopCount(const ChunkMask& mask) {
  uint32_t count = 0;
  for (uint64_t word : mask) count += static_cast<uint32_t>(std::popcount(word));
  return count;
}

// Copies element `i` of `from` to element `i` of `to`, for the element sizes of the dtypes.
template <uint32_t kBytes>
void CopyElement(const uint8_t* from, uint8_t* to) {
  std::memcpy(to, from, kBytes);
}

uint32_t ChunkLength(uint64_t elements, uint64_t chunk) {
  return static_cast<uint32_t>(
      std::min<uint64_t>(kChunkElements, elements - chunk * kChunkElements));
}

// The bitmap of a chunk stored as 32 bytes, least significant bit first.
void StoreBitmap(const ChunkMask& mask, uint8_t* out) {
  for (uint32_t word = 0; word < kChunkElements / 64; ++word) {
    for (uint32_t byte = 0; byte < 8; ++byte) {
      out[word * 8 + byte] = static_cast<uint8_t>(mask[word] >> (byte * 8));
    }
  }
}

void LoadBitmap(const uint8_t* in, ChunkMask& mask) {
  for (uint32_t word = 0; word < kChunkElements / 64; ++word) {
    uint64_t value = 0;
    for (uint32_t byte = 0; byte < 8; ++byte) {
      value |= static_cast<uint64_t>(in[word * 8 + byte]) << (byte * 8);
    }
    mask[word] = value;
  }
}

uint32_t IndexBytesOf(uint8_t code) {
  if (code <= kMaxListed) return code;
  return code == kBitmap ? kBitmapBytes : 0;
}

}  // namespace

uint64_t ChunkCost(uint32_t changed, uint32_t length, uint32_t element_bytes, uint8_t* code) {
  const uint64_t list = uint64_t{changed} * (1 + element_bytes);
  const uint64_t bitmap = kBitmapBytes + uint64_t{changed} * element_bytes;
  const uint64_t whole = uint64_t{length} * element_bytes;
  if (changed == 0) {
    *code = 0;
    return 0;
  }
  if (changed <= kMaxListed && list <= std::min(bitmap, whole)) {
    *code = static_cast<uint8_t>(changed);
    return list;
  }
  *code = bitmap < whole ? kBitmap : kWhole;
  return std::min(bitmap, whole);
}

double ExpectedDeltaBytesPerElement(double fraction, uint32_t element_bytes) {
  fraction = std::clamp(fraction, 0.0, 1.0);
  uint8_t code = 0;
  double chunk = 1;  // the directory byte
  if (fraction == 0 || fraction == 1) {
    chunk += static_cast<double>(
        ChunkCost(fraction == 0 ? 0 : kChunkElements, kChunkElements, element_bytes, &code));
  } else {
    // P(k of 256 changed), in logs: (1 - f)^256 underflows long before f reaches 1.
    const double n = kChunkElements;
    for (uint32_t k = 0; k <= kChunkElements; ++k) {
      const double log_p = std::lgamma(n + 1) - std::lgamma(k + 1.0) - std::lgamma(n - k + 1) +
                           k * std::log(fraction) + (n - k) * std::log1p(-fraction);
      chunk +=
          std::exp(log_p) * static_cast<double>(ChunkCost(k, kChunkElements, element_bytes, &code));
    }
  }
  return std::min(chunk / kChunkElements, static_cast<double>(element_bytes));
}

double ExpectedWireBytesPerElement(double fraction, uint32_t element_bytes) {
  const double model = ExpectedDeltaBytesPerElement(fraction, element_bytes);
  return model * kAutoRoomDivisor > element_bytes ? element_bytes : model;
}

std::optional<Encoded> SegmentEncoder::Encode(std::span<const uint8_t> base,
                                              std::span<const uint8_t> next, uint32_t element_bytes,
                                              std::span<uint8_t> out) {
  // Sizes that do not make elements cannot be diffed: the caller sends such a segment whole.
  if (element_bytes == 0 || element_bytes > kMaxElementBytes || base.size() != next.size() ||
      next.size() % element_bytes != 0) {
    return std::nullopt;
  }
  const uint64_t elements = next.size() / element_bytes;
  const uint64_t chunks = ChunkCount(elements);
  if (chunks > out.size()) return std::nullopt;
  index_.clear();
  uint64_t values = chunks;  // where the next value goes in `out`
  Encoded encoded;
  ChunkMask mask;
  for (uint64_t chunk = 0; chunk < chunks; ++chunk) {
    const uint32_t length = ChunkLength(elements, chunk);
    const uint64_t first = chunk * kChunkElements * element_bytes;
    const uint8_t* from = next.data() + first;
    ChangeMask(base.data() + first, from, length, element_bytes, mask, kernel_);
    const uint32_t changed = PopCount(mask);
    encoded.changed_elements += changed;
    if (changed == 0) {
      out[chunk] = 0;
      continue;
    }
    uint8_t code = 0;
    const uint64_t cost = ChunkCost(changed, length, element_bytes, &code);
    const uint64_t value_bytes = cost - IndexBytesOf(code);
    if (values + cost + index_.size() > out.size()) return std::nullopt;
    out[chunk] = code;
    if (code == kWhole) {
      std::memcpy(out.data() + values, from, value_bytes);
      values += value_bytes;
      continue;
    }
    if (code == kBitmap) {
      index_.resize(index_.size() + kBitmapBytes);
      StoreBitmap(mask, index_.data() + index_.size() - kBitmapBytes);
    }
    ForEachBit(mask, [&](uint32_t i) {
      if (code != kBitmap) index_.push_back(static_cast<uint8_t>(i));
      std::memcpy(out.data() + values, from + uint64_t{i} * element_bytes, element_bytes);
      values += element_bytes;
    });
  }
  if (!index_.empty()) std::memcpy(out.data() + values, index_.data(), index_.size());
  encoded.bytes = values + index_.size();
  return encoded;
}

Result<DeltaShape> CheckDelta(std::span<const uint8_t> delta, uint64_t segment_bytes,
                              uint32_t element_bytes) {
  if (element_bytes == 0 || element_bytes > kMaxElementBytes ||
      segment_bytes % element_bytes != 0) {
    return Status::InvalidArgument("delta: a segment of ", segment_bytes,
                                   " bytes is not made of elements of ", element_bytes, " bytes");
  }
  const uint64_t elements = segment_bytes / element_bytes;
  const uint64_t chunks = ChunkCount(elements);
  if (delta.size() < chunks) {
    return Status::ProtocolError("delta: ", delta.size(), " bytes, shorter than its directory of ",
                                 chunks, " chunks");
  }
  DeltaShape shape;
  for (uint64_t chunk = 0; chunk < chunks; ++chunk) {
    const uint8_t code = delta[chunk];
    if (code > kMaxListed && code != kBitmap && code != kWhole) {
      return Status::ProtocolError("delta: chunk ", chunk, " has the unknown code ", int{code});
    }
    if (code <= kMaxListed && code > ChunkLength(elements, chunk)) {
      return Status::ProtocolError("delta: chunk ", chunk, " lists ", int{code},
                                   " elements of its ", ChunkLength(elements, chunk));
    }
    shape.index_bytes += IndexBytesOf(code);
  }
  if (delta.size() - chunks < shape.index_bytes) {
    return Status::ProtocolError("delta: ", delta.size(), " bytes, too short for a directory of ",
                                 chunks, " chunks and an index of ", shape.index_bytes, " bytes");
  }
  const uint8_t* index = delta.data() + delta.size() - shape.index_bytes;
  for (uint64_t chunk = 0; chunk < chunks; ++chunk) {
    const uint8_t code = delta[chunk];
    const uint32_t length = ChunkLength(elements, chunk);
    if (code == kWhole) {
      shape.changed_elements += length;
    } else if (code == kBitmap) {
      ChunkMask mask;
      LoadBitmap(index, mask);
      index += kBitmapBytes;
      const uint32_t set = PopCount(mask);
      uint32_t in_chunk = set;
      if (length < kChunkElements) {
        ChunkMask inside = {};
        for (uint32_t i = 0; i < length; ++i) inside[i / 64] |= uint64_t{1} << (i % 64);
        for (uint32_t w = 0; w < kChunkElements / 64; ++w) mask[w] &= inside[w];
        in_chunk = PopCount(mask);
      }
      if (set == 0 || in_chunk != set) {
        return Status::ProtocolError("delta: chunk ", chunk, "'s bitmap ",
                                     set == 0 ? "is empty" : "marks elements past its end");
      }
      shape.changed_elements += set;
    } else {
      for (uint32_t k = 0; k < code; ++k) {
        if (index[k] >= length || (k > 0 && index[k] <= index[k - 1])) {
          return Status::ProtocolError("delta: chunk ", chunk, "'s offsets are not increasing ",
                                       "inside its ", length, " elements (offset ", int{index[k]},
                                       " at ", k, ")");
        }
      }
      index += code;
      shape.changed_elements += code;
    }
  }
  shape.value_bytes = shape.changed_elements * element_bytes;
  const uint64_t value_room = delta.size() - chunks - shape.index_bytes;
  if (value_room != shape.value_bytes) {
    return Status::ProtocolError("delta: ", value_room, " bytes of values for ",
                                 shape.changed_elements, " elements of ", element_bytes, " bytes");
  }
  return shape;
}

namespace {

template <uint32_t kBytes>
void Scatter(std::span<const uint8_t> delta, uint32_t element_bytes, uint64_t index_bytes,
             std::span<uint8_t> segment) {
  const uint64_t elements = segment.size() / element_bytes;
  const uint64_t chunks = ChunkCount(elements);
  const uint8_t* value = delta.data() + chunks;
  const uint8_t* index = delta.data() + delta.size() - index_bytes;
  auto copy = [&](uint8_t* to) {
    if constexpr (kBytes != 0) {
      CopyElement<kBytes>(value, to);
    } else {
      std::memcpy(to, value, element_bytes);
    }
    value += element_bytes;
  };
  for (uint64_t chunk = 0; chunk < chunks; ++chunk) {
    const uint8_t code = delta[chunk];
    uint8_t* first = segment.data() + chunk * kChunkElements * element_bytes;
    if (code == kWhole) {
      const uint64_t bytes = uint64_t{ChunkLength(elements, chunk)} * element_bytes;
      std::memcpy(first, value, bytes);
      value += bytes;
    } else if (code == kBitmap) {
      ChunkMask mask;
      LoadBitmap(index, mask);
      index += kBitmapBytes;
      ForEachBit(mask, [&](uint32_t i) { copy(first + uint64_t{i} * element_bytes); });
    } else {
      for (uint32_t k = 0; k < code; ++k) copy(first + uint64_t{index[k]} * element_bytes);
      index += code;
    }
  }
}

}  // namespace

Status ApplyDelta(std::span<const uint8_t> delta, uint32_t element_bytes,
                  std::span<uint8_t> segment) {
  WS_ASSIGN_OR_RETURN(const DeltaShape shape, CheckDelta(delta, segment.size(), element_bytes));
  ApplyCheckedDelta(delta, shape, element_bytes, segment);
  return Status::Ok();
}

void ApplyCheckedDelta(std::span<const uint8_t> delta, const DeltaShape& shape,
                       uint32_t element_bytes, std::span<uint8_t> segment) {
  switch (element_bytes) {
    case 1:
      Scatter<1>(delta, element_bytes, shape.index_bytes, segment);
      break;
    case 2:
      Scatter<2>(delta, element_bytes, shape.index_bytes, segment);
      break;
    case 4:
      Scatter<4>(delta, element_bytes, shape.index_bytes, segment);
      break;
    case 8:
      Scatter<8>(delta, element_bytes, shape.index_bytes, segment);
      break;
    default:
      Scatter<0>(delta, element_bytes, shape.index_bytes, segment);
      break;
  }
}

}  // namespace weightsync::delta
