#include "transport/store/bucket_ring.h"

#include <algorithm>

namespace weightsync::transport::store {
namespace {
// Waits wake on every change; the slice only bounds how late a deadline or a departed peer is
// noticed.
constexpr auto kWaitSlice = std::chrono::milliseconds(50);
}  // namespace

BucketRing::BucketRing(uint32_t slots, uint32_t buckets, int max_members,
                       std::chrono::milliseconds hold_timeout, Fill fill)
    : slots_(slots),
      buckets_(buckets),
      hold_timeout_(hold_timeout),
      fill_(std::move(fill)),
      members_(std::max(max_members, 1)),
      holding_(slots, -1),
      filled_at_(slots) {}

bool BucketRing::SlotFree(uint32_t slot) const {
  const int64_t held = holding_[slot];
  if (held < 0) return true;
  return std::all_of(members_.begin(), members_.end(), [&](const Member& m) {
    return !m.in_use || m.revoked != Revoked::kNo || int64_t{m.released} > held;
  });
}

Status BucketRing::RevokedError(const Member& m) const {
  switch (m.revoked) {
    case Revoked::kHeldSlot:
      return Status::Timeout("the read of step ", m.step,
                             " was revoked: it held a ring bucket longer than the publisher's "
                             "timeout of ",
                             hold_timeout_.count(),
                             " ms (PublisherOptions.timeout) while other subscribers waited for "
                             "its slot; nothing it read may be committed");
    case Revoked::kWriter:
      return Status::Timeout("the read of step ", m.step,
                             " was revoked: the publisher took its tensors back to write them "
                             "(BeginWrite or the next Publish, after waiting ",
                             hold_timeout_.count(), " ms); nothing it read may be committed");
    case Revoked::kFillFailed:
      return m.error.WithContext("ring fill of step " + std::to_string(m.step));
    case Revoked::kNo:
      break;
  }
  return Status::Ok();
}

void BucketRing::Revoke(Member* m, Revoked why) {
  if (!m->in_use || m->revoked != Revoked::kNo) return;
  m->revoked = why;
  --live_members_;
}

void BucketRing::EndRoundIfEmpty() {
  if (live_members_ > 0) return;
  round_ = false;
  filled_ = 0;
  std::fill(holding_.begin(), holding_.end(), -1);
}

bool BucketRing::RevokeStalledHolders() {
  const auto now = std::chrono::steady_clock::now();
  bool revoked = false;
  for (Member& m : members_) {
    if (!m.in_use || m.revoked != Revoked::kNo || m.released >= filled_) continue;
    const uint32_t slot = m.released % slots_;
    if (holding_[slot] != int64_t{m.released}) continue;
    if (now - std::max(filled_at_[slot], m.joined) >= hold_timeout_) {
      Revoke(&m, Revoked::kHeldSlot);
      revoked = true;
    }
  }
  return revoked;
}

Result<int> BucketRing::Join(int64_t step, const util::Deadline& deadline,
                             const std::function<bool()>& give_up) {
  util::MutexLock lock(&mu_);
  while (true) {
    // A new round waits for a fill of a finished (all revoked) one still copying.
    const bool start = !round_ && !filling_;
    const bool join =
        round_ && step_ == step && fill_error_.ok() && filled_ + (filling_ ? 1 : 0) <= slots_;
    if (start || join) {
      auto free =
          std::find_if(members_.begin(), members_.end(), [](const Member& m) { return !m.in_use; });
      if (free == members_.end()) {
        return Status::ResourceExhausted("ring: all ", members_.size(), " reader places are taken");
      }
      if (start) {
        round_ = true;
        step_ = step;
        filled_ = 0;
        fill_error_ = Status::Ok();
        std::fill(holding_.begin(), holding_.end(), -1);
      }
      *free = Member{true, Revoked::kNo, 0, step, Status::Ok(), std::chrono::steady_clock::now()};
      ++live_members_;
      return static_cast<int>(free - members_.begin());
    }
    // Waiting for the round to end: a member stalled on a bucket holds up every reader waiting
    // to start the next one, so it gets the same timeout as for a slot others wait for.
    if (round_ && RevokeStalledHolders()) {
      EndRoundIfEmpty();
      cv_.NotifyAll();
      continue;
    }
    if (give_up()) return Status::PeerLost("subscriber left while waiting for the ring");
    if (deadline.expired()) {
      return Status::Timeout("ring: the round streaming step ", step_,
                             " was still under way when the subscriber's wait for step ", step,
                             " ran out");
    }
    cv_.WaitFor(&mu_, kWaitSlice);
  }
}

Result<uint32_t> BucketRing::Await(int member, uint32_t bucket, const util::Deadline& deadline) {
  if (bucket >= buckets_) {
    return Status::InvalidArgument("ring: bucket ", bucket, " of a version of ", buckets_);
  }
  util::MutexLock lock(&mu_);
  Member& m = members_[member];
  while (true) {
    if (m.revoked != Revoked::kNo) return RevokedError(m);
    if (bucket < filled_) return bucket % slots_;
    if (bucket > filled_) {
      return Status::Internal("ring: bucket ", bucket, " asked for before bucket ", filled_);
    }
    if (!filling_) {
      const uint32_t slot = bucket % slots_;
      if (SlotFree(slot)) {
        filling_ = true;
        mu_.Unlock();
        Status s = fill_(bucket, slot);
        mu_.Lock();
        filling_ = false;
        if (!s.ok()) {
          fill_error_ = s;
          for (Member& other : members_) {
            if (other.in_use && other.revoked == Revoked::kNo) other.error = s;
            Revoke(&other, Revoked::kFillFailed);
          }
          EndRoundIfEmpty();
        } else {
          holding_[slot] = bucket;
          filled_at_[slot] = std::chrono::steady_clock::now();
          filled_ = bucket + 1;
        }
        cv_.NotifyAll();
        continue;
      }
      // Other members still read the bucket this slot holds: wait for them, but none longer
      // than the publisher's timeout since it had the bucket (it was filled, or the member
      // joined, whichever is later), then revoke it so that the rest of the round goes on.
      const auto now = std::chrono::steady_clock::now();
      bool revoked = false;
      for (Member& other : members_) {
        if (!other.in_use || other.revoked != Revoked::kNo || &other == &m ||
            int64_t{other.released} > holding_[slot]) {
          continue;
        }
        if (now - std::max(filled_at_[slot], other.joined) >= hold_timeout_) {
          Revoke(&other, Revoked::kHeldSlot);
          revoked = true;
        }
      }
      if (revoked) {
        cv_.NotifyAll();
        continue;
      }
    }
    if (deadline.expired()) {
      return Status::Timeout("ring: bucket ", bucket, " of step ", step_,
                             " was not filled within the subscriber's wait");
    }
    cv_.WaitFor(&mu_, kWaitSlice);
  }
}

Status BucketRing::Release(int member, uint32_t bucket) {
  util::MutexLock lock(&mu_);
  Member& m = members_[member];
  if (m.revoked != Revoked::kNo) return RevokedError(m);
  if (bucket != m.released || bucket >= filled_) {
    return Status::Internal("ring: bucket ", bucket, " released out of order (next is ", m.released,
                            ", ", filled_, " filled)");
  }
  ++m.released;
  cv_.NotifyAll();
  return Status::Ok();
}

Status BucketRing::Leave(int member) {
  util::MutexLock lock(&mu_);
  Member& m = members_[member];
  Status s = RevokedError(m);
  if (m.revoked == Revoked::kNo) --live_members_;
  m = Member{};
  EndRoundIfEmpty();
  cv_.NotifyAll();
  return s;
}

int BucketRing::RevokeAll() {
  util::MutexLock lock(&mu_);
  int revoked = 0;
  for (Member& m : members_) {
    if (m.in_use && m.revoked == Revoked::kNo) ++revoked;
    Revoke(&m, Revoked::kWriter);
  }
  EndRoundIfEmpty();
  cv_.NotifyAll();
  return revoked;
}

}  // namespace weightsync::transport::store
