// The publisher's Unix-socket link (StartUnixServer in server.h).
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "plan/plan.h"
#include "transport/link/channel.h"
#include "transport/link/endpoint_lock.h"
#include "transport/link/link.h"
#include "transport/link/publisher_session.h"
#include "transport/link/server.h"
#include "transport/link/session_threads.h"
#include "util/fail_point.h"
#include "util/ledger.h"
#include "util/logging.h"
#include "util/thread.h"
#include "wire/handshake.h"

namespace weightsync::transport::link {
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

// The publisher's Unix-socket link: owner-only socket under the endpoint's lock (endpoint_lock.h),
// peers checked by uid (SO_PEERCRED), the store's fd passed with the Welcome (SCM_RIGHTS); a
// subscriber reads each step from the shared store itself and confirms it with CopyDone.
class UnixServer final : public Server {
 public:
  UnixServer(Endpoint endpoint, ServerOptions options, VersionSource* source,
             std::unique_ptr<EndpointLock> lock, util::UniqueFd fd)
      : endpoint_(std::move(endpoint)),
        options_(std::move(options)),
        source_(source),
        lock_(std::move(lock)),
        listen_fd_(std::move(fd)) {}
  ~UnixServer() override {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "shm") << "server cleanup: " << s;
  }
  const Endpoint& bound() const override { return endpoint_; }
  Status Close() override;
  Status StartAccepting() {
    WS_RETURN_IF_ERROR(util::StartThread(&accept_thread_, "shm accept", [this] { AcceptLoop(); }));
    LedgerAdd(LedgerItem::kThreads, 1);
    return Status::Ok();
  }

 private:
  void AcceptLoop();
  void Serve(int fd, int id);
  // After the Welcome: a zero-copy publisher's cuMem chunk fds, one AllocationFd frame each.
  Status SendAllocationFds(Channel& ch, const wire::Welcome& welcome);

  Endpoint endpoint_;
  ServerOptions options_;
  VersionSource* source_;
  std::unique_ptr<EndpointLock> lock_;  // held from before the bind until after the unlink
  util::UniqueFd listen_fd_;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  SessionThreads sessions_;
  int next_id_ = 1;
  bool closed_ = false;
};

// The subscriber reads a pinned step from the shared store itself and says when it is done. From
// a ring, it reads bucket by bucket: each announced once it is in the ring, and released when
// the subscriber says it has read it. This session fills the next bucket (if no other reader's
// session has) while its subscriber copies the current one, so two ring slots keep it busy.
class CopyDoneDelivery final : public StepDelivery {
 public:
  CopyDoneDelivery(VersionSource* source, const wire::Welcome& welcome)
      : source_(source), buckets_(welcome.version_buckets), slot_count_(welcome.slot_count) {}

  Status Deliver(const Pin& pin, const wire::UpdateRequest& /*request*/, Channel& ch,
                 const Deadline& deadline, bool* /*streaming*/) override {
    const wire::StepBegin& begin = pin.begin;
    if (buckets_ > 0) WS_RETURN_IF_ERROR(DeliverRing(pin, ch, deadline));
    wire::CopyDone done;
    WS_RETURN_IF_ERROR(ch.ReceiveExpect(wire::FrameType::kCopyDone, &done, deadline));
    if (done.step != begin.step) {
      return Status::ProtocolError("copy done for step ", done.step, ", expected ", begin.step);
    }
    return Status::Ok();
  }

 private:
  Status DeliverRing(const Pin& pin, Channel& ch, const Deadline& deadline) {
    wire::RingBucket ready{pin.begin.step, 0, 0};
    wire::RingBucket done;
    WS_ASSIGN_OR_RETURN(ready.slot, source_->AwaitBucket(pin, 0, deadline));
    for (uint32_t b = 0; b < buckets_; ++b) {
      ready.bucket = b;
      // Tests: another slot of the ring than the bucket's, which the subscriber must refuse.
      wire::RingBucket offered = ready;
      if (util::FailPoints::Check("publisher.ring_bad_slot").action == util::FailAction::kFlip) {
        offered.slot = (ready.slot + 1) % slot_count_;
      }
      WS_RETURN_IF_ERROR(ch.Send(wire::FrameType::kRingBucketReady, offered, deadline));
      uint32_t next_slot = 0;
      if (b + 1 < buckets_) {
        WS_ASSIGN_OR_RETURN(next_slot, source_->AwaitBucket(pin, b + 1, deadline));
      }
      WS_RETURN_IF_ERROR(ch.ReceiveExpect(wire::FrameType::kRingBucketDone, &done, deadline));
      if (done.step != ready.step || done.bucket != b || done.slot != ready.slot) {
        return Status::ProtocolError("ring_bucket_done for step ", done.step, " bucket ",
                                     done.bucket, " slot ", done.slot, ", expected step ",
                                     ready.step, " bucket ", b, " slot ", ready.slot);
      }
      WS_RETURN_IF_ERROR(source_->ReleaseBucket(pin, b));
      ready.slot = next_slot;
    }
    return Status::Ok();
  }

