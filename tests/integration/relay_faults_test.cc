// A relay in its own process (ws_subscriber with WS_TEST_SERVE, docs/relays.md) between a trainer
// and a replica, both in this process, over tcp loopback. Over 20 updates the relay is killed
// (SIGKILL) at different points — idle between updates, while the replica waits for the step, and
// while it serves the replica's copy — or stalled (SIGSTOP). The replica's update must fail within
// its own deadline with nothing committed (staged: its weights as they were), the trainer must keep
// publishing without waiting for the relay, and once the relay is back on its endpoint the replica
// catches up bit-exact. At the end the ledger is back where it began. The second test lets the
// trainer place replicas (max_direct) and shows an orphan placed on another relay after a kill
// and after a stall.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <future>
#include <thread>

#include "testing/local_pair.h"

namespace weightsync {
namespace {

using testing::ChildProcess;
using testing::LocalPair;
using testing::SyntheticModel;
using Clock = std::chrono::steady_clock;

constexpr int kTimeoutMs = 3000;  // the replica's and the relay's update timeout

class RelayProcess {
 public:
  // Starts ws_subscriber as a relay of `upstream`, serving at `serve` (tcp://127.0.0.1:0 the first
  // time, then the port it bound, so the replica finds it again).
  void Start(const std::string& upstream, const std::string& serve) {
    child_ = ChildProcess::Spawn(
        {testing::HelperPath("subscriber"), upstream, "12", "3000", std::to_string(kTimeoutMs)},
        {"WS_TEST_SERVE=" + serve});
    const std::string ready = child_.ReadLine();
    ASSERT_EQ(ready.rfind("ready tcp://", 0), 0u) << ready;
    endpoint_ = ready.substr(6);
  }
  void Update(int64_t step) {
    const std::string reply = child_.Command("update " + std::to_string(step));
    ASSERT_EQ(reply.rfind("ok " + std::to_string(step) + " ", 0), 0u) << reply;
  }
  void Kill() {
    child_.Signal(SIGKILL);
    const int status = child_.Wait();
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "wait status " << status << (WIFEXITED(status) ? " (exited)" : "");
  }
  ChildProcess& child() { return child_; }
  const std::string& endpoint() const { return endpoint_; }

