// Zero-copy GPU publishing (PublisherOptions::zero_copy, label gpu) beyond the conformance suite's
// cuda-ipc-zero-copy rows: a publisher process whose CUDA tensors are packed several to a
// cudaMalloc allocation (two allocations), or into cuMem chunks as PyTorch's expandable segments
// (two ranges of back-to-back chunks, tensors straddling chunk boundaries), publishes them where
// they are; this process subscribes
// into CUDA destinations on cuda:1 (cuda:0 with one GPU). The publisher adds no arena (GPU memory
// measured around its first publish, against an arena publisher of the same model); its write is
// fenced — held while a subscriber reads, so the reader gets exactly the version it asked for —
// and a stalled reader is revoked within the publisher's timeout with its old weights intact
// (staged); two subscribers in one process share the publisher's opened allocations; memory it
// cannot export is refused naming the tensor.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/device.h"
#include "cuda/ipc.h"
#include "cuda/vmm.h"
#include "gpu/gpu_test_util.h"
#include "testing/publisher_process.h"
#include "testing/test_util.h"
#include "util/fail_point.h"

namespace weightsync {
namespace {

using Clock = std::chrono::steady_clock;
using testing::SyntheticModel;
using util::FailAction;
using util::FailPoints;

constexpr int kTensors = 12;
constexpr int64_t kElements = 1 << 20;  // about 40 MB a step
constexpr int kPublisherTimeoutMs = 800;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// (update mode, the trainer's memory: WS_TEST_ZERO_COPY's value, "1" cudaMalloc or "vmm" cuMem
// chunks as PyTorch's expandable segments)
class ZeroCopy : public ::testing::TestWithParam<std::tuple<UpdateMode, const char*>> {
 protected:
  void SetUp() override {
    WS_SKIP_WITHOUT_GPU();
    FailPoints::DisarmAll();
    device_ = cuda::DeviceCount() > 1 ? 1 : 0;
    ASSERT_OK(cuda::SetDevice(device_));
    like_ = model_.Tensors();
  }
  void TearDown() override { FailPoints::DisarmAll(); }

  std::unique_ptr<testing::PublisherProcess> StartPublisher(bool zero_copy) {
    std::vector<std::string> env = {"WS_TEST_TIMEOUT_MS=" + std::to_string(kPublisherTimeoutMs)};
    if (zero_copy) env.push_back(std::string("WS_TEST_ZERO_COPY=") + std::get<1>(GetParam()));
    return cuda::testing::StartGpuPublisher(kTensors, kElements, std::move(env),
                                            zero_copy ? "zerocopy" : "arena");
  }
  // Poisoned destinations on device_ and a verifying subscriber of `publisher` into them.
  std::unique_ptr<Subscriber> Connect(const testing::PublisherProcess& publisher,
                                      std::vector<NamedTensor>* dst,
                                      std::vector<cuda::DeviceBuffer>* buffers) {
    return cuda::testing::ConnectVerifying(publisher.endpoint(), std::get<0>(GetParam()), like_,
                                           device_, dst, buffers);
  }
  std::string Holds(const std::vector<NamedTensor>& dst, int64_t step) {
    std::string why;
    return cuda::testing::DestinationsHold(dst, like_, step, &why) ? "" : why;
  }
  // Steps 1 and 2 published, step 1 received; then an update of step 2 that the fail point holds
  // for `hold_ms` inside its step, pinned (the returned future is its result).
  std::future<Result<UpdateStats>> HoldAReaderOfStepTwo(testing::PublisherProcess& pub,
                                                        Subscriber& sub, int hold_ms) {
    pub.Publish(1);
    EXPECT_OK(sub.Update());
    pub.Publish(2);
    FailPoints::Arm("subscriber.before_copy", FailAction::kSleep, hold_ms, 1);
    auto update = std::async(std::launch::async, [&sub] { return sub.Update(); });
    EXPECT_TRUE(testing::WaitForFailPointHits("subscriber.before_copy"));
    return update;
  }

