#include "transport/store/store_table.h"

#include <utility>

namespace weightsync::transport::store {
namespace {

bool OnGpu(const StoreRequest& r) { return r.cuda_device >= 0; }
bool Ring(const StoreRequest& r) { return r.options->ring_buckets > 0; }

constexpr StoreEntry kStores[] = {
    {"zero-copy",
     "CUDA tensors: the registered tensors themselves, exported to local subscribers (IPC "
     "handles, cuMem chunk fds), broadcast over NCCL to tcp ones; 0 bytes held",
     true, [](const StoreRequest& r) { return r.options->zero_copy && OnGpu(r); },
     [](const StoreRequest& r) { return NewZeroCopyGpuStore(r.cuda_device); }},
    {"gpu-ring",
     "CUDA tensors: a ring of ring_buckets buckets in one cuMem allocation on their GPU, filled "
     "from the tensors as readers stream the version (none allocated over tcp)",
     true, [](const StoreRequest& r) { return Ring(r) && OnGpu(r); },
     [](const StoreRequest& r) { return NewGpuRingStore(r.cuda_device); }},
    {"host-ring",
     "host tensors: a ring of ring_buckets buckets in a memfd, filled from the tensors as readers "
     "stream the version (none allocated over tcp)",
     true, [](const StoreRequest& r) { return Ring(r) && !OnGpu(r); },
     [](const StoreRequest& r) { return NewHostRingStore(r.name); }},
    {"gpu-arena", "CUDA tensors: `slots` copies in a cuMem arena on their GPU (fd exported once)",
     false, [](const StoreRequest& r) { return OnGpu(r); },
     [](const StoreRequest& r) { return NewGpuStore(r.cuda_device); }},
    {"host-arena",
     "host tensors: `slots` copies in a memfd arena, which also holds Allocate()d tensors; "
     "over tcp each slot also keeps its version's delta against the one before",
     false, [](const StoreRequest& r) { return !OnGpu(r) && r.host_store && *r.host_store; },
     [](const StoreRequest& r) -> Result<std::unique_ptr<VersionStore>> {
       return std::move(*r.host_store);
     }},
};

}  // namespace

std::span<const StoreEntry> StoreTable() { return kStores; }

Result<const StoreEntry*> ChooseStore(const StoreRequest& request) {
  for (const StoreEntry& entry : kStores) {
    if (entry.can_hold(request)) return &entry;
  }
  return Status::NotSupported(
      "no store holds ", request.cuda_device >= 0 ? "CUDA tensors" : "host tensors",
      request.options->zero_copy ? " with zero_copy" : "",
      request.options->ring_buckets > 0 ? " in a ring" : "",
      request.host_store && !*request.host_store ? " (the host store is gone)" : "");
}

}  // namespace weightsync::transport::store
