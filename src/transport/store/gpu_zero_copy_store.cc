// The zero-copy GPU store (PublisherOptions::zero_copy): the registered CUDA tensors are the
// published version. Nothing is allocated for the weights and a Publish copies nothing: it only
// runs the prepared GPU digest group over the tensors where they are. Each CUDA allocation the
// tensors live in is exported once, at Freeze, by the IPC handle of its base (cuda/ipc.h);
// subscribers on this host open those handles (the Welcome's allocations) and read the trainer's
// memory directly. The tensors are placed in a virtual direct region in which every allocation has
// its own range, so the rest of the system addresses them by one offset as in an arena; like
// arena-allocated host tensors they are shared by every version, and the publisher fences writes
// (BeginWrite).
#include <algorithm>
#include <map>
#include <memory>

#include "cuda/device.h"
#include "cuda/ipc.h"
#include "cuda/kernels.h"
#include "cuda/vmm.h"
#include "transport/store/version_store.h"
#include "util/logging.h"

namespace weightsync::transport::store {
namespace {

constexpr uint64_t kDefaultSegmentBytes = 64ull << 20;  // as the GPU arena
constexpr uint64_t kRangeAlignment = 4096;              // between allocations' virtual ranges

class ZeroCopyGpuStore final : public VersionStore {
 public:
  explicit ZeroCopyGpuStore(int device) : device_(device) {}
  ~ZeroCopyGpuStore() override {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "publisher") << "release: zero-copy store: " << s;
  }

  Status Freeze(const StoreLayout& layout, wire::Welcome* welcome) override;
  Status Publish(uint32_t slot, std::span<uint64_t> digests, void* cuda_stream,
                 const util::Deadline& deadline) override;
  int fd() const override { return -1; }  // the allocations travel as IPC handles
  const uint8_t* base() const override { return nullptr; }
  uint32_t digest_count() const override { return digest_count_; }
  uint64_t copy_bytes() const override { return 0; }
  std::string Describe() const override {
    return "zero-copy: the registered tensors in " + std::to_string(allocations_) +
           " CUDA allocation(s) on cuda:" + std::to_string(device_) + ", " +
           std::to_string(segments_) + " segments hashed in one grouped launch pair";
  }
  Status Close() override;

 private:
  // The Welcome's allocations and placements for `layout` (no CUDA work but queries and exports).
  Status Place(const StoreLayout& layout, wire::Welcome* welcome);

  int device_;
  uint64_t allocations_ = 0;
  cuda::CopyQueue queue_;
  cuda::DeviceBuffer digests_device_;
  cuda::PreparedDigestGroup digests_;  // every segment, over the caller's tensors
  size_t segments_ = 0;
  std::vector<std::pair<uint32_t, uint32_t>> digest_copies_;
  uint32_t digest_count_ = 0;
};

Status ZeroCopyGpuStore::Place(const StoreLayout& layout, wire::Welcome* welcome) {
  // The allocation of every tensor, by base (tied tensors share their original's).
  std::vector<cuda::AllocationRange> of(layout.tensors.size());
  std::map<const uint8_t*, uint64_t> allocations;  // base -> bytes
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const PublishedTensor& t = layout.tensors[i];
    const std::string& name = t.placement.spec.name;
    if (t.placement.region != wire::Region::kSlot || t.source == nullptr) {
      return Status::NotSupported("zero-copy: tensor '", name, "' is not a registered CUDA tensor");
    }
    if (t.placement.spec.nbytes == 0 || t.alias_of >= 0) continue;
    Result<cuda::AllocationRange> range = cuda::AllocationOf(t.source);
    if (!range.ok()) {
      return range.status().WithContext("zero-copy: the CUDA allocation of tensor '" + name + "'");
    }
    if (t.source + t.placement.spec.nbytes > range->base + range->bytes) {
      return Status::InvalidArgument("zero-copy: tensor '", name, "' (", t.placement.spec.nbytes,
                                     " bytes) runs past the end of its CUDA allocation");
    }
    of[i] = *range;
    allocations.emplace(range->base, range->bytes);
  }
  std::map<const uint8_t*, uint64_t> virtual_offset;
  uint64_t at = 0;
  welcome->allocations.clear();
  for (const auto& [base, bytes] : allocations) {
    Result<cuda::IpcHandle> handle = cuda::ExportIpcHandle(base);
    if (!handle.ok()) {
      std::string tensor;
      for (size_t i = 0; i < of.size() && tensor.empty(); ++i) {
        if (of[i].base == base) tensor = layout.tensors[i].placement.spec.name;
      }
      return handle.status().WithContext(
          "zero-copy: exporting the CUDA allocation of tensor '" + tensor +
          "' (register tensors from cudaMalloc memory, e.g. PyTorch without expandable segments, "
          "or publish without zero_copy)");
    }
    welcome->allocations.push_back({at, bytes, *handle});
    virtual_offset[base] = at;
    at += (bytes + kRangeAlignment - 1) / kRangeAlignment * kRangeAlignment;
  }
  welcome->tensors.clear();
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const PublishedTensor& t = layout.tensors[i];
    wire::TensorPlacement p = t.placement;
    p.region = wire::Region::kDirect;
    if (t.alias_of >= 0) {
      p.offset = welcome->tensors[t.alias_of].offset;
    } else if (p.spec.nbytes == 0) {
      p.offset = 0;
    } else {
      p.offset = virtual_offset[of[i].base] + static_cast<uint64_t>(t.source - of[i].base);
    }
    welcome->tensors.push_back(std::move(p));
  }
  welcome->arena_kind = wire::ArenaKind::kCudaIpc;
  welcome->device = device_;
  welcome->digest_kind = wire::DigestKind::kGpu64;
  welcome->segment_bytes = layout.segment_bytes;
  welcome->slot_count = layout.slots;  // versions are told apart, all read the same memory
  welcome->slot_bytes = 0;
  welcome->slots_offset = 0;
  welcome->direct_offset = 0;
  welcome->direct_bytes = at;
  welcome->arena_bytes = at;
  return Status::Ok();
}

