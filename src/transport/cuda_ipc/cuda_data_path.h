// CudaDataPath: the receiving end of a transfer from a publisher's GPU arena (cuda-ipc): the
// arena imported once from its POSIX fd and mapped for the destinations' device, a dedicated
// stream whose copies are waited for by event with a deadline, a device staging buffer (staged
// mode), and one prepared GPU-digest launch per segment over the received bytes. A step enqueues
// one copy per planned tensor and launches the prepared digests; it allocates nothing.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/kernels.h"
#include "plan/plan.h"
#include "transport/cuda_ipc/vmm.h"
#include "util/deadline.h"
#include "weightsync/options.h"
#include "wire/messages.h"

namespace weightsync::transport::cuda_ipc {

class CudaDataPath {
 public:
  // `arena_fd`: the publisher's exported allocation. Every destination must be on one CUDA
  // device; InvalidArgument names the first that is not.
  Status Prepare(int arena_fd, const wire::Welcome& welcome, const plan::Plan* plan,
                 const std::vector<plan::Destination>& destinations, UpdateMode mode);
  Status Copy(uint32_t slot, const util::Deadline& deadline);
  Status Verify(std::span<const uint64_t> digests, int64_t step, const util::Deadline& deadline);
  Status Commit(const util::Deadline& deadline);
  int device() const { return device_; }
  Status Release();  // digests, staging, stream, then the mapping

 private:
  uint8_t* Received(const plan::PlannedTensor& t) const;
  Status MaybeInjectBitFlip();  // test hook: fail point subscriber.flip_received

  const plan::Plan* plan_ = nullptr;
  const wire::Welcome* welcome_ = nullptr;
  std::vector<uint8_t*> destinations_;
  std::vector<std::string> names_;
  int device_ = -1;
  ImportedAllocation arena_;
  CopyQueue queue_;
  gpu::DeviceBuffer shadow_;
  gpu::DeviceBuffer chunk_hashes_;
  gpu::DeviceBuffer digests_device_;
  std::vector<gpu::PreparedDigest> digest_launches_;  // one per plan segment
  std::vector<uint64_t> digests_host_;
  // Prepared copy batches: per slot, every planned tensor's (dst, src, size); and the commit.
  struct Batch {
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
  };
  std::vector<Batch> slot_batches_;
  Batch commit_batch_;
};

}  // namespace weightsync::transport::cuda_ipc
