#include "transport/cuda_ipc/cuda_data_path.h"

#include <functional>

#include "cuda/gpu_digest_reference.h"
#include "util/logging.h"
#include "util/fail_point.h"
#include "util/ledger.h"

namespace weightsync::transport::cuda_ipc {

using util::LedgerAdd;
using util::LedgerItem;

// ---- GpuReceiver ---------------------------------------------------------------------------

Result<int> GpuReceiver::DestinationDevice(const std::vector<plan::Destination>& destinations,
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

Status GpuReceiver::Prepare(const plan::Plan* plan,
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
  WS_ASSIGN_OR_RETURN(queue_, CopyQueue::Create(device_));
  if (mode == UpdateMode::kStaged) {
    WS_ASSIGN_OR_RETURN(shadow_, gpu::DeviceBuffer::Allocate(plan->shadow_bytes));
    LedgerAdd(LedgerItem::kStagingBytes, static_cast<int64_t>(shadow_.size()));
  } else if (plan->landing_bytes > 0 && converted_source_ == nullptr) {
    WS_ASSIGN_OR_RETURN(landing_, gpu::DeviceBuffer::Allocate(plan->landing_bytes));
    LedgerAdd(LedgerItem::kStagingBytes, static_cast<int64_t>(landing_.size()));
  }
  // One prepared digest per segment over where its bytes land, each with its own chunk scratch
  // and output word: a step only launches them.
  uint64_t chunks = 0;
  for (const auto& s : plan->segments) chunks += gpu::GpuDigestChunkCount(s.bytes);
  WS_ASSIGN_OR_RETURN(chunk_hashes_,
                      gpu::DeviceBuffer::Allocate(std::max<uint64_t>(chunks, 1) * 8));
  WS_ASSIGN_OR_RETURN(digests_device_,
                      gpu::DeviceBuffer::Allocate(std::max<size_t>(plan->segments.size(), 1) * 8));
  digests_host_.assign(plan->segments.size(), 0);
  commit_dsts_.clear();
  commit_srcs_.clear();
  commit_sizes_.clear();
  if (shadow_.data() != nullptr) {
    for (const plan::PlannedTensor& t : plan->tensors) {
      if (t.nbytes == 0 || t.transform != plan::Transform::kCopy) continue;
      commit_dsts_.push_back(destinations_[t.destination]);
      commit_srcs_.push_back(shadow_.as<uint8_t>() + t.shadow_offset);
      commit_sizes_.push_back(t.nbytes);
    }
  }
  digest_launches_.clear();
  digest_launches_.reserve(plan->segments.size());
  uint64_t chunk_at = 0;
  for (size_t i = 0; i < plan->segments.size(); ++i) {
    const plan::Segment& s = plan->segments[i];
    uint8_t* where = Received(s);
    uint64_t n = gpu::GpuDigestChunkCount(s.bytes);
    WS_ASSIGN_OR_RETURN(auto launch,
                        gpu::PrepareDigest(where, s.bytes, chunk_hashes_.as<uint64_t>() + chunk_at,
                                           std::max<uint64_t>(n, 1),
                                           digests_device_.as<uint64_t>() + i, queue_.stream()));
    digest_launches_.push_back(std::move(launch));
    chunk_at += n;
  }
  if (converted_source_ != nullptr) return Status::Ok();  // the mover converts
  return PrepareConversions();
}

Status GpuReceiver::HashConvertedSource(const uint8_t* base) {
  if (converted_source_ == nullptr) return Status::Ok();
  const bool moved = base != converted_source_;
  converted_source_ = base;
  for (size_t i = 0; i < plan_->segments.size(); ++i) {
    const plan::Segment& s = plan_->segments[i];
    if (!s.converted) continue;
    if (moved) WS_RETURN_IF_ERROR(digest_launches_[i].SetRange(base + s.src_offset, s.bytes));
    WS_RETURN_IF_ERROR(digest_launches_[i].Launch());
  }
  return Status::Ok();
}

void GpuReceiver::SetConvertedDigestStream(gpu::StreamHandle stream) {
  for (size_t i = 0; i < plan_->segments.size(); ++i) {
    if (plan_->segments[i].converted) digest_launches_[i].set_stream(stream);
  }
}

Status Conversions::Add(const plan::PlannedTensor& t, const void* src, void* dst, void* scale_dst,
                        std::string_view name, gpu::StreamHandle stream) {
  if (t.transform == plan::Transform::kQuantizeFp8) {
    fp8_tensors_.push_back(gpu::Fp8GroupTensor{
        src, dst, scale_dst, t.rows, t.cols,
        t.e8m0_scales ? gpu::Fp8ScaleFormat::kE8M0 : gpu::Fp8ScaleFormat::kFloat32});
    return Status::Ok();
  }
  Result<gpu::PreparedLaunch> launch = gpu::PrepareCast(t.from, t.to, src, dst, t.elements, stream);
  if (!launch.ok()) {
    return launch.status().WithContext("preparing the " +
                                       std::string(plan::TransformName(t.transform)) + " of '" +
                                       std::string(name) + "'");
  }
  casts_.push_back(std::move(launch).value());
  return Status::Ok();
}

Status Conversions::Finish(gpu::StreamHandle stream) {
  if (fp8_tensors_.empty()) return Status::Ok();
  Result<gpu::PreparedFp8Group> group = gpu::PrepareQuantizeFp8Group(fp8_tensors_, stream);
  if (!group.ok()) {
    return group.status().WithContext("preparing the fp8 quantization of " +
                                      std::to_string(fp8_tensors_.size()) + " tensor(s)");
  }
  fp8_ = std::move(group).value();
  return Status::Ok();
}

Status Conversions::Launch() {
  for (gpu::PreparedLaunch& launch : casts_) WS_RETURN_IF_ERROR(launch.Launch());
  return fp8_.Launch();
}

void Conversions::Clear() {
  casts_.clear();
  fp8_tensors_.clear();
  fp8_ = gpu::PreparedFp8Group();
}

// Launches built once over fixed pointers (where the published bytes land → the destination):
// a commit only enqueues them.
Status GpuReceiver::PrepareConversions() {
  conversions_.Clear();
  for (uint32_t k : plan_->converted) {
    const plan::PlannedTensor& t = plan_->tensors[k];
    if (t.elements == 0) continue;
    WS_RETURN_IF_ERROR(conversions_.Add(
        t, Received(t), destinations_[t.destination],
        t.transform == plan::Transform::kQuantizeFp8 ? destinations_[t.scale_destination] : nullptr,
        names_[t.destination], queue_.stream()));
  }
  return conversions_.Finish(queue_.stream());
}

uint8_t* GpuReceiver::Received(const plan::PlannedTensor& t) const {
  if (shadow_.data() != nullptr) return shadow_.as<uint8_t>() + t.shadow_offset;
  return t.transform != plan::Transform::kCopy ? landing_.as<uint8_t>() + t.landing_offset
                                               : destinations_[t.destination];
}

uint8_t* GpuReceiver::Received(const plan::Segment& s) const {
  if (shadow_.data() != nullptr) return shadow_.as<uint8_t>() + s.shadow_offset;
  if (!s.converted) return destinations_[s.destination] + s.dst_offset;
  // Converted straight from the publisher's bytes: the digest reads them there (read only).
  if (converted_source_ != nullptr) return const_cast<uint8_t*>(converted_source_) + s.src_offset;
  return landing_.as<uint8_t>() + s.landing_offset;
}

Status GpuReceiver::MaybeInjectBitFlip() {
  if (util::FailPoints::Check("subscriber.flip_received").action != util::FailAction::kFlip ||
      plan_->segments.empty()) {
    return Status::Ok();
  }
  const plan::Segment& s = plan_->segments[plan_->segments.size() / 2];
  // Never flip the publisher's own bytes (a segment converted straight from its arena).
  if (s.bytes == 0 || (s.converted && converted_source_ != nullptr)) return Status::Ok();
  uint8_t* where = Received(s);
  uint8_t byte = 0;
  WS_RETURN_IF_ERROR(gpu::CopyToHost(&byte, where + s.bytes / 2, 1));
  byte ^= 0x04;
  return gpu::CopyToDevice(where + s.bytes / 2, &byte, 1);
}

Status GpuReceiver::Verify(std::span<const uint64_t> digests, int64_t step,
                           const util::Deadline& deadline) {
  WS_RETURN_IF_ERROR(SetDevice(device_));
  for (size_t i = 0; i < digest_launches_.size(); ++i) {
    // Segments converted straight from the publisher were hashed during the copy.
    if (converted_source_ != nullptr && plan_->segments[i].converted) continue;
    WS_RETURN_IF_ERROR(digest_launches_[i].Launch());
  }
  WS_RETURN_IF_ERROR(queue_.Enqueue(digests_host_.data(), digests_device_.data(),
                                    digests_host_.size() * 8));
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
                            s.converted ? "published bytes [" : "bytes [",
                            s.dst_offset, ", ", s.dst_offset + s.bytes, ") (segment ",
                            s.digest_index, ") do not match the publisher's GPU digest; ", bad,
                            " corrupt segment(s) in all; nothing committed");
}

Status GpuReceiver::Commit(const util::Deadline& deadline) {
  if (commit_dsts_.empty() && conversions_.empty()) return Status::Ok();
  WS_RETURN_IF_ERROR(SetDevice(device_));
  if (!commit_dsts_.empty()) {
    WS_RETURN_IF_ERROR(queue_.EnqueueBatch(commit_dsts_.data(), commit_srcs_.data(),
                                           commit_sizes_.data(), commit_dsts_.size()));
  }
  WS_RETURN_IF_ERROR(conversions_.Launch());
  return queue_.Wait(deadline);
}

Status GpuReceiver::Release() {
  Status result;
  // A cancelled or timed-out step's copies and kernels may still run: they end before anything
  // they touch (staging, digests, the arena mapping the caller releases next) goes.
  result.Update(queue_.Drain());
  // Reverse order of creation.
  conversions_.Clear();
  digest_launches_.clear();
  result.Update(digests_device_.Close());
  result.Update(chunk_hashes_.Close());
  LedgerAdd(LedgerItem::kStagingBytes, -static_cast<int64_t>(shadow_.size() + landing_.size()));
  result.Update(landing_.Close());
  result.Update(shadow_.Close());
  result.Update(queue_.Close());
  return result;
}

// ---- CudaDataPath --------------------------------------------------------------------------

Status CudaDataPath::Prepare(int arena_fd, const wire::Welcome& welcome, const plan::Plan* plan,
                             const std::vector<plan::Destination>& destinations,
                             UpdateMode mode, bool on_publisher_gpu) {
  WS_ASSIGN_OR_RETURN(int device, GpuReceiver::DestinationDevice(destinations, "cuda-ipc"));
  if (welcome.direct_bytes > 0) {
    return Status::NotSupported("cuda-ipc: arena-allocated GPU tensors are not supported yet");
  }
  WS_ASSIGN_OR_RETURN(arena_, ImportedAllocation::Import(arena_fd, welcome.arena_bytes, device));
  auto slot_base = [&](uint32_t k) -> const uint8_t* {
    return arena_.data() + welcome.slots_offset + uint64_t{k} * welcome.slot_bytes;
  };
  // In place, converted tensors are converted straight out of the publisher's arena.
  const bool direct = mode == UpdateMode::kInPlace && !plan->converted.empty();
  WS_RETURN_IF_ERROR(
      receiver_.Prepare(plan, destinations, mode, device, direct ? slot_base(0) : nullptr));
  // Where the conversions run (in place only): on the publisher's GPU when asked and possible,
  // else here. A failed attempt there is logged and the batches are built again here.
  source_device_ = -1;
  if (direct && on_publisher_gpu) {
    ScopedDevice restore;  // the attempt visits the publisher's GPU
    Status s = PrepareSourceGpu(*plan, destinations, device);
    if (s.ok()) {
      Status built = BuildBatches(welcome, plan, destinations, direct, slot_base);
      if (built.ok()) {
        // With verify, the publisher's GPU also hashes the bytes it converts (locally).
        receiver_.SetConvertedDigestStream(source_queue_.stream());
        return Status::Ok();
      }
      s = built;
    }
    WS_LOG(INFO, "cuda-ipc") << "conversions run on cuda:" << device
                             << " (the destinations' GPU), not the publisher's: " << s;
    WS_RETURN_IF_ERROR(SetDevice(device));
    source_queue_ = CopyQueue();
    source_device_ = -1;
  }
  return BuildBatches(welcome, plan, destinations, direct, slot_base);
}

Status CudaDataPath::PrepareSourceGpu(const plan::Plan& plan,
                                      const std::vector<plan::Destination>& destinations,
                                      int device) {
  WS_FAIL_POINT_RETURN("cuda_ipc.publisher_gpu");
  const int owner = arena_.owner_device();
  if (owner < 0) return Status::Unavailable("the driver does not say which GPU holds the arena");
  if (owner == device) return Status::Unavailable("the publisher's GPU is this one");
  WS_RETURN_IF_ERROR(arena_.GrantAccess(owner).WithContext("the arena for cuda:" +
                                                           std::to_string(owner)));
  WS_RETURN_IF_ERROR(EnablePeerAccess(owner, device));
  // Only what the conversions write must be writable from there (copies stay on this device).
  for (uint32_t k : plan.converted) {
    const plan::PlannedTensor& t = plan.tensors[k];
    for (uint32_t index : {t.destination, t.scale_destination}) {
      if (index == plan::kNoDestination) continue;
      const plan::Destination& d = destinations[index];
      if (d.data == nullptr || d.spec.nbytes == 0) continue;
      WS_ASSIGN_OR_RETURN(bool writable, DeviceCanWrite(owner, d.data, d.spec.nbytes));
      if (!writable) {
        return Status::Unavailable("destination '", d.spec.name, "' is not writable from cuda:",
                                   owner);
      }
    }
  }
  WS_ASSIGN_OR_RETURN(source_queue_, CopyQueue::Create(owner));
  source_device_ = owner;
  return Status::Ok();
}

Status CudaDataPath::BuildBatches(const wire::Welcome& welcome, const plan::Plan* plan,
                                  const std::vector<plan::Destination>& destinations, bool direct,
                                  const std::function<const uint8_t*(uint32_t)>& slot_base) {
  // Copy batches and conversion launches, built once: a step submits one batch. Conversions are
  // prepared on the device that will run them (its stream, its job table).
  const bool at_source = source_device_ >= 0;
  void* conversion_stream = at_source ? source_queue_.stream() : receiver_.queue().stream();
  WS_RETURN_IF_ERROR(SetDevice(at_source ? source_device_ : receiver_.device()));
  slot_batches_.clear();
  slot_batches_.resize(welcome.slot_count);
  Status status;
  for (uint32_t k = 0; k < welcome.slot_count && status.ok(); ++k) {
    Batch& batch = slot_batches_[k];
    batch.base = slot_base(k);
    for (const plan::PlannedTensor& t : plan->tensors) {
      if (t.nbytes == 0) continue;
      const uint8_t* src = batch.base + welcome.tensors[t.publisher_index].offset;
      if (direct && t.transform != plan::Transform::kCopy) {
        status = batch.conversions
                     .Add(t, src, destinations[t.destination].data,
                          t.transform == plan::Transform::kQuantizeFp8
                              ? destinations[t.scale_destination].data
                              : nullptr,
                          destinations[t.destination].spec.name, conversion_stream)
                     .WithContext("cuda-ipc");
        if (!status.ok()) break;
        continue;
      }
      batch.dsts.push_back(receiver_.Received(t));
      batch.srcs.push_back(src);
      batch.sizes.push_back(t.nbytes);
    }
    if (status.ok()) status = batch.conversions.Finish(conversion_stream).WithContext("cuda-ipc");
  }
  if (!status.ok()) slot_batches_.clear();  // job tables freed on the device they were made on
  status.Update(SetDevice(receiver_.device()));
  return status;
}

Status CudaDataPath::Copy(uint32_t slot, bool verify, const util::Deadline& deadline) {
  Batch& b = slot_batches_[slot];
  CopyQueue& queue = receiver_.queue();
  WS_RETURN_IF_ERROR(SetDevice(receiver_.device()));
  // A tensor is contiguous on both sides: one copy-engine transfer per tensor, all submitted at
  // once (first, so they overlap the conversions on the publisher's GPU).
  if (!b.dsts.empty()) {
    WS_RETURN_IF_ERROR(
        queue.EnqueueBatch(b.dsts.data(), b.srcs.data(), b.sizes.data(), b.dsts.size()));
  }
  if (source_device_ >= 0 && !b.conversions.empty()) {
    // On the publisher's GPU: read its memory locally, write the converted bytes across the
    // link, hash what was converted while the step is pinned; this device's stream waits for it
    // all (on the GPU) before the step counts as copied.
    ScopedDevice restore;
    WS_RETURN_IF_ERROR(SetDevice(source_device_));
    WS_RETURN_IF_ERROR(b.conversions.Launch());
    if (verify) WS_RETURN_IF_ERROR(receiver_.HashConvertedSource(b.base));
    WS_RETURN_IF_ERROR(source_queue_.SignalTo(queue.stream()));
  } else {
    WS_RETURN_IF_ERROR(b.conversions.Launch());
    // The publisher unpins the slot once it hears the copy is done: hash what was read from it now.
    if (verify && !b.conversions.empty()) {
      WS_RETURN_IF_ERROR(receiver_.HashConvertedSource(b.base));
    }
  }
  WS_RETURN_IF_ERROR(queue.Wait(deadline));
  return receiver_.MaybeInjectBitFlip();
}

Status CudaDataPath::Release() {
  Status result;
  // Nothing in flight on this device's stream either (a cancelled step): its conversions use the
  // job tables freed with the batches below.
  result.Update(receiver_.queue().Drain());
  // Reverse order of creation: the publisher-GPU queue (drained: its kernels write the
  // destinations), the receiver (digests, staging, stream), then the mapping.
  if (source_device_ >= 0) {
    // Unbounded: the kernels there are finite, and until they end they read the arena and write
    // the destinations. Their job tables are freed with the batches, that device current.
    ScopedDevice restore;
    result.Update(source_queue_.Drain());
    result.Update(SetDevice(source_device_));
    slot_batches_.clear();
    result.Update(source_queue_.Close());
    source_device_ = -1;
  }
  slot_batches_.clear();
  result.Update(receiver_.Release());
  result.Update(arena_.Close());
  return result;
}

}  // namespace weightsync::transport::cuda_ipc
