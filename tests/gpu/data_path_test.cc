// The GPU data path classes on their own (src/transport/path/*.h; label gpu, each test skips
// without what it needs), driven by hand as a transfer handle drives them (testing/
// path_harness.h) against a real publisher process: prepared on the device, one step through,
// what each says about itself (Describe(): the details of the prepare log line), released. Their
// availability checks without a device are tests/transport/path/data_path_test.cc; what every
// path does end to end is the conformance suite (tests/gpu/conformance_test.cc).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/nccl_link.h"
#include "cuda/vmm.h"
#include "gpu/gpu_test_util.h"
#include "testing/path_harness.h"
#include "testing/publisher_process.h"
#include "testing/test_util.h"
#include "transport/path/gpu_copy_path.h"
#include "transport/path/gpu_to_host_path.h"
#include "transport/path/host_to_gpu_path.h"
#include "transport/path/nccl_path.h"

namespace weightsync::transport::path {
namespace {

using testing::SyntheticModel;

constexpr int kTensors = 12;
constexpr int64_t kElements = 3000;
constexpr char kToken[] = "data path test token, 32 bytes..";

class GpuDataPath : public ::testing::Test {
 protected:
  // Before NCCL reads its environment (the first communicator): never NVLink multicast.
  static void SetUpTestSuite() { ::setenv("NCCL_NVLS_ENABLE", "0", 1); }
  void SetUp() override { WS_SKIP_WITHOUT_GPU(); }

  // Starts the publisher — CUDA tensors on cuda:0 (`gpu_store`) or host tensors — on `endpoint`
  // (tcp:// ones authenticated), publishes step 1 and connects the harness for destinations on
  // cuda:`device` (host memory when -1), poisoned. Call through ASSERT_NO_FATAL_FAILURE.
  void Start(bool gpu_store, const std::string& endpoint, int device) {
    const bool tcp = endpoint.rfind("tcp://", 0) == 0;
    std::vector<std::string> args = {std::to_string(kTensors), std::to_string(kElements)};
    if (gpu_store) args.push_back("0");
    std::vector<std::string> env = {"NCCL_NVLS_ENABLE=0"};
    if (tcp) env.push_back(std::string("WEIGHTSYNC_TOKEN=") + kToken);
    publisher_ = std::make_unique<testing::PublisherProcess>(
        gpu_store ? "gpu_publisher" : "publisher", std::move(args), std::move(env));
    ASSERT_NO_FATAL_FAILURE(publisher_->Start(endpoint));
    ASSERT_NO_FATAL_FAILURE(publisher_->Publish(1));
    if (device >= 0) {
      ASSERT_OK(cuda::SetDevice(device));
      ASSERT_OK_AND_ASSIGN(dst_, cuda::testing::PoisonedDestinations(like_, device, &buffers_));
    } else {
      dst_ = SyntheticModel::Views(like_, storage_);
    }
    SubscriberOptions o;
    o.endpoint = publisher_->endpoint();
    if (tcp) o.token = kToken;
    o.verify = true;
    harness_ = std::make_unique<testing::PathHarness>(o);
    ASSERT_OK(harness_->Connect(dst_));
  }

  // Prepares `path`, moves step 2 through it into the destinations and checks them.
  void PrepareAndMoveAStep(DataPath& path) {
    ASSERT_OK(harness_->Prepare(path));
    ASSERT_NO_FATAL_FAILURE(publisher_->Publish(2));
    ASSERT_OK_AND_ASSIGN(int64_t step, harness_->Step(path));
    EXPECT_EQ(step, 2);
    std::string why;
    const bool holds = buffers_.empty() ? SyntheticModel::Holds(dst_, 2, &why)
                                        : cuda::testing::DestinationsHold(dst_, like_, 2, &why);
    EXPECT_TRUE(holds) << why;
  }

  // The destinations' device: cuda:1 when there is one (the publishers keep cuda:0).
  static int DestinationDevice() { return cuda::DeviceCount() > 1 ? 1 : 0; }

