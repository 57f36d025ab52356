#include "transport/view/zero_copy_view.h"

#include <algorithm>
#include <string>

#include "cuda/ipc.h"
#include "plan/plan.h"
#include "util/logging.h"

namespace weightsync::transport::view {
namespace {

class ZeroCopyView final : public StoreView {
 public:
  explicit ZeroCopyView(const wire::Welcome& welcome) : welcome_(welcome) {}
  ~ZeroCopyView() override {
    if (Status s = Release(); !s.ok()) WS_LOG(WARN, "subscriber") << "store view cleanup: " << s;
  }
  Status Open(std::vector<util::UniqueFd>* fds, int device);

  uint32_t units() const override { return 1; }
  // A range lies in one allocation (ValidateLayout placed every tensor inside one): it is located
  // there, its span that allocation's.
  void Cut(uint32_t /*unit*/, wire::Region region, uint64_t offset, uint64_t bytes,
           uint64_t max_piece, std::vector<Piece>* out) const override {
    if (region != wire::Region::kDirect || bytes == 0) return;
    const int64_t k = plan::AllocationHolding(welcome_, offset, bytes);
    if (k < 0) return;  // ValidateLayout refused such a layout
    const uint8_t* src = allocations_[k] + (offset - offsets_[k]);
    const uint64_t step = max_piece > 0 ? max_piece : bytes;
    for (uint64_t done = 0; done < bytes; done += step) {
      out->push_back({done, src + done, std::min(step, bytes - done), static_cast<uint32_t>(k)});
    }
  }
  Status Step(const wire::StepBegin& /*begin*/, const util::Deadline& /*deadline*/,
              util::FunctionRef<Status(uint32_t)> read) override {
    return read(0);  // every version is the same memory
  }
  std::string Describe() const override {
    return ", zero-copy from " + std::to_string(allocations_.size()) + " allocation(s) (" +
           std::to_string(chunk_mappings_.size()) +
           " of cuMem chunks) of the publisher's tensors on cuda:" +
           std::to_string(welcome_.device);
  }
  Status Release() override {
    Status result;
    for (cuda::IpcMapping& m : ipc_mappings_) result.Update(m.Close());
    for (cuda::ImportedChunks& m : chunk_mappings_) result.Update(m.Close());
    ipc_mappings_.clear();
    chunk_mappings_.clear();
    allocations_.clear();
    offsets_.clear();
    return result;
  }

 private:
  const wire::Welcome& welcome_;
  std::vector<cuda::IpcMapping> ipc_mappings_;
  std::vector<cuda::ImportedChunks> chunk_mappings_;
  std::vector<const uint8_t*> allocations_;  // where each lies in this process
  std::vector<uint64_t> offsets_;            // where each starts in the direct region
};

Status ZeroCopyView::Open(std::vector<util::UniqueFd>* fds, int device) {
  const size_t fd_count = fds != nullptr ? fds->size() : 0;
  if (fd_count != plan::AllocationFdCount(welcome_)) {
    return Status::ProtocolError("cuda-ipc: ", fd_count, " cuMem chunk fds arrived for the ",
                                 plan::AllocationFdCount(welcome_), " chunks in the Welcome");
  }
  allocations_.reserve(welcome_.allocations.size());
  size_t next_fd = 0;
  std::vector<int> chunk_fds;
  for (size_t i = 0; i < welcome_.allocations.size(); ++i) {
    const wire::GpuAllocation& a = welcome_.allocations[i];
    const std::string what = "cuda-ipc: opening the publisher's allocation " + std::to_string(i) +
                             " of " + std::to_string(welcome_.allocations.size()) + " (" +
                             std::to_string(a.bytes) + " bytes";
    if (a.kind == wire::AllocationKind::kPosixFdChunks) {
      chunk_fds.clear();
      for (size_t c = 0; c < a.chunk_bytes.size(); ++c) {
        chunk_fds.push_back((*fds)[next_fd + c].get());
      }
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
      offsets_.push_back(a.offset);
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
    offsets_.push_back(a.offset);
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<StoreView>> OpenZeroCopyAllocations(const wire::Welcome& welcome,
                                                           std::vector<util::UniqueFd>* fds,
                                                           int device) {
  auto view = std::make_unique<ZeroCopyView>(welcome);
  WS_RETURN_IF_ERROR(view->Open(fds, device));
  return std::unique_ptr<StoreView>(std::move(view));
}

}  // namespace weightsync::transport::view
