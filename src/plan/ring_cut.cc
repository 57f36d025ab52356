#include "plan/ring_cut.h"

#include <algorithm>

#include "plan/plan.h"

namespace weightsync::plan {

void CutAtBuckets(uint64_t offset, uint64_t bytes, uint64_t bucket_bytes, uint64_t max_piece,
                  std::vector<RingPiece>* out) {
  for (uint64_t at = 0; at < bytes;) {
    const uint64_t pos = offset + at;
    const uint64_t b = pos / bucket_bytes;
    const uint64_t n = std::min({bytes - at, (b + 1) * bucket_bytes - pos, max_piece});
    out->push_back({static_cast<uint32_t>(b), at, pos - b * bucket_bytes, n});
    at += n;
  }
}

ByBucket<SegmentPiece> CutSegmentsAtBuckets(std::span<const Segment> segments,
                                            uint64_t bucket_bytes, uint32_t buckets,
                                            uint64_t max_piece) {
  std::vector<std::vector<SegmentPiece>> by_bucket(buckets);
  std::vector<RingPiece> cut;
  for (uint32_t i = 0; i < segments.size(); ++i) {
    cut.clear();
    CutAtBuckets(segments[i].src_offset, segments[i].bytes, bucket_bytes, max_piece, &cut);
    for (const RingPiece& p : cut)
      by_bucket[p.bucket].push_back({i, p.at, p.bucket_offset, p.bytes});
  }
  return ByBucket<SegmentPiece>::From(by_bucket);
}

}  // namespace weightsync::plan
