// Across hosts for real: the publisher runs in one network namespace and the subscriber in another,
// joined by a veth pair. 20 authenticated steps, then the link is cut mid-transfer: the subscriber
// must report Timeout within its deadline with its previous version intact, and succeed again once
// the link returns. Needs root and `ip netns`; skipped with the reason elsewhere.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "testing/test_util.h"

namespace weightsync {
namespace {

using testing::ChildProcess;

constexpr char kToken[] = "netns-shared-token-0123456789";
// A 40 MB step (and the first prepare) needs a longer deadline under a sanitizer, and the slack
// allowed past it grows with it.
constexpr int kTimeoutMs = testing::kUnderSanitizer ? 20000 : 2000;
constexpr int kSlackMs = testing::kUnderSanitizer ? 3000 : 300;

int Sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

class NetnsTcp : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tag = std::to_string(::getpid() % 100000);
    pub_ns_ = "wsp" + tag;
    sub_ns_ = "wss" + tag;
    if (::geteuid() != 0 || Sh("ip netns add " + pub_ns_) != 0) {
      GTEST_SKIP() << "needs root and `ip netns` (iproute2) to create network namespaces";
    }
    created_ = true;
    ASSERT_EQ(Sh("ip netns add " + sub_ns_), 0);
    ASSERT_EQ(Sh("ip link add wsa" + tag + " netns " + pub_ns_ + " type veth peer name wsb" + tag +
                 " netns " + sub_ns_),
              0);
    link_ = "wsa" + tag;
    ASSERT_EQ(Sh("ip -n " + pub_ns_ + " addr add 10.77.0.1/24 dev wsa" + tag), 0);
    ASSERT_EQ(Sh("ip -n " + sub_ns_ + " addr add 10.77.0.2/24 dev wsb" + tag), 0);
    ASSERT_EQ(Sh("ip -n " + pub_ns_ + " link set wsa" + tag + " up"), 0);
    ASSERT_EQ(Sh("ip -n " + sub_ns_ + " link set wsb" + tag + " up"), 0);
    ASSERT_EQ(Sh("ip -n " + pub_ns_ + " link set lo up"), 0);
    ASSERT_EQ(Sh("ip -n " + sub_ns_ + " link set lo up"), 0);
  }
  void TearDown() override {
    if (!created_) return;
    Sh("ip netns del " + pub_ns_);
    Sh("ip netns del " + sub_ns_);
  }
  std::string pub_ns_, sub_ns_, link_;
  bool created_ = false;
};

TEST_F(NetnsTcp, TwentyStepsThenLinkCutMidTransferThenRecovery) {
  const std::string tensors = "24", elements = "600000";  // ~40 MB: outlasts socket buffers
  const std::string token_env = std::string("WEIGHTSYNC_TOKEN=") + kToken;
  ChildProcess pub = ChildProcess::Spawn(
      {"/usr/sbin/ip", "netns", "exec", pub_ns_, testing::HelperPath("publisher"),
       "tcp://10.77.0.1:7791", tensors, elements},
      {token_env});
  ASSERT_EQ(pub.ReadLine(), "ready tcp://10.77.0.1:7791");
  ChildProcess sub = ChildProcess::Spawn(
      {"/usr/sbin/ip", "netns", "exec", sub_ns_, testing::HelperPath("subscriber"),
       "tcp://10.77.0.1:7791", tensors, elements, std::to_string(kTimeoutMs)},
      {token_env});
  ASSERT_EQ(sub.ReadLine(), "ready");
  for (int step = 1; step <= 20; ++step) {
    ASSERT_EQ(pub.Command("publish " + std::to_string(step)), "ok " + std::to_string(step));
    std::string reply = sub.Command("update " + std::to_string(step));
    ASSERT_EQ(reply.rfind("ok " + std::to_string(step) + " ", 0), 0u) << reply;
  }
  ASSERT_EQ(sub.Command("holds 20"), "yes");

  // Step 21: the subscriber pauses just before reading the bytes; the link goes down meanwhile.
  ASSERT_EQ(pub.Command("publish 21"), "ok 21");
  ASSERT_EQ(sub.Command("arm subscriber.before_copy=sleep:300*1"), "ok");
  std::thread cut([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    EXPECT_EQ(Sh("ip -n " + pub_ns_ + " link set " + link_ + " down"), 0);
  });
  std::string reply = sub.Command("update 21", 3 * kTimeoutMs);
  cut.join();
  ASSERT_EQ(reply.rfind("error timeout ", 0), 0u) << reply;
  long ms = std::atol(reply.c_str() + std::string("error timeout ").size());
  EXPECT_LE(ms, kTimeoutMs + kSlackMs) << reply;
  EXPECT_EQ(sub.Command("holds 20"), "yes");  // staged: the previous version is intact
  EXPECT_EQ(sub.Command("valid"), "yes");

  ASSERT_EQ(Sh("ip -n " + pub_ns_ + " link set " + link_ + " up"), 0);
  ASSERT_EQ(pub.Command("publish 22"), "ok 22");
  reply = sub.Command("update 22", 3 * kTimeoutMs);
  ASSERT_EQ(reply.rfind("ok 22 ", 0), 0u) << reply;
  EXPECT_EQ(sub.Command("holds 22"), "yes");
}

}  // namespace
}  // namespace weightsync
