// Relays (SubscriberOptions::serve_endpoint, docs/relays.md): subscribers that serve what they
// committed to other subscribers, in one process over real tcp loopback and real shared memory.
// Every level of a chain must hold the trainer's bytes exactly, under the trainer's lineage and
// digests; a relay that corrupts, goes away, or cannot serve what it holds must never make a child
// commit wrong bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "core/publisher_relay.h"
#include "core/relay_serve.h"
#include "testing/publisher_process.h"
#include "testing/sparse_trainer.h"
#include "testing/test_util.h"
#include "util/fail_point.h"
#include "weightsync/ledger.h"

// Counts host heap allocations (g_new_calls) to show a steady relay update makes none.
#include "testing/count_new.inc"

namespace weightsync {
namespace {

using testing::SparseTrainer;
using util::FailAction;
using util::FailPoints;

using Bytes = std::vector<std::vector<uint8_t>>;

// (tcp: every hop over loopback tcp; else shared memory on this host, mode)
class RelayChain : public ::testing::TestWithParam<std::tuple<bool, UpdateMode>> {
 protected:
  void SetUp() override { FailPoints::DisarmAll(); }
  void TearDown() override { FailPoints::DisarmAll(); }

  bool tcp() const { return std::get<0>(GetParam()); }
  std::string NewEndpoint(const std::string& stem) {
    return tcp() ? std::string("tcp://127.0.0.1:0") : testing::UniqueEndpoint(stem);
  }

