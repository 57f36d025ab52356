// GpuCopyPath (cuda-ipc, cuda-ipc-zero-copy, cuda-ipc-ring): a publisher's GPU store on this
// host into CUDA destinations — the store's view (view/store_view.h) imported once for the
// destinations' device: a GPU arena, a zero-copy publisher's own allocations (one unit serves
// every version: they are the same memory), or a ring of buckets the publisher announces one by
// one. Per unit of a step, one prepared batch of copies (one per planned tensor) into a
// GpuLanding; in place, conversions read an arena's slot directly (optionally on the publisher's
// own GPU).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cuda/kernels.h"
#include "cuda/vmm.h"
#include "plan/plan.h"
#include "transport/link/link.h"
#include "transport/path/data_path.h"
#include "transport/path/gpu_landing.h"
#include "transport/view/store_view.h"
#include "util/deadline.h"
#include "wire/messages.h"

namespace weightsync::transport::path {

class GpuCopyPath final : public DataPath {
 public:
  ~GpuCopyPath() override;
  // Imports the publisher's GPU store for the destinations' device (every destination on one CUDA
  // device) and builds the per-slot copy batches into a GpuLanding. In place, with
  // SubscriberOptions::convert_on_publisher_gpu, the conversions run on the GPU holding the store
  // when this process can use it; the prepare log says where.
  Status Prepare(const PathContext& ctx) override;
  // `verify`: Verify will follow (see GpuLanding::HashConvertedSource).
  Status Copy(const wire::StepBegin& begin, bool verify, const util::Deadline& deadline) override;
  Status Verify(std::span<const uint64_t> digests, int64_t step,
                const util::Deadline& deadline) override {
    return receiver_.Verify(digests, step, deadline);
  }
  Status Commit(const util::Deadline& deadline) override { return receiver_.Commit(deadline); }
  std::string Describe() const override;
  uint64_t staging_bytes() const override { return receiver_.staging_bytes(); }
  ConversionReport conversion() const override {
    ConversionReport r = receiver_.conversion();
    if (r.tensors > 0 && source_device_ >= 0) {
      r.where = ConvertedOn::kPublisherGpu;
      r.device = source_device_;
    }
    return r;
  }
  Status Release() override;  // the landing (digests, staging, stream), then the mapping
  // The device the conversions run on: the publisher's GPU, or -1 for the destinations' one.
  int conversion_source_device() const { return source_device_; }
  int device() const { return receiver_.device(); }

 private:
  std::unique_ptr<view::StoreView> view_;  // the publisher's GPU store, imported or opened
  GpuLanding receiver_;
  size_t conversions_ = 0;
  // Prepared per unit of the store (an arena's slot, the zero-copy tensors, a ring's bucket): the
  // copy batch of every unconverted planned tensor's bytes it holds, and, in place, the
  // conversion launches reading an arena's slot straight from the publisher's GPU over the peer
  // link (bf16 → fp8 moves the published bytes once, writes the fp8 bytes once). On the store's
  // own GPU the small copies go out as one copy-group launch (small_copies,
  // cuda::kCopyGroupBelowBytes).
  struct Batch {
    cuda::CopyBatch copies;
    cuda::PreparedCopyGroup small_copies;
    Conversions conversions;
    const uint8_t* base = nullptr;  // the unit's slot region (view::StoreView::SlotBase)
  };
  std::vector<Batch> unit_batches_;
  // Conversions on the publisher's GPU: its device and a stream there; -1 when they run here.
  int source_device_ = -1;
  cuda::CopyQueue source_queue_;

  Status PrepareSourceGpu(const plan::Plan& plan,
                          const std::vector<plan::Destination>& destinations, int device);
  Status BuildBatches(const wire::Welcome& welcome, const plan::Plan* plan, bool direct);
};

}  // namespace weightsync::transport::path
