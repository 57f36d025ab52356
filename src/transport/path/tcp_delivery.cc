#include "transport/path/tcp_delivery.h"

#include <sys/uio.h>

#include <algorithm>
#include <vector>

#include "cuda/nccl_link.h"
#include "transport/path/nccl_path.h"
#include "util/fail_point.h"
#include "util/logging.h"

namespace weightsync::transport::path {
namespace {

using link::Channel;
using link::Pin;
using link::SessionConfig;
using link::StepDelivery;
using link::VersionSource;
using util::Deadline;

// A host store's step: the selected byte ranges, in Select order, straight from the pinned
// version (scatter-gather send, no staging copy). Prepared once per session. From a host ring
// publisher the version is its registered tensors: sent from them (fenced by BeginWrite), the
// ring itself unused — the socket already bounds what is in flight.
//
// A subscriber that asked for a delta (UpdateRequest::delta, docs/deltas.md) gets a delta_begin
// first. When the store encoded the pinned version against exactly the subscriber's committed
// step, and the subscriber selected whole tensors (the digest segments the deltas are cut by),
// each segment then goes as its delta where there is one; otherwise delta_begin says "no delta"
// and every byte goes as above.
//
// A version still landing (a cut-through relay's, Pin::progress) goes whole, each range as far
// as it landed, then waits for the rest; the step ends once the relay has the trainer's digests.
class SocketDelivery final : public StepDelivery {
 public:
  SocketDelivery(const wire::Welcome& welcome, const wire::Select& select, VersionSource* source)
      : welcome_(welcome),
        select_(select),
        source_(source),
        base_(source->arena_base()),
        parts_(select.ranges.size()),
        from_tensors_(source->VersionIsTensors()) {
    // From the tensors, every step sends the same ranges.
    for (size_t i = 0; from_tensors_ && i < parts_.size(); ++i) {
      const wire::SelectRange& range = select.ranges[i];
      parts_[i] = {const_cast<uint8_t*>(source->TensorBytes(range.tensor) + range.offset),
                   range.bytes};
    }
    if (!from_tensors_) CutSelectionIntoSegments();
  }
  bool WholeVersion() const override { return true; }
  Status Deliver(const Pin& pin, const wire::UpdateRequest& request, Channel& ch,
                 const Deadline& deadline, bool* streaming) override {
    const wire::StepBegin& begin = pin.begin;
    const uint64_t slot_base = welcome_.slots_offset + uint64_t{begin.slot} * welcome_.slot_bytes;
    // Tests: sleep:<ms> holds a session that pinned its step before it sends (a relay stalled or
    // killed mid-serve).
    (void)util::FailPoints::Check("publisher.before_send");
    if (pin.progress != nullptr) {
      return DeliverLanding(begin, *pin.progress, request, slot_base, ch, deadline, streaming);
    }
    if (request.delta) {
      // Only a delta against the step the subscriber holds (the source waits for its encode).
      const store::SlotDelta* delta = nullptr;
      if (!segments_.empty()) {
        // An encode that outlasts half of the session's time for the step (the subscriber's
        // wait): the step goes whole on the time left rather than failing with Timeout.
        const Deadline encode_deadline =
            deadline.Sooner(std::chrono::milliseconds(deadline.RemainingMs() / 2));
        Result<const store::SlotDelta*> awaited =
            source_->AwaitDelta(pin, request.after_step, encode_deadline);
        if (awaited.ok()) {
          delta = *awaited;
        } else if (awaited.status().code() != StatusCode::kTimeout) {
          return awaited.status();
        } else {
          WS_LOG(INFO, "publisher")
              << "step " << begin.step << " sent whole: its deltas (" << awaited.status().message()
              << ") took over half of the session's time for the step";
        }
      }
      if (delta != nullptr) {
        return DeliverDelta(begin, *delta, slot_base, ch, deadline, streaming);
      }
      WS_RETURN_IF_ERROR(
          ch.Send(wire::FrameType::kDeltaBegin, wire::DeltaBegin{begin.step, -1, 0, {}}, deadline));
    }
    for (size_t i = 0; !from_tensors_ && i < parts_.size(); ++i) {
      const wire::SelectRange& range = select_.ranges[i];
      parts_[i] = {const_cast<uint8_t*>(base_ + RangeAt(range, slot_base)), range.bytes};
    }
    *streaming = true;
    WS_RETURN_IF_ERROR(ch.WriteAll(parts_, deadline));
    *streaming = false;
    return Status::Ok();
  }
  // A subscriber asking for NCCL from a host store is told why not.
  Status Unexpected(wire::FrameType type) override {
    if (type == wire::FrameType::kNcclSetup) {
      return Status::FailedPrecondition(
          "nccl_setup refused: this publisher keeps its arena in host memory, whose bytes come "
          "over the tcp connection itself; nccl moves GPU arenas only");
    }
    return StepDelivery::Unexpected(type);
  }

