// GpuLanding: where a step's bytes land on the subscriber's GPU, whatever moves them there
// (cuda-ipc copies from the publisher's imported store, host-to-GPU copies, or NCCL receives): a
// device staging buffer (staged mode) or the destinations themselves (in place), the prepared GPU
// digests of every plan segment over those bytes (one grouped launch pair), and the prepared
// commit (a copy batch and the conversions), all on a dedicated stream waited for by event with a
// deadline. Prepared once; a step allocates nothing. The GPU paths' shared landing code, as
// host_landing.h is the host paths'.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cuda/block_scaled_kernels.h"
#include "cuda/device.h"
#include "cuda/kernels.h"
#include "cuda/vmm.h"
#include "plan/plan.h"
#include "transport/path/data_path.h"
#include "util/deadline.h"
#include "weightsync/options.h"
#include "wire/messages.h"

namespace weightsync::transport::path {

// A step's conversions, prepared once over fixed pointers: one cast launch per cast tensor (or
// cast piece), one grouped launch (cuda::PrepareQuantizeFp8Group) for every fp8 tensor, so the
// quantization runs as a single grid and no tensor waits for the previous one's tail, and one copy
// batch for the same-dtype pieces of kExtract tensors (a verified digest segment the subscriber
// wants only part of, or scattered over several destinations: plan.h).
class Conversions {
 public:
  // Adds planned tensor `t` of `plan` (a cast, a quantization or a kExtract) reading `src`
  // (where its published bytes are). `destinations`: every destination's base address by plan
  // index; `names` (same indices) label errors. A cast or kExtract writes at its dst_offset.
  Status Add(const plan::Plan& plan, const plan::PlannedTensor& t, const uint8_t* src,
             std::span<uint8_t* const> destinations, std::span<const std::string> names,
             cuda::StreamHandle stream);
  Status Finish(cuda::StreamHandle stream);  // prepares the grouped fp8 and block-scaled launches
  // Submits everything on `queue` (whose stream the launches were prepared on).
  Status Launch(cuda::CopyQueue& queue);
  bool empty() const {
    return casts_.empty() && fp8_.empty() && fp8_tensors_.empty() && block_scaled_.empty() &&
           block_scaled_tensors_.empty() && copies_.empty();
  }
  void Clear();

 private:
  Status AddCast(DType from, DType to, const uint8_t* src, uint8_t* dst, uint64_t elements,
                 std::string_view what, std::string_view name, cuda::StreamHandle stream);

  std::vector<cuda::PreparedLaunch> casts_;
  std::vector<cuda::Fp8GroupTensor> fp8_tensors_;
  cuda::PreparedFp8Group fp8_;
  std::vector<cuda::BlockScaledTensor> block_scaled_tensors_;  // MXFP8, NVFP4 (one group)
  std::vector<std::string> block_scaled_names_;                // same order: errors name them
  cuda::PreparedBlockScaledGroup block_scaled_;
  cuda::CopyBatch copies_;  // kExtract pieces of the published dtype
};

// Host memory the copy engines of a path read (a store mapped here, a mirror), pinned once per
// handle, or left pageable with the reason: the copies then go through the driver's bounce
// buffers (slower), and the prepare line says why.
class HostPin {
 public:
  // Pins `memory` for the current device (`device`, for the log line); `what` names it there
  // ("the arena", "the host mirror"). Never fails: pageable memory still works.
  void Pin(std::span<const uint8_t> memory, bool read_only, int device, std::string_view what);
  // " from pinned memory", or " from pageable memory (why)": the path's Describe() ends with it.
  std::string Describe() const;
  Status Close();  // unpins; nothing may read the memory any more

 private:
  cuda::HostRegistration registration_;
  std::string pageable_reason_;  // "" when pinned
};

// Every destination index planned tensor `t` writes (its destination, an fp8 scale destination,
// a kExtract's pieces' destinations), in plan order; duplicates possible.
std::vector<uint32_t> WrittenDestinations(const plan::Plan& plan, const plan::PlannedTensor& t);

class GpuLanding {
 public:
  // The one CUDA device every destination is on. InvalidArgument names the first destination
  // that is not on a CUDA device, or on another one ("<transport>: destination 'x' is on cpu").
  static Result<int> DestinationDevice(const std::vector<plan::Destination>& destinations,
                                       std::string_view transport);