  SyntheticModel model_{kTensors, kElements};
  std::vector<NamedTensor> like_ = model_.Tensors();
  std::vector<std::vector<uint8_t>> storage_ = SyntheticModel::PoisonedStorage(like_);
  std::vector<cuda::DeviceBuffer> buffers_;
  std::vector<NamedTensor> dst_;
  std::unique_ptr<testing::PublisherProcess> publisher_;
  std::unique_ptr<testing::PathHarness> harness_;
};

TEST_F(GpuDataPath, HostToGpuReadsTheHostStoreFromPinnedMemory) {
  const int device = DestinationDevice();
  ASSERT_NO_FATAL_FAILURE(Start(/*gpu_store=*/false, testing::UniqueEndpoint("h2dpath"), device));
  HostToGpuPath path;
  ASSERT_NO_FATAL_FAILURE(PrepareAndMoveAStep(path));
  // The H200's driver pins read-only memory (tests/gpu/host_to_gpu_test.cc).
  EXPECT_EQ(path.Describe(),
            ", host arena into cuda:" + std::to_string(device) + " from pinned memory");
  EXPECT_OK(path.Release());
}

TEST_F(GpuDataPath, GpuToHostWritesPinnedHostMemoryWithTheStoresCopyEngines) {
  ASSERT_NO_FATAL_FAILURE(Start(/*gpu_store=*/true, testing::UniqueEndpoint("d2hpath"), -1));
  GpuToHostPath path;
  ASSERT_NO_FATAL_FAILURE(PrepareAndMoveAStep(path));
  EXPECT_EQ(path.Describe(),
            ", GPU arena from cuda:0 into host memory by the copy engines of cuda:0, pinned");
  EXPECT_OK(path.Release());
}

TEST_F(GpuDataPath, GpuCopyImportsTheStoreForTheDestinationsDevice) {
  const int device = DestinationDevice();
  ASSERT_NO_FATAL_FAILURE(Start(/*gpu_store=*/true, testing::UniqueEndpoint("ipcpath"), device));
  GpuCopyPath path;
  ASSERT_NO_FATAL_FAILURE(PrepareAndMoveAStep(path));
  const std::string line = path.Describe();
  const std::string prefix = ", GPU arena from cuda:0 into cuda:" + std::to_string(device);
  EXPECT_EQ(line.substr(0, prefix.size()), prefix) << line;
  // On the arena's own GPU the small copies go out as one copy-group launch; across GPUs every
  // copy stays with the copy engines.
  EXPECT_EQ(line.find("copy jobs in one launch") != std::string::npos, device == 0) << line;
  EXPECT_EQ(path.conversion_source_device(), -1);  // nothing to convert
  EXPECT_OK(path.Release());
}

TEST_F(GpuDataPath, NcclJoinsATwoRankCommunicatorOnTheDestinationsDevice) {
  if (cuda::DeviceCount() < 2)
    GTEST_SKIP() << "needs 2 CUDA devices, found " << cuda::DeviceCount();
  if (Status s = cuda::nccl::NcclAvailable(); !s.ok()) GTEST_SKIP() << "needs NCCL: " << s;
  ASSERT_NO_FATAL_FAILURE(Start(/*gpu_store=*/true, "tcp://127.0.0.1:0", /*device=*/1));
  const int64_t live = cuda::nccl::LiveCommunicators();
  NcclPath path;
  ASSERT_NO_FATAL_FAILURE(PrepareAndMoveAStep(path));
  EXPECT_EQ(cuda::nccl::LiveCommunicators(), live + 1);
  const std::string said = path.Describe();
  EXPECT_EQ(said.rfind("; communicator rank 1 on cuda:1, NCCL ", 0), 0u) << said;
  EXPECT_NE(said.find(" staging bytes"), std::string::npos) << said;  // staged
  EXPECT_OK(path.Release());
  EXPECT_EQ(cuda::nccl::LiveCommunicators(), live);
}

}  // namespace
}  // namespace weightsync::transport::path
