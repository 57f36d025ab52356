// A subscriber fed by two publishers (two trainer ranks, each owning half of the model, or both
// holding replicas): one static schedule, both shares per step, all of a step or none of it.
// Real publishers over real Unix sockets + shared memory, and over TCP loopback.

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "testing/count_new.inc"
#include "testing/test_util.h"
#include "testing/transport_modes.h"

namespace weightsync {
namespace {

using testing::SyntheticModel;

using Param = testing::TransportMode;

class MultiPublisher : public ::testing::TestWithParam<Param> {
 protected:
  // Publisher `which` (0 or 1) registers the given tensors of the model.
  void StartPublisher(int which, const std::vector<NamedTensor>& owned,
                      const std::string& endpoint = "") {
    PublisherOptions o;
    o.endpoint = !endpoint.empty() ? endpoint
                 : GetParam().tcp  ? std::string("tcp://127.0.0.1:0")
                                   : testing::UniqueEndpoint("multi");
    o.segment_bytes = 4096;
    o.timeout = std::chrono::milliseconds(5000);
    auto p = Publisher::Create(o);
    ASSERT_TRUE(p.ok()) << p.status();
    publishers_[which] = std::move(p).value();
    ASSERT_OK(publishers_[which]->Register(owned));
    endpoints_[which] = publishers_[which]->endpoint();
  }
  void StartHalves() {
    std::vector<NamedTensor> all = model_.Tensors();
    StartPublisher(0, {all.begin(), all.begin() + 6});
    StartPublisher(1, {all.begin() + 6, all.end()});
  }
  void Publish(int which, int64_t step) {
    model_.Fill(step);
    auto r = publishers_[which]->Publish(step);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  void PublishBoth(int64_t step) {
    Publish(0, step);
    Publish(1, step);
  }
  std::unique_ptr<Subscriber> Connect(MatchPolicy policy = MatchPolicy::kStrict,
                                      const std::vector<NamedTensor>* views = nullptr) {
    SubscriberOptions o;
    o.endpoint = endpoints_[0];
    o.endpoints = {endpoints_[1]};
    o.mode = GetParam().mode;
    o.policy = policy;
    o.verify = true;
    o.timeout = std::chrono::milliseconds(3000);
    return testing::NewSubscriber(o, views ? *views : dst_);
  }
  bool Holds(int64_t step, std::string* why) { return SyntheticModel::Holds(dst_, step, why); }

  SyntheticModel model_{12, 3000};
  std::vector<NamedTensor> tensors_ = model_.Tensors();
  std::vector<std::vector<uint8_t>> storage_ = SyntheticModel::PoisonedStorage(tensors_);
  std::vector<NamedTensor> dst_ = SyntheticModel::Views(tensors_, storage_);
  std::unique_ptr<Publisher> publishers_[2];
  std::string endpoints_[2];
};

TEST_P(MultiPublisher, HalvesFromTwoPublishersArriveBitExactWithOneHandlePrepared) {
  StartHalves();
  auto sub = Connect();
  for (int64_t step = 1; step <= 50; ++step) {
    PublishBoth(step);
    auto r = sub->Update();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step, step);
    EXPECT_EQ(r->tensors, 12u);
    EXPECT_EQ(r->bytes, model_.total_bytes());
    EXPECT_TRUE(r->verified);
    EXPECT_EQ(r->prepare_count, 1u);
    EXPECT_EQ(r->handle_created, step == 1);
    std::string why;
    ASSERT_TRUE(Holds(step, &why)) << why;
  }
}

TEST_P(MultiPublisher, SteadyStateStepsAllocateNothingInTheSubscriber) {
  StartHalves();
  auto sub = Connect();
  PublishBoth(1);
  ASSERT_OK(sub->Update());
  int64_t worst = 0;
  for (int64_t step = 2; step <= 20; ++step) {
    PublishBoth(step);  // the publishers allocate nothing per step either, but are not measured
    const int64_t before = g_new_calls.load();
    auto r = sub->Update();
    const int64_t after = g_new_calls.load();
    ASSERT_TRUE(r.ok()) << r.status();
    worst = std::max(worst, after - before);
  }
  EXPECT_EQ(worst, 0) << "operator new calls in one steady-state update (both sources)";
}

TEST_P(MultiPublisher, ReplicasOnBothPublishersAreSplitBetweenThem) {
  testing::LogCapture log;
  StartPublisher(0, model_.Tensors());
  StartPublisher(1, model_.Tensors());
  auto sub = Connect();
  PublishBoth(1);
  auto r = sub->Update();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tensors, 12u);
  std::string why;
  EXPECT_TRUE(Holds(1, &why)) << why;
  // Both publishers deliver a share: neither line says "0 tensors".
  bool found = false;
  for (const std::string& line : log.Lines()) {
    if (line.find("schedule over 2 publishers") == std::string::npos) continue;
    found = true;
    EXPECT_EQ(line.find(" 0 tensors"), std::string::npos) << line;
  }
  EXPECT_TRUE(found) << "no schedule line logged";
}

TEST_P(MultiPublisher, ALaggingPublisherIsWaitedForWithinTheDeadline) {
  StartHalves();
  auto sub = Connect();
  PublishBoth(1);
  ASSERT_OK(sub->Update());
  Publish(0, 2);  // publisher 1 is still computing step 2
  auto late = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    Publish(1, 2);
  });
  auto r = sub->Update();
  late.get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 2);
  EXPECT_GE(r->wait_seconds, 0.2);
  std::string why;
  EXPECT_TRUE(Holds(2, &why)) << why;
}

