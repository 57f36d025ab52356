#pragma once
// MembersReport (subscriber → publisher, between updates): the step the subscriber committed and,
// for a relay, everyone it serves below it, so the trainer sees the whole tree (docs/relays.md,
// "Membership"). A publisher reads it only where it waits for the next update request.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "weightsync/status.h"
#include "wire/messages.h"

namespace weightsync::wire {

// One subscriber below the reporting relay, depth-first: each relay is followed by its own
// subtree. `depth` 1 is the reporter's own child; `via` is the endpoint of the relay that serves
// it (empty at depth 1: the reporter itself, which its parent knows by MemberInfo::serves).
inline constexpr uint32_t kNoBound = 0xFFFFFFFFu;  // ReportedMember/MembersReport::room

struct ReportedMember {
  std::string peer;      // as its relay saw it: ≤ kMaxPeerBytes printable ASCII (spaces allowed)
  std::string serves;    // its own serve endpoint (a relay), or empty
  std::string locality;  // as it labelled itself, or empty
  std::string via;       // empty at depth 1, else the endpoint of the relay it is served by
  int64_t held_step = -1;
  int64_t sent_step = -1;
  int64_t receiving_step = -1;
  uint32_t below = 0;
  uint32_t depth = 1;
  uint32_t room = kNoBound;  // a relay: how many more children it takes directly (see below)
  bool operator==(const ReportedMember&) const = default;
};

struct MembersReport {
  int64_t held_step = -1;  // the reporter's committed step of the publisher's session, or -1
  uint32_t below = 0;      // how many it serves below it (its subtree), as UpdateRequest::below
  // A relay: how many more children it takes directly before it redirects them
  // (SubscriberOptions::serve_max_direct less those it has); kNoBound: no bound; 0 for a leaf.
  uint32_t room = 0;
  std::vector<ReportedMember> members;  // its subtree, depth-first, ≤ kMaxReportedMembers
};
inline constexpr uint32_t kMaxPeerBytes = 128;
// A tree of this many subscribers below one relay (1,000 replicas with room to spare); a relay
// with more reports the first ones it lists and says how many there are in `below`.
inline constexpr uint32_t kMaxReportedMembers = 1u << 14;
inline constexpr uint32_t kMaxTreeDepth = 64;
// The largest encoded ReportedMember: four u16-length strings, three i64 steps, three u32.
inline constexpr uint32_t kMaxReportedMemberBytes =
    2 + kMaxPeerBytes + 2 * (2 + kMaxEndpointBytes) + 2 + kMaxLocalityBytes + 3 * 8 + 3 * 4;
// The largest encoded MembersReport: i64 held_step, u32 below, u32 room, u32 count, the members
// (≈ 12 MiB).
inline constexpr uint32_t kMaxMembersReportBytes =
    8 + 4 + 4 + 4 + kMaxReportedMembers * kMaxReportedMemberBytes;

void Encode(const MembersReport& m, std::vector<uint8_t>* out);
// Checks the form (texts, steps ≥ -1, a depth-first tree: the first entry at depth 1, each at
// most one deeper than the one before, none past kMaxTreeDepth); the publisher checks the steps
// against what it published.
Status Decode(std::span<const uint8_t> payload, MembersReport* m);

}  // namespace weightsync::wire
