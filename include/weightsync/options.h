// Options for Publisher and Subscriber. Every field has a safe default; see docs/env_vars.md for
// the environment knobs that override defaults.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace weightsync {

// How a subscriber applies a version.
enum class UpdateMode : uint8_t {
  kStaged,   // receive into a shadow buffer, verify, then commit; old weights untouched on failure
  kInPlace,  // write destinations directly (no extra memory, except a landing buffer for tensors
             // converted in flight other than over cuda-ipc); a failure marks weights invalid
};

// How the plan treats names present on one side only.
enum class MatchPolicy : uint8_t {
  kStrict,  // both sides must hold exactly the same names
  kSubset,  // the subscriber may register a subset of the publisher's names
};

// When a publisher encodes deltas (PublisherOptions::delta). Built for a host arena publisher
// (host tensors registered, no ring) and tcp subscribers; other stores encode none.
enum class DeltaMode : uint8_t {
  // On a tcp:// endpoint, where bytes cost most: each segment's delta when it is at most a quarter
  // of the segment (else the segment goes whole). Each slot keeps an area of a quarter of the
  // registered tensors for its deltas. On local://, none: subscribers there copy at memory speed.
  kAuto,
  kOff,  // no deltas: every subscriber gets whole segments
  // Every segment as a delta, whatever its size, on any endpoint (tests and benchmarks; each slot
  // keeps an area as large as the registered tensors).
  kAlways,
};

// Tensors registered with a Publisher may live in host memory or on one CUDA device: a publisher
// of CUDA tensors keeps its store on that device; subscribers on the same host receive over
// cuda-ipc (into CUDA tensors) or the GPU's copy engines (into host memory), subscribers on other
// hosts over NCCL.
struct PublisherOptions {
  // "local://NAME": a Unix socket, owner-only, in $WEIGHTSYNC_SOCKET_DIR or /tmp/weightsync-UID;
  // subscribers on this host map the publisher's shared memory.
  // "tcp://HOST:PORT": listens on HOST (loopback unless a token is configured); subscribers on
  // any host receive the bytes over TCP. Port 0 picks a free port (see Publisher::endpoint()).
  std::string endpoint;
  // Shared secret for TCP (see docs/security.md). Empty: $WEIGHTSYNC_TOKEN_FILE or
  // $WEIGHTSYNC_TOKEN. Required to listen on a non-loopback address.
  std::string token;
  std::string token_file;  // path to a 0600 file holding the token
  // Versions held in the arena at once for registered (copied) tensors. Two lets a subscriber read
  // version N while version N+1 is written.
  int slots = 2;
  // Largest contiguous byte range covered by one digest, a multiple of 8 (whole elements of every
  // dtype). 0: 8 MiB for a host arena, 64 MiB for a GPU arena (fewer, larger digest launches per
  // step).
  uint64_t segment_bytes = 0;
  // Threads used by Publish() to copy and hash a host store's version; 0 picks every hardware
  // thread, up to 16 (hashing while copying needs several cores to keep up with memory).
  int copy_threads = 0;
  // Accepted connections at once; further ones are refused with a logged reason.
  int max_connections = 64;
  // Relay topology (docs/relays.md): how many subscribers this publisher serves directly. A
  // subscriber past the bound is redirected, in answer to its Hello, to the direct subscriber that
  // relays (SubscriberOptions::serve_endpoint) with the fewest subscribers below it, and dials
  // that relay instead (which may send it on by its own bound). With no relay to send it to, it is
  // served directly anyway: joining is never refused. 0: no bound.
  int max_direct = 0;
  // How long Publish() waits for readers to release a slot, and BeginWrite() for readers of
  // arena-allocated tensors, before revoking those reads (the subscribers get a Timeout at the end
  // of their step and commit nothing); and the deadline of any single control-frame read or
  // write. Waiting for a step and for a subscriber reading it is bounded by that subscriber's own
  // timeout instead (nccl: by this one), so a slow reader is never dropped unless its version's
  // memory is needed.
  std::chrono::milliseconds timeout{10000};
  // The line of versions this publisher continues: 1..64 characters of [A-Za-z0-9._:-], e.g. a
  // training run's name. Empty: a new random lineage for every Publisher::Create. Subscribers
  // tell versions apart by (lineage, publisher session, step), never by step alone: after a
  // restart they apply the new session's latest step even if its number is one they hold
  // (SubscriberOptions::lineage_policy says what else they accept).
  std::string lineage;
  // ≥ 0: this publisher resumes `lineage` from that step (the checkpoint it restored); steps it
  // publishes must be greater. Requires `lineage`. -1: a fresh start.
  int64_t resume_from_step = -1;
  // CUDA tensors: the registered tensors ARE the published version — no GPU arena, no copy. On a
  // local:// endpoint subscribers on this host read the trainer's memory (cuda-ipc: each
  // cudaMalloc allocation the tensors live in exported once by IPC handle, cuMem memory such as
  // PyTorch's expandable segments chunk by chunk as POSIX fds); on a tcp:// endpoint nothing is
  // exported and each session broadcasts the tensors over NCCL. As with Allocate()d host
  // tensors, Publish(step) only hashes, and the trainer must call BeginWrite() before changing
  // the tensors (it waits for readers, revoking any past `timeout`). The tensors stay allocated
  // until Close(): subscribers map them until their next update, sleep or close.
  bool zero_copy = false;
  // Bounded staging: ≥ 2 keeps versions in a ring of this many buckets of
  // `ring_bucket_bytes` instead of `slots` copies of the model — in host memory for host tensors,
  // in one cuMem allocation on their GPU for CUDA tensors (read by cuda-ipc subscribers). As for
  // zero_copy, Publish(step) only hashes the registered tensors (no copy, returns at once) and the
  // trainer calls BeginWrite() before changing them; each subscriber's update then streams the
  // version through the ring, bucket b + 1 filled from the tensors while it copies bucket b.
  // Subscribers updating at the same time share one pass through the ring (a round); one arriving
  // after the ring has moved on waits for the round to end, then starts the next. A subscriber
  // holding a bucket past `timeout` while others wait for its slot is revoked (it commits nothing).
  // Over tcp the session sends the version from the tensors themselves (socket writes for host
  // tensors, NCCL broadcasts for CUDA ones), BeginWrite waiting until the bytes have been taken;
  // no bucket is allocated there (PublishStats::store_bytes 0). 0: off.
  int ring_buckets = 0;
  // Bytes per ring bucket, rounded up to whole 4 KiB pages; 0: a quarter of the free host (GPU)
  // memory over the buckets, within [64 MiB, 1 GiB], and never more than the model.
  uint64_t ring_bucket_bytes = 0;
  // Delta updates (docs/deltas.md): each Publish also encodes the elements of every registered
  // tensor that changed since the previous version, segment by segment, and a tcp subscriber whose
  // committed bytes are exactly that version receives the deltas instead of the segments.
  DeltaMode delta = DeltaMode::kAuto;
};

