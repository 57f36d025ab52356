#include "transport/path/host_landing.h"

#include <algorithm>
#include <cstring>

#include "cuda/block_scaled_reference.h"
#include "cuda/gpu_digest_reference.h"
#include "cuda/transform_reference.h"
#include "plan/block_scaled_plan.h"
#include "util/fail_point.h"
#include "util/hash.h"

namespace weightsync::transport::path {
namespace {

// MXFP8 or NVFP4 (plan/block_scaled_plan.h) with the CPU reference: values into `dst`, scales into
// `scales` in the destination's layout, NVFP4's float32 global scale into `global`.
Status QuantizeBlockScaled(const plan::PlannedTensor& t, const uint8_t* src, uint8_t* dst,
                           uint8_t* scales, uint8_t* global) {
  const cuda::ScaleLayout layout = plan::ScaleLayoutOf(t.scale_layout);
  if (t.transform == plan::Transform::kQuantizeMxfp8) {
    return cuda::reference::QuantizeMxfp8(t.from, src, t.rows, t.cols, dst, scales, layout);
  }
  float global_scale = 1.0f;
  WS_RETURN_IF_ERROR(cuda::reference::QuantizeNvfp4(t.from, src, t.rows, t.cols, dst, scales,
                                                    &global_scale, layout));
  std::memcpy(global, &global_scale, sizeof(global_scale));
  return Status::Ok();
}
constexpr uint32_t kNoMismatch = 0xFFFFFFFFu;
}  // namespace

Status HostLanding::Prepare(const plan::Plan* plan,
                            const std::vector<plan::Destination>& destinations, UpdateMode mode,
                            int threads) {
  plan_ = plan;
  destinations_.clear();
  names_.clear();
  for (const auto& d : destinations) {
    destinations_.push_back(d.data);
    names_.push_back(d.spec.name);
  }
  if (mode == UpdateMode::kStaged) {
    WS_ASSIGN_OR_RETURN(shadow_, util::StagingBuffer::Allocate(plan->shadow_bytes));
  } else if (plan->landing_bytes > 0) {
    WS_ASSIGN_OR_RETURN(landing_, util::StagingBuffer::Allocate(plan->landing_bytes));
  }
  convert_status_.assign(plan->converted.size(), Status::Ok());
  const plan::ConvertedFootprint converted = plan::ConvertedOf(*plan);
  conversion_ = {converted.tensors, converted.bytes,
                 converted.tensors > 0 ? ConvertedOn::kHost : ConvertedOn::kNone, -1};
  threads = std::max(1, threads);
  workers_ = std::make_unique<util::WorkerPool>(threads);
  return Status::Ok();
}

void HostLanding::PrepareCopies(const view::StoreView& view) {
  // Large segments split so that a unit (a ring's bucket, or a whole slot) keeps every worker busy.
  constexpr uint64_t kPieceBytes = 4ull << 20;
  std::vector<std::vector<CopyPiece>> by_unit(view.units());
  std::vector<view::Piece> cut;
  for (uint32_t u = 0; u < view.units(); ++u) {
    for (const plan::Segment& s : plan_->segments) {
      cut.clear();
      view.Cut(u, s.region, s.src_offset, s.bytes, kPieceBytes, &cut);
      for (const view::Piece& p : cut)
        by_unit[u].push_back({ReceivedBytes(s) + p.at, p.src, p.bytes});
    }
  }
  pieces_ = plan::ByBucket<CopyPiece>::From(by_unit);
}

void HostLanding::CopyPieceOfUnit(void* context, uint32_t index) {
  auto* self = static_cast<HostLanding*>(context);
  // Relaxed: the flag only stops further copies; Run's join publishes it to the caller.
  if (self->copy_deadline_->cancelled()) {
    self->copy_cancelled_.store(true, std::memory_order_relaxed);
    return;
  }
  const CopyPiece& p = self->pieces_.begin(self->unit_)[index];
  std::memcpy(p.dst, p.src, p.bytes);
  util::FailPoints::Check("host_landing.after_segment");  // tests: sleep:<ms> slows the copy
}

Status HostLanding::CopyUnit(uint32_t unit, const util::Deadline& deadline) {
  unit_ = unit;
  copy_deadline_ = &deadline;
  copy_cancelled_.store(false, std::memory_order_relaxed);
  workers_->Run(pieces_.count(unit), &HostLanding::CopyPieceOfUnit, this);
  copy_deadline_ = nullptr;
  if (copy_cancelled_.load(std::memory_order_relaxed)) {
    return Status::Cancelled("copying from the publisher's shared memory: cancelled");
  }
  return Status::Ok();
}

uint64_t HostDigest(wire::DigestKind kind, const uint8_t* data, uint64_t bytes) {
  return kind == wire::DigestKind::kXxh3 ? util::Hash64(data, bytes) : cuda::GpuDigest(data, bytes);
}

uint64_t HostLanding::Digest(const plan::Segment& s) const {
  return HostDigest(digest_kind_, ReceivedBytes(s), s.bytes);
}

void HostLanding::VerifySegment(void* context, uint32_t index) {
  auto* self = static_cast<HostLanding*>(context);
  const plan::Segment& s = self->plan_->segments[index];
  if (self->Digest(s) != self->digests_[s.digest_index]) {
    uint32_t seen = self->first_mismatch_.load(std::memory_order_relaxed);
    // Keep the lowest failing segment so the error is deterministic.
    while (index < seen &&
           !self->first_mismatch_.compare_exchange_weak(seen, index, std::memory_order_relaxed)) {
    }
  }
}

void HostLanding::MaybeInjectBitFlip() {
  if (util::FailPoints::Check("subscriber.flip_received").action == util::FailAction::kFlip &&
      !plan_->segments.empty()) {
    const plan::Segment& s = plan_->segments[plan_->segments.size() / 2];
    if (s.bytes > 0) ReceivedBytes(s)[s.bytes / 2] ^= 0x04;  // one bit, as a bad DIMM would
  }
}

Status HostLanding::Verify(std::span<const uint64_t> digests, wire::DigestKind kind, int64_t step) {
  WS_RETURN_IF_ERROR(plan::CheckVerifiable(*plan_, step));
  digests_ = digests;
  digest_kind_ = kind;
  first_mismatch_.store(kNoMismatch, std::memory_order_relaxed);
  workers_->Run(static_cast<uint32_t>(plan_->segments.size()), &HostLanding::VerifySegment, this);
  const uint32_t bad = first_mismatch_.load(std::memory_order_relaxed);
  if (bad == kNoMismatch) return Status::Ok();
  // The failure path may take its time: count every corrupt segment for the message.
  size_t count = 0;
  for (const auto& s : plan_->segments) count += Digest(s) != digests[s.digest_index];
  const plan::Segment& s = plan_->segments[bad];
  if (plan_->regions) {
    // Regions: the segment is a range of a published tensor, read for one or more destinations.
    return Status::Corruption("step ", step, ": published bytes read for tensor '",
                              names_[s.destination], "' (segment ", s.digest_index, ", ", s.bytes,
                              " bytes) do not match the publisher's digest; ", count,
                              " corrupt segment(s) in all; nothing committed");
  }
  // Offsets are into the tensor as published (for a converted tensor, before converting).
  return Status::Corruption("step ", step, ": tensor '", names_[s.destination], "' ",
                            s.converted ? "published bytes [" : "bytes [", s.dst_offset, ", ",
                            s.dst_offset + s.bytes, ") (segment ", s.digest_index,
                            ") do not match the publisher's digest; ", count,
                            " corrupt segment(s) in all; nothing committed");
}

void HostLanding::CommitSegment(void* context, uint32_t index) {
  auto* self = static_cast<HostLanding*>(context);
  const plan::Segment& s = self->plan_->segments[index];
  if (s.converted) return;  // ConvertTensor writes it
  std::memcpy(self->destinations_[s.destination] + s.dst_offset,
              self->shadow_.data() + s.shadow_offset, s.bytes);
}

void HostLanding::CommitSegments(std::span<const uint32_t> segments) {
  if (shadow_.data() == nullptr || segments.empty()) return;
  listed_ = segments;
  workers_->Run(static_cast<uint32_t>(segments.size()), &HostLanding::CommitListedSegment, this);
}

void HostLanding::CommitListedSegment(void* context, uint32_t index) {
  auto* self = static_cast<HostLanding*>(context);
  CommitSegment(context, self->listed_[index]);
}

void HostLanding::ConvertTensor(void* context, uint32_t index) {
  auto* self = static_cast<HostLanding*>(context);
  const plan::PlannedTensor& t = self->plan_->tensors[self->plan_->converted[index]];
  const uint8_t* src = self->ReceivedTensor(t);
  uint8_t* dst = self->destinations_[t.destination];
  Status& out = self->convert_status_[index];
  if (t.transform == plan::Transform::kExtract) {
    for (uint32_t e = 0; e < t.extract_count && out.ok(); ++e) {
      const plan::Extract& piece = self->plan_->extracts[t.first_extract + e];
      uint8_t* into = self->destinations_[piece.destination] + piece.dst_offset;
      if (piece.to == t.from) {
        std::memcpy(into, src + piece.offset, piece.bytes);
      } else {
        out = cuda::reference::Cast(t.from, piece.to, src + piece.offset, into,
                                    piece.bytes / (Info(t.from).bits / 8));
      }
    }
    return;
  }
  if (t.transform == plan::Transform::kCast) {
    // Regions: a run of the destination (dst_offset); whole tensors: all of it (offset 0).
    out = cuda::reference::Cast(t.from, t.to, src, dst + t.dst_offset, t.elements);
  } else if (t.transform == plan::Transform::kQuantizeFp8) {
    out = cuda::reference::QuantizeFp8(
        reinterpret_cast<const uint16_t*>(src), t.rows, t.cols, dst,
        self->destinations_[t.scale_destination],
        t.e8m0_scales ? cuda::Fp8ScaleFormat::kE8M0 : cuda::Fp8ScaleFormat::kFloat32);
  } else {
    out = QuantizeBlockScaled(t, src, dst, self->destinations_[t.scale_destination],
                              t.global_scale_destination == plan::kNoDestination
                                  ? nullptr
                                  : self->destinations_[t.global_scale_destination]);
  }
}

Status HostLanding::Commit() {
  if (shadow_.data() != nullptr) {
    workers_->Run(static_cast<uint32_t>(plan_->segments.size()), &HostLanding::CommitSegment, this);
  }
  if (plan_->converted.empty()) return Status::Ok();
  workers_->Run(static_cast<uint32_t>(plan_->converted.size()), &HostLanding::ConvertTensor, this);
  for (size_t i = 0; i < convert_status_.size(); ++i) {
    if (!convert_status_[i].ok()) {
      const plan::PlannedTensor& t = plan_->tensors[plan_->converted[i]];
      return convert_status_[i].WithContext("converting '" + names_[t.destination] + "' (" +
                                            plan::TransformName(t.transform) + ")");
    }
  }
  return Status::Ok();
}

Status HostLanding::Release() {
  workers_.reset();
  Status result = landing_.Close();
  result.Update(shadow_.Close());
  return result;
}

}  // namespace weightsync::transport::path
