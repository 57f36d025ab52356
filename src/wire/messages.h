// The control messages. Each has Encode (appends the payload to a reused buffer) and a strict,
// bounded Decode. Decoders validate everything they can without context (counts, lengths, dtypes,
// dims, overflow of shape products and byte sizes); the caller validates the rest against its
// own state (offsets against the mapped arena, steps against its committed step).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "weightsync/manifest.h"
#include "weightsync/status.h"

namespace weightsync::wire {

enum class Role : uint8_t { kSubscriber = 1 };

struct Hello {
  uint16_t protocol_version = 0;
  Role role = Role::kSubscriber;
  uint32_t pid = 0;
  // How long the subscriber waits for the publisher's layout (its first Publish): the publisher
  // waits that long, not for a timeout of its own (see UpdateRequest::wait_ms).
  uint64_t wait_ms = 0;
  // Topology (docs/relays.md). `serves`: the endpoint this subscriber serves its children on (a
  // relay, SubscriberOptions::serve_endpoint), where a publisher past its max_direct may send
  // newcomers; empty for a leaf. `avoid`: a relay endpoint this subscriber just lost a step
  // through (dead or stalled), which the publisher must not send it to again. Each is empty or
  // an endpoint text of ≤ kMaxEndpointBytes printable ASCII.
  std::string serves;
  std::string avoid;
  // Where the subscriber runs, as its user labels it (SubscriberOptions::locality: a host, a
  // rack): a publisher redirects it to a relay of the same locality first. Empty or ≤
  // kMaxLocalityBytes printable ASCII.
  std::string locality;
};
inline constexpr uint32_t kMaxEndpointBytes = 256;
inline constexpr uint32_t kMaxLocalityBytes = 64;
// The texts a peer names (Hello::serves/avoid/locality, Redirect) are printable ASCII without
// spaces (0x21..0x7E), safe to log and to dial: the index of the first byte outside, or -1.
inline int64_t FirstUnprintable(std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<uint8_t>(text[i]);
    if (c <= 0x20 || c > 0x7e) return static_cast<int64_t>(i);
  }
  return -1;
}
// The largest encoded Hello: the fixed fields, then three u16-length strings.
inline constexpr uint32_t kMaxHelloBytes =
    2 + 1 + 4 + 8 + 2 * (2 + kMaxEndpointBytes) + 2 + kMaxLocalityBytes;

// Publisher → subscriber, answering its Hello instead of a Welcome: this publisher serves as many
// subscribers directly as it may (PublisherOptions::max_direct); dial the relay at `endpoint`
// (with the same token) instead. The subscriber follows at most kMaxRedirects in a row.
struct Redirect {
  std::string endpoint;  // 1..kMaxEndpointBytes printable ASCII
};
inline constexpr uint32_t kMaxRedirectBytes = 2 + kMaxEndpointBytes;
inline constexpr int kMaxRedirects = 8;

// Where each published tensor lies in the arena.
enum class Region : uint8_t {
  kDirect = 0,  // arena-allocated tensor: offset from Welcome::direct_offset
  kSlot = 1,    // registered (copied) tensor: offset from the start of the version's slot
};

// A published tensor that is a region of a global tensor (a sharded trainer's piece): where its
// elements sit there. Its shape is the tensor's own (TensorPlacement::spec.shape).
struct ShardOf {
  std::string tensor;                 // the global tensor's name, 1..kMaxNameBytes
  std::vector<int64_t> global_shape;  // as many dims as the tensor; offset + shape ≤ global_shape
  std::vector<int64_t> offset;        // per dim, ≥ 0
  bool operator==(const ShardOf&) const = default;
};

struct TensorPlacement {
  TensorSpec spec;  // name, dtype, shape, nbytes (nbytes recomputed and checked by the decoder)
  Region region = Region::kSlot;
  uint64_t offset = 0;
  bool sharded = false;  // `shard` holds where it sits in its global tensor
  ShardOf shard;
};

