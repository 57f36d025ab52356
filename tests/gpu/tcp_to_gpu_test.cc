// A host publisher over tcp into CUDA destinations (src/transport/path/tcp_to_gpu_path.*), with
// deltas (docs/deltas.md): the step crosses the socket into the pinned host mirror, deltas are
// applied there, and the mirror is copied to the GPU. What the conformance suite's tcp-to-gpu rows
// do not cover: 211 sparse steps landing bit for bit on the GPU as deltas, in both
// modes and verified, and the second verification hop (the copy to the GPU checked against the
// mirror) catching a bit flipped on the GPU, after which the next step comes whole.
#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"
#include "testing/sparse_trainer.h"
#include "util/fail_point.h"

namespace weightsync {
namespace {

using cuda::testing::Download;
using cuda::testing::PoisonedDestinations;
using testing::SparseTrainer;
using util::FailAction;
using util::FailPoints;

class TcpToGpu : public ::testing::TestWithParam<UpdateMode> {
 protected:
  void SetUp() override {
    WS_SKIP_WITHOUT_GPU();
    FailPoints::DisarmAll();
    ASSERT_OK(cuda::SetDevice(0));
    PublisherOptions o;
    o.endpoint = "tcp://127.0.0.1:0";
    o.segment_bytes = 4096;  // many segments even for a small model
    ASSERT_OK_AND_ASSIGN(publisher_, Publisher::Create(o));
    ASSERT_OK(publisher_->Register(trainer_.Tensors()));
    ASSERT_OK_AND_ASSIGN(dst_, PoisonedDestinations(trainer_.Tensors(), 0, &buffers_));
  }
  void TearDown() override { FailPoints::DisarmAll(); }

  void Publish(int64_t step, double fraction) {
    if (step > 1) trainer_.Step(fraction);
    ASSERT_OK(publisher_->Publish(step).status());
  }
  std::unique_ptr<Subscriber> Connect() {
    SubscriberOptions o;
    o.endpoint = publisher_->endpoint();
    o.mode = GetParam();
    o.verify = true;
    return testing::NewSubscriber(o, dst_);
  }
  // Whether the GPU destinations hold the trainer's tensors, byte for byte.
  bool GpuHoldsTrainer() {
    std::vector<std::vector<uint8_t>> held;
    for (const NamedTensor& t : dst_) {
      Result<uint64_t> bytes = t.view.NumBytes();
      EXPECT_OK(bytes);
      Result<std::vector<uint8_t>> h = Download<uint8_t>(t.view.data, *bytes);
      EXPECT_OK(h);
      held.push_back(h.ok() ? *h : std::vector<uint8_t>());
    }
    return trainer_.HeldBy(held);
  }

  SparseTrainer trainer_;
  std::unique_ptr<Publisher> publisher_;
  std::vector<cuda::DeviceBuffer> buffers_;
  std::vector<NamedTensor> dst_;
};

TEST_P(TcpToGpu, SparseStepsLandOnTheGpuAsDeltasBitForBit) {
  Publish(1, 0);
  auto sub = Connect();
  auto first = sub->Update();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->path, "tcp-to-gpu");
  EXPECT_EQ(first->delta_base_step, -1);
  ASSERT_TRUE(GpuHoldsTrainer());
  const double fractions[] = {0.01, 0, 0.02, 0.3, 1.0, 0.001, 0.05};
  int64_t step = 1;
  for (int round = 0; round < 30; ++round) {
    for (double fraction : fractions) {
      SCOPED_TRACE("step " + std::to_string(step + 1) + ", fraction " + std::to_string(fraction));
      Publish(++step, fraction);
      auto stats = sub->Update();
      ASSERT_TRUE(stats.ok()) << stats.status();
      ASSERT_EQ(stats->step, step);
      EXPECT_TRUE(stats->verified);
      EXPECT_EQ(stats->prepare_count, 1u);
      EXPECT_EQ(stats->delta_base_step, step - 1);
      ASSERT_TRUE(GpuHoldsTrainer());
      if (fraction <= 0.02) {
        EXPECT_GT(stats->delta_segments, 0u);
        EXPECT_LT(stats->received_bytes, stats->bytes / 4);
      }
      if (fraction >= 0.3) {
        EXPECT_EQ(stats->received_bytes, stats->bytes);
      }
    }
  }
}

// A bit flipped on the GPU after the copy (fail point tcp.flip_uploaded): the mirror is right, so
// only the second hop can see it. Nothing is committed (staged) or the weights are invalid (in
// place); the next step comes whole and lands exactly.
TEST_P(TcpToGpu, TheCopyToTheGpuIsCheckedAgainstTheMirror) {
  Publish(1, 0);
  auto sub = Connect();
  ASSERT_OK(sub->Update().status());
  Publish(2, 0.01);
  FailPoints::Arm("tcp.flip_uploaded", FailAction::kFlip, 0, /*count=*/1);
  auto bad = sub->Update();
  EXPECT_EQ(FailPoints::Hits("tcp.flip_uploaded"), 1);
  EXPECT_STATUS_IS(kCorruption, bad.status(), "step 2",
                   "checked against the host mirror it was copied from");
  if (GetParam() == UpdateMode::kStaged) {
    EXPECT_FALSE(GpuHoldsTrainer());  // still step 1
  }
  Publish(3, 0.01);
  auto next = sub->Update();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->step, 3);
  EXPECT_EQ(next->delta_base_step, -1);  // whole: the handle did not commit step 2
  EXPECT_TRUE(GpuHoldsTrainer());
}