  int device_ = 0;
  SyntheticModel model_{kTensors, kElements};
  std::vector<NamedTensor> like_;
};

// Each publisher's GPU memory is measured across its first publish (its store is made then); the
// subscriber connects only afterwards.
TEST_P(ZeroCopy, APublisherOfItsOwnTensorsAddsNoArenaAndDeliversEveryByte) {
  int64_t arena_extra = 0, zero_extra = 0;
  auto arena = StartPublisher(/*zero_copy=*/false);
  ASSERT_NO_FATAL_FAILURE(cuda::testing::ExtraAcrossFirstPublish(*arena, &arena_extra));
  arena.reset();
  auto zero = StartPublisher(/*zero_copy=*/true);
  ASSERT_NO_FATAL_FAILURE(cuda::testing::ExtraAcrossFirstPublish(*zero, &zero_extra));
  EXPECT_GE(arena_extra, static_cast<int64_t>(2 * model_.total_bytes()))
      << "the arena publisher's two slots";
  EXPECT_LE(zero_extra, 64ll << 20) << "zero-copy adds at most 64 MiB (digest scratch, stream)";

  std::vector<NamedTensor> dst;
  std::vector<cuda::DeviceBuffer> buffers;
  auto sub = Connect(*zero, &dst, &buffers);
  for (int64_t step = 1; step <= 4; ++step) {
    if (step > 1) {
      ASSERT_NO_FATAL_FAILURE(zero->Publish(step));
    }
    ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub->Update());
    EXPECT_EQ(stats.path, "cuda-ipc-zero-copy");
    EXPECT_EQ(stats.step, step);
    EXPECT_TRUE(stats.verified);
    EXPECT_EQ(stats.bytes, model_.total_bytes());
    EXPECT_EQ(Holds(dst, step), "") << "step " << step;
  }
}

// The trainer's next write (BeginWrite in the publisher's publish) is held while this subscriber
// reads step 2 in place in the trainer's memory: the subscriber verifies and holds step 2 exactly,
// which it could not if the trainer had written step 3 meanwhile.
TEST_P(ZeroCopy, TheTrainersWriteWaitsForTheReaderWhichGetsTheVersionItAskedFor) {
  auto pub = StartPublisher(/*zero_copy=*/true);
  std::vector<NamedTensor> dst;
  std::vector<cuda::DeviceBuffer> buffers;
  auto sub = Connect(*pub, &dst, &buffers);
  auto update = HoldAReaderOfStepTwo(*pub, *sub, kPublisherTimeoutMs / 2);
  ASSERT_FALSE(HasFatalFailure());
  const auto t0 = Clock::now();
  ASSERT_NO_FATAL_FAILURE(pub->Publish(3));  // BeginWrite, write, publish
  const double publish_seconds = SecondsSince(t0);
  ASSERT_OK_AND_ASSIGN(UpdateStats read, update.get());
  EXPECT_EQ(read.step, 2);
  EXPECT_TRUE(read.verified);
  EXPECT_EQ(Holds(dst, 2), "") << "the write did not wait: the reader saw the trainer's next bytes";
  EXPECT_GT(publish_seconds, 0.25 * kPublisherTimeoutMs / 1000.0) << "the write never waited";
  ASSERT_OK_AND_ASSIGN(UpdateStats next, sub->Update());
  EXPECT_EQ(next.step, 3);
  EXPECT_EQ(Holds(dst, 3), "");
}

// A reader stalled past the publisher's timeout has its read revoked: the trainer writes on, the
// reader gets a Timeout at the end of its step and commits nothing, and its next update lands.
TEST_P(ZeroCopy, AStalledReaderIsRevokedAndCommitsNothing) {
  auto pub = StartPublisher(/*zero_copy=*/true);
  std::vector<NamedTensor> dst;
  std::vector<cuda::DeviceBuffer> buffers;
  auto sub = Connect(*pub, &dst, &buffers);
  auto update = HoldAReaderOfStepTwo(*pub, *sub, 3 * kPublisherTimeoutMs);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_NO_FATAL_FAILURE(pub->Publish(3));  // revokes the stalled read, writes step 3
  Result<UpdateStats> stalled = update.get();
  ASSERT_FALSE(stalled.ok()) << "a revoked read was committed";
  EXPECT_STATUS_IS(kTimeout, stalled, "the read of step 2 was revoked");
  EXPECT_EQ(sub->committed_step(), 1);
  if (std::get<0>(GetParam()) == UpdateMode::kStaged) {
    EXPECT_TRUE(sub->weights_valid());
    EXPECT_EQ(Holds(dst, 1), "") << "staged: the old weights stay";
  } else {
    EXPECT_FALSE(sub->weights_valid());
  }
  ASSERT_OK_AND_ASSIGN(UpdateStats next, sub->Update());
  EXPECT_EQ(next.step, 3);
  EXPECT_EQ(Holds(dst, 3), "");
}

// CUDA opens a handle once per process: two subscribers here share each opened allocation (IPC
// handles; cuMem chunks each import and map for themselves), and one closing leaves the other's
// mappings open.
TEST_P(ZeroCopy, TwoSubscribersInOneProcessShareTheOpenedAllocations) {
  auto pub = StartPublisher(/*zero_copy=*/true);
  std::vector<NamedTensor> dst_a, dst_b;
  std::vector<cuda::DeviceBuffer> buffers_a, buffers_b;
  auto a = Connect(*pub, &dst_a, &buffers_a);
  auto b = Connect(*pub, &dst_b, &buffers_b);
  for (int64_t step = 1; step <= 2; ++step) {
    ASSERT_NO_FATAL_FAILURE(pub->Publish(step));
    ASSERT_OK(a->Update());
    ASSERT_OK(b->Update());
    EXPECT_EQ(Holds(dst_a, step), "");
    EXPECT_EQ(Holds(dst_b, step), "");
  }
  ASSERT_OK(a->Close());
  ASSERT_NO_FATAL_FAILURE(pub->Publish(3));
  ASSERT_OK_AND_ASSIGN(UpdateStats stats, b->Update());
  EXPECT_EQ(stats.step, 3);
  EXPECT_FALSE(stats.handle_created) << "b's handle and mappings stay";
  EXPECT_EQ(Holds(dst_b, 3), "");
}

// What zero-copy cannot publish is refused at the first publish, naming the tensor: cuMem memory
// created without a shareable handle type (PyTorch's expandable segments have one; others may
// not), and a view that runs past the end of its allocation (cudaMalloc or cuMem). A cuMem
// allocation that can be shared is published (the conformance suite's cuMem rows move its bytes).
TEST(ZeroCopyRefusals, MemoryThatCannotBeSharedAndViewsPastTheirAllocationNameTheTensor) {
  WS_SKIP_WITHOUT_GPU();
  ASSERT_OK(cuda::SetDevice(0));
  auto start = [](const std::string& stem) {
    PublisherOptions o;
    o.endpoint = testing::UniqueEndpoint(stem);
    o.zero_copy = true;
    return Publisher::Create(o);
  };
  ASSERT_OK_AND_ASSIGN(cuda::ChunkedAllocation private_memory,
                       cuda::ChunkedAllocation::Create(0, 4 << 20, /*exportable=*/false));
  ASSERT_OK_AND_ASSIGN(auto a, start("zc-private"));
  // Across the chunk boundary: both chunks are looked at, the first one refused.
  ASSERT_OK(a->Register({{"w",
                          {private_memory.data() + private_memory.chunk_bytes() - 4096,
                           DType::kFloat32,
                           {2048},
                           {Device::Kind::kCUDA, 0}}}}));
  // The code is the driver's; the text names the tensor and why.
  Result<PublishStats> refused = a->Publish(1);
  ASSERT_FALSE(refused.ok());
  const std::string text = refused.status().ToString();
  EXPECT_NE(text.find("exporting the cuMem memory of tensor 'w'"), std::string::npos) << text;
  EXPECT_NE(text.find("CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR"), std::string::npos) << text;
  EXPECT_EQ(a->latest_step(), -1) << "nothing published";

  // A view that starts in cuMem memory and runs past the end of its reserved range.
  ASSERT_OK_AND_ASSIGN(cuda::ChunkedAllocation shared, cuda::ChunkedAllocation::Create(0, 2 << 20));
  ASSERT_OK_AND_ASSIGN(auto past, start("zc-cumem-past"));
  ASSERT_OK(past->Register({{"u",
                             {shared.data() + shared.size() - 1024,
                              DType::kFloat32,
                              {1024},
                              {Device::Kind::kCUDA, 0}}}}));
  EXPECT_STATUS_IS(kInvalidArgument, past->Publish(1),
                   "tensor 'u' (4096 bytes) runs past the cuMem memory it starts in");

  ASSERT_OK_AND_ASSIGN(cuda::ExportedAllocation cumem,
                       cuda::ExportedAllocation::Create(0, 2 << 20));
  ASSERT_OK_AND_ASSIGN(auto ok, start("zc-cumem"));
  ASSERT_OK(
      ok->Register({{"w", {cumem.data(), DType::kFloat32, {1024}, {Device::Kind::kCUDA, 0}}}}));
  EXPECT_OK(ok->Publish(1));

  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer small, cuda::DeviceBuffer::Allocate(4096));
  ASSERT_OK_AND_ASSIGN(auto b, start("zc-past"));
  ASSERT_OK(b->Register(
      {{"v", {small.as<uint8_t>() + 2048, DType::kFloat32, {1024}, {Device::Kind::kCUDA, 0}}}}));
  EXPECT_STATUS_IS(kInvalidArgument, b->Publish(1),
                   "tensor 'v' (4096 bytes) runs past the end of its CUDA allocation");
}

