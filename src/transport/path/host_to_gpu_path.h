// HostToGpuPath: a publisher's host arena (shared memory on this host) into CUDA destinations.
//
// The arena's mapping is pinned once per handle (cudaHostRegister, read-only), so each step is one
// batch of asynchronous host-to-device copies straight from the published slot into a
// GpuLanding (staging on the GPU, or the destinations themselves in place; conversions at
// commit), on the receiver's stream, waited for with the deadline. Where the device cannot pin
// read-only memory the copies read pageable memory instead (slower; the prepare line says so).
//
// Verification, when asked, checks both hops: while the copies run (and the publisher still pins
// the step) worker threads hash the source segments twice — with the publisher's digest kind,
// compared to its digests, and with the GPU digest, compared to what the GPU computes over the
// bytes that landed. So a corrupt arena and a corrupt copy are both caught before any commit.
//
// From a ring of host buckets (kHostRing, PublisherOptions::ring_buckets) the same a bucket at a
// time: per bucket one prepared batch from its slot (the ring, K buckets, is what is pinned), and
// with verify both hashes are fed each segment's bytes in the bucket while the copy engines read
// it (streamed: a bucket is refilled once answered, and buckets cut segments anywhere), finished
// after the last bucket. Per segment that costs an xxh3 state (~700 bytes) while prepared, made
// only for a subscriber that verifies. A segment is hashed by one worker (xxh3 is sequential), so
// a bucket's hashing spreads over as many workers as it holds segments (8 MiB each by default):
// verified, the ring ran at 0.69x the verified arena on the H200 (docs/benchmarks.md).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "cuda/gpu_digest_reference.h"
#include "cuda/vmm.h"
#include "plan/plan.h"
#include "plan/ring_cut.h"
#include "transport/path/data_path.h"
#include "transport/path/gpu_landing.h"
#include "transport/store/shm_segment.h"
#include "util/deadline.h"
#include "util/hash.h"
#include "util/worker_pool.h"
#include "weightsync/options.h"
#include "wire/messages.h"

namespace weightsync::transport::path {

class HostToGpuPath final : public DataPath {
 public:
  ~HostToGpuPath() override;
  Status Available(const PathContext& ctx) override;  // a CUDA device
  // Maps the publisher's store read-only, pins it, prepares the landing on the destinations'
  // device (every destination on one CUDA device) and the per-slot copy batches.
  Status Prepare(const PathContext& ctx) override;
  // Copies the step's slot (and the store's own tensors) to the GPU; with `verify` also hashes
  // its source bytes for Verify.
  Status Copy(const wire::StepBegin& begin, bool verify, const util::Deadline& deadline) override;
  // `digests`: the publisher's (its Welcome's digest kind), by digest index.
  Status Verify(std::span<const uint64_t> digests, int64_t step,
                const util::Deadline& deadline) override;
  Status Commit(const util::Deadline& deadline) override;
  std::string Describe() const override;
  uint64_t staging_bytes() const override { return receiver_.staging_bytes(); }
  Status Release() override;  // the landing (stream, staging), the pin, the workers, the mapping

 private:
  static void HashSegment(void* context, uint32_t index);
  // A ring: the per-bucket batches, what each bucket holds of each segment, the streams.
  void PrepareRing(const wire::Welcome& welcome, const plan::Plan& plan, bool verify);
  Status CopyFromRing(const wire::StepBegin& begin, bool verify, const util::Deadline& deadline);
  static void HashRingPiece(void* context, uint32_t index);

  struct SegmentStreams {
    util::Hash64Stream published;  // the publisher's digest kind, when it is xxh3
    cuda::GpuDigestStream gpu;
  };

  const plan::Plan* plan_ = nullptr;
  store::Mapping mapping_;
  const uint8_t* arena_ = nullptr;
  const wire::Welcome* welcome_ = nullptr;
  GpuLanding receiver_;
  cuda::HostRegistration pinned_;
  std::string pageable_reason_;     // why the copies read pageable memory ("" when pinned)
  std::vector<std::string> names_;  // destination names, for errors
  std::unique_ptr<util::WorkerPool> workers_;
  std::vector<cuda::CopyBatch> slot_batches_;  // per slot, prepared: every planned tensor
  // Per step (verify): the source segments' digests, by plan segment.
  const uint8_t* slot_base_ = nullptr;
  std::vector<uint64_t> published_kind_;  // with the publisher's digest kind
  std::vector<uint64_t> gpu_kind_;        // GPU digest, by digest index (what receiver_ compares)
  // A ring.
  link::Link* link_ = nullptr;  // its buckets are announced and answered on it
  plan::ByBucket<plan::SegmentPiece> ring_pieces_;
  std::vector<SegmentStreams> streams_;  // by plan segment
  uint32_t ring_bucket_ = 0;             // the bucket being hashed
};

}  // namespace weightsync::transport::path
