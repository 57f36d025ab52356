#include "transport/path/host_to_gpu_path.h"

#include <algorithm>

#include "cuda/device.h"
#include "cuda/gpu_digest_reference.h"
#include "plan/ring_cut.h"
#include "transport/link/step_exchange.h"
#include "transport/path/host_landing.h"
#include "transport/path/ring_copies.h"
#include "util/fail_point.h"
#include "util/logging.h"
#include "util/worker_pool.h"

namespace weightsync::transport::path {

HostToGpuPath::~HostToGpuPath() {
  if (Status s = Release(); !s.ok()) WS_LOG(WARN, "shm") << "path cleanup: " << s;
}

Status HostToGpuPath::Available(const PathContext& ctx) {
  return cuda::CudaAvailable().WithContext(
      ctx.link->peer() + " keeps its arena in host memory and the destinations are CUDA tensors");
}

Status HostToGpuPath::Prepare(const PathContext& ctx) {
  const std::vector<plan::Destination>& destinations = *ctx.destinations;
  const wire::Welcome& welcome = *ctx.welcome;
  const plan::Plan* plan = ctx.plan;
  const std::string& peer = ctx.link->peer();
  util::UniqueFd fd = std::move(*ctx.store_fd);
  WS_RETURN_IF_ERROR(store::CheckImportedSegment(fd.get(), welcome.arena_bytes).WithContext(peer));
  WS_ASSIGN_OR_RETURN(mapping_, store::Mapping::Map(fd.get(), welcome.arena_bytes,
                                                    /*writable=*/false, "arena of " + peer));
  WS_RETURN_IF_ERROR(fd.Close());  // the mapping keeps the memory alive
  const uint8_t* arena = mapping_.data();
  const UpdateMode mode = ctx.mode;
  const int threads = ctx.HashingThreads();
  WS_ASSIGN_OR_RETURN(int device, GpuLanding::DestinationDevice(destinations, "shm"));
  plan_ = plan;
  arena_ = arena;
  welcome_ = &welcome;
  names_.clear();
  for (const plan::Destination& d : destinations) names_.push_back(d.spec.name);
  cuda::ScopedDevice restore;
  WS_RETURN_IF_ERROR(cuda::SetDevice(device));
  // Pinned once: the copy engines read the published slots directly (read-only, like the mapping).
  Result<cuda::HostRegistration> pin = cuda::HostRegistration::Register(arena, welcome.arena_bytes,
                                                                        /*read_only=*/true);
  if (pin.ok()) {
    pinned_ = std::move(pin).value();
    pageable_reason_.clear();
  } else {
    pageable_reason_ = pin.status().ToString();
    WS_LOG(INFO, "shm") << "the arena stays pageable (copies to cuda:" << device
                        << " go through the driver's bounce buffers): " << pin.status();
  }
  WS_RETURN_IF_ERROR(receiver_.Prepare(plan, destinations, mode, device));
  uint32_t digests = 0;
  for (const plan::Segment& s : plan->segments) digests = std::max(digests, s.digest_index + 1);
  published_kind_.assign(plan->segments.size(), 0);
  gpu_kind_.assign(digests, 0);
  workers_ = std::make_unique<util::WorkerPool>(std::max(threads, 1));
  link_ = ctx.link;
  if (welcome.arena_kind == wire::ArenaKind::kHostRing) {
    PrepareRing(welcome, *plan, ctx.options->verify);
    return Status::Ok();
  }
  const uint8_t* direct = arena + welcome.direct_offset;
  slot_batches_.assign(welcome.slot_count, {});
  for (uint32_t k = 0; k < welcome.slot_count; ++k) {
    const uint8_t* slot = arena + welcome.slots_offset + uint64_t{k} * welcome.slot_bytes;
    for (const plan::PlannedTensor& t : plan->tensors) {
      if (t.nbytes == 0) continue;
      const wire::TensorPlacement& p = welcome.tensors[t.publisher_index];
      slot_batches_[k].Add(
          receiver_.Received(t),
          (p.region == wire::Region::kSlot ? slot : direct) + p.offset + t.src_offset, t.nbytes,
          t.destination);
    }
  }
  return Status::Ok();
}

void HostToGpuPath::PrepareRing(const wire::Welcome& welcome, const plan::Plan& plan, bool verify) {
  const uint8_t* ring = arena_ + welcome.slots_offset;
  slot_batches_ = RingCopyBatches(
      welcome, plan, ring, [&](const plan::PlannedTensor& t) { return receiver_.Received(t); });
  // What a verified step hashes, bucket by bucket: each segment's bytes in the bucket, uncut, so
  // that a segment's stream is fed in order by one worker at a time (a bucket's pieces are of
  // different segments and hashed in parallel).
  ring_pieces_ = plan::CutSegmentsAtBuckets(plan.segments, welcome.slot_bytes,
                                            welcome.version_buckets, UINT64_MAX);
  // ~700 bytes a segment: made here when the subscriber verifies, else at the first update that
  // asks for it (Update's verify override), once.
  streams_ = {};
  if (verify) streams_.assign(plan.segments.size(), SegmentStreams{});
}

void HostToGpuPath::HashRingPiece(void* context, uint32_t index) {
  auto* self = static_cast<HostToGpuPath*>(context);
  const plan::SegmentPiece& p = self->ring_pieces_.begin(self->ring_bucket_)[index];
  const uint8_t* src = self->slot_base_ + p.offset;
  SegmentStreams& streams = self->streams_[p.segment];
  if (self->welcome_->digest_kind == wire::DigestKind::kXxh3) {
    streams.published.Update(src, p.bytes);
  }
  streams.gpu.Update(src, p.bytes);
}

Status HostToGpuPath::CopyFromRing(const wire::StepBegin& begin, bool verify,
                                   const util::Deadline& deadline) {
  if (verify) {
    if (streams_.size() != plan_->segments.size()) {
      streams_.assign(plan_->segments.size(), SegmentStreams{});
    }
    for (SegmentStreams& s : streams_) {
      s.published.Reset();
      s.gpu.Reset();
    }
  }
  const uint8_t* ring = arena_ + welcome_->slots_offset;
  WS_RETURN_IF_ERROR(link::ReadRingBuckets(
      link_->channel(), link_->peer(), begin.step, welcome_->version_buckets, welcome_->slot_count,
      deadline, [&](uint32_t b, uint32_t slot) {
        WS_RETURN_IF_ERROR(receiver_.queue().EnqueueBatch(slot_batches_[b]));
        if (verify) {  // while the copy engines read the bucket, the CPU hashes it
          ring_bucket_ = b;
          slot_base_ = ring + uint64_t{slot} * welcome_->slot_bytes;
          workers_->Run(ring_pieces_.count(b), &HostToGpuPath::HashRingPiece, this);
        }
        return receiver_.queue().Wait(deadline);  // the slot is refilled once answered
      }));
  if (verify) {
    const bool gpu_kind = welcome_->digest_kind == wire::DigestKind::kGpu64;
    for (size_t i = 0; i < streams_.size(); ++i) {
      const uint64_t gpu = streams_[i].gpu.Finish();
      published_kind_[i] = gpu_kind ? gpu : streams_[i].published.Finish();
      gpu_kind_[plan_->segments[i].digest_index] = gpu;
    }
  }
  return receiver_.MaybeInjectBitFlip();
}

void HostToGpuPath::HashSegment(void* context, uint32_t index) {
  auto* self = static_cast<HostToGpuPath*>(context);
  const plan::Segment& s = self->plan_->segments[index];
  const uint8_t* src =
      (s.region == wire::Region::kSlot ? self->slot_base_
                                       : self->arena_ + self->welcome_->direct_offset) +
      s.src_offset;
  self->published_kind_[index] = HostDigest(self->welcome_->digest_kind, src, s.bytes);
  self->gpu_kind_[s.digest_index] = cuda::GpuDigest(src, s.bytes);
}

Status HostToGpuPath::Copy(const wire::StepBegin& begin, bool verify,
                           const util::Deadline& deadline) {
  cuda::ScopedDevice restore;
  WS_RETURN_IF_ERROR(cuda::SetDevice(receiver_.device()));
  if (welcome_->arena_kind == wire::ArenaKind::kHostRing) {
    return CopyFromRing(begin, verify, deadline);
  }
  const uint32_t slot = begin.slot;
  if (slot >= slot_batches_.size()) {
    return Status::Internal("shm: slot ", slot, " of ", slot_batches_.size());
  }
  WS_RETURN_IF_ERROR(receiver_.queue().EnqueueBatch(slot_batches_[slot]));
  if (verify) {
    // While the copy engines read the slot, the CPU hashes the same bytes (still pinned by the
    // publisher until this step's copy_done).
    slot_base_ = arena_ + welcome_->slots_offset + uint64_t{slot} * welcome_->slot_bytes;
    workers_->Run(static_cast<uint32_t>(plan_->segments.size()), &HostToGpuPath::HashSegment, this);
  }
  WS_RETURN_IF_ERROR(receiver_.queue().Wait(deadline));
  return receiver_.MaybeInjectBitFlip();
}

Status HostToGpuPath::Verify(std::span<const uint64_t> digests, int64_t step,
                             const util::Deadline& deadline) {
  WS_RETURN_IF_ERROR(plan::CheckVerifiable(*plan_, step));
  // Test hook: the arena's bytes as read here differ from what was published.
  if (util::FailPoints::Check("shm.arena_digest_flip").action == util::FailAction::kFlip &&
      !published_kind_.empty()) {
    published_kind_[published_kind_.size() / 2] ^= 1;
  }
  // First hop: what the publisher published, as this process read it from the arena.
  size_t bad = 0, first = plan_->segments.size();
  for (size_t i = 0; i < plan_->segments.size(); ++i) {
    if (published_kind_[i] != digests[plan_->segments[i].digest_index]) {
      ++bad;
      first = std::min(first, i);
    }
  }
  if (bad > 0) {
    const plan::Segment& s = plan_->segments[first];
    return Status::Corruption("step ", step, ": tensor '", names_[s.destination], "' ",
                              s.converted ? "published bytes [" : "bytes [", s.dst_offset, ", ",
                              s.dst_offset + s.bytes, ") (segment ", s.digest_index,
                              ") as read from the publisher's arena do not match its digest; ", bad,
                              " corrupt segment(s) in all; nothing committed");
  }
  // Second hop: what landed on the GPU, against the same source bytes (hashed here with the GPU
  // digest while they were copied).
  cuda::ScopedDevice restore;
  Status s = receiver_.Verify(gpu_kind_, step, deadline);
  if (s.ok()) return s;  // the success path builds no string
  return s.WithContext("the copy to cuda:" + std::to_string(receiver_.device()) +
                       " checked against this process's hash of the arena");
}

Status HostToGpuPath::Commit(const util::Deadline& deadline) {
  cuda::ScopedDevice restore;
  return receiver_.Commit(deadline);
}

Status HostToGpuPath::Release() {
  if (plan_ == nullptr) return mapping_.Close();  // no GPU state yet: no CUDA call at all
  Status result;
  // Reverse order of creation: nothing may still read the pinned arena when it is unpinned, so the
  // receiver (its stream, synchronized on close) goes first.
  slot_batches_.clear();
  {
    cuda::ScopedDevice restore;
    result.Update(receiver_.Release());
  }
  result.Update(pinned_.Close());
  workers_.reset();
  streams_ = {};
  ring_pieces_ = {};
  plan_ = nullptr;
  arena_ = nullptr;
  welcome_ = nullptr;
  link_ = nullptr;
  pageable_reason_.clear();
  names_.clear();
  result.Update(mapping_.Close());  // after the unpin
  return result;
}

std::string HostToGpuPath::Describe() const {
  const std::string from = welcome_ != nullptr && welcome_->arena_kind == wire::ArenaKind::kHostRing
                               ? ", " + RingText(*welcome_, "host")
                               : ", host arena";
  return from + " into cuda:" + std::to_string(receiver_.device()) +
         (pageable_reason_.empty() ? " from pinned memory"
                                   : " from pageable memory (" + pageable_reason_ + ")");
}

}  // namespace weightsync::transport::path