  void StartPublisher(const std::string& lineage = "relay-test") {
    PublisherOptions o;
    o.endpoint = endpoint_.empty() ? NewEndpoint("trainer") : endpoint_;
    o.lineage = lineage;
    o.segment_bytes = 4096;  // many segments even for a small model
    o.timeout = std::chrono::milliseconds(5000);
    ASSERT_OK_AND_ASSIGN(publisher_, Publisher::Create(o));
    ASSERT_OK(publisher_->Register(trainer_.Tensors()));
    endpoint_ = publisher_->endpoint();
  }
  void Publish(int64_t step, double fraction) {
    if (step > 1) trainer_.Step(fraction);
    auto r = publisher_->Publish(step);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  // A subscriber of `upstream` into `storage`; `serve`: it relays at a new endpoint.
  std::unique_ptr<Subscriber> Connect(const std::string& upstream, Bytes& storage, bool serve,
                                      bool verify = true) {
    SubscriberOptions o;
    o.endpoint = upstream;
    o.mode = std::get<1>(GetParam());
    o.verify = verify;
    o.timeout = std::chrono::milliseconds(5000);
    if (serve) o.serve_endpoint = NewEndpoint("relay");
    return testing::NewSubscriber(o, trainer_.Views(storage));
  }

  // The trainer at step 1 and a verifying relay of it into `mid`; null after a fatal failure.
  std::unique_ptr<Subscriber> RelayAtStepOne(Bytes& mid) {
    StartPublisher();
    if (HasFatalFailure()) return nullptr;
    Publish(1, 0);
    if (HasFatalFailure()) return nullptr;
    return Connect(endpoint_, mid, /*serve=*/true);
  }

  // RelayAtStepOne and a child of the relay into `leaf`, both holding step 1; the child null
  // after a failure.
  std::pair<std::unique_ptr<Subscriber>, std::unique_ptr<Subscriber>> ChainAtStepOne(Bytes& mid,
                                                                                     Bytes& leaf) {
    auto relay = RelayAtStepOne(mid);
    if (relay == nullptr) return {};
    auto sub = Connect(relay->serve_endpoint(), leaf, /*serve=*/false);
    auto relayed = relay->Update();
    auto received = relayed.ok() ? sub->Update() : relayed;
    if (!received.ok()) {
      ADD_FAILURE() << "step 1 through the relay: " << received.status();
      sub.reset();
    }
    return {std::move(relay), std::move(sub)};
  }

  SparseTrainer trainer_;
  std::string endpoint_;
  std::unique_ptr<Publisher> publisher_;
};

// trainer → relay → relay → leaf, 40 steps of 0% to 100% changed elements: every level holds the
// trainer's bytes after every step, under its lineage; over tcp the leaf gets deltas through two
// relays (each re-encodes against the version it served before, with the trainer's digests).
TEST_P(RelayChain, ThreeLevelsHoldTheTrainersBytesEveryStep) {
  ASSERT_NO_FATAL_FAILURE(StartPublisher());
  ASSERT_NO_FATAL_FAILURE(Publish(1, 0));
  Bytes first = trainer_.Poisoned(), second = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  auto r1 = Connect(endpoint_, first, /*serve=*/true, /*verify=*/false);
  auto r2 = Connect(r1->serve_endpoint(), second, /*serve=*/true);
  auto sub = Connect(r2->serve_endpoint(), leaf, /*serve=*/false);
  EXPECT_TRUE(sub->serve_endpoint().empty());
  const double fractions[] = {0.01, 0, 0.001, 0.03, 0.5, 1.0, 0.02, 0.01};
  int64_t step = 1;
  uint32_t leaf_delta_segments = 0;
  for (int round = 0; round < 5; ++round) {
    for (double fraction : fractions) {
      SCOPED_TRACE("step " + std::to_string(step) + ", fraction " + std::to_string(fraction));
      if (step > 1) {
        ASSERT_NO_FATAL_FAILURE(Publish(step, fraction));
      }
      for (Subscriber* relay : {r1.get(), r2.get()}) {
        auto stats = relay->Update();
        ASSERT_TRUE(stats.ok()) << stats.status();
        ASSERT_EQ(stats->step, step);
        EXPECT_EQ(stats->served_step, step);
      }
      auto stats = sub->Update();
      ASSERT_TRUE(stats.ok()) << stats.status();
      ASSERT_EQ(stats->step, step);
      EXPECT_TRUE(stats->verified);
      EXPECT_EQ(stats->served_step, -1);
      EXPECT_EQ(stats->lineage.view(), "relay-test");
      ASSERT_TRUE(trainer_.HeldBy(first));
      ASSERT_TRUE(trainer_.HeldBy(second));
      ASSERT_TRUE(trainer_.HeldBy(leaf));
      if (tcp() && step > 1 && fraction > 0 && fraction <= 0.02) {
        EXPECT_EQ(stats->delta_base_step, step - 1);
        EXPECT_LT(stats->received_bytes, stats->bytes / 4);
      }
      leaf_delta_segments += stats->delta_segments;
      ++step;
    }
  }
  EXPECT_EQ(leaf_delta_segments > 0, tcp());
  EXPECT_EQ(sub->committed_lineage(), "relay-test");
}

// A relay that corrupts what it serves (after the trainer's digests were taken) cannot make a
// verifying child commit: Corruption, the child's staged weights as they were; the next step,
// served intact, lands.
TEST_P(RelayChain, ACorruptingRelayIsCaughtByTheChildsVerify) {
  Bytes mid = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  auto [relay, sub] = ChainAtStepOne(mid, leaf);
  ASSERT_NE(sub, nullptr);
  ASSERT_NO_FATAL_FAILURE(Publish(2, 1.0));
  FailPoints::Arm("relay.corrupt_served", FailAction::kFlip, 0, /*count=*/1);
  ASSERT_OK(relay->Update().status());  // the relay's own weights are fine
  EXPECT_EQ(FailPoints::Hits("relay.corrupt_served"), 1);
  ASSERT_TRUE(trainer_.HeldBy(mid));
  const Bytes before = leaf;
  auto refused = sub->Update();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kCorruption) << refused.status();
  EXPECT_EQ(sub->committed_step(), 1);
  if (std::get<1>(GetParam()) == UpdateMode::kStaged) {
    EXPECT_EQ(leaf, before);
    EXPECT_TRUE(sub->weights_valid());
  } else {
    EXPECT_FALSE(sub->weights_valid());
  }
  ASSERT_NO_FATAL_FAILURE(Publish(3, 0.02));
  ASSERT_OK(relay->Update().status());
  auto healed = sub->Update();
  ASSERT_TRUE(healed.ok()) << healed.status();
  EXPECT_EQ(healed->step, 3);
  EXPECT_EQ(healed->delta_base_step, -1);  // it holds no base the relay diffed against
  ASSERT_TRUE(trainer_.HeldBy(leaf));
}

// A relay that went away: its child's update fails within its deadline with nothing committed
// (the old weights intact: nothing had moved), and the ledger returns to where it was.
TEST_P(RelayChain, AClosedRelayFailsItsChildCleanly) {
  const LedgerSnapshot baseline = ReadLedger();
  Bytes mid = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  auto [relay, sub] = ChainAtStepOne(mid, leaf);
  ASSERT_NE(sub, nullptr);
  ASSERT_NO_FATAL_FAILURE(Publish(2, 0.5));
  const std::string served_at = relay->serve_endpoint();
  ASSERT_OK(relay->Close());
  const Bytes before = leaf;
  auto lost = sub->Update();
  ASSERT_FALSE(lost.ok());
  // Its handle saw the relay go and prepared once more: nobody serves the endpoint now.
  EXPECT_EQ(lost.status().code(), StatusCode::kNotFound) << lost.status();
  EXPECT_NE(lost.status().message().find(served_at), std::string::npos) << lost.status();
  EXPECT_EQ(sub->committed_step(), 1);
  EXPECT_EQ(leaf, before);
  ASSERT_OK(sub->Close());
  relay.reset();
  sub.reset();
  ASSERT_OK(publisher_->Close());
  publisher_.reset();
  LedgerSnapshot last;
  EXPECT_TRUE(testing::LedgerSettlesTo(baseline, &last)) << last.ToString();
}

// A replica that joins a relay late gets its latest version whole; a relay asleep (its handle to
// the trainer released) still serves what it holds, from its own store.
TEST_P(RelayChain, ALateJoinerGetsTheLatestAndASleepingRelayStillServes) {
  ASSERT_NO_FATAL_FAILURE(StartPublisher());
  Bytes mid = trainer_.Poisoned(), late = trainer_.Poisoned();
  auto relay = Connect(endpoint_, mid, /*serve=*/true);
  for (int64_t step = 1; step <= 5; ++step) {
    ASSERT_NO_FATAL_FAILURE(Publish(step, 0.03));
    ASSERT_OK(relay->Update().status());
  }
  ASSERT_OK(relay->Sleep());
  auto sub = Connect(relay->serve_endpoint(), late, /*serve=*/false);
  auto stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->step, 5);
  EXPECT_EQ(stats->delta_base_step, -1);
  ASSERT_TRUE(trainer_.HeldBy(late));
}

// The trainer restarts (a new session of its lineage, steps from 1 again) under a chain: the
// relay follows it and serves the new session anew on the same endpoint; its child dials again
// and takes the new session's step whole.
TEST_P(RelayChain, ATrainerRestartFlowsDownTheChain) {
  ASSERT_NO_FATAL_FAILURE(StartPublisher());
  Bytes mid = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  auto relay = Connect(endpoint_, mid, /*serve=*/true);
  auto sub = Connect(relay->serve_endpoint(), leaf, /*serve=*/false);
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_NO_FATAL_FAILURE(Publish(step, 0.02));
    ASSERT_OK(relay->Update().status());
    ASSERT_OK(sub->Update().status());
  }
  const std::string served_at = relay->serve_endpoint();
  ASSERT_OK(publisher_->Close());
  publisher_.reset();
  ASSERT_NO_FATAL_FAILURE(StartPublisher());  // same endpoint and lineage, a new session
  ASSERT_NO_FATAL_FAILURE(Publish(2, 0.5));   // a step number the chain already passed
  auto followed = relay->Update();
  ASSERT_TRUE(followed.ok()) << followed.status();
  EXPECT_TRUE(followed->lineage_changed);
  EXPECT_EQ(followed->served_step, 2);
  EXPECT_EQ(relay->serve_endpoint(), served_at);
  auto stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->step, 2);
  EXPECT_TRUE(stats->lineage_changed);
  EXPECT_EQ(stats->delta_base_step, -1);
  ASSERT_TRUE(trainer_.HeldBy(leaf));
  // Again, now with a step past the one served: still a new session all the way down.
  ASSERT_OK(publisher_->Close());
  publisher_.reset();
  ASSERT_NO_FATAL_FAILURE(StartPublisher());
  ASSERT_NO_FATAL_FAILURE(Publish(10, 0.01));
  ASSERT_OK(relay->Update().status());
  stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->step, 10);
  EXPECT_TRUE(stats->lineage_changed);
  EXPECT_EQ(stats->delta_base_step, -1);
  ASSERT_TRUE(trainer_.HeldBy(leaf));
}

