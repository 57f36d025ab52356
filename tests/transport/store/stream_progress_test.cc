// StreamProgress on its own (store/stream_progress.h): what a cut-through relay's sessions wait
// on. A wait returns as soon as more than what the session sent has landed, the end only once the
// version is finished; a failure ends every wait at once with its reason; deadlines and cancels
// bound the waits. Threads stand in for the relay's read and the sessions.
#include "transport/store/stream_progress.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "testing/test_util.h"

namespace weightsync::transport::store {
namespace {

using std::chrono::milliseconds;

util::Deadline Within(milliseconds ms = milliseconds(2000)) { return util::Deadline(ms); }

TEST(StreamProgress, AWaitReturnsWhatLandedOnceMoreThanItHad) {
  StreamProgress p;
  p.Begin(7, {100, 50});
  EXPECT_EQ(p.step(), 7);
  auto waiting = std::async(std::launch::async, [&] { return p.WaitLanded(7, 0, 0, Within()); });
  EXPECT_EQ(waiting.wait_for(milliseconds(50)), std::future_status::timeout);
  p.Landed(0, 40);
  ASSERT_OK_AND_ASSIGN(uint64_t landed, waiting.get());
  EXPECT_EQ(landed, 40u);
  p.Landed(0, 30);  // never back
  ASSERT_OK_AND_ASSIGN(landed, p.WaitLanded(7, 0, 39, Within()));
  EXPECT_EQ(landed, 40u);
  p.Landed(0, 1000);  // never past the tensor
  ASSERT_OK_AND_ASSIGN(landed, p.WaitLanded(7, 0, 40, Within()));
  EXPECT_EQ(landed, 100u);
  // The other tensor is its own.
  auto second = p.WaitLanded(7, 1, 0, Within(milliseconds(50)));
  EXPECT_EQ(second.status().code(), StatusCode::kTimeout) << second.status();
  EXPECT_EQ(p.WaitLanded(7, 2, 0, Within()).status().code(), StatusCode::kInternal);
}

TEST(StreamProgress, TheEndComesWithFinishAndEveryByteWithIt) {
  StreamProgress p;
  p.Begin(7, {100});
  EXPECT_EQ(p.WaitFinished(7, Within(milliseconds(50))).code(), StatusCode::kTimeout);
  auto finished = std::async(std::launch::async, [&] { return p.WaitFinished(7, Within()); });
  EXPECT_EQ(finished.wait_for(milliseconds(50)), std::future_status::timeout);
  p.Finish();
  ASSERT_OK(finished.get());
  ASSERT_OK_AND_ASSIGN(uint64_t landed, p.WaitLanded(7, 0, 0, Within()));
  EXPECT_EQ(landed, 100u);
}

// A session still sending a step this progress no longer tracks (the slot streams another one
// now) is stopped at once, never paced by the other step nor ended by its Finish.
TEST(StreamProgress, AWaitForAnotherStepFailsAtOnce) {
  StreamProgress p;
  p.Begin(8, {100});
  p.Landed(0, 100);
  p.Finish();
  p.Begin(10, {100});
  p.Landed(0, 100);
  p.Finish();
  for (const Status& s : {p.WaitLanded(8, 0, 0, Within()).status(), p.WaitFinished(8, Within())}) {
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
    EXPECT_NE(s.message().find("step 8 is no longer landing here"), std::string::npos) << s;
  }
  ASSERT_OK(p.WaitFinished(10, Within()));
}

TEST(StreamProgress, AFailureEndsEveryWaitWithItsReason) {
  StreamProgress p;
  p.Begin(4, {100});
  p.Landed(0, 60);
  auto waiting = std::async(std::launch::async, [&] { return p.WaitLanded(4, 0, 60, Within()); });
  auto ending = std::async(std::launch::async, [&] { return p.WaitFinished(4, Within()); });
  p.Fail(Status::PeerLost("the relay's parent went away"));
  for (const Status& s : {waiting.get().status(), ending.get()}) {
    EXPECT_EQ(s.code(), StatusCode::kPeerLost) << s;
    EXPECT_NE(s.message().find("parent went away"), std::string::npos) << s;
  }
  // Also what had landed: a failed version is sent no further.
  EXPECT_EQ(p.WaitLanded(4, 0, 0, Within()).status().code(), StatusCode::kPeerLost);
  p.Finish();  // too late: failed stays failed
  EXPECT_EQ(p.WaitFinished(4, Within()).code(), StatusCode::kPeerLost);
  // The next version starts afresh.
  p.Begin(5, {100});
  EXPECT_EQ(p.WaitFinished(5, Within(milliseconds(20))).code(), StatusCode::kTimeout);
}

TEST(StreamProgress, ACancelEndsAWaitAtOnce) {
  StreamProgress p;
  p.Begin(1, {10});
  std::atomic<bool> cancel{false};
  util::Deadline deadline(milliseconds(10000), &cancel);
  auto waiting = std::async(std::launch::async, [&] { return p.WaitLanded(1, 0, 0, deadline); });
  cancel = true;
  EXPECT_EQ(waiting.get().status().code(), StatusCode::kCancelled);
}

}  // namespace
}  // namespace weightsync::transport::store
