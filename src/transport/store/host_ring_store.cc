// The host ring store: a memfd of ring_slots buckets (host_arena.h, its slots being the buckets)
// instead of slots × the model. A version is the registered tensors themselves: Publish hashes
// them where they are (xxHash3 per segment, on the worker pool) and copies nothing; each bucket
// is copied into the ring only when the subscribers reading the version need it (FillBucket,
// driven by BucketRing), so the trainer must not write the tensors until they are done — the
// publisher's BeginWrite fence, as for zero-copy tensors.
//
// Prepared at Freeze: the pieces of every bucket (which bytes of which tensor land where in it),
// cut at the bucket's edges and into pieces small enough to share among the workers. A fill only
// runs them.
//
// Over tcp (StoreLayout::local_readers false) no bucket is allocated: the session sends the
// version from the tensors themselves and the socket bounds what is in flight. The Welcome keeps
// the ring's geometry (the cut of the version into buckets), with nothing mapped behind it.
#include <sys/sysinfo.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "plan/ring_cut.h"
#include "transport/store/host_arena.h"
#include "transport/store/version_store.h"
#include "util/hash.h"
#include "util/logging.h"
#include "util/mutex.h"
#include "util/worker_pool.h"

namespace weightsync::transport::store {
namespace {

constexpr uint64_t kDefaultSegmentBytes = 8ull << 20;
// Large enough that a memcpy runs at full speed, small enough that a 64 MiB bucket keeps 16
// workers busy.
constexpr uint64_t kPieceBytes = 4ull << 20;

uint64_t FreeHostBytes() {
  struct sysinfo info {};
  if (::sysinfo(&info) != 0) return 0;
  return uint64_t{info.freeram} * info.mem_unit;
}

class HostRingStore final : public VersionStore {
 public:
  explicit HostRingStore(std::string name) : name_(std::move(name)) {}
  ~HostRingStore() override { (void)Close(); }  // the arena logs its own failures

  Status Freeze(const StoreLayout& layout, wire::Welcome* welcome) override;
  Status Publish(uint32_t slot, std::span<uint64_t> digests, const DeltaBase* base,
                 void* cuda_stream, const util::Deadline& deadline) override;
  uint32_t version_buckets() const override { return version_buckets_; }
  uint64_t fill_bytes() const override { return fill_bytes_; }
  Status FillBucket(uint32_t bucket, uint32_t slot) override;
  int fd() const override { return arena_ ? arena_->fd() : -1; }
  const uint8_t* base() const override { return arena_ ? arena_->base() : nullptr; }
  uint32_t digest_count() const override { return digest_count_; }
  uint64_t copy_bytes() const override { return 0; }
  uint64_t held_bytes() const override { return arena_ ? arena_->arena_bytes() : 0; }  // the ring
  std::string Describe() const override {
    const std::string where =
        arena_ ? " bytes in host memory (" : " bytes, none allocated: tcp sends the tensors (";
    return "a ring of " + std::to_string(ring_slots_) + " buckets of " +
           std::to_string(bucket_bytes_) + where + std::to_string(version_buckets_) +
           " buckets a version), " + std::to_string(segments_.size()) +
           " segments hashed in place, " + std::to_string(workers_ ? workers_->size() : 0) +
           " threads";
  }
  Status Close() override {
    util::MutexLock lock(&work_mu_);
    workers_.reset();
    Status s = arena_ ? arena_->Close() : Status::Ok();
    arena_.reset();
    return s;
  }

 private:
  struct Piece {  // bytes of one tensor, copied to `offset` of the bucket
    const uint8_t* src = nullptr;
    uint64_t offset = 0;
    uint64_t bytes = 0;
  };
  struct HashTask {
    const uint8_t* src = nullptr;
    uint64_t bytes = 0;
    uint32_t digest = 0;
  };
  struct HashJob {
    const HostRingStore* self;
    uint64_t* digests;
  };
  struct FillJob {
    const Piece* pieces;  // the bucket's
    uint8_t* dst;
  };
  static void Hash(void* context, uint32_t index) {
    auto* job = static_cast<HashJob*>(context);
    const HashTask& t = job->self->segments_[index];
    job->digests[t.digest] = util::Hash64(t.src, t.bytes);
  }
  static void Copy(void* context, uint32_t index) {
    auto* job = static_cast<FillJob*>(context);
    const Piece& p = job->pieces[index];
    std::memcpy(job->dst + p.offset, p.src, p.bytes);
  }

