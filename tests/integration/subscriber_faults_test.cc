// The subscriber dies mid-transfer: the publisher (in this process) must unpin the version it was
// reading, keep publishing, keep serving others, and return to its resource baseline.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include "testing/local_pair.h"

namespace weightsync {
namespace {

using testing::ChildProcess;
using testing::LocalPair;
using testing::SyntheticModel;

class SubscriberFaults : public ::testing::TestWithParam<bool /*tcp*/> {};

TEST_P(SubscriberFaults, KilledSubscriberReleasesItsPinAndOthersContinue) {
  LocalPair p;
  p.timeout = std::chrono::milliseconds(3000);
  if (GetParam()) p.endpoint = "tcp://127.0.0.1:0";
  p.Start(/*slots=*/2);
  p.Publish(1);
  const std::string endpoint = p.publisher->endpoint();
  const LedgerSnapshot idle = ReadLedger();

  ChildProcess child =
      ChildProcess::Spawn({testing::HelperPath("subscriber"), endpoint, "12", "3000", "3000"});
  ASSERT_EQ(child.ReadLine(), "ready");
  ASSERT_EQ(child.Command("update 1").rfind("ok 1 ", 0), 0u);
  p.Publish(2);
  // The child pins step 2 and then sleeps before copying; kill it there.
  ASSERT_EQ(child.Command("arm subscriber.before_copy=sleep:5000*1"), "ok");
  // The reply never comes: the child is killed while it sleeps inside the update.
  EXPECT_EQ(child.Command("update 2", 300), "");
  child.Signal(SIGKILL);
  int status = child.Wait();
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

  // Step 2 was pinned by the dead child; two more publishes need both slots: they only succeed
  // if the pin was released.
  p.Publish(3);
  p.Publish(4);
  auto sub = p.Connect();
  auto stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->step, 4);
  sub.reset();
  LedgerSnapshot now;
  EXPECT_TRUE(testing::LedgerSettlesTo(idle, &now)) << now.ToString() << " vs " << idle.ToString();
}

INSTANTIATE_TEST_SUITE_P(Transports, SubscriberFaults, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "tcp" : "shm"; });

}  // namespace
}  // namespace weightsync
