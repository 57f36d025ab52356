#include "transport/link/tcp_session.h"

#include <sys/uio.h>
#include <unistd.h>

#include <vector>

#include "cuda/nccl_link.h"
#include "transport/link/channel.h"
#include "transport/link/publisher_session.h"
#include "transport/path/nccl_path.h"
#include "util/logging.h"
#include "wire/handshake.h"

namespace weightsync::transport::link {
namespace {

using util::Deadline;

bool IsGpuStore(wire::ArenaKind kind) {
  return kind == wire::ArenaKind::kCudaMem || kind == wire::ArenaKind::kCudaIpc ||
         kind == wire::ArenaKind::kCudaRing;
}

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
        from_tensors_(welcome.arena_kind == wire::ArenaKind::kHostRing) {
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

// A GPU store's step: a grouped broadcast over the session's NCCL communicator.
class NcclDelivery final : public StepDelivery {
 public:
  NcclDelivery(path::NcclSender* sender, const cuda::nccl::Watch& watch)
      : sender_(sender), watch_(watch) {}
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
  path::NcclSender* sender_;
  const cuda::nccl::Watch& watch_;
};

// A GPU store's bytes go over NCCL: the subscriber asks with NcclSetup right after Select, and
// gets the unique id of a two-rank communicator both sides then join. Once per session. From a
// GPU arena the sender maps it; from a zero-copy or ring publisher it sends from the registered
// tensors themselves.
Result<std::unique_ptr<path::NcclSender>> SetUpNccl(Channel& ch, const SessionConfig& config,
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
  if (!path::CompatibleVersions(version, static_cast<int>(setup.nccl_version))) {
    return Status::FailedPrecondition(
        "NCCL versions differ: publisher ", cuda::nccl::NcclVersionString(version), ", subscriber ",
        cuda::nccl::NcclVersionString(static_cast<int>(setup.nccl_version)),
        " (both ranks of a communicator need the same NCCL major.minor)");
  }
  Result<std::unique_ptr<path::NcclSender>> prepared =
      welcome.arena_kind == wire::ArenaKind::kCudaMem
          ? path::NcclSender::Prepare(arena_fd, welcome, select.ranges)
          : path::NcclSender::FromTensors(welcome, select.ranges, [&](uint32_t tensor) {
              return config.source->TensorBytes(tensor);
            });
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

Status Serve(Channel& ch, const SessionConfig& config, bool* streaming) {
  WS_ASSIGN_OR_RETURN(auto layout, ReceiveHello(ch, config));
  const wire::Welcome& welcome = *layout.first;
  WS_RETURN_IF_ERROR(CheckServableOverTcp(welcome));
  WS_RETURN_IF_ERROR(ch.Send(wire::FrameType::kWelcome, welcome, Deadline(config.timeout)));
  wire::Select select;
  WS_RETURN_IF_ERROR(ch.ReceiveExpect(wire::FrameType::kSelect, &select, Deadline(config.timeout)));
  // Every range is read from the pinned version every step: each must lie inside its tensor.
  for (const wire::SelectRange& range : select.ranges) {
    if (range.tensor >= welcome.tensors.size()) {
      return Status::ProtocolError("select: tensor index ", range.tensor, " but the publisher has ",
                                   welcome.tensors.size(), " tensors");
    }
    const TensorSpec& spec = welcome.tensors[range.tensor].spec;
    if (range.offset > spec.nbytes || range.bytes > spec.nbytes - range.offset) {
      return Status::ProtocolError("select: bytes [", range.offset, ", +", range.bytes,
                                   ") of tensor '", spec.name, "', which has ", spec.nbytes);
    }
  }
  if (IsGpuStore(welcome.arena_kind)) {
    const cuda::nccl::Watch watch{ch.fd(), config.stopping, "subscriber " + config.peer};
    WS_ASSIGN_OR_RETURN(auto sender, SetUpNccl(ch, config, welcome, layout.second, select, watch));
    NcclDelivery delivery(sender.get(), watch);
    return ServeSteps(ch, config, welcome, delivery, streaming);
  }
  SocketDelivery delivery(welcome, select, config.source);
  return ServeSteps(ch, config, welcome, delivery, streaming);
}

}  // namespace

Status CheckServableOverTcp(const wire::Welcome& welcome) {
  // A zero-copy publisher's CUDA IPC handles and chunk fds are bearer secrets of this host: never
  // on a network connection. A zero-copy store made for tcp exports none (its Welcome lists no
  // allocations); this is the last line.
  if (!welcome.allocations.empty()) {
    return Status::FailedPrecondition(
        "a zero-copy publisher that exported its CUDA allocations (for subscribers on its own "
        "host, local://) never sends them over tcp: ",
        welcome.allocations.size(), " allocation(s) in its layout");
  }
  return Status::Ok();
}

void RunSession(int fd, const SessionConfig& config) {
  Channel ch(util::UniqueFd(::dup(fd)), "subscriber " + config.peer);
  bool streaming = false;
  Status s = Serve(ch, config, &streaming);
  EndSession(ch, config, s, streaming, "tcp");
}

}  // namespace weightsync::transport::link
