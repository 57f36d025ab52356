// DestinationCheck: digests the destinations' own memory — the engine's weights as they are, not
// the bytes received — and compares it with the publisher's digests of the committed version
// (Subscriber::CheckWeights). Whatever moved the bytes (any data path), a committed segment whose
// tensor is a plain copy lies whole at dst_offset of its destination, so its digest can be
// recomputed there: on the CPU for host destinations, with the grouped GPU digest kernels on the
// destination's device for CUDA ones (a publisher of xxh3 digests — a host store — into CUDA
// destinations: each segment copied back to the host and hashed there, as no GPU kernel computes
// xxh3). Segments of converted tensors (casts, fp8) and region pieces extracted from a segment have
// no digest as they lie: their destinations are reported unchecked.
//
// Prepared at the first check of a handle (its plan and destinations are fixed by then), reused by
// every later one, released with the handle.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cuda/kernels.h"
#include "cuda/vmm.h"
#include "plan/plan.h"
#include "util/deadline.h"
#include "util/worker_pool.h"
#include "weightsync/status.h"
#include "wire/messages.h"

namespace weightsync::transport::path {

class DestinationCheck {
 public:
  // A destination whose memory differs from what was committed: the first differing segment's
  // byte range, and how many of its segments differ.
  struct Difference {
    uint32_t destination = 0;  // index into the handle's destinations
    uint64_t offset = 0;
    uint64_t bytes = 0;
    uint32_t segments = 0;
  };

  DestinationCheck() = default;
  DestinationCheck(const DestinationCheck&) = delete;
  DestinationCheck& operator=(const DestinationCheck&) = delete;
  ~DestinationCheck();

  bool prepared() const { return prepared_; }
  // `plan` and `destinations` outlive this (the handle's); `kind`: the publisher's digests'.
  Status Prepare(const plan::Plan& plan, std::span<const plan::Destination> destinations,
                 wire::DigestKind kind, int threads);
  // Digests every checkable segment where it lies and compares it with `digests` (the committed
  // version's, the publisher's order). Per destination of the handle's list: `checked_bytes[d]` +=
  // the bytes compared; `unchecked[d]` = 1 where it holds bytes without a digest to compare with.
  // Every destination that differs is appended to `differing` (in plan order; a destination
  // filled by several runs of a region plan may appear once per run).
  Status Run(std::span<const uint64_t> digests, const util::Deadline& deadline,
             std::span<uint64_t> checked_bytes, std::span<uint8_t> unchecked,
             std::vector<Difference>* differing);
  Status Release();

 private:
  // One checkable segment: `bytes` at `data` (host memory, or the device's), digest `digest`.
  struct Piece {
    const uint8_t* data = nullptr;
    uint64_t bytes = 0;
    uint32_t digest = 0;
    uint32_t destination = 0;
    uint64_t dst_offset = 0;
  };
  // The CUDA destinations of one device: their pieces' digests computed there.
  struct OnDevice {
    int device = -1;
    std::vector<uint32_t> pieces;  // indices into pieces_
    cuda::CopyQueue queue;
    cuda::DeviceBuffer digests;       // one word per piece
    cuda::PreparedDigestGroup group;  // GPU digest kind
    std::vector<uint64_t> host;       // the digests copied back
  };
  static void HashHostPiece(void* context, uint32_t index);
  Status DigestOnDevice(OnDevice& d, const util::Deadline& deadline);
  Status BounceToHost(OnDevice& d, const util::Deadline& deadline);

  bool prepared_ = false;
  wire::DigestKind kind_ = wire::DigestKind::kXxh3;
  std::vector<Piece> pieces_;
  std::vector<uint64_t> actual_;  // per piece, this check's digest
  std::vector<uint32_t> host_;    // pieces in host memory
  std::vector<std::unique_ptr<OnDevice>> devices_;
  std::vector<uint8_t> unchecked_;  // per destination: holds bytes no digest describes
  std::vector<uint8_t> bounce_;     // xxh3 of CUDA destinations: one segment at a time
  std::unique_ptr<util::WorkerPool> workers_;
};

}  // namespace weightsync::transport::path