// Sleep() frees the mirror: the handle prepared again holds no base, so its first step comes
// whole (deltas onto a fresh mirror would fail verification, or without it land wrong bytes).
TEST_P(TcpToGpu, AfterSleepTheFirstStepComesWhole) {
  Publish(1, 0);
  auto sub = Connect();
  ASSERT_OK(sub->Update().status());
  ASSERT_OK(sub->Sleep());
  Publish(2, 0.01);
  auto stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats->handle_created);
  EXPECT_EQ(stats->delta_base_step, -1);
  EXPECT_TRUE(GpuHoldsTrainer());
  Publish(3, 0.01);
  stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->delta_base_step, 2);
  EXPECT_TRUE(GpuHoldsTrainer());
}

// The mirror keeps converted tensors' published bytes whole, so they take deltas too: a bf16
// tensor quantized to fp8 (with its block scales) and one cast to float16 end every step exactly
// as on a subscriber that takes every step whole.
TEST_P(TcpToGpu, ConvertedTensorsTakeDeltasAndEndAsAWholeSubscribersDo) {
  Publish(1, 0);
  // Destinations as the trainer's, but layers.0.w in fp8 with its scales, layers.1.w in float16.
  auto converted = [&](std::vector<cuda::DeviceBuffer>* keep) {
    std::vector<NamedTensor> like = trainer_.Tensors();
    for (NamedTensor& t : like) {
      if (t.name == "layers.0.w") t.view.dtype = DType::kFloat8E4M3FN;
      if (t.name == "layers.1.w") t.view.dtype = DType::kFloat16;
    }
    like.push_back({"layers.0.w_scale_inv", TensorView{nullptr, DType::kFloat32, {1, 1}}});
    Result<std::vector<NamedTensor>> dst = PoisonedDestinations(like, 0, keep);
    EXPECT_OK(dst);
    return dst.ok() ? *dst : std::vector<NamedTensor>();
  };
  std::vector<cuda::DeviceBuffer> keep_delta, keep_whole;
  const std::vector<NamedTensor> dst_delta = converted(&keep_delta);
  const std::vector<NamedTensor> dst_whole = converted(&keep_whole);
  auto connect = [&](const std::vector<NamedTensor>& dst, bool delta) {
    SubscriberOptions o;
    o.endpoint = publisher_->endpoint();
    o.mode = GetParam();
    o.verify = true;
    o.convert_dtypes = true;
    o.delta = delta;
    return testing::NewSubscriber(o, dst);
  };
  auto with_deltas = connect(dst_delta, true);
  auto whole = connect(dst_whole, false);
  auto bytes_of = [](const std::vector<NamedTensor>& dst) {
    std::vector<std::vector<uint8_t>> held;
    for (const NamedTensor& t : dst) {
      Result<std::vector<uint8_t>> h = Download<uint8_t>(t.view.data, *t.view.NumBytes());
      EXPECT_OK(h);
      held.push_back(h.ok() ? *h : std::vector<uint8_t>());
    }
    return held;
  };
  const double fractions[] = {0.01, 0, 0.02, 0.3, 1.0, 0.001};
  for (int64_t step = 1; step <= 25; ++step) {
    const double fraction = fractions[step % 6];
    SCOPED_TRACE("step " + std::to_string(step) + ", fraction " + std::to_string(fraction));
    if (step > 1) Publish(step, fraction);
    auto a = with_deltas->Update();
    auto b = whole->Update();
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->delta_base_step, -1);
    if (step > 1) {
      EXPECT_EQ(a->delta_base_step, step - 1);
    }
    if (step > 1 && fraction > 0 && fraction <= 0.02) {
      EXPECT_GT(a->delta_segments, 0u);
      EXPECT_LT(a->received_bytes, a->bytes / 4);
    }
    ASSERT_EQ(bytes_of(dst_delta), bytes_of(dst_whole));
  }
  // Not vacuous: the fp8 tensor is not the poison any more.
  EXPECT_NE(bytes_of(dst_delta)[0], std::vector<uint8_t>(bytes_of(dst_delta)[0].size(), 0xFF));
}

INSTANTIATE_TEST_SUITE_P(Modes, TcpToGpu,
                         ::testing::Values(UpdateMode::kStaged, UpdateMode::kInPlace),
                         [](const ::testing::TestParamInfo<UpdateMode>& info) {
                           return std::string(info.param == UpdateMode::kStaged ? "Staged"
                                                                                : "InPlace");
                         });

}  // namespace
}  // namespace weightsync
