// StreamProgress: how much of a version being received has landed in the store slot it is served
// from — a cut-through relay's version (docs/relays.md, "Cut-through"). The relay's read path
// says, tensor by tensor, how many leading bytes are in the slot (Landed); the tcp sessions that
// pinned the version send up to there and wait for more (WaitLanded), then for the trainer's
// digests (WaitFinished), which come only when the relay's own update has received, verified and
// committed the step. When that update fails, Fail ends every wait with its reason: the children
// commit nothing.
//
// One per slot of a streaming publisher's store, reused for every version streamed into that slot
// (Begin only once the slot's readers are gone: the publisher takes a slot nobody reads). Begin
// sizes it once, so a steady step allocates nothing. A wait names the step it waits for: one for
// a step this progress no longer tracks fails at once. Thread-safe: one writer (the relay's update)
// and any number of session threads.
#pragma once

#include <cstdint>
#include <vector>

#include "util/deadline.h"
#include "util/mutex.h"
#include "weightsync/status.h"

namespace weightsync::transport::store {

class StreamProgress {
 public:
  // A new version of `tensors` tensors of `bytes` each: nothing landed yet.
  void Begin(int64_t step, const std::vector<uint64_t>& bytes);
  // The first `prefix` bytes of tensor `tensor` are in the slot (never less than said before).
  void Landed(uint32_t tensor, uint64_t prefix);
  // Every byte landed and the digests are set: sessions may end the step.
  void Finish();
  // The version will never be whole: every wait, now and later, fails with `why`.
  void Fail(const Status& why);

  // Waits until more than `have` leading bytes of `tensor` of step `step` landed; returns how
  // many did. Fails with Fail's reason, or Timeout / Cancelled by `deadline`.
  Result<uint64_t> WaitLanded(int64_t step, uint32_t tensor, uint64_t have,
                              const util::Deadline& deadline);
  // Waits until step `step` is finished (Ok) or failed (its reason), at most `deadline`.
  Status WaitFinished(int64_t step, const util::Deadline& deadline);
  int64_t step() const;

 private:
  enum class State : uint8_t { kLanding, kFinished, kFailed };
  // Ok while step `step` may still become whole; else why not.
  Status Ended(int64_t step, const util::Deadline& deadline) const WS_REQUIRES(mu_);

  mutable util::Mutex mu_;
  util::CondVar cv_;
  int64_t step_ WS_GUARDED_BY(mu_) = -1;
  std::vector<uint64_t> landed_ WS_GUARDED_BY(mu_);
  std::vector<uint64_t> bytes_ WS_GUARDED_BY(mu_);
  State state_ WS_GUARDED_BY(mu_) = State::kFailed;
  Status failed_ WS_GUARDED_BY(mu_);
};

}  // namespace weightsync::transport::store
