// VersionSlots: which version slot of a publisher's store holds which published step, who reads
// it, and the fence on tensors that are read where they are (Allocate()d ones, a zero-copy
// publisher's, a ring's). The trainer's side takes a slot to write (waiting for its readers,
// revoking them past the timeout so a stalled subscriber never stalls the trainer), makes it the
// latest, and fences its writes to shared tensors (BeginWrite); the sessions' side pins a version
// for a subscriber's step (joining the ring's round for a ring) and unpins it, copying out its
// digests — or learning that it was revoked, so the subscriber commits nothing it read.
//
// Thread-safe: the trainer's calls (one at a time: the publisher serializes them) and any number
// of session threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "transport/store/bucket_ring.h"
#include "transport/store/stream_progress.h"
#include "util/deadline.h"
#include "util/mutex.h"
#include "weightsync/status.h"
#include "wire/messages.h"

namespace weightsync::transport::store {

// A version pinned for one subscriber: what Acquire returns and Unpin takes back. `epoch`: the
// slot's epoch when it was pinned (a later revocation moved it on).
struct Pin {
  wire::StepBegin begin;
  uint64_t epoch = 0;
  int ring_member = -1;  // ring publishers: this reader's place in the round (bucket_ring.h)
  // A version still landing (a cut-through relay's, Streaming): how much of it is in the slot.
  // Null for a version published whole.
  StreamProgress* progress = nullptr;
};

// What waiting for readers cost the trainer, and how many reads it revoked.
struct WaitCost {
  double seconds = 0;
  int revoked = 0;
};

class VersionSlots {
 public:
  // Before Arm: no version, every Pin waits.
  VersionSlots() = default;
  // `versions` slots of `digest_count` digests each. `shared`: the slots share tensors read in
  // place (Allocate()d, zero-copy, a ring's), so publishing one makes the others stale and
  // BeginWrite must wait for every reader. `ring` (optional): a ring store's rounds, which Acquire
  // joins and every revocation ends. `timeout`: how long the trainer waits for readers; `who`
  // names the publisher in logs.
  void Arm(int versions, uint32_t digest_count, bool shared, std::unique_ptr<BucketRing> ring,
           std::chrono::milliseconds timeout, std::string who);
  bool has_ring() const { return ring_ != nullptr; }

  // ---- the trainer's side
  // Takes a slot to write step `step` into: one nobody reads that is not the latest (unless it is
  // the only one), else the oldest. It is out of service at once (no new reader pins it) and its
  // readers are waited for, at most `timeout`; past it their pins are revoked. `writer` (a relay's
  // update, docs/relays.md): its own deadline, expired or cancelled, ends the wait sooner, so a
  // slow child never holds its relay past the relay's own deadline.
  uint32_t TakeForWrite(int64_t step, WaitCost* cost, const util::Deadline* writer = nullptr);
  // Cut-through: TakeForWrite's slot, but only one nobody reads (and not the latest, unless it is
  // the only slot): never waits. -1 when there is none now.
  int TakeIdle();
  // Where Publish writes slot `slot`'s digests (only while it is taken for writing).
  std::span<uint64_t> digests(uint32_t slot) { return digests_[slot]; }
  // The slot now holds `step`, the latest version; with shared tensors the others hold none.
  void Published(uint32_t slot, int64_t step);
  // The write failed: the slot holds no version; the next TakeForWrite may reuse it.
  void WriteFailed(uint32_t slot);
  // Cut-through (docs/relays.md): the slot taken for writing holds `step` from now on, the latest
  // version, while its bytes still land there as `progress` says. Sessions that read the whole
  // version at once (tcp) pin it and send what landed; the others wait until it is Published. A
  // later Published(slot, step) makes it whole; StreamFailed gives it up.
  void Streaming(uint32_t slot, int64_t step, StreamProgress* progress);
  // The streamed version will never be whole: the slot holds none, its readers are revoked (their
  // Unpin fails: nothing they read may be committed), and the latest is again the version that
  // was latest before it (its slot was not taken).
  void StreamFailed(uint32_t slot);
  // Shared tensors only: no new reader from here on, and the readers there are waited for (at
  // most `timeout`, then revoked, ring members too); the held versions describe the tensors no
  // longer. Ends at the next Published.
  void BeginWrite(WaitCost* cost);
  int64_t latest_step() const;
  // The latest version's slot and step ({-1, -1} before the first): what the next version is
  // diffed against while it is written into another slot. Its digests (published_digests) stay
  // until the trainer takes that slot for writing again.
  std::pair<int, int64_t> latest() const;
  std::span<const uint64_t> published_digests(uint32_t slot) const { return digests_[slot]; }