 private:
  // One digest segment of a selected tensor: the unit a delta stands for.
  struct Segment {
    uint32_t digest = 0;
    uint32_t range = 0;   // in select_.ranges
    uint64_t offset = 0;  // within the range
    uint64_t bytes = 0;
  };

  // Where range `range` of the version in the slot at `slot_base` lies from the arena's base.
  uint64_t RangeAt(const wire::SelectRange& range, uint64_t slot_base) const {
    const wire::TensorPlacement& t = welcome_.tensors[range.tensor];
    return t.offset + range.offset +
           (t.region == wire::Region::kSlot ? slot_base : welcome_.direct_offset);
  }

  // A version still landing: whole (its delta, if any, is not encoded yet), range by range as far
  // as each landed, then the end of the landing (the digests set, or its failure).
  Status DeliverLanding(const wire::StepBegin& begin, store::StreamProgress& progress,
                        const wire::UpdateRequest& request, uint64_t slot_base, Channel& ch,
                        const Deadline& deadline, bool* streaming) {
    if (request.delta) {
      WS_RETURN_IF_ERROR(
          ch.Send(wire::FrameType::kDeltaBegin, wire::DeltaBegin{begin.step, -1, 0, {}}, deadline));
    }
    *streaming = true;
    for (const wire::SelectRange& range : select_.ranges) {
      uint8_t* bytes = const_cast<uint8_t*>(base_ + RangeAt(range, slot_base));
      const uint64_t end = range.offset + range.bytes;
      for (uint64_t at = range.offset, landed = 0; at < end;) {
        if (landed <= at) {
          WS_ASSIGN_OR_RETURN(landed, progress.WaitLanded(begin.step, range.tensor, at, deadline));
        }
        const uint64_t n = std::min(landed, end) - at;
        const iovec part{bytes + (at - range.offset), n};
        WS_RETURN_IF_ERROR(ch.WriteAll(std::span<const iovec>(&part, 1), deadline));
        at += n;
      }
    }
    WS_RETURN_IF_ERROR(progress.WaitFinished(begin.step, deadline));
    *streaming = false;
    return Status::Ok();
  }

  // The selection's digest segments, in Select order, when every range is a whole tensor
  // (store/version_store.h's CutSegments numbers them); else none, and no delta is ever sent.
  void CutSelectionIntoSegments() {
    std::vector<uint32_t> first_digest(welcome_.tensors.size() + 1, 0);
    for (size_t i = 0; i < welcome_.tensors.size(); ++i) {
      const uint64_t nbytes = welcome_.tensors[i].spec.nbytes;
      first_digest[i + 1] =
          first_digest[i] +
          static_cast<uint32_t>((nbytes + welcome_.segment_bytes - 1) / welcome_.segment_bytes);
    }
    std::vector<Segment> segments;
    for (uint32_t r = 0; r < select_.ranges.size(); ++r) {
      const wire::SelectRange& range = select_.ranges[r];
      if (range.offset != 0 || range.bytes != welcome_.tensors[range.tensor].spec.nbytes) return;
      for (uint64_t off = 0, k = 0; off < range.bytes; off += welcome_.segment_bytes, ++k) {
        segments.push_back({first_digest[range.tensor] + static_cast<uint32_t>(k), r, off,
                            std::min(welcome_.segment_bytes, range.bytes - off)});
      }
    }
    segments_ = std::move(segments);
    delta_begin_.bytes.resize(segments_.size());
    base_digests_.resize(segments_.size());
    delta_parts_.resize(segments_.size());
  }

