// BucketRing: who reads which bucket of a ring store, and when a ring slot may be refilled.
//
// A version streams through `slots` ring slots, bucket b in slot b % slots. The subscribers that
// read it together form a *round*: the first to ask starts one, and others join while no slot
// has been refilled yet (every bucket filled so far is still in the ring for them). A later one
// waits for the next round, which starts once every member has left or been revoked. A bucket is
// filled by whichever member's session asks for it first, once every member has released the bucket
// that slot held before; so a session filling bucket b + 1 while its subscriber copies bucket b
// keeps the ring full (two slots suffice).
//
// Nothing waits without bound: a member that holds a slot others wait for (members for its refill,
// or readers waiting to start the next round), `hold_timeout` (PublisherOptions::timeout) after it
// had that slot's bucket, is revoked, as is every member when
// the publisher needs the tensors back (RevokeAll, from BeginWrite); a revoked member's calls fail
// with Timeout saying why, and it commits nothing. A failed fill ends the round for all its members
// with that error. Members are slots in a table sized once (max_members): a step allocates nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "util/deadline.h"
#include "util/mutex.h"
#include "weightsync/status.h"

namespace weightsync::transport::store {

class BucketRing {
 public:
  // Copies bucket `bucket` of the version into ring slot `slot` (VersionStore::FillBucket).
  using Fill = std::function<Status(uint32_t bucket, uint32_t slot)>;
  BucketRing(uint32_t slots, uint32_t buckets, int max_members,
             std::chrono::milliseconds hold_timeout, Fill fill);

  uint32_t slots() const { return slots_; }
  uint32_t buckets() const { return buckets_; }

  // Joins the round that streams `step`, or starts one; waits while a round of another step, or
  // one that already refilled a slot, is under way. Returns the member's id.
  Result<int> Join(int64_t step, const util::Deadline& deadline,
                   const std::function<bool()>& give_up);
  // The ring slot holding `bucket` for `member`, once it is there: the member's session fills it
  // when it is the next one and nobody else is filling. Buckets are asked for in order.
  Result<uint32_t> Await(int member, uint32_t bucket, const util::Deadline& deadline);
  // `member` has read `bucket` (the oldest it holds): its slot may be refilled.
  Status Release(int member, uint32_t bucket);
  // Ends `member`'s part in the round, releasing what it holds. Timeout if it had been revoked:
  // what it read may not be committed.
  Status Leave(int member);
  // Revokes every member (the publisher takes the tensors back); returns how many.
  int RevokeAll();

 private:
  enum class Revoked : uint8_t { kNo, kHeldSlot, kWriter, kFillFailed };
  struct Member {
    bool in_use = false;
    Revoked revoked = Revoked::kNo;
    uint32_t released = 0;  // buckets [0, released) released
    int64_t step = -1;      // its round's step, for its errors once the round is over
    Status error;           // kFillFailed: the fill's error
    std::chrono::steady_clock::time_point joined;
  };
  bool SlotFree(uint32_t slot) const WS_REQUIRES(mu_);
  Status RevokedError(const Member& m) const WS_REQUIRES(mu_);
  void Revoke(Member* m, Revoked why) WS_REQUIRES(mu_);
  void EndRoundIfEmpty() WS_REQUIRES(mu_);
  // Revokes every member that has held its oldest unreleased bucket for `hold_timeout`; returns
  // whether it revoked any.
  bool RevokeStalledHolders() WS_REQUIRES(mu_);

  const uint32_t slots_;
  const uint32_t buckets_;
  const std::chrono::milliseconds hold_timeout_;
  const Fill fill_;
  mutable util::Mutex mu_;
  util::CondVar cv_;
  std::vector<Member> members_ WS_GUARDED_BY(mu_);
  std::vector<int64_t> holding_ WS_GUARDED_BY(mu_);  // per slot: the bucket in it, -1: none
  std::vector<std::chrono::steady_clock::time_point> filled_at_ WS_GUARDED_BY(mu_);  // per slot
  // Members of the round not revoked: the round ends when none is left, even while revoked ones
  // have not left yet (their sessions may wait on their subscribers for a while; they no longer
  // hold any slot, and their calls only fail).
  int live_members_ WS_GUARDED_BY(mu_) = 0;
  bool round_ WS_GUARDED_BY(mu_) = false;
  int64_t step_ WS_GUARDED_BY(mu_) = -1;
  uint32_t filled_ WS_GUARDED_BY(mu_) = 0;  // buckets [0, filled_) of this round filled
  bool filling_ WS_GUARDED_BY(mu_) = false;
  Status fill_error_ WS_GUARDED_BY(mu_);
};

}  // namespace weightsync::transport::store
