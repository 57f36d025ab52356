// HostToGpuPath: a publisher's host arena (shared memory on this host) into CUDA destinations.
//
// The arena's mapping is pinned once per handle (cudaHostRegister, read-only), so each step is one
// batch of asynchronous host-to-device copies straight from the published slot into a
// GpuReceiver (staging on the GPU, or the destinations themselves in place; conversions at
// commit), on the receiver's stream, waited for with the deadline. Where the device cannot pin
// read-only memory the copies read pageable memory instead (slower; the prepare line says so).
//
// Verification, when asked, checks both hops: while the copies run (and the publisher still pins
// the step) worker threads hash the source segments twice — with the publisher's digest kind,
// compared to its digests, and with the GPU digest, compared to what the GPU computes over the
// bytes that landed. So a corrupt arena and a corrupt copy are both caught before any commit.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "plan/plan.h"
#include "transport/cuda_ipc/cuda_data_path.h"
#include "transport/cuda_ipc/vmm.h"
#include "util/deadline.h"
#include "util/worker_pool.h"
#include "weightsync/options.h"
#include "wire/messages.h"

namespace weightsync::transport::cuda_ipc {

class HostToGpuPath {
 public:
  // `arena`: the publisher's arena mapped read-only in this process (welcome.arena_bytes). Every
  // destination must be on one CUDA device. `threads`: hashing workers (verify).
  Status Prepare(const uint8_t* arena, const wire::Welcome& welcome, const plan::Plan* plan,
                 const std::vector<plan::Destination>& destinations, UpdateMode mode,
                 int threads);
  // Copies the step in `slot` (and the arena-allocated tensors) to the GPU; with `verify` also
  // hashes its source bytes for Verify.
  Status Copy(uint32_t slot, bool verify, const util::Deadline& deadline);
  // `digests`: the publisher's (its Welcome's digest kind), by digest index.
  Status Verify(std::span<const uint64_t> digests, int64_t step, const util::Deadline& deadline);
  Status Commit(const util::Deadline& deadline);
  int device() const { return receiver_.device(); }
  bool pinned() const { return pageable_reason_.empty(); }
  std::string_view pageable_reason() const { return pageable_reason_; }
  Status Release();  // the receiver (stream, staging), the pin, the workers

 private:
  static void HashSegment(void* context, uint32_t index);

  const plan::Plan* plan_ = nullptr;
  const uint8_t* arena_ = nullptr;
  const wire::Welcome* welcome_ = nullptr;
  GpuReceiver receiver_;
  HostRegistration pinned_;
  std::string pageable_reason_;  // why the copies read pageable memory ("" when pinned)
  std::vector<std::string> names_;  // destination names, for errors
  std::unique_ptr<util::WorkerPool> workers_;
  // Per slot, prepared: every planned tensor's (dst, src, size).
  struct Batch {
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
  };
  std::vector<Batch> slot_batches_;
  // Per step (verify): the source segments' digests, by plan segment.
  const uint8_t* slot_base_ = nullptr;
  std::vector<uint64_t> published_kind_;  // with the publisher's digest kind
  std::vector<uint64_t> gpu_kind_;        // GPU digest, by digest index (what receiver_ compares)
};

}  // namespace weightsync::transport::cuda_ipc
