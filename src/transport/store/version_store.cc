#include "transport/store/version_store.h"

#include <algorithm>

namespace weightsync::transport::store {

SegmentLayout CutSegments(const StoreLayout& layout) {
  SegmentLayout out;
  std::vector<uint32_t> first_digest(layout.tensors.size());
  uint32_t digest = 0;
  for (uint32_t i = 0; i < layout.tensors.size(); ++i) {
    const PublishedTensor& t = layout.tensors[i];
    const uint64_t nbytes = t.placement.spec.nbytes;
    first_digest[i] = digest;
    for (uint64_t off = 0, k = 0; off < nbytes; off += layout.segment_bytes, ++k) {
      if (t.alias_of >= 0) {
        out.copies.emplace_back(digest++, first_digest[t.alias_of] + static_cast<uint32_t>(k));
      } else {
        out.segments.push_back({i, off, std::min(layout.segment_bytes, nbytes - off), digest++});
      }
    }
  }
  out.digest_count = digest;
  return out;
}

uint64_t DefaultRingBucketBytes(uint64_t free_bytes, uint32_t slots, uint64_t version_bytes) {
  constexpr uint64_t kMin = 64ull << 20, kMax = 1ull << 30;
  uint64_t bytes = std::clamp<uint64_t>(free_bytes / 4 / std::max<uint32_t>(slots, 1), kMin, kMax);
  bytes = std::min(bytes, (version_bytes + 63) / 64 * 64);
  return std::max<uint64_t>(bytes, 64);
}

Result<uint64_t> VersionStore::AllocateDirect(uint64_t /*bytes*/) {
  return Status::NotSupported("this store holds no tensors of its own");
}

}  // namespace weightsync::transport::store