// Membership at each level: the trainer lists the relay, the relay its child, each with the step
// it holds (as it said when it committed it), was sent, or is receiving; a child that leaves is
// dropped.
TEST_P(RelayChain, MembershipSaysWhoHoldsWhichStepAtEachLevel) {
  Bytes mid = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  auto [relay, sub] = ChainAtStepOne(mid, leaf);
  ASSERT_NE(sub, nullptr);
  Subscriber* serving = relay.get();          // (clang 14 captures no structured binding)
  EXPECT_TRUE(sub->ServedMembers().empty());  // not a relay
  ASSERT_NO_FATAL_FAILURE(Publish(2, 0.02));
  ASSERT_OK(relay->Update().status());
  ASSERT_OK(sub->Update().status());
  ASSERT_NO_FATAL_FAILURE(Publish(3, 0.02));
  ASSERT_OK(relay->Update().status());  // the child has not asked for step 3 yet
  std::vector<MemberInfo> direct;
  // Its report after the commit reaches the trainer's session on that session's thread.
  EXPECT_TRUE(testing::Eventually([&] {
    direct = publisher_->Members();
    return direct.size() == 1 && direct[0].held_step == 3;
  }));
  ASSERT_EQ(direct.size(), 1u);  // the relay
  EXPECT_EQ(direct[0].held_step, 3);
  EXPECT_EQ(direct[0].sent_step, 3);
  EXPECT_EQ(direct[0].receiving_step, -1);
  EXPECT_EQ(direct[0].peer.empty(), false);  // 127.0.0.1:PORT (tcp), "subscriber connection N"
  std::vector<MemberInfo> served;
  EXPECT_TRUE(testing::Eventually([&] {
    served = serving->ServedMembers();
    return served.size() == 1 && served[0].held_step == 2;
  }));
  ASSERT_EQ(served.size(), 1u);       // the child
  EXPECT_EQ(served[0].held_step, 2);  // committed, and said so, before it asks for step 3
  EXPECT_EQ(served[0].sent_step, 2);
  // While step 3 is on its way to the child (held up where the link sends it): receiving.
  const char* stall = tcp() ? "publisher.before_send" : "subscriber.before_copy";
  FailPoints::Arm(stall, FailAction::kSleep, 1000, /*count=*/1);
  Subscriber* child = sub.get();  // (a structured binding cannot be captured before C++20's)
  auto receiving = std::async(std::launch::async, [child] { return child->Update(); });
  ASSERT_TRUE(testing::WaitForFailPointHits(stall));
  served = relay->ServedMembers();
  ASSERT_EQ(served.size(), 1u);
  EXPECT_EQ(served[0].held_step, 2);
  EXPECT_EQ(served[0].receiving_step, 3);
  ASSERT_OK(receiving.get().status());
  EXPECT_TRUE(testing::Eventually([&] {
    served = serving->ServedMembers();
    return served.size() == 1 && served[0].held_step == 3;
  }));
  ASSERT_EQ(served.size(), 1u);
  EXPECT_EQ(served[0].held_step, 3);
  EXPECT_EQ(served[0].sent_step, 3);
  ASSERT_OK(sub->Close());
  // The relay's session notices the child leave on its own thread.
  for (int i = 0; i < 300 && !relay->ServedMembers().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(relay->ServedMembers().empty());
  EXPECT_EQ(publisher_->Members().size(), 1u);
}

// After the trainer restarts at a lower step, a child under the strict lineage policy asks its
// relay for a step past the one it holds of the session before; the relay ends that child's
// session, and its own reports (which never list a step past the trainer's latest) keep its
// session with the trainer: its next update needs no new handle.
TEST_P(RelayChain, AStrictChildOfARestartedTrainerNeverGetsItsRelayCutOff) {
  ASSERT_NO_FATAL_FAILURE(StartPublisher());
  for (int64_t step = 1; step <= 3; ++step) ASSERT_NO_FATAL_FAILURE(Publish(step, 0.02));
  Bytes mid = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  auto relay = Connect(endpoint_, mid, /*serve=*/true);
  SubscriberOptions o;
  o.endpoint = relay->serve_endpoint();
  o.mode = std::get<1>(GetParam());
  o.timeout = std::chrono::milliseconds(5000);
  o.lineage_policy = LineagePolicy::kStrict;
  auto child = testing::NewSubscriber(o, trainer_.Views(leaf));
  ASSERT_OK(relay->Update().status());
  ASSERT_OK(child->Update().status());  // step 3
  ASSERT_OK(publisher_->Close());
  publisher_.reset();
  ASSERT_NO_FATAL_FAILURE(StartPublisher());  // same endpoint and lineage, steps from 1 again
  ASSERT_NO_FATAL_FAILURE(Publish(1, 0.02));
  ASSERT_OK(relay->Update().status());                     // follows the new session
  ASSERT_STATUS_IS(kFailedPrecondition, child->Update());  // strict: waits for a step past 3
  EXPECT_TRUE(testing::Eventually([&] {
    const std::vector<MemberInfo> tree = publisher_->Tree();
    return tree.size() == 1 && tree[0].held_step == 1;
  }));
  ASSERT_NO_FATAL_FAILURE(Publish(2, 0.02));
  auto stats = relay->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_FALSE(stats->handle_created);  // its session with the trainer lived on
  ASSERT_TRUE(trainer_.HeldBy(mid));
}

// A relay's report between its updates holds its update lock for one frame: a call that starts
// meanwhile waits for it and goes through, never Busy because of it.
TEST_P(RelayChain, ACallDuringAReportBetweenUpdatesWaitsForItInsteadOfBeingBusy) {
  Bytes mid = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  auto [relay, sub] = ChainAtStepOne(mid, leaf);
  ASSERT_NE(sub, nullptr);
  ASSERT_NO_FATAL_FAILURE(Publish(2, 0.02));
  ASSERT_OK(relay->Update().status());
  FailPoints::Arm("subscriber.report_between", FailAction::kSleep, 500, /*count=*/1);
  ASSERT_OK(sub->Update().status());  // the child's report makes the relay report upward
  ASSERT_TRUE(testing::WaitForFailPointHits("subscriber.report_between"));
  auto stats = relay->Update();  // up to date, while the report holds the lock
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats->up_to_date);
  ASSERT_TRUE(trainer_.HeldBy(leaf));
}

