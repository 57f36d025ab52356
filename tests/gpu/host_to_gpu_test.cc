// A publisher of host tensors (shared-memory arena) and a subscriber whose destinations are CUDA
// tensors: the copy engines read the pinned arena (src/transport/path/host_to_gpu_path.*).
// What the conformance suite's host-to-gpu rows (tests/gpu/conformance_test.cc) do not cover:
// the caller's device left alone and the arena read from pinned memory, the first verification
// hop (the arena as read here) catching corruption, arena-allocated tensors, and sleep/wake
// cycles that unpin and re-pin. Each also through a ring of host buckets (host-to-gpu-ring):
// 16 KiB buckets cut the 4 KiB digest segments of the ~130 KB model anywhere, so the streamed
// hashes of both hops are fed a segment in pieces.
#include <gtest/gtest.h>

#include "cuda/vmm.h"
#include "gpu/gpu_test_util.h"
#include "testing/local_pair.h"
#include "util/fail_point.h"

namespace weightsync {
namespace {

using cuda::testing::DestinationsHold;
using cuda::testing::PoisonedDestinations;
using testing::LocalPair;

struct Row {
  UpdateMode mode;
  bool ring;  // a ring publisher of 2 x 16 KiB buckets
};

class HostToGpu : public ::testing::TestWithParam<Row> {
 protected:
  void SetUp() override {
    WS_SKIP_WITHOUT_GPU();
    util::FailPoints::DisarmAll();
    device_ = cuda::DeviceCount() > 1 ? 1 : 0;
    ASSERT_OK(cuda::SetDevice(device_));
    ASSERT_OK_AND_ASSIGN(dst_, PoisonedDestinations(pair_.tensors, device_, &buffers_));
    if (GetParam().ring) {
      pair_.ring_buckets = 2;
      pair_.ring_bucket_bytes = 16384;
    }
    pair_.Start();
  }
  UpdateMode mode() const { return GetParam().mode; }
  void TearDown() override { util::FailPoints::DisarmAll(); }

  std::string Holds(int64_t step) {
    std::string why;
    return DestinationsHold(dst_, pair_.tensors, step, &why) ? "" : why;
  }

