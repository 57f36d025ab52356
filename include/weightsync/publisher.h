// A Publisher makes versions of named tensors — in host memory, or on one CUDA device — available
// to Subscribers: on this host over a Unix socket ("local://NAME": they map its store), on any
// host over tcp ("tcp://HOST:PORT": the bytes stream on the connection, or over NCCL for CUDA
// tensors).
//
// Two ways to hand over tensors:
//  * Register(): the tensors stay in caller memory; Publish(step) copies them into a slot of the
//    publisher's store (shared memory, or a GPU arena for CUDA tensors), so the trainer may change
//    them as soon as Publish returns. A tensor registered under two names (tied weights) is
//    copied once.
//  * Allocate() (host tensors): the tensor lives in the shared-memory store itself;
//    Publish(step) copies nothing. Call BeginWrite() before changing allocated tensors: it waits
//    until no subscriber is reading them, and makes the previous version unavailable until the
//    next Publish. It waits at most PublisherOptions::timeout: a subscriber still reading then
//    has its read revoked (it gets a Timeout at the end of its step and commits nothing: staged,
//    its old weights stay; in place, they are marked invalid) and BeginWrite returns, so one
//    stalled subscriber never stalls the trainer. PublishStats says what it cost.
//  * Register() with PublisherOptions::zero_copy (CUDA tensors): the registered tensors
//    themselves are the published version — no GPU arena, Publish(step) copies nothing (it
//    hashes the tensors where they are); subscribers on this host read the trainer's memory, tcp
//    subscribers receive it over NCCL. As for Allocate(), call BeginWrite() before changing them.
// All registration (Register/Allocate) happens before the first Publish.
//
// Versions are identified by (lineage, session, step): PublisherOptions::lineage and
// resume_from_step say which line of versions a (restarted) trainer continues.
//
// Thread safety: Register/Allocate/Publish/BeginWrite/Close are serialized internally; connection
// handling runs on the publisher's own threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weightsync/manifest.h"
#include "weightsync/options.h"
#include "weightsync/status.h"
#include "weightsync/tensor_view.h"

namespace weightsync {

struct PublishOptions {
  // CUDA tensors: Publish's copies start on the GPU after the work already queued on this
  // cudaStream_t (of the tensors' device) — the kernels that wrote the weights, e.g. PyTorch's
  // current stream — without blocking the host. nullptr: the legacy default stream (where
  // PyTorch works unless told otherwise). Ignored for host tensors.
  void* cuda_stream = nullptr;
  // Delta updates (docs/deltas.md): Publish returns once the version is copied and hashed, and
  // its deltas are encoded after that, off the trainer's path (a subscriber asking for them
  // waits for that encode). true: Publish returns once they are encoded too, and its stats say
  // what they hold (benchmarks, tests, a trainer that logs them). The version is the latest
  // before that wait: a wait past PublisherOptions::timeout fails the call, not the version.
  bool wait_for_deltas = false;
};

struct PublishStats {
  int64_t step = -1;
  uint64_t bytes_copied = 0;  // bytes copied into the arena (0 for arena-allocated tensors)
  double seconds = 0;
  double gbps = 0;
  // What the BeginWrite() before this Publish cost the trainer: the time it waited for readers,
  // and how many reads it revoked when they outlasted PublisherOptions::timeout.
  double wait_for_readers_seconds = 0;
  int revoked_reads = 0;
  // The memory the publisher's store holds for versions, besides the tensors themselves (the
  // extra memory publishing costs the trainer), as allocated: every slot of the arena (slots ×
  // the registered tensors, a slot rounded up to whole pages on the host, to 2 MiB on a GPU), or
  // the ring's buckets (ring_buckets × the bucket, in whole pages); on a GPU the allocation is
  // rounded up to the cuMem granularity. 0 for zero_copy, whose version is the registered
  // tensors. Allocate()d tensors (the arena's direct region) are the tensors themselves and not
  // counted, nor are digests and GPU digest scratch (the ledger's device_bytes has those). The
  // same on every Publish: the store is sized at the first.
  uint64_t store_bytes = 0;
  int store_device = -1;  // where store_bytes is: -1 host memory (a memfd), else the CUDA device
  // Delta updates (PublisherOptions::delta, docs/deltas.md): the step this version is encoded
  // against (-1: none: the first Publish, deltas off, or a store that keeps none). Whether that
  // encode still ran when Publish returned (it runs off the trainer's path unless
  // PublishOptions::wait_for_deltas); once it finished: its segments encoded as deltas and left
  // whole (too large for the room, or Allocate()d tensors), the deltas' bytes, and the bytes of
  // the elements that changed in the encoded segments (all 0 while it runs).
  int64_t delta_base_step = -1;
  bool delta_pending = false;
  uint32_t delta_segments = 0;
  uint32_t whole_segments = 0;
  uint64_t delta_bytes = 0;
  uint64_t changed_bytes = 0;
};

// What the encode of one version's deltas found (Publisher::Deltas, docs/deltas.md).
struct DeltaStats {
  int64_t step = -1;       // the version
  int64_t base_step = -1;  // the step it was encoded against; -1: none (every segment whole)
  uint32_t delta_segments = 0;
  uint32_t whole_segments = 0;
  uint64_t delta_bytes = 0;
  uint64_t changed_bytes = 0;
  double encode_seconds = 0;  // the encode's own time, after the copy and the hashes
};

// One subscriber of a publisher (Publisher::Members): prepared (past the Welcome) and still
// connected; which version it holds, by what it said and what it was sent — the version tag an
// asynchronous RL scheduler needs.
struct MemberInfo {
  std::string peer;  // "10.0.0.7:51234" (tcp), "subscriber connection 3" (local)
  // The step it holds, as it last said: in its latest update request, or after it committed a
  // step (its committed step of this publisher's session; -1: none, a version of another
  // session, or weights it no longer vouches for after a weights check found differences or its
  // registration changed; a request naming a step past this publisher's latest, a strict
  // subscriber's step of the session before a restart, is listed as -1).
  int64_t held_step = -1;
  int64_t sent_step = -1;       // the latest step it was sent whole (it may still be verifying)
  int64_t receiving_step = -1;  // the step being sent to it now; -1: none
  // A relay: the endpoint it serves on, as it announced itself (SubscriberOptions::serve_endpoint,
  // serve_announce); empty for a leaf.
  std::string serves;
  // How many subscribers it serves, its children and theirs, as its latest request said.
  int64_t below = 0;
  std::string locality;  // as it labelled itself (SubscriberOptions::locality); empty: none
  // Publisher::Tree(): how far below this publisher (1: its own member) and, deeper, the
  // endpoint of the relay that serves it (empty at depth 1).
  int depth = 1;
  std::string via;
};

// Internal: how a relay (SubscriberOptions::serve_endpoint) serves a version it received under
// the trainer's identity and digests (src/core/publisher_relay.h).
struct PublisherRelayAccess;

class Publisher {
 public:
  // Binds the endpoint and starts serving. Fails with AlreadyExists if a live publisher serves it.
  // A local:// endpoint belongs to the publisher holding the flock on its lock file (NAME.sock.lock
  // beside the socket) until Close(): of publishers starting together exactly one wins, and a
  // socket left by a publisher that died is replaced (see docs/security.md).
  static Result<std::unique_ptr<Publisher>> Create(const PublisherOptions& options);
  ~Publisher();  // Close(), logging any failure

