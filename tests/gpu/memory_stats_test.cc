// The extra GPU memory each side holds, as the stats and the ledger report it (issue 16): the
// ledger's device_bytes counts every DeviceBuffer and exported cuMem allocation until it is
// closed, not the caller's DeviceMemory; a GPU publisher's PublishStats::store_bytes is its
// arena's slots or its ring's buckets on its device (store_device), 0 for zero-copy; a
// subscriber's UpdateStats::staging_bytes is its device (or host) staging on every GPU path,
// exactly its share of the ledger's staging_bytes; all of it back at the baseline after Close or
// Sleep. Publisher and subscriber in this process, on cuda:0.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/vmm.h"
#include "gpu/gpu_test_util.h"
#include "util/fail_point.h"
#include "weightsync/cuda.h"

namespace weightsync {
namespace {

using testing::SyntheticModel;

constexpr uint64_t kMiB = 1 << 20;

TEST(GpuDeviceBytes, BuffersAndExportedAllocationsAreCountedUntilClosedTheCallersAreNot) {
  WS_SKIP_WITHOUT_GPU();
  ASSERT_OK(cuda::SetDevice(0));
  const LedgerSnapshot baseline = ReadLedger();
  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer buffer, cuda::DeviceBuffer::Allocate(kMiB + 8));
  EXPECT_EQ(ReadLedger().device_bytes - baseline.device_bytes, static_cast<int64_t>(kMiB + 8));
  ASSERT_OK_AND_ASSIGN(cuda::ExportedAllocation arena, cuda::ExportedAllocation::Create(0, kMiB));
  EXPECT_GE(arena.size(), kMiB);
  EXPECT_EQ(ReadLedger().device_bytes - baseline.device_bytes,
            static_cast<int64_t>(kMiB + 8 + arena.size()));
  ASSERT_OK(arena.Close());
  ASSERT_OK(buffer.Close());
  EXPECT_TRUE(ReadLedger().SameLiveCounts(baseline)) << ReadLedger().ToString();
  // Memory handed to the caller is the caller's: not weightsync's to count.
  ASSERT_OK_AND_ASSIGN(DeviceMemory caller, DeviceMemory::Allocate(0, 4096));
  EXPECT_EQ(ReadLedger().device_bytes, baseline.device_bytes) << "DeviceMemory was counted";
  ASSERT_OK(caller.Close());
  EXPECT_TRUE(ReadLedger().SameLiveCounts(baseline)) << ReadLedger().ToString();
}

enum class Store { kHostArena, kGpuArena, kGpuRing, kZeroCopy, kHostRing };
bool HostTensors(Store s) { return s == Store::kHostArena || s == Store::kHostRing; }
enum class Into { kHost, kCuda };
struct Param {
  Store store;
  Into into;
  UpdateMode mode;
};

// A publisher of the synthetic model (host tensors, or CUDA tensors on cuda:0 in `store`) and one
// subscriber into host or CUDA destinations.
class GpuMemoryStats : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    WS_SKIP_WITHOUT_GPU();
    ASSERT_OK(cuda::SetDevice(0));
    const Param p = GetParam();
    like_ = model_.Tensors();
    tensors_ = like_;
    if (!HostTensors(p.store)) {  // the model uploaded to cuda:0 at each publish
      for (NamedTensor& t : tensors_) {
        ASSERT_OK_AND_ASSIGN(uint64_t bytes, t.view.NumBytes());
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer b, cuda::DeviceBuffer::Allocate(bytes));
        t.view.data = b.data();
        t.view.device = {Device::Kind::kCUDA, 0};
        sources_.push_back(std::move(b));
      }
    }
    if (p.into == Into::kCuda) {
      ASSERT_OK_AND_ASSIGN(dst_, cuda::testing::PoisonedDestinations(like_, 0, &dst_buffers_));
    } else {
      host_dst_ = SyntheticModel::PoisonedStorage(like_);
      dst_ = SyntheticModel::Views(like_, host_dst_);
    }
    baseline_ = ReadLedger();  // every tensor allocated: what the test itself holds
    PublisherOptions o;
    o.endpoint = testing::UniqueEndpoint("gpumem");
    o.timeout = std::chrono::milliseconds(10000);
    o.slots = 2;
    if (p.store == Store::kGpuRing || p.store == Store::kHostRing) {
      o.ring_buckets = 2;
      o.ring_bucket_bytes = kMiB;
    }
    o.zero_copy = p.store == Store::kZeroCopy;
    ASSERT_OK_AND_ASSIGN(pub_, Publisher::Create(o));
    ASSERT_OK(pub_->Register(tensors_));
  }
  Result<PublishStats> Publish(int64_t step) {
    WS_RETURN_IF_ERROR(pub_->BeginWrite());
    model_.Fill(step);
    for (size_t i = 0; i < sources_.size(); ++i) {
      WS_RETURN_IF_ERROR(
          cuda::CopyToDevice(sources_[i].data(), like_[i].view.data, sources_[i].size()));
    }
    return pub_->Publish(step);
  }
  // A verified subscriber of the row's mode into the row's destinations.
  std::unique_ptr<Subscriber> Connect() {
    SubscriberOptions so;
    so.endpoint = pub_->endpoint();
    so.mode = GetParam().mode;
    so.verify = true;
    so.timeout = std::chrono::milliseconds(10000);
    return testing::NewSubscriber(so, dst_);
  }
  std::string Holds(int64_t step) {
    std::string why;
    const bool holds = GetParam().into == Into::kCuda
                           ? cuda::testing::DestinationsHold(dst_, like_, step, &why)
                           : SyntheticModel::Holds(dst_, step, &why);
    return holds ? "" : why;
  }

  SyntheticModel model_{8, 1 << 18};
  std::vector<NamedTensor> like_, tensors_, dst_;
  std::vector<cuda::DeviceBuffer> sources_, dst_buffers_;
  std::vector<std::vector<uint8_t>> host_dst_;
  LedgerSnapshot baseline_;
  std::unique_ptr<Publisher> pub_;
};

