// The arena and ring views (store_view.h), over host or GPU memory, and the two makers. The
// zero-copy view is zero_copy_view.cc's.
#include "transport/view/store_view.h"

#include <algorithm>
#include <utility>

#include "cuda/vmm.h"
#include "transport/link/step_exchange.h"
#include "transport/store/shm_segment.h"
#include "transport/view/zero_copy_view.h"
#include "util/logging.h"

namespace weightsync::transport::view {
namespace {

// What a view reads: host memory mapped from a memfd, or a cuMem allocation imported for a device.
class Memory {
 public:
  virtual ~Memory() = default;
  virtual const uint8_t* data() const = 0;
  virtual std::span<const uint8_t> host() const { return {}; }
  virtual int owner_device() const { return -1; }
  virtual Status GrantAccess(int device) {
    return Status::NotSupported("host memory cannot be granted to cuda:", device);
  }
  virtual Status Close() = 0;
};

class HostMemory final : public Memory {
 public:
  explicit HostMemory(store::Mapping mapping) : mapping_(std::move(mapping)) {}
  const uint8_t* data() const override { return mapping_.data(); }
  std::span<const uint8_t> host() const override { return {mapping_.data(), mapping_.size()}; }
  Status Close() override { return mapping_.Close(); }

 private:
  store::Mapping mapping_;
};

class GpuMemory final : public Memory {
 public:
  explicit GpuMemory(cuda::ImportedAllocation imported) : imported_(std::move(imported)) {}
  const uint8_t* data() const override { return imported_.data(); }
  int owner_device() const override { return imported_.owner_device(); }
  Status GrantAccess(int device) override { return imported_.GrantAccess(device); }
  Status Close() override { return imported_.Close(); }

 private:
  cuda::ImportedAllocation imported_;
};

// `bytes` at `src`, `at` bytes into the range, cut into pieces of at most `max_piece`.
void Append(const uint8_t* src, uint64_t at, uint64_t bytes, uint64_t max_piece, uint32_t span,
            std::vector<Piece>* out) {
  const uint64_t step = max_piece > 0 ? max_piece : bytes;
  for (uint64_t done = 0; done < bytes; done += step) {
    out->push_back({at + done, src + done, std::min(step, bytes - done), span});
  }
}

// Shared by both views over one piece of memory: what they hold and release.
class MemoryView : public StoreView {
 public:
  MemoryView(const wire::Welcome& welcome, std::unique_ptr<Memory> memory, std::string text)
      : welcome_(welcome), memory_(std::move(memory)), text_(std::move(text)) {}
  ~MemoryView() override {
    if (Status s = Release(); !s.ok()) WS_LOG(WARN, "subscriber") << "store view cleanup: " << s;
  }
  std::span<const uint8_t> host_memory() const override {
    return memory_ ? memory_->host() : std::span<const uint8_t>();
  }
  int owner_device() const override { return memory_ ? memory_->owner_device() : -1; }
  Status GrantAccess(int device) override {
    return memory_ ? memory_->GrantAccess(device) : Status::FailedPrecondition("view released");
  }
  Status Release() override {
    if (!memory_) return Status::Ok();
    Status s = memory_->Close();
    memory_.reset();
    return s;
  }