// Over tcp a zero-copy publisher exports nothing (its sessions' NCCL broadcasts read the tensors
// in its process; the nccl-zero-copy rows of the conformance suite, two GPUs): memory no IPC could
// share publishes, no chunk is retained, and the Welcome passes the tcp server's guard against
// exported allocations, so a subscriber of host memory learns that no path moves GPU tensors
// there. A tensor running past its memory is still refused at the first publish, naming it.
TEST(ZeroCopyOverTcp, ExportsNothingSoUnshareableMemoryPublishes) {
  WS_SKIP_WITHOUT_GPU();
  ASSERT_OK(cuda::SetDevice(0));
  const LedgerSnapshot before = ReadLedger();
  ASSERT_OK_AND_ASSIGN(cuda::ChunkedAllocation private_memory,
                       cuda::ChunkedAllocation::Create(0, 4 << 20, /*exportable=*/false));
  PublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:0";
  o.zero_copy = true;
  ASSERT_OK_AND_ASSIGN(auto pub, Publisher::Create(o));
  ASSERT_OK(pub->Register({{"w",
                            {private_memory.data() + private_memory.chunk_bytes() - 4096,
                             DType::kFloat32,
                             {2048},
                             {Device::Kind::kCUDA, 0}}}}));
  ASSERT_OK_AND_ASSIGN(PublishStats stats, pub->Publish(1));  // local://: refused, above
  EXPECT_EQ(stats.store_bytes, 0u);
  EXPECT_EQ(ReadLedger().retained_allocations, before.retained_allocations)
      << "two chunks under the tensor, none retained: nothing is shared";
  std::vector<float> host(2048, -1.0f);
  SubscriberOptions so;
  so.endpoint = pub->endpoint();
  so.timeout = std::chrono::milliseconds(3000);
  auto sub = testing::NewSubscriber(so, {{"w", {host.data(), DType::kFloat32, {2048}}}});
  EXPECT_STATUS_IS(kNotSupported, sub->Update(), "its own GPU tensors (zero-copy, cuda:0)",
                   "over tcp into host memory");
  EXPECT_EQ(host[0], -1.0f);

  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer small, cuda::DeviceBuffer::Allocate(4096));
  ASSERT_OK_AND_ASSIGN(auto past, Publisher::Create(o));
  ASSERT_OK(past->Register(
      {{"v", {small.as<uint8_t>() + 2048, DType::kFloat32, {1024}, {Device::Kind::kCUDA, 0}}}}));
  EXPECT_STATUS_IS(kInvalidArgument, past->Publish(1), "tensor 'v' (4096 bytes)",
                   "runs past the end of its CUDA allocation");
}