// A report that could not be sent may have left part of a frame on the connection: the update that
// committed stands, and the next one prepares anew before it asks for a step.
TEST_P(RelayChain, AFailedReportMakesTheNextUpdatePrepareAnew) {
  Bytes mid = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  auto [relay, sub] = ChainAtStepOne(mid, leaf);
  ASSERT_NE(sub, nullptr);
  ASSERT_NO_FATAL_FAILURE(Publish(2, 0.02));
  ASSERT_OK(relay->Update().status());
  FailPoints::Arm("subscriber.report", FailAction::kError, 0, /*count=*/1);
  auto stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->step, 2);
  EXPECT_EQ(FailPoints::Hits("subscriber.report"), 1);
  ASSERT_TRUE(trainer_.HeldBy(leaf));
  ASSERT_NO_FATAL_FAILURE(Publish(3, 0.02));
  ASSERT_OK(relay->Update().status());
  stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->step, 3);
  EXPECT_TRUE(stats->handle_created);
  ASSERT_TRUE(trainer_.HeldBy(leaf));
}

// The trainer's tree lists every replica of a chain of depth 3: how deep, through which relay, and
// the step each committed — the leaf's too, though neither relay updates after the leaf commits
// (each pushes what changed below it to its parent between its own updates). A leaf that leaves
// is gone from the trainer's tree the same way.
TEST_P(RelayChain, TheTrainersTreeListsEveryReplicaWithTheStepItCommitted) {
  ASSERT_NO_FATAL_FAILURE(StartPublisher());
  ASSERT_NO_FATAL_FAILURE(Publish(1, 0));
  Bytes first = trainer_.Poisoned(), second = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  auto r1 = Connect(endpoint_, first, /*serve=*/true);
  auto r2 = Connect(r1->serve_endpoint(), second, /*serve=*/true);
  auto sub = Connect(r2->serve_endpoint(), leaf, /*serve=*/false);
  std::vector<MemberInfo> tree;
  for (int64_t step = 1; step <= 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    if (step > 1) {
      ASSERT_NO_FATAL_FAILURE(Publish(step, 0.02));
    }
    for (Subscriber* s : {r1.get(), r2.get(), sub.get()}) ASSERT_OK(s->Update().status());
    ASSERT_TRUE(trainer_.HeldBy(leaf));
    const bool settled = testing::Eventually([&] {
      tree = publisher_->Tree();
      return tree.size() == 3 && tree[2].held_step == step && tree[1].held_step == step;
    });
    ASSERT_EQ(tree.size(), 3u);
    EXPECT_TRUE(settled) << "the leaf is listed as holding step " << tree[2].held_step;
    EXPECT_EQ(tree[0].depth, 1);
    EXPECT_EQ(tree[0].via, "");
    EXPECT_EQ(tree[0].serves, r1->serve_endpoint());
    EXPECT_EQ(tree[0].held_step, step);
    EXPECT_EQ(tree[0].below, 2);
    EXPECT_EQ(tree[1].depth, 2);
    EXPECT_EQ(tree[1].via, r1->serve_endpoint());
    EXPECT_EQ(tree[1].serves, r2->serve_endpoint());
    EXPECT_EQ(tree[1].below, 1);
    EXPECT_EQ(tree[2].depth, 3);
    EXPECT_EQ(tree[2].via, r2->serve_endpoint());
    EXPECT_EQ(tree[2].serves, "");
    EXPECT_EQ(tree[2].sent_step, step);
    EXPECT_FALSE(tree[2].peer.empty());
  }
  // Each relay's own view is the same tree from where it stands.
  const std::vector<MemberInfo> below_r1 = r1->ServedTree();
  ASSERT_EQ(below_r1.size(), 2u);
  EXPECT_EQ(below_r1[0].serves, r2->serve_endpoint());
  EXPECT_EQ(below_r1[1].via, r2->serve_endpoint());
  EXPECT_EQ(below_r1[1].depth, 2);
  EXPECT_EQ(publisher_->Members().size(), 1u);  // Members() stays the direct ones
  ASSERT_OK(sub->Close());
  EXPECT_TRUE(testing::Eventually([&] { return publisher_->Tree().size() == 2; }))
      << publisher_->Tree().size();
}