// Where the arena lives, and so how a subscriber maps it.
enum class ArenaKind : uint8_t {
  kHostMemfd = 0,  // host memory: a sealed memfd (fd passed with the frame)
  kCudaMem = 1,    // GPU memory: a cuMem allocation exported as a POSIX fd (fd passed)
  kNone = 2,       // nothing to map (tcp: bytes arrive on the connection)
  // GPU memory: the publisher's own CUDA allocations (zero-copy), listed in
  // Welcome::allocations (no fd with the Welcome). The direct region is a virtual range in which
  // every allocation has its place, so tensors are placed by one offset as in an arena.
  kCudaIpc = 3,
  // Host memory, a bounded ring (PublisherOptions::ring_buckets): a sealed memfd of slot_count
  // buckets of slot_bytes (fd passed). A version is version_buckets buckets long; it streams
  // through the ring, bucket b in slot b % slot_count, announced by ring_bucket frames.
  kHostRing = 4,
  // GPU memory, a bounded ring: a cuMem allocation (fd passed, as kCudaMem) of slot_count
  // buckets of slot_bytes on the publisher's device, streamed through as kHostRing.
  kCudaRing = 5,
};
inline constexpr bool IsRing(ArenaKind kind) {
  return kind == ArenaKind::kHostRing || kind == ArenaKind::kCudaRing;
}
// How a kCudaIpc allocation is shared.
enum class AllocationKind : uint8_t {
  kIpcHandle = 0,  // cudaMalloc memory: a CUDA IPC handle of its base
  // cuMem memory (e.g. PyTorch's expandable segments): consecutive chunks, each one cuMem
  // allocation mapped whole, exported as a POSIX fd that follows the Welcome in an AllocationFd
  // frame. The subscriber maps the chunks back to back, so the allocation is one range there too.
  kPosixFdChunks = 1,
};
// One publisher allocation of a kCudaIpc store: `bytes` at `offset` of the direct region.
struct GpuAllocation {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  AllocationKind kind = AllocationKind::kIpcHandle;
  std::array<uint8_t, 64> ipc_handle{};  // kIpcHandle: a bearer secret, never logged
  std::vector<uint64_t> chunk_bytes;     // kPosixFdChunks: each > 0, summing to `bytes`
};
// Allocations in a Welcome, and fd chunks over all of them.
inline constexpr uint32_t kMaxAllocations = 1u << 20;
// How segment digests are computed (the subscriber must verify with the same function).
enum class DigestKind : uint8_t {
  kXxh3 = 0,   // XXH3_64bits of the segment's bytes
  kGpu64 = 1,  // the GPU digest of src/cuda/gpu_digest_reference.h
};

// A publisher's lineage name (PublisherOptions::lineage): 1..kMaxLineageBytes of [A-Za-z0-9._:-],
// so it is safe to log and to compare byte for byte.
inline constexpr uint32_t kMaxLineageBytes = 64;

struct Welcome {
  // Identity of the versions this publisher serves: (lineage, session_id, step). session_id is
  // random per Publisher::Create, so a restarted trainer is a new session even under the same
  // lineage and step numbers; a subscriber reports "up to date" only within one session.
  uint64_t session_id = 0;
  std::string lineage;         // 1..kMaxLineageBytes, see above
  int64_t resumed_from = -1;   // ≥ 0: this session continues `lineage` from that step
  uint64_t arena_bytes = 0;    // size of the memfd passed with this frame
  uint64_t direct_offset = 0;  // start of the direct region in the arena
  uint64_t direct_bytes = 0;
  uint64_t slots_offset = 0;   // start of slot 0
  uint64_t slot_bytes = 0;     // size of each slot
  uint32_t slot_count = 0;     // ≤ kMaxSlots
  uint64_t segment_bytes = 0;  // digest granularity, > 0
  ArenaKind arena_kind = ArenaKind::kHostMemfd;
  int32_t device = -1;  // kCudaMem: the publisher's CUDA device ordinal
  DigestKind digest_kind = DigestKind::kXxh3;
  std::vector<TensorPlacement> tensors;  // ≤ kMaxTensors
  // kCudaIpc only (empty otherwise): by offset, disjoint, inside the direct region.
  std::vector<GpuAllocation> allocations;
  // Ring kinds only (IsRing): a version's bucket count, ≥ 1; tensors lie in a virtual slot of
  // version_buckets × slot_bytes.
  uint32_t version_buckets = 0;
};
inline constexpr uint32_t kMaxSlots = 64;

struct UpdateRequest {
  int64_t step = -1;  // -1: latest
  // The subscriber's committed step of this publisher session (-1: it holds none of this
  // session's versions, e.g. after the publisher restarted): equal to the latest means
  // "up to date".
  int64_t after_step = -1;
  // How long the subscriber waits for this step (its own remaining deadline): the publisher
  // waits for the step, and for the subscriber to finish reading it, that long and not less.
  uint64_t wait_ms = 0;
  // The subscriber holds exactly the bytes of `after_step` where the step will land and can apply
  // a delta against them (tcp, docs/deltas.md): the publisher answers the step's bytes with a
  // DeltaBegin first. Encoded as one byte, 0 or 1.
  bool delta = false;
  // How many subscribers this one serves, its own children and theirs (a relay's subtree; 0 for
  // a leaf), as of this request: the publisher balances redirects by it and reports it in its
  // membership (MemberInfo::below).
  uint32_t below = 0;
};
inline constexpr uint32_t kUpdateRequestBytes = 8 + 8 + 8 + 1 + 4;  // its encoded payload, always
// The longest wait a publisher honours for one step (a day): bounds a pinned slot.
inline constexpr uint64_t kMaxWaitMs = 24ull * 3600 * 1000;

inline constexpr uint32_t kNoSlot = 0xFFFFFFFFu;
struct StepBegin {
  int64_t step = -1;
  uint32_t slot = kNoSlot;  // kNoSlot when the publisher has no registered (copied) tensors
};
inline constexpr uint32_t kStepBeginBytes = 8 + 4;

// The fd of chunk `index` (counting every kPosixFdChunks allocation's chunks in Welcome order)
// rides with this frame.
struct AllocationFd {
  uint32_t index = 0;
};
inline constexpr uint32_t kAllocationFdBytes = 4;