// What a subscriber does when a publisher's session changes (it restarted, or another publisher
// took the endpoint) while it holds a version of the previous session.
enum class LineagePolicy : uint8_t {
  // Follow the publisher: its latest step replaces the committed version whatever its number
  // (a trainer resumed from step 4 republishing step 5 is applied). Logged; UpdateStats::
  // lineage_changed says so.
  kFollow,
  // Steps only move forward across restarts: a restart of the same lineage is applied once it
  // publishes a step newer than the committed one, and a different lineage is refused with
  // FailedPrecondition, until an update asks for it (UpdateOptions::accept_new_lineage).
  kStrict,
};

struct SubscriberOptions {
  std::string endpoint;  // same form as PublisherOptions::endpoint
  // Further publishers feeding this subscriber, e.g. one per trainer rank, each holding part (or
  // all) of the tensors. At every prepare (the first update, and after Sleep() or a failed one)
  // every publisher's manifest is read and each tensor is assigned to exactly one of them (a
  // tensor several hold goes to the least-loaded one; one that needs no conversion wins over one
  // that would); the shares then move concurrently, each over its own transfer handle, and every
  // share is received (and verified, when asked) before any is committed: a failure up to then
  // leaves the old weights untouched (staged). A failure during the commit itself marks the
  // weights invalid, as with one publisher. All publishers must publish the same steps; "latest"
  // is the latest of the first listed one that delivers something. `endpoint` may be left empty
  // when this is not.
  std::vector<std::string> endpoints;
  std::string token;  // as PublisherOptions::token (TCP only)
  std::string token_file;
  UpdateMode mode = UpdateMode::kStaged;
  MatchPolicy policy = MatchPolicy::kStrict;
  // Deadline for each update, end to end, including connecting and preparing.
  std::chrono::milliseconds timeout{10000};
  // Threads copying bytes; 0 picks min(4, hardware threads).
  int copy_threads = 0;
  // Verify every segment against the publisher's xxHash3 digest before committing (per update
  // overridable).
  bool verify = false;
  // Delta updates (docs/deltas.md): over tcp, when the weights hold exactly the committed version
  // (this session's, nothing failed since), ask for the changes against it instead of whole
  // segments. The publisher proves its base by the digests of the committed version; anything
  // else (no base, another one, a delta the publisher did not encode) comes whole. Off: always
  // whole.
  bool delta = true;
  // Lets a destination's dtype differ from the publisher's where weightsync converts in flight:
  // casts among float32, float16 and bfloat16 (round to nearest even), and bfloat16 →
  // float8_e4m3fn with one scale per 128×128 block (cols = the last dimension, rows = the
  // product of the others), written to the destination NAME + fp8_scale_suffix: float32
  // (amax / 448) or float8_e8m0fnu (power-of-two) of shape [ceil(rows/128), ceil(cols/128)].
  // The published bytes move and are verified as published; the conversion writes the
  // destination at commit, after verification (in place over cuda-ipc: during the copy, reading
  // the publisher's GPU memory directly). Off: any dtype difference is a mismatch. Format
  // details: docs/gpu.md.
  bool convert_dtypes = false;
  std::string fp8_scale_suffix = "_scale_inv";
  // In place over cuda-ipc, when the publisher's GPU is another device this process can use (it
  // is visible here, it can reach the destinations' GPU, and every converted destination is
  // writable from it), run the conversions there: they read the published bytes from that GPU's
  // own memory and only the converted bytes cross the link (bf16 → fp8: half of them; measured
  // figures in docs/gpu.md). Off by default because it costs the publisher's GPU:
  // this process creates a CUDA context there (hundreds of MiB) and the kernels use its SMs for
  // the update. Otherwise the conversions run on the destinations' GPU, reading the published
  // bytes across the link. The prepare log line says where they run and, after a failed attempt,
  // why not on the publisher's GPU.
  bool convert_on_publisher_gpu = false;
  // See LineagePolicy.
  LineagePolicy lineage_policy = LineagePolicy::kFollow;
  // A relay (docs/relays.md): "local://NAME" or "tcp://HOST:PORT" makes this subscriber also serve
  // every version it commits to other subscribers, who dial it as they would the trainer's
  // publisher (same token). It serves under the trainer's lineage, session and step numbers with
  // the trainer's digests (never hashed again), so its children verify exactly what the trainer
  // published; over tcp they get deltas as from the trainer. The endpoint is bound at Create
  // (Subscriber::serve_endpoint()); children wait there for the first version. Needs one
  // publisher, and every published tensor registered whole and unconverted, all in host memory
  // (from a publisher that digests on the host) or all on one GPU (from one that digests on its
  // GPU: served over cuda-ipc, or nccl to tcp children). The relay keeps two copies of the model
  // there (its own store, so the next update never pulls bytes from under a child; a GPU store is
  // given back by Sleep()). Empty: not a relay.
  std::string serve_endpoint;
  // A relay's own bound on direct children (PublisherOptions::max_direct of the publisher it
  // serves through); children past it are redirected further down. 0: no bound.
  int serve_max_direct = 0;
  // The endpoint a relay is announced by (in its Hello to its publisher, which redirects
  // newcomers there): where other hosts reach serve_endpoint. Empty: serve_endpoint as bound,
  // unless it binds a wildcard address (tcp://0.0.0.0:P, tcp://[::]:P), which is then not
  // announced (the relay serves only those who dial it themselves).
  std::string serve_announce;
  // Where this subscriber runs, as you label it (a host name, a rack): ≤ 64 printable ASCII
  // characters. A publisher past its max_direct redirects it to a relay of the same locality
  // first (docs/relays.md, "Topology"), so replicas on one host or rack feed each other before
  // they cross the network. Empty: none (any relay).
  std::string locality;
};

}  // namespace weightsync
