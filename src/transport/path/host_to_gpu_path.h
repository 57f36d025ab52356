// HostToGpuPath (host-to-gpu, host-to-gpu-ring): a publisher's host store on this host into CUDA
// destinations.
//
// The store's view (view/store_view.h: an arena, or a ring of buckets the publisher announces one
// by one) is mapped and pinned once per handle (cudaHostRegister, read-only), so each unit of a
// step — the published slot, or a ring's bucket — is one prepared batch of asynchronous
// host-to-device copies into a GpuLanding (staging on the GPU, or the destinations themselves in
// place; conversions at commit), on the receiver's stream, waited for with the deadline before
// the unit is answered. Where the device cannot pin read-only memory the copies read pageable
// memory instead (slower; the prepare line says so).
//
// Verification, when asked, checks both hops: while the copies run (and the publisher still pins
// the unit) worker threads hash the source segments twice — with the publisher's digest kind,
// compared to its digests, and with the GPU digest, compared to what the GPU computes over the
// bytes that landed. So a corrupt store and a corrupt copy are both caught before any commit.
// Each segment's bytes are fed unit by unit into streamed digests (a ring's buckets cut segments
// anywhere, and a bucket is refilled once answered), finished after the step: ~700 bytes of
// state a segment while prepared, made only for a subscriber that verifies. A segment is hashed by
// one worker (xxh3 is sequential), so a unit's hashing spreads over as many workers as it holds
// segments (8 MiB each by default): verified, the ring ran at 0.69x the verified arena on the H200
// (docs/benchmarks.md).
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
#include "transport/view/store_view.h"
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
  ConversionReport conversion() const override { return receiver_.conversion(); }
  Status Release() override;  // the landing (stream, staging), the pin, the workers, the mapping

 private:
  static void HashPieceOfUnit(void* context, uint32_t index);

  struct SegmentStreams {
    util::Hash64Stream published;  // the publisher's digest kind, when it is xxh3
    cuda::GpuDigestStream gpu;
  };
  // What a unit holds of segment `segment`: `bytes` at `src`.
  struct HashPiece {
    uint32_t segment = 0;
    const uint8_t* src = nullptr;
    uint64_t bytes = 0;
  };

  const plan::Plan* plan_ = nullptr;
  const wire::Welcome* welcome_ = nullptr;
  std::unique_ptr<view::StoreView> view_;  // the publisher's host store, mapped
  GpuLanding receiver_;
  HostPin pinned_;
  std::vector<std::string> names_;  // destination names, for errors
  std::unique_ptr<util::WorkerPool> workers_;
  std::vector<cuda::CopyBatch> unit_batches_;  // per unit of the view, prepared
  plan::ByBucket<HashPiece> hash_pieces_;      // per unit of the view
  uint32_t unit_ = 0;                          // the unit being hashed
  // Per step (verify): the source segments' digests, streamed unit by unit.
  std::vector<SegmentStreams> streams_;   // by plan segment
  std::vector<uint64_t> published_kind_;  // with the publisher's digest kind, by plan segment
  std::vector<uint64_t> gpu_kind_;        // GPU digest, by digest index (what receiver_ compares)
};

}  // namespace weightsync::transport::path