struct CopyDone {
  int64_t step = -1;
};
inline constexpr uint32_t kCopyDoneBytes = 8;

// Ring publishers: bucket `bucket` of `step` is in ring slot `slot` (ring_bucket_ready, publisher
// → subscriber); the subscriber has read it and the slot may be refilled (ring_bucket_done, the
// same three fields back).
struct RingBucket {
  int64_t step = -1;
  uint32_t bucket = 0;
  uint32_t slot = 0;
};
inline constexpr uint32_t kRingBucketBytes = 8 + 4 + 4;
// A version's buckets at most: with 64-byte buckets (the smallest), 1 GiB of tensors.
inline constexpr uint32_t kMaxVersionBuckets = 1u << 24;

// Digests of every segment, publisher manifest order, each tensor split into
// ceil(nbytes / segment_bytes) segments (a zero-byte tensor has none).
// 2^22 digests × 8 bytes = 32 MiB: fits the 64 MiB frame limit with room to spare.
inline constexpr uint32_t kMaxDigests = 1u << 22;
struct StepEnd {
  int64_t step = -1;
  std::vector<uint64_t> digests;
};
// The largest encoded StepEnd: i64 step, u32 count, the digests.
inline constexpr uint32_t kMaxStepEndBytes = 8 + 4 + kMaxDigests * 8;

// A tcp step's bytes when the subscriber asked for a delta (UpdateRequest::delta), sent after
// StepBegin: against which version, and for every digest segment of the selected tensors (in
// Select order, each tensor's segments in order) how many delta bytes stand for it on the
// connection, 0 meaning the segment comes whole. Then come those bytes, segment by segment.
// base_step -1: no delta this step (another base, no delta encoded), every segment whole, and
// `bytes` empty.
struct DeltaBegin {
  int64_t step = -1;
  int64_t base_step = -1;       // ≥ 0 and < step, or -1
  uint64_t base_digest = 0;     // 0 with base_step -1; else Hash64 of the base's digests of the
                                // selected segments, in the order of `bytes` (DigestOfDigests)
  std::vector<uint64_t> bytes;  // ≤ kMaxDigests entries
};
// The largest encoded DeltaBegin: i64 step, i64 base_step, u64 base_digest, u32 count, the sizes.
inline constexpr uint32_t kMaxDeltaBeginBytes = 8 + 8 + 8 + 4 + kMaxDigests * 8;
// DeltaBegin::base_digest of a base whose segments (in the DeltaBegin's order) have `digests`:
// XXH3_64bits of them as little-endian u64s.
uint64_t DigestOfDigests(std::span<const uint64_t> digests);

struct ErrorMessage {
  StatusCode code = StatusCode::kInternal;
  std::string message;  // ≤ kMaxErrorMessageBytes
};
inline constexpr uint32_t kMaxErrorMessageBytes = 4096;
// The largest encoded ErrorMessage: u8 code, u16 length, the message.
inline constexpr uint32_t kMaxErrorBytes = 1 + 2 + kMaxErrorMessageBytes;

void Encode(const Hello& m, std::vector<uint8_t>* out);
void Encode(const Redirect& m, std::vector<uint8_t>* out);
void Encode(const Welcome& m, std::vector<uint8_t>* out);
void Encode(const UpdateRequest& m, std::vector<uint8_t>* out);
void Encode(const StepBegin& m, std::vector<uint8_t>* out);
void Encode(const CopyDone& m, std::vector<uint8_t>* out);
void Encode(const AllocationFd& m, std::vector<uint8_t>* out);
void Encode(const RingBucket& m, std::vector<uint8_t>* out);
void Encode(const StepEnd& m, std::vector<uint8_t>* out);
void Encode(const DeltaBegin& m, std::vector<uint8_t>* out);
void Encode(const ErrorMessage& m, std::vector<uint8_t>* out);

Status Decode(std::span<const uint8_t> payload, Hello* m);
Status Decode(std::span<const uint8_t> payload, Redirect* m);
Status Decode(std::span<const uint8_t> payload, Welcome* m);
Status Decode(std::span<const uint8_t> payload, UpdateRequest* m);
Status Decode(std::span<const uint8_t> payload, StepBegin* m);
Status Decode(std::span<const uint8_t> payload, CopyDone* m);
Status Decode(std::span<const uint8_t> payload, AllocationFd* m);
Status Decode(std::span<const uint8_t> payload, RingBucket* m);
// Reuses m->digests' capacity: steady-state decoding does not allocate.
Status Decode(std::span<const uint8_t> payload, StepEnd* m);
// Reuses m->bytes' capacity, as StepEnd's decode does.
Status Decode(std::span<const uint8_t> payload, DeltaBegin* m);
Status Decode(std::span<const uint8_t> payload, ErrorMessage* m);

// ErrorMessage → Status with the peer's code and "peer: " + message. Unknown codes → ProtocolError.
Status ToStatus(const ErrorMessage& m);

// Ok if `lineage` is a valid lineage name (see kMaxLineageBytes); InvalidArgument saying why.
Status CheckLineage(std::string_view lineage);

}  // namespace weightsync::wire