  // The step as deltas against the subscriber's committed step (delta.base_step): delta_begin
  // with each segment's delta size (0: whole) and the base's digest, then segment by segment.
  Status DeliverDelta(const wire::StepBegin& begin, const store::SlotDelta& delta,
                      uint64_t slot_base, Channel& ch, const Deadline& deadline, bool* streaming) {
    delta_begin_.step = begin.step;
    delta_begin_.base_step = delta.base_step;
    for (size_t i = 0; i < segments_.size(); ++i) {
      const Segment& s = segments_[i];
      const uint64_t bytes = delta.bytes[s.digest];
      delta_begin_.bytes[i] = bytes;
      base_digests_[i] = delta.base_digests[s.digest];
      delta_parts_[i] =
          bytes > 0 ? iovec{const_cast<uint8_t*>(delta.area + delta.at[s.digest]), bytes}
                    : iovec{const_cast<uint8_t*>(
                                base_ + RangeAt(select_.ranges[s.range], slot_base) + s.offset),
                            s.bytes};
    }
    delta_begin_.base_digest = wire::DigestOfDigests(base_digests_);
    // Tests: a publisher claiming a base it did not encode against, which subscribers refuse.
    if (util::FailPoints::Check("publisher.delta_wrong_base").action == util::FailAction::kFlip) {
      delta_begin_.base_digest ^= 1;
    }
    WS_RETURN_IF_ERROR(ch.Send(wire::FrameType::kDeltaBegin, delta_begin_, deadline));
    *streaming = true;
    WS_RETURN_IF_ERROR(ch.WriteAll(delta_parts_, deadline));
    *streaming = false;
    return Status::Ok();
  }

