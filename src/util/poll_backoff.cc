#include "util/poll_backoff.h"

#include <sys/prctl.h>

#include <algorithm>
#include <thread>

namespace weightsync::util {

PollBackoff::PollBackoff(std::chrono::nanoseconds spin_for)
    : start_(std::chrono::steady_clock::now()), spin_for_(spin_for) {}

PollBackoff::~PollBackoff() {
  // PR_SET_TIMERSLACK with the value read before: a thread on the default gets the default back.
  if (saved_slack_ >= 0) (void)prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(saved_slack_));
}

std::chrono::nanoseconds PollBackoff::Pause() {
  const auto waited = std::chrono::steady_clock::now() - start_;
  if (waited < spin_for_) return std::chrono::nanoseconds(0);
  if (saved_slack_ < 0) {
    const int slack = prctl(PR_GET_TIMERSLACK);
    // A thread whose slack cannot be read keeps it (and sleeps a little longer).
    if (slack >= 0 &&
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
