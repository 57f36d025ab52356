#include "transport/path/delta_receiver.h"

#include <algorithm>
#include <limits>

namespace weightsync::transport::path {
namespace {

constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

std::span<const uint8_t> DeltaOf(const util::StagingBuffer& buffer, uint64_t at, uint64_t bytes) {
  return {buffer.data() + at, bytes};
}

}  // namespace

bool DeltaReceiver::Fits(const plan::Plan& plan, const wire::Welcome& welcome,
                         bool keeps_converted_bytes) {
  if (plan.regions) return false;
  for (const plan::PlannedTensor& t : plan.tensors) {
    const bool converted_ok =
        keeps_converted_bytes &&
        (t.transform == plan::Transform::kCast || t.transform == plan::Transform::kQuantizeFp8);
    if ((t.transform != plan::Transform::kCopy && !converted_ok) || t.src_offset != 0 ||
        t.nbytes != welcome.tensors[t.publisher_index].spec.nbytes) {
      return false;
    }
  }
  return true;
}

void DeltaReceiver::Prepare(const plan::Plan* plan, const wire::Welcome* welcome,
                            HostLanding* landing) {
  plan_ = plan;
  landing_ = landing;
  const size_t n = plan->segments.size();
  element_bytes_.assign(n, 1);
  for (const plan::PlannedTensor& t : plan->tensors) {
    const uint32_t e = delta::ElementBytes(welcome->tensors[t.publisher_index].spec.dtype);
    for (uint32_t k = 0; k < t.segment_count; ++k) element_bytes_[t.first_segment + k] = e;
  }
  begin_.bytes.reserve(n);
  planned_base_digests_.assign(n, 0);
  parts_.assign(n, iovec{});
  landing_parts_.assign(n, LandingPart{});
  for (const plan::PlannedTensor& t : plan->tensors) {
    uint64_t offset = t.src_offset;
    for (uint32_t k = 0; k < t.segment_count; ++k) {
      const plan::Segment& segment = plan->segments[t.first_segment + k];
      landing_parts_[t.first_segment + k] = {t.publisher_index, offset,
                                             landing->ReceivedBytes(segment), segment.bytes};
      offset += segment.bytes;
    }
  }
  at_.assign(n, 0);
  shapes_.assign(n, {});
  delta_segments_.reserve(n);
  whole_segments_.reserve(n);
}

void DeltaReceiver::Expect(int64_t base_step, std::span<const uint64_t> base_digests) {
  base_step_ = base_step;
  base_digests_ = base_digests;
}

Status DeltaReceiver::CheckBegin(const std::string& peer, int64_t step) const {
  if (begin_.step != step) {
    return Status::ProtocolError(peer, ": delta_begin for step ", begin_.step, " in step ", step);
  }
  if (begin_.base_step < 0) return Status::Ok();  // every segment whole (DeltaBegin's own check)
  if (begin_.base_step != base_step_) {
    return Status::ProtocolError(peer, ": step ", step, " as deltas against step ",
                                 begin_.base_step, ", but the committed step is ", base_step_);
  }
  if (begin_.bytes.size() != plan_->segments.size()) {
    return Status::ProtocolError(peer, ": step ", step, " delta_begin sizes ", begin_.bytes.size(),
                                 " segments, the selection has ", plan_->segments.size());
  }
  for (size_t i = 0; i < begin_.bytes.size(); ++i) {
    const uint64_t most = delta::MaxDeltaBytes(plan_->segments[i].bytes, element_bytes_[i]);
    if (begin_.bytes[i] > most) {
      return Status::ProtocolError(peer, ": step ", step, " segment ", i, " delta of ",
                                   begin_.bytes[i], " bytes, more than its ",
                                   plan_->segments[i].bytes, "-byte segment can need (", most, ")");
    }
  }
  return Status::Ok();
}

Status DeltaReceiver::ReserveBuffer(uint64_t bytes) {
  if (bytes <= buffer_.size()) return Status::Ok();
  // A quarter more than asked: a step that changed a little more than the last one reuses it.
  WS_RETURN_IF_ERROR(buffer_.Close());
  WS_ASSIGN_OR_RETURN(buffer_, util::StagingBuffer::Allocate(bytes + bytes / 4));
  return Status::Ok();
}

Status DeltaReceiver::Receive(link::Channel& channel, const std::string& peer, int64_t step,
                              const util::Deadline& deadline, LandingObserver* observer) {
  receipt_ = {};
  WS_RETURN_IF_ERROR(channel.ReceiveReply(wire::FrameType::kDeltaBegin, &begin_, deadline));
  WS_RETURN_IF_ERROR(CheckBegin(peer, step));
  const std::vector<plan::Segment>& segments = plan_->segments;
  delta_segments_.clear();
  whole_segments_.clear();
  uint64_t buffer_bytes = 0;
  for (size_t i = 0; begin_.base_step >= 0 && i < segments.size(); ++i) {
    planned_base_digests_[i] = base_digests_[segments[i].digest_index];
    if (begin_.bytes[i] == 0) {
      whole_segments_.push_back(static_cast<uint32_t>(i));
      continue;
    }
    at_[i] = buffer_bytes;
    buffer_bytes += begin_.bytes[i];
    delta_segments_.push_back(static_cast<uint32_t>(i));
  }
  if (begin_.base_step >= 0) {
    // The publisher encoded against the version whose digests these are: ours, or nothing lands.
    const uint64_t ours = wire::DigestOfDigests(planned_base_digests_);
    if (begin_.base_digest != ours) {
      return Status::Corruption(peer, ": step ", step, " came as deltas against step ",
                                begin_.base_step, " of digest ", begin_.base_digest,
                                ", but the committed step's digest is ", ours,
                                ": not applied (the next update asks for whole segments)");
    }
    WS_RETURN_IF_ERROR(ReserveBuffer(buffer_bytes));
  }
  uint64_t received = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const bool as_delta = begin_.base_step >= 0 && begin_.bytes[i] > 0;
    parts_[i] = as_delta ? iovec{buffer_.data() + at_[i], begin_.bytes[i]}
                         : iovec{landing_->ReceivedBytes(segments[i]), segments[i].bytes};
    received += parts_[i].iov_len;
  }
  const bool observed =
      observer != nullptr && begin_.base_step < 0 && observer->Begin(step, landing_parts_);
  Status s = channel.ReadAll(parts_, deadline, observed ? observer : nullptr);
  if (!s.ok()) return s.WithContext("step " + std::to_string(step) + " data");
  if (begin_.base_step >= 0) WS_RETURN_IF_ERROR(CheckAndApply(peer, step));
  receipt_ = {begin_.base_step, static_cast<uint32_t>(delta_segments_.size()), received};
  return Status::Ok();
}

