// Cut-through relays (docs/relays.md, "Cut-through"): a relay serves a step it receives whole over
// tcp while it lands, so its children have the bytes before the relay has committed the step;
// they end the step (and commit) only once the relay did. Real tcp loopback and shared memory, in
// one process.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "testing/publisher_process.h"
#include "testing/sparse_trainer.h"
#include "testing/test_util.h"
#include "testing/transport_modes.h"
#include "util/fail_point.h"
#include "weightsync/ledger.h"

namespace weightsync {
namespace {

using testing::SparseTrainer;
using util::FailAction;
using util::FailPoints;

using Bytes = std::vector<std::vector<uint8_t>>;
using namespace std::chrono_literals;

class CutThrough : public ::testing::TestWithParam<UpdateMode> {
 protected:
  void SetUp() override {
    FailPoints::DisarmAll();
    PublisherOptions o;
    o.endpoint = "tcp://127.0.0.1:0";
    o.lineage = "cut-through";
    o.segment_bytes = 4096;
    o.timeout = 5000ms;
    ASSERT_OK_AND_ASSIGN(publisher_, Publisher::Create(o));
    ASSERT_OK(publisher_->Register(trainer_.Tensors()));
    ASSERT_NO_FATAL_FAILURE(Publish(1, 0));
  }
  void TearDown() override { FailPoints::DisarmAll(); }

