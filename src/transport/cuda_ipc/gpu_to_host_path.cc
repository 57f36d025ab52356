#include "transport/cuda_ipc/gpu_to_host_path.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "cuda/device.h"
#include "util/logging.h"

namespace weightsync::transport::cuda_ipc {

Status GpuToHostPath::Prepare(int arena_fd, const wire::Welcome& welcome, const plan::Plan* plan,
                              const std::vector<plan::Destination>& destinations,
                              UpdateMode mode, int threads) {
  for (const plan::Destination& d : destinations) {
    if (d.device.is_cuda()) {
      return Status::InvalidArgument(
          "cuda-ipc: destination '", d.spec.name, "' is on ", DeviceString(d.device), " but '",
          destinations[0].spec.name, "' is in host memory: one handle delivers into host memory "
          "or into one CUDA device");
    }
  }
  if (welcome.direct_bytes > 0) {
    return Status::NotSupported("cuda-ipc: arena-allocated GPU tensors are not supported yet");
  }
  welcome_ = &welcome;
  plan_ = plan;
  ScopedDevice restore;
  // Mapped for the GPU that holds the arena, whose copy engines then read local memory. The
  // publisher's ordinal may mean another GPU here (CUDA_VISIBLE_DEVICES): the driver says which.
  const int guess = welcome.device >= 0 && welcome.device < gpu::DeviceCount() ? welcome.device : 0;
  WS_ASSIGN_OR_RETURN(arena_, ImportedAllocation::Import(arena_fd, welcome.arena_bytes, guess));
  device_ = guess;
  if (arena_.owner_device() >= 0 && arena_.owner_device() != guess) {
    WS_RETURN_IF_ERROR(arena_.GrantAccess(arena_.owner_device()));
    device_ = arena_.owner_device();
  }
  WS_ASSIGN_OR_RETURN(queue_, CopyQueue::Create(device_));
  WS_RETURN_IF_ERROR(host_.Prepare(plan, destinations, mode, threads));
  WS_RETURN_IF_ERROR(Pin());
  slot_batches_.assign(welcome.slot_count, {});
  for (uint32_t k = 0; k < welcome.slot_count; ++k) {
    const uint8_t* slot = arena_.data() + welcome.slots_offset + uint64_t{k} * welcome.slot_bytes;
    Batch& b = slot_batches_[k];
    for (const plan::PlannedTensor& t : plan->tensors) {
      if (t.nbytes == 0) continue;
      b.dsts.push_back(host_.ReceivedTensor(t));
      b.srcs.push_back(slot + welcome.tensors[t.publisher_index].offset);
      b.sizes.push_back(t.nbytes);
    }
  }
  return Status::Ok();
}

Status GpuToHostPath::Pin() {
  // Where the bytes land, page-aligned and merged: cudaHostRegister refuses a page twice.
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  for (const plan::PlannedTensor& t : plan_->tensors) {
    if (t.nbytes == 0) continue;
    const auto begin = reinterpret_cast<uintptr_t>(host_.ReceivedTensor(t));
    ranges.emplace_back(begin / page * page, (begin + t.nbytes + page - 1) / page * page);
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uintptr_t, uintptr_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  pins_.clear();
  pins_.reserve(merged.size());
  for (const auto& [begin, end] : merged) {
    Result<HostRegistration> pin = HostRegistration::Register(
        reinterpret_cast<const void*>(begin), end - begin, /*read_only=*/false);
    if (!pin.ok()) {
      // All or nothing: a partly pinned set would only make the timing harder to explain.
      pageable_reason_ = pin.status().ToString();
      for (HostRegistration& p : pins_) (void)p.Close();
      pins_.clear();
      WS_LOG(INFO, "cuda-ipc") << "host destinations stay pageable (copies from cuda:" << device_
                               << " go through the driver's bounce buffers): " << pin.status();
      return Status::Ok();
    }
    pins_.push_back(std::move(pin).value());
  }
  pageable_reason_.clear();
  return Status::Ok();
}

Status GpuToHostPath::Copy(uint32_t slot, const util::Deadline& deadline) {
  if (slot >= slot_batches_.size()) {
    return Status::Internal("cuda-ipc: slot ", slot, " of ", slot_batches_.size());
  }
  ScopedDevice restore;
  WS_RETURN_IF_ERROR(SetDevice(device_));
  const Batch& b = slot_batches_[slot];
  if (!b.dsts.empty()) {
    WS_RETURN_IF_ERROR(queue_.EnqueueBatch(b.dsts.data(), b.srcs.data(), b.sizes.data(),
                                           b.dsts.size()));
  }
  WS_RETURN_IF_ERROR(queue_.Wait(deadline));
  host_.MaybeInjectBitFlip();
  return Status::Ok();
}

Status GpuToHostPath::Release() {
  if (welcome_ == nullptr) return Status::Ok();  // never prepared: no CUDA call at all
  Status result;
  ScopedDevice restore;
  slot_batches_.clear();
  // Reverse order of creation: no copy may still write the pinned memory or read the arena.
  result.Update(queue_.Drain());  // a cancelled step's copies may still run
  result.Update(queue_.Close());
  for (HostRegistration& p : pins_) result.Update(p.Close());
  pins_.clear();
  result.Update(host_.Release());
  result.Update(arena_.Close());
  pageable_reason_.clear();
  welcome_ = nullptr;
  plan_ = nullptr;
  device_ = -1;
  return result;
}

}  // namespace weightsync::transport::cuda_ipc
