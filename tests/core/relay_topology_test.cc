// Relay topology (PublisherOptions::max_direct, SubscriberOptions::serve_max_direct,
// docs/relays.md): a publisher past its bound redirects newcomers to a relay, each relay bounds
// its own children the same way, so replicas that all dial the trainer's endpoint arrange
// themselves into a tree of bounded fan-out. In one process over real tcp loopback and real shared
// memory; a fake publisher (a Unix socket that answers every Hello with a redirect) plays the
// hostile cases.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/relay_serve.h"
#include "testing/sparse_trainer.h"
#include "testing/test_util.h"
#include "transport/link/channel.h"
#include "transport/link/endpoint.h"
#include "util/fail_point.h"
#include "wire/frame.h"
#include "wire/messages.h"

namespace weightsync {
namespace {

using testing::SparseTrainer;
using util::FailAction;
using util::FailPoints;
using Bytes = std::vector<std::vector<uint8_t>>;

// One replica: its weights and its subscriber.
struct Replica {
  Bytes weights;
  std::unique_ptr<Subscriber> sub;
};

// (tcp: every hop over loopback tcp; else shared memory on this host)
class RelayTopology : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { FailPoints::DisarmAll(); }
  void TearDown() override { FailPoints::DisarmAll(); }

  bool tcp() const { return GetParam(); }
  std::string NewEndpoint(const std::string& stem) {
    return tcp() ? std::string("tcp://127.0.0.1:0") : testing::UniqueEndpoint(stem);
  }
  void StartPublisher(int max_direct) {
    PublisherOptions o;
    o.endpoint = NewEndpoint("trainer");
    o.lineage = "topology-test";
    o.segment_bytes = 4096;
    o.timeout = std::chrono::milliseconds(5000);
    o.max_direct = max_direct;
    ASSERT_OK_AND_ASSIGN(publisher_, Publisher::Create(o));
    ASSERT_OK(publisher_->Register(trainer_.Tensors()));
  }
  void Publish(int64_t step, double fraction) {
    if (step > 1) trainer_.Step(fraction);
    auto r = publisher_->Publish(step);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  // A replica that dials the trainer's endpoint (or `dial`); `serve`: it relays, with at most
  // `fan_out` children of its own; `announce`: SubscriberOptions::serve_announce; `locality`: its
  // label.
  Replica& AddReplica(bool serve, int fan_out = 0, const std::string& announce = "",
                      const std::string& locality = "", const std::string& dial = "") {
    replicas_.push_back(std::make_unique<Replica>());
    Replica& r = *replicas_.back();
    r.weights = trainer_.Poisoned();
    SubscriberOptions o;
    o.endpoint = dial.empty() ? publisher_->endpoint() : dial;
    o.verify = true;
    o.timeout = std::chrono::milliseconds(5000);
    o.locality = locality;
    if (serve) {
      o.serve_endpoint = NewEndpoint("relay");
      o.serve_max_direct = fan_out;
      o.serve_announce = announce;
    }
    r.sub = testing::NewSubscriber(o, trainer_.Views(r.weights));
    return r;
  }
  // Updates every replica in the order they came (parents before their children) to `step`.
  void UpdateAll(int64_t step) {
    for (size_t i = 0; i < replicas_.size(); ++i) {
      SCOPED_TRACE("replica " + std::to_string(i));
      auto stats = replicas_[i]->sub->Update();
      ASSERT_TRUE(stats.ok()) << stats.status();
      ASSERT_EQ(stats->step, step);
      ASSERT_TRUE(stats->verified);
      ASSERT_TRUE(trainer_.HeldBy(replicas_[i]->weights));
    }
  }
  // Which replica serves on `endpoint`; -1 for none.
  int ServedBy(const std::string& endpoint) const {
    for (size_t i = 0; i < replicas_.size(); ++i) {
      if (replicas_[i]->sub->serve_endpoint() == endpoint) return static_cast<int>(i);
    }
    return -1;
  }

  SparseTrainer trainer_;
  std::unique_ptr<Publisher> publisher_;
  std::vector<std::unique_ptr<Replica>> replicas_;
};

// Seven relaying replicas dial the trainer, which serves two directly; each relay serves two.
// They arrange themselves into a tree of depth 3 in which nobody has more than two children,
// every replica holds the trainer's bytes after every step, and each level's membership says how
// many it serves below.
TEST_P(RelayTopology, NewcomersPastTheBoundFormATreeOfBoundedFanOut) {
  ASSERT_NO_FATAL_FAILURE(StartPublisher(/*max_direct=*/2));
  ASSERT_NO_FATAL_FAILURE(Publish(1, 0));
  for (int i = 0; i < 7; ++i) {
    SCOPED_TRACE("joining replica " + std::to_string(i));
    Replica& r = AddReplica(/*serve=*/true, /*fan_out=*/2);
    auto stats = r.sub->Update();  // its place in the tree is decided at its first Hello
    ASSERT_TRUE(stats.ok()) << stats.status();
    ASSERT_TRUE(trainer_.HeldBy(r.weights));
  }
  for (int64_t step = 2; step <= 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    ASSERT_NO_FATAL_FAILURE(Publish(step, 0.02));
    ASSERT_NO_FATAL_FAILURE(UpdateAll(step));
  }
  // Every replica said it committed step 4 (each relay's session reads its children's reports
  // on its own thread, and pushes them up): the trainer's tree lists all seven.
  std::vector<MemberInfo> tree;
  EXPECT_TRUE(testing::Eventually([&] {
    tree = publisher_->Tree();
    return tree.size() == 7 && std::all_of(tree.begin(), tree.end(),
                                           [](const MemberInfo& m) { return m.held_step == 4; });
  }));
  // The fan-out bound holds at every node, and every replica has exactly one parent.
  const std::vector<MemberInfo> direct = publisher_->Members();
  ASSERT_EQ(direct.size(), 2u);
  std::vector<int> parent(replicas_.size(), -2);
  for (const MemberInfo& m : direct) {
    const int child = ServedBy(m.serves);
    ASSERT_GE(child, 0) << m.serves;
    parent[child] = -1;
  }
  for (size_t i = 0; i < replicas_.size(); ++i) {
    const std::vector<MemberInfo> children = replicas_[i]->sub->ServedMembers();
    EXPECT_LE(children.size(), 2u) << "replica " << i;
    for (const MemberInfo& m : children) {
      const int child = ServedBy(m.serves);
      ASSERT_GE(child, 0) << m.serves;
      EXPECT_EQ(parent[child], -2) << "replica " << child << " has two parents";
      parent[child] = static_cast<int>(i);
      EXPECT_EQ(m.held_step, 4);  // as it said when it committed step 4
      EXPECT_EQ(m.sent_step, 4);
    }
  }
  int deepest = 0;
  for (size_t i = 0; i < replicas_.size(); ++i) {
    ASSERT_NE(parent[i], -2) << "replica " << i << " is nobody's child";
    int depth = 1;
    for (int p = parent[i]; p >= 0; p = parent[p]) ++depth;
    deepest = std::max(deepest, depth);
  }
  EXPECT_EQ(deepest, 3);
  // The trainer's tree says the same: each replica once, at its depth, under its parent.
  ASSERT_EQ(tree.size(), 7u);
  std::vector<int> listed(replicas_.size(), 0);
  for (const MemberInfo& m : tree) {
    const int i = ServedBy(m.serves);
    ASSERT_GE(i, 0) << m.serves;
    ++listed[i];
    EXPECT_EQ(m.via.empty() ? -1 : ServedBy(m.via), parent[i]) << "replica " << i;
    int depth = 1;
    for (int p = parent[i]; p >= 0; p = parent[p]) ++depth;
    EXPECT_EQ(m.depth, depth) << "replica " << i;
  }
  EXPECT_EQ(listed, std::vector<int>(replicas_.size(), 1));
  // Newcomers were spread over both direct relays, not piled onto the first.
  EXPECT_EQ(replicas_[0]->sub->ServedMembers().size(), 2u);
  EXPECT_EQ(replicas_[1]->sub->ServedMembers().size(), 2u);
  // Each direct relay says how many it serves: the other five between them.
  EXPECT_EQ(direct[0].below + direct[1].below, 5);
  EXPECT_GE(direct[0].below, 2);
  EXPECT_GE(direct[1].below, 2);
}

// The trainer places a newcomer on the shallowest relay with room anywhere in the tree, as the
// relays' reports list it: here relay B (one child, room for another), not relay A, which serves
// fewer below it but is full and has no relay to send it on to (it would serve a third child past
// its bound).
TEST_P(RelayTopology, ANewcomerGoesToTheShallowestRelayWithRoom) {
  ASSERT_NO_FATAL_FAILURE(StartPublisher(/*max_direct=*/2));
  ASSERT_NO_FATAL_FAILURE(Publish(1, 0));
  Replica& a = AddReplica(/*serve=*/true, /*fan_out=*/2);
  ASSERT_OK(a.sub->Update().status());
  Replica& b = AddReplica(/*serve=*/true, /*fan_out=*/2);
  ASSERT_OK(b.sub->Update().status());
  const std::string a_at = a.sub->serve_endpoint(), b_at = b.sub->serve_endpoint();
  for (int i = 0; i < 2; ++i) ASSERT_OK(AddReplica(false, 0, "", "", a_at).sub->Update().status());
  Replica& c = AddReplica(/*serve=*/true, /*fan_out=*/0, "", "", b_at);  // unbounded, depth 2
  ASSERT_OK(c.sub->Update().status());
  const std::string c_at = c.sub->serve_endpoint();
  for (int i = 0; i < 3; ++i) ASSERT_OK(AddReplica(false, 0, "", "", c_at).sub->Update().status());
  // A: 2 leaves (full); B: C, which serves 3 leaves. The trainer knows it once reports arrive.
  ASSERT_TRUE(testing::Eventually([&] { return publisher_->Tree().size() == 8; }))
      << publisher_->Tree().size();
  Replica& newcomer = AddReplica(/*serve=*/false);
  ASSERT_OK(newcomer.sub->Update().status());
  ASSERT_TRUE(trainer_.HeldBy(newcomer.weights));
  EXPECT_EQ(a.sub->ServedMembers().size(), 2u);
  EXPECT_EQ(b.sub->ServedMembers().size(), 2u);  // C and the newcomer
  EXPECT_EQ(c.sub->ServedMembers().size(), 3u);
  std::vector<MemberInfo> tree;
  EXPECT_TRUE(testing::Eventually([&] {
    tree = publisher_->Tree();
    return tree.size() == 9;
  }));
  int under_b = 0;
  for (const MemberInfo& m : tree) under_b += m.via == b_at && m.depth == 2;
  EXPECT_EQ(under_b, 2);
}

// With every direct relay full, the newcomer still goes to the shallowest relay with room, not
// down the branch that serves the fewest: A -> A1 -> A2 (room at depth 3) serves 2 below A, and
// B -> B1 (room for one at depth 2) -> two leaves serves 3 below B; the newcomer joins B1, at
// depth 3, not A2's children at depth 4. The next one, before B1 said it is full, goes to A2.
TEST_P(RelayTopology, ANewcomerGoesToTheShallowestRoomNotDownTheLightestBranch) {
  ASSERT_NO_FATAL_FAILURE(StartPublisher(/*max_direct=*/2));
  ASSERT_NO_FATAL_FAILURE(Publish(1, 0));
  auto join = [&](int fan_out, const std::string& dial) -> Replica& {
    Replica& r = AddReplica(/*serve=*/fan_out >= 0, std::max(fan_out, 0), "", "", dial);
    EXPECT_OK(r.sub->Update().status());
    return r;
  };
  Replica& a = join(1, "");
  Replica& b = join(1, "");
  Replica& a1 = join(1, a.sub->serve_endpoint());
  Replica& a2 = join(2, a1.sub->serve_endpoint());
  Replica& b1 = join(3, b.sub->serve_endpoint());
  for (int i = 0; i < 2; ++i) join(-1, b1.sub->serve_endpoint());  // leaves
  ASSERT_FALSE(HasFailure());
  // Every join and commit reported all the way up: nothing is on its way to the trainer now.
  ASSERT_TRUE(testing::Eventually([&] {
    const std::vector<MemberInfo> tree = publisher_->Tree();
    return tree.size() == 7 && std::all_of(tree.begin(), tree.end(),
                                           [](const MemberInfo& m) { return m.held_step == 1; });
  })) << publisher_->Tree().size();
  // B1's report of the newcomer is held back (its reporter sleeps): a second newcomer right
  // after is placed by what the trainer sent where since, so it goes to A2, not to a full B1.
  FailPoints::Arm("subscriber.report_between", FailAction::kSleep, 2000, /*count=*/1);
  Replica& newcomer = join(-1, "");
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(trainer_.HeldBy(newcomer.weights));
  EXPECT_EQ(b1.sub->ServedMembers().size(), 3u);
  EXPECT_TRUE(a2.sub->ServedMembers().empty());
  Replica& second = join(-1, "");
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(trainer_.HeldBy(second.weights));
  EXPECT_EQ(b1.sub->ServedMembers().size(), 3u);  // never past its bound
  EXPECT_EQ(a2.sub->ServedMembers().size(), 1u);
  std::vector<MemberInfo> tree;
  EXPECT_TRUE(testing::Eventually([&] {
    tree = publisher_->Tree();
    return tree.size() == 9;
  }));
  int deepest = 0;
  for (const MemberInfo& m : tree) deepest = std::max(deepest, m.depth);
  EXPECT_EQ(deepest, 4);  // the second one, under A2
}

// A newcomer goes to a relay of its own locality (host, rack) first, whatever the others serve;
// with none of its locality, to the one with the fewest below it.
TEST_P(RelayTopology, NewcomersGoToARelayOfTheirOwnLocalityFirst) {
  ASSERT_NO_FATAL_FAILURE(StartPublisher(/*max_direct=*/2));
  ASSERT_NO_FATAL_FAILURE(Publish(1, 0));
  Replica& a = AddReplica(/*serve=*/true, 0, "", "rack-a");
  Replica& b = AddReplica(/*serve=*/true, 0, "", "rack-b");
  ASSERT_NO_FATAL_FAILURE(UpdateAll(1));
  // Three of rack b: by load alone they would alternate between the relays.
  for (int i = 0; i < 3; ++i) {
    Replica& leaf = AddReplica(/*serve=*/false, 0, "", "rack-b");
    ASSERT_OK(leaf.sub->Update().status());
    EXPECT_TRUE(trainer_.HeldBy(leaf.weights));
  }
  EXPECT_TRUE(a.sub->ServedMembers().empty());
  const std::vector<MemberInfo> served = b.sub->ServedMembers();
  ASSERT_EQ(served.size(), 3u);
  for (const MemberInfo& m : served) EXPECT_EQ(m.locality, "rack-b");
  // One of rack c, where no relay runs: the less busy relay.
  ASSERT_OK(AddReplica(/*serve=*/false, 0, "", "rack-c").sub->Update().status());
  EXPECT_EQ(a.sub->ServedMembers().size(), 1u);
  const std::vector<MemberInfo> direct = publisher_->Members();
  ASSERT_EQ(direct.size(), 2u);
  EXPECT_EQ(direct[0].locality, "rack-a");
  EXPECT_EQ(direct[1].locality, "rack-b");
}

// Joining is never refused: past the bound with no relay to send it to, a newcomer is served by the
// publisher itself.
TEST_P(RelayTopology, WithNoRelayToSendItToANewcomerIsServedDirectly) {
  ASSERT_NO_FATAL_FAILURE(StartPublisher(/*max_direct=*/1));
  ASSERT_NO_FATAL_FAILURE(Publish(1, 0));
  AddReplica(/*serve=*/false);
  AddReplica(/*serve=*/false);
  ASSERT_NO_FATAL_FAILURE(UpdateAll(1));
  EXPECT_EQ(publisher_->Members().size(), 2u);
}

// A relay is never sent to the endpoint it announces itself by (a relay re-attaching, or two
// replicas configured with one address): it is served directly instead of by "itself".
TEST_P(RelayTopology, ARelayIsNeverRedirectedToTheEndpointItAnnounces) {
  ASSERT_NO_FATAL_FAILURE(StartPublisher(/*max_direct=*/1));
  ASSERT_NO_FATAL_FAILURE(Publish(1, 0));
  Replica& first = AddReplica(/*serve=*/true);
  ASSERT_NO_FATAL_FAILURE(UpdateAll(1));
  Replica& second = AddReplica(/*serve=*/true, /*fan_out=*/0, first.sub->serve_endpoint());
  auto stats = second.sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(trainer_.HeldBy(second.weights));
  EXPECT_EQ(publisher_->Members().size(), 2u);
  EXPECT_TRUE(first.sub->ServedMembers().empty());
}

// The child of a relay that went away dials the trainer's endpoint again at its next update and
// is served (directly: the publisher has room again), bit-exact, in that same update.
TEST_P(RelayTopology, AChildOfARelayThatWentAwayReattachesAndCatchesUp) {
  ASSERT_NO_FATAL_FAILURE(StartPublisher(/*max_direct=*/1));
  ASSERT_NO_FATAL_FAILURE(Publish(1, 0));
  Replica& relay = AddReplica(/*serve=*/true);
  Replica& leaf = AddReplica(/*serve=*/false);
  ASSERT_NO_FATAL_FAILURE(UpdateAll(1));
  ASSERT_EQ(relay.sub->ServedMembers().size(), 1u);  // the leaf went through the relay
  ASSERT_OK(relay.sub->Close());
  for (int i = 0; i < 300 && !publisher_->Members().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_NO_FATAL_FAILURE(Publish(2, 0.02));
  auto stats = leaf.sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->step, 2);
  EXPECT_TRUE(trainer_.HeldBy(leaf.weights));
  ASSERT_EQ(publisher_->Members().size(), 1u);
  EXPECT_TRUE(publisher_->Members()[0].serves.empty());  // the leaf, directly
}

// A replica that lost a step through a relay (here: the relay served corrupted bytes, refused by
// the replica's verify) asks not to be sent there again: its next update goes to the other relay,
// although the one it lost serves fewer.
TEST_P(RelayTopology, AReplicaIsNotSentBackToTheRelayItLostAStepThrough) {
  ASSERT_NO_FATAL_FAILURE(StartPublisher(/*max_direct=*/2));
  ASSERT_NO_FATAL_FAILURE(Publish(1, 0));
  Replica& good = AddReplica(/*serve=*/true);
  Replica& bad = AddReplica(/*serve=*/true);
  ASSERT_OK(good.sub->Update().status());
  // Only the second relay's hand-over of step 1 is corrupted.
  FailPoints::Arm("relay.corrupt_served", FailAction::kFlip, 0, /*count=*/1);
  ASSERT_OK(bad.sub->Update().status());
  ASSERT_EQ(FailPoints::Hits("relay.corrupt_served"), 1);
  // A first leaf goes to the first relay (a tie), so the second one serves fewer from here on.
  ASSERT_OK(AddReplica(/*serve=*/false).sub->Update().status());
  ASSERT_EQ(good.sub->ServedMembers().size(), 1u);
  Replica& leaf = AddReplica(/*serve=*/false);
  const std::vector<uint64_t> poisoned = testing::Digests(trainer_.Views(leaf.weights));
  ASSERT_STATUS_IS(kCorruption, leaf.sub->Update());
  EXPECT_EQ(testing::Digests(trainer_.Views(leaf.weights)), poisoned);  // staged: untouched
  // Both relays report what they serve now: the bad one nobody, the good one the first leaf.
  for (int i = 0; i < 300 && !bad.sub->ServedMembers().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(bad.sub->ServedMembers().empty());
  ASSERT_OK(bad.sub->Update().status());
  ASSERT_OK(good.sub->Update().status());
  auto stats = leaf.sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(trainer_.HeldBy(leaf.weights));
  EXPECT_TRUE(bad.sub->ServedMembers().empty());
  EXPECT_EQ(good.sub->ServedMembers().size(), 2u);
}

// Nor below it: every step of a relay under the one it lost goes through that one too. Here the
// relay it lost (`bad`, under `top`) has a child with room; the trainer sends it to `top`, which,
// told to avoid `bad` and all below it, serves it directly past its bound.
TEST_P(RelayTopology, AReplicaIsNotSentBelowTheRelayItLostAStepThrough) {
  ASSERT_NO_FATAL_FAILURE(StartPublisher(/*max_direct=*/1));
  ASSERT_NO_FATAL_FAILURE(Publish(1, 0));
  Replica& top = AddReplica(/*serve=*/true, /*fan_out=*/1);
  ASSERT_OK(top.sub->Update().status());
  Replica& bad = AddReplica(/*serve=*/true, /*fan_out=*/2, "", "", top.sub->serve_endpoint());
  FailPoints::Arm("relay.corrupt_served", FailAction::kFlip, 0, /*count=*/1);
  ASSERT_OK(bad.sub->Update().status());
  ASSERT_EQ(FailPoints::Hits("relay.corrupt_served"), 1);
  ASSERT_TRUE(testing::Eventually([&] { return publisher_->Tree().size() == 2; }));
  Replica& leaf = AddReplica(/*serve=*/false);  // sent to `bad`, the one with room
  ASSERT_STATUS_IS(kCorruption, leaf.sub->Update());
  // Step 2 goes through `bad` uncorrupted to a relay of its own, which has room.
  ASSERT_NO_FATAL_FAILURE(Publish(2, 0.02));
  ASSERT_OK(top.sub->Update().status());
  ASSERT_OK(bad.sub->Update().status());
  Replica& below = AddReplica(/*serve=*/true, /*fan_out=*/2, "", "", bad.sub->serve_endpoint());
  ASSERT_OK(below.sub->Update().status());
  ASSERT_TRUE(testing::Eventually([&] { return publisher_->Tree().size() == 3; }))
      << publisher_->Tree().size();
  auto stats = leaf.sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(trainer_.HeldBy(leaf.weights));
  EXPECT_TRUE(below.sub->ServedMembers().empty());
  EXPECT_EQ(bad.sub->ServedMembers().size(), 1u);  // `below` only
  EXPECT_EQ(top.sub->ServedMembers().size(), 2u);  // `bad`, and the leaf past its bound
}

// Newcomers that come faster than the relays report are spread by what the trainer sent where:
// with both relays' reports held back (their reporters asleep), two leaves go one to each relay,
// not both to the first.
TEST_P(RelayTopology, ABurstOfNewcomersIsSpreadBeforeTheRelaysReport) {
  ASSERT_NO_FATAL_FAILURE(StartPublisher(/*max_direct=*/2));
  ASSERT_NO_FATAL_FAILURE(Publish(1, 0));
  Replica& a = AddReplica(/*serve=*/true);  // no bound of its own
  ASSERT_OK(a.sub->Update().status());
  Replica& b = AddReplica(/*serve=*/true);
  ASSERT_OK(b.sub->Update().status());
  ASSERT_TRUE(testing::Eventually([&] {
    const std::vector<MemberInfo> tree = publisher_->Tree();
    return tree.size() == 2 && tree[0].held_step == 1 && tree[1].held_step == 1;
  }));
  FailPoints::Arm("subscriber.report_between", FailAction::kSleep, 2000, /*count=*/2);
  for (int i = 0; i < 2; ++i) ASSERT_OK(AddReplica(/*serve=*/false).sub->Update().status());
  EXPECT_EQ(a.sub->ServedMembers().size(), 1u);
  EXPECT_EQ(b.sub->ServedMembers().size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Links, RelayTopology, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "tcp" : "shm"; });

// A "publisher" on a Unix socket that answers every Hello with a redirect to `target` (itself by
// default) and records what each Hello said.
class RedirectingPublisher {
 public:
  explicit RedirectingPublisher(std::string target = "") {
    endpoint_ = testing::UniqueEndpoint("redirecting");
    auto parsed = transport::link::ParseEndpoint(endpoint_);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_OK(transport::link::EnsureSocketDir(*parsed));
    path_ = parsed->socket_path;
    target_ = target.empty() ? endpoint_ : target;
    listen_ = util::UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::bind(listen_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listen_.get(), 16), 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~RedirectingPublisher() {
    stop_ = true;
    thread_.join();
    ::unlink(path_.c_str());
  }
  const std::string& endpoint() const { return endpoint_; }
  std::vector<wire::Hello> hellos() {
    std::lock_guard<std::mutex> lock(mu_);
    return hellos_;
  }

 private:
  void Serve() {
    while (!stop_) {
      pollfd p{listen_.get(), POLLIN, 0};
      if (::poll(&p, 1, 20) != 1) continue;
      transport::link::Channel ch(
          util::UniqueFd(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC)), "subscriber");
      wire::Hello hello;
      if (!ch.ReceiveExpect(wire::FrameType::kHello, &hello, util::Deadline(kWait)).ok()) continue;
      {
        std::lock_guard<std::mutex> lock(mu_);
        hellos_.push_back(hello);
      }
      (void)ch.Send(wire::FrameType::kRedirect, wire::Redirect{target_}, util::Deadline(kWait));
    }
  }
  static constexpr std::chrono::milliseconds kWait{2000};
  std::string endpoint_, path_, target_;
  util::UniqueFd listen_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<wire::Hello> hellos_;
  std::thread thread_;
};

std::unique_ptr<Subscriber> LeafOf(const std::string& endpoint, SparseTrainer& trainer,
                                   Bytes& weights, int timeout_ms = 5000) {
  SubscriberOptions o;
  o.endpoint = endpoint;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  return testing::NewSubscriber(o, trainer.Views(weights));
}

// A publisher that redirects a subscriber to itself forever cannot hold it: after
// wire::kMaxRedirects hops in a row the update fails with an error that says so, well before its
// deadline, with nothing moved.
TEST(RelayRedirect, ARedirectLoopEndsInAClearErrorNotAtTheDeadline) {
  RedirectingPublisher loop;
  SparseTrainer trainer;
  Bytes weights = trainer.Poisoned();
  auto sub = LeafOf(loop.endpoint(), trainer, weights);
  const auto t0 = std::chrono::steady_clock::now();
  auto result = sub->Update();
  ASSERT_STATUS_IS(kProtocolError, result, "redirects in a row");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4));
  EXPECT_EQ(loop.hellos().size(), static_cast<size_t>(wire::kMaxRedirects + 1));
  EXPECT_EQ(weights, trainer.Poisoned());
}

// A redirect to something that is no endpoint is refused, naming it.
TEST(RelayRedirect, ARedirectToNoEndpointIsRefusedNamingIt) {
  RedirectingPublisher bogus("ftp://relay");
  SparseTrainer trainer;
  Bytes weights = trainer.Poisoned();
  auto sub = LeafOf(bogus.endpoint(), trainer, weights);
  ASSERT_STATUS_IS(kInvalidArgument, sub->Update(), "redirected to 'ftp://relay'");
}

// A relay it was sent to that is not there: back to the endpoint it dialed first, within the
// relay dial bound (not its deadline), saying which relay to avoid.
TEST(RelayRedirect, ARelayThatIsNotThereSendsItBackHomeAvoidingThatRelay) {
  const std::string gone = testing::UniqueEndpoint("gone-relay");
  RedirectingPublisher home(gone);
  SparseTrainer trainer;
  Bytes weights = trainer.Poisoned();
  // 3 s: one relay dial bound (2 s) and a second Hello fit; the update then fails.
  auto sub = LeafOf(home.endpoint(), trainer, weights, 3000);
  (void)sub->Update();  // redirected to `gone` every time: it fails in the end
  const std::vector<wire::Hello> hellos = home.hellos();
  ASSERT_GE(hellos.size(), 2u);
  EXPECT_EQ(hellos[0].avoid, "");
  EXPECT_EQ(hellos[1].avoid, gone);
  EXPECT_EQ(hellos[0].serves, "");  // a leaf
}

// What a relay announces: serve_announce, else the endpoint it bound unless that is a wildcard.
TEST(RelayAnnounce, TheBoundEndpointUnlessAWildcardOrAnAnnouncedOne) {
  SubscriberOptions o;
  EXPECT_EQ(*core::RelayServe::Announced(o, "tcp://10.0.0.7:5000"), "tcp://10.0.0.7:5000");
  EXPECT_EQ(*core::RelayServe::Announced(o, "local://relay-a"), "local://relay-a");
  EXPECT_EQ(*core::RelayServe::Announced(o, "tcp://0.0.0.0:5000"), "");
  EXPECT_EQ(*core::RelayServe::Announced(o, "tcp://[::]:5000"), "");
  o.serve_announce = "tcp://relay-7.cluster:5000";
  EXPECT_EQ(*core::RelayServe::Announced(o, "tcp://0.0.0.0:5000"), o.serve_announce);
  o.serve_announce = "relay-7";
  ASSERT_STATUS_IS(kInvalidArgument, core::RelayServe::Announced(o, "tcp://0.0.0.0:5000").status(),
                   "serve_announce");
  o.serve_announce = "local://" + std::string(wire::kMaxEndpointBytes, 'a');
  ASSERT_STATUS_IS(kInvalidArgument, core::RelayServe::Announced(o, "local://x").status(),
                   "serve_announce");
}

TEST(RelayAnnounce, TopologyOptionsAreCheckedAtCreate) {
  SubscriberOptions o;
  o.endpoint = "local://nobody";
  o.locality = std::string(wire::kMaxLocalityBytes + 1, 'l');
  ASSERT_STATUS_IS(kInvalidArgument, Subscriber::Create(o).status(), "locality is 65 bytes");
  o.locality = "rack 3";
  ASSERT_STATUS_IS(kInvalidArgument, Subscriber::Create(o).status(), "locality byte 4 is 32");
  o.locality = "rack-3";
  o.serve_max_direct = 2;  // without serve_endpoint
  ASSERT_STATUS_IS(kInvalidArgument, Subscriber::Create(o).status(), "need serve_endpoint");
  o.serve_endpoint = testing::UniqueEndpoint("relay");
  o.serve_max_direct = -1;
  ASSERT_STATUS_IS(kInvalidArgument, Subscriber::Create(o).status(), "serve_max_direct");
  PublisherOptions p;
  p.endpoint = testing::UniqueEndpoint("trainer");
  p.max_direct = -1;
  ASSERT_STATUS_IS(kInvalidArgument, Publisher::Create(p).status(), "max_direct");
}

}  // namespace
}  // namespace weightsync