  // ---- the sessions' side (transport/link/version_source.h)
  // Waits until a version satisfies `request` and pins it; a StepBegin whose step equals
  // request.after_step means "up to date" and pins nothing. With a ring, joins the round of the
  // pinned step (`whole`: reads the version at once from the tensors, tcp: pins it, joins no
  // round). Only `whole` readers pin a version still landing (Streaming; Pin::progress set).
  Result<Pin> Acquire(const wire::UpdateRequest& request, const util::Deadline& deadline,
                      const std::function<bool()>& give_up, bool whole = false);
  // Unpins and copies the version's digests into `end`; Timeout if the pin was revoked meanwhile
  // (the trainer may be writing what it read: nothing may be committed); Unavailable for a version
  // still landing (its digests are not there yet).
  Status Unpin(const Pin& pin, wire::StepEnd* end);
  // A ring's slot holding `bucket` of the pinned step, filled first if need be; and the bucket
  // read. FailedPrecondition without a ring.
  Result<uint32_t> AwaitBucket(const Pin& pin, uint32_t bucket, const util::Deadline& deadline);
  Status ReleaseBucket(const Pin& pin, uint32_t bucket);

  // Every wait ends with Unavailable; later calls get it at once.
  void Close();

 private:
  struct Version {
    int64_t step = -1;   // -1: holds no available version
    int readers = 0;     // pins of the current epoch
    int revoked = 0;     // pins of earlier epochs (revoked), not yet unpinned
    uint64_t epoch = 0;  // incremented when this version's readers are revoked
    bool writing = false;
    StreamProgress* progress = nullptr;  // Streaming until Published or StreamFailed
  };
  Result<Pin> PinVersion(const wire::UpdateRequest& request, const util::Deadline& deadline,
                         const std::function<bool()>& give_up, bool landing_ok);
  // Stops waiting for the readers of `v`: their pins are revoked (an error at Unpin) and no
  // longer hold its memory; on a ring, every member of the round as well.
  void RevokeReaders(Version* v) WS_REQUIRES(mu_);
  // Waits until readers() is 0, at most the timeout; past it revoke() ends their reads and
  // what() (only then: a write allocates nothing) names the wait in the log.
  template <typename Readers, typename Revoke, typename What>
  void WaitForReaders(Readers readers, Revoke revoke, What what, WaitCost* cost,
                      const util::Deadline* writer = nullptr) WS_REQUIRES(mu_);

  mutable util::Mutex mu_;
  util::CondVar cv_;
  std::vector<Version> versions_ WS_GUARDED_BY(mu_);
  // Digests per slot: written by the trainer while the slot is `writing` (no reader can pin it
  // then), copied out by Unpin under mu_ while the slot is pinned (no writer can take it then).
  std::vector<std::vector<uint64_t>> digests_;
  int latest_ WS_GUARDED_BY(mu_) = -1;
  int64_t latest_step_ WS_GUARDED_BY(mu_) = -1;
  // The latest version before the one streaming, which StreamFailed makes the latest again.
  int before_stream_ WS_GUARDED_BY(mu_) = -1;
  int64_t before_stream_step_ WS_GUARDED_BY(mu_) = -1;
  bool shared_writing_ WS_GUARDED_BY(mu_) = false;  // BeginWrite until the next Published
  bool closed_ WS_GUARDED_BY(mu_) = false;
  // Set by Arm, before any session reads them (sessions start after the layout is fixed).
  bool shared_ = false;
  std::unique_ptr<BucketRing> ring_;
  std::chrono::milliseconds timeout_{10000};
  std::string who_;
};

}  // namespace weightsync::transport::store
