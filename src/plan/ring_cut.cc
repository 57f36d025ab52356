#include "plan/ring_cut.h"

#include <algorithm>

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

}  // namespace weightsync::plan
