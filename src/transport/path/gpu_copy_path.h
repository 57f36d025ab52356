// GpuCopyPath (cuda-ipc): a publisher's GPU store on this host into CUDA destinations — the
// store imported once from its POSIX fd and mapped for the destinations' device, and per slot the
// prepared batch of copies (one per planned tensor) into a GpuLanding; in place, conversions read
// the publisher's bytes directly (optionally on its own GPU). For a zero-copy publisher
// (cuda-ipc-zero-copy) the "store" is its own allocations, each opened once by IPC handle, and
// one batch reads every version (they are the same memory). From a GPU ring (cuda-ipc-ring) the
// store is a ring of buckets: one prepared batch per bucket of the version, submitted as the
// publisher announces each bucket, its slot released once the batch is done.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "cuda/ipc.h"
#include "cuda/kernels.h"
#include "cuda/vmm.h"
#include "plan/plan.h"
#include "transport/link/link.h"
#include "transport/path/data_path.h"
#include "transport/path/gpu_landing.h"
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
  Status Release() override;  // the landing (digests, staging, stream), then the mapping
  // The device the conversions run on: the publisher's GPU, or -1 for the destinations' one.
  int conversion_source_device() const { return source_device_; }
  int device() const { return receiver_.device(); }

 private:
  cuda::ImportedAllocation arena_;
  // A ring store (ArenaKind::kCudaRing): its buckets stream through the imported ring, announced
  // on the link's channel; the batches are per bucket of the version.
  bool ring_ = false;
  const wire::Welcome* welcome_ = nullptr;
  link::Link* link_ = nullptr;
  // Zero-copy: the publisher's allocations opened here (IPC handles, or cuMem chunks imported from
  // their fds), where each lies in this process, and where it starts in the direct region.
  bool zero_copy_ = false;
  std::vector<cuda::IpcMapping> ipc_mappings_;
  std::vector<cuda::ImportedChunks> chunk_mappings_;
  std::vector<const uint8_t*> allocations_;
  std::vector<uint64_t> allocation_offsets_;
  GpuLanding receiver_;
  int welcome_device_ = -1;  // the publisher's device, in its numbering (for the log)
  size_t conversions_ = 0;
  // Prepared per slot: the copy batch, every unconverted planned tensor's (dst, src, size), and,
  // in place, the conversion launches reading the slot straight from the publisher's GPU over
  // the peer link (bf16 → fp8 moves the published bytes once, writes the fp8 bytes once).
  // On one GPU (the publisher's arena on the destinations' device) the small copies go out as
  // one copy-group launch (small_copies, cuda::kCopyGroupBelowBytes).
  struct Batch {
    cuda::CopyBatch copies;
    cuda::PreparedCopyGroup small_copies;
    Conversions conversions;
    const uint8_t* base = nullptr;
  };
  std::vector<Batch> slot_batches_;
  // Conversions on the publisher's GPU: its device and a stream there; -1 when they run here.
  int source_device_ = -1;
  cuda::CopyQueue source_queue_;

  // `fds`: one per cuMem chunk (link.h); each is closed once imported.
  Status OpenAllocations(const wire::Welcome& welcome, std::vector<util::UniqueFd>* fds,
                         int device);
  Status PrepareSourceGpu(const plan::Plan& plan,
                          const std::vector<plan::Destination>& destinations, int device);
  Status CopyFromRing(const wire::StepBegin& begin, const util::Deadline& deadline);
  Status BuildBatches(const wire::Welcome& welcome, const plan::Plan* plan,
                      const std::vector<plan::Destination>& destinations, bool direct,
                      const std::function<const uint8_t*(uint32_t)>& slot_base);
};

}  // namespace weightsync::transport::path