Status ZeroCopyGpuStore::Freeze(const StoreLayout& given, wire::Welcome* welcome) {
  StoreLayout layout = given;
  if (layout.segment_bytes == 0) layout.segment_bytes = kDefaultSegmentBytes;
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "publisher") << "release: zero-copy store: " << s;
  cuda::ScopedDevice
      restore;  // everything is made on the tensors' device; the caller keeps its own
  WS_RETURN_IF_ERROR(cuda::SetDevice(device_));
  // Built aside and kept only whole: a failed Freeze leaves the store and the Welcome as they were.
  wire::Welcome placed = *welcome;
  WS_RETURN_IF_ERROR(Place(layout, &placed));
  SegmentLayout segments = CutSegments(layout);
  WS_ASSIGN_OR_RETURN(cuda::CopyQueue queue, cuda::CopyQueue::Create(device_));
  WS_ASSIGN_OR_RETURN(
      cuda::DeviceBuffer digests_device,
      cuda::DeviceBuffer::Allocate(std::max<uint64_t>(segments.digest_count, 1) * 8));
  std::vector<cuda::DigestRange> ranges;
  ranges.reserve(segments.segments.size());
  for (const Segment& s : segments.segments) {
    ranges.push_back({layout.tensors[s.tensor].source + s.offset, s.bytes,
                      digests_device.as<uint64_t>() + s.digest});
  }
  WS_ASSIGN_OR_RETURN(cuda::PreparedDigestGroup digests,
                      cuda::PrepareDigestGroup(ranges, queue.stream()));
  *welcome = std::move(placed);
  allocations_ = welcome->allocations.size();
  queue_ = std::move(queue);
  digests_device_ = std::move(digests_device);
  digests_ = std::move(digests);
  segments_ = segments.segments.size();
  digest_copies_ = std::move(segments.copies);
  digest_count_ = segments.digest_count;
  return Status::Ok();
}

Status ZeroCopyGpuStore::Publish(uint32_t /*slot*/, std::span<uint64_t> digests, void* cuda_stream,
                                 const util::Deadline& deadline) {
  cuda::ScopedDevice restore;
  WS_RETURN_IF_ERROR(cuda::SetDevice(device_));
  // The digests read the tensors once the caller's kernels that wrote them are done.
  WS_RETURN_IF_ERROR(queue_.WaitFor(cuda_stream));
  WS_RETURN_IF_ERROR(digests_.Launch());
  WS_RETURN_IF_ERROR(
      queue_.Enqueue(digests.data(), digests_device_.data(), uint64_t{digest_count_} * 8));
  WS_RETURN_IF_ERROR(queue_.Wait(deadline));
  for (auto [tied, original] : digest_copies_) digests[tied] = digests[original];
  return Status::Ok();
}

Status ZeroCopyGpuStore::Close() {
  Status result;
  result.Update(queue_.Drain());
  digests_ = cuda::PreparedDigestGroup();
  result.Update(digests_device_.Close());
  result.Update(queue_.Close());
  allocations_ = 0;
  return result;
}

}  // namespace

Result<std::unique_ptr<VersionStore>> NewZeroCopyGpuStore(int device) {
  return std::unique_ptr<VersionStore>(new ZeroCopyGpuStore(device));
}

}  // namespace weightsync::transport::store
