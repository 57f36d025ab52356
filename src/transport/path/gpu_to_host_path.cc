#include "transport/path/gpu_to_host_path.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <utility>

#include "cuda/device.h"
#include "transport/path/unit_copies.h"
#include "util/logging.h"

namespace weightsync::transport::path {

GpuToHostPath::~GpuToHostPath() {
  if (Status s = Release(); !s.ok()) WS_LOG(WARN, "cuda-ipc") << "path cleanup: " << s;
}

Status GpuToHostPath::Available(const PathContext& ctx) {
  return cuda::CudaAvailable().WithContext(
      ctx.link->peer() + " keeps its arena on cuda:" + std::to_string(ctx.welcome->device) +
      " and the destinations are in host memory");
}

Status GpuToHostPath::Prepare(const PathContext& ctx) {
  const wire::Welcome& welcome = *ctx.welcome;
  const plan::Plan* plan = ctx.plan;
  const std::vector<plan::Destination>& destinations = *ctx.destinations;
  welcome_ = &welcome;
  plan_ = plan;
  cuda::ScopedDevice restore;
  // Mapped for the GPU that holds the store, whose copy engines then read local memory. The
  // publisher's ordinal may mean another GPU here (CUDA_VISIBLE_DEVICES): the driver says which.
  const int guess =
      welcome.device >= 0 && welcome.device < cuda::DeviceCount() ? welcome.device : 0;
  WS_ASSIGN_OR_RETURN(view_, view::ImportGpuStore(welcome, std::move(*ctx.store_fd),
                                                  ctx.allocation_fds, guess, ctx.link));
  device_ = guess;
  if (view_->owner_device() >= 0 && view_->owner_device() != guess) {
    WS_RETURN_IF_ERROR(view_->GrantAccess(view_->owner_device()));
    device_ = view_->owner_device();
  }
  WS_ASSIGN_OR_RETURN(queue_, cuda::CopyQueue::Create(device_));
  WS_RETURN_IF_ERROR(host_.Prepare(plan, destinations, ctx.mode, ctx.HashingThreads()));
  WS_RETURN_IF_ERROR(Pin());
  // Per unit of the store (a slot, or a ring's bucket): one batch of every planned tensor's bytes
  // it holds.
  unit_batches_ = UnitCopyBatches(*view_, welcome, *plan, [&](const plan::PlannedTensor& t) {
    return host_.ReceivedTensor(t);
  });
  return Status::Ok();
}

Status GpuToHostPath::Pin() {
  // Where the bytes land, page-aligned and merged: cudaHostRegister refuses a page twice. One
  // range per destination from its first landing byte to its last, gaps included: a region cut's
  // rows into a destination are one 2-D copy (cuda/copy_batch.h), which must find its whole span
  // pinned in one registration, not rows pinned apart with pageable gaps between them.
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  std::map<uint32_t, std::pair<uintptr_t, uintptr_t>> per_destination;
  for (const plan::PlannedTensor& t : plan_->tensors) {
    if (t.nbytes == 0) continue;
    const auto begin = reinterpret_cast<uintptr_t>(host_.ReceivedTensor(t));
    auto [it, fresh] = per_destination.try_emplace(t.destination, begin, begin + t.nbytes);
    if (!fresh) {
      it->second.first = std::min(it->second.first, begin);
      it->second.second = std::max(it->second.second, begin + t.nbytes);
    }
  }
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  for (const auto& [index, r] : per_destination) {
    ranges.emplace_back(r.first / page * page, (r.second + page - 1) / page * page);
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
    Result<cuda::HostRegistration> pin = cuda::HostRegistration::Register(
        reinterpret_cast<const void*>(begin), end - begin, /*read_only=*/false);
    if (!pin.ok()) {
      // All or nothing: a partly pinned set would only make the timing harder to explain.
      pageable_reason_ = pin.status().ToString();
      for (cuda::HostRegistration& p : pins_) (void)p.Close();
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

Status GpuToHostPath::Copy(const wire::StepBegin& begin, bool /*verify*/,
                           const util::Deadline& deadline) {
  cuda::ScopedDevice restore;
  WS_RETURN_IF_ERROR(cuda::SetDevice(device_));
  WS_RETURN_IF_ERROR(view_->Step(begin, deadline, [&](uint32_t unit) {
    WS_RETURN_IF_ERROR(queue_.EnqueueBatch(unit_batches_[unit]));
    return queue_.Wait(deadline);  // done before the unit is answered (a ring refills it then)
  }));
  host_.MaybeInjectBitFlip();
  return Status::Ok();
}

Status GpuToHostPath::Release() {
  if (welcome_ == nullptr) return Status::Ok();  // never prepared: no CUDA call at all
  Status result;
  cuda::ScopedDevice restore;
  unit_batches_.clear();
  // Reverse order of creation: no copy may still write the pinned memory or read the store.
  result.Update(queue_.Drain());  // a cancelled step's copies may still run
  result.Update(queue_.Close());
  for (cuda::HostRegistration& p : pins_) result.Update(p.Close());
  pins_.clear();
  result.Update(host_.Release());
  if (view_) result.Update(view_->Release());
  view_.reset();
  pageable_reason_.clear();
  welcome_ = nullptr;
  plan_ = nullptr;
  device_ = -1;
  return result;
}

std::string GpuToHostPath::Describe() const {
  return (view_ ? view_->Describe() : std::string()) +
         " into host memory by the copy engines of cuda:" + std::to_string(device_) +
         (pageable_reason_.empty() ? ", pinned" : ", pageable (" + pageable_reason_ + ")");
}

}  // namespace weightsync::transport::path