// Every delta is checked before any is applied, on the landing's workers: a malformed one leaves
// the landed bytes as the base (staged: the shadow; in place: the destinations) plus the whole
// segments that came with it.
Status DeltaReceiver::CheckAndApply(const std::string& peer, int64_t step) {
  if (delta_segments_.empty()) return Status::Ok();
  const uint32_t count = static_cast<uint32_t>(delta_segments_.size());
  first_bad_.store(kNone, std::memory_order_relaxed);
  landing_->workers()->Run(count, &DeltaReceiver::CheckSegment, this);
  if (const uint32_t bad = first_bad_.load(std::memory_order_relaxed); bad != kNone) {
    const uint32_t i = delta_segments_[bad];
    Result<delta::DeltaShape> shape = delta::CheckDelta(
        DeltaOf(buffer_, at_[i], begin_.bytes[i]), plan_->segments[i].bytes, element_bytes_[i]);
    return shape.status().WithContext("step " + std::to_string(step) + " segment " +
                                      std::to_string(i) + " delta from " + peer +
                                      ": nothing applied");
  }
  ApplyDeltas(/*to_destinations=*/false);
  return Status::Ok();
}

bool DeltaReceiver::CommitSparse() {
  if (receipt_.base_step < 0) return false;
  landing_->CommitSegments(whole_segments_);
  ApplyDeltas(/*to_destinations=*/true);
  return true;
}

void DeltaReceiver::ApplyDeltas(bool to_destinations) {
  to_destinations_ = to_destinations;
  landing_->workers()->Run(static_cast<uint32_t>(delta_segments_.size()),
                           &DeltaReceiver::ApplySegment, this);
}

void DeltaReceiver::CheckSegment(void* context, uint32_t index) {
  auto* self = static_cast<DeltaReceiver*>(context);
  const uint32_t i = self->delta_segments_[index];
  const Result<delta::DeltaShape> shape =
      delta::CheckDelta(DeltaOf(self->buffer_, self->at_[i], self->begin_.bytes[i]),
                        self->plan_->segments[i].bytes, self->element_bytes_[i]);
  if (shape.ok()) {
    self->shapes_[i] = *shape;
  } else {
    self->RecordBad(index);
  }
}

void DeltaReceiver::RecordBad(uint32_t index) {
  uint32_t seen = first_bad_.load(std::memory_order_relaxed);
  while (index < seen &&
         !first_bad_.compare_exchange_weak(seen, index, std::memory_order_relaxed)) {
  }
}

// Deltas CheckSegment accepted (shapes_), into what landed or, at a sparse commit, the weights.
void DeltaReceiver::ApplySegment(void* context, uint32_t index) {
  auto* self = static_cast<DeltaReceiver*>(context);
  const uint32_t i = self->delta_segments_[index];
  const plan::Segment& s = self->plan_->segments[i];
  uint8_t* to = self->to_destinations_ ? self->landing_->DestinationBytes(s)
                                       : self->landing_->ReceivedBytes(s);
  delta::ApplyCheckedDelta(DeltaOf(self->buffer_, self->at_[i], self->begin_.bytes[i]),
                           self->shapes_[i], self->element_bytes_[i], {to, s.bytes});
}

}  // namespace weightsync::transport::path
