// The host store: a memfd arena (host_arena.h) that subscribers on this host map read-only, and
// tcp sends from. A Publish copies every registered tensor into the slot and hashes each segment
// (xxHash3) on a pool of worker threads (every hardware thread by default: the copy is bound by
// memory bandwidth only once enough cores hash), one task per segment, copied and hashed in one
// pass (util::CopyAndHash64). With delta room (docs/deltas.md) each segment is then encoded
// against the previous version's slot, into this slot's delta area, off the trainer's path: Publish
// returns once the version is copied and hashed, and a thread of the store's own runs the encode on
// the same workers while the trainer goes on. A tcp session sends a delta once it is encoded
// (AwaitDelta); the next Publish, a write from outside and Close wait for the encode, so it never
// reads a base being overwritten nor shares the workers.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <utility>

#include "delta/segment_delta.h"
#include "transport/store/host_arena.h"
#include "transport/store/version_store.h"
#include "util/fail_point.h"
#include "util/hash.h"
#include "util/ledger.h"
#include "util/logging.h"
#include "util/mutex.h"
#include "util/thread.h"
#include "util/worker_pool.h"

namespace weightsync::transport::store {
namespace {

// One slot's delta area: anonymous memory mapped at Freeze, its pages committed as deltas are
// written (a quarter of the tensors with kAuto). Publisher memory, reported by held_bytes (the
// ledger's staging_bytes counts subscribers' buffers only).
class DeltaArea {
 public:
  static Result<DeltaArea> Map(uint64_t bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return Status::FromErrno(errno,
                               "mapping a delta area of " + std::to_string(bytes) + " bytes");
    }
    DeltaArea area;
    area.data_ = static_cast<uint8_t*>(p);
    area.bytes_ = bytes;
    return area;
  }
  DeltaArea() = default;
  DeltaArea(DeltaArea&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeltaArea& operator=(DeltaArea&&) = delete;
  ~DeltaArea() {
    if (Status s = Unmap(); !s.ok()) WS_LOG(WARN, "publisher") << "delta area: " << s;
  }
  Status Unmap() {
    if (data_ == nullptr) return Status::Ok();
    const int rc = ::munmap(std::exchange(data_, nullptr), bytes_);
    return rc == 0 ? Status::Ok() : Status::FromErrno(errno, "unmapping a delta area");
  }
  uint8_t* data() const { return data_; }

 private:
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
};

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
  Status Publish(uint32_t slot, std::span<uint64_t> digests, const DeltaBase* base,
                 void* cuda_stream, const util::Deadline& deadline) override;
  Status PublishCopy(uint32_t slot, const DeltaBase* base,
                     const util::Deadline& /*deadline*/) override;
  Result<uint8_t*> WriteFromOutside(uint32_t slot) override {
    if (!arena_ || !arena_->frozen()) return Status::FailedPrecondition("host store not frozen");
    BeginDelta(slot, nullptr);
    return arena_->slot(slot);
  }
  int fd() const override { return arena_->fd(); }
  const uint8_t* base() const override { return arena_->base(); }
  uint32_t digest_count() const override { return digest_count_; }
  uint64_t copy_bytes() const override { return copy_bytes_; }
  // The slots and their delta areas: the direct region before them holds the Allocate()d
  // tensors themselves.
  uint64_t held_bytes() const override {
    return arena_ && arena_->frozen()
               ? uint64_t{slots_} * (arena_->slot_bytes() + delta_area_bytes_)
               : 0;
  }
  const SlotDelta* delta(uint32_t slot) const override {
    return slot < deltas_.size() ? &deltas_[slot] : nullptr;
  }
  bool DeltaPending(uint32_t slot) const override {
    util::MutexLock lock(&encode_mu_);
    return pending_slot_ == static_cast<int64_t>(slot);
  }
  Result<const SlotDelta*> AwaitDelta(uint32_t slot, const util::Deadline& deadline) override;
  std::string Describe() const override {
    return std::to_string(slots_) + " slots of " + std::to_string(arena_->slot_bytes()) +
           " bytes in host memory, " + std::to_string(tasks_.size()) + " segments, " +
           std::to_string(workers_ ? workers_->size() : 0) + " threads" +
           (delta_area_bytes_ > 0
                ? ", delta areas of " + std::to_string(delta_area_bytes_) + " bytes"
                : "");
  }
  Status Close() override {
    StopEncoder();
    workers_.reset();
    Status result = arena_ ? arena_->Close() : Status::Ok();
    for (DeltaArea& area : delta_areas_) result.Update(area.Unmap());
    delta_areas_.clear();
    deltas_.clear();
    encoders_.clear();
    return result;
  }