TEST_P(GpuMemoryStats, StoreAndStagingAreReportedCountedAndGiveBack) {
  const Param p = GetParam();
  const uint64_t total = model_.total_bytes();
  ASSERT_GT(total, 4 * kMiB) << "the model must outgrow the ring";
  ASSERT_OK_AND_ASSIGN(PublishStats published, Publish(1));
  const LedgerSnapshot published_ledger = ReadLedger();
  switch (p.store) {
    case Store::kHostArena:
      EXPECT_EQ(published.store_device, -1);
      EXPECT_GE(published.store_bytes, 2 * total);
      break;
    case Store::kGpuArena:
      EXPECT_EQ(published.store_device, 0);
      EXPECT_GE(published.store_bytes, 2 * total);
      EXPECT_EQ(published.store_bytes % (2 * kMiB), 0u) << "slots of whole 2 MiB";
      EXPECT_LE(published.store_bytes, 2 * (total + 2 * kMiB) + 2 * kMiB);
      break;
    case Store::kGpuRing:
      EXPECT_EQ(published.store_device, 0);
      EXPECT_GE(published.store_bytes, 2 * kMiB);
      EXPECT_LE(published.store_bytes, 2 * kMiB + 2 * kMiB) << "2 buckets + the cuMem granularity";
      break;
    case Store::kHostRing:
      EXPECT_EQ(published.store_device, -1);
      EXPECT_GE(published.store_bytes, 2 * kMiB);
      EXPECT_LE(published.store_bytes, 4 * kMiB) << "2 buckets, not the model";
      break;
    case Store::kZeroCopy:
      EXPECT_EQ(published.store_device, 0);
      EXPECT_EQ(published.store_bytes, 0u) << "the version is the registered tensors";
      // Its subscribers open the publisher's allocations by CUDA IPC handle, which a process
      // cannot do with its own (zero_copy_test.cc runs them in a child): the store only.
      ASSERT_OK(pub_->Close());
      LedgerSnapshot last;
      EXPECT_TRUE(testing::LedgerSettlesTo(baseline_, &last))
          << "after Close: " << last.ToString() << " vs " << baseline_.ToString();
      return;
  }
  if (!HostTensors(p.store)) {
    // The store (and its digest scratch) is GPU memory of weightsync's.
    EXPECT_GE(published_ledger.device_bytes - baseline_.device_bytes,
              static_cast<int64_t>(published.store_bytes));
  }

  auto sub = Connect();
  ASSERT_OK_AND_ASSIGN(UpdateStats first, sub->Update());
  EXPECT_EQ(Holds(1), "");
  const LedgerSnapshot held = ReadLedger();
  if (p.mode == UpdateMode::kStaged) {
    EXPECT_GE(first.staging_bytes, total)
        << first.path << ": the path does not report its landing's staging";
  } else {
    EXPECT_EQ(first.staging_bytes, 0u) << first.path;
  }
  EXPECT_EQ(static_cast<int64_t>(first.staging_bytes),
            held.staging_bytes - published_ledger.staging_bytes)
      << first.path << ": not this subscriber's share of the ledger";
  if (p.into == Into::kCuda && p.mode == UpdateMode::kStaged) {
    EXPECT_GE(held.device_bytes - published_ledger.device_bytes,
              static_cast<int64_t>(first.staging_bytes))
        << first.path << ": device staging not in device_bytes";
  }
  ASSERT_OK_AND_ASSIGN(PublishStats second, Publish(2));
  EXPECT_EQ(second.store_bytes, published.store_bytes);
  ASSERT_OK_AND_ASSIGN(UpdateStats steady, sub->Update());
  EXPECT_FALSE(steady.handle_created);
  EXPECT_EQ(steady.staging_bytes, first.staging_bytes);
  EXPECT_EQ(Holds(2), "");

  ASSERT_OK(sub->Sleep());
  LedgerSnapshot last;
  EXPECT_TRUE(testing::LedgerSettlesTo(published_ledger, &last))
      << "after Sleep: " << last.ToString() << " vs " << published_ledger.ToString();
  ASSERT_OK(sub->Close());
  ASSERT_OK(pub_->Close());
  EXPECT_TRUE(testing::LedgerSettlesTo(baseline_, &last))
      << "after Close: " << last.ToString() << " vs " << baseline_.ToString();
}

