// The zero-copy GPU store (PublisherOptions::zero_copy): the registered CUDA tensors are the
// published version. Nothing is allocated for the weights and a Publish copies nothing: it only
// runs the prepared GPU digest group over the tensors where they are. Each CUDA allocation the
// tensors live in is exported at Freeze (cuda/ipc.h): cudaMalloc memory by the IPC handle of its
// base, cuMem memory (PyTorch's expandable segments) as runs of back-to-back chunks, each chunk's
// fd sent to every subscriber after its Welcome. Subscribers on this host open those (the
// Welcome's allocations) and read the trainer's memory directly. The tensors are placed in a
// virtual direct region in which every allocation has its own range, so the rest of the system
// addresses them by one offset as in an arena; like arena-allocated host tensors they are shared by
// every version, and the publisher fences writes (BeginWrite). Over tcp (StoreLayout::local_readers
// false) nothing is exported: the sessions' NCCL broadcasts read the tensors in this process, and
// the Welcome lists no allocation (no handle ever exists to leak).
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/ipc.h"
#include "cuda/kernels.h"
#include "cuda/vmm.h"
#include "transport/store/gpu_tensor_digests.h"
#include "transport/store/version_store.h"
#include "util/logging.h"

namespace weightsync::transport::store {
namespace {

constexpr uint64_t kDefaultSegmentBytes = 64ull << 20;  // as the GPU arena
constexpr uint64_t kRangeAlignment = 4096;              // between allocations' virtual ranges
// The GPU's large page. A cudaMalloc allocation whose size is not a multiple of it is mapped with
// smaller pages where another process opens it by IPC handle, and the copy engines read it more
// slowly there: on an H200, one 15.2 GB allocation copied at 0.79x of the same bytes in the
// reader's own memory (0.85x rounded to 64 KiB, 1.00x rounded to 2 MiB; bench/copy_kernel_probe
// --src ipc). PyTorch's caching allocator rounds its segments to 2 MiB, so its tensors never pay
// it.
constexpr uint64_t kWholePageBytes = 2ull << 20;

class ZeroCopyGpuStore final : public VersionStore {
 public:
  explicit ZeroCopyGpuStore(int device) : device_(device) {}
  ~ZeroCopyGpuStore() override {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "publisher") << "release: zero-copy store: " << s;
  }

  Status Freeze(const StoreLayout& layout, wire::Welcome* welcome) override;
  Status Publish(uint32_t slot, std::span<uint64_t> digests, const DeltaBase* base,
                 void* cuda_stream, const util::Deadline& deadline) override;
  int fd() const override { return -1; }  // the allocations travel as IPC handles or chunk fds
  Result<util::UniqueFd> ExportAllocationFd(uint32_t index) const override {
    if (index >= chunks_.size()) {
      return Status::FailedPrecondition("allocation fd ", index, ": the store has ", chunks_.size(),
                                        " cuMem chunks");
    }
    Result<util::UniqueFd> fd = chunks_[index].ExportFd();
    if (!fd.ok()) {
      return fd.status().WithContext("exporting cuMem chunk " + std::to_string(index) + " of " +
                                     std::to_string(chunks_.size()) +
                                     " (is this process out of open files?)");
    }
    return fd;
  }
  const uint8_t* base() const override { return nullptr; }
  uint32_t digest_count() const override { return digests_.count(); }
  uint64_t copy_bytes() const override { return 0; }
  uint64_t held_bytes() const override { return 0; }  // the version is the registered tensors
  std::string Describe() const override {
    const std::string where = exported_
                                  ? "in " + std::to_string(allocations_) + " CUDA allocation(s) (" +
                                        std::to_string(chunks_.size()) + " cuMem chunks) "
                                  : "(nothing exported: sent by NCCL from this process) ";
    return "zero-copy: the registered tensors " + where + "on cuda:" + std::to_string(device_) +
           ", " + std::to_string(digests_.segments()) +
           " segments hashed in one grouped launch pair";
  }
  Status Close() override;