TEST_P(MultiPublisher, PublishersOutOfStepIsAClearErrorAndNothingIsWritten) {
  StartHalves();
  auto sub = Connect();
  Publish(0, 1);
  for (int64_t step = 1; step <= 3; ++step) Publish(1, step);  // holds 2 and 3 only
  const std::vector<uint64_t> before = testing::Digests(dst_);
  auto r = sub->Update();
  ASSERT_STATUS_IS(kNotFound, r, "publishers out of step", endpoints_[1]);
  EXPECT_EQ(sub->committed_step(), -1);
  EXPECT_EQ(testing::Digests(dst_), before) << "destinations changed by a failed update";
  EXPECT_TRUE(sub->weights_valid()) << "nothing was copied, so nothing is invalid";
}

TEST_P(MultiPublisher, APublisherGoneFailsTheUpdateKeepsTheOldStepAndARestartRecovers) {
  StartHalves();
  auto sub = Connect();
  PublishBoth(1);
  ASSERT_OK(sub->Update());
  const std::vector<uint64_t> step1 = testing::Digests(dst_);
  const std::string endpoint1 = endpoints_[1];
  ASSERT_OK(publishers_[1]->Close());
  publishers_[1].reset();
  Publish(0, 2);
  auto r = sub->Update();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(endpoint1), std::string::npos) << r.status();
  EXPECT_EQ(sub->committed_step(), 1);
  EXPECT_EQ(testing::Digests(dst_), step1) << "step 1 must survive a failed update";

  // The rank comes back (same endpoint for shm; tcp gets a new port, so a new subscriber).
  std::vector<NamedTensor> all = model_.Tensors();
  if (GetParam().tcp) {
    StartPublisher(1, {all.begin() + 6, all.end()});
    sub = Connect();
  } else {
    StartPublisher(1, {all.begin() + 6, all.end()}, endpoint1);
  }
  PublishBoth(3);
  auto ok = sub->Update();
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->step, 3);
  EXPECT_TRUE(ok->handle_created);
  std::string why;
  EXPECT_TRUE(Holds(3, &why)) << why;
}

TEST_P(MultiPublisher, ATensorNoPublisherHoldsIsListedAtPrepare) {
  StartHalves();
  std::vector<uint8_t> extra(16, 0xFF);
  std::vector<NamedTensor> views = dst_;
  views.push_back({"orphan", TensorView{extra.data(), DType::kUInt8, {16}}});
  auto sub = Connect(MatchPolicy::kStrict, &views);
  PublishBoth(1);
  auto r = sub->Update();
  ASSERT_STATUS_IS(kInvalidArgument, r, "'orphan': registered by subscriber but published by none");
}

TEST_P(MultiPublisher, SleepReleasesBothHandlesAndTheLedgerReturnsToBaseline) {
  StartHalves();
  PublishBoth(1);  // the publishers' arenas and slots exist from here on
  const LedgerSnapshot baseline = ReadLedger();
  auto sub = Connect();
  for (int cycle = 1; cycle <= 5; ++cycle) {
    if (cycle > 1) PublishBoth(cycle);
    auto r = sub->Update();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->handle_created);
    EXPECT_EQ(ReadLedger().handles, baseline.handles + 2);
    ASSERT_OK(sub->Sleep());
    LedgerSnapshot last;
    EXPECT_TRUE(testing::LedgerSettlesTo(baseline, &last)) << "cycle " << cycle;
  }
}

TEST_P(MultiPublisher, CancelWhileWaitingForALaggingPublisherReturnsPromptly) {
  StartHalves();
  auto sub = Connect();
  PublishBoth(1);
  ASSERT_OK(sub->Update());
  Publish(0, 2);  // publisher 1 never publishes step 2
  auto canceller = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return std::chrono::steady_clock::now();
  });
  auto waiter = std::async(std::launch::async, [&] { return sub->Update(); });
  const auto cancelled_at = canceller.get();
  ASSERT_OK(sub->Cancel());
  auto r = waiter.get();
  const double late =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - cancelled_at).count();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled) << r.status();
  EXPECT_LT(late, 1.0) << "cancel took " << late << " s (the deadline is 3 s)";
  EXPECT_EQ(sub->committed_step(), 1);
  std::string why;
  EXPECT_TRUE(Holds(1, &why)) << why;
}