  void Publish(int64_t step, double fraction) {
    if (step > 1) trainer_.Step(fraction);
    auto r = publisher_->Publish(step);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  // A subscriber of `upstream` into `storage`; `serve`: it relays at `serve` (a new endpoint).
  std::unique_ptr<Subscriber> Connect(const std::string& upstream, Bytes& storage,
                                      const std::string& serve = {}, bool verify = true,
                                      bool delta = true) {
    SubscriberOptions o;
    o.endpoint = upstream;
    o.mode = GetParam();
    o.verify = verify;
    o.delta = delta;
    o.timeout = 5000ms;
    o.serve_endpoint = serve;
    return testing::NewSubscriber(o, trainer_.Views(storage));
  }

  SparseTrainer trainer_;
  std::unique_ptr<Publisher> publisher_;
};

// The relay is held after its copy, before it serves the step's end (fail point
// relay.before_finish): its child has every byte of the step by then (it passed
// subscriber.after_copy, which the relay passed first), and ends the step only once the relay
// committed. Stored and forwarded, the child would get no byte before the relay's update returned.
TEST_P(CutThrough, AChildHasTheStepsBytesBeforeItsRelayCommittedIt) {
  Bytes mid = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  auto relay = Connect(publisher_->endpoint(), mid, "tcp://127.0.0.1:0", /*verify=*/true,
                       /*delta=*/false);
  ASSERT_OK(relay->Update().status());
  auto child = Connect(relay->serve_endpoint(), leaf);
  ASSERT_OK(child->Update().status());
  ASSERT_NO_FATAL_FAILURE(Publish(2, 0.3));
  FailPoints::Arm("relay.before_finish", FailAction::kSleep, 3000, /*count=*/1);
  FailPoints::Arm("subscriber.after_copy", FailAction::kSleep, 0);
  std::atomic<bool> relay_done{false};
  auto relayed = std::async(std::launch::async, [&] {
    auto r = relay->Update();
    relay_done = true;
    return r;
  });
  // The relay's own copy first, so the child asks for step 2 while it is landing or held.
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  while (FailPoints::Hits("subscriber.after_copy") < 1 &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(1ms);
  }
  auto received = std::async(std::launch::async, [&] { return child->Update(); });
  while (FailPoints::Hits("subscriber.after_copy") < 2 && !relay_done &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(FailPoints::Hits("subscriber.after_copy"), 2);
  EXPECT_FALSE(relay_done) << "the child got the step's bytes only after its relay's update";
  EXPECT_EQ(received.wait_for(0s), std::future_status::timeout)
      << "the child ended the step before its relay committed it";
  auto r = relayed.get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->served_step, 2);
  auto c = received.get();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step, 2);
  EXPECT_TRUE(c->verified);
  EXPECT_TRUE(trainer_.HeldBy(mid));
  EXPECT_TRUE(trainer_.HeldBy(leaf));
}

// A relay whose own update fails after its children began to receive the step (its verify
// refuses bytes the trainer corrupted after hashing) gives the step up: the child's update fails
// with nothing committed (staged: its weights as they were), the relay serves the step before
// again, and both catch up bit-exact at the next step.
TEST_P(CutThrough, ARelayWhoseUpdateFailsMidStepFailsItsChildren) {
  const LedgerSnapshot baseline = ReadLedger();
  Bytes mid = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  auto relay = Connect(publisher_->endpoint(), mid, "tcp://127.0.0.1:0", /*verify=*/true,
                       /*delta=*/false);
  ASSERT_OK(relay->Update().status());
  auto child = Connect(relay->serve_endpoint(), leaf);
  ASSERT_OK(child->Update().status());
  const Bytes at_one = trainer_.Snapshot();
  FailPoints::Arm("publisher.corrupt_after_digest", FailAction::kFlip, 0, /*count=*/1);
  ASSERT_NO_FATAL_FAILURE(Publish(2, 0.3));
  FailPoints::Arm("relay.before_finish", FailAction::kSleep, 0);
  // Every update waits there a while once its bytes are in: the relay before its verify, so its
  // child has all of step 2 by the time the relay refuses it.
  FailPoints::Arm("subscriber.after_copy", FailAction::kSleep, 300);
  // The child asks first and waits for step 2, so it is reading when the relay fails.
  UpdateOptions two;
  two.step = 2;
  auto received = std::async(std::launch::async, [&] { return child->Update(two); });
  std::this_thread::sleep_for(100ms);
  auto r = relay->Update();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status();
  auto c = received.get();
  ASSERT_FALSE(c.ok()) << "the child committed step " << c->step << ", which its relay refused";
  EXPECT_EQ(FailPoints::Hits("subscriber.after_copy"), 2) << "the child never had all of step 2";
  EXPECT_EQ(child->committed_step(), 1);
  EXPECT_EQ(FailPoints::Hits("relay.before_finish"), 0);
  if (GetParam() == UpdateMode::kStaged) {
    EXPECT_EQ(leaf, at_one);
    EXPECT_TRUE(child->weights_valid());
  } else {
    EXPECT_FALSE(child->weights_valid());
  }
  // The relay serves step 1 again, whole, to a newcomer.
  Bytes fresh = trainer_.Poisoned();
  auto late = Connect(relay->serve_endpoint(), fresh);
  auto one = late->Update();
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->step, 1);
  EXPECT_EQ(fresh, at_one);
  ASSERT_OK(late->Close());
  ASSERT_NO_FATAL_FAILURE(Publish(3, 0.3));
  auto again = relay->Update();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->served_step, 3);
  auto caught_up = child->Update();
  ASSERT_TRUE(caught_up.ok()) << caught_up.status();
  EXPECT_EQ(caught_up->step, 3);
  EXPECT_TRUE(trainer_.HeldBy(mid));
  EXPECT_TRUE(trainer_.HeldBy(leaf));
  ASSERT_OK(child->Close());
  ASSERT_OK(relay->Close());
  // The trainer's sessions with them end within a poll slice.
  LedgerSnapshot after;
  EXPECT_TRUE(testing::LedgerSettlesTo(baseline, &after)) << baseline.ToString() << "\n"
                                                          << after.ToString();
}

// A child on the relay's own host (local://) copies the slot it maps as it is: it is never given a
// step still landing, but waits until the relay committed it, then gets it whole and verified.
TEST_P(CutThrough, ASharedMemoryChildWaitsForTheStepWhole) {
  Bytes mid = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  auto relay = Connect(publisher_->endpoint(), mid, testing::UniqueEndpoint("cut-relay"),
                       /*verify=*/true, /*delta=*/false);
  ASSERT_OK(relay->Update().status());
  auto child = Connect(relay->serve_endpoint(), leaf);
  ASSERT_OK(child->Update().status());
  ASSERT_NO_FATAL_FAILURE(Publish(2, 0.3));
  FailPoints::Arm("relay.before_finish", FailAction::kSleep, 1000, /*count=*/1);
  auto relayed = std::async(std::launch::async, [&] { return relay->Update(); });
  ASSERT_TRUE(testing::WaitForFailPointHits("relay.before_finish"));
  auto c = child->Update();  // asked while step 2 is in the relay's slot, not yet whole
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step, 2);
  EXPECT_TRUE(c->verified);
  ASSERT_OK(relayed.get().status());
  EXPECT_TRUE(trainer_.HeldBy(leaf));
}

