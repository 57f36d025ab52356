// Writes the seed corpora of the fuzz targets: valid encodings made with the library's own
// encoders, plus a few near misses. Run by scripts/fuzz.sh --regen-corpus; the output is checked in
// under fuzz/corpus/<target>/ (small on purpose: libFuzzer grows its own working corpus).
//
//   gen_corpus OUT_DIR   → OUT_DIR/{frame_fuzz,messages_fuzz,handshake_fuzz,delta_fuzz}/<name>
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "delta/segment_delta.h"
#include "fuzz_destinations.h"
#include "wire/frame.h"
#include "wire/handshake.h"
#include "wire/members_report.h"
#include "wire/messages.h"

namespace {

namespace fs = std::filesystem;
namespace wire = weightsync::wire;
using weightsync::DType;
using weightsync::TensorSpec;

fs::path g_out;
int g_files = 0;

void Write(const std::string& target, const std::string& name, const std::vector<uint8_t>& bytes) {
  fs::create_directories(g_out / target);
  std::ofstream f(g_out / target / name, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) {
    std::fprintf(stderr, "gen_corpus: cannot write %s/%s\n", target.c_str(), name.c_str());
    std::exit(1);
  }
  ++g_files;
}

template <typename M>
std::vector<uint8_t> Payload(const M& m) {
  std::vector<uint8_t> out;
  wire::Encode(m, &out);
  return out;
}

std::vector<uint8_t> WithSelector(uint8_t selector, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out{selector};
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::vector<uint8_t> Frame(wire::FrameType type, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out(wire::kHeaderBytes);
  wire::EncodeHeader(type, payload, std::span<uint8_t, wire::kHeaderBytes>(out.data(), 24));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// A Welcome placing `specs` in the arena: in the slots (two of them) if all_in_slot, in the
// direct region if all_direct, otherwise odd-indexed tensors in the slots and the rest direct.
wire::Welcome MakeWelcome(const std::vector<TensorSpec>& specs, uint64_t segment_bytes,
                          bool all_in_slot, bool all_direct) {
  wire::Welcome w;
  w.session_id = 0x1234;
  w.lineage = "run-1";
  uint64_t direct = 0, slot = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    wire::TensorPlacement p;
    p.spec = specs[i];
    const bool in_slot = all_in_slot || (!all_direct && i % 2 == 1);
    p.region = in_slot ? wire::Region::kSlot : wire::Region::kDirect;
    uint64_t& cursor = in_slot ? slot : direct;
    p.offset = cursor;
    cursor = RoundUp(cursor + p.spec.nbytes, 64);
    w.tensors.push_back(p);
  }
  w.direct_offset = 0;
  w.direct_bytes = direct;
  w.slots_offset = RoundUp(direct, 4096);
  w.slot_bytes = RoundUp(slot, 4096);
  w.slot_count = slot > 0 ? 2 : 0;
  w.arena_bytes = w.slots_offset + w.slot_bytes * w.slot_count;
  w.segment_bytes = segment_bytes;
  return w;
}

// A ring publisher's Welcome: `specs` in a version of buckets of `bucket_bytes`, streamed through
// `slots` ring slots (tensors straddle bucket edges where bucket_bytes is small).
wire::Welcome MakeRingWelcome(const std::vector<TensorSpec>& specs, uint64_t segment_bytes,
                              wire::ArenaKind kind, uint64_t bucket_bytes, uint32_t slots) {
  wire::Welcome w = MakeWelcome(specs, segment_bytes, true, false);
  uint64_t version = 0;
  for (const wire::TensorPlacement& p : w.tensors) {
    version = std::max(version, p.offset + p.spec.nbytes);
  }
  w.arena_kind = kind;
  w.slots_offset = 0;
  w.slot_bytes = bucket_bytes;
  w.slot_count = slots;
  w.arena_bytes = bucket_bytes * slots;
  w.version_buckets =
      static_cast<uint32_t>(std::max<uint64_t>(RoundUp(version, bucket_bytes) / bucket_bytes, 1));
  if (kind == wire::ArenaKind::kCudaRing) {
    w.device = 0;
    w.digest_kind = wire::DigestKind::kGpu64;
  }
  return w;
}

// messages_fuzz selector: type 1 (Welcome), bucket index, destination set.
uint8_t WelcomeSelector(int bucket, int set) {
  return static_cast<uint8_t>(1 + 8 * (bucket + 4 * set));
}

void Messages() {
  const std::string t = "messages_fuzz";
  const std::vector<TensorSpec> dests = weightsync::fuzz::DestinationSpecs();

  Write(
      t, "hello",
      WithSelector(0, Payload(wire::Hello{wire::kProtocolVersion, wire::Role::kSubscriber, 4242})));
  Write(
      t, "hello_relay",
      WithSelector(0, Payload(wire::Hello{wire::kProtocolVersion, wire::Role::kSubscriber, 7, 9,
                                          "tcp://10.0.0.7:5000", "local://lost-relay", "rack-3"})));
  Write(t, "hello_bad_role", WithSelector(0, {1, 0, 2, 0, 0, 0, 0}));
  Write(t, "redirect", WithSelector(8, Payload(wire::Redirect{"tcp://[fd00::7]:5000"})));
  wire::MembersReport report;
  report.held_step = 3;
  report.below = 2;
  report.members = {{"10.0.0.8:4100", "tcp://10.0.0.8:5000", "rack-3", "", 3, 3, -1, 1, 1},
                    {"subscriber connection 2", "", "", "tcp://10.0.0.8:5000", 2, 3, 3, 0, 2}};
  Write(t, "members_report", WithSelector(16, Payload(report)));

  Write(t, "welcome_mixed_seg16",
        WithSelector(WelcomeSelector(1, 0), Payload(MakeWelcome(dests, 16, false, false))));
  Write(t, "welcome_direct_seg4096",
        WithSelector(WelcomeSelector(2, 0), Payload(MakeWelcome(dests, 4096, false, true))));
  Write(t, "welcome_slots_seg1",
        WithSelector(WelcomeSelector(0, 0), Payload(MakeWelcome(dests, 1, true, false))));
  Write(t, "welcome_mixed_bucket_max",
        WithSelector(WelcomeSelector(3, 0), Payload(MakeWelcome(dests, 24, false, false))));
  Write(t, "welcome_duplicate_destination",
        WithSelector(WelcomeSelector(1, 1), Payload(MakeWelcome(dests, 16, false, false))));
  {
    // Publisher holds an extra tensor: the subset policy plans, the strict one refuses.
    std::vector<TensorSpec> more = dests;
    more.insert(more.begin() + 2, TensorSpec{"extra.w", DType::kUInt16, {3, 3}, 18});
    Write(t, "welcome_publisher_extra",
          WithSelector(WelcomeSelector(1, 0), Payload(MakeWelcome(more, 16, false, false))));
  }
  {
    // Dtype and shape mismatches, and a missing tensor.
    std::vector<TensorSpec> wrong = dests;
    wrong[0].dtype = DType::kInt32;
    wrong[1].shape = {2, 4};
    wrong.pop_back();
    Write(t, "welcome_mismatches",
          WithSelector(WelcomeSelector(1, 0), Payload(MakeWelcome(wrong, 16, false, false))));
  }
  {
    // Layout errors: a tensor past its region, a region past the arena.
    wire::Welcome w = MakeWelcome(dests, 16, false, false);
    w.tensors[0].offset = w.direct_bytes;
    Write(t, "welcome_tensor_outside_region", WithSelector(WelcomeSelector(1, 0), Payload(w)));
    w = MakeWelcome(dests, 16, false, false);
    w.arena_bytes -= 1;
    Write(t, "welcome_region_outside_arena", WithSelector(WelcomeSelector(1, 0), Payload(w)));
  }
  {
    // The same layout in a GPU arena (GPU digests) and in a tcp session (nothing mapped).
    wire::Welcome w = MakeWelcome(dests, 16, false, false);
    w.arena_kind = wire::ArenaKind::kCudaMem;
    w.device = 0;
    w.digest_kind = wire::DigestKind::kGpu64;
    Write(t, "welcome_cuda_arena", WithSelector(WelcomeSelector(1, 0), Payload(w)));
    w = MakeWelcome(dests, 16, false, false);
    w.arena_kind = wire::ArenaKind::kNone;
    Write(t, "welcome_tcp_no_arena", WithSelector(WelcomeSelector(2, 0), Payload(w)));
    // A zero-copy publisher: its direct tensors in two allocations, a cudaMalloc one (IPC
    // handle) and a cuMem one of three chunks (fds follow the Welcome).
    w = MakeWelcome(dests, 16, false, true);
    w.arena_kind = wire::ArenaKind::kCudaIpc;
    w.device = 0;
    w.digest_kind = wire::DigestKind::kGpu64;
    const uint64_t half = w.direct_bytes / 2;
    wire::GpuAllocation ipc{0, half, wire::AllocationKind::kIpcHandle, {}, {}};
    ipc.ipc_handle.fill(0x5A);
    wire::GpuAllocation chunks{
        half, w.direct_bytes - half, wire::AllocationKind::kPosixFdChunks, {}, {}};
    chunks.chunk_bytes = {chunks.bytes / 3, chunks.bytes / 3,
                          chunks.bytes - 2 * (chunks.bytes / 3)};
    w.allocations = {ipc, chunks};
    Write(t, "welcome_zero_copy", WithSelector(WelcomeSelector(1, 0), Payload(w)));
    // The same publisher on a tcp endpoint: nothing exported, no allocation listed.
    w.allocations.clear();
    Write(t, "welcome_zero_copy_tcp", WithSelector(WelcomeSelector(1, 0), Payload(w)));
    // Converting subscriber (set 2): casts and bf16 → fp8 with scales, slots and direct.
    const std::vector<TensorSpec> converting = weightsync::fuzz::ConvertingPublisherSpecs();
    Write(t, "welcome_converting_seg16",
          WithSelector(WelcomeSelector(1, 2), Payload(MakeWelcome(converting, 16, false, false))));
    Write(t, "welcome_converting_slots",
          WithSelector(WelcomeSelector(2, 2), Payload(MakeWelcome(converting, 4096, true, false))));
  }
  {
    // Sharded tensors (regions of global tensors): each the second quarter of rows of its own,
    // twice as wide global tensor at column offset 0.
    wire::Welcome w = MakeWelcome(dests, 16, false, false);
    for (wire::TensorPlacement& p : w.tensors) {
      p.sharded = true;
      p.shard.tensor = "global." + p.spec.name;
      p.shard.global_shape = p.spec.shape;
      p.shard.offset.assign(p.spec.shape.size(), 0);
      if (!p.spec.shape.empty()) {
        p.shard.global_shape[0] *= 4;
        p.shard.offset[0] = p.spec.shape[0];
      }
    }
    Write(t, "welcome_sharded", WithSelector(WelcomeSelector(1, 0), Payload(w)));
  }
  {
    // Ring publishers: 5 host buckets of 64 bytes in 3 slots (so bucket b wraps to slot b % 3);
    // 4 GPU buckets of 80 bytes in 2 slots, with 24-byte segments crossing bucket edges.
    wire::Welcome w = MakeRingWelcome(dests, 16, wire::ArenaKind::kHostRing, 64, 3);
    Write(t, "welcome_host_ring", WithSelector(WelcomeSelector(1, 0), Payload(w)));
    w = MakeRingWelcome(dests, 24, wire::ArenaKind::kCudaRing, 80, 2);
    Write(t, "welcome_cuda_ring", WithSelector(WelcomeSelector(1, 0), Payload(w)));
    Write(t, "welcome_converting_ring",
          WithSelector(WelcomeSelector(0, 2),
                       Payload(MakeRingWelcome(weightsync::fuzz::ConvertingPublisherSpecs(), 100,
                                               wire::ArenaKind::kHostRing, 256, 2))));
    // A ring of one slot: ValidateLayout refuses it.
    w = MakeRingWelcome(dests, 16, wire::ArenaKind::kHostRing, 64, 1);
    Write(t, "welcome_ring_one_slot", WithSelector(WelcomeSelector(1, 0), Payload(w)));
  }
  Write(t, "welcome_empty",
        WithSelector(WelcomeSelector(2, 0), Payload(MakeWelcome({}, 16, false, false))));

  Write(t, "update_request", WithSelector(2, Payload(wire::UpdateRequest{7, 6})));
  Write(t, "update_request_delta", WithSelector(2, Payload(wire::UpdateRequest{7, 6, 100, true})));
  Write(t, "update_request_relay",
        WithSelector(2, Payload(wire::UpdateRequest{7, 6, 100, true, 14})));
  Write(t, "update_request_latest", WithSelector(2, Payload(wire::UpdateRequest{})));
  Write(t, "step_begin", WithSelector(3, Payload(wire::StepBegin{7, 1})));
  Write(t, "step_begin_no_slot", WithSelector(3, Payload(wire::StepBegin{7, wire::kNoSlot})));
  Write(t, "copy_done", WithSelector(4, Payload(wire::CopyDone{7})));
  Write(t, "step_end",
        WithSelector(5, Payload(wire::StepEnd{7, {1, 2, 3, 0xFFFFFFFFFFFFFFFFull}})));
  Write(t, "step_end_empty", WithSelector(5, Payload(wire::StepEnd{7, {}})));
  Write(t, "delta_begin", WithSelector(13, Payload(wire::DeltaBegin{7, 6, 0xABCD, {0, 12, 4096}})));
  Write(t, "delta_begin_whole", WithSelector(13, Payload(wire::DeltaBegin{7, -1, 0, {}})));
  Write(t, "error",
        WithSelector(6, Payload(wire::ErrorMessage{weightsync::StatusCode::kTimeout,
                                                   "publisher: step 7 timed out"})));
  Write(t, "error_utf8",
        WithSelector(6, Payload(wire::ErrorMessage{weightsync::StatusCode::kCorruption,
                                                   "tensor 'w\xc3\xa9ight' digest mismatch"})));
  Write(t, "ring_bucket", WithSelector(7, Payload(wire::RingBucket{7, 4, 1})));
  std::vector<uint8_t> short_bucket = WithSelector(7, Payload(wire::RingBucket{7, 4, 1}));
  short_bucket.pop_back();
  Write(t, "ring_bucket_truncated", short_bucket);
}

void Handshake() {
  const std::string t = "handshake_fuzz";
  wire::Nonce nonce{};
  for (size_t i = 0; i < nonce.size(); ++i) nonce[i] = static_cast<uint8_t>(i * 7 + 1);
  wire::Challenge challenge{wire::kProtocolVersion, 99, nonce, true};
  Write(t, "challenge_auth", WithSelector(0, Payload(challenge)));
  challenge.auth_required = false;
  Write(t, "challenge_loopback", WithSelector(0, Payload(challenge)));
  wire::Auth auth{wire::Role::kSubscriber, nonce, {}};
  auth.mac = wire::ComputeMac("token", wire::MacSide::kClient, challenge, nonce, auth.role);
  Write(t, "auth", WithSelector(1, Payload(auth)));
  wire::AuthOk ok{wire::ComputeMac("token", wire::MacSide::kServer, challenge, nonce, auth.role)};
  Write(t, "auth_ok", WithSelector(2, Payload(ok)));
  Write(t, "select",
        WithSelector(
            3, Payload(wire::Select{{{0, 0, 16}, {1, 8, 4}, {5, 0, 1}, {4096, 1u << 20, 64}}})));
  Write(t, "select_empty", WithSelector(3, Payload(wire::Select{})));
  // One range of tensor 3, offset 0, 0 bytes: refused.
  Write(t, "select_empty_range",
        WithSelector(3, {1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  Write(t, "nccl_setup", WithSelector(4, Payload(wire::NcclSetup{22809, 1})));
  wire::NcclId id{22809, {}};
  for (size_t i = 0; i < id.unique_id.size(); ++i) id.unique_id[i] = static_cast<uint8_t>(255 - i);
  Write(t, "nccl_id", WithSelector(5, Payload(id)));
}

void Frames() {
  const std::string t = "frame_fuzz";
  const std::vector<TensorSpec> dests = weightsync::fuzz::DestinationSpecs();
  wire::Nonce nonce{};
  Write(t, "hello",
        Frame(wire::FrameType::kHello, Payload(wire::Hello{1, wire::Role::kSubscriber, 1})));
  Write(t, "welcome",
        Frame(wire::FrameType::kWelcome, Payload(MakeWelcome(dests, 16, false, false))));
  Write(t, "welcome_ring",
        Frame(wire::FrameType::kWelcome,
              Payload(MakeRingWelcome(dests, 16, wire::ArenaKind::kCudaRing, 64, 2))));
  Write(t, "update_request",
        Frame(wire::FrameType::kUpdateRequest, Payload(wire::UpdateRequest{})));
  Write(t, "step_begin", Frame(wire::FrameType::kStepBegin, Payload(wire::StepBegin{3, 0})));
  Write(t, "copy_done", Frame(wire::FrameType::kCopyDone, Payload(wire::CopyDone{3})));
  Write(t, "step_end", Frame(wire::FrameType::kStepEnd, Payload(wire::StepEnd{3, {9, 8}})));
  Write(t, "error",
        Frame(wire::FrameType::kError,
              Payload(wire::ErrorMessage{weightsync::StatusCode::kBusy, "busy"})));
  Write(t, "challenge",
        Frame(wire::FrameType::kChallenge, Payload(wire::Challenge{1, 5, nonce, true})));
  Write(t, "auth",
        Frame(wire::FrameType::kAuth, Payload(wire::Auth{wire::Role::kSubscriber, nonce, {}})));
  Write(t, "auth_ok", Frame(wire::FrameType::kAuthOk, Payload(wire::AuthOk{})));
  Write(t, "select",
        Frame(wire::FrameType::kSelect, Payload(wire::Select{{{0, 0, 4}, {2, 0, 8}}})));
  Write(t, "nccl_setup", Frame(wire::FrameType::kNcclSetup, Payload(wire::NcclSetup{22809, 0})));
  Write(t, "nccl_id", Frame(wire::FrameType::kNcclId, Payload(wire::NcclId{22809, {}})));
  Write(t, "ring_bucket_ready",
        Frame(wire::FrameType::kRingBucketReady, Payload(wire::RingBucket{3, 0, 1})));
  Write(t, "ring_bucket_done",
        Frame(wire::FrameType::kRingBucketDone, Payload(wire::RingBucket{3, 0, 1})));
  Write(t, "empty_payload", Frame(wire::FrameType::kCopyDone, {}));
  std::vector<uint8_t> truncated =
      Frame(wire::FrameType::kStepEnd, Payload(wire::StepEnd{3, {9, 8}}));
  truncated.pop_back();
  Write(t, "truncated_payload", truncated);
  std::vector<uint8_t> flipped = Frame(wire::FrameType::kCopyDone, Payload(wire::CopyDone{3}));
  flipped.back() ^= 1;
  Write(t, "bitflip_payload", flipped);
  std::vector<uint8_t> huge = Frame(wire::FrameType::kWelcome, {});
  huge[8] = 0xFF, huge[9] = 0xFF, huge[10] = 0xFF, huge[11] = 0xFF;  // length 2^32 - 1
  Write(t, "length_over_cap", huge);
}

// delta_fuzz: element-size selector, element count (u16), then a delta the encoder wrote against
// the target's base pattern (i * 131 + 7), at the fractions that reach each chunk form.
void Deltas() {
  const std::string t = "delta_fuzz";
  struct Seed {
    const char* name;
    uint8_t selector;  // 1 (bf16), 2 (fp32), 5 (3-byte elements)
    uint16_t elements;
    uint32_t every;  // every nth element changes
  };
  const Seed seeds[] = {{"bf16_sparse", 1, 1000, 37}, {"bf16_bitmap", 1, 700, 3},
                        {"bf16_whole", 1, 300, 1},    {"fp32_partial", 2, 77, 5},
                        {"odd_elements", 5, 600, 9},  {"unchanged", 1, 513, 0}};
  const uint32_t sizes[] = {1, 2, 4, 8, 16, 3};
  for (const Seed& s : seeds) {
    const uint32_t e = sizes[s.selector];
    std::vector<uint8_t> base(uint64_t{s.elements} * e);
    for (size_t i = 0; i < base.size(); ++i) base[i] = static_cast<uint8_t>(i * 131 + 7);
    std::vector<uint8_t> next = base;
    for (uint32_t i = 0; s.every != 0 && i < s.elements; i += s.every) next[i * e] ^= 0x5A;
    std::vector<uint8_t> out(next.size() + weightsync::delta::ChunkCount(s.elements));
    weightsync::delta::SegmentEncoder encoder;
    const auto encoded = encoder.Encode(base, next, e, out);
    if (!encoded) {
      std::fprintf(stderr, "gen_corpus: no delta for %s\n", s.name);
      std::exit(1);
    }
    std::vector<uint8_t> bytes = {s.selector, static_cast<uint8_t>(s.elements),
                                  static_cast<uint8_t>(s.elements >> 8)};
    bytes.insert(bytes.end(), out.begin(), out.begin() + static_cast<long>(encoded->bytes));
    Write(t, s.name, bytes);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  g_out = argv[1];
  Frames();
  Messages();
  Handshake();
  Deltas();
  std::printf("gen_corpus: wrote %d files under %s\n", g_files, argv[1]);
  return 0;
}
