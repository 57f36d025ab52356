// GpuToHostPath: a publisher's GPU arena (cuda-ipc, same host) into host destinations.
//
// Prepared once per handle: the arena imported from its fd and mapped for the GPU that holds it,
// a copy stream there, a HostLanding for where the bytes land (the host staging buffer in staged
// mode, the destinations in place, the landing buffer of tensors converted at commit), and those
// landing ranges pinned (cudaHostRegister, page-aligned and merged), so each step is one batch of
// asynchronous device-to-host copies at the link's DMA rate. If any range cannot be pinned (the
// device refuses, or someone else registered part of it: pins are never shared) none is, and the
// copies go through the driver (logged; correct; as fast only where the memory is pinned anyway).
// Verify checks the landed bytes on the CPU against the publisher's GPU digests (the CPU
// implementation of that digest); conversions run at commit with the CPU implementations of the GPU
// transforms.
//
// From a ring of GPU buckets (kCudaRing, PublisherOptions::ring_buckets) the same, a bucket at a
// time: each bucket's copies are one batch, submitted when the publisher announces the bucket and
// answered once they are done (its slot is then refilled). Verify is unchanged: it hashes what
// landed, all of which is still here.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cuda/vmm.h"
#include "plan/plan.h"
#include "transport/path/data_path.h"
#include "transport/path/host_landing.h"
#include "util/deadline.h"
#include "weightsync/options.h"
#include "wire/messages.h"

namespace weightsync::transport::path {

class GpuToHostPath final : public DataPath {
 public:
  ~GpuToHostPath() override;
  Status Available(const PathContext& ctx) override;  // a CUDA device
  // Imports the publisher's GPU store (every destination must be in host memory), prepares the
  // host landing, pins it and builds the per-slot copy batches.
  Status Prepare(const PathContext& ctx) override;
  Status Copy(const wire::StepBegin& begin, bool verify, const util::Deadline& deadline) override;
  Status Verify(std::span<const uint64_t> digests, int64_t step,
                const util::Deadline& /*deadline*/) override {
    return host_.Verify(digests, welcome_->digest_kind, step);
  }
  Status Commit(const util::Deadline& /*deadline*/) override { return host_.Commit(); }
  std::string Describe() const override;
  uint64_t staging_bytes() const override { return host_.staging_bytes(); }
  Status Release() override;  // stream (drained), pins, host landing, then the mapping

 private:
  Status Pin();

  const wire::Welcome* welcome_ = nullptr;
  const plan::Plan* plan_ = nullptr;
  link::Link* link_ = nullptr;  // a ring's buckets are announced and answered on it
  int device_ = -1;             // the GPU whose copy engines move the bytes
  cuda::ImportedAllocation arena_;
  cuda::CopyQueue queue_;
  HostLanding host_;
  std::vector<cuda::HostRegistration> pins_;
  std::string pageable_reason_;  // "" when every landing range is pinned
  // Prepared: per slot, every planned tensor; from a ring (kCudaRing), per bucket of a version.
  std::vector<cuda::CopyBatch> slot_batches_;
};

}  // namespace weightsync::transport::path
