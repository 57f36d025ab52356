#include "transport/store/gpu_tensor_digests.h"

#include <algorithm>

namespace weightsync::transport::store {

Result<GpuTensorDigests> GpuTensorDigests::Prepare(const StoreLayout& layout,
                                                   SegmentLayout segments, cuda::CopyQueue& queue) {
  GpuTensorDigests d;
  WS_ASSIGN_OR_RETURN(
      d.device_, cuda::DeviceBuffer::Allocate(std::max<uint64_t>(segments.digest_count, 1) * 8));
  std::vector<cuda::DigestRange> ranges;
  ranges.reserve(segments.segments.size());
  for (const Segment& s : segments.segments) {
    ranges.push_back(
        {layout.tensors[s.tensor].source + s.offset, s.bytes, d.device_.as<uint64_t>() + s.digest});
  }
  WS_ASSIGN_OR_RETURN(d.group_, cuda::PrepareDigestGroup(ranges, queue.stream()));
  d.copies_ = std::move(segments.copies);
  d.count_ = segments.digest_count;
  d.segments_ = segments.segments.size();
  return d;
}

Status GpuTensorDigests::Run(cuda::CopyQueue& queue, std::span<uint64_t> digests,
                             void* caller_stream, const util::Deadline& deadline) {
  // The digests read the tensors once the caller's kernels that wrote them are done.
  WS_RETURN_IF_ERROR(queue.WaitFor(caller_stream));
  WS_RETURN_IF_ERROR(group_.Launch());
  WS_RETURN_IF_ERROR(queue.Enqueue(digests.data(), device_.data(), uint64_t{count_} * 8));
  WS_RETURN_IF_ERROR(queue.Wait(deadline));
  for (auto [tied, original] : copies_) digests[tied] = digests[original];
  return Status::Ok();
}

Status GpuTensorDigests::Close() {
  group_ = cuda::PreparedDigestGroup();
  copies_.clear();
  count_ = 0;
  segments_ = 0;
  return device_.Close();
}

}  // namespace weightsync::transport::store