  // Creates the stream, the staging buffer (staged mode), the digest launches and the commit
  // batch on `device` (DestinationDevice's answer).
  // `converted_source` (in place only): the mover converts tensors straight from the publisher's
  // bytes, mapped here (slot base; segments at base + src_offset), so nothing lands for them and
  // Commit converts nothing; their digests hash those bytes (SetConvertedSource per step).
  Status Prepare(const plan::Plan* plan, const std::vector<plan::Destination>& destinations,
                 UpdateMode mode, int device, const uint8_t* converted_source = nullptr);
  // Points the converted segments' digests at this step's source bytes (no allocation) and
  // launches them now, on the stream, while the publisher still pins the step; Verify then only
  // launches the other segments' digests and compares.
  Status HashConvertedSource(const uint8_t* base);
  // Moves those digest launches to `stream` (another device's: the publisher's GPU hashes its own
  // memory; the chunk hashes and digests still land in this receiver's buffers, over peer access).
  void SetConvertedDigestStream(cuda::StreamHandle stream);
  // Where tensor `t`'s bytes must land: its place in the staging buffer; in place, its
  // destination, or the landing buffer when it is converted at commit.
  uint8_t* Received(const plan::PlannedTensor& t) const;
  uint8_t* Received(const plan::Segment& s) const;
  // The stream the digests and the commit run on (mover copies may run on it too).
  cuda::CopyQueue& queue() { return queue_; }
  // Test hook (fail point `point`): flips one received bit.
  Status MaybeInjectBitFlip(const char* point = "subscriber.flip_received");
  Status Verify(std::span<const uint64_t> digests, int64_t step, const util::Deadline& deadline);
  // Staged: staging → destinations. Both modes: the prepared conversion launches.
  Status Commit(const util::Deadline& deadline);
  int device() const { return device_; }
  // Every destination's base address and name, by plan destination index.
  std::span<uint8_t* const> destination_bases() const { return destinations_; }
  std::span<const std::string> names() const { return names_; }
  // Device bytes of the staging buffer (staged) and of the landing buffer (in place, tensors
  // converted at commit): what Prepare added to the ledger's staging_bytes.
  uint64_t staging_bytes() const { return shadow_.size() + landing_.size(); }
  // The plan's conversions, on this landing's device (DataPath::conversion; a path converting on
  // the publisher's GPU says so itself).
  ConversionReport conversion() const;
  Status Release();  // digests, staging, stream

 private:
  Status PrepareConversions();

  const plan::Plan* plan_ = nullptr;
  const uint8_t* converted_source_ = nullptr;  // see Prepare; null: converted at Commit
  std::vector<uint8_t*> destinations_;
  std::vector<std::string> names_;
  int device_ = -1;
  cuda::CopyQueue queue_;
  cuda::DeviceBuffer shadow_;
  cuda::DeviceBuffer landing_;  // in place: converted tensors' published bytes
  cuda::DeviceBuffer chunk_hashes_;
  cuda::DeviceBuffer digests_device_;
  // Digests: of the segments converted straight from the publisher, one launch each (their plan
  // indices in source_segments_); of every other segment, one group over where it landed.
  std::vector<cuda::PreparedDigest> digest_launches_;
  std::vector<uint32_t> source_segments_;
  cuda::PreparedDigestGroup landed_digests_;
  std::vector<uint64_t> digests_host_;
  cuda::CopyBatch commit_;  // prepared: every planned tensor's staging → destination
  // ... of which the small ones, in one launch (all on this device: cuda::kCopyGroupBelowBytes).
  cuda::PreparedCopyGroup commit_small_;
  // Prepared conversions (casts, one grouped fp8 launch, kExtract pieces) from where the
  // published bytes land.
  Conversions conversions_;
};

}  // namespace weightsync::transport::path
