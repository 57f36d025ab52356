// Helpers of the GPU tests (tests/gpu, ctest label `gpu`): skip cleanly without a device, move
// vectors to and from device memory.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "cuda/device.h"
#include "testing/test_util.h"

// Skips the test, with the reason, when no CUDA device can be used (no driver, no GPU, or a build
// without CUDA).
#define WS_SKIP_WITHOUT_GPU()                                                               \
  do {                                                                                      \
    if (::weightsync::Status ws_gpu_ = ::weightsync::gpu::CudaAvailable(); !ws_gpu_.ok()) { \
      GTEST_SKIP() << "needs a CUDA device: " << ws_gpu_;                                   \
    }                                                                                       \
  } while (0)

namespace weightsync::gpu::testing {

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

}  // namespace weightsync::gpu::testing
