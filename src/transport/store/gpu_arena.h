// GpuArena: the publisher's side of cuda-ipc. Its slots live in one cuMem allocation on the
// publisher's device, exported once as a POSIX fd that subscribers import. Publishing a version
// is a batch of device-to-device copies (registered tensors → slot) plus one grouped GPU digest of
// every segment (two launches), on a dedicated stream, waited for with a deadline. Everything — the
// allocation, the stream, the digest group of every slot — is prepared at the first
// publish; a step only enqueues.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/device.h"
#include "cuda/kernels.h"
#include "cuda/vmm.h"
#include "util/deadline.h"
#include "util/unique_fd.h"

namespace weightsync::transport::store {

class GpuArena {
 public:
  struct Copy {                    // one registered tensor
    const uint8_t* src = nullptr;  // device pointer in the caller's tensor
    uint64_t slot_offset = 0;
    uint64_t bytes = 0;
  };
  struct Segment {  // one digest
    uint64_t slot_offset = 0;
    uint64_t bytes = 0;
    uint32_t digest = 0;  // index into the version's digest array
  };

  static Result<std::unique_ptr<GpuArena>> Create(int device, uint64_t slot_bytes, uint32_t slots,
                                                  std::vector<Copy> copies,
                                                  std::vector<Segment> segments,
                                                  uint32_t digest_count);
  ~GpuArena();

  int device() const { return device_; }
  int fd() const { return fd_.get(); }
  uint64_t arena_bytes() const { return allocation_.size(); }
  uint64_t slot_bytes() const { return slot_bytes_; }
  // Copies every registered tensor into `slot` and computes its digests into `digests`
  // (digest_count words, host memory). The copies start after the work already queued on
  // `after_stream` (a cudaStream_t of the arena's device; nullptr: the legacy default stream),
  // which wrote the tensors.
  Status Publish(uint32_t slot, uint64_t* digests, void* after_stream,
                 const util::Deadline& deadline);
  // A relay's version (its digests are the trainer's): the same copies into `slot`, no digests,
  // and ordered after no stream: the tensors' writes ended before the caller returned from them
  // (a relay's update waits for its copies on the host before it commits), so an engine's work
  // queued on its default stream never holds the copy back.
  Status CopyWritten(uint32_t slot, const util::Deadline& deadline);
  // Tests (fail point relay.corrupt_served): flips one bit inside the first non-empty tensor's
  // copy in `slot`; FailedPrecondition when every tensor is empty (nothing to corrupt).
  Status FlipBit(uint32_t slot);
  Status Close();

 private:
  GpuArena() = default;
  // The copies into `slot`, then (digests not null) the digests, waited for within `deadline`.
  Status CopyAndDigest(uint32_t slot, uint64_t* digests, const util::Deadline& deadline);

  int device_ = -1;
  uint64_t slot_bytes_ = 0;
  uint32_t digest_count_ = 0;
  std::vector<Copy> copies_;
  cuda::ExportedAllocation allocation_;
  util::UniqueFd fd_;
  cuda::CopyQueue queue_;
  cuda::DeviceBuffer digests_device_;               // slots × digest_count words
  std::vector<cuda::PreparedDigestGroup> digests_;  // per slot: every segment's digest
  // Prepared per slot (registered tensors → slot): the copy-engine batch and the copy group of
  // the small copies.
  std::vector<cuda::CopyBatch> copies_by_slot_;
  std::vector<cuda::PreparedCopyGroup> small_by_slot_;
};

}  // namespace weightsync::transport::store
