// GpuToHostPath (gpu-to-host, gpu-to-host-ring): a publisher's GPU store (same host) into host
// destinations.
//
// Prepared once per handle: the store's view (view/store_view.h: an arena, or a ring of buckets
// the publisher announces one by one) imported from its fd and mapped for the GPU that holds it,
// a copy stream there, a HostLanding for where the bytes land (the host staging buffer in staged
// mode, the destinations in place, the landing buffer of tensors converted at commit), and those
// landing ranges pinned (cudaHostRegister, page-aligned and merged), so each unit of a step (the
// slot, or a ring's bucket) is one batch of asynchronous device-to-host copies at the link's DMA
// rate, done before the unit is answered. If any range cannot be pinned (the device refuses, or
// someone else registered part of it: pins are never shared) none is, and the copies go through
// the driver (logged; correct; as fast only where the memory is pinned anyway). Verify checks the
// landed bytes on the CPU against the publisher's GPU digests (the CPU implementation of that
// digest); conversions run at commit with the CPU implementations of the GPU transforms.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cuda/vmm.h"
#include "plan/plan.h"
#include "transport/path/data_path.h"
#include "transport/path/host_landing.h"
#include "transport/view/store_view.h"
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
  ConversionReport conversion() const override { return host_.conversion(); }
  Status Release() override;  // stream (drained), pins, host landing, then the mapping

 private:
  Status Pin();

  const wire::Welcome* welcome_ = nullptr;
  const plan::Plan* plan_ = nullptr;
  int device_ = -1;                        // the GPU whose copy engines move the bytes
  std::unique_ptr<view::StoreView> view_;  // the publisher's GPU store, imported
  cuda::CopyQueue queue_;
  HostLanding host_;
  std::vector<cuda::HostRegistration> pins_;
  std::string pageable_reason_;                // "" when every landing range is pinned
  std::vector<cuda::CopyBatch> unit_batches_;  // per unit of the view (a slot, a ring's bucket)
};

}  // namespace weightsync::transport::path