// A child stalled in the middle of reading an older version never holds its relay past the
// relay's own update: closing the relay while its hand-over waits for that child's slot ends the
// wait at once (the child's read revoked), not after the relay's timeout.
TEST_P(RelayChain, AStalledChildNeverHoldsItsRelayPastItsOwnUpdate) {
  Bytes mid = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  auto relay = RelayAtStepOne(mid);  // 5 s timeout, its serving publisher's too
  ASSERT_NE(relay, nullptr);
  ASSERT_OK(relay->Update().status());
  ASSERT_NO_FATAL_FAILURE(Publish(2, 0.02));
  ASSERT_OK(relay->Update().status());  // its store: step 1 and step 2
  auto sub = Connect(relay->serve_endpoint(), leaf, /*serve=*/false);
  // Stalled with step 2 pinned: over tcp the relay's session sleeps before it sends (the bytes
  // would otherwise sit in the socket at once), over shm the child sleeps before it copies.
  const char* stall = tcp() ? "publisher.before_send" : "subscriber.before_copy";
  FailPoints::Arm(stall, FailAction::kSleep, 4000, /*count=*/1);
  auto stalled = std::async(std::launch::async, [&] { return sub->Update(); });
  ASSERT_TRUE(testing::WaitForFailPointHits(stall));
  ASSERT_NO_FATAL_FAILURE(Publish(3, 0.02));
  ASSERT_OK(relay->Update().status());  // into step 1's slot, which nobody reads
  ASSERT_NO_FATAL_FAILURE(Publish(4, 0.02));
  // Step 4 needs the slot the child reads: the relay's update waits for it, until closed.
  auto waiting = std::async(std::launch::async, [&] { return relay->Update(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // (Close itself then waits for the stalled session's fail-point sleep to end: a test artifact.)
  testing::LogCapture logs;
  auto closing = std::async(std::launch::async, [&] { return relay->Close(); });
  ASSERT_EQ(waiting.wait_for(std::chrono::milliseconds(2500)), std::future_status::ready);
  auto handed = waiting.get();
  ASSERT_TRUE(handed.ok()) << handed.status();  // its own update committed step 4
  EXPECT_EQ(handed->step, 4);
  ASSERT_OK(closing.get());
  EXPECT_TRUE(logs.Contains("revoked the read of 1 subscriber(s)") &&
              logs.Contains("the writer was cancelled: a relay closing"))
      << ::testing::PrintToString(logs.Lines());
  auto revoked = stalled.get();
  ASSERT_FALSE(revoked.ok());
  EXPECT_EQ(sub->committed_step(), -1);
}

// A relay must hold the trainer's whole version to serve it: one that registered part of it is
// refused before anything moves (its destinations untouched), naming the missing tensor.
TEST_P(RelayChain, ARelayHoldingPartOfTheVersionIsRefusedBeforeAnythingMoves) {
  ASSERT_NO_FATAL_FAILURE(StartPublisher());
  ASSERT_NO_FATAL_FAILURE(Publish(1, 0));
  Bytes mid = trainer_.Poisoned();
  std::vector<NamedTensor> views = trainer_.Views(mid);
  views.pop_back();  // the last published tensor is not held here
  SubscriberOptions o;
  o.endpoint = endpoint_;
  o.mode = std::get<1>(GetParam());
  o.policy = MatchPolicy::kSubset;
  o.serve_endpoint = NewEndpoint("relay");
  auto relay = testing::NewSubscriber(o, views);
  auto refused = relay->Update();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("'empty' is not registered here"), std::string::npos)
      << refused.status();
  EXPECT_EQ(mid, trainer_.Poisoned());
  EXPECT_EQ(relay->committed_step(), -1);
}

// A relay whose weights check found a difference rewrites its committed step, and takes the
// copy it serves again from the rewritten bytes (a new serving publisher on the same endpoint).
TEST_P(RelayChain, RewritingTheCommittedStepServesItAnewFromTheRewrittenBytes) {
  Bytes mid = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  auto relay = RelayAtStepOne(mid);
  ASSERT_NE(relay, nullptr);
  ASSERT_OK(relay->Update().status());
  mid[0][7] ^= 0x10;  // something wrote over the relay's weights
  ASSERT_EQ(relay->CheckWeights().status().code(), StatusCode::kCorruption);
  testing::LogCapture logs;
  auto rewritten = relay->Update();
  ASSERT_TRUE(rewritten.ok()) << rewritten.status();
  EXPECT_EQ(rewritten->step, 1);
  EXPECT_FALSE(rewritten->up_to_date);
  EXPECT_EQ(rewritten->served_step, 1);
  EXPECT_TRUE(logs.Contains("it committed a step it serves again"))
      << ::testing::PrintToString(logs.Lines());
  EXPECT_FALSE(logs.Contains("failed")) << ::testing::PrintToString(logs.Lines());
  ASSERT_TRUE(trainer_.HeldBy(mid));
  auto sub = Connect(relay->serve_endpoint(), leaf, /*serve=*/false);
  ASSERT_OK(sub->Update().status());
  ASSERT_TRUE(trainer_.HeldBy(leaf));
}

// A relay that slept and registered new memory for its weights (an engine that freed and
// re-allocated them) serves from the new memory: the old is overwritten and its children still
// get the trainer's bytes, verified.
TEST_P(RelayChain, ARelayThatRegisteredNewMemoryServesFromIt) {
  Bytes mid = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  auto [relay, sub] = ChainAtStepOne(mid, leaf);
  ASSERT_NE(sub, nullptr);
  ASSERT_OK(relay->Sleep());
  Bytes moved = mid;  // the engine's weights, now elsewhere
  ASSERT_OK(relay->Register(trainer_.Views(moved)));
  for (auto& t : mid) std::fill(t.begin(), t.end(), 0xEE);  // the old memory, reused
  for (int64_t step = 2; step <= 3; ++step) {
    ASSERT_NO_FATAL_FAILURE(Publish(step, 0.02));
    auto stats = relay->Update();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->served_step, step);
    ASSERT_TRUE(trainer_.HeldBy(moved));
    auto child = sub->Update();
    ASSERT_TRUE(child.ok()) << child.status();
    EXPECT_TRUE(child->verified);
    ASSERT_TRUE(trainer_.HeldBy(leaf));
  }
}

// A relay's steady update allocates nothing on the host: the update, the check that its
// destinations are the memory it registered, and the hand-over into its store (sized at the
// first); an up-to-date update neither.
TEST_P(RelayChain, ASteadyRelayUpdateAllocatesNothing) {
  Bytes mid = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  const int64_t at_start = g_new_calls.load();
  auto [relay, sub] = ChainAtStepOne(mid, leaf);
  ASSERT_NE(sub, nullptr);
  // Warm: every lazily sized scratch is sized. Deltas grow their buffers to the largest seen, so
  // the warm steps change more elements than the one measured.
  for (int64_t step = 2; step <= 3; ++step) {
    ASSERT_NO_FATAL_FAILURE(Publish(step, 0.05));
    ASSERT_OK(relay->Update().status());
    ASSERT_OK(sub->Update().status());
  }
  EXPECT_GT(g_new_calls.load(), at_start) << "operator new is not counted: the zeros prove nothing";
  // The trainer's session sizes its decode of the relay's reports at the first that lists the
  // leaf (a report between updates, which a loaded machine may deliver late): wait for it, so
  // the window below holds the relay's update alone.
  ASSERT_TRUE(testing::Eventually([&] {
    const std::vector<MemberInfo> tree = publisher_->Tree();
    return tree.size() == 2 && tree[1].held_step == 3;
  }));
  ASSERT_NO_FATAL_FAILURE(Publish(4, 0.005));
  const int64_t before = g_new_calls.load();
  auto stats = relay->Update();
  const int64_t in_update = g_new_calls.load() - before;
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->served_step, 4);
  EXPECT_EQ(in_update, 0);
  const int64_t again_before = g_new_calls.load();
  ASSERT_OK(relay->Update().status());  // up to date
  EXPECT_EQ(g_new_calls.load() - again_before, 0);
}