// A first Publish that fails after the store was made (fail point publisher.freeze) gives back
// what that store allocated — a GPU arena or ring, a host ring — at once; the host arena stays
// (it holds Allocate()d tensors). The retry makes it again and delivers.
TEST_P(GpuMemoryStats, AFailedFirstPublishGivesTheStoreBackAtOnce) {
  const Param p = GetParam();
  const LedgerSnapshot before = ReadLedger();  // the publisher made, nothing published
  util::FailPoints::DisarmAll();
  util::FailPoints::Arm("publisher.freeze", util::FailAction::kError, 0, 1);
  ASSERT_STATUS_IS(kInternal, Publish(1));
  ASSERT_EQ(util::FailPoints::Hits("publisher.freeze"), 1) << "fault never injected";
  util::FailPoints::DisarmAll();
  const LedgerSnapshot failed = ReadLedger();
  if (p.store != Store::kHostArena) {
    EXPECT_EQ(failed.device_bytes, before.device_bytes)
        << failed.ToString() << " vs " << before.ToString();
    EXPECT_EQ(failed.mapped_bytes, before.mapped_bytes)
        << failed.ToString() << " vs " << before.ToString();
  }
  ASSERT_OK(Publish(1).status());
  if (p.store == Store::kZeroCopy) return;  // its subscribers run in a child (zero_copy_test.cc)
  auto sub = Connect();
  ASSERT_OK(sub->Update().status());
  EXPECT_EQ(Holds(1), "");
}

std::string Name(const ::testing::TestParamInfo<Param>& info) {
  const char* store[] = {"host_arena", "gpu_arena", "gpu_ring", "zero_copy", "host_ring"};
  return std::string(store[static_cast<int>(info.param.store)]) +
         (info.param.into == Into::kCuda ? "_into_cuda" : "_into_host") +
         (info.param.mode == UpdateMode::kStaged ? "_staged" : "_in_place");
}

// Every GPU path one process can serve itself: host-to-gpu, gpu-to-host, cuda-ipc,
// cuda-ipc-ring, host-to-gpu-ring and gpu-to-host-ring, staged and in place; the zero-copy
// store's figures.
INSTANTIATE_TEST_SUITE_P(
    Paths, GpuMemoryStats,
    ::testing::Values(Param{Store::kHostArena, Into::kCuda, UpdateMode::kStaged},
                      Param{Store::kHostArena, Into::kCuda, UpdateMode::kInPlace},
                      Param{Store::kGpuArena, Into::kHost, UpdateMode::kStaged},
                      Param{Store::kGpuArena, Into::kHost, UpdateMode::kInPlace},
                      Param{Store::kGpuArena, Into::kCuda, UpdateMode::kStaged},
                      Param{Store::kGpuArena, Into::kCuda, UpdateMode::kInPlace},
                      Param{Store::kGpuRing, Into::kCuda, UpdateMode::kStaged},
                      Param{Store::kGpuRing, Into::kCuda, UpdateMode::kInPlace},
                      Param{Store::kGpuRing, Into::kHost, UpdateMode::kStaged},
                      Param{Store::kGpuRing, Into::kHost, UpdateMode::kInPlace},
                      Param{Store::kHostRing, Into::kCuda, UpdateMode::kStaged},
                      Param{Store::kHostRing, Into::kCuda, UpdateMode::kInPlace},
                      Param{Store::kZeroCopy, Into::kCuda, UpdateMode::kStaged}),
    Name);