  std::string name_;
  std::unique_ptr<HostArena> arena_;
  std::vector<HashTask> segments_;
  std::vector<std::pair<uint32_t, uint32_t>> digest_copies_;
  plan::ByBucket<Piece> pieces_;
  // Publish and a fill may overlap (a fill for a read BeginWrite revoked); one job at a time
  // runs on the pool.
  util::Mutex work_mu_;
  std::unique_ptr<util::WorkerPool> workers_;
  uint32_t digest_count_ = 0;
  uint32_t version_buckets_ = 0;
  uint32_t ring_slots_ = 0;
  uint64_t bucket_bytes_ = 0;
  uint64_t fill_bytes_ = 0;
};

Status HostRingStore::Freeze(const StoreLayout& given, wire::Welcome* welcome) {
  StoreLayout layout = given;
  if (layout.segment_bytes == 0) layout.segment_bytes = kDefaultSegmentBytes;
  WS_ASSIGN_OR_RETURN(const RingGeometry ring,
                      PlanRing(layout, [] { return Result<uint64_t>(FreeHostBytes()); }));
  const uint64_t bucket = ring.bucket_bytes;
  const uint32_t buckets = ring.buckets;
  // The pieces of every bucket, in bucket order (none without buckets).
  std::vector<std::vector<Piece>> by_bucket(layout.local_readers ? buckets : 0);
  std::vector<plan::RingPiece> cut;
  uint64_t fill_bytes = 0;
  const std::span<const PublishedTensor> filled =
      layout.local_readers ? std::span<const PublishedTensor>(layout.tensors)
                           : std::span<const PublishedTensor>();
  for (const PublishedTensor& t : filled) {
    if (t.alias_of >= 0) continue;  // a tied tensor's bytes are its original's
    cut.clear();
    plan::CutAtBuckets(t.placement.offset, t.placement.spec.nbytes, bucket, kPieceBytes, &cut);
    for (const plan::RingPiece& p : cut) {
      by_bucket[p.bucket].push_back({t.source + p.at, p.bucket_offset, p.bytes});
      fill_bytes += p.bytes;
    }
  }
  SegmentLayout segments = CutSegments(layout);
  std::vector<HashTask> tasks;
  tasks.reserve(segments.segments.size());
  for (const Segment& s : segments.segments) {
    tasks.push_back({layout.tensors[s.tensor].source + s.offset, s.bytes, s.digest});
  }
  // Its own memfd, sized for the ring alone (the address space it reserves is the ring's).
  std::unique_ptr<HostArena> arena;
  if (layout.local_readers) {
    WS_ASSIGN_OR_RETURN(arena,
                        HostArena::Create(name_ + "-ring", bucket * layout.ring_slots + (1 << 20)));
    WS_RETURN_IF_ERROR(arena->Freeze(bucket, layout.ring_slots));
    if (arena->slot_bytes() != bucket) {
      return Status::Internal("ring arena slots of ", arena->slot_bytes(), " bytes, buckets of ",
                              bucket);
    }
  }
  welcome->arena_kind = wire::ArenaKind::kHostRing;
  welcome->device = -1;
  welcome->digest_kind = wire::DigestKind::kXxh3;
  welcome->segment_bytes = layout.segment_bytes;
  welcome->slot_count = layout.ring_slots;
  // Without buckets the geometry alone: slots from offset 0, nothing behind them.
  welcome->arena_bytes = arena ? arena->arena_bytes() : bucket * layout.ring_slots;
  welcome->direct_offset = 0;
  welcome->direct_bytes = 0;
  welcome->slots_offset = arena ? arena->slots_offset() : 0;
  welcome->slot_bytes = bucket;
  welcome->version_buckets = static_cast<uint32_t>(buckets);
  welcome->tensors.clear();
  for (const PublishedTensor& t : layout.tensors) welcome->tensors.push_back(t.placement);
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "publisher") << "release: ring: " << s;
  util::MutexLock lock(&work_mu_);
  arena_ = std::move(arena);
  const int threads = layout.copy_threads > 0 ? layout.copy_threads : util::HashThreads();
  workers_ = std::make_unique<util::WorkerPool>(threads);
  segments_ = std::move(tasks);
  digest_copies_ = std::move(segments.copies);
  pieces_ = plan::ByBucket<Piece>::From(by_bucket);
  digest_count_ = segments.digest_count;
  version_buckets_ = static_cast<uint32_t>(buckets);
  ring_slots_ = layout.ring_slots;
  bucket_bytes_ = bucket;
  fill_bytes_ = fill_bytes;
  return Status::Ok();
}

Status HostRingStore::Publish(uint32_t /*slot*/, std::span<uint64_t> digests,
                              const DeltaBase* /*base*/, void* /*cuda_stream*/,
                              const util::Deadline& /*deadline*/) {
  util::MutexLock lock(&work_mu_);
  if (!workers_) return Status::FailedPrecondition("ring store is closed");
  HashJob job{this, digests.data()};
  workers_->Run(static_cast<uint32_t>(segments_.size()), &HostRingStore::Hash, &job);
  for (auto [tied, original] : digest_copies_) digests[tied] = digests[original];
  return Status::Ok();
}

Status HostRingStore::FillBucket(uint32_t bucket, uint32_t slot) {
  util::MutexLock lock(&work_mu_);
  if (!workers_) return Status::FailedPrecondition("ring store is closed");
  if (!arena_) {
    return Status::FailedPrecondition("bucket ", bucket,
                                      ": this ring publisher serves tcp, which sends the version "
                                      "from the tensors; it holds no buckets to fill");
  }
  if (bucket >= version_buckets_ || slot != bucket % ring_slots_) {
    return Status::InvalidArgument("bucket ", bucket, " into slot ", slot, ": the ring has ",
                                   version_buckets_, " buckets a version and ", ring_slots_,
                                   " slots, bucket b in slot b % ", ring_slots_);
  }
  FillJob job{pieces_.begin(bucket), arena_->slot(slot)};
  workers_->Run(pieces_.count(bucket), &HostRingStore::Copy, &job);
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<VersionStore>> NewHostRingStore(const std::string& name) {
  return std::unique_ptr<VersionStore>(new HostRingStore(name));
}

}  // namespace weightsync::transport::store
