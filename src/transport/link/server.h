// Server: the publisher's side of its link — it owns the endpoint, accepts subscribers (checking
// who they are: the peer uid on a Unix socket, the HMAC handshake over tcp) and serves each one
// a session (publisher_session.h) over the publisher core's VersionSource, on its own thread.
// StartServer picks the link from the endpoint: the one place that names both.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "transport/link/endpoint.h"
#include "transport/link/publisher_session.h"
#include "transport/link/version_source.h"
#include "weightsync/status.h"

namespace weightsync::transport::link {

struct ServerOptions {
  int max_connections = 64;                  // sessions at once; more are refused with a reason
  std::chrono::milliseconds timeout{10000};  // each frame; a subscriber reading a pinned step
  // tcp only: the shared secret (PublisherOptions::token / token_file; both empty: the
  // environment's, else none: loopback only, no authentication), handshakes in flight, and how
  // long one may take.
  std::string token;
  std::string token_file;
  int max_pending = 1024;
  std::chrono::milliseconds handshake_timeout{2000};
  // tcp only: how a session sends a step's bytes (publisher_session.h); required there.
  DeliveryFactory deliver = nullptr;
};

class Server {
 public:
  virtual ~Server() = default;
  // The endpoint subscribers connect to (tcp: with the port actually bound).
  virtual const Endpoint& bound() const = 0;
  // Stops accepting, ends every session, joins every thread, gives the endpoint up.
  virtual Status Close() = 0;
};

Result<std::unique_ptr<Server>> StartServer(const Endpoint& endpoint, const ServerOptions& options,
                                            VersionSource* source);

// The two links (unix_server.cc, tcp_server.cc).
Result<std::unique_ptr<Server>> StartUnixServer(const Endpoint& endpoint,
                                                const ServerOptions& options,
                                                VersionSource* source);
Result<std::unique_ptr<Server>> StartTcpServer(const Endpoint& endpoint,
                                               const ServerOptions& options, VersionSource* source);

}  // namespace weightsync::transport::link
