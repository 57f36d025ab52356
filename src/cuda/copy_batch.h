// A prepared batch of copies (destination, source, size), built once per transfer handle and
// submitted every step in one go (CopyQueue::EnqueueBatch): the one copy-batch type of the GPU
// paths and the GPU store. Host code, no CUDA headers.
//
// Why it coalesces: a region plan (plan/region_plan.h) turns a row-parallel cut into one run per
// row — a 7B model's TP-2 engine rank receives about 200,000 runs of a few KiB per step. One
// copy-engine descriptor per run costs ~2 µs each, far more than the bytes. Runs of equal size at
// constant strides on both sides are kept as one StridedCopy (cudaMemcpy2DAsync: the copy engine
// walks the rows itself), recognised as they are added, so no caller has to know about rows.
// The copies of one batch must not overlap each other's destinations (true of every plan), since
// singles and strided copies are not submitted in the order they were added. A 2-D copy must lie
// in one allocation on each side (cudaMemcpy2DAsync refuses a span across two cudaMalloc blocks,
// e.g. small tensors the caching allocator placed at a regular stride), so only copies the caller
// gave the same `span` id are combined.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace weightsync::cuda {

// `height` rows of `width` bytes; row r goes from src + r * src_pitch to dst + r * dst_pitch.
struct StridedCopy {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t dst_pitch = 0;
  size_t src_pitch = 0;
  size_t width = 0;
  size_t height = 0;
};

struct SingleCopy {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};

class CopyBatch {
 public:
  // Rows that must line up before they become one StridedCopy: below it, a 2-D copy saves less
  // than the extra call costs (the singles already go out in one submission).
  static constexpr size_t kMinRows = 4;
  // cudaMemcpy2D's pitch limit (cudaDevAttrMaxPitch is 2^31 - 1 on every GPU we know of).
  static constexpr size_t kMaxPitch = (size_t{1} << 31) - 1;

  // Zero-byte copies are dropped. `span`: the caller's promise that all copies with this id have
  // their destinations in one allocation and their sources in one allocation (the GPU paths pass
  // the destination tensor's index: their sources are one arena, staging or shadow buffer).
  void Add(void* dst, const void* src, size_t bytes, uint64_t span);

  // Copies submitted one by one (in one cudaMemcpyBatchAsync).
  const std::vector<void*>& dsts() const { return dsts_; }
  const std::vector<const void*>& srcs() const { return srcs_; }
  const std::vector<size_t>& sizes() const { return sizes_; }
  const std::vector<StridedCopy>& strided() const { return strided_; }

  // The singles of fewer than `below_bytes` bytes (in order), for a caller that would submit
  // them another way (one copy kernel, cuda/kernels.h); DropSinglesBelow removes them once that
  // way is prepared, so a failed preparation leaves the batch whole. Call both once the batch is
  // complete: after a drop, nothing added continues a run begun before it.
  std::vector<SingleCopy> SinglesBelow(size_t below_bytes) const;
  void DropSinglesBelow(size_t below_bytes);

  size_t copies() const;  // every copy added (a strided copy counts its rows); zero-byte ones not
  uint64_t bytes() const;
  bool empty() const { return sizes_.empty() && strided_.empty(); }
  void Clear();

 private:
  // Whether the last two singles step by the same strides as the trailing run so far.
  bool ContinuesTrail() const;

  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<size_t> sizes_;
  std::vector<StridedCopy> strided_;
  uint64_t last_span_ = 0;     // of the last copy added
  bool strided_open_ = false;  // the last copy added extended strided_.back()
  size_t trail_ = 0;           // trailing singles that form one progression
  size_t trail_dst_pitch_ = 0;
  size_t trail_src_pitch_ = 0;
};

// Where the singles of a batch are cut to go out on several streams at once (CopyQueue's copy
// lanes): at most `lanes` (1..kMaxCopyLanes) contiguous runs of about equal bytes, in order, none
// empty. Run r is sizes[begin[r], begin[r + 1]); `count` runs. Contiguous runs keep each lane's
// copies in the caller's prepared arrays (one cudaMemcpyBatchAsync per lane, nothing built per
// step). A single copy larger than a lane's share makes fewer runs: copies are never split.
inline constexpr size_t kMaxCopyLanes = 8;
struct LaneCuts {
  size_t count = 0;
  std::array<size_t, kMaxCopyLanes + 1> begin{};
};
LaneCuts CutIntoLanes(std::span<const size_t> sizes, size_t lanes);

}  // namespace weightsync::cuda
