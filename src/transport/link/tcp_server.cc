// The publisher's tcp link (StartTcpServer in server.h). An asio io_context thread accepts
// connections and runs each handshake asynchronously with a deadline: Challenge → Auth (HMAC
// verified, client nonce never seen before) → AuthOk. Until then the peer costs one socket and a
// fixed-size handshake record, never a thread or a buffer. Only an authenticated peer gets a
// session thread (tcp_session.h). A connection that breaks the protocol gets an Error frame (where
// one can be sent) and is closed with the reason logged; other connections are unaffected.
#include <poll.h>
#include <sys/socket.h>

#include <asio.hpp>
#include <atomic>
#include <deque>
#include <list>
#include <mutex>
#include <set>
#include <thread>

#include "transport/link/channel.h"
#include "transport/link/server.h"
#include "transport/link/session_threads.h"
#include "transport/link/tcp_session.h"
#include "util/ledger.h"
#include "util/logging.h"
#include "util/thread.h"
#include "util/token.h"
#include "util/unique_fd.h"
#include "wire/frame.h"
#include "wire/handshake.h"

namespace weightsync::transport::link {
namespace {

using asio::ip::tcp;
using util::LedgerAdd;
using util::LedgerItem;

// Largest handshake frame a peer may send before it is authenticated. Tighter than
// wire::kMaxHandshakePayloadBytes: the only frame a subscriber sends here is Auth (a subscriber
// never answers a Challenge with an Error frame).
constexpr uint32_t kMaxHandshakePayload = 256;
static_assert(wire::kAuthBytes <= kMaxHandshakePayload);
// Client nonces remembered to refuse a replayed Auth (beyond what fresh server nonces give).
constexpr size_t kRememberedNonces = 4096;

class TcpServerImpl;

// One connection's handshake, driven by completion handlers on the io thread.
struct Handshake : std::enable_shared_from_this<Handshake> {
  Handshake(TcpServerImpl* server, tcp::socket socket)
      : server(server), socket(std::move(socket)), timer(this->socket.get_executor()) {}
  TcpServerImpl* server;
  tcp::socket socket;
  asio::steady_timer timer;
  std::string peer;
  wire::Challenge challenge;
  std::vector<uint8_t> out;  // an encoded frame being written
  uint8_t header[wire::kHeaderBytes];
  std::array<uint8_t, kMaxHandshakePayload> payload;
  uint32_t payload_size = 0;
  bool finished = false;
};

class TcpServerImpl final : public Server {
 public:
  TcpServerImpl(const Endpoint& endpoint, const ServerOptions& options, VersionSource* source)
      : endpoint_(endpoint), options_(options), source_(source), acceptor_(io_) {}
  ~TcpServerImpl() override {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "tcp") << "server cleanup: " << s;
  }

  Status Listen();
  const Endpoint& bound() const override { return bound_; }
  Status Close() override;

  // Handshake steps (io thread).
  void Accept();
  void Begin(std::shared_ptr<Handshake> h);
  void ReadAuthHeader(std::shared_ptr<Handshake> h);
  void ReadAuthPayload(std::shared_ptr<Handshake> h);
  void VerifyAuth(std::shared_ptr<Handshake> h);
  void Refuse(std::shared_ptr<Handshake> h, StatusCode code, const std::string& why);
  void Finish(const std::shared_ptr<Handshake>& h);
  void StartSession(std::shared_ptr<Handshake> h);
  void ScheduleReap();