  Status Register(const std::vector<NamedTensor>& tensors);
  // Returns a view into the arena, zero-filled. Valid until Close().
  Result<TensorView> Allocate(const std::string& name, DType dtype,
                              const std::vector<int64_t>& shape);
  Status BeginWrite();
  // Makes `step` the latest version. Steps must increase. CUDA tensors are copied on a stream of
  // the publisher's own, ordered after the work queued on PublishOptions::cuda_stream (the legacy
  // default stream unless given): kernels that wrote the tensors on another stream must be on
  // that one, or finished. Returns once the version is complete (host and GPU).
  Result<PublishStats> Publish(int64_t step, const PublishOptions& options);
  Result<PublishStats> Publish(int64_t step) { return Publish(step, PublishOptions{}); }
  int64_t latest_step() const;  // -1 before the first Publish
  // The latest version's deltas, once encoded: waits for the encode that runs on after Publish
  // (at most PublisherOptions::timeout). Called before the next Publish (which waits for it
  // anyway), it costs the trainer nothing. FailedPrecondition before the first Publish.
  Result<DeltaStats> Deltas();
  const Manifest& manifest() const;
  // The endpoint subscribers connect to (for tcp://HOST:0, with the port actually bound).
  const std::string& endpoint() const;
  // PublisherOptions::lineage, or the random one chosen at Create when none was given.
  const std::string& lineage() const;
  // The subscribers prepared and connected now, in the order they joined (a relay is one of them;
  // its own children are its Subscriber::ServedMembers()). Any thread.
  std::vector<MemberInfo> Members() const;
  // Every subscriber below this publisher, depth-first: each member followed by the subtree it
  // serves (a relay's children, theirs, ...), with `depth` and `via`. Below depth 1 each entry is
  // as its relay last reported it: at the end of that relay's updates, and between them as its
  // children commit and come and go (docs/relays.md, "Membership"). Any thread.
  std::vector<MemberInfo> Tree() const;
  // Stops serving, closes connections, unmaps and frees the arena. Idempotent.
  Status Close();

  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;
  struct Impl;

 private:
  friend struct PublisherRelayAccess;
  explicit Publisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace weightsync
