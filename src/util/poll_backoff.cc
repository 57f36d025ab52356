#include "util/poll_backoff.h"

#include <sys/prctl.h>

#include <algorithm>
#include <thread>

namespace weightsync::util {

PollBackoff::PollBackoff(std::chrono::nanoseconds spin_for)
    : start_(std::chrono::steady_clock::now()), spin_for_(spin_for) {}

PollBackoff::~PollBackoff() {
  // PR_SET_TIMERSLACK with the value read before (> 0: never "reset to the default").
  if (saved_slack_ > 0) (void)prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(saved_slack_));
}

std::chrono::nanoseconds PollBackoff::Pause() {
  const auto waited = std::chrono::steady_clock::now() - start_;
  if (waited < spin_for_) return std::chrono::nanoseconds(0);
  if (!slack_checked_) {
    slack_checked_ = true;
    const int slack = prctl(PR_GET_TIMERSLACK);
    // Lowered only from above kSleepingSlack: a thread whose slack is already that low (or 0, a
    // real-time thread's) or cannot be read keeps its own.
    if (slack > kSleepingSlack.count() &&
        prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(kSleepingSlack.count())) == 0) {
      saved_slack_ = slack;
    }
  }
  const std::chrono::nanoseconds slice =
      std::clamp<std::chrono::nanoseconds>(waited / 256, kMinSlice, kMaxSlice);
  std::this_thread::sleep_for(slice);
  return slice;
}

}  // namespace weightsync::util