 private:
  Endpoint endpoint_;
  Endpoint bound_;
  ServerOptions options_;
  VersionSource* source_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer reap_timer_{io_};
  std::thread io_thread_;
  std::atomic<bool> stopping_{false};
  bool closed_ = false;
  std::set<std::shared_ptr<Handshake>> live_;  // handshakes in progress; io thread only
  std::set<wire::Nonce> seen_nonces_;          // io thread only
  std::deque<wire::Nonce> nonce_order_;        // io thread only
  SessionThreads sessions_;
  uint64_t next_session_id_ = 1;
};

Status TcpServerImpl::Listen() {
  asio::error_code ec;
  tcp::resolver resolver(io_);
  auto results = resolver.resolve(endpoint_.host, std::to_string(endpoint_.port),
                                  tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    return Status::InvalidArgument("tcp endpoint ", endpoint_.ToString(), ": cannot resolve '",
                                   endpoint_.host, "': ", ec.message());
  }
  tcp::endpoint ep = results.begin()->endpoint();
  if (options_.token.empty() && !ep.address().is_loopback() &&
      !(ep.address().is_v6() && ep.address().to_v6().is_v4_mapped() &&
        asio::ip::make_address_v4(asio::ip::v4_mapped, ep.address().to_v6()).is_loopback())) {
    return Status::Unauthenticated(
        "refusing to listen on ", ep.address().to_string(), ":", ep.port(),
        " without a token: a non-loopback listener must authenticate its peers "
        "(set PublisherOptions.token_file, WEIGHTSYNC_TOKEN_FILE or WEIGHTSYNC_TOKEN)");
  }
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status::IoError("tcp endpoint ", endpoint_.ToString(), ": cannot listen on ",
                           ep.address().to_string(), ":", ep.port(), ": ", ec.message());
  }
  LedgerAdd(LedgerItem::kFds, 1);
  bound_ = endpoint_;
  bound_.host = ep.address().to_string();
  bound_.port = acceptor_.local_endpoint().port();
  bound_.name = bound_.ToString().substr(6);
  Accept();
  ScheduleReap();
  WS_RETURN_IF_ERROR(util::StartThread(&io_thread_, "tcp io", [this] { io_.run(); }));
  LedgerAdd(LedgerItem::kThreads, 1);
  WS_LOG(INFO, "tcp") << "listening on " << bound_.ToString()
                      << (options_.token.empty() ? " (loopback, no token)" : " (token required)");
  return Status::Ok();
}

void TcpServerImpl::Accept() {
  acceptor_.async_accept([this](asio::error_code ec, tcp::socket socket) {
    if (stopping_.load(std::memory_order_acquire)) return;
    if (ec) {
      WS_LOG(WARN, "tcp") << "accept: " << ec.message();
      if (ec == asio::error::no_descriptors) {
        // Out of fds: back off instead of spinning on a failing accept.
        auto t = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(50));
        t->async_wait([this, t](asio::error_code) { Accept(); });
        return;
      }
      Accept();
      return;
    }
    if (static_cast<int>(live_.size()) >= options_.max_pending) {
      WS_LOG(DEBUG, "tcp") << "refused a connection: " << live_.size() << " handshakes pending";
      asio::error_code ignored;
      socket.close(ignored);
    } else {
      LedgerAdd(LedgerItem::kFds, 1);
      auto h = std::make_shared<Handshake>(this, std::move(socket));
      live_.insert(h);
      Begin(h);
    }
    Accept();
  });
}

void TcpServerImpl::Begin(std::shared_ptr<Handshake> h) {
  asio::error_code ec;
  auto remote = h->socket.remote_endpoint(ec);
  h->peer = ec ? std::string("unknown peer")
               : remote.address().to_string() + ":" + std::to_string(remote.port());
  h->socket.set_option(tcp::no_delay(true), ec);
  h->timer.expires_after(options_.handshake_timeout);
  h->timer.async_wait([this, h](asio::error_code ec) {
    if (ec || h->finished) return;
    WS_LOG(WARN, "tcp") << "closed " << h->peer << ": no authentication within "
                        << options_.handshake_timeout.count() << " ms";
    Finish(h);
  });
  auto nonce = wire::RandomNonce();
  if (!nonce.ok()) {
    Refuse(h, StatusCode::kInternal, nonce.status().message());
    return;
  }
  h->challenge = {wire::kProtocolVersion, next_session_id_++, *nonce, !options_.token.empty()};
  std::vector<uint8_t> payload;
  wire::Encode(h->challenge, &payload);
  h->out.resize(wire::kHeaderBytes);
  wire::EncodeHeader(wire::FrameType::kChallenge, payload,
                     std::span<uint8_t, wire::kHeaderBytes>(h->out.data(), wire::kHeaderBytes));
  h->out.insert(h->out.end(), payload.begin(), payload.end());
  asio::async_write(h->socket, asio::buffer(h->out), [this, h](asio::error_code ec, size_t) {
    if (ec) return Finish(h);
    ReadAuthHeader(h);
  });
}

