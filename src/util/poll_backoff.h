// PollBackoff: how a thread waits for work it can only poll (a GPU event under a deadline). It
// spins first, since GPU copies of a step often end within a few milliseconds and a sleep is
// paid in the timer's granularity (50 us asked is ~100 us with Linux's default 50 us timer
// slack); past the spin it sleeps in slices of about 1/256 of the time waited so far (20 us to
// 1 ms), so the wait overshoots the work by well under 1 % however long it runs, with this
// thread's timer slack lowered to 1 us while it sleeps and given back when the wait ends.
#pragma once

#include <chrono>

namespace weightsync::util {

class PollBackoff {
 public:
  static constexpr std::chrono::microseconds kMinSlice{20};
  static constexpr std::chrono::microseconds kMaxSlice{1000};
  static constexpr std::chrono::nanoseconds kSleepingSlack{1000};

  explicit PollBackoff(std::chrono::nanoseconds spin_for = std::chrono::milliseconds(2));
  ~PollBackoff();  // the thread's own timer slack again
  PollBackoff(const PollBackoff&) = delete;
  PollBackoff& operator=(const PollBackoff&) = delete;

  // Call between polls: returns at once while spinning, else sleeps one slice. Returns the slice
  // asked (zero while spinning).
  std::chrono::nanoseconds Pause();

 private:
  std::chrono::steady_clock::time_point start_;
  std::chrono::nanoseconds spin_for_;
  bool slack_checked_ = false;  // the first sleep looked at the thread's slack
  long saved_slack_ = -1;       // the slack it replaced, to give back; -1: none replaced
};

}  // namespace weightsync::util