  int device_ = 0;
  LocalPair pair_;
  std::vector<cuda::DeviceBuffer> buffers_;
  std::vector<NamedTensor> dst_;
};

TEST_P(HostToGpu, RoundTripIsBitExactStepAfterStep) {
  testing::LogCapture log;
  auto sub = pair_.ConnectWith(dst_, mode(), /*verify=*/true);
  const int callers_device = cuda::DeviceCount() > 1 ? 0 : device_;
  for (int64_t step = 1; step <= 5; ++step) {
    pair_.Publish(step);
    ASSERT_OK(cuda::SetDevice(callers_device));
    auto r = sub->Update();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*cuda::CurrentDevice(), callers_device);
    EXPECT_TRUE(r->verified);
    EXPECT_EQ(r->step, step);
    EXPECT_EQ(r->prepare_count, 1u);
    EXPECT_EQ(Holds(step), "") << "step " << step;
    EXPECT_EQ(r->path, GetParam().ring ? "host-to-gpu-ring" : "host-to-gpu");
  }
  const std::string line = GetParam().ring ? "a ring of 2 host buckets of 16384 bytes ("
                                           : "host arena into cuda:" + std::to_string(device_);
  EXPECT_TRUE(log.Contains(line)) << "no prepare line with: " << line;
  const std::string into = "into cuda:" + std::to_string(device_) + " from pinned memory";
  EXPECT_TRUE(log.Contains(into)) << "no prepare line with: " << into;
  // (The H200's driver pins read-only memory: the arena or ring is read from pinned memory.)
}

// The first hop: the arena's bytes as this process read them do not match the publisher's digests
// (a fail point flips one of the hashes taken during the copy). Nothing is committed. (The second
// hop, a bit flipped in what landed on the GPU, is the conformance suite's.)
TEST_P(HostToGpu, ArenaBytesNotMatchingThePublishersDigestsAreCaught) {
  auto sub = pair_.ConnectWith(dst_, mode(), /*verify=*/true);
  pair_.Publish(1);
  ASSERT_TRUE(sub->Update().ok());
  pair_.Publish(2);
  util::FailPoints::Arm("shm.arena_digest_flip", util::FailAction::kFlip, 0, 1);
  auto r = sub->Update();
  ASSERT_STATUS_IS(kCorruption, r);
  EXPECT_EQ(util::FailPoints::Hits("shm.arena_digest_flip"), 1);
  EXPECT_NE(r.status().message().find("as read from the publisher's arena"), std::string::npos)
      << r.status();
  EXPECT_EQ(sub->committed_step(), 1);
  if (mode() == UpdateMode::kStaged) {
    EXPECT_EQ(Holds(1), "");
  }
}

// Arena-allocated host tensors (Publisher::Allocate: no copy at publish) reach the GPU too; their
// bytes come from the arena's direct region, not a slot.
TEST_P(HostToGpu, ArenaAllocatedTensorsReachTheGpu) {
  if (GetParam().ring)
    GTEST_SKIP() << "a ring publisher refuses Allocate (tests/core/ring_test.cc)";
  PublisherOptions po;
  po.endpoint = testing::UniqueEndpoint("h2darena");
  auto pub = Publisher::Create(po);
  ASSERT_TRUE(pub.ok()) << pub.status();
  auto w = (*pub)->Allocate("w", DType::kFloat32, {256, 64});
  ASSERT_TRUE(w.ok()) << w.status();
  auto b = (*pub)->Allocate("b", DType::kBFloat16, {64});
  ASSERT_TRUE(b.ok()) << b.status();
  std::vector<cuda::DeviceBuffer> keep;
  std::vector<NamedTensor> like = {{"w", {nullptr, DType::kFloat32, {256, 64}}},
                                   {"b", {nullptr, DType::kBFloat16, {64}}}};
  auto dst = PoisonedDestinations(like, device_, &keep);
  ASSERT_TRUE(dst.ok()) << dst.status();
  SubscriberOptions so;
  so.endpoint = (*pub)->endpoint();
  so.mode = mode();
  so.verify = true;
  auto sub = Subscriber::Create(so);
  ASSERT_TRUE(sub.ok()) << sub.status();
  ASSERT_OK((*sub)->Register(*dst));
  for (int step = 1; step <= 3; ++step) {
    ASSERT_OK((*pub)->BeginWrite());
    auto* pw = static_cast<float*>(w->data);
    for (int i = 0; i < 256 * 64; ++i) pw[i] = step * 1000.0f + i;
    auto* pb = static_cast<uint16_t*>(b->data);
    for (int i = 0; i < 64; ++i) pb[i] = static_cast<uint16_t>(step * 100 + i);
    ASSERT_TRUE((*pub)->Publish(step).ok());
    auto r = (*sub)->Update();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->verified);
    auto got_w = cuda::testing::Download<float>((*dst)[0].view.data, 256 * 64);
    auto got_b = cuda::testing::Download<uint16_t>((*dst)[1].view.data, 64);
    ASSERT_TRUE(got_w.ok() && got_b.ok());
    for (int i = 0; i < 256 * 64; ++i) ASSERT_EQ((*got_w)[i], step * 1000.0f + i) << i;
    for (int i = 0; i < 64; ++i) ASSERT_EQ((*got_b)[i], step * 100 + i) << i;
  }
}

// Each Sleep unpins and unmaps (the ledger's mappings return to where they were); each wake-up
// prepares, pins and delivers again.
TEST_P(HostToGpu, SleepAndWakeCyclesReturnToBaseline) {
  auto sub = pair_.ConnectWith(dst_, mode(), /*verify=*/false);
  pair_.Publish(1);  // the publisher's arena and copy threads exist from here on
  const LedgerSnapshot before = ReadLedger();
  ASSERT_NO_FATAL_FAILURE(
      cuda::testing::SleepWakeCyclesPinAndReturnToBaseline(*sub, 20, before, [&](int64_t step) {
        if (step > 1) pair_.Publish(step);
      }));
  EXPECT_EQ(Holds(20), "");
}

INSTANTIATE_TEST_SUITE_P(
    Modes, HostToGpu,
    ::testing::Values(Row{UpdateMode::kStaged, false}, Row{UpdateMode::kInPlace, false},
                      Row{UpdateMode::kStaged, true}, Row{UpdateMode::kInPlace, true}),
    [](const auto& info) {
      return std::string(info.param.mode == UpdateMode::kStaged ? "staged" : "in_place") +
             (info.param.ring ? "_ring" : "");
    });

}  // namespace
}  // namespace weightsync
