// Endpoint: where a publisher serves. "local://NAME" is a Unix socket under a per-user directory
// (mode 0700): $WEIGHTSYNC_SOCKET_DIR if set, else /tmp/weightsync-UID.
#pragma once

#include <string>

#include "weightsync/status.h"

namespace weightsync::transport {

struct Endpoint {
  enum class Kind { kLocal } kind = Kind::kLocal;
  std::string name;         // NAME
  std::string socket_path;  // resolved path of the Unix socket
};

// NAME: 1..64 of [A-Za-z0-9._-], not starting with '.'. InvalidArgument names the problem.
Result<Endpoint> ParseEndpoint(const std::string& text);

// Creates the socket directory (0700) if missing; refuses one owned by another user or open to
// group/others.
Status EnsureSocketDir(const Endpoint& endpoint);

}  // namespace weightsync::transport
