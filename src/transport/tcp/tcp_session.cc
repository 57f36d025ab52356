#include "transport/tcp/tcp_session.h"

#include <poll.h>
#include <sys/uio.h>
#include <unistd.h>

#include <vector>

#include "util/logging.h"
#include "wire/channel.h"
#include "wire/handshake.h"

namespace weightsync::transport::tcp {
namespace {

using util::Deadline;

constexpr int kPollSliceMs = 50;

Status Serve(wire::Channel& ch, const SessionConfig& config) {
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
  WS_ASSIGN_OR_RETURN(auto layout, config.source->WaitLayout(Deadline(config.timeout), give_up));
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
  // Prepared once per session: where each selected tensor's bytes come from.
  std::vector<iovec> parts(select.tensors.size());
  const uint8_t* base = config.source->arena_base();

  wire::UpdateRequest request;
  wire::StepEnd end;
  while (!config.stopping->load(std::memory_order_acquire)) {
    pollfd p{ch.fd(), POLLIN, 0};
    int r = ::poll(&p, 1, kPollSliceMs);
    if (r == 0 || (r < 0 && errno == EINTR)) continue;
    WS_RETURN_IF_ERROR(
        ch.ReceiveExpect(wire::FrameType::kUpdateRequest, &request, Deadline(config.timeout)));
    WS_ASSIGN_OR_RETURN(wire::StepBegin begin,
                        config.source->Acquire(request, Deadline(config.timeout), give_up));
    Status s = ch.Send(wire::FrameType::kStepBegin, begin, Deadline(config.timeout));
    if (begin.step == request.after_step) {
      WS_RETURN_IF_ERROR(s);
      continue;  // up to date: nothing pinned
    }
    if (s.ok()) {
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
    WS_RETURN_IF_ERROR(s);
    WS_RETURN_IF_ERROR(ch.Send(wire::FrameType::kStepEnd, end, Deadline(config.timeout)));
  }
  return Status::Ok();
}

}  // namespace

void RunSession(int fd, const SessionConfig& config) {
  wire::Channel ch(util::UniqueFd(::dup(fd)), "subscriber " + config.peer);
  Status s = Serve(ch, config);
  if (s.ok() || config.stopping->load(std::memory_order_acquire)) return;
  if (s.code() == StatusCode::kPeerLost) {
    WS_LOG(DEBUG, "tcp") << "session with " << config.peer << " ended: " << s;
    return;
  }
  WS_LOG(WARN, "tcp") << "session with " << config.peer << " closed: " << s;
  if (s.code() != StatusCode::kTimeout) {
    (void)ch.Send(wire::FrameType::kError,
                  wire::ErrorMessage{s.code(), s.message().substr(0, wire::kMaxErrorMessageBytes)},
                  Deadline(std::chrono::milliseconds(200)));
  }
}

}  // namespace weightsync::transport::tcp
