#include "transport/endpoint.h"

#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace weightsync::transport {
namespace {

std::string SocketDir() {
  if (const char* dir = std::getenv("WEIGHTSYNC_SOCKET_DIR"); dir != nullptr && *dir) return dir;
  return "/tmp/weightsync-" + std::to_string(::getuid());
}

}  // namespace

Result<Endpoint> ParseEndpoint(const std::string& text) {
  constexpr std::string_view kLocal = "local://";
  if (text.rfind(kLocal, 0) != 0) {
    return Status::InvalidArgument("endpoint '", text,
                                   "': unsupported scheme (expected local://NAME)");
  }
  std::string name = text.substr(kLocal.size());
  if (name.empty() || name.size() > 64) {
    return Status::InvalidArgument("endpoint '", text, "': NAME must be 1..64 characters");
  }
  if (name[0] == '.') {
    return Status::InvalidArgument("endpoint '", text, "': NAME must not start with '.'");
  }
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) {
      return Status::InvalidArgument("endpoint '", text, "': character '", c,
                                     "' not allowed in NAME (use A-Z a-z 0-9 . _ -)");
    }
  }
  Endpoint e;
  e.name = name;
  e.socket_path = SocketDir() + "/" + name + ".sock";
  if (e.socket_path.size() >= sizeof(sockaddr_un::sun_path)) {
    return Status::InvalidArgument("endpoint '", text, "': socket path '", e.socket_path,
                                   "' is longer than ", sizeof(sockaddr_un::sun_path) - 1,
                                   " bytes");
  }
  return e;
}

Status EnsureSocketDir(const Endpoint& endpoint) {
  std::string dir = endpoint.socket_path.substr(0, endpoint.socket_path.rfind('/'));
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::FromErrno(errno, "mkdir '" + dir + "'");
  }
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return Status::FromErrno(errno, "stat '" + dir + "'");
  if (!S_ISDIR(st.st_mode)) {
    return Status::FailedPrecondition("socket dir '", dir, "' is not a directory");
  }
  if (st.st_uid != ::getuid()) {
    return Status::Unauthenticated("socket dir '", dir, "' is owned by uid ", st.st_uid,
                                   ", not by this user (uid ", ::getuid(), ")");
  }
  if ((st.st_mode & 077) != 0) {
    return Status::Unauthenticated("socket dir '", dir, "' has mode ", std::oct,
                                   (st.st_mode & 0777), "; it must be 0700 (owner-only)");
  }
  return Status::Ok();
}

}  // namespace weightsync::transport
