#include "transport/link/publisher_session.h"

#include <poll.h>

#include <cerrno>

#include "util/logging.h"
#include "wire/handshake.h"
#include "wire/members_report.h"

namespace weightsync::transport::link {
namespace {

using util::Deadline;

constexpr int kPollSliceMs = 50;

}  // namespace

Status StepDelivery::Unexpected(wire::FrameType type) {
  return Status::ProtocolError("expected update_request, got ", wire::FrameTypeName(type));
}

Result<Admitted> ReceiveHello(Channel& ch, const SessionConfig& config) {
  auto give_up = [&] {
    return config.stopping->load(std::memory_order_acquire) || ch.PeerHungUpOrSpoke();
  };
  wire::Hello hello;
  Status s = ch.ReceiveExpect(wire::FrameType::kHello, &hello, Deadline(config.timeout));
  if (!s.ok()) return s.WithContext("handshake");
  // An authenticated peer speaking our protocol: full-size frames from here on.
  ch.set_max_payload(wire::kMaxPayloadBytes);
  if (hello.protocol_version != wire::kProtocolVersion) {
    return Status::FailedPrecondition("subscriber speaks protocol version ", hello.protocol_version,
                                      ", publisher speaks ", wire::kProtocolVersion);
  }
  Admitted admitted;
  uint64_t id = 0;
  const std::string relay = config.source->Admit(config.peer, hello, &id);
  if (!relay.empty()) {
    WS_RETURN_IF_ERROR(
        ch.Send(wire::FrameType::kRedirect, wire::Redirect{relay}, Deadline(config.timeout)));
    WS_LOG(DEBUG, "topology") << config.peer << " redirected to relay " << relay;
    return admitted;
  }
  admitted.member = Membership(config.source, id);
  WS_ASSIGN_OR_RETURN(auto layout,
                      config.source->WaitLayout(PeerWaitDeadline(hello.wait_ms), give_up));
  admitted.welcome = layout.first;
  admitted.store_fd = layout.second;
  return admitted;
}

Status ServeSteps(Channel& ch, const SessionConfig& config, const wire::Welcome& welcome,
                  StepDelivery& delivery, bool* streaming, uint64_t member) {
  auto give_up = [&] {
    return config.stopping->load(std::memory_order_acquire) || ch.PeerHungUpOrSpoke();
  };
  wire::UpdateRequest request;
  wire::StepEnd end;
  wire::MembersReport report;
  config.source->Ready(member);
  while (!config.stopping->load(std::memory_order_acquire)) {
    // Idle between updates: wait for the next request without a deadline, but wake to notice
    // the server stopping.
    pollfd p{ch.fd(), POLLIN, 0};
    int r = ::poll(&p, 1, kPollSliceMs);
    if (r == 0 || (r < 0 && errno == EINTR)) continue;
    WS_ASSIGN_OR_RETURN(wire::FrameHeader header, ch.Receive(Deadline(config.timeout)));
    if (header.type == wire::FrameType::kError) {
      wire::ErrorMessage err;
      WS_RETURN_IF_ERROR(wire::Decode(ch.payload(), &err));
      return wire::ToStatus(err);
    }
    if (header.type == wire::FrameType::kMembersReport) {
      WS_RETURN_IF_ERROR(wire::Decode(ch.payload(), &report).WithContext(ch.peer()));
      WS_RETURN_IF_ERROR(config.source->Reported(member, report).WithContext(ch.peer()));
      continue;
    }
    if (header.type != wire::FrameType::kUpdateRequest) return delivery.Unexpected(header.type);
    WS_RETURN_IF_ERROR(wire::Decode(ch.payload(), &request).WithContext(ch.peer()));
    // What it holds, as it says, even while it waits for a step to be published.
    config.source->Requested(member, request.after_step, -1, request.below);
    // Waiting for the step is bounded by the subscriber's wait, not ours; once a version is
    // pinned for it, our deadline bounds its delivery (a stalled reader loses the version).
    const util::Deadline wait = PeerWaitDeadline(request.wait_ms);
    WS_ASSIGN_OR_RETURN(Pin pin, delivery.WholeVersion()
                                     ? config.source->AcquireWhole(request, wait, give_up)
                                     : config.source->Acquire(request, wait, give_up));
    const wire::StepBegin& begin = pin.begin;
    config.source->Requested(member, request.after_step,
                             begin.step == request.after_step ? -1 : begin.step, request.below);
    Status s = ch.Send(wire::FrameType::kStepBegin, AsOffered(begin, request, welcome.slot_count),
                       Deadline(config.timeout));
    if (begin.step == request.after_step) {  // up to date: nothing pinned
      WS_RETURN_IF_ERROR(s);
      continue;
    }
    if (s.ok()) {
      s = delivery.Deliver(pin, request, ch,
                           delivery.BoundedByPublisher() ? Deadline(config.timeout)
                                                         : PeerWaitDeadline(request.wait_ms),
                           streaming);
    }
    Status unpinned = config.source->Unpin(pin, &end);
    if (!s.ok()) return s.WithContext("step " + std::to_string(begin.step));
    // A revoked read ends the session with an error frame instead of the step's end.
    WS_RETURN_IF_ERROR(unpinned);
    // Counted as sent before the subscriber can have it (a failed send ends the session, and with
    // it the member), so Members() never lags an update that returned.
    config.source->Sent(member, begin.step);
    WS_RETURN_IF_ERROR(ch.Send(wire::FrameType::kStepEnd, end, Deadline(config.timeout)));
  }
  return Status::Ok();
}

void EndSession(Channel& ch, const SessionConfig& config, const Status& s, bool streaming,
                std::string_view component) {
  if (s.ok() || config.stopping->load(std::memory_order_acquire)) return;
  if (s.code() == StatusCode::kPeerLost) {
    WS_LOG(DEBUG, component) << "session with " << config.peer << " ended: " << s;
    return;
  }
  WS_LOG(WARN, component) << "session with " << config.peer << " closed: " << s;
  // A session this side ends is ended with an error frame that says why, unless it ended in the
  // middle of a step's bytes (the subscriber then sees the connection close mid-data).
  if (streaming) return;
  (void)ch.Send(wire::FrameType::kError,
                wire::ErrorMessage{s.code(), s.message().substr(0, wire::kMaxErrorMessageBytes)},
                Deadline(std::chrono::milliseconds(200)));
}

}  // namespace weightsync::transport::link
