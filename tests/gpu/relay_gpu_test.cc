// Relays of CUDA destinations (docs/relays.md, "Relays of CUDA destinations"; label gpu). A
// trainer process publishes CUDA tensors from its GPU store, digested on its GPU; a chain of four
// engine processes (ws_subscriber with WS_TEST_DEVICE) on the same GPU, each but the last a relay
// on local://, reads it hop by hop over cuda-ipc. Each relay copies the step it committed into a
// GPU store of its own (device to device, no hashing) and serves it with the trainer's digests,
// which every engine verifies.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "testing/test_util.h"
#include "testing/transport_modes.h"

namespace weightsync {
namespace {

using testing::ChildProcess;

constexpr int kTensors = 12;
constexpr int64_t kElements = 1 << 20;  // a model of tens of MiB
constexpr int kEngines = 4;
constexpr int kTimeoutMs = 5000;

bool Ok(const std::string& reply, int64_t step) {
  return reply.rfind("ok " + std::to_string(step) + " ", 0) == 0;
}

class CudaRelayChain : public ::testing::TestWithParam<UpdateMode> {
 protected:
  void SetUp() override {
    WS_SKIP_WITHOUT_GPU();
    trainer_ = cuda::testing::StartGpuPublisher(kTensors, kElements, {}, "gpurelay");
    std::string upstream = trainer_->endpoint();
    const std::string mode = GetParam() == UpdateMode::kStaged ? "staged" : "in_place";
    for (int i = 0; i < kEngines; ++i) {
      std::vector<std::string> env = {"WS_TEST_DEVICE=0", "WS_TEST_MODE=" + mode};
      std::string serve;
      if (i + 1 < kEngines) {
        serve = testing::UniqueEndpoint("gpurelay" + std::to_string(i));
        env.push_back("WS_TEST_SERVE=" + serve);
      }
      engines_.push_back(ChildProcess::Spawn(
          {testing::HelperPath("subscriber"), upstream, std::to_string(kTensors),
           std::to_string(kElements), std::to_string(kTimeoutMs)},
          env));
      ASSERT_EQ(engines_.back().ReadLine(60000), serve.empty() ? "ready" : "ready " + serve);
      upstream = serve;
    }
  }

  // Publishes `step` and updates the engines in chain order, each from the one before.
  void Step(int64_t step, int engines = kEngines) {
    ASSERT_NO_FATAL_FAILURE(trainer_->Publish(step));
    for (int i = 0; i < engines; ++i) {
      const std::string reply = engines_[i].Command("update " + std::to_string(step));
      ASSERT_TRUE(Ok(reply, step)) << "engine " << i << ": " << reply;
    }
  }
  void ExpectHold(int64_t step, int from = 0, int to = kEngines) {
    for (int i = from; i < to; ++i) {
      EXPECT_EQ(engines_[i].Command("holds " + std::to_string(step)), "yes") << "engine " << i;
    }
  }

  std::unique_ptr<testing::PublisherProcess> trainer_;
  std::vector<ChildProcess> engines_;
};

// Bit-exact at every hop over ten steps; the trainer serves one engine, each relay one child: the
// trainer's cost is one subscriber's whatever the chain's length.
TEST_P(CudaRelayChain, FourEnginesHoldEveryStepBitExactAndTheTrainerServesOne) {
  for (int64_t step = 1; step <= 10; ++step) {
    ASSERT_NO_FATAL_FAILURE(Step(step));
    ExpectHold(step);
  }
  EXPECT_EQ(trainer_->process().Command("members"), "1");
  for (int i = 0; i + 1 < kEngines; ++i) {
    EXPECT_EQ(engines_[i].Command("served"), "1") << "relay " << i;
  }
}

// A relay whose GPU copy of the step differs from what the trainer hashed: its child's verify
// refuses the step on its GPU and commits nothing; the next step, copied anew, goes through.
TEST_P(CudaRelayChain, ACorruptingRelayIsRefusedByItsChildsVerify) {
  ASSERT_NO_FATAL_FAILURE(Step(1));
  ASSERT_EQ(engines_[1].Command("arm relay.corrupt_served=flip*1"), "ok");
  ASSERT_NO_FATAL_FAILURE(trainer_->Publish(2));
  ASSERT_TRUE(Ok(engines_[0].Command("update 2"), 2));
  ASSERT_TRUE(Ok(engines_[1].Command("update 2"), 2));
  EXPECT_EQ(engines_[1].Command("hits relay.corrupt_served"), "1");
  const std::string refused = engines_[2].Command("update 2");
  EXPECT_EQ(refused.rfind("error corruption ", 0), 0u) << refused;
  if (GetParam() == UpdateMode::kStaged) {
    EXPECT_EQ(engines_[2].Command("holds 1"), "yes");  // the weights it had
  } else {
    EXPECT_EQ(engines_[2].Command("valid"), "no");  // marked invalid, never silently wrong
  }
  ASSERT_NO_FATAL_FAILURE(Step(3));
  ExpectHold(3);
}

// A relay that sleeps gives its GPU store back (the engine's point in sleeping): its child finds no
// publisher at the relay's endpoint, and once that failed update let go of its mapping of the
// store (CUDA frees memory when its last importer does) the store's two slots are free. After the
// relay's next update the chain serves and holds steps again.
TEST_P(CudaRelayChain, ASleepingRelayReturnsItsGpuStoreAndServesAgainAfterWaking) {
  ASSERT_NO_FATAL_FAILURE(Step(1));
  const int64_t model_bytes =
      static_cast<int64_t>(testing::SyntheticModel(kTensors, kElements).total_bytes());
  const int64_t before = cuda::testing::UsedBytes(0);
  ASSERT_EQ(engines_[0].Command("sleep"), "ok");
  ASSERT_NO_FATAL_FAILURE(trainer_->Publish(2));
  const std::string orphan = engines_[1].Command("update 2");
  EXPECT_EQ(orphan.rfind("error not_found ", 0), 0u) << orphan;
  EXPECT_GE(before - cuda::testing::UsedBytes(0), 2 * model_bytes);
  if (GetParam() == UpdateMode::kStaged) {
    EXPECT_EQ(engines_[1].Command("holds 1"), "yes");
  }
  ASSERT_NO_FATAL_FAILURE(Step(3));
  ExpectHold(3);
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaRelayChain, testing::BothUpdateModes(),
                         testing::UpdateModeName);

}  // namespace
}  // namespace weightsync
