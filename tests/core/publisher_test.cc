// Publisher semantics that need no subscriber process: a first Publish that fails late in its
// setup and is retried builds its work once (each byte copied once per step, the arena sealed
// once).
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "testing/local_pair.h"
#include "util/fail_point.h"

namespace weightsync {
namespace {

using testing::LocalPair;
using testing::SyntheticModel;
using util::FailAction;
using util::FailPoints;

TEST(PublisherRetry, AFirstPublishThatFailedLateIsRetriedAndCopiesEachByteOnce) {
  FailPoints::DisarmAll();
  LocalPair p;
  p.Start();
  FailPoints::Arm("publisher.freeze", FailAction::kError, 0, 1);
  p.model.Fill(1);
  Result<PublishStats> first = p.publisher->Publish(1);
  ASSERT_EQ(FailPoints::Hits("publisher.freeze"), 1) << "fault never injected";
  ASSERT_STATUS_IS(kInternal, first);
  EXPECT_EQ(p.publisher->latest_step(), -1);

  // The retry seals the arena it sealed already and plans its copies afresh: each Publish runs
  // one copy+hash task per segment, not the failed attempt's tasks as well. The fail point every
  // task passes (it corrupts only when armed to flip) counts them.
  uint64_t segments = 0;
  for (const NamedTensor& t : p.tensors) segments += (*t.view.NumBytes() + 4095) / 4096;
  FailPoints::Arm("publisher.corrupt_after_digest", FailAction::kSleep, 0);
  for (int64_t step : {1, 2}) {
    p.model.Fill(step);
    const int64_t before = FailPoints::Hits("publisher.corrupt_after_digest");
    Result<PublishStats> stats = p.publisher->Publish(step);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->bytes_copied, p.model.total_bytes()) << "step " << step;
    EXPECT_EQ(FailPoints::Hits("publisher.corrupt_after_digest") - before,
              static_cast<int64_t>(segments))
        << "step " << step << ": copy+hash tasks run, one per segment";
  }
  FailPoints::Disarm("publisher.corrupt_after_digest");
  auto sub = p.Connect();
  Result<UpdateStats> got = sub->Update();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->step, 2);
  std::string why;
  EXPECT_TRUE(SyntheticModel::Holds(p.dst, 2, &why)) << why;
  FailPoints::DisarmAll();
}

TEST(PublisherAllocate, AFailedAllocateLeavesNothingBehind) {
  auto p = Publisher::Create({.endpoint = testing::UniqueEndpoint("alloc")});
  ASSERT_TRUE(p.ok()) << p.status();
  // More than the arena's address space: refused after the name was validated.
  Result<TensorView> huge = (*p)->Allocate("w", DType::kFloat32, {1ll << 40, 4});
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ((*p)->manifest().Find("w"), -1);
  Result<TensorView> w = (*p)->Allocate("w", DType::kFloat32, {4, 4});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*p)->manifest().size(), 1u);
  EXPECT_EQ((*p)->manifest().total_bytes(), 64u);
}

// Zero-copy publishes CUDA tensors where they are (to subscribers on this host by CUDA IPC, over
// tcp by NCCL): host tensors and Allocate are refused up front, saying what to do instead (the
// GPU round trips are tests/gpu/zero_copy_test.cc and the conformance suite's cuda-ipc-zero-copy
// and nccl-zero-copy rows).
TEST(PublisherZeroCopy, IsRefusedForHostTensorsAndForAllocateOverEitherLink) {
  PublisherOptions tcp;
  tcp.endpoint = "tcp://127.0.0.1:0";
  tcp.zero_copy = true;
  ASSERT_OK_AND_ASSIGN(auto over_tcp, Publisher::Create(tcp));
  std::vector<float> bias(4);
  EXPECT_STATUS_IS(kInvalidArgument,
                   over_tcp->Register({{"b", {bias.data(), DType::kFloat32, {4}}}}),
                   "tensor 'b' is on cpu", "zero_copy");
  PublisherOptions local;
  local.endpoint = testing::UniqueEndpoint("zerocopy");
  local.zero_copy = true;
  ASSERT_OK_AND_ASSIGN(auto p, Publisher::Create(local));
  std::vector<float> host(4);
  EXPECT_STATUS_IS(kInvalidArgument, p->Register({{"w", {host.data(), DType::kFloat32, {4}}}}),
                   "tensor 'w' is on cpu", "zero_copy");
  EXPECT_EQ(p->manifest().size(), 0u) << "a refused Register leaves nothing behind";
  EXPECT_STATUS_IS(kFailedPrecondition, p->Allocate("a", DType::kFloat32, {4}),
                   "Allocate() on a zero_copy publisher");
}

// The engine-side loop `for name in published_manifest(): allocate(name)` of a 100k-tensor MoE
// model, on both sides. Rebuilding the whole manifest per call made this quadratic (~25 min from
// Python); linear it takes about a second. The bound only tells O(n) from O(n^2).
TEST(PublisherAllocate, AHundredThousandAllocationsOneAtATimeAreLinear) {
  constexpr int kCount = 100000;
  auto p = Publisher::Create({.endpoint = testing::UniqueEndpoint("alloc")});
  ASSERT_TRUE(p.ok()) << p.status();
  auto sub = Subscriber::Create({.endpoint = (*p)->endpoint()});
  ASSERT_TRUE(sub.ok()) << sub.status();
  std::vector<float> engine(kCount);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCount; ++i) {
    const std::string name = "experts." + std::to_string(i);
    ASSERT_TRUE((*p)->Allocate(name, DType::kFloat32, {1}).ok()) << i;
    ASSERT_OK((*sub)->Register({{name, TensorView{&engine[i], DType::kFloat32, {1}}}}));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ((*p)->manifest().size(), static_cast<size_t>(kCount));
  EXPECT_LT(seconds, testing::kUnderSanitizer ? 120.0 : 30.0);
}

}  // namespace
}  // namespace weightsync
