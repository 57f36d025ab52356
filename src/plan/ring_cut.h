// How a ring store's version is cut (ArenaKind::kHostRing, kCudaRing): a virtual range of
// version_buckets buckets of bucket_bytes each, bucket b streamed through ring slot b % slots.
// The publisher fills a bucket from its tensors and the subscriber copies it out into its
// landing; both must cut every byte range at the same bucket edges, so both cut here.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace weightsync::plan {

struct Segment;  // plan.h

struct RingPiece {
  uint32_t bucket = 0;
  uint64_t at = 0;             // bytes into the range that was cut
  uint64_t bucket_offset = 0;  // where those bytes lie in their bucket
  uint64_t bytes = 0;
};

// Appends to `out` the pieces of the version's bytes [offset, offset + bytes): cut at bucket
// edges and into pieces of at most `max_piece` bytes, in order. `bucket_bytes` and `max_piece`
// > 0; the range lies inside the version (plan::ValidateLayout checked it), so bucket numbers
// fit in 32 bits.
void CutAtBuckets(uint64_t offset, uint64_t bytes, uint64_t bucket_bytes, uint64_t max_piece,
                  std::vector<RingPiece>* out);

// Items grouped by bucket, in bucket order: bucket b's are items[first[b] .. first[b + 1]).
template <typename T>
struct ByBucket {
  std::vector<T> items;
  std::vector<uint32_t> first;  // buckets + 1 entries

  // From per-bucket lists (one per bucket of the version).
  static ByBucket From(const std::vector<std::vector<T>>& lists) {
    ByBucket out;
    out.first.assign(1, 0);
    for (const std::vector<T>& list : lists) {
      out.items.insert(out.items.end(), list.begin(), list.end());
      out.first.push_back(static_cast<uint32_t>(out.items.size()));
    }
    return out;
  }
  uint32_t count(uint32_t bucket) const { return first[bucket + 1] - first[bucket]; }
  const T* begin(uint32_t bucket) const { return items.data() + first[bucket]; }
};

// `bytes` of plan segment `segment`, `at` bytes into it, at `offset` of its bucket.
struct SegmentPiece {
  uint32_t segment = 0;
  uint64_t at = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// Every plan segment's bytes (its src_offset into the version) cut at the edges of `buckets`
// buckets of `bucket_bytes` and into pieces of at most `max_piece`, grouped by bucket.
ByBucket<SegmentPiece> CutSegmentsAtBuckets(std::span<const Segment> segments,
                                            uint64_t bucket_bytes, uint32_t buckets,
                                            uint64_t max_piece);

}  // namespace weightsync::plan
