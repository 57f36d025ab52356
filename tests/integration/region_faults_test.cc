// A sharded trainer losing a rank mid-step: two FSDP publisher processes feed a TP engine rank
// whose every destination takes bytes from both. One is killed while the subscriber copies; the
// update fails typed within its deadline, nothing is committed (staged: the old weights intact),
// and once the rank is back the next update rebuilds its handles and lands every byte.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <csignal>
#include <thread>

#include "testing/publisher_process.h"
#include "testing/regions.h"
#include "testing/test_util.h"
#include "testing/transport_modes.h"
#include "util/fail_point.h"

namespace weightsync {
namespace {

using util::FailAction;
using util::FailPoints;

// 71 MB in all: rank 1 sends the engine rank about 18 MB, more than loopback socket buffers hold,
// so over tcp the kill lands while bytes are still in flight.
constexpr int kScale = 160;

class RegionFaults : public ::testing::TestWithParam<testing::TransportMode> {
 protected:
  void SetUp() override {
    FailPoints::DisarmAll();
    for (int r = 0; r < 2; ++r) {
      ranks_.emplace_back("publisher", std::vector<std::string>{"fsdp", std::to_string(r), "2",
                                                                std::to_string(kScale)});
      ASSERT_NO_FATAL_FAILURE(ranks_[r].Start(GetParam().tcp ? std::string("tcp://127.0.0.1:0")
                                                             : testing::UniqueEndpoint("rfault")));
    }
  }
  void TearDown() override { FailPoints::DisarmAll(); }
  void PublishBoth(int64_t step) {
    for (auto& rank : ranks_) ASSERT_NO_FATAL_FAILURE(rank.Publish(step));
  }

  std::vector<testing::GlobalTensor> model_ = testing::LayerModel(kScale);
  std::vector<testing::PublisherProcess> ranks_;
};

TEST_P(RegionFaults, ATrainerRankKilledMidStepIsATypedErrorAndTheNextUpdateRecovers) {
  testing::EngineRank engine = testing::TensorParallelRank(model_, 1);
  SubscriberOptions o;
  o.endpoints = {ranks_[0].endpoint(), ranks_[1].endpoint()};
  o.mode = GetParam().mode;
  o.policy = MatchPolicy::kSubset;
  o.timeout = std::chrono::milliseconds(testing::kUnderSanitizer ? 10000 : 3000);
  auto sub = testing::NewSubscriber(o, engine.Views());
  PublishBoth(1);
  ASSERT_OK(sub->Update());
  std::string why;
  ASSERT_TRUE(engine.Holds(1, &why)) << why;

  PublishBoth(2);
  FailPoints::Arm("subscriber.before_copy", FailAction::kSleep, 300, 1);
  std::thread killer([&] {
    if (testing::WaitForFailPointHits("subscriber.before_copy")) {
      ranks_[1].process().Signal(SIGKILL);
    }
  });
  auto t0 = std::chrono::steady_clock::now();
  auto failed = sub->Update();
  auto elapsed = std::chrono::steady_clock::now() - t0;
  killer.join();
  ASSERT_EQ(FailPoints::Hits("subscriber.before_copy"), 1) << "the copy was never paused";
  const int status = ranks_[1].process().Wait();
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "rank 1 was not killed";
  ASSERT_STATUS_IS(kPeerLost, failed, ranks_[1].endpoint());
  EXPECT_LT(elapsed, o.timeout);
  EXPECT_EQ(sub->committed_step(), 1);
  if (GetParam().mode == UpdateMode::kStaged) {
    EXPECT_TRUE(sub->weights_valid());
    EXPECT_TRUE(engine.Holds(1, &why)) << why;
  } else {
    EXPECT_FALSE(sub->weights_valid());
  }

  ASSERT_NO_FATAL_FAILURE(ranks_[1].Start(ranks_[1].endpoint()));
  PublishBoth(3);
  ASSERT_OK_AND_ASSIGN(UpdateStats again, sub->Update());
  EXPECT_EQ(again.step, 3);
  EXPECT_TRUE(again.handle_created);
  EXPECT_EQ(again.bytes, engine.nbytes());
  EXPECT_TRUE(sub->weights_valid());
  EXPECT_TRUE(engine.Holds(3, &why)) << why;
}

INSTANTIATE_TEST_SUITE_P(Modes, RegionFaults, testing::AllTransportModes(),
                         testing::TransportModeName);

}  // namespace
}  // namespace weightsync
