// The subscriber's tcp link: any host, mutual HMAC authentication over fresh nonces before anything
// else (wire/handshake.h), then Hello → Welcome → Select; a step's bytes follow on the connection
// (or over NCCL, which the nccl path sets up on it).
#include <asio.hpp>
#include <thread>

#include "transport/link/link.h"
#include "util/fail_point.h"
#include "util/logging.h"
#include "util/token.h"
#include "wire/handshake.h"

namespace weightsync::transport::link {
namespace {

using asio::ip::tcp;
using util::Deadline;

class TcpLink final : public Link {
 public:
  TcpLink(Endpoint endpoint, SubscriberOptions options)
      : Link(LinkKind::kTcp, "publisher " + endpoint.ToString()),
        endpoint_(std::move(endpoint)),
        options_(std::move(options)) {}

  Status Select(const plan::Plan& plan, const Deadline& deadline) override {
    wire::Select select;
    for (const auto& t : plan.tensors) {
      if (t.nbytes > 0) select.ranges.push_back({t.publisher_index, t.src_offset, t.nbytes});
    }
    WS_RETURN_IF_ERROR(SelectFits(select.ranges.size()).WithContext(peer()));
    return channel().Send(wire::FrameType::kSelect, select, deadline);
  }
  std::string Describe() const override {
    return token_.empty() ? ", no token (loopback)" : ", authenticated";
  }

 private:
  Result<std::unique_ptr<Channel>> Open(const Deadline& deadline) override;
  Status Authenticate(Channel& ch, const Deadline& deadline);
  bool confirms_copy() const override { return false; }

  Endpoint endpoint_;
  SubscriberOptions options_;
  std::string token_;
};

Result<std::unique_ptr<Channel>> TcpLink::Open(const Deadline& deadline) {
  WS_FAIL_POINT_RETURN("tcp.prepare");
  WS_ASSIGN_OR_RETURN(token_, util::LoadToken(options_.token, options_.token_file));
  WS_ASSIGN_OR_RETURN(util::UniqueFd fd, ConnectTcp(endpoint_, deadline));
  // Handshake-sized frames only until Authenticate() has checked the publisher's MAC: an
  // impostor must not make us reserve a full-size frame buffer with one 24-byte header.
  auto channel = std::make_unique<Channel>(std::move(fd), peer(), wire::kMaxHandshakePayloadBytes);
  WS_RETURN_IF_ERROR(Authenticate(*channel, deadline));
  return channel;
}

Status TcpLink::Authenticate(Channel& ch, const Deadline& deadline) {
  wire::Challenge challenge;
  WS_RETURN_IF_ERROR(ch.ReceiveExpect(wire::FrameType::kChallenge, &challenge, deadline));
  if (challenge.protocol_version != wire::kProtocolVersion) {
    return Status::FailedPrecondition(peer(), " speaks protocol version ",
                                      challenge.protocol_version, ", this subscriber speaks ",
                                      wire::kProtocolVersion);
  }
  if (challenge.auth_required && token_.empty()) {
    return Status::Unauthenticated(peer(),
                                   " requires a token and none is configured "
                                   "(SubscriberOptions.token_file, WEIGHTSYNC_TOKEN_FILE "
                                   "or WEIGHTSYNC_TOKEN)");
  }
  if (!challenge.auth_required && !token_.empty()) {
    return Status::Unauthenticated(peer(),
                                   " does not authenticate, but this subscriber has a "
                                   "token: refusing an unauthenticated publisher");
  }
  WS_ASSIGN_OR_RETURN(wire::Nonce nonce, wire::RandomNonce());
  wire::Auth auth{
      wire::Role::kSubscriber, nonce,
      wire::ComputeMac(token_, wire::MacSide::kClient, challenge, nonce, wire::Role::kSubscriber)};
  WS_RETURN_IF_ERROR(ch.Send(wire::FrameType::kAuth, auth, deadline));
  wire::AuthOk ok;
  WS_RETURN_IF_ERROR(ch.ReceiveExpect(wire::FrameType::kAuthOk, &ok, deadline));
  wire::Mac expected =
      wire::ComputeMac(token_, wire::MacSide::kServer, challenge, nonce, wire::Role::kSubscriber);
  if (!wire::MacEquals(expected, ok.mac)) {
    return Status::Unauthenticated(peer(), " failed to prove it holds the token");
  }
  // The publisher has proven itself (or, without a token, loopback is all the proof there is):
  // the Welcome and step frames may be full-size.
  ch.set_max_payload(wire::kMaxPayloadBytes);
  return Status::Ok();
}

}  // namespace

std::unique_ptr<Link> NewTcpLink(const Endpoint& endpoint, const SubscriberOptions& options) {
  return std::make_unique<TcpLink>(endpoint, options);
}

Result<util::UniqueFd> ConnectTcp(const Endpoint& endpoint, const Deadline& deadline) {
  asio::io_context io;
  tcp::resolver resolver(io);
  asio::error_code ec;
  auto addresses = resolver.resolve(endpoint.host, std::to_string(endpoint.port),
                                    tcp::resolver::numeric_service, ec);
  if (ec) {
    return Status::NotFound("cannot resolve '", endpoint.host, "': ", ec.message());
  }
  // "No route to host" right after a link comes back (neighbour entry still failed) is
  // transient: retry within the deadline, as for a refused local connect.
  while (true) {
    tcp::socket socket(io);
    asio::error_code result = asio::error::would_block;
    asio::async_connect(socket, addresses,
                        [&](const asio::error_code& e, const tcp::endpoint&) { result = e; });
    io.restart();
    io.run_for(std::chrono::milliseconds(deadline.RemainingMs()));
    if (result == asio::error::would_block) {
      return Status::Timeout("connecting to ", endpoint.ToString(),
                             ": no answer before the deadline");
    }
    const bool transient =
        result == asio::error::host_unreachable || result == asio::error::network_unreachable;
    if (transient && !deadline.expired() && !deadline.cancelled()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    if (result) {
      if (result == asio::error::connection_refused) {
        return Status::NotFound("no publisher listens on ", endpoint.ToString(), " (",
                                result.message(), ")");
      }
      return Status::IoError("connecting to ", endpoint.ToString(), ": ", result.message());
    }
    socket.set_option(tcp::no_delay(true), ec);
    int fd = socket.release(ec);
    if (ec) return Status::IoError("connecting to ", endpoint.ToString(), ": ", ec.message());
    return util::UniqueFd(fd);
  }
}

}  // namespace weightsync::transport::link