 private:
  // One unit of Publish work: copy (registered tensors) then hash one segment; and, with delta
  // room and a base, one unit of the encode that follows (EncodeTask).
  struct Task {
    const uint8_t* src = nullptr;  // null: hash in place (a tensor living in the arena)
    uint64_t arena_offset = 0;     // slot tensors: from the slot start; others: from the base
    bool in_slot = false;
    uint64_t bytes = 0;
    uint32_t digest = 0;
    // Delta room (registered tensors only: an Allocate()d one has no previous version kept).
    uint64_t delta_at = 0;  // in the slot's delta area
    uint64_t delta_room = 0;
    uint32_t element_bytes = 1;
  };
  struct Job {
    HostStore* self;
    uint32_t slot;
    uint64_t* digests;   // null: copy only (PublishCopy: a relay's digests are the trainer's)
    uint32_t base_slot;  // EncodeTask: where the base version lies
  };
  void Run(uint32_t slot, uint64_t* digests, const DeltaBase* base);
  static void RunTask(void* context, uint32_t index);
  static void EncodeTask(void* context, uint32_t index);
  // Before a version is written into `slot`: waits for the encode still running, then sets the
  // slot's delta to its base (digests copied, so the caller's may change) or none (every
  // segment whole).
  void BeginDelta(uint32_t slot, const DeltaBase* base);
  // The encode of `slot` against `base_slot` on the workers, then its summary (FinishDelta).
  void Encode(uint32_t slot, uint32_t base_slot);
  void FinishDelta(uint32_t slot);
  // The encoder thread, and the waits on it.
  void EncodeLoop();
  void WaitEncoded();
  void StopEncoder();

