// The GPU ring store (PublisherOptions::ring_buckets with CUDA tensors): ring_slots buckets in one
// cuMem allocation on the tensors' device, exported once as a POSIX fd that cuda-ipc subscribers
// import, instead of slots × the model. As on the host (host_ring_store.cc), a version is the
// registered tensors themselves: Publish hashes them where they are and copies nothing; bucket b
// is copied into slot b % ring_slots when the subscribers reading the version need it
// (FillBucket, driven by BucketRing), so the trainer must not write the tensors until they are
// done — the publisher's BeginWrite fence.
//
// Prepared at Freeze: per bucket, the copy-engine batch of its pieces (the registered tensors cut
// at the bucket's edges) and the copy-group launch of its small ones. A fill only submits them.
#include <algorithm>
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
// A fill is at most a bucket (≤ 1 GiB by default: under 10 ms on the copy engines); one still
// running after this long means the GPU is wedged, and the readers waiting on it are failed.
constexpr auto kFillWait = std::chrono::seconds(60);

class GpuRingStore final : public VersionStore {
 public:
  explicit GpuRingStore(int device) : device_(device) {}
  ~GpuRingStore() override {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "publisher") << "release: GPU ring: " << s;
  }

  Status Freeze(const StoreLayout& layout, wire::Welcome* welcome) override;
  Status Publish(uint32_t /*slot*/, std::span<uint64_t> digests, void* cuda_stream,
                 const util::Deadline& deadline) override {
    util::MutexLock lock(&mu_);
    if (ring_.data() == nullptr) return Status::FailedPrecondition("GPU ring store is closed");
    cuda::ScopedDevice restore;
    WS_RETURN_IF_ERROR(cuda::SetDevice(device_));
    return digests_.Run(queue_, digests, cuda_stream, deadline);
  }
  uint32_t version_buckets() const override { return version_buckets_; }
  Status FillBucket(uint32_t bucket, uint32_t slot) override;
  int fd() const override { return fd_.get(); }
  const uint8_t* base() const override { return nullptr; }
  uint32_t digest_count() const override { return digests_.count(); }
  uint64_t copy_bytes() const override { return 0; }
  uint64_t held_bytes() const override { return ring_.size(); }  // the ring's cuMem allocation
  std::string Describe() const override {
    return "a ring of " + std::to_string(ring_slots_) + " buckets of " +
           std::to_string(bucket_bytes_) + " bytes on cuda:" + std::to_string(device_) + " (" +
           std::to_string(version_buckets_) + " buckets a version), " +
           std::to_string(digests_.segments()) + " segments hashed in place";
  }
  Status Close() override {
    util::MutexLock lock(&mu_);
    Status result;
    result.Update(queue_.Drain());  // fills and digests read the tensors and write the ring
    fills_.clear();
    result.Update(digests_.Close());
    result.Update(queue_.Close());
    result.Update(fd_.Close());
    result.Update(ring_.Close());
    return result;
  }

 private:
  struct Fill {  // one bucket's copies into its slot
    cuda::CopyBatch copies;
    cuda::PreparedCopyGroup small;
  };

  int device_;
  // Publish and a fill may overlap (a fill for a read BeginWrite revoked); both use the queue.
  util::Mutex mu_;
  cuda::ExportedAllocation ring_;
  util::UniqueFd fd_;
  cuda::CopyQueue queue_;
  GpuTensorDigests digests_;
  std::vector<Fill> fills_;  // by bucket
  uint64_t bucket_bytes_ = 0;
  uint32_t version_buckets_ = 0;
  uint32_t ring_slots_ = 0;
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
  WS_ASSIGN_OR_RETURN(cuda::ExportedAllocation ring,
                      cuda::ExportedAllocation::Create(device_, bucket * layout.ring_slots));
  WS_ASSIGN_OR_RETURN(util::UniqueFd fd, ring.ExportFd());
  WS_ASSIGN_OR_RETURN(cuda::CopyQueue queue, cuda::CopyQueue::Create(device_));
  WS_ASSIGN_OR_RETURN(GpuTensorDigests digests,
                      GpuTensorDigests::Prepare(layout, CutSegments(layout), queue));
  // Every bucket's copies, into its slot b % ring_slots. A registered tensor is its own
  // allocation's (span: its index), so rows fold only within one.
  std::vector<Fill> fills(buckets);
  std::vector<plan::RingPiece> cut;
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const PublishedTensor& t = layout.tensors[i];
    if (t.alias_of >= 0) continue;  // a tied tensor's bytes are its original's
    cut.clear();
    plan::CutAtBuckets(t.placement.offset, t.placement.spec.nbytes, bucket, UINT64_MAX, &cut);
    for (const plan::RingPiece& p : cut) {
      uint8_t* slot = ring.data() + (p.bucket % layout.ring_slots) * bucket;
      fills[p.bucket].copies.Add(slot + p.bucket_offset, t.source + p.at, p.bytes, i);
    }
  }
  for (Fill& f : fills) {
    Result<cuda::PreparedCopyGroup> small = cuda::SplitOffSmallCopies(f.copies, queue.stream());
    if (small.ok()) {
      f.small = std::move(*small);
    } else {
      WS_LOG(INFO, "publisher") << "ring fills stay with the copy engines: " << small.status();
    }
  }
  welcome->arena_kind = wire::ArenaKind::kCudaRing;
  welcome->device = device_;
  welcome->digest_kind = wire::DigestKind::kGpu64;
  welcome->segment_bytes = layout.segment_bytes;
  welcome->slot_count = layout.ring_slots;
  welcome->arena_bytes = ring.size();
  welcome->direct_offset = 0;
  welcome->direct_bytes = 0;
  welcome->slots_offset = 0;
  welcome->slot_bytes = bucket;
  welcome->version_buckets = static_cast<uint32_t>(buckets);
  welcome->tensors.clear();
  for (const PublishedTensor& t : layout.tensors) welcome->tensors.push_back(t.placement);
  util::MutexLock lock(&mu_);
  ring_ = std::move(ring);
  fd_ = std::move(fd);
  queue_ = std::move(queue);
  digests_ = std::move(digests);
  fills_ = std::move(fills);
  bucket_bytes_ = bucket;
  version_buckets_ = static_cast<uint32_t>(buckets);
  ring_slots_ = layout.ring_slots;
  return Status::Ok();
}

Status GpuRingStore::FillBucket(uint32_t bucket, uint32_t slot) {
  util::MutexLock lock(&mu_);
  if (ring_.data() == nullptr) return Status::FailedPrecondition("GPU ring store is closed");
  if (bucket >= version_buckets_ || slot != bucket % ring_slots_) {
    return Status::InvalidArgument("bucket ", bucket, " into slot ", slot, ": the ring has ",
                                   version_buckets_, " buckets a version, bucket b in slot b % ",
                                   ring_slots_);
  }
  cuda::ScopedDevice restore;  // sessions' threads fill
  WS_RETURN_IF_ERROR(cuda::SetDevice(device_));
  Fill& f = fills_[bucket];
  WS_RETURN_IF_ERROR(queue_.EnqueueBatch(f.copies));
  WS_RETURN_IF_ERROR(f.small.Launch());
  return queue_.Wait(util::Deadline(kFillWait))
      .WithContext("filling ring bucket " + std::to_string(bucket));
}

}  // namespace

Result<std::unique_ptr<VersionStore>> NewGpuRingStore(int device) {
  return std::unique_ptr<VersionStore>(new GpuRingStore(device));
}

}  // namespace weightsync::transport::store
