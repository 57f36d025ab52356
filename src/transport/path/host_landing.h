// HostLanding: the receiving end of a transfer into host memory — the staging (shadow) buffer of
// staged mode, the worker threads, digest verification and the commit copy. Shared by the
// transports whose bytes land in host memory (shm from a memfd arena, tcp from a socket).
// Prepared once per handle; Verify/Commit allocate nothing.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "plan/plan.h"
#include "plan/ring_cut.h"
#include "transport/path/data_path.h"
#include "transport/view/store_view.h"
#include "util/deadline.h"
#include "util/staging_buffer.h"
#include "util/worker_pool.h"
#include "weightsync/options.h"
#include "weightsync/status.h"
#include "wire/messages.h"

namespace weightsync::transport::path {

// A segment's digest computed on the CPU with the publisher's digest kind (xxh3, or the CPU
// implementation of the GPU digest).
uint64_t HostDigest(wire::DigestKind kind, const uint8_t* data, uint64_t bytes);

class HostLanding {
 public:
  // Allocates the shadow (staged mode) or the landing buffer of converted tensors (in place) and
  // starts `threads` workers. `plan` must outlive this.
  Status Prepare(const plan::Plan* plan, const std::vector<plan::Destination>& destinations,
                 UpdateMode mode, int threads);

  // Where the bytes of segment / planned tensor land this step: the shadow in staged mode; in
  // place, the destination, or the landing buffer for a tensor converted at commit.
  uint8_t* ReceivedBytes(const plan::Segment& s) const {
    if (shadow_.data() != nullptr) return shadow_.data() + s.shadow_offset;
    return s.converted ? landing_.data() + s.landing_offset
                       : destinations_[s.destination] + s.dst_offset;
  }
  uint8_t* ReceivedTensor(const plan::PlannedTensor& t) const {
    if (shadow_.data() != nullptr) return shadow_.data() + t.shadow_offset;
    return t.transform != plan::Transform::kCopy ? landing_.data() + t.landing_offset
                                                 : destinations_[t.destination] + t.dst_offset;
  }

  // Prepares the copy of every segment from `view` (the publisher's store mapped here), unit by
  // unit, in pieces the workers share; then CopyUnit copies what unit `unit` holds (the step's
  // slot, or a ring's bucket, as the view's Step hands it out). A cancelled `deadline`
  // (Subscriber::Cancel/Close) stops each worker before its next piece: Cancelled, with at most
  // one piece per worker still copied after it.
  void PrepareCopies(const view::StoreView& view);
  Status CopyUnit(uint32_t unit, const util::Deadline& deadline);
  // Checks every received segment against `digests` (computed with `kind`). Corruption names the
  // first failing tensor and byte range and counts the failing segments.
  Status Verify(std::span<const uint64_t> digests, wire::DigestKind kind, int64_t step);
  // Staged: shadow → destinations. Both modes: converted tensors are converted into their
  // destinations (the CPU implementations of the GPU transforms), and the pieces of region
  // segments received whole (kExtract) are copied out.
  Status Commit();
  // Staged, the segments listed only (indices into the plan's segments): shadow → destinations.
  // For a step whose other segments reach the destinations another way (delta updates).
  void CommitSegments(std::span<const uint32_t> segments);
  // Where segment `s` of a tensor copied as published lies in its destination.
  uint8_t* DestinationBytes(const plan::Segment& s) const {
    return destinations_[s.destination] + s.dst_offset;
  }
  // Test hook: flips one bit of the received bytes when the fail point fires.
  void MaybeInjectBitFlip();

  util::WorkerPool* workers() { return workers_.get(); }
  // The shadow (staged): every received byte, by the plan's shadow offsets.
  std::span<uint8_t> shadow() const { return {shadow_.data(), shadow_.size()}; }
  // Bytes of the shadow (staged) and of the landing buffer (in place, converted tensors): what
  // Prepare added to the ledger's staging_bytes.
  uint64_t staging_bytes() const { return shadow_.size() + landing_.size(); }
  // The plan's conversions, on the CPU (DataPath::conversion).
  ConversionReport conversion() const { return conversion_; }
  Status Release();  // workers, then the shadow

 private:
  struct CopyPiece {
    uint8_t* dst = nullptr;
    const uint8_t* src = nullptr;
    uint64_t bytes = 0;
  };
  static void CopyPieceOfUnit(void* context, uint32_t index);
  plan::ByBucket<CopyPiece> pieces_;  // by unit of the store view
  uint32_t unit_ = 0;                 // the unit being copied, set before each parallel run
  static void VerifySegment(void* context, uint32_t index);
  static void CommitSegment(void* context, uint32_t index);
  static void CommitListedSegment(void* context, uint32_t index);
  std::span<const uint32_t> listed_;  // CommitSegments' list, set before its parallel run
  static void ConvertTensor(void* context, uint32_t index);
  uint64_t Digest(const plan::Segment& s) const;

  const plan::Plan* plan_ = nullptr;
  std::vector<uint8_t*> destinations_;
  std::vector<std::string> names_;
  util::StagingBuffer shadow_;
  util::StagingBuffer landing_;
  std::vector<Status> convert_status_;  // one per converted tensor, reused every commit
  ConversionReport conversion_;
  std::unique_ptr<util::WorkerPool> workers_;
  // Per-step scratch, set before each parallel run.
  const util::Deadline* copy_deadline_ = nullptr;
  std::atomic<bool> copy_cancelled_{false};
  std::span<const uint64_t> digests_;
  wire::DigestKind digest_kind_ = wire::DigestKind::kXxh3;
  std::atomic<uint32_t> first_mismatch_{0};
};

}  // namespace weightsync::transport::path