void TcpServerImpl::ReadAuthHeader(std::shared_ptr<Handshake> h) {
  asio::async_read(h->socket, asio::buffer(h->header), [this, h](asio::error_code ec, size_t) {
    if (ec) {
      if (!h->finished) WS_LOG(DEBUG, "tcp") << h->peer << " left during the handshake";
      return Finish(h);
    }
    auto header = wire::DecodeHeader(std::span<const uint8_t, wire::kHeaderBytes>(h->header),
                                     kMaxHandshakePayload);
    if (!header.ok()) return Refuse(h, header.status().code(), header.status().message());
    if (header->type != wire::FrameType::kAuth) {
      return Refuse(h, StatusCode::kProtocolError,
                    "expected auth frame, got " + std::string(wire::FrameTypeName(header->type)));
    }
    h->payload_size = header->length;
    // The checksum is verified once the payload is in.
    std::memcpy(&h->out[0], h->header, wire::kHeaderBytes);
    ReadAuthPayload(h);
  });
}

void TcpServerImpl::ReadAuthPayload(std::shared_ptr<Handshake> h) {
  asio::async_read(h->socket, asio::buffer(h->payload.data(), h->payload_size),
                   [this, h](asio::error_code ec, size_t) {
                     if (ec) return Finish(h);
                     VerifyAuth(h);
                   });
}

void TcpServerImpl::VerifyAuth(std::shared_ptr<Handshake> h) {
  auto header = wire::DecodeHeader(std::span<const uint8_t, wire::kHeaderBytes>(h->header),
                                   kMaxHandshakePayload);
  std::span<const uint8_t> payload(h->payload.data(), h->payload_size);
  if (Status s = wire::VerifyPayload(*header, payload); !s.ok()) {
    return Refuse(h, s.code(), s.message());
  }
  wire::Auth auth;
  if (Status s = wire::Decode(payload, &auth); !s.ok()) return Refuse(h, s.code(), s.message());
  wire::Mac expected = wire::ComputeMac(options_.token, wire::MacSide::kClient, h->challenge,
                                        auth.client_nonce, auth.role);
  if (!wire::MacEquals(expected, auth.mac)) {
    return Refuse(h, StatusCode::kUnauthenticated,
                  "authentication failed: the peer does not hold the publisher's token");
  }
  if (!options_.token.empty()) {
    if (!seen_nonces_.insert(auth.client_nonce).second) {
      return Refuse(h, StatusCode::kUnauthenticated, "authentication failed: replayed nonce");
    }
    nonce_order_.push_back(auth.client_nonce);
    if (nonce_order_.size() > kRememberedNonces) {
      seen_nonces_.erase(nonce_order_.front());
      nonce_order_.pop_front();
    }
  }
  wire::AuthOk ok{wire::ComputeMac(options_.token, wire::MacSide::kServer, h->challenge,
                                   auth.client_nonce, auth.role)};
  std::vector<uint8_t> body;
  wire::Encode(ok, &body);
  h->out.assign(wire::kHeaderBytes, 0);
  wire::EncodeHeader(wire::FrameType::kAuthOk, body,
                     std::span<uint8_t, wire::kHeaderBytes>(h->out.data(), wire::kHeaderBytes));
  h->out.insert(h->out.end(), body.begin(), body.end());
  asio::async_write(h->socket, asio::buffer(h->out), [this, h](asio::error_code ec, size_t) {
    if (ec) return Finish(h);
    StartSession(h);
  });
}

void TcpServerImpl::Refuse(std::shared_ptr<Handshake> h, StatusCode code, const std::string& why) {
  WS_LOG(WARN, "tcp") << "refused " << h->peer << ": " << StatusCodeName(code) << ": " << why;
  std::vector<uint8_t> body;
  wire::Encode(wire::ErrorMessage{code, why.substr(0, wire::kMaxErrorMessageBytes)}, &body);
  h->out.assign(wire::kHeaderBytes, 0);
  wire::EncodeHeader(wire::FrameType::kError, body,
                     std::span<uint8_t, wire::kHeaderBytes>(h->out.data(), wire::kHeaderBytes));
  h->out.insert(h->out.end(), body.begin(), body.end());
  asio::async_write(h->socket, asio::buffer(h->out),
                    [this, h](asio::error_code, size_t) { Finish(h); });
}