// One publisher on shared memory, one on TCP: a subscriber may mix transports.
TEST(MultiPublisherMixed, ShmAndTcpSourcesFeedOneSubscriber) {
  SyntheticModel model(8, 2000);
  std::vector<NamedTensor> all = model.Tensors();
  std::unique_ptr<Publisher> pubs[2];
  const std::string asked[2] = {testing::UniqueEndpoint("mixed"), "tcp://127.0.0.1:0"};
  for (int i = 0; i < 2; ++i) {
    PublisherOptions o;
    o.endpoint = asked[i];
    auto p = Publisher::Create(o);
    ASSERT_TRUE(p.ok()) << p.status();
    pubs[i] = std::move(p).value();
    ASSERT_OK(pubs[i]->Register({all.begin() + 4 * i, all.begin() + 4 * i + 4}));
  }
  auto storage = SyntheticModel::PoisonedStorage(all);
  auto dst = SyntheticModel::Views(all, storage);
  SubscriberOptions o;
  o.endpoints = {pubs[0]->endpoint(), pubs[1]->endpoint()};
  o.verify = true;
  auto sub = Subscriber::Create(o);
  ASSERT_TRUE(sub.ok()) << sub.status();
  ASSERT_OK((*sub)->Register(dst));
  for (int64_t step = 1; step <= 3; ++step) {
    model.Fill(step);
    for (auto& p : pubs) ASSERT_OK(p->Publish(step));
    auto r = (*sub)->Update();
    ASSERT_TRUE(r.ok()) << r.status();
    std::string why;
    ASSERT_TRUE(SyntheticModel::Holds(dst, step, &why)) << why;
  }
}

TEST_P(MultiPublisher, PublishedManifestIsTheUnionAndLeavesNothingOpen) {
  StartHalves();
  PublishBoth(1);
  const LedgerSnapshot baseline = ReadLedger();
  SubscriberOptions o;
  o.endpoint = endpoints_[0];
  o.endpoints = {endpoints_[1]};
  auto sub = Subscriber::Create(o);
  ASSERT_TRUE(sub.ok()) << sub.status();
  auto m = (*sub)->PublishedManifest();  // before Register: an engine allocating its buffers
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->size(), tensors_.size());
  for (const NamedTensor& t : tensors_) {
    const int64_t i = m->Find(t.name);
    ASSERT_GE(i, 0) << t.name;
    EXPECT_EQ(m->tensors()[i].dtype, t.view.dtype) << t.name;
    EXPECT_EQ(m->tensors()[i].shape, t.view.shape) << t.name;
  }
  LedgerSnapshot last;
  EXPECT_TRUE(testing::LedgerSettlesTo(baseline, &last)) << last.ToString();
  // Mirror it, then update into what was allocated from it.
  ASSERT_OK((*sub)->Register(dst_));
  auto r = (*sub)->Update();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tensors, m->size());
}

TEST(PublishedManifest, PublishersThatDisagreeAreNamedAndNoPublisherIsAnError) {
  std::vector<float> a(4), b(8);
  std::unique_ptr<Publisher> pubs[2];
  std::string eps[2];
  for (int i = 0; i < 2; ++i) {
    PublisherOptions o;
    o.endpoint = testing::UniqueEndpoint("disagree");
    auto p = Publisher::Create(o);
    ASSERT_TRUE(p.ok()) << p.status();
    pubs[i] = std::move(p).value();
    eps[i] = pubs[i]->endpoint();
    std::vector<float>& w = i == 0 ? a : b;
    ASSERT_OK(
        pubs[i]->Register({{"w", {w.data(), DType::kFloat32, {static_cast<int64_t>(w.size())}}}}));
    ASSERT_OK(pubs[i]->Publish(1));
  }
  SubscriberOptions o;
  o.endpoints = {eps[0], eps[1]};
  o.timeout = std::chrono::milliseconds(2000);
  auto sub = Subscriber::Create(o);
  ASSERT_TRUE(sub.ok());
  auto m = (*sub)->PublishedManifest();
  ASSERT_STATUS_IS(
      kInvalidArgument, m,
      "tensor 'w': " + eps[0] + " publishes float32 [4], " + eps[1] + " publishes float32 [8]");

  SubscriberOptions none;
  none.endpoint = testing::UniqueEndpoint("nobody");
  none.timeout = std::chrono::milliseconds(300);
  auto lonely = Subscriber::Create(none);
  ASSERT_TRUE(lonely.ok());
  auto nothing = (*lonely)->PublishedManifest();
  ASSERT_FALSE(nothing.ok());
  EXPECT_NE(nothing.status().message().find(none.endpoint), std::string::npos) << nothing.status();
}

TEST(MultiPublisherOptions, AnEndpointListedTwiceIsRefused) {
  SubscriberOptions o;
  o.endpoint = "local://same";
  o.endpoints = {"local://other", "local://same"};
  auto s = Subscriber::Create(o);
  ASSERT_STATUS_IS(kInvalidArgument, s, "'local://same' is listed twice");
}

INSTANTIATE_TEST_SUITE_P(Transports, MultiPublisher, testing::AllTransportModes(),
                         testing::TransportModeName);

}  // namespace
}  // namespace weightsync
