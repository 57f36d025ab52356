// A steady step allocates nothing on the GPU paths (label gpu): once prepared, a publisher's
// BeginWrite + Publish and a subscriber's Update (which runs the publisher's session threads too:
// a ring fills its buckets while the subscriber copies them) make no operator new call, over the
// GPU arena, the GPU ring (2 buckets, the model 8x one bucket) and zero-copy (of cuMem memory),
// staged and in place.
// Publisher and subscriber in this process on cuda:0, so every thread of both is counted.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/vmm.h"
#include "gpu/gpu_test_util.h"
#include "testing/count_new.inc"

namespace weightsync {
namespace {

using testing::SyntheticModel;

enum class Store { kGpuArena, kGpuRing, kZeroCopy };
struct Param {
  Store store;
  UpdateMode mode;
};

class GpuSteadyAllocations : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    WS_SKIP_WITHOUT_GPU();
    ASSERT_OK(cuda::SetDevice(0));
    like_ = model_.Tensors();
    tensors_ = like_;
    // The trainer's weights on cuda:0, written each step: a cudaMalloc buffer each, or for
    // zero-copy back to back in cuMem chunks (PyTorch's expandable segments), which a subscriber
    // in the publisher's own process can import (a CUDA IPC handle cannot be opened there).
    const bool chunked = GetParam().store == Store::kZeroCopy;
    if (chunked) {
      ASSERT_OK_AND_ASSIGN(chunks_, cuda::ChunkedAllocation::Create(0, model_.total_bytes()));
    }
    uint64_t at = 0;
    for (NamedTensor& t : tensors_) {
      ASSERT_OK_AND_ASSIGN(uint64_t bytes, t.view.NumBytes());
      if (chunked) {
        t.view.data = chunks_.data() + at;
        at += bytes;
      } else {
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer b, cuda::DeviceBuffer::Allocate(bytes));
        t.view.data = b.data();
        buffers_.push_back(std::move(b));
      }
      t.view.device = {Device::Kind::kCUDA, 0};
    }
    PublisherOptions o;
    o.endpoint = testing::UniqueEndpoint("gpu-steady");
    o.timeout = std::chrono::milliseconds(10000);
    if (GetParam().store == Store::kGpuRing) {
      o.ring_buckets = 2;
      o.ring_bucket_bytes = model_.total_bytes() / 8;
    }
    o.zero_copy = GetParam().store == Store::kZeroCopy;
    ASSERT_OK_AND_ASSIGN(pub_, Publisher::Create(o));
    ASSERT_OK(pub_->Register(tensors_));
    ASSERT_OK_AND_ASSIGN(dst_, cuda::testing::PoisonedDestinations(like_, 0, &dst_buffers_));
  }
  // The new weights into the trainer's tensors (not counted: the test's own host vectors).
  void Write(int64_t step) {
    model_.Fill(step);
    for (size_t i = 0; i < tensors_.size(); ++i) {
      ASSERT_OK_AND_ASSIGN(uint64_t bytes, like_[i].view.NumBytes());
      ASSERT_OK(cuda::CopyToDevice(tensors_[i].view.data, like_[i].view.data, bytes));
    }
  }

  SyntheticModel model_{8, 1 << 18};  // 8 MiB of float32
  std::vector<NamedTensor> like_, tensors_, dst_;
  cuda::ChunkedAllocation chunks_;
  std::vector<cuda::DeviceBuffer> buffers_, dst_buffers_;
  std::unique_ptr<Publisher> pub_;
};

TEST_P(GpuSteadyAllocations, PublishAndUpdateMakeNoOperatorNewCall) {
  SubscriberOptions so;
  so.endpoint = pub_->endpoint();
  so.mode = GetParam().mode;
  so.verify = true;
  so.timeout = std::chrono::milliseconds(10000);
  auto sub = testing::NewSubscriber(so, dst_);
  int64_t worst_publish = 0, worst_update = 0, first_step = 0;
  for (int64_t step = 1; step <= 12; ++step) {
    // Step 1 prepares both sides and step 2 warms what the first steady step touches (the
    // version ring's entries, thread-local buffers); from step 3 on nothing may allocate.
    const bool steady = step >= 3;
    ASSERT_OK(pub_->BeginWrite());
    ASSERT_NO_FATAL_FAILURE(Write(step));
    const int64_t before_publish = g_new_calls.load();
    Result<PublishStats> published = pub_->Publish(step);
    const int64_t after_publish = g_new_calls.load();
    ASSERT_TRUE(published.ok()) << published.status();
    Result<UpdateStats> updated = sub->Update();
    const int64_t after_update = g_new_calls.load();
    ASSERT_TRUE(updated.ok()) << "step " << step << ": " << updated.status();
    EXPECT_EQ(updated->step, step);
    if (step == 1) first_step = after_update - before_publish;
    if (steady) {
      worst_publish = std::max(worst_publish, after_publish - before_publish);
      worst_update = std::max(worst_update, after_update - after_publish);
    }
  }
  // The hooks are live: preparing both sides (step 1) allocates.
  EXPECT_GT(first_step, 0) << "operator new is not counted: the zeros below would prove nothing";
  EXPECT_EQ(worst_publish, 0) << "operator new calls in one steady Publish";
  EXPECT_EQ(worst_update, 0) << "operator new calls in one steady Update (both sides' threads)";
  std::string why;
  EXPECT_TRUE(cuda::testing::DestinationsHold(dst_, like_, 12, &why)) << why;
}

constexpr Param kParams[] = {
    {Store::kGpuArena, UpdateMode::kInPlace}, {Store::kGpuArena, UpdateMode::kStaged},
    {Store::kGpuRing, UpdateMode::kInPlace},  {Store::kGpuRing, UpdateMode::kStaged},
    {Store::kZeroCopy, UpdateMode::kInPlace}, {Store::kZeroCopy, UpdateMode::kStaged},
};

std::string RowName(const ::testing::TestParamInfo<Param>& info) {
  static constexpr const char* kStore[] = {"gpu_arena", "gpu_ring", "zero_copy"};
  return std::string(kStore[static_cast<int>(info.param.store)]) +
         (info.param.mode == UpdateMode::kStaged ? "_staged" : "_in_place");
}

INSTANTIATE_TEST_SUITE_P(Stores, GpuSteadyAllocations, ::testing::ValuesIn(kParams), RowName);

}  // namespace
}  // namespace weightsync
