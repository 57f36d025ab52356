// The GPU ring store (PublisherOptions::ring_buckets with CUDA tensors): ring_slots buckets in one
// cuMem allocation on the tensors' device, exported once as a POSIX fd that cuda-ipc subscribers
// import, instead of slots × the model. As on the host (host_ring_store.cc), a version is the
// registered tensors themselves: Publish hashes them where they are and copies nothing; bucket b
// is copied into slot b % ring_slots when the subscribers reading the version need it
// (FillBucket, driven by BucketRing), so the trainer must not write the tensors until they are
// done — the publisher's BeginWrite fence. Over tcp (StoreLayout::local_readers false) no bucket
// is allocated: the sessions' NCCL broadcasts read the tensors; the Welcome keeps the geometry.
//
// Prepared at Freeze: per bucket, the copy-engine batch of its pieces (the registered tensors cut
// at the bucket's edges) and the copy-group launch of its small ones. A fill only submits them.
#include <algorithm>
#include <chrono>
#include <memory>

#include "cuda/device.h"
#include "cuda/kernels.h"
#include "cuda/vmm.h"
#include "plan/ring_cut.h"
#include "transport/store/gpu_tensor_digests.h"
#include "transport/store/version_store.h"
#include "util/logging.h"
#include "util/mutex.h"

namespace weightsync::transport::store {
namespace {

constexpr uint64_t kDefaultSegmentBytes = 64ull << 20;  // as the GPU arena
// Every bucket has its own prepared batch and copy-group job table (device memory), made at the
// first publish and by each subscriber's prepare: a version of more buckets than this would spend
// seconds on them. 4096 buckets are 3.7 MiB buckets for a 15 GB model (the default is 1 GiB).
constexpr uint64_t kMaxGpuRingBuckets = 4096;

class GpuRingStore final : public VersionStore {
 public:
  explicit GpuRingStore(int device) : device_(device) {}
  ~GpuRingStore() override {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "publisher") << "release: GPU ring: " << s;
  }

  Status Freeze(const StoreLayout& layout, wire::Welcome* welcome) override;
  Status Publish(uint32_t /*slot*/, std::span<uint64_t> digests, const DeltaBase* /*base*/,
                 void* cuda_stream, const util::Deadline& deadline) override {
    util::MutexLock lock(&mu_);
    if (!frozen_) return Status::FailedPrecondition("GPU ring store is closed");
    cuda::ScopedDevice restore;
    WS_RETURN_IF_ERROR(cuda::SetDevice(device_));
    return digests_.Run(queue_, digests, cuda_stream, deadline);
  }
  uint32_t version_buckets() const override {
    util::MutexLock lock(&mu_);
    return version_buckets_;
  }
  uint64_t fill_bytes() const override {
    util::MutexLock lock(&mu_);
    return fill_bytes_;
  }
  Status FillBucket(uint32_t bucket, uint32_t slot) override;
  int fd() const override {
    util::MutexLock lock(&mu_);
    return fd_.get();
  }
  const uint8_t* base() const override { return nullptr; }
  uint32_t digest_count() const override {
    util::MutexLock lock(&mu_);
    return digests_.count();
  }
  uint64_t copy_bytes() const override { return 0; }
  uint64_t held_bytes() const override {  // the ring's cuMem allocation
    util::MutexLock lock(&mu_);
    return ring_.size();
  }
  std::string Describe() const override {
    util::MutexLock lock(&mu_);
    return "a ring of " + std::to_string(ring_slots_) + " buckets of " +
           std::to_string(bucket_bytes_) + " bytes on cuda:" + std::to_string(device_) + " (" +
           std::to_string(version_buckets_) + " buckets a version" +
           (ring_.data() == nullptr ? "; none allocated: over tcp NCCL sends from the tensors"
                                    : "") +
           "), " + std::to_string(digests_.segments()) + " segments hashed in place";
  }
  Status Close() override {
    util::MutexLock lock(&mu_);
    cuda::ScopedDevice restore;  // the drain makes the ring's device current
    Status result;
    result.Update(queue_.Drain());  // fills and digests read the tensors and write the ring
    fills_.clear();
    result.Update(digests_.Close());
    result.Update(queue_.Close());
    result.Update(fd_.Close());
    result.Update(ring_.Close());
    frozen_ = false;
    bucket_bytes_ = 0;
    fill_bytes_ = 0;
    version_buckets_ = 0;
    ring_slots_ = 0;
    return result;
  }

