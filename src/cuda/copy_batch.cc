#include "cuda/copy_batch.h"

#include <algorithm>

namespace weightsync::cuda {
namespace {

uintptr_t Address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// The pitch from `from` to `to` if it is a valid row step for rows of `width` bytes, else 0.
size_t RowStep(const void* from, const void* to, size_t width) {
  if (Address(to) <= Address(from)) return 0;
  const size_t step = Address(to) - Address(from);
  return step >= width && step <= CopyBatch::kMaxPitch ? step : 0;
}

}  // namespace

void CopyBatch::Add(void* dst, const void* src, size_t bytes, uint64_t span) {
  if (bytes == 0) return;
  const bool same_span = !empty() && span == last_span_;
  last_span_ = span;
  if (!same_span) {
    strided_open_ = false;
    trail_ = 0;
  }
  if (strided_open_) {
    StridedCopy& g = strided_.back();
    if (bytes == g.width && Address(dst) == Address(g.dst) + g.height * g.dst_pitch &&
        Address(src) == Address(g.src) + g.height * g.src_pitch) {
      ++g.height;
      return;
    }
    strided_open_ = false;
  }
  dsts_.push_back(dst);
  srcs_.push_back(src);
  sizes_.push_back(bytes);
  if (trail_ >= 2 && ContinuesTrail()) {
    ++trail_;
  } else if (trail_ >= 1 && sizes_[sizes_.size() - 2] == bytes) {
    // A new progression may start at the previous single.
    const size_t n = sizes_.size();
    trail_dst_pitch_ = RowStep(dsts_[n - 2], dst, bytes);
    trail_src_pitch_ = RowStep(srcs_[n - 2], src, bytes);
    trail_ = trail_dst_pitch_ != 0 && trail_src_pitch_ != 0 ? 2 : 1;
  } else {
    trail_ = 1;
  }
  if (trail_ < kMinRows) return;
  const size_t first = sizes_.size() - trail_;
  strided_.push_back(
      {dsts_[first], srcs_[first], trail_dst_pitch_, trail_src_pitch_, bytes, trail_});
  dsts_.resize(first);
  srcs_.resize(first);
  sizes_.resize(first);
  strided_open_ = true;
  trail_ = 0;
}

bool CopyBatch::ContinuesTrail() const {
  const size_t n = sizes_.size();
  return sizes_[n - 1] == sizes_[n - 2] &&
         Address(dsts_[n - 1]) == Address(dsts_[n - 2]) + trail_dst_pitch_ &&
         Address(srcs_[n - 1]) == Address(srcs_[n - 2]) + trail_src_pitch_;
}

std::vector<SingleCopy> CopyBatch::SinglesBelow(size_t below_bytes) const {
  std::vector<SingleCopy> small;
  for (size_t i = 0; i < sizes_.size(); ++i) {
    if (sizes_[i] < below_bytes) small.push_back({dsts_[i], srcs_[i], sizes_[i]});
  }
  return small;
}

void CopyBatch::DropSinglesBelow(size_t below_bytes) {
  size_t kept = 0;
  for (size_t i = 0; i < sizes_.size(); ++i) {
    if (sizes_[i] < below_bytes) continue;
    dsts_[kept] = dsts_[i];
    srcs_[kept] = srcs_[i];
    sizes_[kept] = sizes_[i];
    ++kept;
  }
  dsts_.resize(kept);
  srcs_.resize(kept);
  sizes_.resize(kept);
  strided_open_ = false;
  trail_ = 0;
}

size_t CopyBatch::copies() const {
  size_t n = sizes_.size();
  for (const StridedCopy& g : strided_) n += g.height;
  return n;
}

uint64_t CopyBatch::bytes() const {
  uint64_t n = 0;
  for (size_t s : sizes_) n += s;
  for (const StridedCopy& g : strided_) n += uint64_t{g.width} * g.height;
  return n;
}

void CopyBatch::Clear() {
  dsts_.clear();
  srcs_.clear();
  sizes_.clear();
  strided_.clear();
  strided_open_ = false;
  trail_ = 0;
}

LaneCuts CutIntoLanes(std::span<const size_t> sizes, size_t lanes) {
  LaneCuts cuts;
  if (sizes.empty()) return cuts;
  lanes = std::min(lanes, kMaxCopyLanes);  // 0 lanes: one run, as 1
  uint64_t total = 0;
  for (size_t b : sizes) total += b;
  // Run r ends after the copy that carries the prefix sum past r/lanes of the total; a run whose
  // goal an earlier copy already passed would be empty and is merged away.
  cuts.begin[0] = 0;
  cuts.count = 0;
  uint64_t prefix = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    prefix += sizes[i];
    const size_t lane = cuts.count + 1;  // the run that copy i + 1 would open
    if (lane < lanes && i + 1 < sizes.size() && prefix * lanes >= total * lane) {
      cuts.begin[++cuts.count] = i + 1;
    }
  }
  cuts.begin[++cuts.count] = sizes.size();
  return cuts;
}

}  // namespace weightsync::cuda
