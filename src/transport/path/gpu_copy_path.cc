#include "transport/path/gpu_copy_path.h"

#include <algorithm>

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
  WS_ASSIGN_OR_RETURN(int device, GpuLanding::DestinationDevice(destinations, "cuda-ipc"));
  WS_ASSIGN_OR_RETURN(view_, view::ImportGpuStore(welcome, std::move(*ctx.store_fd),
                                                  ctx.allocation_fds, device, ctx.link));
  conversions_ = plan->converted.size();
  // In place, converted tensors are converted straight out of the publisher's store where one
  // base addresses a unit's slot region for the whole step (an arena's slot). They land first
  // where none does: a zero-copy publisher's allocations have no one base to address segments
  // from, and a ring's bucket is gone once read.
  const uint8_t* slot_base = view_->SlotBase(0);
  const bool direct =
      mode == UpdateMode::kInPlace && !plan->converted.empty() && slot_base != nullptr;
  if (!direct && on_publisher_gpu && !plan->converted.empty()) {
    WS_LOG(INFO, "cuda-ipc") << "conversions run on cuda:" << device
                             << " after landing: the publisher's store keeps no slot whole "
                                "through the step to convert from on its GPU";
  }
  WS_RETURN_IF_ERROR(
      receiver_.Prepare(plan, destinations, mode, device, direct ? slot_base : nullptr));
  // Where the conversions run (in place only): on the publisher's GPU when asked and possible,
  // else here. A failed attempt there is logged and the batches are built again here.
  source_device_ = -1;
  if (direct && on_publisher_gpu) {
    cuda::ScopedDevice restore;  // the attempt visits the publisher's GPU
    Status s = PrepareSourceGpu(*plan, destinations, device);
    if (s.ok()) {
      Status built = BuildBatches(welcome, plan, direct);
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
  return BuildBatches(welcome, plan, direct);
}

Status GpuCopyPath::PrepareSourceGpu(const plan::Plan& plan,
                                     const std::vector<plan::Destination>& destinations,
                                     int device) {
  WS_FAIL_POINT_RETURN("cuda_ipc.publisher_gpu");
  const int owner = view_->owner_device();
  if (owner < 0) return Status::Unavailable("the driver does not say which GPU holds the arena");
  if (owner == device) return Status::Unavailable("the publisher's GPU is this one");
  WS_RETURN_IF_ERROR(
      view_->GrantAccess(owner).WithContext("the arena for cuda:" + std::to_string(owner)));
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
                                 bool direct) {
  // Copy batches and conversion launches, built once: a step submits one batch per unit of the
  // store (the slot, the zero-copy tensors, a ring's bucket). Conversions are prepared on the
  // device that will run them (its stream, its job table).
  const bool at_source = source_device_ >= 0;
  void* conversion_stream = at_source ? source_queue_.stream() : receiver_.queue().stream();
  WS_RETURN_IF_ERROR(cuda::SetDevice(at_source ? source_device_ : receiver_.device()));
  unit_batches_.clear();
  unit_batches_.resize(view_->units());
  Status status;
  std::vector<view::Piece> cut;
  for (uint32_t u = 0; u < unit_batches_.size() && status.ok(); ++u) {
    Batch& batch = unit_batches_[u];
    batch.base = view_->SlotBase(u);
    for (const plan::PlannedTensor& t : plan->tensors) {
      if (t.nbytes == 0) continue;
      const wire::TensorPlacement& p = welcome.tensors[t.publisher_index];
      const uint64_t offset = p.offset + t.src_offset;
      if (direct && t.transform != plan::Transform::kCopy) {
        status = batch.conversions
                     .Add(*plan, t, batch.base + offset, receiver_.destination_bases(),
                          receiver_.names(), conversion_stream)
                     .WithContext("cuda-ipc");
        if (!status.ok()) break;
        continue;
      }
      // A copy batch folds rows of one span only: its sources must be one piece of the store's
      // memory (a zero-copy publisher's allocation) and its destinations one tensor.
      cut.clear();
      view_->Cut(u, p.region, offset, t.nbytes, 0, &cut);
      for (const view::Piece& piece : cut) {
        batch.copies.Add(receiver_.Received(t) + piece.at, piece.src, piece.bytes,
                         uint64_t{t.destination} << 32 | piece.span);
      }
    }
    if (status.ok()) status = batch.conversions.Finish(conversion_stream).WithContext("cuda-ipc");
    // On the store's own GPU (or where the driver does not say: a group refuses memory of another
    // device) the small copies go out in one launch, prepared there (conversions may have made
    // another device current above).
    const int owner = view_->owner_device();
    if (status.ok() && (owner < 0 || owner == receiver_.device())) {
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
  if (!status.ok()) unit_batches_.clear();  // job tables freed on the device they were made on
  status.Update(cuda::SetDevice(receiver_.device()));
  return status;
}

Status GpuCopyPath::Copy(const wire::StepBegin& begin, bool verify,
                         const util::Deadline& deadline) {
  WS_RETURN_IF_ERROR(cuda::SetDevice(receiver_.device()));
  cuda::CopyQueue& queue = receiver_.queue();
  WS_RETURN_IF_ERROR(view_->Step(begin, deadline, [&](uint32_t unit) -> Status {
    Batch& b = unit_batches_[unit];
    // A planned tensor is contiguous on both sides: one copy-engine transfer per tensor (the rows
    // of a region cut as one 2-D transfer, cuda/copy_batch.h), all submitted at once (first, so
    // they overlap the conversions on the publisher's GPU).
    WS_RETURN_IF_ERROR(queue.EnqueueBatch(b.copies, &b.small_copies));
    if (source_device_ >= 0 && !b.conversions.empty()) {
      // On the publisher's GPU: read its memory locally, write the converted bytes across the
      // link, hash what was converted while the step is pinned; this device's stream waits for
      // it all (on the GPU) before the step counts as copied.
      cuda::ScopedDevice restore;
      WS_RETURN_IF_ERROR(cuda::SetDevice(source_device_));
      WS_RETURN_IF_ERROR(b.conversions.Launch(source_queue_));
      if (verify) WS_RETURN_IF_ERROR(receiver_.HashConvertedSource(b.base));
      WS_RETURN_IF_ERROR(source_queue_.SignalTo(queue.stream()));
    } else {
      WS_RETURN_IF_ERROR(b.conversions.Launch(queue));
      // The publisher unpins the unit once it hears the copy is done: hash what was read from it
      // now.
      if (verify && !b.conversions.empty()) {
        WS_RETURN_IF_ERROR(receiver_.HashConvertedSource(b.base));
      }
    }
    return queue.Wait(deadline);  // done before the unit is answered (a ring refills it then)
  }));
  return receiver_.MaybeInjectBitFlip();
}

Status GpuCopyPath::Release() {
  Status result;
  // Nothing in flight on this device's stream either (a cancelled step): its conversions use the
  // job tables freed with the batches below.
  result.Update(receiver_.queue().Drain());
  // Reverse order of creation: the publisher-GPU queue (drained: its kernels write the
  // destinations), the receiver (digests, staging, stream), then the store's view.
  if (source_device_ >= 0) {
    // Unbounded: the kernels there are finite, and until they end they read the store and write
    // the destinations. Their job tables are freed with the batches, that device current.
    cuda::ScopedDevice restore;
    result.Update(source_queue_.Drain());
    result.Update(cuda::SetDevice(source_device_));
    unit_batches_.clear();
    result.Update(source_queue_.Close());
    source_device_ = -1;
  }
  unit_batches_.clear();
  result.Update(receiver_.Release());
  if (view_) result.Update(view_->Release());
  view_.reset();
  conversions_ = 0;
  return result;
}

std::string GpuCopyPath::Describe() const {
  std::string text = (view_ ? view_->Describe() : std::string()) +
                     " into cuda:" + std::to_string(receiver_.device());
  if (!unit_batches_.empty() && !unit_batches_[0].small_copies.empty()) {
    text +=
        ", " + std::to_string(unit_batches_[0].small_copies.jobs()) + " copy jobs in one launch";
  }
  if (conversions_ == 0) return text;
  const int at = source_device_ >= 0 ? source_device_ : receiver_.device();
  return text + "; " + std::to_string(conversions_) + " conversions on cuda:" + std::to_string(at) +
         (source_device_ >= 0 ? " (the publisher's GPU: only converted bytes cross the link)" : "");
}

}  // namespace weightsync::transport::path
