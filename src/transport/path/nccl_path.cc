#include "transport/path/nccl_path.h"

#include "cuda/device.h"
#include "util/fail_point.h"
#include "util/logging.h"
#include "wire/handshake.h"

namespace weightsync::transport::path {

bool CompatibleVersions(int a, int b) {
  // NCCL_VERSION_CODE from 2.9 on: major·10000 + minor·100 + patch.
  return a / 100 == b / 100;
}

// ---- NcclSender ----------------------------------------------------------------------------

Result<std::unique_ptr<NcclSender>> NcclSender::Prepare(
    int arena_fd, const wire::Welcome& welcome, std::span<const wire::SelectRange> selected) {
  if (arena_fd < 0 || welcome.device < 0) {
    return Status::Internal("nccl: the publisher's store is no GPU arena it holds an fd of");
  }
  std::unique_ptr<NcclSender> s(new NcclSender());
  s->device_ = welcome.device;
  WS_ASSIGN_OR_RETURN(
      s->arena_, cuda::ImportedAllocation::Import(arena_fd, welcome.arena_bytes, welcome.device));
  s->slot_pieces_.assign(welcome.slot_count, {});
  for (uint32_t k = 0; k < welcome.slot_count; ++k) {
    // The mapping is read-write for this device; NCCL only reads from it.
    uint8_t* slot = const_cast<uint8_t*>(s->arena_.data()) + welcome.slots_offset +
                    uint64_t{k} * welcome.slot_bytes;
    for (const wire::SelectRange& range : selected) {  // checked against the Welcome
      const wire::TensorPlacement& t = welcome.tensors[range.tensor];
      if (t.region != wire::Region::kSlot) {
        return Status::NotSupported("nccl: tensor '", t.spec.name,
                                    "' is arena-allocated; a GPU arena holds registered tensors "
                                    "in slots only");
      }
      s->slot_pieces_[k].push_back({slot + t.offset + range.offset, range.bytes});
      if (k == 0) s->bytes_per_step_ += range.bytes;
    }
  }
  return s;
}

Result<std::unique_ptr<NcclSender>> NcclSender::FromTensors(
    const wire::Welcome& welcome, std::span<const wire::SelectRange> selected,
    const std::function<const uint8_t*(uint32_t)>& tensor_bytes) {
  if (welcome.device < 0) {
    return Status::Internal("nccl: the publisher's version is not CUDA tensors");
  }
  std::unique_ptr<NcclSender> s(new NcclSender());
  s->device_ = welcome.device;
  s->from_tensors_ = true;
  s->slot_pieces_.assign(1, {});
  for (const wire::SelectRange& range : selected) {  // checked against the Welcome
    const uint8_t* bytes = tensor_bytes(range.tensor);
    if (bytes == nullptr && range.bytes > 0) {
      return Status::Internal("nccl: tensor '", welcome.tensors[range.tensor].spec.name,
                              "' has no bytes in this process");
    }
    // NCCL only reads from the root's buffers.
    s->slot_pieces_[0].push_back({const_cast<uint8_t*>(bytes) + range.offset, range.bytes});
    s->bytes_per_step_ += range.bytes;
  }
  return s;
}

NcclSender::~NcclSender() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "nccl") << "sender cleanup: " << s;
}

Status NcclSender::Connect(const cuda::nccl::UniqueId& id, const util::Deadline& deadline,
                           const cuda::nccl::Watch& watch) {
  WS_ASSIGN_OR_RETURN(link_, cuda::nccl::Link::Connect(id, /*rank=*/0, device_, deadline, watch));
  return Status::Ok();
}

