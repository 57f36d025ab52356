#include "transport/path/gpu_landing.h"

#include "cuda/gpu_digest_reference.h"
#include "plan/block_scaled_plan.h"
#include "util/fail_point.h"
#include "util/ledger.h"
#include "util/logging.h"

namespace weightsync::transport::path {

using util::LedgerAdd;
using util::LedgerItem;

// ---- GpuLanding ---------------------------------------------------------------------------

Result<int> GpuLanding::DestinationDevice(const std::vector<plan::Destination>& destinations,
                                          std::string_view transport) {
  int device = -1;
  for (const auto& d : destinations) {
    if (!d.device.is_cuda() || (device >= 0 && d.device.index != device)) {
      return Status::InvalidArgument(
          transport, ": destination '", d.spec.name, "' is on ", DeviceString(d.device),
          "; a GPU transfer delivers into destinations on one CUDA device",
          device >= 0 ? " (cuda:" + std::to_string(device) + ")" : std::string());
    }
    device = d.device.index;
  }
  if (device < 0) return Status::InvalidArgument(transport, ": no destination tensors");
  return device;
}

Status GpuLanding::Prepare(const plan::Plan* plan,
                           const std::vector<plan::Destination>& destinations, UpdateMode mode,
                           int device, const uint8_t* converted_source) {
  plan_ = plan;
  device_ = device;
  converted_source_ = mode == UpdateMode::kInPlace ? converted_source : nullptr;
  destinations_.clear();
  names_.clear();
  for (const auto& d : destinations) {
    destinations_.push_back(d.data);
    names_.push_back(d.spec.name);
  }
  WS_ASSIGN_OR_RETURN(queue_, cuda::CopyQueue::Create(device_));
  if (mode == UpdateMode::kStaged) {
    WS_ASSIGN_OR_RETURN(shadow_, cuda::DeviceBuffer::Allocate(plan->shadow_bytes));
    LedgerAdd(LedgerItem::kStagingBytes, static_cast<int64_t>(shadow_.size()));
  } else if (plan->landing_bytes > 0 && converted_source_ == nullptr) {
    WS_ASSIGN_OR_RETURN(landing_, cuda::DeviceBuffer::Allocate(plan->landing_bytes));
    LedgerAdd(LedgerItem::kStagingBytes, static_cast<int64_t>(landing_.size()));
  }
  // Digests prepared once over where each segment's bytes land, each writing its own output
  // word: a step only launches them. Segments converted straight from the publisher's bytes get a
  // launch each (pointed at the step's source, HashConvertedSource); every other one is in one
  // grouped launch pair (10^5 expert tensors would otherwise be 2 * 10^5 launches per verify).
  uint64_t source_chunks = 0;
  for (const auto& s : plan->segments) {
    if (converted_source_ != nullptr && s.converted) {
      source_chunks += cuda::GpuDigestChunkCount(s.bytes);
    }
  }
  WS_ASSIGN_OR_RETURN(chunk_hashes_,
                      cuda::DeviceBuffer::Allocate(std::max<uint64_t>(source_chunks, 1) * 8));
  WS_ASSIGN_OR_RETURN(digests_device_,
                      cuda::DeviceBuffer::Allocate(std::max<size_t>(plan->segments.size(), 1) * 8));
  digests_host_.assign(plan->segments.size(), 0);
  commit_.Clear();
  if (shadow_.data() != nullptr) {
    for (const plan::PlannedTensor& t : plan->tensors) {
      if (t.nbytes == 0 || t.transform != plan::Transform::kCopy) continue;
      commit_.Add(destinations_[t.destination] + t.dst_offset,
                  shadow_.as<uint8_t>() + t.shadow_offset, t.nbytes, t.destination);
    }
  }
  if (Result<cuda::PreparedCopyGroup> group = cuda::SplitOffSmallCopies(commit_, queue_.stream());
      group.ok()) {
    commit_small_ = std::move(*group);
  } else {
    WS_LOG(INFO, "cuda") << "small commit copies stay with the copy engines: " << group.status();
  }
  digest_launches_.clear();
  source_segments_.clear();
  std::vector<cuda::DigestRange> landed;
  uint64_t chunk_at = 0;
  for (size_t i = 0; i < plan->segments.size(); ++i) {
    const plan::Segment& s = plan->segments[i];
    uint64_t* digest = digests_device_.as<uint64_t>() + i;
    if (converted_source_ == nullptr || !s.converted) {
      landed.push_back({Received(s), s.bytes, digest});
      continue;
    }
    const uint64_t n = cuda::GpuDigestChunkCount(s.bytes);
    WS_ASSIGN_OR_RETURN(
        auto launch,
        cuda::PrepareDigest(Received(s), s.bytes, chunk_hashes_.as<uint64_t>() + chunk_at,
                            std::max<uint64_t>(n, 1), digest, queue_.stream()));
    digest_launches_.push_back(std::move(launch));
    source_segments_.push_back(static_cast<uint32_t>(i));
    chunk_at += n;
  }
  WS_ASSIGN_OR_RETURN(landed_digests_, cuda::PrepareDigestGroup(landed, queue_.stream()));
  if (converted_source_ != nullptr) return Status::Ok();  // the mover converts
  return PrepareConversions();
}

ConversionReport GpuLanding::conversion() const {
  if (plan_ == nullptr) return {};
  const plan::ConvertedFootprint converted = plan::ConvertedOf(*plan_);
  if (converted.tensors == 0) return {};
  return {converted.tensors, converted.bytes, ConvertedOn::kDestinationGpu, device_};
}

Status GpuLanding::HashConvertedSource(const uint8_t* base) {
  if (converted_source_ == nullptr) return Status::Ok();
  if (base == nullptr) return Status::Internal("hashing converted bytes of no source");
  const bool moved = base != converted_source_;
  converted_source_ = base;
  for (size_t k = 0; k < source_segments_.size(); ++k) {
    const plan::Segment& s = plan_->segments[source_segments_[k]];
    if (moved) WS_RETURN_IF_ERROR(digest_launches_[k].SetRange(base + s.src_offset, s.bytes));
    WS_RETURN_IF_ERROR(digest_launches_[k].Launch());
  }
  return Status::Ok();
}

void GpuLanding::SetConvertedDigestStream(cuda::StreamHandle stream) {
  for (cuda::PreparedDigest& launch : digest_launches_) launch.set_stream(stream);
}

Status Conversions::AddCast(DType from, DType to, const uint8_t* src, uint8_t* dst,
                            uint64_t elements, std::string_view what, std::string_view name,
                            cuda::StreamHandle stream) {
  Result<cuda::PreparedLaunch> launch = cuda::PrepareCast(from, to, src, dst, elements, stream);
  if (!launch.ok()) {
    return launch.status().WithContext("preparing the " + std::string(what) + " of '" +
                                       std::string(name) + "'");
  }
  casts_.push_back(std::move(launch).value());
  return Status::Ok();
}

Status Conversions::Add(const plan::Plan& plan, const plan::PlannedTensor& t, const uint8_t* src,
                        std::span<uint8_t* const> destinations, std::span<const std::string> names,
                        cuda::StreamHandle stream) {
  switch (t.transform) {
    case plan::Transform::kCopy:
      return Status::Internal("conversions: '", names[t.destination], "' needs no conversion");
    case plan::Transform::kQuantizeFp8:
      fp8_tensors_.push_back(cuda::Fp8GroupTensor{
          src, destinations[t.destination], destinations[t.scale_destination], t.rows, t.cols,
          t.e8m0_scales ? cuda::Fp8ScaleFormat::kE8M0 : cuda::Fp8ScaleFormat::kFloat32});
      return Status::Ok();
    case plan::Transform::kQuantizeMxfp8:
    case plan::Transform::kQuantizeNvfp4: {
      const bool nvfp4 = t.transform == plan::Transform::kQuantizeNvfp4;
      block_scaled_tensors_.push_back(cuda::BlockScaledTensor{
          t.from, src, destinations[t.destination], destinations[t.scale_destination],
          nvfp4 ? destinations[t.global_scale_destination] : nullptr, t.rows, t.cols,
          nvfp4 ? cuda::BlockFormat::kNvfp4 : cuda::BlockFormat::kMxfp8,
          plan::ScaleLayoutOf(t.scale_layout)});
      block_scaled_names_.push_back(names[t.destination]);
      return Status::Ok();
    }
    case plan::Transform::kCast:
      // Regions: a run of the destination (dst_offset); whole tensors: all of it (offset 0).
      return AddCast(t.from, t.to, src, destinations[t.destination] + t.dst_offset, t.elements,
                     "cast", names[t.destination], stream);
    case plan::Transform::kExtract:
      for (uint32_t e = 0; e < t.extract_count; ++e) {
        const plan::Extract& piece = plan.extracts[t.first_extract + e];
        uint8_t* into = destinations[piece.destination] + piece.dst_offset;
        if (piece.to == t.from) {
          copies_.Add(into, src + piece.offset, piece.bytes, piece.destination);
          continue;
        }
        const uint64_t elements = piece.bytes / (Info(t.from).bits / 8);
        if (elements == 0) continue;
        WS_RETURN_IF_ERROR(AddCast(t.from, piece.to, src + piece.offset, into, elements,
                                   "cast (a piece of a verified segment)", names[piece.destination],
                                   stream));
      }
      return Status::Ok();
  }
  return Status::Internal("conversions: unknown transform");
}

Status Conversions::Finish(cuda::StreamHandle stream) {
  if (!fp8_tensors_.empty()) {
    Result<cuda::PreparedFp8Group> group = cuda::PrepareQuantizeFp8Group(fp8_tensors_, stream);
    if (!group.ok()) {
      return group.status().WithContext("preparing the fp8 quantization of " +
                                        std::to_string(fp8_tensors_.size()) + " tensor(s)");
    }
    fp8_ = std::move(group).value();
  }
  if (!block_scaled_tensors_.empty()) {
    Result<cuda::PreparedBlockScaledGroup> group =
        cuda::PrepareQuantizeBlockScaledGroup(block_scaled_tensors_, stream);
    if (!group.ok()) {
      // The kernel names a tensor by its index in the group: say which one that is.
      std::string names;
      for (size_t i = 0; i < block_scaled_names_.size(); ++i) {
        names += (i ? ", " : "") + std::to_string(i) + ": '" + block_scaled_names_[i] + "'";
      }
      return group.status().WithContext("preparing the MXFP8/NVFP4 quantization of " +
                                        std::to_string(block_scaled_tensors_.size()) +
                                        " tensor(s) (" + names + ")");
    }
    block_scaled_ = std::move(group).value();
  }
  return Status::Ok();
}

Status Conversions::Launch(cuda::CopyQueue& queue) {
  if (!copies_.empty()) WS_RETURN_IF_ERROR(queue.EnqueueBatch(copies_));
  for (cuda::PreparedLaunch& launch : casts_) WS_RETURN_IF_ERROR(launch.Launch());
  WS_RETURN_IF_ERROR(fp8_.Launch());
  return block_scaled_.Launch();
}

void Conversions::Clear() {
  casts_.clear();
  fp8_tensors_.clear();
  fp8_ = cuda::PreparedFp8Group();
  block_scaled_tensors_.clear();
  block_scaled_names_.clear();
  block_scaled_ = cuda::PreparedBlockScaledGroup();
  copies_.Clear();
}

void HostPin::Pin(std::span<const uint8_t> memory, bool read_only, int device,
                  std::string_view what) {
  Result<cuda::HostRegistration> pin =
      cuda::HostRegistration::Register(memory.data(), memory.size(), read_only);
  if (pin.ok()) {
    registration_ = std::move(pin).value();
    pageable_reason_.clear();
    return;
  }
  pageable_reason_ = pin.status().ToString();
  WS_LOG(INFO, "gpu") << what << " stays pageable (copies to cuda:" << device
                      << " go through the driver's bounce buffers): " << pin.status();
}

std::string HostPin::Describe() const {
  return pageable_reason_.empty() ? " from pinned memory"
                                  : " from pageable memory (" + pageable_reason_ + ")";
}

Status HostPin::Close() {
  pageable_reason_.clear();
  return registration_.Close();
}

std::vector<uint32_t> WrittenDestinations(const plan::Plan& plan, const plan::PlannedTensor& t) {
  std::vector<uint32_t> out;
  if (t.transform == plan::Transform::kExtract) {
    for (uint32_t e = 0; e < t.extract_count; ++e) {
      out.push_back(plan.extracts[t.first_extract + e].destination);
    }
    return out;
  }
  out.push_back(t.destination);
  if (t.scale_destination != plan::kNoDestination) out.push_back(t.scale_destination);
  if (t.global_scale_destination != plan::kNoDestination) {
    out.push_back(t.global_scale_destination);
  }
  return out;
}

// Launches built once over fixed pointers (where the published bytes land → the destination):
// a commit only enqueues them.
Status GpuLanding::PrepareConversions() {
  conversions_.Clear();
  for (uint32_t k : plan_->converted) {
    const plan::PlannedTensor& t = plan_->tensors[k];
    if (t.nbytes == 0 && !plan::IsBlockScaled(t.transform)) continue;  // those are refused
    WS_RETURN_IF_ERROR(
        conversions_.Add(*plan_, t, Received(t), destinations_, names_, queue_.stream()));
  }
  return conversions_.Finish(queue_.stream());
}

uint8_t* GpuLanding::Received(const plan::PlannedTensor& t) const {
  if (shadow_.data() != nullptr) return shadow_.as<uint8_t>() + t.shadow_offset;
  return t.transform != plan::Transform::kCopy ? landing_.as<uint8_t>() + t.landing_offset
                                               : destinations_[t.destination] + t.dst_offset;
}

uint8_t* GpuLanding::Received(const plan::Segment& s) const {
  if (shadow_.data() != nullptr) return shadow_.as<uint8_t>() + s.shadow_offset;
  if (!s.converted) return destinations_[s.destination] + s.dst_offset;
  // Converted straight from the publisher's bytes: the digest reads them there (read only).
  if (converted_source_ != nullptr) return const_cast<uint8_t*>(converted_source_) + s.src_offset;
  return landing_.as<uint8_t>() + s.landing_offset;
}

Status GpuLanding::MaybeInjectBitFlip(const char* point) {
  if (util::FailPoints::Check(point).action != util::FailAction::kFlip || plan_->segments.empty()) {
    return Status::Ok();
  }
  // The middle segment, or the next one after it (wrapping) whose bytes landed here: never the
  // publisher's own bytes (a segment converted straight from its arena).
  const size_t n = plan_->segments.size();
  const plan::Segment* chosen = nullptr;
  for (size_t k = 0; k < n && chosen == nullptr; ++k) {
    const plan::Segment& c = plan_->segments[(n / 2 + k) % n];
    if (c.bytes > 0 && !(c.converted && converted_source_ != nullptr)) chosen = &c;
  }
  if (chosen == nullptr) {
    // Fired but nothing to flip: say so, so no fault test passes with nothing injected.
    return Status::FailedPrecondition("fail point ", point,
                                      ": no received byte to flip (every segment is converted "
                                      "from the publisher)");
  }
  const plan::Segment& s = *chosen;
  uint8_t* where = Received(s);
  uint8_t byte = 0;
  WS_RETURN_IF_ERROR(cuda::CopyToHost(&byte, where + s.bytes / 2, 1));
  byte ^= 0x04;
  return cuda::CopyToDevice(where + s.bytes / 2, &byte, 1);
}

Status GpuLanding::Verify(std::span<const uint64_t> digests, int64_t step,
                          const util::Deadline& deadline) {
  WS_RETURN_IF_ERROR(plan::CheckVerifiable(*plan_, step));
  WS_RETURN_IF_ERROR(cuda::SetDevice(device_));
  // Segments converted straight from the publisher were hashed during the copy.
  WS_RETURN_IF_ERROR(landed_digests_.Launch());
  WS_RETURN_IF_ERROR(
      queue_.Enqueue(digests_host_.data(), digests_device_.data(), digests_host_.size() * 8));
  WS_RETURN_IF_ERROR(queue_.Wait(deadline));
  size_t bad = 0, first = digests_host_.size();
  for (size_t i = 0; i < digests_host_.size(); ++i) {
    if (digests_host_[i] != digests[plan_->segments[i].digest_index]) {
      ++bad;
      first = std::min(first, i);
    }
  }
  if (bad == 0) return Status::Ok();
  const plan::Segment& s = plan_->segments[first];
  // Offsets are into the tensor as published (for a converted tensor, before converting).
  return Status::Corruption("step ", step, ": tensor '", names_[s.destination], "' ",
                            s.converted ? "published bytes [" : "bytes [", s.dst_offset, ", ",
                            s.dst_offset + s.bytes, ") (segment ", s.digest_index,
                            ") do not match the publisher's GPU digest; ", bad,
                            " corrupt segment(s) in all; nothing committed");
}

Status GpuLanding::Commit(const util::Deadline& deadline) {
  if (commit_.empty() && commit_small_.empty() && conversions_.empty()) return Status::Ok();
  WS_RETURN_IF_ERROR(cuda::SetDevice(device_));
  WS_RETURN_IF_ERROR(queue_.EnqueueBatch(commit_, &commit_small_));
  WS_RETURN_IF_ERROR(conversions_.Launch(queue_));
  return queue_.Wait(deadline);
}

Status GpuLanding::Release() {
  Status result;
  // A cancelled or timed-out step's copies and kernels may still run: they end before anything
  // they touch (staging, digests, the arena mapping the caller releases next) goes.
  result.Update(queue_.Drain());
  // Reverse order of creation.
  conversions_.Clear();
  commit_small_ = cuda::PreparedCopyGroup();
  digest_launches_.clear();
  source_segments_.clear();
  landed_digests_ = cuda::PreparedDigestGroup();
  result.Update(digests_device_.Close());
  result.Update(chunk_hashes_.Close());
  LedgerAdd(LedgerItem::kStagingBytes, -static_cast<int64_t>(shadow_.size() + landing_.size()));
  result.Update(landing_.Close());
  result.Update(shadow_.Close());
  result.Update(queue_.Close());
  return result;
}

// ---- GpuCopyPath --------------------------------------------------------------------------

}  // namespace weightsync::transport::path
