// Helpers of the GPU tests (tests/gpu, ctest label `gpu`): skip cleanly without a device, move
// vectors to and from device memory.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/vmm.h"
#include "testing/publisher_process.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"

// Skips the test, with the reason, when no CUDA device can be used (no driver, no GPU, or a build
// without CUDA).
#define WS_SKIP_WITHOUT_GPU()                                                                \
  do {                                                                                       \
    if (::weightsync::Status ws_gpu_ = ::weightsync::cuda::CudaAvailable(); !ws_gpu_.ok()) { \
      GTEST_SKIP() << "needs a CUDA device: " << ws_gpu_;                                    \
    }                                                                                        \
  } while (0)

namespace weightsync::cuda::testing {

// Device memory holding `host`, with `slack` spare bytes at the end.
template <typename T>
Result<DeviceBuffer> Upload(const std::vector<T>& host, uint64_t slack = 0) {
  WS_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Allocate(host.size() * sizeof(T) + slack));
  WS_RETURN_IF_ERROR(CopyToDevice(buffer.data(), host.data(), host.size() * sizeof(T)));
  return buffer;
}

template <typename T>
Result<std::vector<T>> Download(const void* device, uint64_t count) {
  std::vector<T> host(count);
  WS_RETURN_IF_ERROR(CopyToHost(host.data(), device, count * sizeof(T)));
  return host;
}

// CUDA destinations on `device` shaped like `like` (names, regions, quantization kept),
// poison-filled (0xFF); the buffers that back
// them go to `keep`. The caller must have made `device` current.
inline Result<std::vector<NamedTensor>> PoisonedDestinations(const std::vector<NamedTensor>& like,
                                                             int device,
                                                             std::vector<DeviceBuffer>* keep) {
  std::vector<NamedTensor> out;
  for (const auto& t : like) {
    WS_ASSIGN_OR_RETURN(uint64_t bytes, t.view.NumBytes());
    WS_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(std::max<uint64_t>(bytes, 1)));
    WS_RETURN_IF_ERROR(MemsetDevice(b.data(), 0xFF, b.size()));
    NamedTensor n = t;  // regions and quantization too
    n.view.data = b.data();
    n.view.device = {Device::Kind::kCUDA, device};
    out.push_back(std::move(n));
    keep->push_back(std::move(b));
  }
  return out;
}

// GPU memory in use on `device` by every process (cudaMemGetInfo), in bytes; the caller's device
// stays current.
inline int64_t UsedBytes(int device) {
  ScopedDevice restore;
  EXPECT_OK(SetDevice(device));
  size_t free_bytes = 0, total = 0;
  EXPECT_OK(MemInfo(&free_bytes, &total));
  return static_cast<int64_t>(total - free_bytes);
}

// A ws_gpu_publisher process of the synthetic model (`tensors` × `elements`) on cuda:0, with
// `env` (WS_TEST_TIMEOUT_MS, WS_TEST_ZERO_COPY, WS_TEST_RING, ...), on a fresh endpoint named
// after `stem`.
inline std::unique_ptr<weightsync::testing::PublisherProcess> StartGpuPublisher(
    int tensors, int64_t elements, std::vector<std::string> env, const std::string& stem) {
  auto p = std::make_unique<weightsync::testing::PublisherProcess>(
      "gpu_publisher",
      std::vector<std::string>{std::to_string(tensors), std::to_string(elements), "0"},
      std::move(env));
  p->Start(weightsync::testing::UniqueEndpoint(stem));
  return p;
}

// The GPU memory on cuda:0 that `publisher` adds across its first publish (its store is made
// then). Call through ASSERT_NO_FATAL_FAILURE.
inline void ExtraAcrossFirstPublish(weightsync::testing::PublisherProcess& publisher,
                                    int64_t* extra) {
  const int64_t before = UsedBytes(0);
  ASSERT_NO_FATAL_FAILURE(publisher.Publish(1));
  *extra = UsedBytes(0) - before;
}

// A verifying subscriber of `endpoint` in `mode` (10 s timeout) into poisoned CUDA destinations
// on `device` shaped like `like`: the views go to `dst`, their buffers to `keep`.
inline std::unique_ptr<Subscriber> ConnectVerifying(const std::string& endpoint, UpdateMode mode,
                                                    const std::vector<NamedTensor>& like,
                                                    int device, std::vector<NamedTensor>* dst,
                                                    std::vector<DeviceBuffer>* keep) {
  auto poisoned = PoisonedDestinations(like, device, keep);
  EXPECT_OK(poisoned);
  *dst = std::move(poisoned).value();
  SubscriberOptions o;
  o.endpoint = endpoint;
  o.mode = mode;
  o.verify = true;
  o.timeout = std::chrono::milliseconds(10000);
  return weightsync::testing::NewSubscriber(o, *dst);
}

// Downloads every CUDA destination in `dst` and checks it holds the synthetic model (shaped like
// `like`) at `step`.
inline bool DestinationsHold(const std::vector<NamedTensor>& dst,
                             const std::vector<NamedTensor>& like, int64_t step, std::string* why) {
  std::vector<std::vector<uint8_t>> host;
  for (const auto& d : dst) {
    host.emplace_back(*d.view.NumBytes());
    if (!CopyToHost(host.back().data(), d.view.data, host.back().size()).ok()) {
      *why = "download of '" + d.name + "' failed";
      return false;
    }
  }
  return weightsync::testing::SyntheticModel::Holds(
      weightsync::testing::SyntheticModel::Views(like, host), step, why);
}

// Updates `sub` to steps 1..`steps` (`publish(step)` first makes each available), with a Sleep
// after each: every update prepares again and pins host memory (the ledger's pinned_bytes rises
// above `before`), every Sleep returns the ledger to `before`. Call through
// ASSERT_NO_FATAL_FAILURE.
inline void SleepWakeCyclesPinAndReturnToBaseline(Subscriber& sub, int64_t steps,
                                                  const LedgerSnapshot& before,
                                                  const std::function<void(int64_t)>& publish) {
  for (int64_t step = 1; step <= steps; ++step) {
    publish(step);
    auto r = sub.Update();
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->prepare_count, static_cast<uint64_t>(step));
    ASSERT_GT(ReadLedger().pinned_bytes, before.pinned_bytes) << "step " << step;
    ASSERT_OK(sub.Sleep());
    LedgerSnapshot now;
    ASSERT_TRUE(weightsync::testing::LedgerSettlesTo(before, &now))
        << "after sleep " << step << ": " << now.ToString() << " vs " << before.ToString();
  }
}

}  // namespace weightsync::cuda::testing
