// Deadline: a point on the steady clock every blocking wait is bounded by.
#pragma once

#include <algorithm>
#include <chrono>

namespace weightsync::util {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Deadline(std::chrono::milliseconds budget) : at_(Clock::now() + budget) {}
  static Deadline At(Clock::time_point at) { return Deadline(at); }
  Clock::time_point at() const { return at_; }
  bool expired() const { return Clock::now() >= at_; }
  // Milliseconds left, clamped to [0, INT_MAX], rounded up so a poll does not spin.
  int RemainingMs() const {
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(at_ - Clock::now()).count();
    if (left <= 0) return 0;
    return static_cast<int>(std::min<long long>((left + 999) / 1000, 0x7FFFFFFF));
  }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
};

}  // namespace weightsync::util