  const wire::Welcome& welcome_;
  const wire::Select& select_;
  VersionSource* source_;
  const uint8_t* base_;
  std::vector<iovec> parts_;
  const bool from_tensors_;  // a host ring publisher: its registered tensors
  // Deltas: the selection's segments (empty: not whole tensors) and per-step scratch, sized once.
  std::vector<Segment> segments_;
  wire::DeltaBegin delta_begin_;
  std::vector<uint64_t> base_digests_;
  std::vector<iovec> delta_parts_;
};

// A GPU store's bytes go over NCCL: the subscriber asks with NcclSetup right after Select, and
// gets the unique id of a two-rank communicator both sides then join. Once per session. From a
// GPU arena the sender maps it; from a zero-copy or ring publisher it sends from the registered
// tensors themselves.
Result<std::unique_ptr<NcclSender>> SetUpNccl(Channel& ch, const SessionConfig& config,
                                              const wire::Welcome& welcome, int arena_fd,
                                              const wire::Select& select,
                                              const cuda::nccl::Watch& watch) {
  util::Deadline deadline(config.timeout);
  WS_ASSIGN_OR_RETURN(wire::FrameHeader header, ch.Receive(deadline));
  if (header.type == wire::FrameType::kError) {
    wire::ErrorMessage err;
    WS_RETURN_IF_ERROR(wire::Decode(ch.payload(), &err));
    return wire::ToStatus(err);
  }
  if (header.type != wire::FrameType::kNcclSetup) {
    return Status::ProtocolError("expected nccl_setup, got ", wire::FrameTypeName(header.type),
                                 ": this publisher serves GPU memory on cuda:", welcome.device,
                                 ", which a tcp subscriber receives over nccl only");
  }
  wire::NcclSetup setup;
  WS_RETURN_IF_ERROR(wire::Decode(ch.payload(), &setup));
  WS_RETURN_IF_ERROR(
      cuda::nccl::NcclAvailable().WithContext("nccl transport on the publisher's host"));
  const int version = cuda::nccl::NcclVersionCode();
  if (!CompatibleVersions(version, static_cast<int>(setup.nccl_version))) {
    return Status::FailedPrecondition(
        "NCCL versions differ: publisher ", cuda::nccl::NcclVersionString(version), ", subscriber ",
        cuda::nccl::NcclVersionString(static_cast<int>(setup.nccl_version)),
        " (both ranks of a communicator need the same NCCL major.minor)");
  }
  Result<std::unique_ptr<NcclSender>> prepared =
      config.source->VersionIsTensors()
          ? NcclSender::FromTensors(
                welcome, select.ranges,
                [&](uint32_t tensor) { return config.source->TensorBytes(tensor); })
          : NcclSender::Prepare(arena_fd, welcome, select.ranges);
  WS_ASSIGN_OR_RETURN(auto sender, std::move(prepared));
  WS_ASSIGN_OR_RETURN(cuda::nccl::UniqueId id, cuda::nccl::NewUniqueId());
  wire::NcclId answer{static_cast<uint32_t>(version), id};
  WS_RETURN_IF_ERROR(ch.Send(wire::FrameType::kNcclId, answer, deadline));
  WS_RETURN_IF_ERROR(sender->Connect(id, deadline, watch));
  WS_LOG(INFO, "tcp") << "nccl communicator with " << config.peer << " ready in "
                      << static_cast<int>(sender->link()->connect_seconds() * 1000)
                      << " ms: rank 0 on cuda:" << sender->device()
                      << ", subscriber rank 1 on cuda:" << setup.device << ", NCCL "
                      << cuda::nccl::NcclVersionString(version) << ", " << sender->bytes_per_step()
                      << " bytes per step";
  return sender;
}

// A GPU store's step: a grouped broadcast over the session's NCCL communicator.
class NcclDelivery final : public StepDelivery {
 public:
  explicit NcclDelivery(cuda::nccl::Watch watch) : watch_(std::move(watch)) {}
  // Sets up the communicator (the subscriber's nccl_setup, our nccl_id, both join).
  Status SetUp(Channel& ch, const SessionConfig& config, const wire::Welcome& welcome, int store_fd,
               const wire::Select& select) {
    WS_ASSIGN_OR_RETURN(sender_, SetUpNccl(ch, config, welcome, store_fd, select, watch_));
    return Status::Ok();
  }
  Status Deliver(const Pin& pin, const wire::UpdateRequest& /*request*/, Channel& /*ch*/,
                 const Deadline& deadline, bool* /*streaming*/) override {
    // Unpinned only once NCCL has read the whole slot (or the communicator was aborted).
    return sender_->Send(pin.begin.slot, deadline, watch_);
  }
  // A broadcast waiting on a stalled receiver keeps NCCL kernels running on the publisher's GPU:
  // it is aborted at the publisher's timeout.
  bool BoundedByPublisher() const override { return true; }
  // From a ring publisher: its tensors, pinned whole (no round of its ring; NCCL's own buffers
  // bound what is in flight).
  bool WholeVersion() const override { return true; }

 private:
  cuda::nccl::Watch watch_;  // before the sender: it aborts the communicator by it
  std::unique_ptr<NcclSender> sender_;
};

}  // namespace

Result<std::unique_ptr<StepDelivery>> DeliverOnSocket(Channel& /*ch*/, const SessionConfig& config,
                                                      const wire::Welcome& welcome,
                                                      int /*store_fd*/,
                                                      const wire::Select& select) {
  return std::unique_ptr<StepDelivery>(new SocketDelivery(welcome, select, config.source));
}

Result<std::unique_ptr<StepDelivery>> DeliverOverNccl(Channel& ch, const SessionConfig& config,
                                                      const wire::Welcome& welcome, int store_fd,
                                                      const wire::Select& select) {
  auto delivery = std::make_unique<NcclDelivery>(
      cuda::nccl::Watch{ch.fd(), config.stopping, "subscriber " + config.peer});
  WS_RETURN_IF_ERROR(delivery->SetUp(ch, config, welcome, store_fd, select));
  return std::unique_ptr<StepDelivery>(std::move(delivery));
}

}  // namespace weightsync::transport::path