 private:
  // The Welcome's allocations and placements for `layout` (no CUDA work but queries and exports);
  // the cuMem chunks it exports, retained, into `retained`.
  Status Place(const StoreLayout& layout, wire::Welcome* welcome,
               std::vector<cuda::RetainedChunk>* retained);
  // Over tcp (no local readers): nothing exported, no allocation listed — NCCL reads the tensors
  // in this process. Each tensor is still checked to lie inside its CUDA memory (a bad pointer is
  // an error naming it, not a fault in the trainer's context at the first broadcast); they keep
  // their registration offsets in the virtual direct region.
  Status PlaceForNetwork(const StoreLayout& layout, wire::Welcome* welcome);
  void SetKind(const StoreLayout& layout, wire::Welcome* welcome) const;

  int device_;
  uint64_t allocations_ = 0;
  bool exported_ = true;                     // false over tcp: PlaceForNetwork
  std::vector<cuda::RetainedChunk> chunks_;  // the cuMem chunks in Welcome order
  cuda::CopyQueue queue_;
  GpuTensorDigests digests_;  // every segment, over the caller's tensors
};

// What one Welcome allocation is in this process: a cudaMalloc allocation (exported by IPC handle)
// or a run of back-to-back cuMem chunks (exported by fd, chunk by chunk).
struct Holding {
  uint64_t bytes = 0;
  std::vector<cuda::VmmChunk> chunks;  // empty: a cudaMalloc allocation
  std::string tensor;                  // the first tensor in it, for errors
};

// Adds the memory under tensor `name` ([p, p + bytes)) to `holdings`, keyed by base address.
// A cuMem chunk seen for the first time is recorded with `name` in `chunk_tensor`.
Status AddHolding(const std::string& name, const uint8_t* p, uint64_t bytes,
                  std::map<const uint8_t*, Holding>* holdings,
                  std::map<const uint8_t*, cuda::VmmChunk>* chunks,
                  std::map<const uint8_t*, std::string>* chunk_tensor) {
  WS_ASSIGN_OR_RETURN(std::optional<cuda::VmmChunk> first, cuda::VmmChunkAt(p));
  if (first.has_value()) {
    // cuMem memory: every chunk the tensor touches (a tensor may span several pages).
    for (const uint8_t* at = p; at < p + bytes;) {
      WS_ASSIGN_OR_RETURN(std::optional<cuda::VmmChunk> c, cuda::VmmChunkAt(at));
      if (!c.has_value() || c->bytes == 0 || c->base > at) {
        return Status::InvalidArgument("zero-copy: tensor '", name, "' (", bytes,
                                       " bytes) runs past the cuMem memory it starts in");
      }
      if (chunks->emplace(c->base, *c).second) chunk_tensor->emplace(c->base, name);
      at = c->base + c->bytes;
    }
    return Status::Ok();
  }
  WS_ASSIGN_OR_RETURN(cuda::AllocationRange range, cuda::AllocationOf(p));
  if (p + bytes > range.base + range.bytes) {
    return Status::InvalidArgument("zero-copy: tensor '", name, "' (", bytes,
                                   " bytes) runs past the end of its CUDA allocation");
  }
  Holding& h = (*holdings)[range.base];
  h.bytes = range.bytes;
  if (h.tensor.empty()) h.tensor = name;
  return Status::Ok();
}

// Zero-copy publishes registered CUDA tensors only (not Allocate()d ones).
Status CheckRegistered(const PublishedTensor& t) {
  if (t.placement.region != wire::Region::kSlot || t.source == nullptr) {
    return Status::NotSupported("zero-copy: tensor '", t.placement.spec.name,
                                "' is not a registered CUDA tensor");
  }
  return Status::Ok();
}

// One warning per prepare for the cudaMalloc allocations of a large page or more that end in a
// partial one (kWholePageBytes): the trainer can fix it (round its allocations up), nothing here
// can. Smaller allocations (a bias of its own) hold too few bytes for their pages to matter.
void WarnOfPartialPages(const std::map<const uint8_t*, Holding>& holdings) {
  uint64_t count = 0, bytes = 0, ipc = 0;
  const Holding* first = nullptr;
  for (const auto& [base, h] : holdings) {
    if (!h.chunks.empty()) continue;
    ++ipc;
    if (h.bytes < kWholePageBytes || h.bytes % kWholePageBytes == 0) continue;
    ++count;
    bytes += h.bytes;
    if (first == nullptr) first = &h;
  }
  if (count == 0) return;
  WS_LOG(WARN, "publisher") << "zero-copy: " << count << " of " << ipc
                            << " cudaMalloc allocation(s) (" << bytes
                            << " bytes; the first holds tensor '" << first->tensor << "', "
                            << first->bytes << " bytes) are not a whole number of 2 MiB pages: "
                            << "a subscriber opening them by CUDA IPC reads them at about 0.8x "
                               "the speed (the driver maps them with smaller pages there); "
                               "allocate in multiples of 2 MiB, as PyTorch's caching allocator "
                               "does";
}

Status ZeroCopyGpuStore::Place(const StoreLayout& layout, wire::Welcome* welcome,
                               std::vector<cuda::RetainedChunk>* retained) {
  std::map<const uint8_t*, Holding> holdings;           // by base
  std::map<const uint8_t*, cuda::VmmChunk> vmm_chunks;  // by base
  std::map<const uint8_t*, std::string> chunk_tensor;   // a tensor in each chunk, for errors
  for (const PublishedTensor& t : layout.tensors) {
    const std::string& name = t.placement.spec.name;
    WS_RETURN_IF_ERROR(CheckRegistered(t));
    if (t.placement.spec.nbytes == 0 || t.alias_of >= 0) continue;
    WS_RETURN_IF_ERROR(
        AddHolding(name, t.source, t.placement.spec.nbytes, &holdings, &vmm_chunks, &chunk_tensor)
            .WithContext("zero-copy: the CUDA allocation of tensor '" + name + "'"));
  }
  // Back-to-back chunks become one run, mapped as one range by the subscriber (a tensor may span
  // chunks; two runs never touch, or they would be one).
  for (auto it = vmm_chunks.begin(); it != vmm_chunks.end();) {
    const uint8_t* base = it->first;
    Holding run;
    run.tensor = chunk_tensor[base];
    const uint8_t* end = base;
    for (; it != vmm_chunks.end() && it->first == end; ++it) {
      run.chunks.push_back(it->second);
      run.bytes += it->second.bytes;
      end = it->first + it->second.bytes;
    }
    holdings.emplace(base, std::move(run));
  }
  WarnOfPartialPages(holdings);
  std::map<const uint8_t*, uint64_t> virtual_offset;
  uint64_t at = 0;
  welcome->allocations.clear();
  retained->clear();
  for (const auto& [base, h] : holdings) {
    wire::GpuAllocation a;
    a.offset = at;
    a.bytes = h.bytes;
    if (h.chunks.empty()) {
      Result<cuda::IpcHandle> handle = cuda::ExportIpcHandle(base);
      if (!handle.ok()) {
        return handle.status().WithContext(
            "zero-copy: exporting the CUDA allocation of tensor '" + h.tensor +
            "' (register tensors from cudaMalloc or cuMem memory, e.g. PyTorch's caching "
            "allocator with or without expandable segments, or publish without zero_copy)");
      }
      std::copy(handle->begin(), handle->end(), a.ipc_handle.begin());
    } else {
      a.kind = wire::AllocationKind::kPosixFdChunks;
      for (const cuda::VmmChunk& c : h.chunks) {
        const std::string context =
            "zero-copy: exporting the cuMem memory of tensor '" + chunk_tensor[c.base] + "'";
        Result<cuda::RetainedChunk> chunk = cuda::RetainedChunk::Retain(c);
        if (!chunk.ok()) return chunk.status().WithContext(context);
        // Exported once now so that an allocation nobody can share fails this Publish, not each
        // subscriber's connection.
        Result<util::UniqueFd> probe = chunk->ExportFd();
        if (!probe.ok()) {
          return probe.status().WithContext(
              context +
              " (a cuMem allocation created without "
              "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR cannot be shared)");
        }
        WS_RETURN_IF_ERROR(probe->Close());
        retained->push_back(std::move(chunk).value());
        a.chunk_bytes.push_back(c.bytes);
      }
    }
    welcome->allocations.push_back(std::move(a));
    virtual_offset[base] = at;
    at += (h.bytes + kRangeAlignment - 1) / kRangeAlignment * kRangeAlignment;
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
      auto holding = std::prev(holdings.upper_bound(t.source));  // AddHolding put one there
      p.offset = virtual_offset[holding->first] + static_cast<uint64_t>(t.source - holding->first);
    }
    welcome->tensors.push_back(std::move(p));
  }
  SetKind(layout, welcome);
  welcome->direct_bytes = at;
  welcome->arena_bytes = at;
  return Status::Ok();
}

