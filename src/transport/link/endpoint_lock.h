// EndpointLock: ownership of a local:// endpoint, as an exclusive flock on its lock file
// (Endpoint::lock_path, next to the socket) held for the owning server's whole life.
//
// Why a lock and not "is anyone listening? no → unlink the stale socket and bind": that probe and
// the unlink are two steps, so two publishers starting over a stale socket could both pass the
// probe, each unlink and bind, and both believe they serve; the loser's Close() then unlinked the
// winner's socket by name. Taking a flock is one atomic step, the kernel drops it however the
// owner dies (so a crashed publisher never blocks its successor), and only the holder touches
// the socket file: holding the lock, a socket file left at the path is stale by definition.
#pragma once

#include <memory>
#include <string>

#include "transport/link/endpoint.h"
#include "util/unique_fd.h"
#include "weightsync/status.h"

namespace weightsync::transport::link {

class EndpointLock {
 public:
  // Creates the lock file if missing (mode 0600) and locks it without waiting. AlreadyExists,
  // naming the endpoint, when another live publisher holds it. The caller has checked the socket
  // directory (EnsureSocketDir).
  static Result<std::unique_ptr<EndpointLock>> Acquire(const Endpoint& endpoint);

  EndpointLock(const EndpointLock&) = delete;
  EndpointLock& operator=(const EndpointLock&) = delete;
  ~EndpointLock();

  // Unlinks the lock file while still holding the lock, then closes it (which releases the lock).
  // In that order: unlinked after the close, the file could already be a successor's lock, and
  // removing it would let a third publisher lock a fresh file beside the successor. Every failure
  // is logged with its cause and the release continues; the aggregate is returned.
  Status Release();

 private:
  EndpointLock(std::string path, util::UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}

  std::string path_;
  util::UniqueFd fd_;  // counted in the ledger like every fd
};

}  // namespace weightsync::transport::link
