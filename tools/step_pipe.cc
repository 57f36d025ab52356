#include "step_pipe.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

namespace weightsync::tools {

Status WriteMessage(int fd, const void* message, size_t bytes) {
  const char* p = static_cast<const char*>(message);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EPIPE) return Status::PeerLost("demo peer process closed its pipe");
    if (n < 0) return Status::FromErrno(errno, "write to demo pipe");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status ReadMessage(int fd, void* message, size_t bytes, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  char* p = static_cast<char*>(message);
  while (bytes > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) {
      return Status::Timeout("demo peer process sent nothing within ", timeout.count(), " ms");
    }
    pollfd pfd{fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::FromErrno(errno, "poll on demo pipe");
    if (r == 0) continue;
    ssize_t n = ::read(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "read from demo pipe");
    if (n == 0) return Status::PeerLost("demo peer process exited");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace weightsync::tools