Status ZeroCopyGpuStore::PlaceForNetwork(const StoreLayout& layout, wire::Welcome* welcome) {
  std::map<const uint8_t*, Holding> holdings;  // found to check bounds only: nothing is exported
  std::map<const uint8_t*, cuda::VmmChunk> vmm_chunks;
  std::map<const uint8_t*, std::string> chunk_tensor;
  for (const PublishedTensor& t : layout.tensors) {
    WS_RETURN_IF_ERROR(CheckRegistered(t));
    if (t.placement.spec.nbytes == 0 || t.alias_of >= 0) continue;
    const std::string& name = t.placement.spec.name;
    WS_RETURN_IF_ERROR(
        AddHolding(name, t.source, t.placement.spec.nbytes, &holdings, &vmm_chunks, &chunk_tensor)
            .WithContext("zero-copy: the CUDA memory of tensor '" + name + "'"));
  }
  welcome->allocations.clear();
  welcome->tensors.clear();
  uint64_t end = 0;
  for (const PublishedTensor& t : layout.tensors) {
    wire::TensorPlacement p = t.placement;  // aliases share their original's offset
    p.region = wire::Region::kDirect;
    if (p.spec.nbytes == 0) p.offset = 0;
    end = std::max(end, p.offset + p.spec.nbytes);
    welcome->tensors.push_back(std::move(p));
  }
  SetKind(layout, welcome);
  welcome->direct_bytes = end;
  welcome->arena_bytes = end;
  return Status::Ok();
}

