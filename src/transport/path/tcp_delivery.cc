#include "transport/path/tcp_delivery.h"

#include <sys/uio.h>

#include <vector>

#include "cuda/nccl_link.h"
#include "transport/path/nccl_path.h"
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
class SocketDelivery final : public StepDelivery {
 public:
  SocketDelivery(const wire::Welcome& welcome, const wire::Select& select, VersionSource* source)
      : welcome_(welcome),
        select_(select),
        base_(source->arena_base()),
        parts_(select.ranges.size()),
        from_tensors_(source->VersionIsTensors()) {
    // From the tensors, every step sends the same ranges.
    for (size_t i = 0; from_tensors_ && i < parts_.size(); ++i) {
      const wire::SelectRange& range = select.ranges[i];
      parts_[i] = {const_cast<uint8_t*>(source->TensorBytes(range.tensor) + range.offset),
                   range.bytes};
    }
  }
  bool WholeVersion() const override { return true; }
  Status Deliver(const Pin& pin, Channel& ch, const Deadline& deadline, bool* streaming) override {
    const wire::StepBegin& begin = pin.begin;
    const uint64_t slot_base = welcome_.slots_offset + uint64_t{begin.slot} * welcome_.slot_bytes;
    for (size_t i = 0; !from_tensors_ && i < parts_.size(); ++i) {
      const wire::SelectRange& range = select_.ranges[i];
      const wire::TensorPlacement& t = welcome_.tensors[range.tensor];
      uint64_t at = t.offset + range.offset +
                    (t.region == wire::Region::kSlot ? slot_base : welcome_.direct_offset);
      parts_[i] = {const_cast<uint8_t*>(base_ + at), range.bytes};
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
  const wire::Welcome& welcome_;
  const wire::Select& select_;
  const uint8_t* base_;
  std::vector<iovec> parts_;
  const bool from_tensors_;  // a host ring publisher: its registered tensors
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
  Status Deliver(const Pin& pin, Channel& /*ch*/, const Deadline& deadline,
                 bool* /*streaming*/) override {
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
