#include "transport/store/version_store.h"

#include <algorithm>
#include <functional>

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

Result<RingGeometry> PlanRing(const StoreLayout& layout,
                              const std::function<Result<uint64_t>()>& free_bytes) {
  if (layout.ring_slots < 2) {
    return Status::InvalidArgument("a ring of ", layout.ring_slots,
                                   " buckets: a ring holds 2 or more (one is filled while "
                                   "subscribers read another)");
  }
  for (const PublishedTensor& t : layout.tensors) {
    if (t.placement.region != wire::Region::kSlot || t.source == nullptr) {
      return Status::NotSupported("tensor '", t.placement.spec.name,
                                  "': a ring store streams registered tensors only");
    }
  }
  // Whole pages: every bucket starts aligned (the Welcome's slot_bytes is what subscribers cut
  // the version by).
  auto whole_pages = [](uint64_t bytes) {
    constexpr uint64_t kPage = 4096;
    return std::max<uint64_t>((bytes + kPage - 1) / kPage * kPage, kPage);
  };
  uint64_t bucket = layout.ring_bucket_bytes;
  if (bucket == 0) {
    WS_ASSIGN_OR_RETURN(uint64_t free, free_bytes());
    bucket = DefaultRingBucketBytes(free, layout.ring_slots, layout.slot_bytes);
  }
  // Clamped before rounding: a bucket asked for near 2^64 must not wrap to one page.
  bucket = whole_pages(std::min(bucket, layout.slot_bytes));
  const uint64_t buckets = std::max<uint64_t>((layout.slot_bytes + bucket - 1) / bucket, 1);
  if (buckets > wire::kMaxVersionBuckets) {
    return Status::InvalidArgument("a version of ", layout.slot_bytes, " bytes in buckets of ",
                                   bucket, " bytes needs ", buckets, " buckets, more than ",
                                   wire::kMaxVersionBuckets, ": use larger buckets");
  }
  return RingGeometry{bucket, static_cast<uint32_t>(buckets)};
}

Result<uint64_t> VersionStore::AllocateDirect(uint64_t /*bytes*/) {
  return Status::NotSupported("this store holds no tensors of its own");
}

}  // namespace weightsync::transport::store
