#include "transport/store/gpu_arena.h"

#include <algorithm>

#include "cuda/gpu_digest_reference.h"
#include "util/logging.h"

namespace weightsync::transport::store {

Result<std::unique_ptr<GpuArena>> GpuArena::Create(int device, uint64_t slot_bytes, uint32_t slots,
                                                   std::vector<Copy> copies,
                                                   std::vector<Segment> segments,
                                                   uint32_t digest_count) {
  cuda::ScopedDevice restore;  // everything below is made on `device`; the caller keeps its own
  WS_RETURN_IF_ERROR(cuda::SetDevice(device));
  std::unique_ptr<GpuArena> a(new GpuArena());
  a->device_ = device;
  // Slots start on 2 MiB boundaries: large pages for the copy engines, and aligned vector loads.
  a->slot_bytes_ = (std::max<uint64_t>(slot_bytes, 1) + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  a->digest_count_ = digest_count;
  a->copies_ = std::move(copies);
  WS_ASSIGN_OR_RETURN(a->allocation_,
                      cuda::ExportedAllocation::Create(device, a->slot_bytes_ * slots));
  WS_ASSIGN_OR_RETURN(a->fd_, a->allocation_.ExportFd());
  WS_ASSIGN_OR_RETURN(a->queue_, cuda::CopyQueue::Create(device));
  WS_ASSIGN_OR_RETURN(a->digests_device_, cuda::DeviceBuffer::Allocate(
                                              std::max<uint64_t>(digest_count, 1) * slots * 8));
  // Per slot, the copies of the registered tensors: the small ones in one copy-group launch (the
  // tensors and the arena are both on this device), the rest one copy-engine submission. A
  // registered tensor is its own allocation's (span: its index), so rows fold only within one.
  a->copies_by_slot_.resize(slots);
  a->small_by_slot_.resize(slots);
  for (uint32_t k = 0; k < slots; ++k) {
    cuda::CopyBatch& batch = a->copies_by_slot_[k];
    for (size_t i = 0; i < a->copies_.size(); ++i) {
      const Copy& c = a->copies_[i];
      batch.Add(a->allocation_.data() + k * a->slot_bytes_ + c.slot_offset, c.src, c.bytes, i);
    }
    Result<cuda::PreparedCopyGroup> small = cuda::SplitOffSmallCopies(batch, a->queue_.stream());
    if (small.ok()) {
      a->small_by_slot_[k] = std::move(*small);
    } else {
      WS_LOG(INFO, "cuda-ipc") << "publish copies stay with the copy engines: " << small.status();
    }
  }
  // Per slot, every segment's digest in one grouped launch pair (a model of 10^5 tensors would
  // otherwise be 2 * 10^5 launches a publish).
  a->digests_.resize(slots);
  std::vector<cuda::DigestRange> ranges(segments.size());
  for (uint32_t k = 0; k < slots; ++k) {
    uint8_t* slot = a->allocation_.data() + k * a->slot_bytes_;
    uint64_t* digest_base = a->digests_device_.as<uint64_t>() + uint64_t{k} * digest_count;
    for (size_t i = 0; i < segments.size(); ++i) {
      ranges[i] = {slot + segments[i].slot_offset, segments[i].bytes,
                   digest_base + segments[i].digest};
    }
    WS_ASSIGN_OR_RETURN(a->digests_[k], cuda::PrepareDigestGroup(ranges, a->queue_.stream()));
  }
  return a;
}

GpuArena::~GpuArena() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "cuda-ipc") << "GPU arena cleanup: " << s;
}

Status GpuArena::Publish(uint32_t slot, uint64_t* digests, void* after_stream,
                         const util::Deadline& deadline) {
  cuda::ScopedDevice restore;
  WS_RETURN_IF_ERROR(cuda::SetDevice(device_));
  WS_RETURN_IF_ERROR(queue_.WaitFor(after_stream));
  return CopyAndDigest(slot, digests, deadline);
}

Status GpuArena::CopyWritten(uint32_t slot, const util::Deadline& deadline) {
  cuda::ScopedDevice restore;
  WS_RETURN_IF_ERROR(cuda::SetDevice(device_));
  return CopyAndDigest(slot, nullptr, deadline);
}

Status GpuArena::CopyAndDigest(uint32_t slot, uint64_t* digests, const util::Deadline& deadline) {
  WS_RETURN_IF_ERROR(queue_.EnqueueBatch(copies_by_slot_[slot], &small_by_slot_[slot]));
  if (digests != nullptr) {
    WS_RETURN_IF_ERROR(digests_[slot].Launch());
    WS_RETURN_IF_ERROR(
        queue_.Enqueue(digests, digests_device_.as<uint64_t>() + uint64_t{slot} * digest_count_,
                       uint64_t{digest_count_} * 8));
  }
  return queue_.Wait(deadline);
}

Status GpuArena::FlipBit(uint32_t slot) {
  auto copy =
      std::find_if(copies_.begin(), copies_.end(), [](const Copy& c) { return c.bytes > 0; });
  if (copy == copies_.end()) {
    return Status::FailedPrecondition("no byte to flip: every tensor of the arena is empty");
  }
  cuda::ScopedDevice restore;
  WS_RETURN_IF_ERROR(cuda::SetDevice(device_));
  uint8_t* at =
      allocation_.data() + uint64_t{slot} * slot_bytes_ + copy->slot_offset + copy->bytes / 2;
  uint8_t byte = 0;
  WS_RETURN_IF_ERROR(cuda::CopyToHost(&byte, at, 1));
  byte ^= 0x01;
  return cuda::CopyToDevice(at, &byte, 1);
}

Status GpuArena::Close() {
  Status result;
  result.Update(queue_.Drain());  // the digests read the slots and write their buffers
  digests_.clear();
  small_by_slot_.clear();
  copies_by_slot_.clear();
  result.Update(digests_device_.Close());
  result.Update(queue_.Close());
  result.Update(fd_.Close());
  result.Update(allocation_.Close());
  return result;
}

}  // namespace weightsync::transport::store
