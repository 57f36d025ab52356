// Endpoint: where a publisher serves.
//  "local://NAME"     a Unix socket under a per-user directory (mode 0700):
//                     $WEIGHTSYNC_SOCKET_DIR if set, else /tmp/weightsync-UID, next to the lock
//                     file whose flock says which publisher owns it (shm/endpoint_lock.h).
//  "tcp://HOST:PORT"  HOST a name, an IPv4 address or a bracketed IPv6 address; PORT 0..65535.
#pragma once

#include <cstdint>
#include <string>

#include "weightsync/status.h"

namespace weightsync::transport::link {

struct Endpoint {
  enum class Kind { kLocal, kTcp } kind = Kind::kLocal;
  std::string name;         // NAME (local) or "HOST:PORT" (tcp), for messages
  std::string socket_path;  // local: resolved path of the Unix socket
  std::string lock_path;    // local: socket_path + ".lock"
  std::string host;         // tcp
  uint16_t port = 0;        // tcp
  std::string ToString() const;
};

// NAME: 1..64 of [A-Za-z0-9._-], not starting with '.'. InvalidArgument names the problem.
Result<Endpoint> ParseEndpoint(const std::string& text);

// Creates the socket directory (0700) if missing; refuses one owned by another user or open to
// group/others.
Status EnsureSocketDir(const Endpoint& endpoint);

}  // namespace weightsync::transport::link
