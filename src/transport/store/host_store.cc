// The host store: a memfd arena (host_arena.h) that subscribers on this host map read-only, and
// tcp sends from. A Publish copies every registered tensor into the slot and hashes each segment
// (xxHash3) on a pool of worker threads (every hardware thread by default: the copy is bound by
// memory bandwidth only once enough cores hash), one task per segment, copied and hashed in one
// pass (util::CopyAndHash64).
#include <cstring>
#include <memory>

#include "transport/store/host_arena.h"
#include "transport/store/version_store.h"
#include "util/fail_point.h"
#include "util/hash.h"
#include "util/worker_pool.h"

namespace weightsync::transport::store {
namespace {

// Address space reserved for arena-allocated tensors and slots; only what is used is committed.
constexpr uint64_t kReserveBytes = 1ull << 40;
constexpr uint64_t kDefaultSegmentBytes = 8ull << 20;

class HostStore final : public VersionStore {
 public:
  explicit HostStore(std::unique_ptr<HostArena> arena) : arena_(std::move(arena)) {}
  ~HostStore() override { (void)Close(); }  // the arena logs its own failures

  Result<uint64_t> AllocateDirect(uint64_t bytes) override { return arena_->AllocateDirect(bytes); }
  uint8_t* direct_base() const override { return arena_->base(); }
  Status Freeze(const StoreLayout& layout, wire::Welcome* welcome) override;
  Status Publish(uint32_t slot, std::span<uint64_t> digests, void* cuda_stream,
                 const util::Deadline& deadline) override;
  int fd() const override { return arena_->fd(); }
  const uint8_t* base() const override { return arena_->base(); }
  uint32_t digest_count() const override { return digest_count_; }
  uint64_t copy_bytes() const override { return copy_bytes_; }
  // The slots only: the direct region before them holds the Allocate()d tensors themselves.
  uint64_t held_bytes() const override {
    return arena_ && arena_->frozen() ? uint64_t{slots_} * arena_->slot_bytes() : 0;
  }
  std::string Describe() const override {
    return std::to_string(slots_) + " slots of " + std::to_string(arena_->slot_bytes()) +
           " bytes in host memory, " + std::to_string(tasks_.size()) + " segments, " +
           std::to_string(workers_ ? workers_->size() : 0) + " threads";
  }
  Status Close() override {
    workers_.reset();
    return arena_ ? arena_->Close() : Status::Ok();
  }

 private:
  // One unit of Publish work: copy (registered tensors) then hash one segment.
  struct Task {
    const uint8_t* src = nullptr;  // null: hash in place (a tensor living in the arena)
    uint64_t arena_offset = 0;     // slot tensors: from the slot start; others: from the base
    bool in_slot = false;
    uint64_t bytes = 0;
    uint32_t digest = 0;
  };
  struct Job {
    HostStore* self;
    uint32_t slot;
    uint64_t* digests;
  };
  static void RunTask(void* context, uint32_t index);

  std::unique_ptr<HostArena> arena_;
  std::vector<Task> tasks_;
  std::vector<std::pair<uint32_t, uint32_t>> digest_copies_;
  std::unique_ptr<util::WorkerPool> workers_;
  uint32_t digest_count_ = 0;
  uint64_t copy_bytes_ = 0;
  uint32_t slots_ = 0;
};

void HostStore::RunTask(void* context, uint32_t index) {
  auto* job = static_cast<Job*>(context);
  const Task& t = job->self->tasks_[index];
  HostArena& arena = *job->self->arena_;
  uint8_t* dst = t.in_slot ? arena.slot(job->slot) + t.arena_offset : arena.base() + t.arena_offset;
  uint64_t digest =
      t.src != nullptr ? util::CopyAndHash64(dst, t.src, t.bytes) : util::Hash64(dst, t.bytes);
  if (util::FailPoints::Check("publisher.corrupt_after_digest").action == util::FailAction::kFlip) {
    dst[t.bytes / 2] ^= 0x01;  // the digest now describes bytes the arena no longer holds
  }
  job->digests[t.digest] = digest;
}

Status HostStore::Freeze(const StoreLayout& given, wire::Welcome* welcome) {
  StoreLayout layout = given;
  if (layout.segment_bytes == 0) layout.segment_bytes = kDefaultSegmentBytes;
  SegmentLayout segments = CutSegments(layout);
  std::vector<Task> tasks;
  uint64_t copy_bytes = 0;
  tasks.reserve(segments.segments.size());
  for (const Segment& s : segments.segments) {
    const PublishedTensor& t = layout.tensors[s.tensor];
    Task task;
    task.bytes = s.bytes;
    task.in_slot = t.placement.region == wire::Region::kSlot;
    task.arena_offset = t.placement.offset + s.offset;
    task.src = t.source != nullptr ? t.source + s.offset : nullptr;
    task.digest = s.digest;
    if (task.src != nullptr) copy_bytes += task.bytes;
    tasks.push_back(task);
  }
  // Sealing twice is a no-op for the same layout (a Publish that failed later is retried).
  WS_RETURN_IF_ERROR(arena_->Freeze(layout.slot_bytes, layout.slots));
  welcome->arena_kind = wire::ArenaKind::kHostMemfd;
  welcome->device = -1;
  welcome->digest_kind = wire::DigestKind::kXxh3;
  welcome->segment_bytes = layout.segment_bytes;
  welcome->slot_count = layout.slots;
  welcome->arena_bytes = arena_->arena_bytes();
  welcome->direct_offset = 0;
  welcome->direct_bytes = arena_->direct_bytes();
  welcome->slots_offset = arena_->slots_offset();
  welcome->slot_bytes = arena_->slot_bytes();
  welcome->tensors.clear();
  for (const PublishedTensor& t : layout.tensors) welcome->tensors.push_back(t.placement);
  const int threads = layout.copy_threads > 0 ? layout.copy_threads : util::HashThreads();
  workers_ = std::make_unique<util::WorkerPool>(threads);
  tasks_ = std::move(tasks);
  digest_copies_ = std::move(segments.copies);
  digest_count_ = segments.digest_count;
  copy_bytes_ = copy_bytes;
  slots_ = layout.slots;
  return Status::Ok();
}

Status HostStore::Publish(uint32_t slot, std::span<uint64_t> digests, void* /*cuda_stream*/,
                          const util::Deadline& /*deadline*/) {
  Job job{this, slot, digests.data()};
  workers_->Run(static_cast<uint32_t>(tasks_.size()), &HostStore::RunTask, &job);
  for (auto [tied, original] : digest_copies_) digests[tied] = digests[original];
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<VersionStore>> NewHostStore(const std::string& name) {
  WS_ASSIGN_OR_RETURN(std::unique_ptr<HostArena> arena, HostArena::Create(name, kReserveBytes));
  return std::unique_ptr<VersionStore>(new HostStore(std::move(arena)));
}

}  // namespace weightsync::transport::store