// A relay that offers a step older than the one its child holds (hostile, or confused) is refused
// as a trainer would be: a protocol error, nothing committed, the child's weights as they were.
TEST_P(RelayChain, ARelayOfferingAnOlderStepIsRefused) {
  Bytes mid = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  auto [relay, sub] = ChainAtStepOne(mid, leaf);
  ASSERT_NE(sub, nullptr);
  ASSERT_NO_FATAL_FAILURE(Publish(2, 0.5));
  ASSERT_OK(relay->Update().status());
  const Bytes before = leaf;
  // Only the relay's session acquires a step now: the child's request to it.
  FailPoints::Arm("publisher.offer_older_step", FailAction::kFlip, 0, /*count=*/1);
  auto refused = sub->Update();
  EXPECT_EQ(FailPoints::Hits("publisher.offer_older_step"), 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kProtocolError) << refused.status();
  EXPECT_EQ(sub->committed_step(), 1);
  EXPECT_EQ(leaf, before);
  auto healed = sub->Update();
  ASSERT_TRUE(healed.ok()) << healed.status();
  EXPECT_EQ(healed->step, 2);
  ASSERT_TRUE(trainer_.HeldBy(leaf));
}

// A hand-over that fails never fails the relay's own update (it committed): logged with its
// cause, served_step says what children get, and the next update — up to date — hands it over.
TEST_P(RelayChain, AFailedHandOverIsLoggedAndRetriedByTheNextUpdate) {
  Bytes mid = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  auto relay = RelayAtStepOne(mid);
  ASSERT_NE(relay, nullptr);
  testing::LogCapture logs;
  FailPoints::Arm("relay.serve", FailAction::kError, 0, /*count=*/1);
  auto first = relay->Update();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(FailPoints::Hits("relay.serve"), 1);
  EXPECT_EQ(first->step, 1);
  EXPECT_EQ(first->served_step, -1);
  EXPECT_TRUE(
      logs.Contains("serving step 1 failed: internal: injected failure at fail point "
                    "'relay.serve'"))
      << ::testing::PrintToString(logs.Lines());
  ASSERT_TRUE(trainer_.HeldBy(mid));
  auto again = relay->Update();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->up_to_date);
  EXPECT_EQ(again->served_step, 1);
  // Up to date once more: the step it serves stays as it is, nothing handed over, nothing failed.
  auto still = relay->Update();
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(still->served_step, 1);
  const auto lines = logs.Lines();
  EXPECT_EQ(
      std::count_if(lines.begin(), lines.end(),
                    [](const std::string& l) { return l.find("failed") != std::string::npos; }),
      1)
      << ::testing::PrintToString(lines);
  auto sub = Connect(relay->serve_endpoint(), leaf, /*serve=*/false);
  ASSERT_OK(sub->Update().status());
  ASSERT_TRUE(trainer_.HeldBy(leaf));
}

