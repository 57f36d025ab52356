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

// Bounds that hold however late the thread runs: a slice is never below kMinSlice, at least 1/256
// of the time waited (which only grows), and kMaxSlice once that is over 256 ms.
TEST(PollBackoff, SleepsGrowingSlicesWithLowSlackAndGivesTheSlackBack) {
  const int before = prctl(PR_GET_TIMERSLACK);
  if (before <= PollBackoff::kSleepingSlack.count()) {
    GTEST_SKIP() << "this thread's timer slack is " << before << " ns already (real-time?)";
  }
  {
    PollBackoff wait(nanoseconds(0));
    const nanoseconds first = wait.Pause();
    EXPECT_GE(first, PollBackoff::kMinSlice);
    EXPECT_LE(first, PollBackoff::kMaxSlice);
    EXPECT_EQ(prctl(PR_GET_TIMERSLACK), PollBackoff::kSleepingSlack.count());
    std::this_thread::sleep_for(milliseconds(40));  // waited >= 40 ms: slices >= 156 us
    const nanoseconds later = wait.Pause();
    EXPECT_GE(later, milliseconds(40) / 256);
    EXPECT_GE(later, first);
    std::this_thread::sleep_for(milliseconds(300));  // >= 340 ms / 256 > 1 ms: the cap
    EXPECT_EQ(wait.Pause(), PollBackoff::kMaxSlice);
  }
  EXPECT_EQ(prctl(PR_GET_TIMERSLACK), before) << "the thread's own slack once the wait ends";
}

// A thread whose slack is already below the sleeping slack keeps it.
TEST(PollBackoff, AThreadWithALowerSlackKeepsIt) {
  const int before = prctl(PR_GET_TIMERSLACK);
  ASSERT_EQ(prctl(PR_SET_TIMERSLACK, 500ul), 0);
  {
    PollBackoff wait(nanoseconds(0));
    wait.Pause();
    EXPECT_EQ(prctl(PR_GET_TIMERSLACK), 500);
  }
  EXPECT_EQ(prctl(PR_GET_TIMERSLACK), 500);
  ASSERT_EQ(prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(before)), 0);
}

}  // namespace
}  // namespace weightsync::util
