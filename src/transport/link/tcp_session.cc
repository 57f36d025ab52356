#include "transport/link/tcp_session.h"

#include <sys/uio.h>
#include <unistd.h>

#include <vector>

#include "transport/link/channel.h"
#include "transport/link/publisher_session.h"
#include "util/logging.h"
#include "wire/handshake.h"

namespace weightsync::transport::link {
namespace {

using util::Deadline;

Status Serve(Channel& ch, const SessionConfig& config, bool* streaming) {
  WS_ASSIGN_OR_RETURN(Admitted admitted, ReceiveHello(ch, config));
  if (admitted.welcome == nullptr) return Status::Ok();  // redirected
  const wire::Welcome& welcome = *admitted.welcome;
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
  // How the bytes go is the path table's publisher end (transport/path_table.h), handed in.
  if (config.deliver == nullptr) return Status::Internal("tcp session without a delivery");
  WS_ASSIGN_OR_RETURN(std::unique_ptr<StepDelivery> delivery,
                      config.deliver(ch, config, welcome, admitted.store_fd, select));
  return ServeSteps(ch, config, welcome, *delivery, streaming, admitted.member.id());
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
