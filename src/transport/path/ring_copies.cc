#include "transport/path/ring_copies.h"

#include "plan/ring_cut.h"

namespace weightsync::transport::path {

std::vector<cuda::CopyBatch> RingCopyBatches(
    const wire::Welcome& welcome, const plan::Plan& plan, const uint8_t* ring,
    const std::function<uint8_t*(const plan::PlannedTensor&)>& received) {
  std::vector<cuda::CopyBatch> batches(welcome.version_buckets);
  std::vector<plan::RingPiece> cut;
  for (const plan::PlannedTensor& t : plan.tensors) {
    const uint64_t offset = welcome.tensors[t.publisher_index].offset + t.src_offset;
    cut.clear();
    plan::CutAtBuckets(offset, t.nbytes, welcome.slot_bytes, UINT64_MAX, &cut);
    uint8_t* into = cut.empty() ? nullptr : received(t);
    for (const plan::RingPiece& p : cut) {
      const uint8_t* slot = ring + uint64_t{p.bucket % welcome.slot_count} * welcome.slot_bytes;
      batches[p.bucket].Add(into + p.at, slot + p.bucket_offset, p.bytes, t.destination);
    }
  }
  return batches;
}

std::string RingText(const wire::Welcome& welcome, const char* kind) {
  return "a ring of " + std::to_string(welcome.slot_count) + " " + kind + " buckets of " +
         std::to_string(welcome.slot_bytes) + " bytes (" + std::to_string(welcome.version_buckets) +
         " a version)";
}

}  // namespace weightsync::transport::path
