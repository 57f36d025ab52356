// TcpToGpuPath (tcp-to-gpu): a publisher's host store on another host (or this one) into CUDA
// destinations over tcp — the engine on a GPU, the trainer's store across the network.
//
// The step crosses the socket into a host mirror: a buffer laid out as the plan's shadow, pinned
// once (cudaHostRegister), that keeps the last version received whole whatever the update mode.
// Whole, the bytes are read straight into it (one scatter-gather read); as deltas
// (docs/deltas.md), each one is applied onto it on the CPU — the mirror holds the base, so deltas
// work in both modes and with conversions the GPU runs at commit. Then one prepared batch of
// host-to-device copies moves the mirror into a GpuLanding (staging on the GPU, or the
// destinations in place; conversions at commit) on the receiver's stream, waited for with the
// deadline. So the wire carries what changed, and PCIe the whole model (a GPU apply of the deltas
// would move only what changed: docs/deltas.md, "Next increments").
//
// Verification checks both hops: the mirror against the publisher's digests (what came over the
// socket, deltas applied), and what landed on the GPU against the GPU digest of the mirror,
// hashed by the CPU workers while the copy engines read it.
//
// Memory: the mirror is the plan's size in host memory, pinned, held from Prepare to Release
// (counted in staging_bytes with the GPU landing's staging and the delta buffer).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cuda/copy_batch.h"
#include "cuda/vmm.h"
#include "plan/plan.h"
#include "transport/path/data_path.h"
#include "transport/path/gpu_landing.h"
#include "transport/path/host_landing.h"
#include "transport/path/tcp_step_reader.h"
#include "util/deadline.h"
#include "wire/messages.h"

namespace weightsync::transport::path {

class TcpToGpuPath final : public DataPath {
 public:
  ~TcpToGpuPath() override;
  Status Available(const PathContext& ctx) override;  // a CUDA device
  // Allocates and pins the mirror, prepares the landing on the destinations' device (every
  // destination on one CUDA device) and the mirror → landing copy batch.
  Status Prepare(const PathContext& ctx) override;
  // Reads the step into the mirror, then copies it to the GPU; with `verify` the workers hash the
  // mirror with the GPU digest while it is copied.
  Status Copy(const wire::StepBegin& begin, bool verify, const util::Deadline& deadline) override;
  Status Verify(std::span<const uint64_t> digests, int64_t step,
                const util::Deadline& deadline) override;
  Status Commit(const util::Deadline& deadline) override;
  // The mirror holds the committed version when this handle committed the last step it copied
  // (and took no step since): deltas apply to it, whatever the mode and whatever the GPU does at
  // commit. Regions and partial tensors take whole steps (DeltaReceiver::Fits).
  bool AcceptsDeltas() const override { return reader_.AcceptsDeltas(committed_here_); }
  void ExpectDeltas(int64_t base_step, std::span<const uint64_t> base_digests) override {
    reader_.ExpectDeltas(base_step, base_digests);
  }
  DeltaReceipt delta_receipt() const override { return reader_.receipt(); }
  std::string Describe() const override;
  uint64_t staging_bytes() const override {
    return mirror_.staging_bytes() + reader_.deltas().buffer_bytes() + receiver_.staging_bytes();
  }
  ConversionReport conversion() const override { return receiver_.conversion(); }  // the GPU's
  Status Release() override;  // the delta buffer, the landing (stream first), the pin, the mirror

 private:
  static void HashSegmentForGpu(void* context, uint32_t index);

  const plan::Plan* plan_ = nullptr;
  wire::DigestKind digest_kind_ = wire::DigestKind::kXxh3;
  HostLanding mirror_;  // staged over the plan, always: the last version received, whole
  TcpStepReader reader_;
  HostPin pinned_;  // the mirror
  GpuLanding receiver_;
  cuda::CopyBatch upload_;          // prepared: every planned tensor, mirror → landing
  std::vector<uint64_t> gpu_kind_;  // the mirror's GPU digests, by digest index (verify)
  bool committed_here_ = false;
};

}  // namespace weightsync::transport::path