 private:
  struct Fill {  // one bucket's copies into its slot
    cuda::CopyBatch copies;
    cuda::PreparedCopyGroup small;
  };

  const int device_;
  // Publish and a fill may overlap (a fill for a read BeginWrite revoked); both use the queue
  // (and its one event), so one runs at a time. A fill waits at most fill_wait_ under it.
  mutable util::Mutex mu_;
  cuda::ExportedAllocation ring_ WS_GUARDED_BY(mu_);
  util::UniqueFd fd_ WS_GUARDED_BY(mu_);
  cuda::CopyQueue queue_ WS_GUARDED_BY(mu_);
  GpuTensorDigests digests_ WS_GUARDED_BY(mu_);
  std::vector<Fill> fills_ WS_GUARDED_BY(mu_);  // by bucket
  uint64_t bucket_bytes_ WS_GUARDED_BY(mu_) = 0;
  uint64_t fill_bytes_ WS_GUARDED_BY(mu_) = 0;
  uint32_t version_buckets_ WS_GUARDED_BY(mu_) = 0;
  uint32_t ring_slots_ WS_GUARDED_BY(mu_) = 0;
  bool frozen_ WS_GUARDED_BY(mu_) = false;  // the ring (if any), queue and digests exist
  std::chrono::milliseconds fill_wait_ WS_GUARDED_BY(mu_){0};
};

Status GpuRingStore::Freeze(const StoreLayout& given, wire::Welcome* welcome) {
  StoreLayout layout = given;
  if (layout.segment_bytes == 0) layout.segment_bytes = kDefaultSegmentBytes;
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "publisher") << "release: GPU ring: " << s;
  cuda::ScopedDevice restore;  // everything is made on the tensors' device
  WS_RETURN_IF_ERROR(cuda::SetDevice(device_));
  WS_ASSIGN_OR_RETURN(const RingGeometry geometry, PlanRing(layout, []() -> Result<uint64_t> {
                        size_t free_bytes = 0, total_bytes = 0;
                        WS_RETURN_IF_ERROR(cuda::MemInfo(&free_bytes, &total_bytes));
                        return uint64_t{free_bytes};
                      }));
  const uint64_t bucket = geometry.bucket_bytes;
  const uint32_t buckets = geometry.buckets;
  // The bound is for the per-bucket batches prepared below; over tcp there are none (PlanRing
  // keeps the wire's bound).
  if (layout.local_readers && buckets > kMaxGpuRingBuckets) {
    return Status::InvalidArgument("a GPU ring version of ", layout.slot_bytes,
                                   " bytes in buckets of ", bucket, " bytes needs ", buckets,
                                   " buckets, more than ", kMaxGpuRingBuckets,
                                   ": use larger buckets (PublisherOptions.ring_bucket_bytes)");
  }
  // Over tcp no bucket: the sessions' NCCL broadcasts read the tensors themselves.
  cuda::ExportedAllocation ring;
  util::UniqueFd fd;
  if (layout.local_readers) {
    WS_ASSIGN_OR_RETURN(ring,
                        cuda::ExportedAllocation::Create(device_, bucket * layout.ring_slots));
    WS_ASSIGN_OR_RETURN(fd, ring.ExportFd());
  }
  WS_ASSIGN_OR_RETURN(cuda::CopyQueue queue, cuda::CopyQueue::Create(device_));
  WS_ASSIGN_OR_RETURN(GpuTensorDigests digests,
                      GpuTensorDigests::Prepare(layout, CutSegments(layout), queue));
  // Every bucket's copies, into its slot b % ring_slots. A registered tensor is its own
  // allocation's (span: its index), so rows fold only within one.
  std::vector<Fill> fills(layout.local_readers ? buckets : 0);
  std::vector<plan::RingPiece> cut;
  uint64_t fill_bytes = 0;
  for (size_t i = 0; layout.local_readers && i < layout.tensors.size(); ++i) {
    const PublishedTensor& t = layout.tensors[i];
    if (t.alias_of >= 0) continue;  // a tied tensor's bytes are its original's
    cut.clear();
    plan::CutAtBuckets(t.placement.offset, t.placement.spec.nbytes, bucket, UINT64_MAX, &cut);
    for (const plan::RingPiece& p : cut) {
      uint8_t* slot = ring.data() + (p.bucket % layout.ring_slots) * bucket;
      fills[p.bucket].copies.Add(slot + p.bucket_offset, t.source + p.at, p.bytes, i);
      fill_bytes += p.bytes;
    }
  }
  Status unsplit;  // logged once: every bucket's small copies stay with the copy engines then
  for (Fill& f : fills) {
    Result<cuda::PreparedCopyGroup> small = cuda::SplitOffSmallCopies(f.copies, queue.stream());
    if (small.ok()) {
      f.small = std::move(*small);
    } else if (unsplit.ok()) {
      unsplit = small.status();
    }
  }
  if (!unsplit.ok()) {
    WS_LOG(INFO, "publisher") << "ring fills stay with the copy engines: " << unsplit;
  }
  welcome->arena_kind = wire::ArenaKind::kCudaRing;
  welcome->device = device_;
  welcome->digest_kind = wire::DigestKind::kGpu64;
  welcome->segment_bytes = layout.segment_bytes;
  welcome->slot_count = layout.ring_slots;
  // Without buckets the geometry alone (as the host ring over tcp).
  welcome->arena_bytes = layout.local_readers ? ring.size() : bucket * layout.ring_slots;
  welcome->direct_offset = 0;
  welcome->direct_bytes = 0;
  welcome->slots_offset = 0;
  welcome->slot_bytes = bucket;
  welcome->version_buckets = buckets;
  welcome->tensors.clear();
  for (const PublishedTensor& t : layout.tensors) welcome->tensors.push_back(t.placement);
  util::MutexLock lock(&mu_);
  fill_wait_ = layout.fill_wait;
  ring_ = std::move(ring);
  fd_ = std::move(fd);
  queue_ = std::move(queue);
  digests_ = std::move(digests);
  fills_ = std::move(fills);
  bucket_bytes_ = bucket;
  fill_bytes_ = fill_bytes;
  version_buckets_ = buckets;
  ring_slots_ = layout.ring_slots;
  frozen_ = true;
  return Status::Ok();
}

