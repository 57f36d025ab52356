#include "transport/shm/shm_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "transport/shm/shm_handle.h"
#include "util/ledger.h"
#include "util/logging.h"
#include "util/thread.h"
#include "wire/channel.h"
#include "wire/handshake.h"

namespace weightsync::transport::shm {
namespace {

using util::Deadline;
using util::LedgerAdd;
using util::LedgerItem;

constexpr int kPollSliceMs = 50;

// True when a live process accepts on `path`. A socket whose endpoint lock we hold can only be
// live if a publisher of a build older than the lock serves it: that one took no lock, so its
// socket answering is the only sign of it, and it must not lose its endpoint to us.
bool SomeoneListens(const std::string& path) {
  auto fd = ConnectUnix(path, Deadline(std::chrono::milliseconds(0)));
  return fd.ok();
}

// Clears the socket path for bind(). Only the holder of the endpoint's lock may call it: holding
// the lock, a socket file left there belongs to an owner that is gone.
Status RemoveStaleSocket(const Endpoint& endpoint) {
  struct stat st;
  if (::lstat(endpoint.socket_path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return Status::FromErrno(errno, "stat '" + endpoint.socket_path + "'");
  }
  if (SomeoneListens(endpoint.socket_path)) {
    return Status::AlreadyExists("endpoint ", endpoint.ToString(),
                                 " is already served by a live publisher (", endpoint.socket_path,
                                 ")");
  }
  WS_LOG(INFO, "shm") << "replacing stale socket " << endpoint.socket_path;
  if (::unlink(endpoint.socket_path.c_str()) != 0 && errno != ENOENT) {
    return Status::FromErrno(errno, "unlink stale socket '" + endpoint.socket_path + "'");
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<ShmServer>> ShmServer::Start(const Endpoint& endpoint,
                                                    const ServerOptions& options,
                                                    VersionSource* source) {
  WS_RETURN_IF_ERROR(EnsureSocketDir(endpoint));
  // Ownership first, the socket file second. Any failure below gives the endpoint back (the
  // lock's destructor releases it); a socket file this leaves behind is stale for the next owner.
  WS_ASSIGN_OR_RETURN(std::unique_ptr<EndpointLock> lock, EndpointLock::Acquire(endpoint));
  WS_RETURN_IF_ERROR(RemoveStaleSocket(endpoint));
  // Non-blocking: the accept loop polls first, and Close() wakes that poll with shutdown(), after
  // which a blocking accept() could wait for a connection that never comes.
  int raw = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (raw < 0) return Status::FromErrno(errno, "socket");
  util::UniqueFd fd(raw);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, endpoint.socket_path.c_str(), sizeof(addr.sun_path) - 1);
  // Owner-only from the moment the socket file exists.
  mode_t old_umask = ::umask(0177);
  int rc = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int err = errno;
  ::umask(old_umask);
  if (rc != 0) return Status::FromErrno(err, "bind '" + endpoint.socket_path + "'");
  if (::listen(fd.get(), 128) != 0) {
    return Status::FromErrno(errno, "listen '" + endpoint.socket_path + "'");
  }
  std::unique_ptr<ShmServer> server(
      new ShmServer(endpoint, options, source, std::move(lock), std::move(fd)));
  WS_RETURN_IF_ERROR(util::StartThread(&server->accept_thread_, "shm accept",
                                       [s = server.get()] { s->AcceptLoop(); }));
  LedgerAdd(LedgerItem::kThreads, 1);
  return server;
}

ShmServer::ShmServer(Endpoint endpoint, ServerOptions options, VersionSource* source,
                     std::unique_ptr<EndpointLock> lock, util::UniqueFd fd)
    : endpoint_(std::move(endpoint)),
      options_(options),
      source_(source),
      lock_(std::move(lock)),
      listen_fd_(std::move(fd)) {}

ShmServer::~ShmServer() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "shm") << "server cleanup: " << s;
}

void ShmServer::AcceptLoop() {
  while (!stopping_.load(std::memory_order_acquire)) {
    pollfd p{listen_fd_.get(), POLLIN, 0};
    int r = ::poll(&p, 1, kPollSliceMs);
    ReapFinished(false);
    if (r <= 0) continue;
    int raw = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (raw < 0) {
      if (errno != EINTR && errno != EAGAIN) {
        WS_LOG(WARN, "shm") << Status::FromErrno(errno, "accept on " + endpoint_.socket_path);
      }
      continue;
    }
    util::UniqueFd fd(raw);
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
        cred.uid != ::getuid()) {
      WS_LOG(WARN, "shm") << "refused connection from uid " << cred.uid << " pid " << cred.pid
                          << ": only uid " << ::getuid() << " may subscribe";
      continue;
    }
    if (active_.load(std::memory_order_relaxed) >= options_.max_connections) {
      WS_LOG(WARN, "shm") << "refused connection from pid " << cred.pid << ": connection cap "
                          << options_.max_connections << " reached";
      wire::Channel ch(std::move(fd), "subscriber pid " + std::to_string(cred.pid));
      (void)ch.Send(wire::FrameType::kError,
                    wire::ErrorMessage{StatusCode::kResourceExhausted,
                                       "connection cap of " +
                                           std::to_string(options_.max_connections) +
                                           " reached"},
                    Deadline(std::chrono::milliseconds(100)));
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto conn = std::make_unique<Connection>();
    conn->fd = std::move(fd);
    conn->id = next_id_++;
    Connection* c = conn.get();
    active_.fetch_add(1, std::memory_order_relaxed);
    LedgerAdd(LedgerItem::kConnections, 1);
    if (Status s = util::StartThread(&c->thread, "shm connection", [this, c] { Serve(c); });
        !s.ok()) {
      active_.fetch_sub(1, std::memory_order_relaxed);
      LedgerAdd(LedgerItem::kConnections, -1);
      WS_LOG(WARN, "shm") << "refused connection from pid " << cred.pid << ": " << s;
      wire::Channel ch(std::move(conn->fd), "subscriber pid " + std::to_string(cred.pid));
      (void)ch.Send(wire::FrameType::kError, wire::ErrorMessage{s.code(), s.message()},
                    Deadline(std::chrono::milliseconds(100)));
      continue;
    }
    LedgerAdd(LedgerItem::kThreads, 1);
    connections_.push_back(std::move(conn));
  }
}

void ShmServer::ReapFinished(bool all) {
  std::list<std::unique_ptr<Connection>> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (all || (*it)->done.load(std::memory_order_acquire)) {
        finished.push_back(std::move(*it));
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : finished) {
    if (all && c->fd.valid()) ::shutdown(c->fd.get(), SHUT_RDWR);  // wakes a blocked Serve()
    c->thread.join();
    LedgerAdd(LedgerItem::kThreads, -1);
  }
}

void ShmServer::Serve(Connection* conn) {
  Status s = ServeOrError(conn);
  if (!s.ok() && !stopping_.load(std::memory_order_acquire) && s.code() != StatusCode::kPeerLost) {
    WS_LOG(WARN, "shm") << "connection " << conn->id << " closed: " << s;
  } else if (!s.ok()) {
    WS_LOG(DEBUG, "shm") << "connection " << conn->id << " ended: " << s;
  }
  active_.fetch_sub(1, std::memory_order_relaxed);
  LedgerAdd(LedgerItem::kConnections, -1);
  conn->done.store(true, std::memory_order_release);
}

Status ShmServer::ServeOrError(Connection* conn) {
  // The channel borrows the fd: Close() (not this thread) owns closing it, so a shutdown from
  // Close() always targets a live descriptor.
  // Handshake-sized frames only until the Hello is decoded: a peer that has sent nothing valid
  // yet must not make us reserve a full-size frame buffer with one 24-byte header.
  wire::Channel ch(util::UniqueFd(::dup(conn->fd.get())),
                   "subscriber connection " + std::to_string(conn->id),
                   wire::kMaxHandshakePayloadBytes);
  auto give_up = [&] { return stopping_.load(std::memory_order_acquire) || ch.PeerHungUpOrSpoke(); };
  // Every session this side ends is ended with an error frame that says why (a departed peer
  // cannot read one).
  auto fail = [&](Status s) {
    if (s.code() != StatusCode::kPeerLost) {
      std::string msg = s.message().substr(0, wire::kMaxErrorMessageBytes);
      (void)ch.Send(wire::FrameType::kError, wire::ErrorMessage{s.code(), msg},
                    Deadline(std::chrono::milliseconds(200)));
    }
    return s;
  };

  wire::Hello hello;
  Status s = ch.ReceiveExpect(wire::FrameType::kHello, &hello, Deadline(options_.timeout));
  if (!s.ok()) return fail(s.WithContext("handshake"));
  // Same uid (SO_PEERCRED at accept) and speaking our protocol: full-size frames from here on.
  ch.set_max_payload(wire::kMaxPayloadBytes);
  if (hello.protocol_version != wire::kProtocolVersion) {
    return fail(Status::FailedPrecondition("subscriber speaks protocol version ",
                                           hello.protocol_version, ", publisher speaks ",
                                           wire::kProtocolVersion));
  }
  auto layout = source_->WaitLayout(PeerWaitDeadline(hello.wait_ms), give_up);
  if (!layout.ok()) return fail(layout.status());
  s = ch.Send(wire::FrameType::kWelcome, *layout->first, Deadline(options_.timeout),
              layout->second);
  if (!s.ok()) return s;

  wire::UpdateRequest request;
  wire::StepEnd end;
  while (!stopping_.load(std::memory_order_acquire)) {
    // Idle between updates: wait for the next request without a deadline, but wake to notice
    // Close().
    pollfd p{ch.fd(), POLLIN, 0};
    int r = ::poll(&p, 1, kPollSliceMs);
    if (r == 0 || (r < 0 && errno == EINTR)) continue;
    s = ch.ReceiveExpect(wire::FrameType::kUpdateRequest, &request, Deadline(options_.timeout));
    if (!s.ok()) return fail(s);
    // Waiting for the step is bounded by the subscriber's wait, not ours; once a version is
    // pinned for it, our deadline bounds its reading (a stalled reader loses the version).
    auto begin = source_->Acquire(request, PeerWaitDeadline(request.wait_ms), give_up);
    if (!begin.ok()) return fail(begin.status());
    s = ch.Send(wire::FrameType::kStepBegin,
                AsOffered(*begin, request, layout->first->slot_count),
                Deadline(options_.timeout));
    if (begin->step == request.after_step) {
      if (!s.ok()) return s;
      continue;  // up to date: nothing pinned
    }
    wire::CopyDone done;
    if (s.ok()) {
      s = ch.ReceiveExpect(wire::FrameType::kCopyDone, &done, Deadline(options_.timeout));
    }
    source_->Unpin(*begin, &end);
    if (!s.ok()) return fail(s);
    if (done.step != begin->step) {
      return fail(Status::ProtocolError("copy done for step ", done.step, ", expected ",
                                        begin->step));
    }
    s = ch.Send(wire::FrameType::kStepEnd, end, Deadline(options_.timeout));
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

Status ShmServer::Close() {
  if (closed_) return Status::Ok();
  closed_ = true;
  stopping_.store(true, std::memory_order_release);
  // Wakes the accept loop's poll now rather than at the end of its slice: a publisher that
  // closes and one that takes the endpoint over should not wait on each other.
  if (listen_fd_.valid()) ::shutdown(listen_fd_.get(), SHUT_RDWR);
  if (accept_thread_.joinable()) {
    accept_thread_.join();
    LedgerAdd(LedgerItem::kThreads, -1);
  }
  ReapFinished(true);
  Status result;
  // The socket file is ours to remove by name: nobody else can have bound one at this path
  // while we hold the endpoint's lock.
  if (::unlink(endpoint_.socket_path.c_str()) != 0 && errno != ENOENT) {
    Status s = Status::FromErrno(errno, "unlink '" + endpoint_.socket_path + "'");
    WS_LOG(WARN, "shm") << "release: " << s;
    result.Update(s);
  }
  if (Status s = listen_fd_.Close(); !s.ok()) {
    WS_LOG(WARN, "shm") << "release: listening socket: " << s;
    result.Update(s);
  }
  // Last: once the lock is gone, a successor may bind the path.
  if (lock_) result.Update(lock_->Release());  // logs each failure itself
  return result;
}

}  // namespace weightsync::transport::shm
