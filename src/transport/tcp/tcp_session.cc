#include "transport/tcp/tcp_session.h"

#include <poll.h>
#include <sys/uio.h>
#include <unistd.h>

#include <vector>

#include "transport/nccl/nccl_endpoints.h"
#include "util/logging.h"
#include "wire/channel.h"
#include "wire/handshake.h"

namespace weightsync::transport::tcp {
namespace {

using util::Deadline;

constexpr int kPollSliceMs = 50;

// The next UpdateRequest. A subscriber asking for NCCL from a host arena is told why not.
Status ReceiveUpdateRequest(wire::Channel& ch, const SessionConfig& config, bool nccl,
                            wire::UpdateRequest* request) {
  WS_ASSIGN_OR_RETURN(wire::FrameHeader header, ch.Receive(util::Deadline(config.timeout)));
  if (header.type == wire::FrameType::kUpdateRequest) {
    return wire::Decode(ch.payload(), request);
  }
  if (header.type == wire::FrameType::kError) {
    wire::ErrorMessage err;
    WS_RETURN_IF_ERROR(wire::Decode(ch.payload(), &err));
    return wire::ToStatus(err);
  }
  if (header.type == wire::FrameType::kNcclSetup && !nccl) {
    return Status::FailedPrecondition(
        "nccl_setup refused: this publisher keeps its arena in host memory, whose bytes come "
        "over the tcp connection itself; nccl moves GPU arenas only");
  }
  return Status::ProtocolError("expected update_request, got ",
                               wire::FrameTypeName(header.type));
}

// A GPU arena's bytes move over NCCL: the subscriber asks with NcclSetup right after Select, and
// gets the unique id of a two-rank communicator both sides then join. Once per session.
Result<std::unique_ptr<nccl::NcclSender>> SetUpNccl(wire::Channel& ch, const SessionConfig& config,
                                                    const wire::Welcome& welcome, int arena_fd,
                                                    const wire::Select& select,
                                                    const nccl::Watch& watch) {
  util::Deadline deadline(config.timeout);
  WS_ASSIGN_OR_RETURN(wire::FrameHeader header, ch.Receive(deadline));
  if (header.type == wire::FrameType::kError) {
    wire::ErrorMessage err;
    WS_RETURN_IF_ERROR(wire::Decode(ch.payload(), &err));
    return wire::ToStatus(err);
  }
  if (header.type != wire::FrameType::kNcclSetup) {
    return Status::ProtocolError("expected nccl_setup, got ", wire::FrameTypeName(header.type),
                                 ": this publisher keeps its arena on cuda:", welcome.device,
                                 ", which a tcp subscriber receives over nccl only");
  }
  wire::NcclSetup setup;
  WS_RETURN_IF_ERROR(wire::Decode(ch.payload(), &setup));
  WS_RETURN_IF_ERROR(
      nccl::NcclAvailable().WithContext("nccl transport on the publisher's host"));
  const int version = nccl::NcclVersionCode();
  if (!nccl::CompatibleVersions(version, static_cast<int>(setup.nccl_version))) {
    return Status::FailedPrecondition(
        "NCCL versions differ: publisher ", nccl::NcclVersionString(version), ", subscriber ",
        nccl::NcclVersionString(static_cast<int>(setup.nccl_version)),
        " (both ranks of a communicator need the same NCCL major.minor)");
  }
  WS_ASSIGN_OR_RETURN(auto sender, nccl::NcclSender::Prepare(arena_fd, welcome, select.tensors));
  WS_ASSIGN_OR_RETURN(nccl::UniqueId id, nccl::NewUniqueId());
  wire::NcclId answer{static_cast<uint32_t>(version), id};
  WS_RETURN_IF_ERROR(ch.Send(wire::FrameType::kNcclId, answer, deadline));
  WS_RETURN_IF_ERROR(sender->Connect(id, deadline, watch));
  WS_LOG(INFO, "tcp") << "nccl communicator with " << config.peer << " ready in "
                      << static_cast<int>(sender->link()->connect_seconds() * 1000)
                      << " ms: rank 0 on cuda:" << sender->device()
                      << ", subscriber rank 1 on cuda:" << setup.device << ", NCCL "
                      << nccl::NcclVersionString(version) << ", " << sender->bytes_per_step()
                      << " bytes per step";
  return sender;
}

// `streaming` is true while a step's bytes are on the connection: an error frame sent then would
// land in the middle of the subscriber's data.
Status Serve(wire::Channel& ch, const SessionConfig& config, bool* streaming) {
  auto give_up = [&] {
    return config.stopping->load(std::memory_order_acquire) || ch.PeerHungUpOrSpoke();
  };
  wire::Hello hello;
  WS_RETURN_IF_ERROR(ch.ReceiveExpect(wire::FrameType::kHello, &hello, Deadline(config.timeout)));
  if (hello.protocol_version != wire::kProtocolVersion) {
    return Status::FailedPrecondition("subscriber speaks protocol version ",
                                      hello.protocol_version, ", publisher speaks ",
                                      wire::kProtocolVersion);
  }
  WS_ASSIGN_OR_RETURN(auto layout,
                      config.source->WaitLayout(PeerWaitDeadline(hello.wait_ms), give_up));
  const wire::Welcome& welcome = *layout.first;
  WS_RETURN_IF_ERROR(ch.Send(wire::FrameType::kWelcome, welcome, Deadline(config.timeout)));
  wire::Select select;
  WS_RETURN_IF_ERROR(
      ch.ReceiveExpect(wire::FrameType::kSelect, &select, Deadline(config.timeout)));
  for (uint32_t t : select.tensors) {
    if (t >= welcome.tensors.size()) {
      return Status::ProtocolError("select: tensor index ", t, " but the publisher has ",
                                   welcome.tensors.size(), " tensors");
    }
  }
  // A GPU arena's bytes go over NCCL (set up once, here); a host arena's over this connection.
  const std::string subscriber = "subscriber " + config.peer;
  const nccl::Watch watch{ch.fd(), config.stopping, subscriber};
  std::unique_ptr<nccl::NcclSender> sender;
  if (welcome.arena_kind == wire::ArenaKind::kCudaMem) {
    WS_ASSIGN_OR_RETURN(sender, SetUpNccl(ch, config, welcome, layout.second, select, watch));
  }
  // Prepared once per session: where each selected tensor's bytes come from.
  std::vector<iovec> parts(sender ? 0 : select.tensors.size());
  const uint8_t* base = config.source->arena_base();

  wire::UpdateRequest request;
  wire::StepEnd end;
  while (!config.stopping->load(std::memory_order_acquire)) {
    pollfd p{ch.fd(), POLLIN, 0};
    int r = ::poll(&p, 1, kPollSliceMs);
    if (r == 0 || (r < 0 && errno == EINTR)) continue;
    WS_RETURN_IF_ERROR(ReceiveUpdateRequest(ch, config, sender != nullptr, &request));
    // Waiting for the step is bounded by the subscriber's wait, not ours; once a version is
    // pinned for it, our deadline bounds sending it (a stalled reader loses the version).
    WS_ASSIGN_OR_RETURN(wire::StepBegin begin,
                        config.source->Acquire(request, PeerWaitDeadline(request.wait_ms),
                                               give_up));
    Status s = ch.Send(wire::FrameType::kStepBegin, AsOffered(begin, request, welcome.slot_count),
                       Deadline(config.timeout));
    if (begin.step == request.after_step) {
      WS_RETURN_IF_ERROR(s);
      continue;  // up to date: nothing pinned
    }
    if (s.ok() && sender) {
      // Unpinned only once NCCL has read the whole slot (or the communicator was aborted).
      s = sender->Send(begin.slot, Deadline(config.timeout), watch);
      if (!s.ok()) s = s.WithContext("step " + std::to_string(begin.step));
    } else if (s.ok()) {
      const uint64_t slot_base = welcome.slots_offset + uint64_t{begin.slot} * welcome.slot_bytes;
      for (size_t i = 0; i < parts.size(); ++i) {
        const wire::TensorPlacement& t = welcome.tensors[select.tensors[i]];
        uint64_t at = t.offset + (t.region == wire::Region::kSlot ? slot_base
                                                                  : welcome.direct_offset);
        parts[i] = {const_cast<uint8_t*>(base + at), t.spec.nbytes};
      }
      s = ch.WriteAll(parts, Deadline(config.timeout));
    }
    config.source->Unpin(begin, &end);
    *streaming = !s.ok();
    WS_RETURN_IF_ERROR(s);
    WS_RETURN_IF_ERROR(ch.Send(wire::FrameType::kStepEnd, end, Deadline(config.timeout)));
  }
  return Status::Ok();
}

}  // namespace

void RunSession(int fd, const SessionConfig& config) {
  wire::Channel ch(util::UniqueFd(::dup(fd)), "subscriber " + config.peer);
  bool streaming = false;
  Status s = Serve(ch, config, &streaming);
  if (s.ok() || config.stopping->load(std::memory_order_acquire)) return;
  if (s.code() == StatusCode::kPeerLost) {
    WS_LOG(DEBUG, "tcp") << "session with " << config.peer << " ended: " << s;
    return;
  }
  WS_LOG(WARN, "tcp") << "session with " << config.peer << " closed: " << s;
  // A session this side ends is ended with an error frame that says why, unless it ended in the
  // middle of a step's bytes (the subscriber then sees the connection close mid-data).
  if (streaming) return;
  (void)ch.Send(wire::FrameType::kError,
                wire::ErrorMessage{s.code(), s.message().substr(0, wire::kMaxErrorMessageBytes)},
                Deadline(std::chrono::milliseconds(200)));
}

}  // namespace weightsync::transport::tcp
