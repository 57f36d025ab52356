#include "transport/path/host_to_gpu_path.h"

#include <algorithm>

#include "cuda/device.h"
#include "cuda/gpu_digest_reference.h"
#include "transport/path/host_landing.h"
#include "transport/path/unit_copies.h"
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
  WS_ASSIGN_OR_RETURN(view_, view::MapHostStore(welcome, std::move(*ctx.store_fd), ctx.link));
  const UpdateMode mode = ctx.mode;
  const int threads = ctx.HashingThreads();
  WS_ASSIGN_OR_RETURN(int device, GpuLanding::DestinationDevice(destinations, "shm"));
  plan_ = plan;
  welcome_ = &welcome;
  names_.clear();
  for (const plan::Destination& d : destinations) names_.push_back(d.spec.name);
  cuda::ScopedDevice restore;
  WS_RETURN_IF_ERROR(cuda::SetDevice(device));
  // Pinned once: the copy engines read the published units directly (read-only, like the mapping).
  pinned_.Pin(view_->host_memory(), /*read_only=*/true, device, "the arena");
  WS_RETURN_IF_ERROR(receiver_.Prepare(plan, destinations, mode, device));
  published_kind_.assign(plan->segments.size(), 0);
  gpu_kind_.assign(plan->digest_count, 0);  // by digest index, as GpuLanding::Verify reads it
  workers_ = std::make_unique<util::WorkerPool>(std::max(threads, 1));
  // Per unit of the store (a slot, or a ring's bucket): one copy batch of every planned tensor's
  // bytes it holds, and what it holds of each segment, hashed while the copy engines read it.
  unit_batches_ = UnitCopyBatches(
      *view_, welcome, *plan, [&](const plan::PlannedTensor& t) { return receiver_.Received(t); });
  std::vector<std::vector<HashPiece>> hashed(view_->units());
  std::vector<view::Piece> cut;
  for (uint32_t u = 0; u < view_->units(); ++u) {
    for (uint32_t i = 0; i < plan->segments.size(); ++i) {
      const plan::Segment& s = plan->segments[i];
      cut.clear();
      view_->Cut(u, s.region, s.src_offset, s.bytes, 0, &cut);  // one piece a unit, uncut
      for (const view::Piece& piece : cut) hashed[u].push_back({i, piece.src, piece.bytes});
    }
  }
  hash_pieces_ = plan::ByBucket<HashPiece>::From(hashed);
  // ~700 bytes a segment: made here when the subscriber verifies, else at the first update that
  // asks for it (Update's verify override), once.
  streams_ = {};
  if (ctx.options->verify) streams_.assign(plan->segments.size(), SegmentStreams{});
  return Status::Ok();
}

// A unit's bytes of one segment, fed in order into that segment's digests: one worker a segment
// at a time (a unit's pieces are of different segments, hashed in parallel).
void HostToGpuPath::HashPieceOfUnit(void* context, uint32_t index) {
  auto* self = static_cast<HostToGpuPath*>(context);
  const HashPiece& p = self->hash_pieces_.begin(self->unit_)[index];
  SegmentStreams& streams = self->streams_[p.segment];
  if (self->welcome_->digest_kind == wire::DigestKind::kXxh3) {
    streams.published.Update(p.src, p.bytes);
  }
  streams.gpu.Update(p.src, p.bytes);
}

Status HostToGpuPath::Copy(const wire::StepBegin& begin, bool verify,
                           const util::Deadline& deadline) {
  cuda::ScopedDevice restore;
  WS_RETURN_IF_ERROR(cuda::SetDevice(receiver_.device()));
  if (verify) {
    if (streams_.size() != plan_->segments.size()) {
      streams_.assign(plan_->segments.size(), SegmentStreams{});
    }
    for (SegmentStreams& s : streams_) {
      s.published.Reset();
      s.gpu.Reset();
    }
  }
  WS_RETURN_IF_ERROR(view_->Step(begin, deadline, [&](uint32_t unit) {
    WS_RETURN_IF_ERROR(receiver_.queue().EnqueueBatch(unit_batches_[unit]));
    if (verify) {  // while the copy engines read the unit, the CPU hashes the same bytes
      unit_ = unit;
      workers_->Run(hash_pieces_.count(unit), &HostToGpuPath::HashPieceOfUnit, this);
    }
    // Done before the unit is answered: a ring's slot is refilled once it is.
    return receiver_.queue().Wait(deadline);
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
  if (plan_ == nullptr) {  // no GPU state yet: no CUDA call at all
    Status s = view_ ? view_->Release() : Status::Ok();
    view_.reset();
    return s;
  }
  Status result;
  // Reverse order of creation: nothing may still read the pinned store when it is unpinned, so
  // the receiver (its stream, synchronized on close) goes first.
  unit_batches_.clear();
  {
    cuda::ScopedDevice restore;
    result.Update(receiver_.Release());
  }
  result.Update(pinned_.Close());
  workers_.reset();
  streams_ = {};
  hash_pieces_ = {};
  plan_ = nullptr;
  welcome_ = nullptr;
  names_.clear();
  if (view_) result.Update(view_->Release());  // after the unpin
  view_.reset();
  return result;
}

std::string HostToGpuPath::Describe() const {
  return (view_ ? view_->Describe() : std::string()) +
         " into cuda:" + std::to_string(receiver_.device()) + pinned_.Describe();
}

}  // namespace weightsync::transport::path
