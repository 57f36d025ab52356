// The demo's tensors on the device a process was told to use: the trainer's weights (publisher)
// or the engine's destinations (subscriber), in host memory or in CUDA memory on one device.
// Host memory always backs them too: the step's pattern is written there and copied up, and a
// subscriber's CUDA tensors are copied back there to be checked against the expected digests.
#pragma once

#include <string>
#include <vector>

#include "harness/tensor_storage.h"
#include "weightsync/cuda.h"
#include "weightsync/manifest.h"
#include "weightsync/tensor_view.h"

namespace weightsync::tools {

// "cpu", "cuda" (device 0) or "cuda:N"; `flag` names the flag in the error.
Result<Device> ParseDemoDevice(const std::string& flag, const std::string& text);

class DemoTensors {
 public:
  // Every byte starts as `fill`. On a CUDA device, fails with CUDA's reason when the memory
  // cannot be had (no device, out of memory).
  static Result<DemoTensors> Create(const std::vector<TensorSpec>& tensors, Device device,
                                    uint8_t fill);
  DemoTensors(DemoTensors&&) = default;

  std::vector<NamedTensor> Views() const;
  size_t size() const { return host_.size(); }
  const Device& device() const { return device_; }

  // Writes step `step`'s pattern into every tensor.
  Status Fill(int64_t step);
  // Counts the tensors whose bytes differ from step `step`'s pattern; `first_bad` names the
  // first.
  Result<size_t> CountWrong(int64_t step, std::string* first_bad);

 private:
  DemoTensors(const std::vector<TensorSpec>& tensors, Device device, uint8_t fill);

  const std::vector<TensorSpec>* tensors_;
  Device device_;
  bench::TensorStorage host_;
  DeviceMemory gpu_;               // empty on the CPU
  std::vector<uint64_t> offsets_;  // of each tensor in gpu_
};

}  // namespace weightsync::tools
