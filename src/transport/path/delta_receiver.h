// DeltaReceiver: the subscriber's side of a tcp step sent as deltas (docs/deltas.md). After
// StepBegin, a subscriber that asked for deltas (UpdateRequest::delta) reads a DeltaBegin, checks
// that the publisher encoded against exactly the version it holds, reads each digest segment as
// its delta (into a buffer kept between steps) or whole (straight where it lands), and applies the
// deltas where the segments land — only after every delta proved well formed, so a malformed one
// changes nothing.
//
// Checks, each a clear error naming the publisher and step, before any byte lands:
//   - DeltaBegin for another step, or against another base step   ProtocolError
//   - a segment count that is not the plan's                        ProtocolError
//   - a delta larger than its segment could ever need               ProtocolError
//   - the base's digest is not the digest of the committed digests  Corruption (wrong base)
// and after the bytes arrived, a malformed delta: ProtocolError, nothing applied.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "delta/segment_delta.h"
#include "plan/plan.h"
#include "transport/link/channel.h"
#include "transport/path/data_path.h"
#include "transport/path/host_landing.h"
#include "util/deadline.h"
#include "util/staging_buffer.h"
#include "weightsync/status.h"
#include "wire/messages.h"

namespace weightsync::transport::path {

class DeltaReceiver {
 public:
  // Whether `plan` can take deltas: no regions, every planned tensor a whole published tensor
  // copied as published (a delta describes the published bytes, so a conversion needs them all).
  // `keeps_converted_bytes`: the path keeps every converted tensor's published bytes whole where
  // they land and converts from there (tcp-to-gpu's mirror), so converted tensors fit too.
  static bool Fits(const plan::Plan& plan, const wire::Welcome& welcome,
                   bool keeps_converted_bytes = false);

  // Sizes the per-step scratch for `plan` (which, with `welcome` and `landing`, outlives this).
  void Prepare(const plan::Plan* plan, const wire::Welcome* welcome, HostLanding* landing);
  // The committed step and its digests (every publisher digest, by digest index) the next step's
  // deltas must be computed against; -1: no deltas asked.
  void Expect(int64_t base_step, std::span<const uint64_t> base_digests);
  bool expected() const { return base_step_ >= 0; }

  // Reads the step's DeltaBegin and bytes from `channel` and lands them (landing's received
  // bytes): whole segments as they are, deltas applied onto what the landing holds. A step that
  // comes whole is shown to `observer` (cut-through relays; may be null) as it lands.
  Status Receive(link::Channel& channel, const std::string& peer, int64_t step,
                 const util::Deadline& deadline, LandingObserver* observer = nullptr);
  const DeltaReceipt& receipt() const { return receipt_; }
  // Staged, after the step's bytes were verified in the shadow: writes them into the destinations,
  // which hold the base as the shadow did (the core asks for deltas only then) — each delta
  // applied again there, each segment that came whole copied from the shadow. Writes what
  // changed, not the model. False when this step came whole (commit the shadow as usual).
  bool CommitSparse();
  // The buffer deltas are read into: grown at the first step that needs more, then reused.
  uint64_t buffer_bytes() const { return buffer_.size(); }
  Status Release() { return buffer_.Close(); }

 private:
  Status CheckBegin(const std::string& peer, int64_t step) const;
  Status ReserveBuffer(uint64_t bytes);
  Status CheckAndApply(const std::string& peer, int64_t step);
  static void CheckSegment(void* context, uint32_t index);
  void ApplyDeltas(bool to_destinations);
  static void ApplySegment(void* context, uint32_t index);
  void RecordBad(uint32_t index);

  const plan::Plan* plan_ = nullptr;
  HostLanding* landing_ = nullptr;
  std::vector<uint32_t> element_bytes_;  // per plan segment
  int64_t base_step_ = -1;
  std::span<const uint64_t> base_digests_;
  // Per step, sized at Prepare: the DeltaBegin, the base's digests of the planned segments, the
  // read's parts, each delta's place in the buffer, the segments that came as deltas.
  wire::DeltaBegin begin_;
  std::vector<uint64_t> planned_base_digests_;
  std::vector<iovec> parts_;
  std::vector<LandingPart> landing_parts_;  // a whole step's parts_ as a LandingObserver sees them
  std::vector<uint64_t> at_;
  std::vector<delta::DeltaShape> shapes_;  // per plan segment, as CheckSegment found it
  std::vector<uint32_t> delta_segments_;
  std::vector<uint32_t> whole_segments_;  // the step's other segments (it came as deltas)
  util::StagingBuffer buffer_;
  bool to_destinations_ = false;        // ApplyDeltas' target, set before its parallel run
  std::atomic<uint32_t> first_bad_{0};  // the lowest index in delta_segments_ that failed
  DeltaReceipt receipt_;
};

}  // namespace weightsync::transport::path
