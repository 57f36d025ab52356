// GpuToHostPath: a publisher's GPU arena (cuda-ipc, same host) into host destinations.
//
// Prepared once per handle: the arena imported from its fd and mapped for the GPU that holds it,
// a copy stream there, a HostDataPath for where the bytes land (the host staging buffer in staged
// mode, the destinations in place, the landing buffer of tensors converted at commit), and those
// landing ranges pinned (cudaHostRegister, page-aligned and merged), so each step is one batch of
// asynchronous device-to-host copies at the link's DMA rate. If any range cannot be pinned (the
// device refuses, or someone else registered part of it: pins are never shared) none is, and the
// copies go through the driver (logged; correct; as fast only where the memory is pinned anyway). Verify checks the landed
// bytes on the CPU against the publisher's GPU digests (the CPU implementation of that digest);
// conversions run at commit with the CPU implementations of the GPU transforms.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "plan/plan.h"
#include "transport/cuda_ipc/vmm.h"
#include "transport/host_data_path.h"
#include "util/deadline.h"
#include "weightsync/options.h"
#include "wire/messages.h"

namespace weightsync::transport::cuda_ipc {

class GpuToHostPath {
 public:
  // `arena_fd`: the publisher's exported allocation. Every destination must be in host memory.
  // `threads`: the CPU workers (verify, commit, conversions).
  Status Prepare(int arena_fd, const wire::Welcome& welcome, const plan::Plan* plan,
                 const std::vector<plan::Destination>& destinations, UpdateMode mode,
                 int threads);
  Status Copy(uint32_t slot, const util::Deadline& deadline);
  Status Verify(std::span<const uint64_t> digests, int64_t step) {
    return host_.Verify(digests, welcome_->digest_kind, step);
  }
  Status Commit() { return host_.Commit(); }
  int device() const { return device_; }  // the GPU whose copy engines move the bytes
  bool pinned() const { return pageable_reason_.empty(); }
  std::string_view pageable_reason() const { return pageable_reason_; }
  Status Release();  // stream (drained), pins, host path, then the mapping

 private:
  Status Pin();

  const wire::Welcome* welcome_ = nullptr;
  const plan::Plan* plan_ = nullptr;
  int device_ = -1;
  ImportedAllocation arena_;
  CopyQueue queue_;
  HostDataPath host_;
  std::vector<HostRegistration> pins_;
  std::string pageable_reason_;  // "" when every landing range is pinned
  struct Batch {                 // per slot, prepared: every planned tensor's (dst, src, size)
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
  };
  std::vector<Batch> slot_batches_;
};

}  // namespace weightsync::transport::cuda_ipc
