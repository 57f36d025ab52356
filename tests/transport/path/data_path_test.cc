// Each data path class on its own (src/transport/path/*.h), driven by hand as its transfer handle
// drives it (testing/path_harness.h) against a real publisher process: what it prepares against,
// what it says about itself (Describe(), the prepare log line's details) and its errors. The host
// paths run here; the GPU paths' availability checks run here too (a machine without CUDA is told
// what it lacks), their preparation on a device is tests/gpu/data_path_test.cc. What every path
// does end to end is the conformance suite (tests/transport/conformance_suite.h).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/nccl_link.h"
#include "testing/path_harness.h"
#include "testing/publisher_process.h"
#include "testing/test_util.h"
#include "transport/link/endpoint.h"
#include "transport/path/gpu_to_host_path.h"
#include "transport/path/host_copy_path.h"
#include "transport/path/host_to_gpu_path.h"
#include "transport/path/nccl_path.h"
#include "transport/path/tcp_read_path.h"

namespace weightsync::transport::path {
namespace {

using testing::PathHarness;
using testing::PublisherProcess;
using testing::SyntheticModel;

constexpr int kTensors = 12;

// A publisher process of the synthetic model (started by the test) and host destinations for it,
// poisoned.
struct HostSetup {
  explicit HostSetup(int64_t elements)
      : model(kTensors, elements),
        publisher("publisher", {std::to_string(kTensors), std::to_string(elements)}) {}
  SubscriberOptions Options(UpdateMode mode) const {
    SubscriberOptions o;
    o.endpoint = publisher.endpoint();
    o.mode = mode;
    o.verify = true;
    return o;
  }
  SyntheticModel model;
  std::vector<NamedTensor> like = model.Tensors();
  std::vector<std::vector<uint8_t>> storage = SyntheticModel::PoisonedStorage(like);
  std::vector<NamedTensor> dst = SyntheticModel::Views(like, storage);
  PublisherProcess publisher;
};

// Prepares `path` and moves steps 1 and 2 through it into `setup`'s destinations, then releases
// it: the ledger's mappings and staging return to where they were before the prepare.
// `described`: what the path adds to the prepare log line.
void MoveTwoSteps(HostSetup& setup, PathHarness& harness, DataPath& path,
                  const std::string& described) {
  ASSERT_NO_FATAL_FAILURE(setup.publisher.Publish(1));  // a publisher welcomes once it has a store
  ASSERT_OK(harness.Connect(setup.dst));
  const LedgerSnapshot before = ReadLedger();
  ASSERT_OK(harness.Prepare(path));
  for (int64_t step = 1; step <= 2; ++step) {
    if (step > 1) {
      ASSERT_NO_FATAL_FAILURE(setup.publisher.Publish(step));
    }
    ASSERT_OK_AND_ASSIGN(int64_t moved, harness.Step(path));
    EXPECT_EQ(moved, step);
    std::string why;
    EXPECT_TRUE(SyntheticModel::Holds(setup.dst, step, &why)) << why;
  }
  EXPECT_EQ(path.Describe(), described);
  ASSERT_OK(path.Release());
  const LedgerSnapshot after = ReadLedger();
  EXPECT_EQ(after.mappings, before.mappings);
  EXPECT_EQ(after.staging_bytes, before.staging_bytes);
}

// ---- HostCopyPath (shm) ----------------------------------------------------------------------

TEST(HostCopyPath, MapsThePublishersStoreOnceAndCopiesEachStep) {
  for (UpdateMode mode : {UpdateMode::kStaged, UpdateMode::kInPlace}) {
    SCOPED_TRACE(mode == UpdateMode::kStaged ? "staged" : "in place");
    HostSetup setup(3000);
    ASSERT_NO_FATAL_FAILURE(setup.publisher.Start(testing::UniqueEndpoint("hostcopy")));
    PathHarness harness(setup.Options(mode));
    HostCopyPath path;
    // The store's view names what it reads.
    ASSERT_NO_FATAL_FAILURE(MoveTwoSteps(setup, harness, path, ", host arena"));
  }
}

TEST(HostCopyPath, RefusesAStoreThatIsNotThePublishersNamingThePeerAndTheSizes) {
  HostSetup setup(3000);
  ASSERT_NO_FATAL_FAILURE(setup.publisher.Start(testing::UniqueEndpoint("hostcopy")));
  ASSERT_NO_FATAL_FAILURE(setup.publisher.Publish(1));
  PathHarness harness(setup.Options(UpdateMode::kStaged));
  ASSERT_OK(harness.Connect(setup.dst));
  // Another memory file in place of the store that came with the Welcome.
  util::UniqueFd other(::memfd_create("not-the-store", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(other.valid());
  ASSERT_EQ(::ftruncate(other.get(), 4096), 0);
  harness.store_fd() = std::move(other);
  HostCopyPath path;
  ASSERT_STATUS_IS(kProtocolError, harness.Prepare(path), harness.link().peer(),
                   "received segment is 4096 bytes, welcome says " +
                       std::to_string(harness.welcome().arena_bytes));
  EXPECT_OK(path.Release());
}

// ---- TcpReadPath (tcp) -----------------------------------------------------------------------

TEST(TcpReadPath, ReadsEachStepFromTheConnectionIntoPlace) {
  for (UpdateMode mode : {UpdateMode::kStaged, UpdateMode::kInPlace}) {
    SCOPED_TRACE(mode == UpdateMode::kStaged ? "staged" : "in place");
    HostSetup setup(3000);
    ASSERT_NO_FATAL_FAILURE(setup.publisher.Start("tcp://127.0.0.1:0"));
    PathHarness harness(setup.Options(mode));
    TcpReadPath path;
    ASSERT_NO_FATAL_FAILURE(MoveTwoSteps(setup, harness, path, ""));  // the bytes come on the link
  }
}

TEST(TcpReadPath, BytesThatDoNotArriveInTimeAreATimeoutNamingTheStep) {
  // Tens of MB a step: more than the socket buffers hold, so the read cannot finish at once.
  HostSetup setup(600000);
  ASSERT_NO_FATAL_FAILURE(setup.publisher.Start("tcp://127.0.0.1:0"));
  ASSERT_NO_FATAL_FAILURE(setup.publisher.Publish(1));
  PathHarness harness(setup.Options(UpdateMode::kStaged));
  ASSERT_OK(harness.Connect(setup.dst));
  TcpReadPath path;
  ASSERT_OK(harness.Prepare(path));
  ASSERT_OK_AND_ASSIGN(int64_t step,
                       harness.link().BeginStep(std::nullopt, -1, harness.deadline()));
  ASSERT_EQ(step, 1);
  const util::Deadline expired(std::chrono::milliseconds(0));
  ASSERT_STATUS_IS(kTimeout, path.Copy(harness.link().begin(), /*verify=*/true, expired),
                   "step 1 data", harness.link().peer());
  EXPECT_OK(path.Release());
}

// ---- the GPU paths: what this machine lacks -----------------------------------------------------

// A context as a handle builds it for a publisher whose store is on cuda:0 (the link is not
// connected: Available() is asked before anything goes to the publisher).
struct GpuContext {
  GpuContext() {
    SubscriberOptions o;
    o.endpoint = "local://gpu-paths-test";
    options = o;
    link = link::NewLink(*link::ParseEndpoint(o.endpoint), o);
    welcome.arena_kind = wire::ArenaKind::kCudaMem;
    welcome.device = 0;
    ctx.link = link.get();
    ctx.welcome = &welcome;
    ctx.options = &options;
  }
  SubscriberOptions options;
  std::unique_ptr<link::Link> link;
  wire::Welcome welcome;
  PathContext ctx;
};

// Each GPU path answers Available() with OK on a machine that can run it, else Unavailable
// naming the publisher and what the path needs, and why this machine cannot.
void ExpectAvailableOrSaysWhy(DataPath& path, const PathContext& ctx, bool can_run,
                              const std::string& needs) {
  Status s = path.Available(ctx);
  if (can_run) {
    EXPECT_OK(s);
    return;
  }
  EXPECT_STATUS_IS(kUnavailable, s, ctx.link->peer(), needs);
  EXPECT_TRUE(testing::IsError(s, StatusCode::kUnavailable, {"built without CUDA"}) ||
              testing::IsError(s, StatusCode::kUnavailable, {"no CUDA device"}) ||
              testing::IsError(s, StatusCode::kUnavailable, {"NCCL library"}))
      << s;
}

TEST(HostToGpuPath, WithoutACudaDeviceAvailableSaysWhatItNeeds) {
  GpuContext c;
  c.welcome.arena_kind = wire::ArenaKind::kHostMemfd;
  HostToGpuPath path;
  ExpectAvailableOrSaysWhy(path, c.ctx, cuda::CudaAvailable().ok(),
                           "keeps its arena in host memory and the destinations are CUDA tensors");
}

TEST(GpuToHostPath, WithoutACudaDeviceAvailableSaysWhatItNeeds) {
  GpuContext c;
  GpuToHostPath path;
  ExpectAvailableOrSaysWhy(path, c.ctx, cuda::CudaAvailable().ok(),
                           "keeps its arena on cuda:0 and the destinations are in host memory");
}

TEST(NcclPath, WithoutNcclOrACudaDeviceAvailableSaysWhatItNeeds) {
  GpuContext c;
  NcclPath path;
  ExpectAvailableOrSaysWhy(path, c.ctx,
                           cuda::CudaAvailable().ok() && cuda::nccl::NcclAvailable().ok(),
                           "serves GPU memory on cuda:0 and the destinations are CUDA tensors, "
                           "which needs the nccl transport");
}

}  // namespace
}  // namespace weightsync::transport::path
