// Link: a two-rank NCCL communicator between a publisher session (rank 0, sends) and a
// subscriber's transfer handle (rank 1, receives), plus a stream and an event on the rank's
// device. Created once per handle / per session from a unique id exchanged over the
// authenticated control channel, and reused every step.
//
// The communicator is non-blocking (ncclConfig_t.blocking = 0), so no NCCL call can hang the
// caller: every wait — communicator init, a group of sends or receives, the stream — is a poll
// bounded by the deadline that also watches the communicator's async error and the control
// connection. A dead peer on one host is invisible to NCCL (PLATFORM.md: no async error after
// seconds), so the control connection is what tells "peer died" (PeerLost) from "peer is slow"
// (Timeout). On any failure the communicator is aborted (ncclCommAbort) before the error is
// returned; an aborted link is dead and its owner destroys it.
//
// Host code, no NCCL or CUDA headers; nccl_link.cu implements it, nccl_link_stub.cc answers
// Unavailable in a build without CUDA.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "util/deadline.h"
#include "weightsync/status.h"

namespace weightsync::cuda::nccl {

inline constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
using UniqueId = std::array<uint8_t, kUniqueIdBytes>;

// OK when this process can use the nccl transport: built with CUDA, and the NCCL library loads
// with every entry point and a recent enough version (nccl_api.h). Unavailable says which part is
// missing. Whether a CUDA device is present is cuda::CudaAvailable()'s question.
Status NcclAvailable();
// The loaded library's NCCL_VERSION_CODE (e.g. 22809), 0 when NcclAvailable() is not OK.
int NcclVersionCode();

// A fresh unique id (ncclGetUniqueId; it starts NCCL's bootstrap listener in this process). A
// bearer capability: send it only over the authenticated control channel, never log it.
Result<UniqueId> NewUniqueId();

// What every wait watches besides its deadline (and the deadline's cancel flag).
struct Watch {
  int control_fd = -1;                          // peer closed it (or it broke) → PeerLost
  const std::atomic<bool>* stopping = nullptr;  // set → Cancelled (the server is closing)
  std::string peer;  // names the peer in errors (owned: callers built it from temporaries)
};

// One contiguous device byte range of a prepared transfer.
struct Piece {
  void* data = nullptr;
  uint64_t bytes = 0;
};

// Communicators alive in this process, and the ones aborted so far (tests: the first returns to
// its baseline after every release; the second proves a failure aborted one).
int64_t LiveCommunicators();
int64_t AbortedCommunicators();

class Link {
 public:
  // Joins the two-rank communicator named by `id` as `rank` (0: publisher, 1: subscriber) on CUDA
  // device `device`: ncclCommInitRankConfig in non-blocking mode, polled until ready.
  static Result<std::unique_ptr<Link>> Connect(const UniqueId& id, int rank, int device,
                                               const util::Deadline& deadline, const Watch& watch);
  ~Link();  // Close(), logging a failure; local only (abort, never a collective)

  // Sends (rank 0, the broadcast root) or receives (rank 1) every piece, in order, as one group of
  // ncclBroadcast calls on the link's stream, and waits until the stream has finished them. Pieces
  // match one for one between the two ranks (same count, same sizes). Allocates nothing; `pieces`
  // is the caller's prepared list. Any failure aborts the communicator first; the message names
  // what was in flight.
  Status Transfer(std::span<const Piece> pieces, const util::Deadline& deadline,
                  const Watch& watch);

  // Aborts the communicator (ncclCommAbort) and waits, bounded, until the link's stream is idle,
  // so no NCCL kernel touches the pieces afterwards. Idempotent.
  Status Abort();
  // Abort(), then the stream and event. What a release calls. Idempotent.
  Status Close();

  int rank() const;
  int device() const;
  bool live() const;               // false once aborted
  double connect_seconds() const;  // how long Connect took

  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;
  struct Impl;

 private:
  explicit Link(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace weightsync::cuda::nccl
