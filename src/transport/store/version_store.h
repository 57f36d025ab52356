// VersionStore: where a publisher keeps its versions, and how one is written. A version is a slot
// of the store holding a copy of every registered tensor (tensors allocated in the store itself
// are shared by all slots), or — for the zero-copy and ring stores — the registered tensors
// themselves; plus one digest per segment of every tensor. Five stores, chosen by the store table
// (store_table.h): the host memfd arena (host_store.cc), the GPU cuMem arena (gpu_store.cc), the
// zero-copy store (gpu_zero_copy_store.cc) and the host and GPU rings (host_ring_store.cc,
// gpu_ring_store.cc). Subscribers on this host map the store from the fd passed with the Welcome
// (their view of it: transport/view/store_view.h); tcp sends from it.
//
// Prepared once (Freeze, at the first Publish): the slots, the copies and the digest work of every
// segment. Publish(slot) only runs them: it allocates nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "util/deadline.h"
#include "util/unique_fd.h"
#include "weightsync/status.h"
#include "wire/messages.h"

namespace weightsync::transport::store {

// Delta updates (docs/deltas.md): the room each slot keeps for the deltas of its version against
// the version published before it.
enum class DeltaRoom : uint8_t {
  kNone,     // no deltas
  kQuarter,  // a segment's delta up to a quarter of the segment; a larger one goes whole
  kWhole,    // every segment as a delta whatever its size (the segment and its directory)
};

// The version a Publish diffs against: the latest one, whole in its slot while Publish runs.
struct DeltaBase {
  uint32_t slot = 0;
  int64_t step = -1;
  std::span<const uint64_t> digests;  // its digests, digest_count of them
};

// The delta of the version in one slot against the version before it: written by Publish while
// the slot is taken for writing and by the encode that runs on after it, read by tcp sessions
// while it is pinned, once the encode finished (VersionStore::AwaitDelta). Sized at Freeze: a
// Publish allocates nothing.
struct SlotDelta {
  int64_t base_step = -1;              // -1: no delta (the first version, or a base not kept)
  std::vector<uint64_t> base_digests;  // the base's digests, every one
  std::vector<uint64_t> bytes;         // per digest: its delta's bytes; 0: the segment goes whole
  std::vector<uint64_t> at;            // per digest: where its delta lies in `area`
  const uint8_t* area = nullptr;
  // What encoding it measured (PublishStats): segments encoded and left whole, delta bytes, and
  // the bytes of the elements that changed in the encoded ones.
  uint32_t delta_segments = 0, whole_segments = 0;
  uint64_t delta_bytes = 0, changed_bytes = 0;
  double encode_seconds = 0;
};

// One published tensor as the store writes it.
struct PublishedTensor {
  wire::TensorPlacement placement;  // name, dtype, shape; region and offset in the store
  const uint8_t* source = nullptr;  // caller memory copied at each Publish; null: in the store
  // ≥ 0: the same bytes as tensor `alias_of` (tied weights, registered under two names): not
  // copied again; its digests are that tensor's.
  int64_t alias_of = -1;
};

struct StoreLayout {
  std::vector<PublishedTensor> tensors;  // manifest order
  uint64_t slot_bytes = 0;               // bytes of slot-resident tensors, 64-byte aligned
  uint32_t slots = 2;
  uint64_t segment_bytes = 0;  // > 0
  int copy_threads = 0;        // host store: copy + hash workers (0: default)
  // Ring stores: slots (buckets held at once, ≥ 2) and bytes per bucket (0:
  // DefaultRingBucketBytes).
  uint32_t ring_slots = 0;
  uint64_t ring_bucket_bytes = 0;
  // GPU ring: how long a fill may take (the publisher's timeout); past it the GPU is taken to be
  // wedged and the readers waiting on the fill are failed.
  std::chrono::milliseconds fill_wait{60000};
  // Delta room per slot (host arena stores; the others keep none).
  DeltaRoom delta_room = DeltaRoom::kNone;
  // Whether subscribers may map the store (a local:// publisher). Over tcp the session sends a
  // ring or zero-copy publisher's version straight from the registered tensors (socket writes for
  // host tensors, NCCL for CUDA ones), so the rings allocate no buckets there (the Welcome still
  // carries the ring's geometry, which cuts the version) and zero-copy exports nothing.
  bool local_readers = true;
};

// A ring's bucket when none is asked for: a quarter of `free_bytes` spread over the ring's
// `slots`, within [64 MiB, 1 GiB] (1 GiB buckets already run at the copy limit; smaller ones
// leave memory to a colocated engine), and never more than the version (`version_bytes`, rounded
// up to 64).
uint64_t DefaultRingBucketBytes(uint64_t free_bytes, uint32_t slots, uint64_t version_bytes);

// A ring store's buckets for `layout` (shared by the host and GPU rings): the ring checked (≥ 2
// slots, registered tensors only), the bucket sized (ring_bucket_bytes, else
// DefaultRingBucketBytes of `free_bytes()`, asked only then), in whole 4 KiB pages and never more
// than the version, and the version's bucket count (≤ wire::kMaxVersionBuckets).
struct RingGeometry {
  uint64_t bucket_bytes = 0;
  uint32_t buckets = 0;
};
Result<RingGeometry> PlanRing(const StoreLayout& layout,
                              const std::function<Result<uint64_t>()>& free_bytes);

// The digest ranges of a layout, shared by the stores: each tensor cut into segments of at most
// segment_bytes, digests numbered in manifest order; a tied tensor's digests are copied from its
// original's instead of being computed.
struct Segment {
  uint32_t tensor = 0;  // index into StoreLayout::tensors
  uint64_t offset = 0;  // within the tensor
  uint64_t bytes = 0;
  uint32_t digest = 0;  // index into the version's digests
};
struct SegmentLayout {
  std::vector<Segment> segments;                      // of tensors that are hashed
  std::vector<std::pair<uint32_t, uint32_t>> copies;  // (tied digest, original digest)
  uint32_t digest_count = 0;
};
SegmentLayout CutSegments(const StoreLayout& layout);

class VersionStore {
 public:
  virtual ~VersionStore() = default;
  // A tensor that lives in the store itself (host store only): `bytes` zero-filled bytes at the
  // returned offset from direct_base(), shared by every version.
  virtual Result<uint64_t> AllocateDirect(uint64_t bytes);
  virtual uint8_t* direct_base() const { return nullptr; }
  // Fixes the layout and prepares every Publish; fills the Welcome's store fields (kind, sizes,
  // device, digest kind, segment size, tensors). A failed Freeze keeps nothing it built and may
  // be called again.
  virtual Status Freeze(const StoreLayout& layout, wire::Welcome* welcome) = 0;
  // Writes version `slot`: every registered tensor copied in, `digests` (digest_count of them)
  // computed; with delta room and a `base` (another slot, the latest version), each registered
  // tensor's segments encoded against it too (delta(slot)), by an encode that may run on after
  // Publish returns; the `base` slot is left as it is until that encode finished. `cuda_stream`
  // (GPU store): the copies start after the work queued on it.
  virtual Status Publish(uint32_t slot, std::span<uint64_t> digests, const DeltaBase* base,
                         void* cuda_stream, const util::Deadline& deadline) = 0;
  // Relays (docs/relays.md): writes version `slot` as Publish does but copies without hashing —
  // its digests are the trainer's, which the caller sets, so a relay never re-hashes and its
  // children verify exactly what the trainer published. Deltas are encoded as in Publish. The host
  // arena and the GPU arena have it (a GPU copy ends within `deadline`).
  virtual Status PublishCopy(uint32_t /*slot*/, const DeltaBase* /*base*/,
                             const util::Deadline& /*deadline*/) {
    return Status::NotSupported(Describe(),
                                ": cannot hold a relayed version (host and GPU arenas only)");
  }
  // Cut-through relays (docs/relays.md): version `slot` is written from outside, its bytes copied
  // into the slot as they arrive, with no delta against the version before it (what the slot's
  // delta said of its previous version is dropped, so no session ever sends it). Returns where
  // the slot begins in this process; tensor i lies at the Welcome's tensors[i].offset from it.
  // Only the host store has it.
  virtual Result<uint8_t*> WriteFromOutside(uint32_t /*slot*/) {
    return Status::NotSupported(Describe(),
                                ": cannot take a version written from outside (the host arena "
                                "only)");
  }
  // The delta of version `slot` against the one before it; null for a store without delta room.
  // Its base is set when Publish returns; what it holds (bytes, counts) only once its encode,
  // which runs on after Publish, finished: DeltaPending says whether it still runs, AwaitDelta
  // waits for it (Timeout past `deadline`).
  virtual const SlotDelta* delta(uint32_t /*slot*/) const { return nullptr; }
  virtual bool DeltaPending(uint32_t /*slot*/) const { return false; }
  virtual Result<const SlotDelta*> AwaitDelta(uint32_t slot, const util::Deadline& /*deadline*/) {
    return delta(slot);
  }
  virtual int fd() const = 0;  // what subscribers on this host map
  // Zero-copy store of cuMem memory: a fresh fd for chunk `index` of the Welcome's kPosixFdChunks
  // allocations (counted in Welcome order), for one subscriber; sent and closed before the next
  // is exported, so a session holds one at a time. Others have no chunks.
  virtual Result<util::UniqueFd> ExportAllocationFd(uint32_t index) const {
    return Status::FailedPrecondition("allocation fd ", index, ": this store has no cuMem chunks");
  }
  // Ring stores (NewHostRingStore, NewGpuRingStore): a version's bucket count
  // (Welcome::version_buckets), and the copy of bucket `bucket` of the registered tensors into ring
  // slot `slot`, finished when it returns. Publish only hashes the tensors where they are. Others
  // have no ring.
  virtual uint32_t version_buckets() const { return 0; }
  // Bytes one pass through the ring copies into its buckets: every tensor's bytes once (a tied
  // tensor's are its original's, filled once). 0 for other stores and a ring without buckets (tcp).
  virtual uint64_t fill_bytes() const { return 0; }
  virtual Status FillBucket(uint32_t bucket, uint32_t slot) {
    return Status::FailedPrecondition("bucket ", bucket, ": this store is not a ring");
  }
  virtual const uint8_t* base() const = 0;    // host store: offset 0 here (tcp sends from it)
  virtual uint32_t digest_count() const = 0;  // per version, after Freeze
  virtual uint64_t copy_bytes() const = 0;    // bytes one Publish copies
  // Bytes of memory the store holds for versions, after Freeze (PublishStats::store_bytes): every
  // slot of an arena, or a ring's buckets, as allocated (whole pages on the host, the cuMem
  // granularity on a GPU). Not the tensors themselves (Allocate()d tensors, a zero-copy store's
  // registered ones: 0 there) nor digest words. 0 before Freeze.
  virtual uint64_t held_bytes() const = 0;
  // "2 slots of 4096 bytes in host memory, 44 segments, 2 threads": for the publisher's log.
  virtual std::string Describe() const = 0;
  virtual Status Close() = 0;
};

// The host store: a memfd arena reserving address space now (AllocateDirect works before Freeze).
Result<std::unique_ptr<VersionStore>> NewHostStore(const std::string& name);
// The host ring store (host_ring_store.cc): StoreLayout::ring_slots buckets in a memfd; the
// registered host tensors stream through them bucket by bucket as subscribers read
// (BucketRing), so the store holds ring_slots × bucket bytes instead of slots × the model.
Result<std::unique_ptr<VersionStore>> NewHostRingStore(const std::string& name);
// The GPU ring store on `device` (gpu_ring_store.cc): StoreLayout::ring_slots buckets in one cuMem
// allocation, the registered CUDA tensors streamed through them as for the host ring.
Result<std::unique_ptr<VersionStore>> NewGpuRingStore(int device);
// The GPU store on `device`: a cuMem arena allocated at Freeze.
Result<std::unique_ptr<VersionStore>> NewGpuStore(int device);
// The zero-copy GPU store on `device` (gpu_zero_copy_store.cc): the registered tensors themselves,
// exported by CUDA IPC handle (cudaMalloc memory) or POSIX fds (cuMem memory); nothing copied.
Result<std::unique_ptr<VersionStore>> NewZeroCopyGpuStore(int device);

}  // namespace weightsync::transport::store