  std::unique_ptr<HostArena> arena_;
  std::vector<Task> tasks_;
  std::vector<std::pair<uint32_t, uint32_t>> digest_copies_;
  std::unique_ptr<util::WorkerPool> workers_;
  uint32_t digest_count_ = 0;
  uint64_t copy_bytes_ = 0;
  uint32_t slots_ = 0;
  // Delta room: an area per slot (lazily committed pages), the slots' deltas, and the bytes of
  // changed elements per digest of the Publish running (summed after it).
  uint64_t delta_area_bytes_ = 0;
  std::vector<DeltaArea> delta_areas_;
  std::vector<SlotDelta> deltas_;
  std::vector<uint64_t> changed_bytes_;
  std::vector<delta::SegmentEncoder> encoders_;  // one per pool thread (WorkerPool::Slot)
  // The encode off the trainer's path: the slot whose delta is not encoded yet (-1: none), the
  // one handed to the encoder thread and not taken yet, and where its base lies.
  std::thread encoder_;  // not joinable: no thread could be started, Publish encodes in line
  mutable util::Mutex encode_mu_;
  util::CondVar encode_cv_;
  int64_t pending_slot_ WS_GUARDED_BY(encode_mu_) = -1;
  int64_t queued_slot_ WS_GUARDED_BY(encode_mu_) = -1;
  uint32_t queued_base_ WS_GUARDED_BY(encode_mu_) = 0;
  bool encode_stop_ WS_GUARDED_BY(encode_mu_) = false;
};

void HostStore::RunTask(void* context, uint32_t index) {
  auto* job = static_cast<Job*>(context);
  const Task& t = job->self->tasks_[index];
  HostArena& arena = *job->self->arena_;
  uint8_t* dst = t.in_slot ? arena.slot(job->slot) + t.arena_offset : arena.base() + t.arena_offset;
  if (job->digests == nullptr) {
    if (t.src != nullptr) std::memcpy(dst, t.src, t.bytes);
    // Tests: a relay that corrupts what it serves (its children's verify must refuse it).
    if (util::FailPoints::Check("relay.corrupt_served").action == util::FailAction::kFlip) {
      dst[t.bytes / 2] ^= 0x01;
    }
  } else {
    const uint64_t digest =
        t.src != nullptr ? util::CopyAndHash64(dst, t.src, t.bytes) : util::Hash64(dst, t.bytes);
    if (util::FailPoints::Check("publisher.corrupt_after_digest").action ==
        util::FailAction::kFlip) {
      dst[t.bytes / 2] ^= 0x01;  // the digest now describes bytes the arena no longer holds
    }
    job->digests[t.digest] = digest;
  }
}

void HostStore::EncodeTask(void* context, uint32_t index) {
  const auto* job = static_cast<const Job*>(context);
  HostStore& self = *job->self;
  const Task& t = self.tasks_[index];
  if (t.delta_room == 0) return;
  // Tests: sleep:<ms> makes the encode outlast Publish (sessions and the next Publish wait).
  (void)util::FailPoints::Check("publisher.encode");
  // One encoder per pool thread, sized when the delta areas were made: a step allocates nothing.
  delta::SegmentEncoder& encoder = self.encoders_[util::WorkerPool::Slot()];
  const uint8_t* before = self.arena_->slot(job->base_slot) + t.arena_offset;
  const uint8_t* written = self.arena_->slot(job->slot) + t.arena_offset;
  SlotDelta& d = self.deltas_[job->slot];
  const auto encoded =
      encoder.Encode({before, t.bytes}, {written, t.bytes}, t.element_bytes,
                     {self.delta_areas_[job->slot].data() + t.delta_at, t.delta_room});
  d.bytes[t.digest] = encoded ? encoded->bytes : 0;
  self.changed_bytes_[t.digest] = encoded ? encoded->changed_elements * t.element_bytes : 0;
}

void HostStore::BeginDelta(uint32_t slot, const DeltaBase* base) {
  // Before anything writes the slot: the encode still running may read it (its base), and
  // uses the workers.
  WaitEncoded();
  if (deltas_.empty()) return;
  SlotDelta& d = deltas_[slot];
  d.base_step = base != nullptr ? base->step : -1;
  d.delta_segments = d.whole_segments = 0;
  d.delta_bytes = d.changed_bytes = 0;
  d.encode_seconds = 0;
  if (base == nullptr) {
    std::fill(d.bytes.begin(), d.bytes.end(), 0);
    return;
  }
  std::copy(base->digests.begin(), base->digests.end(), d.base_digests.begin());
}

void HostStore::Encode(uint32_t slot, uint32_t base_slot) {
  const auto start = std::chrono::steady_clock::now();
  Job job{this, slot, nullptr, base_slot};
  workers_->Run(static_cast<uint32_t>(tasks_.size()), &HostStore::EncodeTask, &job);
  FinishDelta(slot);
  deltas_[slot].encode_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// After the encode: what the slot's delta holds, for the sessions and PublishStats.
void HostStore::FinishDelta(uint32_t slot) {
  SlotDelta& d = deltas_[slot];
  for (const Task& t : tasks_) {
    if (t.delta_room == 0) {
      d.bytes[t.digest] = 0;  // an Allocate()d tensor's segment: always whole
      ++d.whole_segments;
      continue;
    }
    d.delta_bytes += d.bytes[t.digest];
    d.changed_bytes += changed_bytes_[t.digest];
    ++(d.bytes[t.digest] > 0 ? d.delta_segments : d.whole_segments);
  }
  // A tied tensor's segments are its original's, delta and all.
  for (auto [tied, original] : digest_copies_) {
    d.bytes[tied] = d.bytes[original];
    d.at[tied] = d.at[original];
  }
}

Status HostStore::Freeze(const StoreLayout& given, wire::Welcome* welcome) {
  WaitEncoded();  // a Freeze again replaces what an encode uses (none runs before a first Publish)
  StoreLayout layout = given;
  if (layout.segment_bytes == 0) layout.segment_bytes = kDefaultSegmentBytes;
  SegmentLayout segments = CutSegments(layout);
  std::vector<Task> tasks;
  uint64_t copy_bytes = 0;
  uint64_t delta_area_bytes = 0;
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
    task.element_bytes = delta::ElementBytes(t.placement.spec.dtype);
    if (task.in_slot && task.src != nullptr && layout.delta_room != DeltaRoom::kNone &&
        task.bytes % task.element_bytes == 0) {
      task.delta_at = delta_area_bytes;
      task.delta_room = layout.delta_room == DeltaRoom::kQuarter
                            ? task.bytes / delta::kAutoRoomDivisor
                            : delta::MaxDeltaBytes(task.bytes, task.element_bytes);
      delta_area_bytes += (task.delta_room + 63) / 64 * 64;
    }
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
  // Delta areas, one per slot: mapped before anything changes, so a failure leaves the store as
  // it was.
  std::vector<DeltaArea> areas;
  for (uint32_t k = 0; delta_area_bytes > 0 && k < layout.slots; ++k) {
    Result<DeltaArea> area = DeltaArea::Map(delta_area_bytes);
    if (!area.ok()) return area.status().WithContext("delta area of slot " + std::to_string(k));
    areas.push_back(std::move(*area));
  }
  const int threads = layout.copy_threads > 0 ? layout.copy_threads : util::HashThreads();
  workers_ = std::make_unique<util::WorkerPool>(threads);
  tasks_ = std::move(tasks);
  digest_copies_ = std::move(segments.copies);
  digest_count_ = segments.digest_count;
  copy_bytes_ = copy_bytes;
  slots_ = layout.slots;
  delta_area_bytes_ = delta_area_bytes;
  delta_areas_.clear();
  for (DeltaArea& area : areas) delta_areas_.push_back(std::move(area));
  deltas_.clear();
  if (delta_area_bytes > 0) {
    for (uint32_t k = 0; k < layout.slots; ++k) {
      SlotDelta d;
      d.base_digests.assign(digest_count_, 0);
      d.bytes.assign(digest_count_, 0);
      d.at.assign(digest_count_, 0);
      for (const Task& t : tasks_) d.at[t.digest] = t.delta_at;
      d.area = delta_areas_[k].data();
      deltas_.push_back(std::move(d));
    }
    changed_bytes_.assign(digest_count_, 0);
    uint64_t largest_room = 0;
    for (const Task& t : tasks_) largest_room = std::max(largest_room, t.delta_room);
    encoders_.assign(static_cast<size_t>(workers_->size()), delta::SegmentEncoder());
    for (delta::SegmentEncoder& encoder : encoders_) encoder.Reserve(largest_room);
    // Without its thread the store still works: Publish then encodes before it returns.
    if (!encoder_.joinable()) {
      if (Status s = util::StartThread(&encoder_, "delta encoder", [this] { EncodeLoop(); });
          !s.ok()) {
        WS_LOG(WARN, "publisher") << s << "; deltas are encoded inside Publish";
      } else {
        util::LedgerAdd(util::LedgerItem::kThreads, 1);
      }
    }
  }
  return Status::Ok();
}

void HostStore::Run(uint32_t slot, uint64_t* digests, const DeltaBase* base) {
  // A base in the slot being written is no base (a store of one slot).
  if (base != nullptr && base->slot == slot) base = nullptr;
  BeginDelta(slot, base);
  Job job{this, slot, digests, 0};
  workers_->Run(static_cast<uint32_t>(tasks_.size()), &HostStore::RunTask, &job);
  if (deltas_.empty() || base == nullptr) return;
  if (!encoder_.joinable()) return Encode(slot, base->slot);
  {
    util::MutexLock lock(&encode_mu_);
    pending_slot_ = queued_slot_ = slot;
    queued_base_ = base->slot;
  }
  encode_cv_.NotifyAll();
}

void HostStore::EncodeLoop() {
  for (;;) {
    uint32_t slot = 0, base_slot = 0;
    {
      util::MutexLock lock(&encode_mu_);
      while (queued_slot_ < 0 && !encode_stop_) encode_cv_.Wait(&encode_mu_);
      if (queued_slot_ < 0) return;  // stopping, nothing left to encode
      slot = static_cast<uint32_t>(std::exchange(queued_slot_, -1));
      base_slot = queued_base_;
    }
    Encode(slot, base_slot);
    {
      util::MutexLock lock(&encode_mu_);
      pending_slot_ = -1;
    }
    encode_cv_.NotifyAll();
  }
}

// Unbounded: the encode is CPU work over memory the store owns, with nothing to wait for.
void HostStore::WaitEncoded() {
  util::MutexLock lock(&encode_mu_);
  while (pending_slot_ >= 0) encode_cv_.Wait(&encode_mu_);
}

void HostStore::StopEncoder() {
  {
    util::MutexLock lock(&encode_mu_);
    encode_stop_ = true;
  }
  encode_cv_.NotifyAll();
  if (!encoder_.joinable()) return;
  encoder_.join();  // after the encode it was handed, if any
  util::LedgerAdd(util::LedgerItem::kThreads, -1);
}

Result<const SlotDelta*> HostStore::AwaitDelta(uint32_t slot, const util::Deadline& deadline) {
  if (slot >= deltas_.size()) return nullptr;
  util::MutexLock lock(&encode_mu_);
  while (pending_slot_ == static_cast<int64_t>(slot)) {
    if (deadline.cancelled()) return Status::Cancelled("waiting for a version's deltas");
    if (deadline.expired()) {
      return Status::Timeout("the delta against step ", deltas_[slot].base_step,
                             " is still being encoded");
    }
    encode_cv_.WaitFor(&encode_mu_, std::chrono::milliseconds(deadline.SliceMs()));
  }
  return &deltas_[slot];
}

Status HostStore::Publish(uint32_t slot, std::span<uint64_t> digests, const DeltaBase* base,
                          void* /*cuda_stream*/, const util::Deadline& /*deadline*/) {
  Run(slot, digests.data(), base);
  for (auto [tied, original] : digest_copies_) digests[tied] = digests[original];
  return Status::Ok();
}

Status HostStore::PublishCopy(uint32_t slot, const DeltaBase* base,
                              const util::Deadline& /*deadline*/) {
  Run(slot, nullptr, base);
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<VersionStore>> NewHostStore(const std::string& name) {
  WS_ASSIGN_OR_RETURN(std::unique_ptr<HostArena> arena, HostArena::Create(name, kReserveBytes));
  return std::unique_ptr<VersionStore>(new HostStore(std::move(arena)));
}

}  // namespace weightsync::transport::store