// Converted tensors on the GPU landings (host-to-gpu and cuda-ipc into CUDA destinations, in
// place and staged): fp32 'w' converted to bf16, uint8 'x' copied as is. In place, the host
// landing stages the published bytes of the converted tensor only (its landing buffer), and the
// cuda-ipc landing none (the mover converts straight from the publisher's mapped arena); staged,
// both tensors' published bytes. Each figure is exactly the ledger's delta, gone after Close.
TEST(GpuStagingConverted, InPlaceTheLandingOfConvertedTensorsOnly) {
  WS_SKIP_WITHOUT_GPU();
  ASSERT_OK(cuda::SetDevice(0));
  constexpr uint64_t kW = 1024, kX = 4096;  // elements
  std::vector<float> w(kW, 1.5f);
  std::vector<uint8_t> x(kX, 7);
  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer w_gpu, cuda::testing::Upload(w));
  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer x_gpu, cuda::testing::Upload(x));
  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer w_dst, cuda::DeviceBuffer::Allocate(kW * 2));
  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer x_dst, cuda::DeviceBuffer::Allocate(kX));
  const Device gpu{Device::Kind::kCUDA, 0};
  const std::vector<NamedTensor> dst = {
      {"w", {w_dst.data(), DType::kBFloat16, {static_cast<int64_t>(kW)}, gpu}},
      {"x", {x_dst.data(), DType::kUInt8, {static_cast<int64_t>(kX)}, gpu}}};
  for (const bool gpu_publisher : {false, true}) {
    PublisherOptions po;
    po.endpoint = testing::UniqueEndpoint("gpuconv");
    po.timeout = std::chrono::milliseconds(10000);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Publisher> pub, Publisher::Create(po));
    if (gpu_publisher) {
      ASSERT_OK(
          pub->Register({{"w", {w_gpu.data(), DType::kFloat32, {static_cast<int64_t>(kW)}, gpu}},
                         {"x", {x_gpu.data(), DType::kUInt8, {static_cast<int64_t>(kX)}, gpu}}}));
    } else {
      ASSERT_OK(pub->Register({{"w", {w.data(), DType::kFloat32, {static_cast<int64_t>(kW)}}},
                               {"x", {x.data(), DType::kUInt8, {static_cast<int64_t>(kX)}}}}));
    }
    ASSERT_OK(pub->Publish(1).status());
    for (UpdateMode mode : {UpdateMode::kInPlace, UpdateMode::kStaged}) {
      const std::string row = std::string(gpu_publisher ? "cuda-ipc" : "host-to-gpu") +
                              (mode == UpdateMode::kInPlace ? ", in place" : ", staged");
      ASSERT_OK(cuda::MemsetDevice(w_dst.data(), 0xFF, w_dst.size()));
      SubscriberOptions so;
      so.endpoint = pub->endpoint();
      so.mode = mode;
      so.convert_dtypes = true;
      so.verify = true;
      so.timeout = std::chrono::milliseconds(10000);
      const int64_t baseline = ReadLedger().staging_bytes;
      auto sub = testing::NewSubscriber(so, dst);
      ASSERT_NE(sub, nullptr) << row;
      ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub->Update());
      EXPECT_EQ(stats.path, gpu_publisher ? "cuda-ipc" : "host-to-gpu") << row;
      if (mode == UpdateMode::kStaged) {
        EXPECT_GE(stats.staging_bytes, kW * 4 + kX) << row << ": both tensors' published bytes";
      } else if (gpu_publisher) {
        EXPECT_EQ(stats.staging_bytes, 0u) << row << ": converted from the mapped arena";
      } else {
        EXPECT_GE(stats.staging_bytes, kW * 4) << row << ": the landing of 'w'";
        EXPECT_LT(stats.staging_bytes, kW * 4 + kX) << row << ": 'x' lands in place";
      }
      EXPECT_EQ(static_cast<int64_t>(stats.staging_bytes), ReadLedger().staging_bytes - baseline)
          << row;
      ASSERT_OK_AND_ASSIGN(std::vector<uint16_t> got,
                           cuda::testing::Download<uint16_t>(w_dst.data(), kW));
      EXPECT_EQ(got.front(), 0x3FC0) << row << ": 1.5 in bfloat16";
      EXPECT_EQ(got.back(), 0x3FC0) << row;
      ASSERT_OK(sub->Close());
      EXPECT_EQ(ReadLedger().staging_bytes, baseline) << row;
    }
    ASSERT_OK(pub->Close());
  }
}

}  // namespace
}  // namespace weightsync
