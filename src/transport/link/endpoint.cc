#include "transport/link/endpoint.h"

#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <optional>

#include "util/knobs.h"

namespace weightsync::transport::link {
namespace {

std::string SocketDir() {
  if (std::optional<std::string> dir = util::KnobValue(util::Knob::kSocketDir)) return *dir;
  return "/tmp/weightsync-" + std::to_string(::getuid());
}

}  // namespace

std::string Endpoint::ToString() const {
  if (kind == Kind::kTcp) {
    bool v6 = host.find(':') != std::string::npos;
    return "tcp://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  }
  return "local://" + name;
}

namespace {

Result<Endpoint> ParseTcp(const std::string& text, std::string_view rest) {
  Endpoint e;
  e.kind = Endpoint::Kind::kTcp;
  std::string_view port_text;
  if (!rest.empty() && rest[0] == '[') {
    size_t close = rest.find(']');
    if (close == std::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':') {
      return Status::InvalidArgument("endpoint '", text, "': expected tcp://[IPv6]:PORT");
    }
    e.host = std::string(rest.substr(1, close - 1));
    port_text = rest.substr(close + 2);
  } else {
    size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos) {
      return Status::InvalidArgument("endpoint '", text, "': expected tcp://HOST:PORT");
    }
    e.host = std::string(rest.substr(0, colon));
    port_text = rest.substr(colon + 1);
  }
  if (e.host.empty() || e.host.size() > 253) {
    return Status::InvalidArgument("endpoint '", text, "': HOST must be 1..253 characters");
  }
  if (port_text.empty() || port_text.size() > 5) {
    return Status::InvalidArgument("endpoint '", text, "': PORT must be 0..65535");
  }
  uint32_t port = 0;
  for (char c : port_text) {
    if (c < '0' || c > '9') {
      return Status::InvalidArgument("endpoint '", text, "': PORT '", port_text,
                                     "' is not a number");
    }
    port = port * 10 + (c - '0');
  }
  if (port > 65535) {
    return Status::InvalidArgument("endpoint '", text, "': PORT ", port, " exceeds 65535");
  }
  e.port = static_cast<uint16_t>(port);
  e.name = std::string(rest);
  return e;
}

}  // namespace

Result<Endpoint> ParseEndpoint(const std::string& text) {
  constexpr std::string_view kLocal = "local://";
  constexpr std::string_view kTcp = "tcp://";
  if (text.rfind(kTcp, 0) == 0) return ParseTcp(text, std::string_view(text).substr(kTcp.size()));
  if (text.rfind(kLocal, 0) != 0) {
    return Status::InvalidArgument("endpoint '", text,
                                   "': unsupported scheme (expected local://NAME or "
                                   "tcp://HOST:PORT)");
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
  e.lock_path = e.socket_path + ".lock";
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

}  // namespace weightsync::transport::link