  VersionSource* source_;
  uint32_t buckets_;
  uint32_t slot_count_;
};

void UnixServer::AcceptLoop() {
  while (!stopping_.load(std::memory_order_acquire)) {
    pollfd p{listen_fd_.get(), POLLIN, 0};
    int r = ::poll(&p, 1, kPollSliceMs);
    sessions_.ReapFinished();
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
    Status refused;
    util::UniqueFd refused_fd;
    if (sessions_.active() >= options_.max_connections) {
      refused =
          Status::ResourceExhausted("connection cap of ", options_.max_connections, " reached");
      refused_fd = std::move(fd);
    } else {
      const int id = next_id_++;
      refused = sessions_.Start(
          std::move(fd), "shm connection", [this, id](int session_fd) { Serve(session_fd, id); },
          &refused_fd);
    }
    if (!refused.ok()) {
      WS_LOG(WARN, "shm") << "refused connection from pid " << cred.pid << ": " << refused;
      Channel ch(std::move(refused_fd), "subscriber pid " + std::to_string(cred.pid));
      (void)ch.Send(wire::FrameType::kError, wire::ErrorMessage{refused.code(), refused.message()},
                    Deadline(std::chrono::milliseconds(100)));
    }
  }
}

Status UnixServer::SendAllocationFds(Channel& ch, const wire::Welcome& welcome) {
  const uint32_t count = plan::AllocationFdCount(welcome);
  // Fds in flight count against this process's open-file limit (sendmsg: ETOOMANYREFS).
  WS_ASSIGN_OR_RETURN(FdRoom room, FdRoom::Make(count));
  const Deadline deadline(options_.timeout);
  for (uint32_t i = 0; i < count; ++i) {
    // One at a time: a model of a thousand chunks never holds a thousand fds here.
    WS_ASSIGN_OR_RETURN(util::UniqueFd fd, source_->ExportAllocationFd(i));
    WS_RETURN_IF_ERROR(
        ch.Send(wire::FrameType::kAllocationFd, wire::AllocationFd{i}, deadline, fd.get()));
    WS_RETURN_IF_ERROR(fd.Close());  // the subscriber holds its own now
  }
  return Status::Ok();
}

void UnixServer::Serve(int fd, int id) {
  // The channel borrows the fd (SessionThreads owns it). Handshake-sized frames only until the
  // Hello is decoded: a peer that has sent nothing valid yet must not make us reserve a
  // full-size frame buffer with one 24-byte header.
  Channel ch(util::UniqueFd(::dup(fd)), "subscriber connection " + std::to_string(id),
             wire::kMaxHandshakePayloadBytes);
  const SessionConfig config{options_.timeout, "subscriber connection " + std::to_string(id),
                             source_, &stopping_};
  bool streaming = false;
  Status s = [&]() -> Status {
    WS_ASSIGN_OR_RETURN(Admitted admitted, ReceiveHello(ch, config));
    if (admitted.welcome == nullptr) return Status::Ok();  // redirected
    const wire::Welcome& welcome = *admitted.welcome;
    WS_RETURN_IF_ERROR(
        ch.Send(wire::FrameType::kWelcome, welcome, Deadline(options_.timeout), admitted.store_fd));
    WS_RETURN_IF_ERROR(SendAllocationFds(ch, welcome));
    CopyDoneDelivery delivery(source_, welcome);
    return ServeSteps(ch, config, welcome, delivery, &streaming, admitted.member.id());
  }();
  EndSession(ch, config, s, streaming, "shm");
}

Status UnixServer::Close() {
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
  sessions_.CloseAll();
  Status result;
  // The socket file is ours to remove by name: nobody else can have bound one at this path
  // while we hold the endpoint's lock.
  util::FailPoints::Check("shm.server.before_unlink");  // tests: sleep:<ms> widens this window
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

}  // namespace

Result<std::unique_ptr<Server>> StartUnixServer(const Endpoint& endpoint,
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
  auto server =
      std::make_unique<UnixServer>(endpoint, options, source, std::move(lock), std::move(fd));
  WS_RETURN_IF_ERROR(server->StartAccepting());
  return std::unique_ptr<Server>(std::move(server));
}

}  // namespace weightsync::transport::link