// cudaMalloc memory that ends in a partial 2 MiB page reads at about 0.8x where a subscriber
// opens it by IPC (bench/copy_kernel_probe --src ipc): the publisher says so once, naming the
// first tensor in such an allocation, and says nothing of whole-page allocations or of ones
// smaller than a page.
TEST(ZeroCopyPages, AnAllocationEndingInAPartialPageIsWarnedOfNamingItsTensor) {
  WS_SKIP_WITHOUT_GPU();
  ASSERT_OK(cuda::SetDevice(0));
  auto publish = [](const std::string& stem, const std::vector<const cuda::DeviceBuffer*>& memory) {
    PublisherOptions o;
    o.endpoint = testing::UniqueEndpoint(stem);
    o.zero_copy = true;
    auto pub = Publisher::Create(o);
    if (!pub.ok()) return pub.status();
    std::vector<NamedTensor> tensors;
    for (const cuda::DeviceBuffer* m : memory) {
      const int64_t elements = static_cast<int64_t>(m->size() / 4);
      tensors.push_back({"w" + std::to_string(tensors.size()),
                         {m->data(), DType::kFloat32, {elements}, {Device::Kind::kCUDA, 0}}});
    }
    if (Status s = (*pub)->Register(tensors); !s.ok()) return s;
    return (*pub)->Publish(1).status();
  };
  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer partial, cuda::DeviceBuffer::Allocate((3 << 20) + 4096));
  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer whole, cuda::DeviceBuffer::Allocate(4 << 20));
  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer small, cuda::DeviceBuffer::Allocate(64 << 10));
  {
    testing::LogCapture log;
    ASSERT_OK(publish("zc-pages-whole", {&whole, &small}));
    EXPECT_FALSE(log.Contains("2 MiB pages")) << "whole pages, and a small allocation";
  }
  testing::LogCapture log;
  ASSERT_OK(publish("zc-pages-partial", {&small, &partial, &whole}));
  EXPECT_TRUE(log.Contains("1 of 3 cudaMalloc allocation(s) (" + std::to_string(partial.size()) +
                           " bytes; the first holds tensor 'w1'"));
  EXPECT_TRUE(log.Contains("not a whole number of 2 MiB pages"));
}

