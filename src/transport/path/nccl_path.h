// The two ends of the nccl transport. Over a tcp:// endpoint, when the publisher's arena is GPU
// memory and the subscriber's destinations are CUDA tensors, the control connection stays the
// authenticated tcp session (transport/link/tcp_session.h) and the bytes move over a two-rank
// NCCL communicator set up right after Select:
//
//   subscriber (NcclPath)                        publisher session (NcclSender)
//   Prepare: staging, receive list               Prepare: arena mapped, send lists (or, from a
//                                                zero-copy or ring publisher, the lists over its
//                                                registered tensors: FromTensors)
//   nccl_setup {version, device} ─────────────▶
//             ◀───────────────────────────────── nccl_id {version, ncclUniqueId}
//   Connect(id, rank 1)                           Connect(id, rank 0)    (non-blocking init)
//   per step: update_request ─────────────────▶  step_begin
//   Copy(): grouped ncclBroadcast → staging/dsts   Send(slot): grouped ncclBroadcast (root)
//             ◀───────────────────────────────── step_end (GPU digests of the slot)
//   verify on the GPU, commit
//
// Both ends prepare their lists of byte ranges once ("prepared buckets": one piece per selected
// tensor, in Select order, zero-byte tensors skipped on both sides) and reuse the communicator
// every step. Host code; without CUDA every call answers Unavailable.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "cuda/nccl_api.h"
#include "cuda/nccl_link.h"
#include "cuda/vmm.h"
#include "plan/plan.h"
#include "transport/path/data_path.h"
#include "transport/path/gpu_landing.h"
#include "util/deadline.h"
#include "weightsync/options.h"
#include "wire/handshake.h"
#include "wire/messages.h"

namespace weightsync::transport::path {

// True when NcclSetup's and NcclId's versions can share a communicator: NCCL wants the same
// library on every rank; we require the same major.minor and accept a different patch.
bool CompatibleVersions(int a, int b);

// The publisher's end of one session (rank 0).
class NcclSender {
 public:
  // Maps the publisher's GPU arena into this session (imported from its POSIX fd, as a subscriber
  // on this host would) and prepares, for every slot, the `selected` byte ranges (checked against
  // the Welcome by the caller).
  static Result<std::unique_ptr<NcclSender>> Prepare(int arena_fd, const wire::Welcome& welcome,
                                                     std::span<const wire::SelectRange> selected);
  // A publisher whose version is its registered tensors (zero-copy, ArenaKind::kCudaIpc; a ring,
  // kCudaRing): the `selected` ranges straight from them, `tensor_bytes(i)` being tensor i's
  // bytes in this process (VersionSource::TensorBytes). Every slot sends the same memory, fenced
  // by the publisher's BeginWrite; nothing is mapped or copied.
  static Result<std::unique_ptr<NcclSender>> FromTensors(
      const wire::Welcome& welcome, std::span<const wire::SelectRange> selected,
      const std::function<const uint8_t*(uint32_t)>& tensor_bytes);
  ~NcclSender();  // Close(), logging a failure

  // Joins the communicator as rank 0 (after the unique id went out in NcclId).
  Status Connect(const cuda::nccl::UniqueId& id, const util::Deadline& deadline,
                 const cuda::nccl::Watch& watch);
  // Sends the selected tensors of `slot` (from tensors: any slot) and waits until NCCL has read all
  // of them (after that, the slot may be unpinned and rewritten). A failure aborts the
  // communicator.
  Status Send(uint32_t slot, const util::Deadline& deadline, const cuda::nccl::Watch& watch);
  // Communicator (abort), then the arena mapping.
  Status Close();

  int device() const { return device_; }
  const cuda::nccl::Link* link() const { return link_.get(); }
  uint64_t bytes_per_step() const { return bytes_per_step_; }

 private:
  NcclSender() = default;
  int device_ = -1;
  cuda::ImportedAllocation arena_;
  // [slot][selected tensor]; from tensors, one list that every slot sends.
  std::vector<std::vector<cuda::nccl::Piece>> slot_pieces_;
  bool from_tensors_ = false;
  uint64_t bytes_per_step_ = 0;
  std::unique_ptr<cuda::nccl::Link> link_;
};

// The subscriber's end (rank 1): a data path over a tcp link whose publisher keeps a GPU store.
// Prepare sets up the communicator on the link (nccl_setup → nccl_id → join), after the handle
// sent Select.
class NcclPath final : public DataPath {
 public:
  ~NcclPath() override;
  Status Available(const PathContext& ctx) override;  // the NCCL library and a CUDA device
  // Staging (staged mode), prepared digests, commit batch and the receive list (every
  // destination on one CUDA device), then the communicator.
  Status Prepare(const PathContext& ctx) override;
  // Receives one step into staging or the destinations and waits for it. A failure aborts the
  // communicator (nothing is committed: the handle is released).
  Status Copy(const wire::StepBegin& begin, bool verify, const util::Deadline& deadline) override;
  Status Verify(std::span<const uint64_t> digests, int64_t step,
                const util::Deadline& deadline) override {
    return gpu_.Verify(digests, step, deadline);
  }
  Status Commit(const util::Deadline& deadline) override { return gpu_.Commit(deadline); }
  std::string Describe() const override;
  uint64_t staging_bytes() const override { return gpu_.staging_bytes(); }
  ConversionReport conversion() const override { return gpu_.conversion(); }
  Status Release() override;

 private:
  link::Link* link_ = nullptr;
  int device_ = -1;
  bool staged_ = false;
  GpuLanding gpu_;
  std::vector<cuda::nccl::Piece> pieces_;  // one per planned tensor with bytes, plan order
  cuda::nccl::Watch watch_;                // what NCCL waits watch: the control connection
  std::unique_ptr<cuda::nccl::Link> comm_;
};

}  // namespace weightsync::transport::path
