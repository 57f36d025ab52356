// PollBackoff spins first, then sleeps slices that grow with the time waited, within their
// bounds, with the thread's timer slack lowered only while the wait lasts.
#include "util/poll_backoff.h"

#include <gtest/gtest.h>
#include <sys/prctl.h>

#include <chrono>
#include <thread>

namespace weightsync::util {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

TEST(PollBackoff, SpinsFirstWithoutTouchingTheTimerSlack) {
  const int before = prctl(PR_GET_TIMERSLACK);
  PollBackoff wait(std::chrono::seconds(60));
  for (int i = 0; i < 100; ++i) EXPECT_EQ(wait.Pause(), nanoseconds(0));
  EXPECT_EQ(prctl(PR_GET_TIMERSLACK), before);
}

TEST(PollBackoff, SleepsGrowingSlicesWithLowSlackAndGivesTheSlackBack) {
  const int before = prctl(PR_GET_TIMERSLACK);
  ASSERT_GT(before, PollBackoff::kSleepingSlack.count()) << "the default slack is 50 us";
  {
    PollBackoff wait(nanoseconds(0));
    const nanoseconds first = wait.Pause();
    EXPECT_EQ(first, PollBackoff::kMinSlice) << "nothing waited yet: the smallest slice";
    EXPECT_EQ(prctl(PR_GET_TIMERSLACK), PollBackoff::kSleepingSlack.count());
    std::this_thread::sleep_for(milliseconds(40));  // waited ~40 ms: slices of ~156 us
    const nanoseconds later = wait.Pause();
    EXPECT_GT(later, first);
    EXPECT_LT(later, PollBackoff::kMaxSlice);
    std::this_thread::sleep_for(milliseconds(300));  // ~300 ms / 256 > 1 ms: the cap
    EXPECT_EQ(wait.Pause(), PollBackoff::kMaxSlice);
  }
  EXPECT_EQ(prctl(PR_GET_TIMERSLACK), before) << "the thread's own slack once the wait ends";
}

}  // namespace
}  // namespace weightsync::util
