#include "transport/nccl/nccl_endpoints.h"

#include "util/logging.h"

namespace weightsync::transport::nccl {

bool CompatibleVersions(int a, int b) {
  // NCCL_VERSION_CODE from 2.9 on: major·10000 + minor·100 + patch.
  return a / 100 == b / 100;
}

// ---- NcclSender ----------------------------------------------------------------------------

Result<std::unique_ptr<NcclSender>> NcclSender::Prepare(int arena_fd, const wire::Welcome& welcome,
                                                        std::span<const uint32_t> selected) {
  if (welcome.arena_kind != wire::ArenaKind::kCudaMem || welcome.device < 0) {
    return Status::Internal("nccl: the publisher's arena is not GPU memory");
  }
  std::unique_ptr<NcclSender> s(new NcclSender());
  s->device_ = welcome.device;
  WS_ASSIGN_OR_RETURN(s->arena_, cuda_ipc::ImportedAllocation::Import(
                                     arena_fd, welcome.arena_bytes, welcome.device));
  s->slot_pieces_.assign(welcome.slot_count, {});
  for (uint32_t k = 0; k < welcome.slot_count; ++k) {
    // The mapping is read-write for this device; NCCL only reads from it.
    uint8_t* slot = const_cast<uint8_t*>(s->arena_.data()) + welcome.slots_offset +
                    uint64_t{k} * welcome.slot_bytes;
    for (uint32_t index : selected) {
      const wire::TensorPlacement& t = welcome.tensors[index];
      if (t.region != wire::Region::kSlot) {
        return Status::NotSupported("nccl: tensor '", t.spec.name,
                                    "' is arena-allocated; a GPU arena holds registered tensors "
                                    "in slots only");
      }
      if (t.spec.nbytes == 0) continue;
      s->slot_pieces_[k].push_back({slot + t.offset, t.spec.nbytes});
      if (k == 0) s->bytes_per_step_ += t.spec.nbytes;
    }
  }
  return s;
}

NcclSender::~NcclSender() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "nccl") << "sender cleanup: " << s;
}

Status NcclSender::Connect(const UniqueId& id, const util::Deadline& deadline,
                           const Watch& watch) {
  WS_ASSIGN_OR_RETURN(link_, Link::Connect(id, /*rank=*/0, device_, deadline, watch));
  return Status::Ok();
}

Status NcclSender::Send(uint32_t slot, const util::Deadline& deadline, const Watch& watch) {
  if (!link_) return Status::FailedPrecondition("nccl: Send() before Connect()");
  if (slot >= slot_pieces_.size()) {
    return Status::Internal("nccl: slot ", slot, " of ", slot_pieces_.size());
  }
  return link_->Transfer(slot_pieces_[slot], deadline, watch);
}

Status NcclSender::Close() {
  Status result;
  // Reverse order of creation: the communicator (abort: nothing reads the slots afterwards),
  // then the arena mapping.
  if (link_) {
    result.Update(link_->Close());
    link_.reset();
  }
  slot_pieces_.clear();
  result.Update(arena_.Close());
  return result;
}

// ---- NcclReceiver --------------------------------------------------------------------------

NcclReceiver::~NcclReceiver() {
  if (Status s = Release(); !s.ok()) WS_LOG(WARN, "nccl") << "receiver cleanup: " << s;
}

Status NcclReceiver::Prepare(const plan::Plan* plan,
                             const std::vector<plan::Destination>& destinations,
                             UpdateMode mode) {
  WS_ASSIGN_OR_RETURN(device_, cuda_ipc::GpuReceiver::DestinationDevice(destinations, "nccl"));
  WS_RETURN_IF_ERROR(gpu_.Prepare(plan, destinations, mode, device_));
  pieces_.clear();
  for (const plan::PlannedTensor& t : plan->tensors) {
    if (t.nbytes == 0) continue;
    pieces_.push_back({gpu_.Received(t), t.nbytes});
  }
  return Status::Ok();
}

Status NcclReceiver::Connect(const UniqueId& id, const util::Deadline& deadline,
                             const Watch& watch) {
  WS_ASSIGN_OR_RETURN(link_, Link::Connect(id, /*rank=*/1, device_, deadline, watch));
  return Status::Ok();
}

Status NcclReceiver::Receive(const util::Deadline& deadline, const Watch& watch) {
  if (!link_) return Status::FailedPrecondition("nccl: Receive() before Connect()");
  WS_RETURN_IF_ERROR(link_->Transfer(pieces_, deadline, watch));
  return gpu_.MaybeInjectBitFlip();
}

Status NcclReceiver::Release() {
  Status result;
  if (link_) {
    result.Update(link_->Close());
    link_.reset();
  }
  pieces_.clear();
  result.Update(gpu_.Release());
  return result;
}

}  // namespace weightsync::transport::nccl