// A zero-copy publisher keeps the trainer's cuMem chunks alive while it shares them: the ledger
// counts each chunk it retained once (later publishes retain nothing more), and Close gives every
// one back, so the trainer's free of that memory really frees it.
TEST(ZeroCopyRetained, EveryRetainedChunkIsInTheLedgerUntilClose) {
  WS_SKIP_WITHOUT_GPU();
  ASSERT_OK(cuda::SetDevice(0));
  const LedgerSnapshot before = ReadLedger();
  ASSERT_OK_AND_ASSIGN(cuda::ChunkedAllocation memory, cuda::ChunkedAllocation::Create(0, 8 << 20));
  ASSERT_GE(memory.chunks(), 2u) << "a tensor across several chunks";
  PublisherOptions o;
  o.endpoint = testing::UniqueEndpoint("zc-retained");
  o.zero_copy = true;
  ASSERT_OK_AND_ASSIGN(auto pub, Publisher::Create(o));
  const int64_t elements = static_cast<int64_t>(memory.size() / 4);
  ASSERT_OK(pub->Register(
      {{"w", {memory.data(), DType::kFloat32, {elements}, {Device::Kind::kCUDA, 0}}}}));
  EXPECT_EQ(ReadLedger().retained_allocations, before.retained_allocations) << "nothing yet";
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_OK(pub->Publish(step));
    EXPECT_EQ(ReadLedger().retained_allocations,
              before.retained_allocations + static_cast<int64_t>(memory.chunks()))
        << "step " << step;
  }
  ASSERT_OK(pub->Close());
  EXPECT_EQ(ReadLedger().retained_allocations, before.retained_allocations);
  ASSERT_OK(memory.Close());
  LedgerSnapshot last;
  EXPECT_TRUE(testing::LedgerSettlesTo(before, &last)) << last.ToString();
}