// A relay serves only what its own weights check passed: a step it received corrupted (it does
// not verify; the trainer flipped a bit after hashing) fails its update with check_weights and is
// never handed to children.
TEST_P(RelayChain, ARelayNeverServesAStepItsWeightsCheckRefused) {
  ASSERT_NO_FATAL_FAILURE(StartPublisher());
  FailPoints::Arm("publisher.corrupt_after_digest", FailAction::kFlip, 0, /*count=*/1);
  ASSERT_NO_FATAL_FAILURE(Publish(1, 0));
  EXPECT_EQ(FailPoints::Hits("publisher.corrupt_after_digest"), 1);
  Bytes mid = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  auto relay = Connect(endpoint_, mid, /*serve=*/true, /*verify=*/false);
  UpdateOptions checked;
  checked.check_weights = true;
  auto refused = relay->Update(checked);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kCorruption) << refused.status();
  SubscriberOptions o;
  o.endpoint = relay->serve_endpoint();
  o.verify = true;
  o.timeout = std::chrono::milliseconds(300);
  auto sub = testing::NewSubscriber(o, trainer_.Views(leaf));
  auto nothing = sub->Update();
  ASSERT_FALSE(nothing.ok());
  EXPECT_EQ(nothing.status().code(), StatusCode::kTimeout) << nothing.status();  // no step served
  EXPECT_EQ(leaf, trainer_.Poisoned());
}

// Tied weights (one memory, two names) and tensors the trainer Allocate()d in its store reach a
// relay's children like any other, verified against the trainer's digests.
TEST_P(RelayChain, TiedAndArenaAllocatedTensorsPassThroughARelay) {
  PublisherOptions po;
  po.endpoint = NewEndpoint("trainer");
  po.segment_bytes = 4096;
  ASSERT_OK_AND_ASSIGN(publisher_, Publisher::Create(po));
  std::vector<NamedTensor> tensors = trainer_.Tensors();
  tensors.push_back(trainer_.Tied());
  ASSERT_OK(publisher_->Register(tensors));
  ASSERT_OK_AND_ASSIGN(TensorView arena,
                       publisher_->Allocate("rope.cache", DType::kFloat32, {777}));
  auto* cache = static_cast<uint8_t*>(arena.data);
  auto views = [&](Bytes& storage, std::vector<uint8_t>& own_cache) {
    std::vector<NamedTensor> v = trainer_.Views(storage);
    v.push_back({"lm_head.weight", v[0].view});  // the same memory as layers.0.w
    v.push_back({"rope.cache", TensorView{own_cache.data(), DType::kFloat32, {777}}});
    return v;
  };
  Bytes mid = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  std::vector<uint8_t> mid_cache(777 * 4), leaf_cache(777 * 4);
  SubscriberOptions o;
  o.mode = std::get<1>(GetParam());
  o.verify = true;
  o.endpoint = publisher_->endpoint();
  o.serve_endpoint = NewEndpoint("relay");
  auto relay = testing::NewSubscriber(o, views(mid, mid_cache));
  o.endpoint = relay->serve_endpoint();
  o.serve_endpoint.clear();
  auto sub = testing::NewSubscriber(o, views(leaf, leaf_cache));
  for (int64_t step = 1; step <= 3; ++step) {
    if (step > 1) trainer_.Step(0.05);
    ASSERT_OK(publisher_->BeginWrite());
    for (int i = 0; i < 777 * 4; ++i) cache[i] = static_cast<uint8_t>(step * 31 + i);
    ASSERT_OK(publisher_->Publish(step).status());
    ASSERT_OK(relay->Update().status());
    auto stats = sub->Update();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_TRUE(stats->verified);
    ASSERT_TRUE(trainer_.HeldBy(leaf));
    EXPECT_EQ(std::memcmp(leaf_cache.data(), cache, leaf_cache.size()), 0);
  }
}

// Every hop authenticates with the trainer's token: a child without it is refused by the relay,
// one with it is served.
TEST_P(RelayChain, EveryHopTakesTheTrainersToken) {
  if (!tcp()) GTEST_SKIP() << "tokens are for tcp";
  const std::string token = "relay-test-token-0123456789abcdef";
  PublisherOptions po;
  po.endpoint = "tcp://127.0.0.1:0";
  po.token = token;
  po.segment_bytes = 4096;
  ASSERT_OK_AND_ASSIGN(publisher_, Publisher::Create(po));
  ASSERT_OK(publisher_->Register(trainer_.Tensors()));
  ASSERT_OK(publisher_->Publish(1).status());
  Bytes mid = trainer_.Poisoned(), stranger = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  SubscriberOptions o;
  o.endpoint = publisher_->endpoint();
  o.token = token;
  o.mode = std::get<1>(GetParam());
  o.serve_endpoint = "tcp://127.0.0.1:0";
  auto relay = testing::NewSubscriber(o, trainer_.Views(mid));
  ASSERT_OK(relay->Update().status());
  SubscriberOptions child = o;
  child.endpoint = relay->serve_endpoint();
  child.serve_endpoint.clear();
  child.token = "not-the-token-0123456789abcdefgh";
  auto refused = testing::NewSubscriber(child, trainer_.Views(stranger))->Update();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnauthenticated) << refused.status();
  EXPECT_EQ(stranger, trainer_.Poisoned());
  child.token = token;
  auto served = testing::NewSubscriber(child, trainer_.Views(leaf))->Update();
  ASSERT_TRUE(served.ok()) << served.status();
  ASSERT_TRUE(trainer_.HeldBy(leaf));
}