Status NcclSender::Send(uint32_t slot, const util::Deadline& deadline,
                        const cuda::nccl::Watch& watch) {
  if (!link_) return Status::FailedPrecondition("nccl: Send() before Connect()");
  if (from_tensors_) return link_->Transfer(slot_pieces_[0], deadline, watch);
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

// ---- NcclPath (the subscriber's end) --------------------------------------------------------

NcclPath::~NcclPath() {
  if (Status s = Release(); !s.ok()) WS_LOG(WARN, "nccl") << "path cleanup: " << s;
}

Status NcclPath::Available(const PathContext& ctx) {
  // Its GPU arena, or (zero-copy, ring) its registered tensors.
  const std::string why = ctx.link->peer() +
                          " serves GPU memory on cuda:" + std::to_string(ctx.welcome->device) +
                          " and the destinations are CUDA tensors, which needs the nccl transport";
  WS_RETURN_IF_ERROR(cuda::nccl::NcclAvailable().WithContext(why));
  return cuda::CudaAvailable().WithContext(why);
}

Status NcclPath::Prepare(const PathContext& ctx) {
  const wire::Welcome& welcome = *ctx.welcome;
  link_ = ctx.link;
  const std::string& peer = link_->peer();
  if (welcome.digest_kind != wire::DigestKind::kGpu64) {
    return Status::ProtocolError(peer, ": a GPU arena with digest kind ",
                                 static_cast<int>(welcome.digest_kind),
                                 ", expected 1 (GPU digest)");
  }
  // Staging, digests and the receive list first: the communicator is created last and released
  // first, so no NCCL kernel can outlive the memory it writes.
  WS_ASSIGN_OR_RETURN(device_, GpuLanding::DestinationDevice(*ctx.destinations, "nccl"));
  WS_RETURN_IF_ERROR(
      gpu_.Prepare(ctx.plan, *ctx.destinations, ctx.mode, device_).WithContext(peer));
  pieces_.clear();
  for (const plan::PlannedTensor& t : ctx.plan->tensors) {
    if (t.nbytes == 0) continue;
    pieces_.push_back({gpu_.Received(t), t.nbytes});
  }
  const int version = cuda::nccl::NcclVersionCode();
  link::Channel& ch = link_->channel();
  const util::Deadline& deadline = *ctx.deadline;
  wire::NcclSetup setup{static_cast<uint32_t>(version), static_cast<uint32_t>(device_)};
  WS_RETURN_IF_ERROR(ch.Send(wire::FrameType::kNcclSetup, setup, deadline));
  wire::NcclId id;
  WS_RETURN_IF_ERROR(ch.ReceiveExpect(wire::FrameType::kNcclId, &id, deadline));
  if (!CompatibleVersions(version, static_cast<int>(id.nccl_version))) {
    return Status::FailedPrecondition(
        peer, ": NCCL versions differ: publisher ",
        cuda::nccl::NcclVersionString(static_cast<int>(id.nccl_version)), ", subscriber ",
        cuda::nccl::NcclVersionString(version),
        " (both ranks of a communicator need the same NCCL major.minor)");
  }
  watch_ = cuda::nccl::Watch{ch.fd(), nullptr, peer};
  Result<std::unique_ptr<cuda::nccl::Link>> comm =
      cuda::nccl::Link::Connect(id.unique_id, /*rank=*/1, device_, deadline, watch_);
  if (!comm.ok()) return link_->PublisherReason(comm.status());
  comm_ = std::move(comm).value();
  staged_ = ctx.mode == UpdateMode::kStaged;
  return Status::Ok();
}

Status NcclPath::Copy(const wire::StepBegin& begin, bool /*verify*/,
                      const util::Deadline& deadline) {
  WS_FAIL_POINT_RETURN("tcp.before_data");
  Status s = comm_->Transfer(pieces_, deadline, watch_);
  if (s.ok()) s = gpu_.MaybeInjectBitFlip();
  if (!s.ok()) {
    return link_->PublisherReason(s).WithContext("step " + std::to_string(begin.step) + " data");
  }
  return Status::Ok();
}

std::string NcclPath::Describe() const {
  return "; communicator rank 1 on cuda:" + std::to_string(device_) + ", NCCL " +
         cuda::nccl::NcclVersionString(cuda::nccl::NcclVersionCode()) + ", joined in " +
         std::to_string(static_cast<int>(comm_ ? comm_->connect_seconds() * 1000 : 0)) + " ms, " +
         (staged_ ? std::to_string(gpu_.staging_bytes()) + " staging bytes"
                  : std::string("in place"));
}

Status NcclPath::Release() {
  Status result;
  // The communicator first (abort: no NCCL kernel may write into staging or destinations after
  // it), then staging, digests and stream.
  if (comm_) {
    result.Update(comm_->Close());
    comm_.reset();
  }
  pieces_.clear();
  result.Update(gpu_.Release());
  return result;
}

}  // namespace weightsync::transport::path
