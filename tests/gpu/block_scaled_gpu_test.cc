// MXFP8 and NVFP4 in flight into CUDA destinations (label gpu): a publisher of host tensors, a
// subscriber whose values, scale tensors and global scales are CUDA memory registered once, over
// shm and tcp (the host-to-gpu and tcp-to-gpu paths), staged and in place. The block-scaled
// kernels convert at commit; every destination equals the CPU reference of the published bytes,
// bit for bit, step after step — for 100 steps in the same registered memory, with the handle
// (and its prepared launches) made once, as CUDA-graph-captured engines need. A corrupt step
// converts nothing when staged.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "testing/block_scaled_model.h"
#include "testing/convert_fixture.h"

namespace weightsync {
namespace {

using testing::block_scaled::Destinations;
using testing::block_scaled::Expected;
using testing::block_scaled::ExpectSame;
using testing::block_scaled::Source;

// The model's destinations in CUDA memory of device 0 (made on first use, poisoned), read back
// into a host Destinations to compare.
struct GpuDestinations {
  Destinations shapes;
  std::vector<cuda::DeviceBuffer> buffers;
  std::vector<NamedTensor> on_device;

  std::vector<NamedTensor> Tensors() {
    if (on_device.empty()) {
      Result<std::vector<NamedTensor>> made =
          cuda::testing::PoisonedDestinations(shapes.Tensors(), 0, &buffers);
      EXPECT_OK(made.status());
      if (made.ok()) on_device = std::move(made).value();
    }
    return on_device;
  }
  void Download(Destinations* out) {
    std::vector<NamedTensor> host = out->Tensors();
    ASSERT_EQ(host.size(), on_device.size());
    for (size_t i = 0; i < host.size(); ++i) {
      ASSERT_OK(
          cuda::CopyToHost(host[i].view.data, on_device[i].view.data, *host[i].view.NumBytes()));
    }
  }
};

class BlockScaledGpu : public testing::ConvertFixture<Source, GpuDestinations> {
 protected:
  void ExpectStep(int64_t step) {
    Destinations got;
    dst_.Download(&got);
    ExpectSame(got, Expected(src_), step);
  }
};

TEST_P(BlockScaledGpu, ValuesAndScalesEqualTheReferenceStepAfterStep) {
  WS_SKIP_WITHOUT_GPU();
  auto sub = Connect();
  for (int64_t step = 1; step <= 4; ++step) {
    Publish(step);
    auto r = sub->Update();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->verified);
    EXPECT_EQ(r->tensors, 4u);
    EXPECT_EQ(r->converted_tensors, 4u);
    EXPECT_EQ(r->converted_on, ConvertedOn::kDestinationGpu);
    EXPECT_EQ(r->converted_device, 0);
    ExpectStep(step);
  }
}

// The engine's kernels (and its CUDA graphs) keep the addresses it registered: 100 updates write
// the registered tensors in place, each step's bytes the reference's, with one handle prepared.
TEST_P(BlockScaledGpu, OneHundredUpdatesLandInTheRegisteredMemory) {
  WS_SKIP_WITHOUT_GPU();
  auto sub = Connect();
  const std::vector<NamedTensor> registered = dst_.Tensors();
  for (int64_t step = 1; step <= 100; ++step) {
    Publish(step);
    auto r = sub->Update();
    ASSERT_TRUE(r.ok()) << "step " << step << ": " << r.status();
    EXPECT_EQ(r->prepare_count, 1u) << "step " << step;
    ExpectStep(step);
    if (::testing::Test::HasFailure()) break;
  }
  // Still the memory we registered (the test reads it there): nothing was re-registered.
  const std::vector<NamedTensor> now = dst_.Tensors();
  for (size_t i = 0; i < now.size(); ++i) EXPECT_EQ(now[i].view.data, registered[i].view.data);
}

TEST_P(BlockScaledGpu, ACorruptStepConvertsNothingWhenStaged) {
  WS_SKIP_WITHOUT_GPU();
  auto sub = Connect();
  Source step1;
  step1.Fill(1);
  ExpectACorruptStepConvertsNothing(sub, [&] {
    Destinations got;
    dst_.Download(&got);
    ExpectSame(got, Expected(step1), 1);
  });
  ExpectStep(2);
}

INSTANTIATE_TEST_SUITE_P(Transports, BlockScaledGpu, testing::AllTransportModes(),
                         testing::TransportModeName);

}  // namespace
}  // namespace weightsync