// A slot that held a delta (a step the relay received as deltas and stored and forwarded) and is
// then written by cut-through keeps no delta: a child holding the old delta's base gets the new
// step whole, never the stale delta applied to it (its verify is off: nothing else would catch
// it).
TEST_P(CutThrough, AStreamedStepNeverCarriesTheDeltaItsSlotHeldBefore) {
  Bytes mid = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  auto relay = Connect(publisher_->endpoint(), mid, "tcp://127.0.0.1:0");
  ASSERT_OK(relay->Update().status());  // step 1 whole: streamed into slot A
  auto child = Connect(relay->serve_endpoint(), leaf, {}, /*verify=*/false);
  ASSERT_OK(child->Update().status());  // the child holds step 1
  ASSERT_NO_FATAL_FAILURE(Publish(2, 0.01));
  auto two = relay->Update();  // as deltas against 1: stored and forwarded into slot B, a delta
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_EQ(two->delta_base_step, 1);
  for (int64_t step = 3; step <= 6; ++step) {
    ASSERT_NO_FATAL_FAILURE(Publish(step, 0.01));
    // 4 and 6 come whole (the trainer's deltas are against 3 and 5, the relay holds 2 and 4):
    // streamed, into slot A and then slot B.
    if (step % 2 == 0) {
      auto r = relay->Update();
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(r->delta_base_step, -1);
      ASSERT_EQ(r->served_step, step);
    }
  }
  auto c = child->Update();  // asks for deltas against step 1
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step, 6);
  EXPECT_EQ(c->delta_base_step, -1);
  EXPECT_TRUE(trainer_.HeldBy(leaf));
}

// A child stalled while it reads the relay's older version (its slot the only one a new step
// could stream into) never fails the relay's update: that step is stored and forwarded, and the
// relay's wait for the child has its own budget after the commit (its read revoked past the
// relay's timeout), as without cut-through.
TEST_P(CutThrough, AStalledChildNeverFailsItsRelaysUpdate) {
  Bytes mid = trainer_.Poisoned(), leaf = trainer_.Poisoned();
  auto relay = Connect(publisher_->endpoint(), mid, "tcp://127.0.0.1:0", /*verify=*/true,
                       /*delta=*/false);
  ASSERT_OK(relay->Update().status());
  ASSERT_NO_FATAL_FAILURE(Publish(2, 0.3));
  ASSERT_OK(relay->Update().status());  // its store: step 1 and step 2
  auto child = Connect(relay->serve_endpoint(), leaf);
  // Stalled with step 2 pinned, longer than the relay's 5 s timeout.
  FailPoints::Arm("publisher.before_send", FailAction::kSleep, 6500, /*count=*/1);
  auto stalled = std::async(std::launch::async, [&] { return child->Update(); });
  ASSERT_TRUE(testing::WaitForFailPointHits("publisher.before_send"));
  ASSERT_NO_FATAL_FAILURE(Publish(3, 0.3));
  auto three = relay->Update();  // streamed into step 1's slot, which nobody reads
  ASSERT_TRUE(three.ok()) << three.status();
  testing::LogCapture logs;
  ASSERT_NO_FATAL_FAILURE(Publish(4, 0.3));
  auto four = relay->Update();  // the other slot is the child's
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ(four->served_step, 4);
  EXPECT_TRUE(logs.Contains("served once committed, not while it lands") &&
              logs.Contains("revoked the read of 1 subscriber(s)"))
      << ::testing::PrintToString(logs.Lines());
  EXPECT_TRUE(trainer_.HeldBy(mid));
  ASSERT_FALSE(stalled.get().ok());
  auto caught_up = child->Update();
  ASSERT_TRUE(caught_up.ok()) << caught_up.status();
  EXPECT_EQ(caught_up->step, 4);
  EXPECT_TRUE(trainer_.HeldBy(leaf));
}

INSTANTIATE_TEST_SUITE_P(Modes, CutThrough, testing::BothUpdateModes(), testing::UpdateModeName);

}  // namespace
}  // namespace weightsync
