#include "wire/members_report.h"

#include <algorithm>

#include "wire/codec.h"

namespace weightsync::wire {
namespace {

constexpr std::string_view kWhat = "members_report";
// Smallest encoding of one member: four empty strings, three steps, below, depth, room.
constexpr uint32_t kMinMemberBytes = 4 * 2 + 3 * 8 + 3 * 4;

Result<int64_t> Step(Reader& r, std::string_view field) {
  WS_ASSIGN_OR_RETURN(int64_t step, r.I64(field));
  if (step < -1) return Status::ProtocolError(kWhat, ": ", field, " ", step, ", expected ≥ -1");
  return step;
}

}  // namespace

// ---- MembersReport: i64 held_step, u32 below, u32 room, u32 count, then per member: string
// peer, string serves, string locality, string via, i64 held_step, i64 sent_step,
// i64 receiving_step, u32 below, u32 depth, u32 room ----

void Encode(const MembersReport& m, std::vector<uint8_t>* out) {
  Writer w(out);
  w.I64(m.held_step);
  w.U32(m.below);
  w.U32(m.room);
  w.U32(static_cast<uint32_t>(m.members.size()));
  for (const ReportedMember& e : m.members) {
    w.String(e.peer);
    w.String(e.serves);
    w.String(e.locality);
    w.String(e.via);
    w.I64(e.held_step);
    w.I64(e.sent_step);
    w.I64(e.receiving_step);
    w.U32(e.below);
    w.U32(e.depth);
    w.U32(e.room);
  }
}

Status Decode(std::span<const uint8_t> payload, MembersReport* m) {
  Reader r(payload, kWhat);
  WS_ASSIGN_OR_RETURN(m->held_step, Step(r, "held_step"));
  WS_ASSIGN_OR_RETURN(m->below, r.U32("below"));
  WS_ASSIGN_OR_RETURN(m->room, r.U32("room"));
  WS_ASSIGN_OR_RETURN(uint32_t count, r.Count("members", kMaxReportedMembers, kMinMemberBytes));
  m->members.resize(count);
  uint32_t previous_depth = 0;
  for (ReportedMember& e : m->members) {
    // Into each entry's strings: a relay's steady report decodes without allocating.
    WS_RETURN_IF_ERROR(r.TextInto("peer", kMaxPeerBytes, false, /*spaces=*/true, &e.peer));
    WS_RETURN_IF_ERROR(r.TextInto("serves", kMaxEndpointBytes, true, false, &e.serves));
    WS_RETURN_IF_ERROR(r.TextInto("locality", kMaxLocalityBytes, true, false, &e.locality));
    WS_RETURN_IF_ERROR(r.TextInto("via", kMaxEndpointBytes, true, false, &e.via));
    WS_ASSIGN_OR_RETURN(e.held_step, Step(r, "held_step"));
    WS_ASSIGN_OR_RETURN(e.sent_step, Step(r, "sent_step"));
    WS_ASSIGN_OR_RETURN(e.receiving_step, Step(r, "receiving_step"));
    WS_ASSIGN_OR_RETURN(e.below, r.U32("below"));
    WS_ASSIGN_OR_RETURN(e.depth, r.U32("depth"));
    WS_ASSIGN_OR_RETURN(e.room, r.U32("room"));
    // Depth-first: a member is the reporter's child (1) or a child of the relay listed before it
    // (at most one deeper than the entry before); `via` names that relay below depth 1.
    if (e.depth < 1 || e.depth > previous_depth + 1 || e.depth > kMaxTreeDepth) {
      return Status::ProtocolError(kWhat, ": member '", e.peer, "' at depth ", e.depth,
                                   " after one at depth ", previous_depth, ", expected 1..",
                                   std::min(previous_depth + 1, kMaxTreeDepth));
    }
    if ((e.depth == 1) != e.via.empty()) {
      return Status::ProtocolError(kWhat, ": member '", e.peer, "' at depth ", e.depth,
                                   e.via.empty() ? " names no relay that serves it"
                                                 : " names a relay though the reporter serves it");
    }
    previous_depth = e.depth;
  }
  return r.ExpectEnd();
}

}  // namespace weightsync::wire
