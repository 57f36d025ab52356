#include "transport/path/destination_check.h"

#include <algorithm>

#include "transport/path/host_landing.h"
#include "util/hash.h"
#include "util/logging.h"

namespace weightsync::transport::path {

DestinationCheck::~DestinationCheck() {
  if (Status s = Release(); !s.ok()) WS_LOG(WARN, "subscriber") << "weights check cleanup: " << s;
}

Status DestinationCheck::Prepare(const plan::Plan& plan,
                                 std::span<const plan::Destination> destinations,
                                 wire::DigestKind kind, int threads) {
  WS_RETURN_IF_ERROR(Release());
  kind_ = kind;
  unchecked_.assign(destinations.size(), 0);
  for (const plan::PlannedTensor& t : plan.tensors) {
    // A plain copy in a plan of whole digest segments: each segment lies whole, as published, at
    // dst_offset of its destination. Anything else was transformed or cut out of a segment.
    if (plan.verifiable && t.transform == plan::Transform::kCopy) {
      for (uint32_t i = 0; i < t.segment_count; ++i) {
        const plan::Segment& s = plan.segments[t.first_segment + i];
        pieces_.push_back({destinations[s.destination].data + s.dst_offset, s.bytes, s.digest_index,
                           s.destination, s.dst_offset});
      }
      continue;
    }
    unchecked_[t.destination] = 1;
    if (t.scale_destination != plan::kNoDestination) unchecked_[t.scale_destination] = 1;
    if (t.global_scale_destination != plan::kNoDestination) {
      unchecked_[t.global_scale_destination] = 1;
    }
    for (uint32_t e = 0; e < t.extract_count; ++e) {
      unchecked_[plan.extracts[t.first_extract + e].destination] = 1;
    }
  }
  actual_.assign(pieces_.size(), 0);
  uint64_t largest_cuda_piece = 0;
  for (uint32_t p = 0; p < pieces_.size(); ++p) {
    const Device where = destinations[pieces_[p].destination].device;
    if (!where.is_cuda()) {
      host_.push_back(p);
      continue;
    }
    auto it = std::find_if(devices_.begin(), devices_.end(),
                           [&](const auto& d) { return d->device == where.index; });
    if (it == devices_.end()) {
      devices_.push_back(std::make_unique<OnDevice>());
      devices_.back()->device = where.index;
      it = devices_.end() - 1;
    }
    (*it)->pieces.push_back(p);
    largest_cuda_piece = std::max(largest_cuda_piece, pieces_[p].bytes);
  }
  if (!host_.empty()) workers_ = std::make_unique<util::WorkerPool>(std::max(threads, 1));
  cuda::ScopedDevice restore;
  for (auto& d : devices_) {
    WS_RETURN_IF_ERROR(cuda::SetDevice(d->device));
    WS_ASSIGN_OR_RETURN(d->queue, cuda::CopyQueue::Create(d->device));
    d->host.assign(d->pieces.size(), 0);
    if (kind_ != wire::DigestKind::kGpu64) continue;  // xxh3: bounced to the host
    WS_ASSIGN_OR_RETURN(d->digests, cuda::DeviceBuffer::Allocate(d->pieces.size() * 8));
    std::vector<cuda::DigestRange> ranges;
    ranges.reserve(d->pieces.size());
    for (size_t k = 0; k < d->pieces.size(); ++k) {
      const Piece& p = pieces_[d->pieces[k]];
      ranges.push_back({p.data, p.bytes, d->digests.as<uint64_t>() + k});
    }
    Result<cuda::PreparedDigestGroup> group = cuda::PrepareDigestGroup(ranges, d->queue.stream());
    if (!group.ok()) {
      return group.status().WithContext("weights check on cuda:" + std::to_string(d->device));
    }
    d->group = std::move(group).value();
  }
  if (kind_ == wire::DigestKind::kXxh3) bounce_.resize(largest_cuda_piece);
  prepared_ = true;
  return Status::Ok();
}

void DestinationCheck::HashHostPiece(void* context, uint32_t index) {
  auto* self = static_cast<DestinationCheck*>(context);
  const uint32_t p = self->host_[index];
  const Piece& piece = self->pieces_[p];
  self->actual_[p] = HostDigest(self->kind_, piece.data, piece.bytes);
}

Status DestinationCheck::DigestOnDevice(OnDevice& d, const util::Deadline& deadline) {
  // After what the engine queued on the legacy default stream (where it works unless told
  // otherwise): the weights as its kernels left them.
  WS_RETURN_IF_ERROR(d.queue.WaitFor(nullptr));
  WS_RETURN_IF_ERROR(d.group.Launch());
  WS_RETURN_IF_ERROR(d.queue.Enqueue(d.host.data(), d.digests.data(), d.host.size() * 8));
  return d.queue.Wait(deadline);
}

Status DestinationCheck::BounceToHost(OnDevice& d, const util::Deadline& deadline) {
  WS_RETURN_IF_ERROR(d.queue.WaitFor(nullptr));
  for (size_t k = 0; k < d.pieces.size(); ++k) {
    const Piece& p = pieces_[d.pieces[k]];
    WS_RETURN_IF_ERROR(d.queue.Enqueue(bounce_.data(), p.data, p.bytes));
    WS_RETURN_IF_ERROR(d.queue.Wait(deadline));
    d.host[k] = util::Hash64(bounce_.data(), p.bytes);
  }
  return Status::Ok();
}

Status DestinationCheck::Run(std::span<const uint64_t> digests, const util::Deadline& deadline,
                             std::span<uint64_t> checked_bytes, std::span<uint8_t> unchecked,
                             std::vector<Difference>* differing) {
  if (!prepared_) return Status::FailedPrecondition("weights check run before it was prepared");
  if (!devices_.empty()) {
    cuda::ScopedDevice restore;
    for (auto& d : devices_) {
      WS_RETURN_IF_ERROR(cuda::SetDevice(d->device));
      Status s = kind_ == wire::DigestKind::kGpu64 ? DigestOnDevice(*d, deadline)
                                                   : BounceToHost(*d, deadline);
      WS_RETURN_IF_ERROR(s.WithContext("weights check on cuda:" + std::to_string(d->device)));
      for (size_t k = 0; k < d->pieces.size(); ++k) actual_[d->pieces[k]] = d->host[k];
    }
  }
  if (!host_.empty()) {
    workers_->Run(static_cast<uint32_t>(host_.size()), &DestinationCheck::HashHostPiece, this);
  }
  for (size_t d = 0; d < unchecked_.size() && d < unchecked.size(); ++d) {
    unchecked[d] = unchecked[d] | unchecked_[d];
  }
  // Pieces are in plan order: a destination's segments are consecutive (one tensor; a region
  // plan's destination may be filled by several runs, each then a Difference of its own).
  for (uint32_t p = 0; p < pieces_.size(); ++p) {
    const Piece& piece = pieces_[p];
    if (piece.digest >= digests.size()) {
      return Status::Internal("weights check: digest ", piece.digest, " of ", digests.size());
    }
    checked_bytes[piece.destination] += piece.bytes;
    if (actual_[p] == digests[piece.digest]) continue;
    if (!differing->empty() && differing->back().destination == piece.destination) {
      ++differing->back().segments;
    } else {
      differing->push_back({piece.destination, piece.dst_offset, piece.bytes, 1});
    }
  }
  return Status::Ok();
}

Status DestinationCheck::Release() {
  Status result;
  for (auto& d : devices_) {
    cuda::ScopedDevice restore;
    if (Status s = cuda::SetDevice(d->device); !s.ok()) {
      result.Update(s);
      continue;
    }
    result.Update(d->queue.Drain());  // the digest launches write the buffer
    d->group = cuda::PreparedDigestGroup();
    result.Update(d->digests.Close());
    result.Update(d->queue.Close());
  }
  devices_.clear();
  workers_.reset();
  pieces_.clear();
  actual_.clear();
  host_.clear();
  unchecked_.clear();
  bounce_.clear();
  bounce_.shrink_to_fit();
  prepared_ = false;
  if (!result.ok()) WS_LOG(WARN, "subscriber") << "releasing the weights check: " << result;
  return result;
}

}  // namespace weightsync::transport::path