// A publisher's chunk sizes are its word: a chunk smaller than claimed must fail at the import's
// mapping (the driver's check), not fault a later copy; the claimed size mapped, the memory reads
// back what the owner wrote.
TEST(ImportedChunks, AChunkSmallerThanClaimedIsRefusedAndATrueOneReadsBack) {
  WS_SKIP_WITHOUT_GPU();
  ASSERT_OK(cuda::SetDevice(0));
  ASSERT_OK_AND_ASSIGN(cuda::ChunkedAllocation memory, cuda::ChunkedAllocation::Create(0, 2 << 20));
  ASSERT_OK(cuda::MemsetDevice(memory.data(), 0x5A, memory.size()));
  ASSERT_OK_AND_ASSIGN(auto chunk, cuda::VmmChunkAt(memory.data()));
  ASSERT_TRUE(chunk.has_value());
  EXPECT_EQ(chunk->bytes, memory.chunk_bytes());
  ASSERT_OK_AND_ASSIGN(cuda::RetainedChunk retained, cuda::RetainedChunk::Retain(*chunk));
  ASSERT_OK_AND_ASSIGN(util::UniqueFd fd, retained.ExportFd());
  const LedgerSnapshot before = ReadLedger();
  const int fds[] = {fd.get()};
  const uint64_t too_big[] = {2 * chunk->bytes};
  EXPECT_STATUS_IS(kIoError, cuda::ImportedChunks::Import(fds, too_big, 0).status(), "cuMemMap");
  LedgerSnapshot last;
  EXPECT_TRUE(testing::LedgerSettlesTo(before, &last)) << last.ToString();
  const uint64_t exact[] = {chunk->bytes};
  ASSERT_OK_AND_ASSIGN(cuda::ImportedChunks imported, cuda::ImportedChunks::Import(fds, exact, 0));
  std::vector<uint8_t> back(4096);
  ASSERT_OK(
      cuda::CopyToHost(back.data(), imported.data() + chunk->bytes - back.size(), back.size()));
  EXPECT_EQ(back, std::vector<uint8_t>(back.size(), 0x5A));
  ASSERT_OK(imported.Close());
  EXPECT_TRUE(testing::LedgerSettlesTo(before, &last)) << last.ToString();
}

INSTANTIATE_TEST_SUITE_P(
    Modes, ZeroCopy,
    ::testing::Combine(::testing::Values(UpdateMode::kStaged, UpdateMode::kInPlace),
                       ::testing::Values("1", "vmm")),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) == UpdateMode::kStaged ? "staged" : "in_place") +
             (std::string(std::get<1>(info.param)) == "vmm" ? "_cumem" : "_cudamalloc");
    });

}  // namespace
}  // namespace weightsync
