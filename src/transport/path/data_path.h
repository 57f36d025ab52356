// DataPath: how the bytes of a step move from the publisher's store into the subscriber's
// destinations — one implementation per way a byte moves (host mmap copy, tcp read, host arena →
// GPU, GPU arena → host, GPU arena → GPU over cuda-ipc, nccl), chosen by the table in
// transport/path_table.h. A path lands bytes through the shared landing code (host_landing.h,
// gpu_landing.h): staging in staged mode, the destinations in place, conversions at commit.
//
// Prepared once per transfer handle (Prepare), then every step: Copy → (the publisher's digests
// arrive) → Verify (when asked) → Commit. Release undoes Prepare in reverse order; a failed call
// leaves the path unusable and its handle releases it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "transport/link/link.h"
#include "util/deadline.h"
#include "util/unique_fd.h"
#include "weightsync/options.h"
#include "weightsync/status.h"
#include "weightsync/update_stats.h"
#include "wire/messages.h"

namespace weightsync::transport::path {

// What a path prepares against. Everything outlives the path except `store_fd`, which the path
// takes (to map or import the publisher's store) or leaves.
struct PathContext {
  link::Link* link = nullptr;  // the control connection (tcp paths read or set up on it)
  const wire::Welcome* welcome = nullptr;
  util::UniqueFd* store_fd = nullptr;  // Unix links: the publisher's store
  // Unix links to a zero-copy publisher of cuMem memory: one fd per chunk (link.h); the path
  // closes each once it is imported.
  std::vector<util::UniqueFd>* allocation_fds = nullptr;
  const plan::Plan* plan = nullptr;
  const std::vector<plan::Destination>* destinations = nullptr;
  UpdateMode mode = UpdateMode::kStaged;
  const SubscriberOptions* options = nullptr;
  const util::Deadline* deadline = nullptr;
  // CPU workers: copy threads (option or default), or hashing threads on the GPU paths.
  int CopyThreads() const;
  int HashingThreads() const;
};

// Delta updates (docs/deltas.md): what the last Copy received, for UpdateStats.
struct DeltaReceipt {
  int64_t base_step = -1;       // the step the deltas were applied to; -1: every byte came whole
  uint32_t delta_segments = 0;  // segments that came as deltas
  uint64_t received_bytes = 0;  // bytes that came for the tensors: deltas plus whole segments
};

// Cut-through relays (docs/relays.md): where a step's bytes land while they arrive. Bytes
// [offset, offset + size) of the publisher's tensor `tensor` land at `bytes`.
struct LandingPart {
  uint32_t tensor = 0;
  uint64_t offset = 0;
  const uint8_t* bytes = nullptr;
  uint64_t size = 0;
};
class LandingObserver : public link::ReadObserver {
 public:
  // The step's bytes come whole and in `parts`' order (a step that comes as deltas is not
  // observed): returns whether it follows them, told by Read (parts [0, part) and `offset` bytes
  // of `part` landed) as they arrive. Never waits: the read goes on at once.
  virtual bool Begin(int64_t step, std::span<const LandingPart> parts) = 0;

 protected:
  ~LandingObserver() = default;
};

// What a prepared path converts every step, and where (DataPath::conversion()).
struct ConversionReport {
  uint32_t tensors = 0;
  uint64_t bytes = 0;  // as published
  ConvertedOn where = ConvertedOn::kNone;
  int device = -1;  // the CUDA device that converts (kDestinationGpu, kPublisherGpu)
};

class DataPath {
 public:
  virtual ~DataPath() = default;
  // What this machine needs for the path (a CUDA device, the NCCL library), checked before
  // anything is asked of the publisher: Unavailable saying what is missing.
  virtual Status Available(const PathContext& ctx) { return Status::Ok(); }
  virtual Status Prepare(const PathContext& ctx) = 0;
  // Moves the step `begin` (pinned by the publisher) into staging or the destinations. `verify`:
  // Verify will follow (a path that reads some of the publisher's bytes in place hashes them now,
  // while they are pinned).
  virtual Status Copy(const wire::StepBegin& begin, bool verify,
                      const util::Deadline& deadline) = 0;
  // Checks what landed against the publisher's digests. Corruption names the tensor and range.
  virtual Status Verify(std::span<const uint64_t> digests, int64_t step,
                        const util::Deadline& deadline) = 0;
  // Staged: staging → destinations. Both modes: converted tensors into their destinations.
  virtual Status Commit(const util::Deadline& deadline) = 0;
  // Delta updates: whether the next Copy can apply deltas against the bytes it lands on — this
  // handle committed the last step it copied (so the shadow, staged, or the destinations, in
  // place, hold the committed version as it left them), and every planned tensor is a whole
  // published tensor copied as it is. Paths without deltas: never.
  virtual bool AcceptsDeltas() const { return false; }
  // Before Copy, on a path that accepts them: the committed step and its digests (all of the
  // publisher's, by digest index) the step's deltas must be computed against; -1: none asked.
  virtual void ExpectDeltas(int64_t /*base_step*/, std::span<const uint64_t> /*base_digests*/) {}
  // Cut-through: the observer told where the next steps' bytes land (null: none). Only the tcp
  // read path has one; the others never call it, and a relay serves what they land once it
  // committed.
  virtual void ObserveLanding(LandingObserver* /*observer*/) {}
  // What the last Copy received; a path without deltas received its plan's bytes whole.
  virtual DeltaReceipt delta_receipt() const { return {}; }
  // ", GPU arena from cuda:0 into cuda:1" and the like: the prepare log line's details.
  virtual std::string Describe() const { return ""; }
  // Bytes of staging the path holds from Prepare until Release, host or device memory: its
  // landing's shadow (staged) or landing buffer of converted tensors (in place) — what it adds to
  // the ledger's staging_bytes (UpdateStats::staging_bytes). Read every update: allocates
  // nothing. A path with a landing (host_landing.h, gpu_landing.h) says what it holds; one
  // without holds none.
  virtual uint64_t staging_bytes() const { return 0; }
  // What each step converts and where (UpdateStats::converted_*): a path with a landing says
  // what its plan converts there; one whose conversions run elsewhere says so.
  virtual ConversionReport conversion() const { return {}; }
  // Undoes Prepare in reverse order; each failure logged with its cause, the rest still released.
  virtual Status Release() = 0;
};

}  // namespace weightsync::transport::path
