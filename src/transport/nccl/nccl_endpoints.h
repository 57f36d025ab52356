// The two ends of the nccl transport. Over a tcp:// endpoint, when the publisher's arena is GPU
// memory and the subscriber's destinations are CUDA tensors, the control connection stays the
// authenticated tcp session (src/transport/tcp/) and the bytes move over a two-rank NCCL
// communicator set up right after Select:
//
//   subscriber                                   publisher session
//   NcclSender/NcclReceiver::Prepare             (arena mapped, send lists / staging prepared)
//   nccl_setup {version, device} ─────────────▶
//             ◀───────────────────────────────── nccl_id {version, ncclUniqueId}
//   Connect(id, rank 1)                           Connect(id, rank 0)    (non-blocking init)
//   per step: update_request ─────────────────▶  step_begin
//   Receive(): grouped ncclBroadcast → staging/dsts   Send(slot): grouped ncclBroadcast (root) from the slot
//             ◀───────────────────────────────── step_end (GPU digests of the slot)
//   verify on the GPU, commit
//
// Both ends prepare their lists of byte ranges once ("prepared buckets": one piece per selected
// tensor, in Select order, zero-byte tensors skipped on both sides) and reuse the communicator
// every step. Host code; without CUDA every call answers Unavailable.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "plan/plan.h"
#include "transport/cuda_ipc/cuda_data_path.h"
#include "transport/cuda_ipc/vmm.h"
#include "transport/nccl/nccl_api.h"
#include "transport/nccl/nccl_link.h"
#include "util/deadline.h"
#include "weightsync/options.h"
#include "wire/messages.h"

namespace weightsync::transport::nccl {

// True when NcclSetup's and NcclId's versions can share a communicator: NCCL wants the same
// library on every rank; we require the same major.minor and accept a different patch.
bool CompatibleVersions(int a, int b);

// The publisher's end of one session (rank 0).
class NcclSender {
 public:
  // Maps the publisher's GPU arena into this session (imported from its POSIX fd, as a subscriber
  // on this host would) and prepares, for every slot, the byte ranges of the `selected` tensors.
  static Result<std::unique_ptr<NcclSender>> Prepare(int arena_fd, const wire::Welcome& welcome,
                                                     std::span<const uint32_t> selected);
  ~NcclSender();  // Close(), logging a failure

  // Joins the communicator as rank 0 (after the unique id went out in NcclId).
  Status Connect(const UniqueId& id, const util::Deadline& deadline, const Watch& watch);
  // Sends the selected tensors of `slot` and waits until NCCL has read all of them (after that,
  // the slot may be unpinned and rewritten). A failure aborts the communicator.
  Status Send(uint32_t slot, const util::Deadline& deadline, const Watch& watch);
  // Communicator (abort), then the arena mapping.
  Status Close();

  int device() const { return device_; }
  const Link* link() const { return link_.get(); }
  uint64_t bytes_per_step() const { return bytes_per_step_; }

 private:
  NcclSender() = default;
  int device_ = -1;
  cuda_ipc::ImportedAllocation arena_;
  std::vector<std::vector<Piece>> slot_pieces_;  // [slot][selected tensor]
  uint64_t bytes_per_step_ = 0;
  std::unique_ptr<Link> link_;
};

// The subscriber's end (rank 1), owned by the tcp transfer handle.
class NcclReceiver {
 public:
  ~NcclReceiver();  // Release(), logging a failure

  // Staging (staged mode), prepared digests, commit batch and the receive list; every
  // destination on one CUDA device.
  Status Prepare(const plan::Plan* plan, const std::vector<plan::Destination>& destinations,
                 UpdateMode mode);
  // Joins the communicator as rank 1 with the unique id from NcclId.
  Status Connect(const UniqueId& id, const util::Deadline& deadline, const Watch& watch);
  // Receives one step into staging or the destinations and waits for it. A failure aborts the
  // communicator (nothing is committed: the core destroys the handle).
  Status Receive(const util::Deadline& deadline, const Watch& watch);
  Status Verify(std::span<const uint64_t> digests, int64_t step, const util::Deadline& deadline) {
    return gpu_.Verify(digests, step, deadline);
  }
  Status Commit(const util::Deadline& deadline) { return gpu_.Commit(deadline); }
  // Communicator first (abort: no NCCL kernel may write into staging or destinations after it),
  // then staging, digests and stream.
  Status Release();

  int device() const { return device_; }
  const Link* link() const { return link_.get(); }
  uint64_t staging_bytes() const { return gpu_.staging_bytes(); }

 private:
  int device_ = -1;
  cuda_ipc::GpuReceiver gpu_;
  std::vector<Piece> pieces_;  // one per planned tensor with bytes, plan order
  std::unique_ptr<Link> link_;
};

}  // namespace weightsync::transport::nccl