Status GpuRingStore::FillBucket(uint32_t bucket, uint32_t slot) {
  util::MutexLock lock(&mu_);
  // Closed, or never allocated (served over tcp, where no session asks for a fill).
  if (ring_.data() == nullptr) {
    return Status::FailedPrecondition("GPU ring store has no buckets (closed, or served over tcp)");
  }
  if (bucket >= version_buckets_ || slot != bucket % ring_slots_) {
    return Status::InvalidArgument("bucket ", bucket, " into slot ", slot, ": the ring has ",
                                   version_buckets_, " buckets a version, bucket b in slot b % ",
                                   ring_slots_);
  }
  cuda::ScopedDevice restore;  // sessions' threads fill
  WS_RETURN_IF_ERROR(cuda::SetDevice(device_));
  Fill& f = fills_[bucket];
  WS_RETURN_IF_ERROR(queue_.EnqueueBatch(f.copies, &f.small));
  Status waited = queue_.Wait(util::Deadline(fill_wait_));
  if (!waited.ok()) return waited.WithContext("filling ring bucket " + std::to_string(bucket));
  return waited;  // a step allocates nothing: the context is built only for an error
}

}  // namespace

Result<std::unique_ptr<VersionStore>> NewGpuRingStore(int device) {
  return std::unique_ptr<VersionStore>(new GpuRingStore(device));
}

}  // namespace weightsync::transport::store
