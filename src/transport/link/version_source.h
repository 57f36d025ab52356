// VersionSource: what a transport's server needs from the publisher core — the arena layout and
// pinned versions. Implemented by Publisher::Impl; shared by the shm and tcp servers.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <utility>

#include "transport/store/version_slots.h"
#include "transport/store/version_store.h"
#include "util/deadline.h"
#include "util/unique_fd.h"
#include "weightsync/status.h"
#include "wire/members_report.h"
#include "wire/messages.h"

namespace weightsync::transport::link {

// A version pinned for one subscriber (store/version_slots.h): what Acquire returns and Unpin
// takes back.
using Pin = store::Pin;

// What the server needs from the publisher core.
class VersionSource {
 public:
  virtual ~VersionSource() = default;
  // Waits until the arena exists; returns its layout and fd (owned by the source).
  virtual Result<std::pair<const wire::Welcome*, int>> WaitLayout(
      const util::Deadline& deadline, const std::function<bool()>& give_up) = 0;
  // A fresh fd of chunk `index` of a zero-copy publisher's cuMem memory
  // (VersionStore::ExportAllocationFd), sent after the Welcome that WaitLayout returned.
  virtual Result<util::UniqueFd> ExportAllocationFd(uint32_t index) = 0;
  // Waits until a version satisfies `request`, pins it and describes it. A StepBegin whose step
  // equals request.after_step means "up to date" and pins nothing.
  virtual Result<Pin> Acquire(const wire::UpdateRequest& request, const util::Deadline& deadline,
                              const std::function<bool()>& give_up) = 0;
  // Acquire for a session that reads the whole version at once from the publisher's memory (tcp):
  // a ring publisher pins the version (its registered tensors, fenced by BeginWrite) without
  // joining a round of its ring.
  virtual Result<Pin> AcquireWhole(const wire::UpdateRequest& request,
                                   const util::Deadline& deadline,
                                   const std::function<bool()>& give_up) {
    return Acquire(request, deadline, give_up);
  }
  // Unpins the version and copies its digests into `end`; or, if the publisher revoked the pin
  // meanwhile (BeginWrite stopped waiting for this reader and the trainer may be writing the
  // bytes it read), Timeout saying so: the subscriber must not commit what it read.
  virtual Status Unpin(const Pin& pin, wire::StepEnd* end) = 0;
  // Ring publishers (Welcome::version_buckets > 0), while `pin` is held: the ring slot holding
  // bucket `bucket` of the pinned step, filled first if need be (buckets in order); and the
  // subscriber having read it. A revoked read fails with Timeout saying why.
  virtual Result<uint32_t> AwaitBucket(const Pin& pin, uint32_t bucket,
                                       const util::Deadline& deadline) {
    return Status::FailedPrecondition("bucket ", bucket, ": this publisher has no ring");
  }
  virtual Status ReleaseBucket(const Pin& pin, uint32_t bucket) {
    return Status::FailedPrecondition("bucket ", bucket, ": this publisher has no ring");
  }
  // The pinned version's delta against `base_step` (docs/deltas.md), valid while `pin` is held,
  // once its encode (which runs on after Publish) finished: waits for that until `deadline`
  // (Timeout). Null, at once, where the store keeps none or the delta is against another step.
  virtual Result<const store::SlotDelta*> AwaitDelta(const Pin& /*pin*/, int64_t /*base_step*/,
                                                     const util::Deadline& /*deadline*/) {
    return nullptr;
  }
  // Address of arena offset 0 in this process (the TCP server sends from it).
  virtual const uint8_t* arena_base() const = 0;
  // A ring or zero-copy publisher's registered tensor `tensor` (manifest order) in this process
  // (host memory, or its CUDA device's): what the TCP server sends from (on the socket, or by
  // NCCL), the version being the tensors themselves. Null where there is none.
  virtual const uint8_t* TensorBytes(uint32_t /*tensor*/) const { return nullptr; }
  // Membership and topology (Publisher::Members, docs/relays.md). At each Hello the source either
  // admits the session as a member (*member set, empty answer) or answers the relay endpoint the
  // subscriber is redirected to (PublisherOptions::max_direct; hello.serves and hello.avoid say
  // who is a relay and which one the subscriber just lost). An admitted member counts against
  // the bound from then on, is listed once Ready (prepared: after the Welcome), reports each
  // request (the step it holds, the one being sent, how many subscribers it serves) and each
  // step sent whole, and leaves when its session ends.
  virtual std::string Admit(const std::string& /*peer*/, const wire::Hello& /*hello*/,
                            uint64_t* member) {
    *member = 0;
    return {};
  }
  virtual void Ready(uint64_t /*member*/) {}
  virtual void Requested(uint64_t /*member*/, int64_t /*held*/, int64_t /*sending*/,
                         uint32_t /*below*/) {}
  virtual void Sent(uint64_t /*member*/, int64_t /*step*/) {}
  virtual void Left(uint64_t /*member*/) {}
  // Between updates a member reports the step it committed and, a relay, its subtree
  // (wire::MembersReport; the source may swap its contents out); an error (a step never
  // published) ends its session.
  virtual Status Reported(uint64_t /*member*/, wire::MembersReport& /*report*/) {
    return Status::Ok();
  }
  // Whether the version is the registered tensors (a ring or zero-copy publisher's: TensorBytes
  // answers), which a tcp session sends from, rather than a slot of the store.
  virtual bool VersionIsTensors() const { return false; }
};

// The StepBegin a server sends for the version `pinned` (Acquire's answer), which Unpin needs
// unchanged. Normally `pinned` itself; two fail points (docs/env_vars.md) make it misreport, so
// tests prove the subscriber's checks: "publisher.offer_older_step" (flip) offers a step older
// than the subscriber's committed one, "publisher.offer_bad_slot" (flip) a slot past the arena's
// `slot_count`.
wire::StepBegin AsOffered(const wire::StepBegin& pinned, const wire::UpdateRequest& request,
                          uint32_t slot_count);

// How long the publisher waits on a subscriber's behalf (for its layout, a step, the subscriber
// reading it): the subscriber's own wait (Hello/UpdateRequest::wait_ms) plus a grace period, so
// that a live subscriber always gives up first (its leaving ends the wait as PeerLost) and a
// publisher never ends a session because a wait of its own ran out.
inline util::Deadline PeerWaitDeadline(uint64_t wait_ms) {
  constexpr uint64_t kGraceMs = 2000;
  return util::Deadline(std::chrono::milliseconds(std::min(wait_ms, wire::kMaxWaitMs) + kGraceMs));
}

}  // namespace weightsync::transport::link
