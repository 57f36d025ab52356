#include "transport/path/tcp_to_gpu_path.h"

#include "cuda/device.h"
#include "util/logging.h"

namespace weightsync::transport::path {

TcpToGpuPath::~TcpToGpuPath() {
  if (Status s = Release(); !s.ok()) WS_LOG(WARN, "tcp") << "path cleanup: " << s;
}

Status TcpToGpuPath::Available(const PathContext& ctx) {
  return cuda::CudaAvailable().WithContext(ctx.link->peer() +
                                           " streams its host store over tcp and the "
                                           "destinations are CUDA tensors");
}

Status TcpToGpuPath::Prepare(const PathContext& ctx) {
  WS_ASSIGN_OR_RETURN(int device, GpuLanding::DestinationDevice(*ctx.destinations, "tcp"));
  plan_ = ctx.plan;
  digest_kind_ = ctx.welcome->digest_kind;
  committed_here_ = false;
  // Staged over the plan whatever the update mode: the mirror keeps what came, whole. Its
  // destinations (CUDA pointers) are never written by it: Commit below is the GPU landing's.
  WS_RETURN_IF_ERROR(
      mirror_.Prepare(plan_, *ctx.destinations, UpdateMode::kStaged, ctx.CopyThreads()));
  cuda::ScopedDevice restore;
  WS_RETURN_IF_ERROR(cuda::SetDevice(device));
  pinned_.Pin(mirror_.shadow(), /*read_only=*/false, device, "the host mirror");
  WS_RETURN_IF_ERROR(receiver_.Prepare(plan_, *ctx.destinations, ctx.mode, device));
  upload_.Clear();
  for (const plan::PlannedTensor& t : plan_->tensors) {
    upload_.Add(receiver_.Received(t), mirror_.ReceivedTensor(t), t.nbytes, t.destination);
  }
  gpu_kind_.assign(plan_->digest_count, 0);  // by digest index, as GpuLanding::Verify reads it
  // The mirror keeps converted tensors' published bytes whole (the GPU converts them at commit
  // from what was copied): deltas fit them too.
  reader_.Prepare(ctx, &mirror_,
                  DeltaReceiver::Fits(*plan_, *ctx.welcome, /*keeps_converted_bytes=*/true));
  return Status::Ok();
}

void TcpToGpuPath::HashSegmentForGpu(void* context, uint32_t index) {
  auto* self = static_cast<TcpToGpuPath*>(context);
  const plan::Segment& s = self->plan_->segments[index];
  self->gpu_kind_[s.digest_index] =
      HostDigest(wire::DigestKind::kGpu64, self->mirror_.ReceivedBytes(s), s.bytes);
}

Status TcpToGpuPath::Copy(const wire::StepBegin& begin, bool verify,
                          const util::Deadline& deadline) {
  committed_here_ = false;  // from the first byte read, the mirror holds neither version
  WS_RETURN_IF_ERROR(reader_.Read(begin, /*observer=*/nullptr, deadline));
  cuda::ScopedDevice restore;
  WS_RETURN_IF_ERROR(cuda::SetDevice(receiver_.device()));
  WS_RETURN_IF_ERROR(receiver_.queue().EnqueueBatch(upload_));
  if (verify) {  // while the copy engines read the mirror, the CPU hashes the same bytes
    mirror_.workers()->Run(static_cast<uint32_t>(plan_->segments.size()),
                           &TcpToGpuPath::HashSegmentForGpu, this);
  }
  WS_RETURN_IF_ERROR(receiver_.queue().Wait(deadline));
  return receiver_.MaybeInjectBitFlip("tcp.flip_uploaded");
}

Status TcpToGpuPath::Verify(std::span<const uint64_t> digests, int64_t step,
                            const util::Deadline& deadline) {
  // First hop: what came over the socket (the deltas applied), against the publisher's digests.
  WS_RETURN_IF_ERROR(mirror_.Verify(digests, digest_kind_, step));
  // Second hop: what landed on the GPU, against the mirror it was copied from.
  cuda::ScopedDevice restore;
  Status s = receiver_.Verify(gpu_kind_, step, deadline);
  if (s.ok()) return s;  // the success path builds no string
  return s.WithContext("the copy to cuda:" + std::to_string(receiver_.device()) +
                       " checked against the host mirror it was copied from");
}

Status TcpToGpuPath::Commit(const util::Deadline& deadline) {
  cuda::ScopedDevice restore;
  WS_RETURN_IF_ERROR(receiver_.Commit(deadline));
  committed_here_ = true;
  return Status::Ok();
}

Status TcpToGpuPath::Release() {
  Status result = reader_.Release();
  committed_here_ = false;
  if (plan_ != nullptr) {
    // Nothing may still read the mirror when it is unpinned: the receiver's stream goes first.
    upload_.Clear();
    {
      cuda::ScopedDevice restore;
      result.Update(receiver_.Release());
    }
    result.Update(pinned_.Close());
  }
  result.Update(mirror_.Release());  // after the unpin
  gpu_kind_.clear();
  plan_ = nullptr;
  if (!result.ok()) WS_LOG(WARN, "tcp") << "release: " << result;
  return result;
}

std::string TcpToGpuPath::Describe() const {
  return ", host mirror of " + std::to_string(mirror_.shadow().size()) +
         " bytes into cuda:" + std::to_string(receiver_.device()) + pinned_.Describe();
}

}  // namespace weightsync::transport::path