INSTANTIATE_TEST_SUITE_P(Links, RelayChain,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(UpdateMode::kStaged,
                                                              UpdateMode::kInPlace)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "Tcp" : "Shm") +
                                  (std::get<1>(info.param) == UpdateMode::kStaged ? "Staged"
                                                                                  : "InPlace");
                         });

TEST(Relay, ServesOnePublisherOnly) {
  SubscriberOptions o;
  o.endpoints = {"tcp://127.0.0.1:1", "tcp://127.0.0.1:2"};
  o.serve_endpoint = "tcp://127.0.0.1:0";
  auto refused = Subscriber::Create(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("serve_endpoint with 2 publishers"), std::string::npos)
      << refused.status();
}

// What a relay can serve: the trainer's whole version, as published, from one store: host memory
// (a publisher that digests on the host) or one GPU (one that digests on its GPU). Each refusal
// names the tensor, or the devices, and why.
TEST(Relay, ServesTheWholeVersionAsPublishedFromHostMemoryOrOneGpu) {
  wire::Welcome upstream;
  upstream.tensors.push_back({{"w", DType::kBFloat16, {4, 8}, 64}});
  upstream.tensors.push_back({{"b", DType::kFloat32, {8}, 32}});
  std::vector<uint8_t> memory(96);
  auto destinations = [&] {
    std::vector<plan::Destination> d(2);
    d[0].spec = {"w", DType::kBFloat16, {4, 8}, 64};
    d[0].data = memory.data();
    d[1].spec = {"b", DType::kFloat32, {8}, 32};
    d[1].data = memory.data() + 64;
    return d;
  };
  ASSERT_OK(core::RelayServe::CheckServable(upstream, destinations()));
  auto refused = [&](const std::vector<plan::Destination>& d, const wire::Welcome& w,
                     const std::string& why) {
    Status s = core::RelayServe::CheckServable(w, d);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find(why), std::string::npos) << s;
  };
  std::vector<plan::Destination> d = destinations();
  d.pop_back();
  refused(d, upstream, "'b' is not registered here");
  d = destinations();
  d[1].spec = {"b", DType::kFloat16, {16}, 32};
  refused(d, upstream, "'b' is float32[8] but registered here as float16[16]");
  d = destinations();
  d[0].device = {Device::Kind::kCUDA, 0};
  refused(d, upstream, "tensors 'w' (cuda:0) and 'b' (cpu) are held on different devices");
  wire::Welcome gpu_digests = upstream;
  gpu_digests.digest_kind = wire::DigestKind::kGpu64;
  d[1].device = {Device::Kind::kCUDA, 1};
  refused(d, gpu_digests, "tensors 'w' (cuda:0) and 'b' (cuda:1) are held on different devices");
  d[1].device = d[0].device;  // all on cuda:0: served from a GPU store, with GPU digests only
  EXPECT_OK(core::RelayServe::CheckServable(gpu_digests, d));
  refused(d, upstream, "the destinations are CUDA memory");
  d.push_back(destinations()[0]);  // a host buffer the trainer does not publish: no matter
  d.back().spec.name = "scratch";
  EXPECT_OK(core::RelayServe::CheckServable(gpu_digests, d));
  d = destinations();
  d[0].regions.push_back({"w", {4, 8}, {0, 0}, {4, 8}, {0, 0}});
  refused(d, upstream, "'w' is registered here as regions");
  wire::Welcome sharded = upstream;
  sharded.tensors[1].sharded = true;
  refused(destinations(), sharded, "'b' is a region of a larger tensor");
  refused(destinations(), gpu_digests, "digests on its GPU");
}

// The relay's publisher takes the trainer's identity only before it serves, and a version only
// with every one of its digests.
TEST(Relay, ItsPublisherTakesAnIdentityOnceAndAVersionWithAllItsDigests) {
  PublisherOptions o;
  o.endpoint = testing::UniqueEndpoint("relay-publisher");
  ASSERT_OK_AND_ASSIGN(auto publisher, Publisher::Create(o));
  std::vector<uint8_t> bytes(4096, 7);
  ASSERT_OK(publisher->Register({{"w", TensorView{bytes.data(), DType::kUInt8, {4096}}}}));
  wire::Welcome upstream;
  upstream.session_id = 42;
  upstream.lineage = "trainer";
  upstream.segment_bytes = 1024;
  ASSERT_OK(PublisherRelayAccess::AdoptIdentity(*publisher, upstream));
  EXPECT_EQ(publisher->lineage(), "trainer");
  const std::vector<uint64_t> digests = {1, 2, 3, 4};  // 4096 bytes in 1,024-byte segments
  const util::Deadline within(std::chrono::seconds(5));
  auto short_by_one =
      PublisherRelayAccess::PublishGiven(*publisher, 1, {digests.data(), 3}, within);
  EXPECT_EQ(short_by_one.status().code(), StatusCode::kInvalidArgument) << short_by_one.status();
  EXPECT_EQ(publisher->latest_step(), -1);
  ASSERT_OK(PublisherRelayAccess::PublishGiven(*publisher, 1, digests, within).status());
  EXPECT_EQ(publisher->latest_step(), 1);
  EXPECT_EQ(PublisherRelayAccess::AdoptIdentity(*publisher, upstream).code(),
            StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace weightsync
