// The publisher side of the shm transport: listens on the endpoint's Unix socket (owner-only),
// accepts subscribers (peer uid checked, connection cap), and serves each on its own thread:
// Hello → Welcome(+arena fd) → { UpdateRequest → StepBegin → CopyDone → StepEnd }*.
// A connection that breaks the protocol gets an Error frame and is closed, with the reason
// logged; other connections are unaffected.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <thread>

#include "transport/endpoint.h"
#include "transport/shm/endpoint_lock.h"
#include "transport/version_source.h"
#include "util/deadline.h"
#include "util/unique_fd.h"
#include "weightsync/status.h"

namespace weightsync::transport::shm {

struct ServerOptions {
  int max_connections = 64;
  std::chrono::milliseconds timeout{10000};
};

class ShmServer {
 public:
  // Takes ownership of `endpoint` (its EndpointLock; AlreadyExists if a live publisher holds it),
  // binds its socket (a socket file left by a dead owner is replaced) and starts accepting.
  static Result<std::unique_ptr<ShmServer>> Start(const Endpoint& endpoint,
                                                  const ServerOptions& options,
                                                  VersionSource* source);
  ~ShmServer();
  // Stops accepting, closes every connection, joins every thread, unlinks the socket, then gives
  // up the endpoint (EndpointLock::Release).
  Status Close();
  int active_connections() const { return active_.load(std::memory_order_relaxed); }

 private:
  struct Connection {
    util::UniqueFd fd;
    std::thread thread;
    std::atomic<bool> done{false};
    int id = 0;
  };
  ShmServer(Endpoint endpoint, ServerOptions options, VersionSource* source,
            std::unique_ptr<EndpointLock> lock, util::UniqueFd fd);
  void AcceptLoop();
  void Serve(Connection* conn);
  Status ServeOrError(Connection* conn);
  void ReapFinished(bool all);

  Endpoint endpoint_;
  ServerOptions options_;
  VersionSource* source_;
  std::unique_ptr<EndpointLock> lock_;  // held from before the bind until after the unlink
  util::UniqueFd listen_fd_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> active_{0};
  std::thread accept_thread_;
  std::mutex mu_;
  std::list<std::unique_ptr<Connection>> connections_;  // guarded by mu_
  int next_id_ = 1;
  bool closed_ = false;
};

}  // namespace weightsync::transport::shm
