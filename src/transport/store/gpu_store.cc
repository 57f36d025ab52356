// The GPU store: a cuMem arena on the publisher's device (gpu_arena.h), exported once as a POSIX
// fd that subscribers on this host import (cuda-ipc) and the tcp server's NCCL sender maps. A
// Publish is one batch of device-to-device copies into the slot plus one prepared digest launch
// per segment, on the arena's stream, ordered after the caller's stream.
#include <algorithm>
#include <memory>

#include "transport/store/gpu_arena.h"
#include "transport/store/version_store.h"
#include "util/fail_point.h"
#include "util/logging.h"

namespace weightsync::transport::store {
namespace {

// Fewer, larger digest launches per step than on the host.
constexpr uint64_t kDefaultSegmentBytes = 64ull << 20;

class GpuStore final : public VersionStore {
 public:
  explicit GpuStore(int device) : device_(device) {}
  ~GpuStore() override {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "publisher") << "release: GPU arena: " << s;
  }

  Status Freeze(const StoreLayout& layout, wire::Welcome* welcome) override;
  Status Publish(uint32_t slot, std::span<uint64_t> digests, const DeltaBase* /*base*/,
                 void* cuda_stream, const util::Deadline& deadline) override {
    WS_RETURN_IF_ERROR(arena_->Publish(slot, digests.data(), cuda_stream, deadline));
    for (auto [tied, original] : digest_copies_) digests[tied] = digests[original];
    return Status::Ok();
  }
  // A relay of CUDA destinations: the same copies, no digest launch (the trainer's digests).
  Status PublishCopy(uint32_t slot, const DeltaBase* /*base*/,
                     const util::Deadline& deadline) override {
    WS_RETURN_IF_ERROR(arena_->CopyWritten(slot, deadline));
    // Tests: a relay that corrupts what it serves (its children's verify must refuse it).
    if (util::FailPoints::Check("relay.corrupt_served").action == util::FailAction::kFlip) {
      return arena_->FlipBit(slot);
    }
    return Status::Ok();
  }
  int fd() const override { return arena_ ? arena_->fd() : -1; }
  const uint8_t* base() const override { return nullptr; }
  uint32_t digest_count() const override { return digest_count_; }
  uint64_t copy_bytes() const override { return copy_bytes_; }
  uint64_t held_bytes() const override { return arena_ ? arena_->arena_bytes() : 0; }  // slots
  std::string Describe() const override {
    return std::to_string(slots_) + " slots of " +
           std::to_string(arena_ ? arena_->slot_bytes() : 0) +
           " bytes on cuda:" + std::to_string(device_) + ", " + std::to_string(segments_) +
           " segments, their digests one grouped launch pair per slot";
  }
  Status Close() override {
    if (!arena_) return Status::Ok();
    Status s = arena_->Close();
    arena_.reset();
    return s;
  }

 private:
  int device_;
  std::unique_ptr<GpuArena> arena_;
  std::vector<std::pair<uint32_t, uint32_t>> digest_copies_;
  uint32_t digest_count_ = 0;
  uint64_t copy_bytes_ = 0;
  uint64_t segments_ = 0;
  uint32_t slots_ = 0;
};

Status GpuStore::Freeze(const StoreLayout& given, wire::Welcome* welcome) {
  StoreLayout layout = given;
  if (layout.segment_bytes == 0) layout.segment_bytes = kDefaultSegmentBytes;
  for (const PublishedTensor& t : layout.tensors) {
    if (t.placement.region != wire::Region::kSlot) {
      return Status::NotSupported("tensor '", t.placement.spec.name,
                                  "': a GPU store holds registered tensors only");
    }
  }
  SegmentLayout segments = CutSegments(layout);
  std::vector<GpuArena::Copy> copies;
  uint64_t copy_bytes = 0;
  for (const PublishedTensor& t : layout.tensors) {
    if (t.alias_of >= 0) continue;
    copies.push_back({t.source, t.placement.offset, t.placement.spec.nbytes});
    copy_bytes += t.placement.spec.nbytes;
  }
  std::vector<GpuArena::Segment> arena_segments;
  for (const Segment& s : segments.segments) {
    arena_segments.push_back(
        {layout.tensors[s.tensor].placement.offset + s.offset, s.bytes, s.digest});
  }
  WS_ASSIGN_OR_RETURN(std::unique_ptr<GpuArena> arena,
                      GpuArena::Create(device_, layout.slot_bytes, layout.slots, std::move(copies),
                                       std::move(arena_segments), segments.digest_count));
  welcome->arena_kind = wire::ArenaKind::kCudaMem;
  welcome->device = device_;
  welcome->digest_kind = wire::DigestKind::kGpu64;
  welcome->segment_bytes = layout.segment_bytes;
  welcome->slot_count = layout.slots;
  welcome->arena_bytes = arena->arena_bytes();
  welcome->direct_offset = 0;
  welcome->direct_bytes = 0;
  welcome->slots_offset = 0;
  welcome->slot_bytes = arena->slot_bytes();
  welcome->tensors.clear();
  for (const PublishedTensor& t : layout.tensors) welcome->tensors.push_back(t.placement);
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "publisher") << "release: GPU arena: " << s;
  arena_ = std::move(arena);
  digest_copies_ = std::move(segments.copies);
  digest_count_ = segments.digest_count;
  copy_bytes_ = copy_bytes;
  segments_ = segments.segments.size();
  slots_ = layout.slots;
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<VersionStore>> NewGpuStore(int device) {
  return std::unique_ptr<VersionStore>(new GpuStore(device));
}

}  // namespace weightsync::transport::store
