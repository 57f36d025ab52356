// The publisher side of the tcp transport.
//
// An asio io_context thread accepts connections and runs each handshake asynchronously with a
// deadline: Challenge → Auth (HMAC verified, client nonce never seen before) → AuthOk. Until then
// the peer costs one socket and a fixed-size handshake record, never a thread or a buffer. Only
// an authenticated peer gets a session thread:
//   Hello → Welcome → Select → { UpdateRequest → StepBegin → data bytes → StepEnd }*
// A connection that breaks the protocol gets an Error frame (where one can be sent) and is closed
// with the reason logged; other connections are unaffected.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "transport/endpoint.h"
#include "transport/version_source.h"
#include "weightsync/status.h"

namespace weightsync::transport::tcp {

struct TcpServerOptions {
  std::string token;              // empty: no authentication (loopback only)
  int max_connections = 64;       // authenticated sessions at once
  int max_pending = 1024;         // handshakes in progress at once
  std::chrono::milliseconds handshake_timeout{2000};
  std::chrono::milliseconds timeout{10000};  // each frame / data transfer of a session
};

class TcpServer {
 public:
  // Binds and listens. Refuses a non-loopback address without a token.
  static Result<std::unique_ptr<TcpServer>> Start(const Endpoint& endpoint,
                                                  const TcpServerOptions& options,
                                                  VersionSource* source);
  virtual ~TcpServer() = default;
  // The endpoint actually bound (port filled in when 0 was asked for).
  virtual Endpoint bound() const = 0;
  // Stops accepting, ends every handshake and session, joins every thread.
  virtual Status Close() = 0;
};

// True for 127.0.0.0/8 and ::1 (and IPv4-mapped loopback).
bool IsLoopbackAddress(const std::string& host);

}  // namespace weightsync::transport::tcp
