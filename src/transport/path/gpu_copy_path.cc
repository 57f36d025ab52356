#include "transport/path/gpu_copy_path.h"

#include <algorithm>
#include <functional>

#include "transport/link/step_exchange.h"
#include "transport/path/ring_copies.h"
#include "util/fail_point.h"
#include "util/logging.h"

namespace weightsync::transport::path {

GpuCopyPath::~GpuCopyPath() {
  if (Status s = Release(); !s.ok()) WS_LOG(WARN, "cuda-ipc") << "path cleanup: " << s;
}

Status GpuCopyPath::Prepare(const PathContext& ctx) {
  const wire::Welcome& welcome = *ctx.welcome;
  const plan::Plan* plan = ctx.plan;
  const std::vector<plan::Destination>& destinations = *ctx.destinations;
  const UpdateMode mode = ctx.mode;
  const bool on_publisher_gpu = ctx.options->convert_on_publisher_gpu;
  welcome_device_ = welcome.device;
  WS_ASSIGN_OR_RETURN(int device, GpuLanding::DestinationDevice(destinations, "cuda-ipc"));
  zero_copy_ = welcome.arena_kind == wire::ArenaKind::kCudaIpc;
  ring_ = welcome.arena_kind == wire::ArenaKind::kCudaRing;
  welcome_ = ctx.welcome;
  link_ = ctx.link;
  if (zero_copy_) {
    WS_RETURN_IF_ERROR(OpenAllocations(welcome, ctx.allocation_fds, device));
  } else {
    if (welcome.direct_bytes > 0) {
      return Status::NotSupported("cuda-ipc: arena-allocated GPU tensors are not supported yet");
    }
    util::UniqueFd arena_fd = std::move(*ctx.store_fd);
    WS_ASSIGN_OR_RETURN(
        arena_, cuda::ImportedAllocation::Import(arena_fd.get(), welcome.arena_bytes, device));
    WS_RETURN_IF_ERROR(arena_fd.Close());  // the import holds the allocation
  }
  auto slot_base = [&](uint32_t k) -> const uint8_t* {
    return zero_copy_ ? nullptr
                      : arena_.data() + welcome.slots_offset + uint64_t{k} * welcome.slot_bytes;
  };
  conversions_ = plan->converted.size();
  // In place, converted tensors are converted straight out of the publisher's arena (zero-copy:
  // they land first; the publisher's allocations have no one base to address segments from; a
  // ring: they land first, as a bucket is gone once read).
  const bool direct =
      mode == UpdateMode::kInPlace && !plan->converted.empty() && !zero_copy_ && !ring_;
  if (zero_copy_ && on_publisher_gpu && !plan->converted.empty()) {
    WS_LOG(INFO, "cuda-ipc") << "conversions run on cuda:" << device
                             << " after landing: a zero-copy publisher's tensors are converted "
                                "here, not on its GPU";
  }
  WS_RETURN_IF_ERROR(
      receiver_.Prepare(plan, destinations, mode, device, direct ? slot_base(0) : nullptr));
  // Where the conversions run (in place only): on the publisher's GPU when asked and possible,
  // else here. A failed attempt there is logged and the batches are built again here.
  source_device_ = -1;
  if (direct && on_publisher_gpu) {
    cuda::ScopedDevice restore;  // the attempt visits the publisher's GPU
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
    WS_RETURN_IF_ERROR(cuda::SetDevice(device));
    source_queue_ = cuda::CopyQueue();
    source_device_ = -1;
  }
  return BuildBatches(welcome, plan, destinations, direct, slot_base);
}

Status GpuCopyPath::PrepareSourceGpu(const plan::Plan& plan,
                                     const std::vector<plan::Destination>& destinations,
                                     int device) {
  WS_FAIL_POINT_RETURN("cuda_ipc.publisher_gpu");
  const int owner = arena_.owner_device();
  if (owner < 0) return Status::Unavailable("the driver does not say which GPU holds the arena");
  if (owner == device) return Status::Unavailable("the publisher's GPU is this one");
  WS_RETURN_IF_ERROR(
      arena_.GrantAccess(owner).WithContext("the arena for cuda:" + std::to_string(owner)));
  WS_RETURN_IF_ERROR(cuda::EnablePeerAccess(owner, device));
  // Only what the conversions write must be writable from there (copies stay on this device).
  for (uint32_t k : plan.converted) {
    const plan::PlannedTensor& t = plan.tensors[k];
    for (uint32_t index : WrittenDestinations(plan, t)) {
      const plan::Destination& d = destinations[index];
      if (d.data == nullptr || d.spec.nbytes == 0) continue;
      WS_ASSIGN_OR_RETURN(bool writable, cuda::DeviceCanWrite(owner, d.data, d.spec.nbytes));
      if (!writable) {
        return Status::Unavailable("destination '", d.spec.name,
                                   "' is not writable from cuda:", owner);
      }
    }
  }
  WS_ASSIGN_OR_RETURN(source_queue_, cuda::CopyQueue::Create(owner));
  source_device_ = owner;
  return Status::Ok();
}

Status GpuCopyPath::BuildBatches(const wire::Welcome& welcome, const plan::Plan* plan,
                                 const std::vector<plan::Destination>& destinations, bool direct,
                                 const std::function<const uint8_t*(uint32_t)>& slot_base) {
  // Copy batches and conversion launches, built once: a step submits one batch. Conversions are
  // prepared on the device that will run them (its stream, its job table).
  const bool at_source = source_device_ >= 0;
  void* conversion_stream = at_source ? source_queue_.stream() : receiver_.queue().stream();
  WS_RETURN_IF_ERROR(cuda::SetDevice(at_source ? source_device_ : receiver_.device()));
  slot_batches_.clear();
  // Zero-copy: every version is the same memory, so one batch serves all. A ring: one batch per
  // bucket of the version.
  slot_batches_.resize(zero_copy_ ? 1 : ring_ ? welcome.version_buckets : welcome.slot_count);
  if (ring_) {
    std::vector<cuda::CopyBatch> copies =
        RingCopyBatches(welcome, *plan, arena_.data() + welcome.slots_offset,
                        [&](const plan::PlannedTensor& t) { return receiver_.Received(t); });
    for (uint32_t b = 0; b < copies.size(); ++b) slot_batches_[b].copies = std::move(copies[b]);
  }
  Status status;
  for (uint32_t k = 0; k < slot_batches_.size() && status.ok(); ++k) {
    Batch& batch = slot_batches_[k];
    batch.base = slot_base(ring_ ? k % welcome.slot_count : k);
    for (const plan::PlannedTensor& t : plan->tensors) {
      if (ring_) break;  // RingCopyBatches made the ring's
      if (t.nbytes == 0) continue;
      const uint64_t offset = welcome.tensors[t.publisher_index].offset + t.src_offset;
      // Zero-copy: the publisher's allocation the run lies in (ValidateLayout placed every tensor
      // inside one, so a run of one is inside it too).
      const int64_t k = zero_copy_ ? plan::AllocationHolding(welcome, offset, t.nbytes) : 0;
      const uint8_t* src =
          zero_copy_ ? allocations_[k] + (offset - allocation_offsets_[k]) : batch.base + offset;
      // A copy batch folds rows of one span only: its sources must be one allocation (zero-copy:
      // allocation k; else the arena) and its destinations one tensor.
      const uint64_t span =
          zero_copy_ ? uint64_t{t.destination} << 32 | static_cast<uint64_t>(k) : t.destination;
      if (direct && t.transform != plan::Transform::kCopy) {
        status = batch.conversions
                     .Add(*plan, t, src, receiver_.destination_bases(), receiver_.names(),
                          conversion_stream)
                     .WithContext("cuda-ipc");
        if (!status.ok()) break;
        continue;
      }
      batch.copies.Add(receiver_.Received(t), src, t.nbytes, span);
    }
    if (status.ok()) status = batch.conversions.Finish(conversion_stream).WithContext("cuda-ipc");
    // Zero-copy: tried whatever the publisher's device (a group refuses memory of another one).
    if (status.ok() && (zero_copy_ || arena_.owner_device() == receiver_.device())) {
      // On the arena's own GPU: the small copies in one launch, prepared there (conversions may
      // have made another device current above).
      status = cuda::SetDevice(receiver_.device());
      if (!status.ok()) break;
      Result<cuda::PreparedCopyGroup> group =
          cuda::SplitOffSmallCopies(batch.copies, receiver_.queue().stream());
      if (group.ok()) {
        batch.small_copies = std::move(*group);
      } else {
        WS_LOG(INFO, "cuda-ipc") << "small copies stay with the copy engines: " << group.status();
      }
    }
  }
  if (!status.ok()) slot_batches_.clear();  // job tables freed on the device they were made on
  status.Update(cuda::SetDevice(receiver_.device()));
  return status;
}

Status GpuCopyPath::CopyFromRing(const wire::StepBegin& begin, const util::Deadline& deadline) {
  cuda::CopyQueue& queue = receiver_.queue();
  WS_RETURN_IF_ERROR(link::ReadRingBuckets(
      link_->channel(), link_->peer(), begin.step, static_cast<uint32_t>(slot_batches_.size()),
      welcome_->slot_count, deadline, [&](uint32_t b, uint32_t /*slot*/) {
        Batch& batch = slot_batches_[b];  // prepared for slot b % slot_count
        WS_RETURN_IF_ERROR(queue.EnqueueBatch(batch.copies, &batch.small_copies));
        return queue.Wait(deadline);  // the slot is refilled once answered: the copies are done
      }));
  return receiver_.MaybeInjectBitFlip();
}

Status GpuCopyPath::Copy(const wire::StepBegin& begin, bool verify,
                         const util::Deadline& deadline) {
  WS_RETURN_IF_ERROR(cuda::SetDevice(receiver_.device()));
  if (ring_) return CopyFromRing(begin, deadline);
  if (!zero_copy_ && begin.slot >= slot_batches_.size()) {
    return Status::ProtocolError("cuda-ipc: step ", begin.step, " in slot ", begin.slot, " of ",
                                 slot_batches_.size());
  }
  Batch& b = slot_batches_[zero_copy_ ? 0 : begin.slot];
  cuda::CopyQueue& queue = receiver_.queue();
  // A planned tensor is contiguous on both sides: one copy-engine transfer per tensor (the rows
  // of a region cut as one 2-D transfer, cuda/copy_batch.h), all submitted at once (first, so
  // they overlap the conversions on the publisher's GPU).
  WS_RETURN_IF_ERROR(queue.EnqueueBatch(b.copies, &b.small_copies));
  if (source_device_ >= 0 && !b.conversions.empty()) {
    // On the publisher's GPU: read its memory locally, write the converted bytes across the
    // link, hash what was converted while the step is pinned; this device's stream waits for it
    // all (on the GPU) before the step counts as copied.
    cuda::ScopedDevice restore;
    WS_RETURN_IF_ERROR(cuda::SetDevice(source_device_));
    WS_RETURN_IF_ERROR(b.conversions.Launch(source_queue_));
    if (verify) WS_RETURN_IF_ERROR(receiver_.HashConvertedSource(b.base));
    WS_RETURN_IF_ERROR(source_queue_.SignalTo(queue.stream()));
  } else {
    WS_RETURN_IF_ERROR(b.conversions.Launch(queue));
    // The publisher unpins the slot once it hears the copy is done: hash what was read from it now.
    if (verify && !b.conversions.empty()) {
      WS_RETURN_IF_ERROR(receiver_.HashConvertedSource(b.base));
    }
  }
  WS_RETURN_IF_ERROR(queue.Wait(deadline));
  return receiver_.MaybeInjectBitFlip();
}

Status GpuCopyPath::Release() {
  Status result;
  // Nothing in flight on this device's stream either (a cancelled step): its conversions use the
  // job tables freed with the batches below.
  result.Update(receiver_.queue().Drain());
  // Reverse order of creation: the publisher-GPU queue (drained: its kernels write the
  // destinations), the receiver (digests, staging, stream), then the mapping.
  if (source_device_ >= 0) {
    // Unbounded: the kernels there are finite, and until they end they read the arena and write
    // the destinations. Their job tables are freed with the batches, that device current.
    cuda::ScopedDevice restore;
    result.Update(source_queue_.Drain());
    result.Update(cuda::SetDevice(source_device_));
    slot_batches_.clear();
    result.Update(source_queue_.Close());
    source_device_ = -1;
  }
  slot_batches_.clear();
  result.Update(receiver_.Release());
  result.Update(arena_.Close());
  for (cuda::IpcMapping& m : ipc_mappings_) result.Update(m.Close());
  for (cuda::ImportedChunks& m : chunk_mappings_) result.Update(m.Close());
  ipc_mappings_.clear();
  chunk_mappings_.clear();
  allocations_.clear();
  allocation_offsets_.clear();
  ring_ = false;
  zero_copy_ = false;
  welcome_ = nullptr;
  link_ = nullptr;
  conversions_ = 0;
  return result;
}

Status GpuCopyPath::OpenAllocations(const wire::Welcome& welcome, std::vector<util::UniqueFd>* fds,
                                    int device) {
  allocations_.clear();
  allocation_offsets_.clear();
  allocations_.reserve(welcome.allocations.size());
  const size_t fd_count = fds != nullptr ? fds->size() : 0;
  if (fd_count != plan::AllocationFdCount(welcome)) {
    return Status::ProtocolError("cuda-ipc: ", fd_count, " cuMem chunk fds arrived for the ",
                                 plan::AllocationFdCount(welcome), " chunks in the Welcome");
  }
  size_t next_fd = 0;
  std::vector<int> chunk_fds;
  for (size_t i = 0; i < welcome.allocations.size(); ++i) {
    const wire::GpuAllocation& a = welcome.allocations[i];
    const std::string what = "cuda-ipc: opening the publisher's allocation " + std::to_string(i) +
                             " of " + std::to_string(welcome.allocations.size()) + " (" +
                             std::to_string(a.bytes) + " bytes";
    if (a.kind == wire::AllocationKind::kPosixFdChunks) {
      chunk_fds.clear();
      for (size_t c = 0; c < a.chunk_bytes.size(); ++c)
        chunk_fds.push_back((*fds)[next_fd + c].get());
      // The driver checks each chunk's size as it maps it: a chunk smaller than claimed fails here.
      Result<cuda::ImportedChunks> m =
          cuda::ImportedChunks::Import(chunk_fds, a.chunk_bytes, device);
      for (size_t c = 0; c < a.chunk_bytes.size(); ++c) {
        WS_RETURN_IF_ERROR((*fds)[next_fd + c].Close());  // the import holds the memory
      }
      next_fd += a.chunk_bytes.size();
      if (!m.ok()) {
        return m.status().WithContext(what + " in " + std::to_string(a.chunk_bytes.size()) +
                                      " cuMem chunks)");
      }
      allocations_.push_back(m->data());
      chunk_mappings_.push_back(std::move(m).value());
      allocation_offsets_.push_back(a.offset);
      continue;
    }
    cuda::IpcHandle handle;
    std::copy(a.ipc_handle.begin(), a.ipc_handle.end(), handle.begin());
    Result<cuda::IpcMapping> m = cuda::IpcMapping::Open(handle, device);
    if (!m.ok()) return m.status().WithContext(what + ")");
    // The Welcome's size is the publisher's word; what was mapped is the driver's. A copy past
    // the mapping would fault and take this process's CUDA context with it.
    Result<cuda::AllocationRange> mapped = cuda::AllocationOf(m->data());
    if (!mapped.ok() || mapped->base != m->data() || mapped->bytes < a.bytes) {
      return Status::ProtocolError(
          "cuda-ipc: the publisher's allocation ", i, " claims ", a.bytes, " bytes but ",
          mapped.ok() ? std::to_string(mapped->bytes) + " are mapped"
                      : "its mapping cannot be measured (" + mapped.status().ToString() + ")");
    }
    allocations_.push_back(m->data());
    ipc_mappings_.push_back(std::move(m).value());
    allocation_offsets_.push_back(a.offset);
  }
  return Status::Ok();
}

std::string GpuCopyPath::Describe() const {
  const std::string into = " into cuda:" + std::to_string(receiver_.device());
  std::string text;
  if (ring_) {
    text = ", a ring of " + std::to_string(welcome_->slot_count) + " buckets of " +
           std::to_string(welcome_->slot_bytes) +
           " bytes on cuda:" + std::to_string(welcome_device_) + into + ", " +
           std::to_string(slot_batches_.size()) + " buckets a version";
  } else if (zero_copy_) {
    text =
        ", zero-copy from " + std::to_string(allocations_.size()) + " allocation(s) (" +
        std::to_string(chunk_mappings_.size()) +
        " of cuMem chunks) of the publisher's tensors on cuda:" + std::to_string(welcome_device_) +
        into;
  } else {
    text = ", GPU arena from cuda:" + std::to_string(welcome_device_) + into;
  }
  if (!ring_ && !slot_batches_.empty() && !slot_batches_[0].small_copies.empty()) {
    text +=
        ", " + std::to_string(slot_batches_[0].small_copies.jobs()) + " copy jobs in one launch";
  }
  if (conversions_ == 0) return text;
  const int at = source_device_ >= 0 ? source_device_ : receiver_.device();
  return text + "; " + std::to_string(conversions_) + " conversions on cuda:" + std::to_string(at) +
         (source_device_ >= 0 ? " (the publisher's GPU: only converted bytes cross the link)" : "");
}

}  // namespace weightsync::transport::path
