// What a relay (SubscriberOptions::serve_endpoint, docs/relays.md) needs of a Publisher beyond
// its public interface: to serve under the trainer's session (so children tell versions apart
// exactly as they would from the trainer) and to publish a received version with the trainer's
// digests instead of hashing it again.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "transport/store/stream_progress.h"
#include "util/deadline.h"
#include "weightsync/publisher.h"
#include "weightsync/status.h"
#include "wire/members_report.h"
#include "wire/messages.h"

namespace weightsync {

struct PublisherRelayAccess {
  // Takes the trainer's identity from its Welcome: session, lineage, the step it resumed from, and
  // its digest segment size (so digests number the same segments). Only before the first
  // publish: sessions read the identity with the layout.
  static Status AdoptIdentity(Publisher& publisher, const wire::Welcome& upstream);
  // Publish(step) of a host or GPU store whose bytes are copied, not hashed; `digests` (the
  // trainer's, of exactly these bytes, every one) are what subscribers verify against. `writer`:
  // the relay's update deadline (and its cancel), which ends the wait for a slot's readers as the
  // publisher's timeout does (their reads revoked).
  static Result<PublishStats> PublishGiven(Publisher& publisher, int64_t step,
                                           std::span<const uint64_t> digests,
                                           const util::Deadline& writer);
  // Cut-through (docs/relays.md, "Cut-through"): a version served while the relay receives it.
  // BeginStream takes a slot for `step` that nobody reads (never waiting: Busy when there is
  // none, and the step is stored and forwarded instead) and makes it the latest version at once,
  // still landing: tcp sessions send what
  // landed and wait for the rest, the others wait for it whole. The relay copies each tensor's
  // bytes into the slot as they arrive (tensor i at slot + offsets[i]) and says how far with
  // progress->Landed. FinishStream sets the trainer's digests and ends the step for every session;
  // AbortStream fails their reads instead (nothing committed downstream) and the version before
  // is the latest again. Only for a host store of registered tensors (a relay's).
  struct StreamTarget {
    uint8_t* slot = nullptr;
    std::span<const uint64_t> offsets;  // per tensor, in manifest order
    transport::store::StreamProgress* progress = nullptr;
  };
  static Result<StreamTarget> BeginStream(Publisher& publisher, int64_t step);
  static Result<PublishStats> FinishStream(Publisher& publisher, std::span<const uint64_t> digests);
  static void AbortStream(Publisher& publisher, const Status& why);
  // How many subscribers it serves, its members and everyone they said they serve (the relay's
  // UpdateRequest::below). Allocates nothing: a relay's steady update asks it every time.
  static uint32_t Below(const Publisher& publisher);

  // Called (on a session's thread, no lock of the publisher's held) whenever a member joins,
  // leaves, asks for a step or reports: the relay then reports its subtree upward. Empty: nobody.
  static void OnMembersChanged(Publisher& publisher, std::function<void()> tell);
  // Its whole subtree (Publisher::Tree) into `report->members`, as the wire bounds it (the first
  // wire::kMaxReportedMembers entries no deeper than wire::kMaxTreeDepth), reusing their storage,
  // with `below` (as Below) and `room` (how many more members it takes directly before it
  // redirects newcomers: PublisherOptions::max_direct less those it has; wire::kNoBound without
  // a bound), all as of one moment.
  static void FillReport(const Publisher& publisher, wire::MembersReport* report);
};

}  // namespace weightsync