 private:
  ChildProcess child_;
  std::string endpoint_;
};

// What a replica's update that lost its relay must look like: a failure within its deadline,
// nothing committed, the staged weights those of `held`.
void ExpectCleanFailure(Result<UpdateStats>& update, Clock::duration took, Subscriber& replica,
                        int64_t held, const std::vector<NamedTensor>& dst) {
  ASSERT_FALSE(update.ok()) << "step " << update->step;
  const StatusCode code = update.status().code();
  EXPECT_TRUE(code == StatusCode::kPeerLost || code == StatusCode::kNotFound ||
              code == StatusCode::kTimeout || code == StatusCode::kUnavailable)
      << update.status();
  EXPECT_LT(took, std::chrono::milliseconds(kTimeoutMs + 1500)) << update.status();
  EXPECT_EQ(replica.committed_step(), held);
  EXPECT_TRUE(replica.weights_valid());
  std::string why;
  if (held >= 0) {
    EXPECT_TRUE(SyntheticModel::Holds(dst, held, &why)) << why;
  }
}

TEST(RelayFaults, TwentyUpdatesWithTheRelayKilledOrStalledAtDifferentPoints) {
  const LedgerSnapshot baseline = ReadLedger();
  LocalPair trainer;
  trainer.endpoint = "tcp://127.0.0.1:0";
  trainer.timeout = std::chrono::milliseconds(kTimeoutMs);
  ASSERT_NO_FATAL_FAILURE(trainer.Start(/*slots=*/2));
  RelayProcess relay;
  ASSERT_NO_FATAL_FAILURE(relay.Start(trainer.endpoint, "tcp://127.0.0.1:0"));
  const std::string served_at = relay.endpoint();

  SubscriberOptions o;
  o.endpoint = served_at;
  o.verify = true;
  o.timeout = std::chrono::milliseconds(kTimeoutMs);
  auto replica = testing::NewSubscriber(o, trainer.dst);
  int64_t held = -1;
  int faults = 0;
  int64_t step = 0;
  // Back on its endpoint: it catches up with the trainer's latest step.
  auto restart = [&] {
    ASSERT_NO_FATAL_FAILURE(relay.Start(trainer.endpoint, served_at));
    EXPECT_EQ(relay.endpoint(), served_at);
  };
  // A replica update that lost its relay, started `after_ms` before the relay is killed (or
  // stopped) by `fault`.
  auto lose_relay = [&](int after_ms, auto fault) {
    const auto t0 = Clock::now();
    auto pending = std::async(std::launch::async, [&] { return replica->Update(step); });
    std::this_thread::sleep_for(std::chrono::milliseconds(after_ms));
    fault();
    Result<UpdateStats> lost = pending.get();
    ExpectCleanFailure(lost, Clock::now() - t0, *replica, held, trainer.dst);
    ++faults;
  };
  for (int round = 1; round <= 20; ++round) {
    SCOPED_TRACE("round " + std::to_string(round) + ", step " + std::to_string(step + 1));
    ASSERT_NO_FATAL_FAILURE(trainer.Publish(++step));
    switch (round % 5) {
      case 1: {  // killed while idle: the replica's reused handle finds nobody serving
        ASSERT_NO_FATAL_FAILURE(relay.Kill());
        const auto t0 = Clock::now();
        Result<UpdateStats> lost = replica->Update(step);
        ASSERT_NO_FATAL_FAILURE(
            ExpectCleanFailure(lost, Clock::now() - t0, *replica, held, trainer.dst));
        ++faults;
        ASSERT_NO_FATAL_FAILURE(restart());
        break;
      }
      case 2:  // killed while the replica waits for a step the relay does not hold yet
        ASSERT_NO_FATAL_FAILURE(lose_relay(300, [&] { relay.Kill(); }));
        ASSERT_NO_FATAL_FAILURE(restart());
        break;
      case 3:  // killed mid-serve: its session with the replica pinned the step, then sleeps
        ASSERT_NO_FATAL_FAILURE(relay.Update(step));
        ASSERT_EQ(relay.child().Command("arm publisher.before_send=sleep:10000*1"), "ok");
        ASSERT_NO_FATAL_FAILURE(lose_relay(300, [&] {
          // Its session with the replica is asleep there now (the command loop still answers).
          EXPECT_EQ(relay.child().Command("hits publisher.before_send"), "1");
          relay.Kill();
        }));
        ASSERT_NO_FATAL_FAILURE(restart());
        break;
      case 4: {  // stalled mid-serve (SIGSTOP): the replica gives up at its own deadline
        ASSERT_NO_FATAL_FAILURE(relay.Update(step));
        ASSERT_EQ(relay.child().Command("arm publisher.before_send=sleep:500*1"), "ok");
        ASSERT_NO_FATAL_FAILURE(lose_relay(200, [&] {
          EXPECT_EQ(relay.child().Command("hits publisher.before_send"), "1");
          ASSERT_TRUE(relay.child().Stop());
        }));
        // The trainer never waits for a stalled relay: it holds no pin of the trainer's.
        const auto p0 = Clock::now();
        ASSERT_NO_FATAL_FAILURE(trainer.Publish(++step));
        ASSERT_NO_FATAL_FAILURE(trainer.Publish(++step));
        EXPECT_LT(Clock::now() - p0, std::chrono::milliseconds(kTimeoutMs / 2));
        ASSERT_NO_FATAL_FAILURE(relay.Kill());
        ASSERT_NO_FATAL_FAILURE(restart());
        break;
      }
      default:
        break;
    }
    ASSERT_NO_FATAL_FAILURE(relay.Update(step));
    auto stats = replica->Update(step);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_TRUE(stats->verified);
    held = step;
    std::string why;
    ASSERT_TRUE(SyntheticModel::Holds(trainer.dst, held, &why)) << why;
  }
  EXPECT_EQ(faults, 16);
  ASSERT_EQ(relay.child().Command("quit"), "ok");
  relay.child().Wait();
  replica.reset();
  trainer.publisher.reset();
  LedgerSnapshot last;
  EXPECT_TRUE(testing::LedgerSettlesTo(baseline, &last)) << last.ToString();
}

// Replicas that dial the trainer, which serves two directly and redirects the rest to relays
// (max_direct). A relay killed mid-serve: its orphan fails cleanly and, at its next update, is
// placed by the trainer on another relay and catches up at once. A relay stalled mid-serve
// (SIGSTOP) stays connected to the trainer, and reports fewer below it than the other relay, so
// only the orphan's "avoid" keeps it from being sent straight back there. The trainer never waits.
TEST(RelayFaults, OrphansArePlacedOnAnotherRelayByTheTrainer) {
  const LedgerSnapshot baseline = ReadLedger();
  LocalPair trainer;
  trainer.endpoint = "tcp://127.0.0.1:0";
  trainer.timeout = std::chrono::milliseconds(kTimeoutMs);
  trainer.max_direct = 2;
  ASSERT_NO_FATAL_FAILURE(trainer.Start(/*slots=*/2));
  int64_t step = 1;
  ASSERT_NO_FATAL_FAILURE(trainer.Publish(step));
  RelayProcess a, b, c;
  ASSERT_NO_FATAL_FAILURE(a.Start(trainer.endpoint, "tcp://127.0.0.1:0"));
  ASSERT_NO_FATAL_FAILURE(a.Update(step));  // the trainer's first direct member
  ASSERT_NO_FATAL_FAILURE(b.Start(trainer.endpoint, "tcp://127.0.0.1:0"));
  ASSERT_NO_FATAL_FAILURE(b.Update(step));

  SubscriberOptions o;
  o.endpoint = trainer.endpoint;
  o.verify = true;
  o.timeout = std::chrono::milliseconds(kTimeoutMs);
  auto replica = testing::NewSubscriber(o, trainer.dst);
  ASSERT_OK(replica->Update(step).status());  // past the bound: redirected to a (a tie, first)
  int64_t held = step;
  auto below_of = [&](const RelayProcess& relay) -> int64_t {
    for (const MemberInfo& m : trainer.publisher->Members()) {
      if (m.serves == relay.endpoint()) return m.below;
    }
    return -1;
  };
  auto caught_up = [&](Clock::time_point since) {
    auto stats = replica->Update(step);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_TRUE(stats->verified);
    EXPECT_LT(Clock::now() - since, std::chrono::milliseconds(kTimeoutMs + 1500));
    held = step;
    std::string why;
    ASSERT_TRUE(SyntheticModel::Holds(trainer.dst, held, &why)) << why;
  };
  // A replica update that loses its relay to `fault` after `after_ms`.
  auto lose_relay = [&](RelayProcess& relay, int sleep_ms, auto fault) {
    ASSERT_EQ(
        relay.child().Command("arm publisher.before_send=sleep:" + std::to_string(sleep_ms) + "*1"),
        "ok");
    const auto t0 = Clock::now();
    auto pending = std::async(std::launch::async, [&] { return replica->Update(step); });
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    EXPECT_EQ(relay.child().Command("hits publisher.before_send"), "1");
    fault();
    Result<UpdateStats> lost = pending.get();
    ExpectCleanFailure(lost, Clock::now() - t0, *replica, held, trainer.dst);
  };

  // 1. a is killed mid-serve; c takes its place at the trainer; the orphan goes to b.
  ASSERT_NO_FATAL_FAILURE(trainer.Publish(++step));
  ASSERT_NO_FATAL_FAILURE(a.Update(step));
  ASSERT_NO_FATAL_FAILURE(b.Update(step));
  ASSERT_NO_FATAL_FAILURE(lose_relay(a, 10000, [&] { a.Kill(); }));
  for (int i = 0; i < 300 && trainer.publisher->Members().size() != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_NO_FATAL_FAILURE(c.Start(trainer.endpoint, "tcp://127.0.0.1:0"));
  ASSERT_NO_FATAL_FAILURE(c.Update(step));
  ASSERT_NO_FATAL_FAILURE(caught_up(Clock::now()));
  ASSERT_NO_FATAL_FAILURE(trainer.Publish(++step));
  ASSERT_NO_FATAL_FAILURE(b.Update(step));  // b's request says it serves the orphan
  ASSERT_NO_FATAL_FAILURE(c.Update(step));
  ASSERT_NO_FATAL_FAILURE(caught_up(Clock::now()));
  EXPECT_EQ(below_of(b), 1);

  // 2. Two leaves of c's own make c the busier relay (it says so in its next request).
  std::vector<std::vector<std::vector<uint8_t>>> storage;
  std::vector<std::unique_ptr<Subscriber>> leaves;
  for (int i = 0; i < 2; ++i) {
    storage.push_back(SyntheticModel::PoisonedStorage(trainer.tensors));
    SubscriberOptions leaf = o;
    leaf.endpoint = c.endpoint();
    leaves.push_back(
        testing::NewSubscriber(leaf, SyntheticModel::Views(trainer.tensors, storage.back())));
    ASSERT_OK(leaves.back()->Update(step).status());
  }
  ASSERT_NO_FATAL_FAILURE(trainer.Publish(++step));
  ASSERT_NO_FATAL_FAILURE(b.Update(step));
  ASSERT_NO_FATAL_FAILURE(c.Update(step));
  EXPECT_EQ(below_of(b), 1);
  EXPECT_EQ(below_of(c), 2);

  // 3. b stalls mid-serve: the orphan fails at its deadline; the trainer publishes on without
  // waiting; the orphan's next update is placed on c, not back on b (which looks less busy).
  ASSERT_NO_FATAL_FAILURE(lose_relay(b, 500, [&] { ASSERT_TRUE(b.child().Stop()); }));
  const auto stalled = Clock::now();
  const auto p0 = Clock::now();
  ASSERT_NO_FATAL_FAILURE(trainer.Publish(++step));
  ASSERT_NO_FATAL_FAILURE(trainer.Publish(++step));
  EXPECT_LT(Clock::now() - p0, std::chrono::milliseconds(kTimeoutMs / 2));
  ASSERT_NO_FATAL_FAILURE(c.Update(step));
  {
    testing::LogCapture log;  // it never dials b again (which would cost it the relay dial bound)
    ASSERT_NO_FATAL_FAILURE(caught_up(stalled));
    EXPECT_FALSE(log.Contains("relay " + b.endpoint() + " did not answer")) << log.Lines().back();
  }
  ASSERT_NO_FATAL_FAILURE(trainer.Publish(++step));
  ASSERT_NO_FATAL_FAILURE(c.Update(step));
  EXPECT_EQ(below_of(c), 3);  // the two leaves and the orphan

  ASSERT_NO_FATAL_FAILURE(b.Kill());
  for (RelayProcess* relay : {&c}) {
    ASSERT_EQ(relay->child().Command("quit"), "ok");
    relay->child().Wait();
  }
  leaves.clear();
  replica.reset();
  trainer.publisher.reset();
  LedgerSnapshot last;
  EXPECT_TRUE(testing::LedgerSettlesTo(baseline, &last)) << last.ToString();
}

}  // namespace
}  // namespace weightsync