void TcpServerImpl::Finish(const std::shared_ptr<Handshake>& h) {
  if (h->finished) return;
  h->finished = true;
  live_.erase(h);
  asio::error_code ignored;
  h->timer.cancel();
  if (h->socket.is_open()) {
    h->socket.close(ignored);
    LedgerAdd(LedgerItem::kFds, -1);
  }
}

void TcpServerImpl::StartSession(std::shared_ptr<Handshake> h) {
  if (h->finished) return;
  sessions_.ReapFinished();
  if (sessions_.active() >= options_.max_connections) {
    return Refuse(h, StatusCode::kResourceExhausted,
                  "connection cap of " + std::to_string(options_.max_connections) + " reached");
  }
  h->finished = true;
  live_.erase(h);
  h->timer.cancel();
  asio::error_code ec;
  int native = h->socket.release(ec);
  LedgerAdd(LedgerItem::kFds, -1);  // re-counted by the UniqueFd below
  if (ec) {
    WS_LOG(WARN, "tcp") << "session for " << h->peer << ": " << ec.message();
    return;
  }
  SessionConfig config{options_.timeout, h->peer, source_, &stopping_, options_.deliver};
  util::UniqueFd refused_fd;
  Status started = sessions_.Start(
      util::UniqueFd(native), "tcp session", [config](int fd) { RunSession(fd, config); },
      &refused_fd);
  if (!started.ok()) {
    // Authenticated, so the peer is told why (briefly: this runs on the io thread) and closed.
    WS_LOG(WARN, "tcp") << "session for " << h->peer << " refused: " << started;
    Channel ch(std::move(refused_fd), "subscriber " + h->peer);
    (void)ch.Send(wire::FrameType::kError, wire::ErrorMessage{started.code(), started.message()},
                  util::Deadline(std::chrono::milliseconds(100)));
  }
}

// Finished sessions are joined promptly so their thread and socket do not outlive the peer.
void TcpServerImpl::ScheduleReap() {
  reap_timer_.expires_after(std::chrono::milliseconds(50));
  reap_timer_.async_wait([this](asio::error_code ec) {
    if (ec || stopping_.load(std::memory_order_acquire)) return;
    sessions_.ReapFinished();
    ScheduleReap();
  });
}

Status TcpServerImpl::Close() {
  if (closed_) return Status::Ok();
  closed_ = true;
  stopping_.store(true, std::memory_order_release);
  // Close the acceptor and every pending handshake on the io thread, then let it finish.
  asio::post(io_, [this] {
    asio::error_code ignored;
    if (acceptor_.is_open()) {
      acceptor_.close(ignored);
      LedgerAdd(LedgerItem::kFds, -1);
    }
    reap_timer_.cancel();
    auto live = live_;  // Finish() erases from live_
    for (const auto& h : live) Finish(h);
  });
  asio::post(io_, [this] { io_.stop(); });
  if (io_thread_.joinable()) {
    io_thread_.join();
    LedgerAdd(LedgerItem::kThreads, -1);
  }
  if (acceptor_.is_open()) {  // the io thread never started
    asio::error_code ignored;
    acceptor_.close(ignored);
    LedgerAdd(LedgerItem::kFds, -1);
  }
  sessions_.CloseAll();
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Server>> StartTcpServer(const Endpoint& endpoint,
                                               const ServerOptions& options,
                                               VersionSource* source) {
  ServerOptions with_token = options;
  WS_ASSIGN_OR_RETURN(with_token.token, util::LoadToken(options.token, options.token_file));
  auto server = std::make_unique<TcpServerImpl>(endpoint, with_token, source);
  WS_RETURN_IF_ERROR(server->Listen());
  return std::unique_ptr<Server>(std::move(server));
}

}  // namespace weightsync::transport::link