 protected:
  const wire::Welcome& welcome_;
  std::unique_ptr<Memory> memory_;
  std::string text_;  // Describe's
};

// An arena: `slot_count` slots of `slot_bytes` (the registered tensors) and a direct region (the
// publisher's Allocate()d tensors, shared by every version). The StepBegin names the slot.
class ArenaView final : public MemoryView {
 public:
  using MemoryView::MemoryView;
  uint32_t units() const override { return welcome_.slot_count; }
  void Cut(uint32_t unit, wire::Region region, uint64_t offset, uint64_t bytes, uint64_t max_piece,
           std::vector<Piece>* out) const override {
    const uint8_t* base =
        region == wire::Region::kSlot ? SlotBase(unit) : memory_->data() + welcome_.direct_offset;
    Append(base + offset, 0, bytes, max_piece, 0, out);
  }
  const uint8_t* SlotBase(uint32_t unit) const override {
    return memory_->data() + welcome_.slots_offset + uint64_t{unit} * welcome_.slot_bytes;
  }
  Status Step(const wire::StepBegin& begin, const util::Deadline& /*deadline*/,
              util::FunctionRef<Status(uint32_t)> read) override {
    if (begin.slot >= welcome_.slot_count) {
      return Status::ProtocolError("step ", begin.step, " in slot ", begin.slot,
                                   " but the arena has ", welcome_.slot_count, " slots");
    }
    return read(begin.slot);
  }
  std::string Describe() const override { return text_; }
};

// A ring: a version of `version_buckets` buckets streamed through `slot_count` slots of
// `slot_bytes`, bucket b in slot b % slot_count, each announced by the publisher and answered once
// read (link/step_exchange.h).
class RingView final : public MemoryView {
 public:
  RingView(const wire::Welcome& welcome, std::unique_ptr<Memory> memory, std::string text,
           link::Link* link)
      : MemoryView(welcome, std::move(memory), std::move(text)), link_(link) {}
  uint32_t units() const override { return welcome_.version_buckets; }
  bool streamed() const override { return true; }
  void Cut(uint32_t unit, wire::Region region, uint64_t offset, uint64_t bytes, uint64_t max_piece,
           std::vector<Piece>* out) const override {
    if (region != wire::Region::kSlot) return;  // a ring holds registered tensors only
    const uint64_t bucket = welcome_.slot_bytes;
    const uint64_t first = uint64_t{unit} * bucket, last = first + bucket;
    const uint64_t begin = std::max(offset, first), end = std::min(offset + bytes, last);
    if (begin >= end) return;
    const uint8_t* slot =
        memory_->data() + welcome_.slots_offset + uint64_t{unit % welcome_.slot_count} * bucket;
    Append(slot + (begin - first), begin - offset, end - begin, max_piece, 0, out);
  }
  Status Step(const wire::StepBegin& begin, const util::Deadline& deadline,
              util::FunctionRef<Status(uint32_t)> read) override {
    return link::ReadRingBuckets(link_->channel(), link_->peer(), begin.step,
                                 welcome_.version_buckets, welcome_.slot_count, deadline,
                                 [&](uint32_t b, uint32_t /*slot*/) { return read(b); });
  }
  std::string Describe() const override { return text_; }

 private:
  link::Link* link_;
};

// "a ring of 2 host buckets of 268435456 bytes (21 a version)"
std::string RingText(const wire::Welcome& welcome, const char* where) {
  return "a ring of " + std::to_string(welcome.slot_count) + " " + where + " buckets of " +
         std::to_string(welcome.slot_bytes) + " bytes (" + std::to_string(welcome.version_buckets) +
         " a version)";
}

Result<std::unique_ptr<StoreView>> OverMemory(const wire::Welcome& welcome,
                                              std::unique_ptr<Memory> memory, bool host,
                                              link::Link* link) {
  const std::string gpu = "cuda:" + std::to_string(welcome.device);
  if (wire::IsRing(welcome.arena_kind)) {
    std::string text = ", " + RingText(welcome, host ? "host" : "GPU") + (host ? "" : " on " + gpu);
    return std::unique_ptr<StoreView>(
        new RingView(welcome, std::move(memory), std::move(text), link));
  }
  return std::unique_ptr<StoreView>(
      new ArenaView(welcome, std::move(memory), host ? ", host arena" : ", GPU arena from " + gpu));
}

}  // namespace

Result<std::unique_ptr<StoreView>> MapHostStore(const wire::Welcome& welcome, util::UniqueFd fd,
                                                link::Link* link) {
  const std::string peer = link != nullptr ? link->peer() : std::string("the publisher");
  WS_RETURN_IF_ERROR(store::CheckImportedSegment(fd.get(), welcome.arena_bytes).WithContext(peer));
  WS_ASSIGN_OR_RETURN(
      store::Mapping mapping,
      store::Mapping::Map(fd.get(), welcome.arena_bytes, /*writable=*/false, "arena of " + peer));
  WS_RETURN_IF_ERROR(fd.Close());  // the mapping keeps the memory alive
  return OverMemory(welcome, std::make_unique<HostMemory>(std::move(mapping)), /*host=*/true, link);
}

Result<std::unique_ptr<StoreView>> ImportGpuStore(const wire::Welcome& welcome, util::UniqueFd fd,
                                                  std::vector<util::UniqueFd>* allocation_fds,
                                                  int device, link::Link* link) {
  if (welcome.arena_kind == wire::ArenaKind::kCudaIpc) {
    return OpenZeroCopyAllocations(welcome, allocation_fds, device);
  }
  WS_ASSIGN_OR_RETURN(cuda::ImportedAllocation imported,
                      cuda::ImportedAllocation::Import(fd.get(), welcome.arena_bytes, device));
  WS_RETURN_IF_ERROR(fd.Close());  // the import holds the allocation
  return OverMemory(welcome, std::make_unique<GpuMemory>(std::move(imported)), /*host=*/false,
                    link);
}

}  // namespace weightsync::transport::view
