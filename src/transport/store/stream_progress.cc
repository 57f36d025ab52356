#include "transport/store/stream_progress.h"

#include <algorithm>
#include <chrono>

namespace weightsync::transport::store {
namespace {

// Waits wake at least this often to see a cancelled or expired deadline.
constexpr std::chrono::milliseconds kSlice{20};

}  // namespace

void StreamProgress::Begin(int64_t step, const std::vector<uint64_t>& bytes) {
  {
    util::MutexLock lock(&mu_);
    step_ = step;
    bytes_.assign(bytes.begin(), bytes.end());  // the same size every step: no allocation
    landed_.assign(bytes.size(), 0);
    state_ = State::kLanding;
    failed_ = Status::Ok();
  }
  cv_.NotifyAll();
}

void StreamProgress::Landed(uint32_t tensor, uint64_t prefix) {
  {
    util::MutexLock lock(&mu_);
    if (tensor >= landed_.size()) return;
    landed_[tensor] = std::max(landed_[tensor], std::min(prefix, bytes_[tensor]));
  }
  cv_.NotifyAll();
}

void StreamProgress::Finish() {
  {
    util::MutexLock lock(&mu_);
    if (state_ != State::kLanding) return;
    landed_ = bytes_;
    state_ = State::kFinished;
  }
  cv_.NotifyAll();
}

void StreamProgress::Fail(const Status& why) {
  {
    util::MutexLock lock(&mu_);
    if (state_ != State::kLanding) return;
    state_ = State::kFailed;
    failed_ = why;
  }
  cv_.NotifyAll();
}

Status StreamProgress::Ended(int64_t step, const util::Deadline& deadline) const {
  if (step != step_) {
    return Status::Unavailable("step ", step, " is no longer landing here (step ", step_, " is)");
  }
  if (state_ == State::kFailed) {
    return failed_.ok() ? Status::Unavailable("step ", step_, " is not being received") : failed_;
  }
  if (deadline.cancelled()) return Status::Cancelled("waiting for step ", step_, " to land");
  if (deadline.expired()) {
    return Status::Timeout("step ", step_, " did not land before the subscriber's deadline");
  }
  return Status::Ok();
}

Result<uint64_t> StreamProgress::WaitLanded(int64_t step, uint32_t tensor, uint64_t have,
                                            const util::Deadline& deadline) {
  util::MutexLock lock(&mu_);
  if (tensor >= landed_.size()) {
    return Status::Internal("tensor ", tensor, " of a streamed version of ", landed_.size());
  }
  // A failed version (or another step's) stops its sessions at once, whatever landed.
  if (state_ == State::kFailed || step != step_) WS_RETURN_IF_ERROR(Ended(step, deadline));
  while (landed_[tensor] <= have && landed_[tensor] < bytes_[tensor]) {
    WS_RETURN_IF_ERROR(Ended(step, deadline));
    cv_.WaitFor(&mu_, kSlice);
  }
  return landed_[tensor];
}

Status StreamProgress::WaitFinished(int64_t step, const util::Deadline& deadline) {
  util::MutexLock lock(&mu_);
  while (state_ != State::kFinished || step != step_) {
    WS_RETURN_IF_ERROR(Ended(step, deadline));
    cv_.WaitFor(&mu_, kSlice);
  }
  return Status::Ok();
}

int64_t StreamProgress::step() const {
  util::MutexLock lock(&mu_);
  return step_;
}

}  // namespace weightsync::transport::store
