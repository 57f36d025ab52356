// Deadline: a point on the steady clock every blocking wait is bounded by, and optionally a
// cancellation flag those waits watch (Subscriber::Cancel): every wait already takes the deadline,
// so cancellation reaches all of them without extra plumbing.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>

namespace weightsync::util {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Deadline(std::chrono::milliseconds budget, const std::atomic<bool>* cancel = nullptr)
      : at_(Clock::now() + budget), cancel_(cancel) {}
  static Deadline At(Clock::time_point at) { return Deadline(at); }
  Clock::time_point at() const { return at_; }
  // This deadline, or `budget` from now if that comes first; the same cancel.
  Deadline Sooner(std::chrono::milliseconds budget) const {
    Deadline d = *this;
    d.at_ = std::min(at_, Clock::now() + budget);
    return d;
  }
  bool expired() const { return Clock::now() >= at_; }
  // Acquire pairs with the release store in Subscriber::Cancel().
  bool cancelled() const { return cancel_ != nullptr && cancel_->load(std::memory_order_acquire); }
  // How long one blocking call may wait: the time left, in slices of 20 ms when cancellable so a
  // cancel is noticed promptly.
  int SliceMs() const { return cancel_ != nullptr ? std::min(RemainingMs(), 20) : RemainingMs(); }
  // Milliseconds left, clamped to [0, INT_MAX], rounded up so a poll does not spin.
  int RemainingMs() const {
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(at_ - Clock::now()).count();
    if (left <= 0) return 0;
    return static_cast<int>(std::min<long long>((left + 999) / 1000, 0x7FFFFFFF));
  }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
  const std::atomic<bool>* cancel_ = nullptr;
};

}  // namespace weightsync::util