void ZeroCopyGpuStore::SetKind(const StoreLayout& layout, wire::Welcome* welcome) const {
  welcome->arena_kind = wire::ArenaKind::kCudaIpc;
  welcome->device = device_;
  welcome->digest_kind = wire::DigestKind::kGpu64;
  welcome->segment_bytes = layout.segment_bytes;
  welcome->slot_count = layout.slots;  // versions are told apart, all read the same memory
  welcome->slot_bytes = 0;
  welcome->slots_offset = 0;
  welcome->direct_offset = 0;
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
  std::vector<cuda::RetainedChunk> chunks;
  if (layout.local_readers) {
    WS_RETURN_IF_ERROR(Place(layout, &placed, &chunks));
  } else {
    WS_RETURN_IF_ERROR(PlaceForNetwork(layout, &placed));
  }
  WS_ASSIGN_OR_RETURN(cuda::CopyQueue queue, cuda::CopyQueue::Create(device_));
  WS_ASSIGN_OR_RETURN(GpuTensorDigests digests,
                      GpuTensorDigests::Prepare(layout, CutSegments(layout), queue));
  *welcome = std::move(placed);
  allocations_ = welcome->allocations.size();
  exported_ = layout.local_readers;
  chunks_ = std::move(chunks);
  queue_ = std::move(queue);
  digests_ = std::move(digests);
  return Status::Ok();
}

Status ZeroCopyGpuStore::Publish(uint32_t /*slot*/, std::span<uint64_t> digests,
                                 const DeltaBase* /*base*/, void* cuda_stream,
                                 const util::Deadline& deadline) {
  cuda::ScopedDevice restore;
  WS_RETURN_IF_ERROR(cuda::SetDevice(device_));
  return digests_.Run(queue_, digests, cuda_stream, deadline);
}

Status ZeroCopyGpuStore::Close() {
  Status result;
  result.Update(queue_.Drain());
  result.Update(digests_.Close());
  result.Update(queue_.Close());
  for (cuda::RetainedChunk& c : chunks_) result.Update(c.Close());
  chunks_.clear();
  allocations_ = 0;
  exported_ = true;
  return result;
}

}  // namespace

Result<std::unique_ptr<VersionStore>> NewZeroCopyGpuStore(int device) {
  return std::unique_ptr<VersionStore>(new ZeroCopyGpuStore(device));
}

}  // namespace weightsync::transport::store
