// GpuTensorDigests: the digests of a version that is the registered CUDA tensors themselves (the
// zero-copy and GPU ring stores, which keep no copy to hash): every segment hashed where it lies
// in the caller's memory, in one grouped launch pair prepared once, after the caller's stream.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "cuda/device.h"
#include "cuda/kernels.h"
#include "cuda/vmm.h"
#include "transport/store/version_store.h"
#include "util/deadline.h"

namespace weightsync::transport::store {

class GpuTensorDigests {
 public:
  // Prepares the digests of `layout`'s tensors (cut by `segments`) on `queue`'s stream; the
  // queue's device current.
  static Result<GpuTensorDigests> Prepare(const StoreLayout& layout, SegmentLayout segments,
                                          cuda::CopyQueue& queue);
  // Hashes every segment once the work already queued on `caller_stream` (which wrote the
  // tensors) is done, into `digests` (count() words), tied ones copied from their originals.
  Status Run(cuda::CopyQueue& queue, std::span<uint64_t> digests, void* caller_stream,
             const util::Deadline& deadline);
  uint32_t count() const { return count_; }
  size_t segments() const { return segments_; }
  Status Close();  // the queue drained first: the launches write the buffer

 private:
  cuda::DeviceBuffer device_;
  cuda::PreparedDigestGroup group_;
  std::vector<std::pair<uint32_t, uint32_t>> copies_;  // (tied, original)
  uint32_t count_ = 0;
  size_t segments_ = 0;
};

}  // namespace weightsync::transport::store
