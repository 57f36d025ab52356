// The subscriber's Unix-socket link: same host, the publisher's uid checked, the store's fd passed
// with the Welcome; the subscriber reads each step from the store itself and confirms the copy.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "transport/link/link.h"
#include "util/fail_point.h"

namespace weightsync::transport::link {
namespace {

class UnixLink final : public Link {
 public:
  explicit UnixLink(Endpoint endpoint)
      : Link(LinkKind::kUnix, "publisher local://" + endpoint.name),
        endpoint_(std::move(endpoint)) {}

 private:
  Result<std::unique_ptr<Channel>> Open(const util::Deadline& deadline) override {
    WS_FAIL_POINT_RETURN("shm.prepare");
    WS_ASSIGN_OR_RETURN(util::UniqueFd fd, ConnectUnix(endpoint_.socket_path, deadline));
    // The peer runs as this user (checked at connect): full-size frames, a Welcome may be large.
    return std::make_unique<Channel>(std::move(fd), peer());
  }
  bool confirms_copy() const override { return true; }

  Endpoint endpoint_;
};

}  // namespace

std::unique_ptr<Link> NewUnixLink(const Endpoint& endpoint) {
  return std::make_unique<UnixLink>(endpoint);
}

Result<util::UniqueFd> ConnectUnix(const std::string& path, const util::Deadline& deadline) {
  int raw = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (raw < 0) return Status::FromErrno(errno, "socket");
  util::UniqueFd fd(raw);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  // A listening publisher accepts at once; retry briefly while it starts (ENOENT/ECONNREFUSED).
  while (true) {
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) break;
    int err = errno;
    if (err == EINTR) continue;
    if (deadline.cancelled()) return Status::Cancelled("connecting to '", path, "': cancelled");
    if ((err == ENOENT || err == ECONNREFUSED) && !deadline.expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (err == ENOENT || err == ECONNREFUSED) {
      return Status::NotFound("no publisher is serving '", path, "' (", std::strerror(err), ")");
    }
    return Status::FromErrno(err, "connect '" + path + "'");
  }
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Status::FromErrno(errno, "SO_PEERCRED on '" + path + "'");
  }
  if (cred.uid != ::getuid()) {
    return Status::Unauthenticated("'", path, "' is served by uid ", cred.uid,
                                   ", not by this user (uid ", ::getuid(), ")");
  }
  return fd;
}

}  // namespace weightsync::transport::link
