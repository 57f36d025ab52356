// libFuzzer target: the control-message decoders (src/wire/messages.h), including the
// manifest-bearing Welcome, followed by what a subscriber does with a Welcome from a possibly
// hostile publisher: plan::ValidateLayout, plan::BuildPlan against a fixed destination set, and
// the copies the plan describes; then the same Welcome's tensors as regions (plan::ScheduleRegions
// and plan::BuildRegionPlan against destinations wanting half of each), executed likewise.
//
// Input: one selector byte, then the message payload.
//   selector % 8        message type (Hello, Redirect or MembersReport, Welcome, UpdateRequest,
//                       StepBegin, CopyDone, StepEnd or DeltaBegin, Error, RingBucket)
//   (selector / 8) % 3  type 0 only: 0 Hello, 1 Redirect, 2 MembersReport
//   (selector / 8) % 2  type 5 only: 0 StepEnd, 1 DeltaBegin
//   (selector / 8) % 4  Welcome only: bucket_bytes (1, 100, 4 MiB, 2^64-1)
//   (selector / 32) % 3 Welcome only: destination set (0: fuzz_destinations.h, 1: the same with a
//                       duplicated name, which BuildPlan must refuse, 2: the converting set,
//                       planned with convert_dtypes on)
//
// Properties checked besides "no sanitizer report":
//   - a decoder fails only with ProtocolError;
//   - a decoded message re-encodes to exactly the payload (canonical encoding: trailing bytes,
//     ignored fields or lossy conversions would show up here), also when decoded into a message
//     object that already holds a previous decode;
//   - ToStatus of a decoded ErrorMessage is never OK;
//   - a layout ValidateLayout accepts keeps every tensor inside its region (for a ring, the
//     version's version_buckets × slot_bytes) and every region inside the arena (checked here
//     independently, in 128-bit arithmetic), and a ring has ≥ 2 slots and no direct region;
//   - a plan BuildPlan returns only pairs same-named, same-dtype (or, converting, a supported
//     transform with its fp8 scale destination), same-shape tensors, covers each
//     planned tensor exactly with segments inside their source region, destination and shadow
//     buffer, numbers digests inside digest_count, and groups segments into contiguous buckets;
//   - executing the plan's copies (staged: arena → shadow → destinations; in place: arena →
//     destinations or the landing buffer; from a ring, each segment cut at the version's bucket
//     edges, bucket b read from ring slot b % slot_count) and its conversions (the CPU
//     transforms, into the destination and scale buffers) against exactly-sized heap buffers
//     stays in bounds (ASan checks every byte).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "cuda/transform_reference.h"
#include "fuzz_check.h"
#include "fuzz_destinations.h"
#include "plan/plan.h"
#include "plan/region_plan.h"
#include "plan/regions.h"
#include "wire/members_report.h"
#include "wire/messages.h"

namespace {

using weightsync::MatchPolicy;
using weightsync::Status;
using weightsync::StatusCode;
using weightsync::TensorSpec;
namespace plan = weightsync::plan;
namespace wire = weightsync::wire;
using u128 = unsigned __int128;

// Arenas up to this size are allocated and the plan's copies executed.
constexpr uint64_t kMaxSimulatedArena = 1u << 20;
constexpr uint64_t kBucketBytes[4] = {1, 100, 4u << 20, ~uint64_t{0}};

template <typename M>
bool RoundTrip(std::span<const uint8_t> payload, M* m) {
  Status s = wire::Decode(payload, m);
  if (!s.ok()) {
    WS_FUZZ_CHECK(s.code() == StatusCode::kProtocolError, "%s", s.ToString().c_str());
    return false;
  }
  std::vector<uint8_t> out;
  wire::Encode(*m, &out);
  WS_FUZZ_CHECK(out.size() == payload.size() && std::equal(out.begin(), out.end(), payload.begin()),
                "decoded message re-encodes to %zu bytes that differ from the %zu-byte payload",
                out.size(), payload.size());
  // Decoding into a used object must not keep anything from its previous contents.
  Status again = wire::Decode(payload, m);
  WS_FUZZ_CHECK(again.ok(), "second decode failed: %s", again.ToString().c_str());
  out.clear();
  wire::Encode(*m, &out);
  WS_FUZZ_CHECK(out.size() == payload.size() && std::equal(out.begin(), out.end(), payload.begin()),
                "re-decoding into a used message changed its encoding");
  return true;
}

template <typename M>
void FuzzSimple(std::span<const uint8_t> payload) {
  M m;
  RoundTrip(payload, &m);
}

struct Destinations {
  std::vector<TensorSpec> specs;
  std::vector<plan::Destination> planned;  // data == nullptr: BuildPlan never touches it
};

const Destinations& GetDestinations(int set) {
  static const Destinations* sets = [] {
    auto* d = new Destinations[3];
    d[0].specs = weightsync::fuzz::DestinationSpecs();
    d[1].specs = d[0].specs;
    d[1].specs.push_back(d[0].specs[0]);  // a name registered twice
    d[2].specs = weightsync::fuzz::ConvertingDestinationSpecs();
    for (int i = 0; i < 3; ++i) {
      for (const TensorSpec& s : d[i].specs) {
        plan::Destination dest;
        dest.spec = s;  // data stays nullptr: BuildPlan never touches it; device: host
        d[i].planned.push_back(dest);
      }
    }
    return d;
  }();
  return sets[set];
}

// A ring's slot tensors lie in a virtual slot of version_buckets ring slots.
u128 RegionBytes(const wire::Welcome& w, wire::Region region) {
  if (region == wire::Region::kDirect) return w.direct_bytes;
  return wire::IsRing(w.arena_kind) ? u128{w.slot_bytes} * w.version_buckets : w.slot_bytes;
}

void CheckLayout(const wire::Welcome& w) {
  if (w.direct_bytes > 0) {
    WS_FUZZ_CHECK(u128{w.direct_offset} + w.direct_bytes <= w.arena_bytes,
                  "direct region outside the arena");
  }
  if (w.slot_count > 0 && w.slot_bytes > 0) {
    WS_FUZZ_CHECK(u128{w.slots_offset} + u128{w.slot_bytes} * w.slot_count <= w.arena_bytes,
                  "slots outside the arena");
  }
  WS_FUZZ_CHECK(w.segment_bytes > 0, "segment_bytes 0 accepted");
  if (wire::IsRing(w.arena_kind)) {
    // ExecutePlan's bucket arithmetic relies on these.
    WS_FUZZ_CHECK(w.version_buckets > 0 && w.slot_count >= 2 && w.slot_bytes > 0 &&
                      w.direct_bytes == 0 && RegionBytes(w, wire::Region::kSlot) <= ~uint64_t{0},
                  "ring of %u slots of %llu bytes, %u buckets a version, %llu direct bytes",
                  w.slot_count, (unsigned long long)w.slot_bytes, w.version_buckets,
                  (unsigned long long)w.direct_bytes);
  } else {
    WS_FUZZ_CHECK(w.version_buckets == 0, "version_buckets %u outside a ring", w.version_buckets);
  }
  u128 digests = 0;
  for (const wire::TensorPlacement& p : w.tensors) {
    WS_FUZZ_CHECK(p.region == wire::Region::kDirect || p.region == wire::Region::kSlot,
                  "unknown region accepted");
    if (p.region == wire::Region::kSlot) WS_FUZZ_CHECK(w.slot_count > 0, "slot tensor, no slots");
    WS_FUZZ_CHECK(u128{p.offset} + p.spec.nbytes <= RegionBytes(w, p.region),
                  "tensor outside its region");
    digests += plan::SegmentCount(p.spec.nbytes, w.segment_bytes);
  }
  WS_FUZZ_CHECK(digests <= wire::kMaxDigests, "more digests than a StepEnd can carry");
}

void CheckPlan(const wire::Welcome& w, const Destinations& dests, MatchPolicy policy,
               uint64_t bucket_bytes, bool convert, const plan::Plan& p) {
  std::vector<bool> dest_used(dests.specs.size(), false);
  u128 total = 0;
  u128 digest_count = 0;
  for (const wire::TensorPlacement& t : w.tensors) {
    digest_count += plan::SegmentCount(t.spec.nbytes, w.segment_bytes);
  }
  WS_FUZZ_CHECK(p.digest_count == digest_count, "digest_count %u", p.digest_count);

  uint32_t next_segment = 0;
  int64_t last_publisher = -1;
  uint64_t shadow_floor = 0;
  std::vector<bool> digest_used(p.digest_count, false);
  bool uses_slots = false, uses_direct = false;
  for (const plan::PlannedTensor& t : p.tensors) {
    WS_FUZZ_CHECK(t.publisher_index < w.tensors.size() && t.publisher_index > last_publisher,
                  "publisher index %u out of range or out of order", t.publisher_index);
    last_publisher = t.publisher_index;
    WS_FUZZ_CHECK(t.destination < dests.specs.size() && !dest_used[t.destination],
                  "destination %u out of range or planned twice", t.destination);
    dest_used[t.destination] = true;
    const wire::TensorPlacement& src = w.tensors[t.publisher_index];
    const TensorSpec& dst = dests.specs[t.destination];
    const bool converted = t.transform != plan::Transform::kCopy;
    WS_FUZZ_CHECK(src.spec.name == dst.name && src.spec.shape == dst.shape &&
                      t.nbytes == src.spec.nbytes &&
                      (converted ? t.transform == plan::TransformFor(src.spec.dtype, dst.dtype)
                                 : src.spec.dtype == dst.dtype && src.spec.nbytes == dst.nbytes),
                  "tensor %u planned onto a different destination", t.publisher_index);
    if (converted) {
      WS_FUZZ_CHECK(convert, "a transform planned with conversion off");
      WS_FUZZ_CHECK(u128{t.landing_offset} + t.nbytes <= p.landing_bytes,
                    "landing range of tensor %u outside the landing buffer", t.publisher_index);
      if (t.transform == plan::Transform::kQuantizeFp8) {
        WS_FUZZ_CHECK(t.scale_destination < dests.specs.size() && !dest_used[t.scale_destination],
                      "scale destination of tensor %u out of range or used twice",
                      t.publisher_index);
        dest_used[t.scale_destination] = true;
        WS_FUZZ_CHECK(static_cast<u128>(t.rows) * static_cast<u128>(t.cols) == u128{t.elements},
                      "fp8 matrix shape");
      }
    }
    uses_slots |= src.region == wire::Region::kSlot;
    uses_direct |= src.region == wire::Region::kDirect;
    total += t.nbytes;
    WS_FUZZ_CHECK(t.shadow_offset % 64 == 0 && t.shadow_offset >= shadow_floor &&
                      u128{t.shadow_offset} + t.nbytes <= p.shadow_bytes,
                  "shadow range of tensor %u misplaced", t.publisher_index);
    shadow_floor = t.shadow_offset + t.nbytes;
    WS_FUZZ_CHECK(t.first_segment == next_segment, "segments of tensor %u not contiguous",
                  t.publisher_index);
    uint64_t covered = 0;
    for (uint32_t i = 0; i < t.segment_count; ++i) {
      WS_FUZZ_CHECK(t.first_segment + i < p.segments.size(), "segment index past the end");
      const plan::Segment& s = p.segments[t.first_segment + i];
      WS_FUZZ_CHECK(s.bytes > 0 && s.bytes <= w.segment_bytes && s.dst_offset == covered &&
                        s.region == src.region && s.destination == t.destination &&
                        s.src_offset == src.offset + covered &&
                        s.shadow_offset == t.shadow_offset + covered && s.converted == converted &&
                        (!converted || s.landing_offset == t.landing_offset + covered),
                    "segment %u of tensor %u malformed", i, t.publisher_index);
      WS_FUZZ_CHECK(u128{s.src_offset} + s.bytes <= RegionBytes(w, s.region),
                    "segment reads outside its region");
      WS_FUZZ_CHECK(s.digest_index < p.digest_count && !digest_used[s.digest_index],
                    "digest index %u out of range or reused", s.digest_index);
      digest_used[s.digest_index] = true;
      covered += s.bytes;
    }
    WS_FUZZ_CHECK(covered == t.nbytes, "segments of tensor %u cover %llu of %llu bytes",
                  t.publisher_index, (unsigned long long)covered, (unsigned long long)t.nbytes);
    next_segment += t.segment_count;
  }
  WS_FUZZ_CHECK(next_segment == p.segments.size(), "segments outside any planned tensor");
  WS_FUZZ_CHECK(total == p.total_bytes, "total_bytes");
  WS_FUZZ_CHECK(uses_slots == p.uses_slots && uses_direct == p.uses_direct, "uses_* flags");
  for (size_t d = 0; d < dest_used.size(); ++d) {
    WS_FUZZ_CHECK(dest_used[d], "destination %zu left unplanned", d);
  }
  if (policy == MatchPolicy::kStrict) {
    WS_FUZZ_CHECK(p.tensors.size() == w.tensors.size(), "strict plan skipped a tensor");
  }
  size_t converted_count = 0;
  for (const plan::PlannedTensor& t : p.tensors)
    converted_count += t.transform != plan::Transform::kCopy;
  WS_FUZZ_CHECK(p.converted.size() == converted_count, "converted list");

  uint32_t expected_first = 0;
  for (const plan::Bucket& b : p.buckets) {
    WS_FUZZ_CHECK(b.first_segment == expected_first && b.segment_count > 0 &&
                      u128{b.first_segment} + b.segment_count <= p.segments.size(),
                  "bucket segments not contiguous");
    u128 bytes = 0;
    for (uint32_t i = 0; i < b.segment_count; ++i) bytes += p.segments[b.first_segment + i].bytes;
    WS_FUZZ_CHECK(bytes == b.bytes, "bucket bytes");
    WS_FUZZ_CHECK(b.segment_count == 1 || b.bytes <= bucket_bytes, "bucket over bucket_bytes");
    expected_first += b.segment_count;
  }
  WS_FUZZ_CHECK(expected_first == p.segments.size(), "buckets do not cover the segments");
}

// The copies a subscriber makes from a plan, into buffers of exactly the sizes it would have:
// reads from the mapped arena (shm: HostLanding in src/transport/path/host_landing.cc; a GPU
// arena is read at the same offsets), writes to the shadow buffer (staged) or the destinations
// (in place), and the commit from shadow to destinations. A tcp arena (ArenaKind::kNone) has
// nothing mapped: its bytes arrive on the connection, so only the writes are checked.
void ExecutePlan(const wire::Welcome& w, const Destinations& dests, const plan::Plan& p) {
  const bool mapped = w.arena_kind != wire::ArenaKind::kNone;
  if (mapped && w.arena_bytes > kMaxSimulatedArena) return;
  std::unique_ptr<uint8_t[]> arena(new uint8_t[mapped ? w.arena_bytes : 0]);
  if (mapped) std::memset(arena.get(), 0xA5, w.arena_bytes);
  std::vector<uint8_t> received(std::min<uint64_t>(w.segment_bytes, 1u << 20), 0x5A);
  std::vector<std::unique_ptr<uint8_t[]>> dst;
  for (const TensorSpec& s : dests.specs) dst.emplace_back(new uint8_t[s.nbytes]);
  std::unique_ptr<uint8_t[]> shadow(new uint8_t[p.shadow_bytes]);
  std::unique_ptr<uint8_t[]> landing(new uint8_t[p.landing_bytes]);
  // `n` bytes of segment `s`, `at` bytes into it, from `src`.
  auto land = [&](const plan::Segment& s, uint64_t at, const uint8_t* src, uint64_t n) {
    std::memcpy(shadow.get() + s.shadow_offset + at, src, n);  // staged
    uint8_t* in_place =
        s.converted ? landing.get() + s.landing_offset : dst[s.destination].get() + s.dst_offset;
    std::memcpy(in_place + at, src, n);  // in place
  };
  if (wire::IsRing(w.arena_kind)) {
    // As HostLanding::PrepareRing/CopyRingBucket: pieces cut at bucket edges, bucket b in the
    // ring slot ring_bucket_ready names (checked against slot_count; the publisher's b % count).
    for (const plan::Segment& s : p.segments) {
      WS_FUZZ_CHECK(s.region == wire::Region::kSlot, "a ring plan reads the direct region");
      for (uint64_t at = 0; at < s.bytes;) {
        const uint64_t pos = s.src_offset + at;
        const uint64_t b = pos / w.slot_bytes;
        WS_FUZZ_CHECK(b < w.version_buckets, "segment reads bucket %llu of %u",
                      (unsigned long long)b, w.version_buckets);
        const uint64_t n = std::min(s.bytes - at, (b + 1) * w.slot_bytes - pos);
        land(s, at,
             arena.get() + w.slots_offset + (b % w.slot_count) * w.slot_bytes +
                 (pos - b * w.slot_bytes),
             n);
        at += n;
      }
    }
  } else {
    // The subscriber reads the slot StepBegin names, which it checks against slot_count.
    const uint32_t slot = w.slot_count > 0 ? w.slot_count - 1 : 0;
    const uint64_t slot_base = w.slots_offset + uint64_t{slot} * w.slot_bytes;
    for (const plan::Bucket& b : p.buckets) {
      for (uint32_t i = 0; i < b.segment_count; ++i) {
        const plan::Segment& s = p.segments[b.first_segment + i];
        // A tcp segment is received into a buffer of segment size; bytes ≤ segment_bytes.
        if (!mapped && s.bytes > received.size()) continue;
        const uint8_t* src =
            mapped ? arena.get() + s.src_offset +
                         (s.region == wire::Region::kSlot ? slot_base : w.direct_offset)
                   : received.data();
        land(s, 0, src, s.bytes);
      }
    }
  }
  for (const plan::Segment& s : p.segments) {
    if (s.converted) continue;
    std::memcpy(dst[s.destination].get() + s.dst_offset, shadow.get() + s.shadow_offset, s.bytes);
  }
  // Conversions, from the shadow (staged) and from the landing buffer (in place).
  for (uint32_t k : p.converted) {
    const plan::PlannedTensor& t = p.tensors[k];
    for (const uint8_t* from : {shadow.get() + t.shadow_offset, landing.get() + t.landing_offset}) {
      if (t.transform == plan::Transform::kExtract) {  // regions: the pieces of a whole segment
        for (uint32_t e = 0; e < t.extract_count; ++e) {
          const plan::Extract& piece = p.extracts[t.first_extract + e];
          WS_FUZZ_CHECK(piece.offset + piece.bytes <= t.nbytes, "extract outside its segment");
          std::memcpy(dst[piece.destination].get() + piece.dst_offset, from + piece.offset,
                      piece.bytes);
        }
        continue;
      }
      Status s = t.transform == plan::Transform::kCast
                     ? weightsync::cuda::reference::Cast(
                           t.from, t.to, from, dst[t.destination].get() + t.dst_offset, t.elements)
                     : weightsync::cuda::reference::QuantizeFp8(
                           reinterpret_cast<const uint16_t*>(from), t.rows, t.cols,
                           dst[t.destination].get(), dst[t.scale_destination].get(),
                           t.e8m0_scales ? weightsync::cuda::Fp8ScaleFormat::kE8M0
                                         : weightsync::cuda::Fp8ScaleFormat::kFloat32);
      WS_FUZZ_CHECK(s.ok(), "planned conversion refused: %s", s.ToString().c_str());
    }
  }
}

// Regions from a hostile Welcome: every tensor (sharded or not) is held by this one publisher;
// a destination per tensor wants the middle half of its global tensor's rows (where that fits in
// 64 KiB). Whatever the schedule and BuildRegionPlan (with and without verification) accept must
// stay inside exactly-sized buffers when executed.
void FuzzRegions(const wire::Welcome& w, uint64_t bucket_bytes) {
  std::vector<plan::HeldTensor> held;
  Destinations dests;
  std::vector<plan::DestinationShape> shapes;
  std::vector<plan::WantedPiece> wanted;
  for (uint32_t i = 0; i < w.tensors.size() && i < 64; ++i) {
    const wire::TensorPlacement& p = w.tensors[i];
    plan::HeldTensor h{
        0,
        p.sharded ? p.shard.tensor : p.spec.name,
        p.spec.dtype,
        p.sharded ? p.shard.global_shape : p.spec.shape,
        {p.sharded ? p.shard.offset : std::vector<int64_t>(p.spec.shape.size(), 0), p.spec.shape}};
    held.push_back(h);
    const int bits = weightsync::Info(p.spec.dtype).bits;
    if (h.global_shape.empty() || bits % 8 != 0) continue;
    plan::Box box{std::vector<int64_t>(h.global_shape.size(), 0), h.global_shape};
    box.offset[0] = h.global_shape[0] / 4;
    box.extent[0] = h.global_shape[0] / 2;
    u128 bytes = bits / 8;
    for (int64_t e : box.extent) bytes *= static_cast<u128>(e);
    if (bytes > (64u << 10)) continue;
    TensorSpec spec{"d" + std::to_string(i), p.spec.dtype, box.extent,
                    static_cast<uint64_t>(bytes)};
    const uint32_t d = static_cast<uint32_t>(dests.specs.size());
    dests.specs.push_back(spec);
    plan::Destination dest;
    dest.spec = spec;
    dests.planned.push_back(dest);
    shapes.push_back({spec.name, spec.dtype, spec.shape});
    wanted.push_back({d, h.name, h.global_shape, box, std::vector<int64_t>(box.extent.size(), 0)});
  }
  auto schedule = plan::ScheduleRegions(held, shapes, wanted, 1);
  if (!schedule.ok()) {
    WS_FUZZ_CHECK(schedule.status().code() == StatusCode::kInvalidArgument, "%s",
                  schedule.status().ToString().c_str());
    return;
  }
  for (const plan::RegionCopy& c : schedule->copies) {
    WS_FUZZ_CHECK(c.held < held.size() && c.destination < dests.specs.size(),
                  "copy of held %u into destination %u", c.held, c.destination);
  }
  for (bool for_verify : {false, true}) {
    auto built =
        plan::BuildRegionPlan(w, dests.planned, schedule->copies, bucket_bytes, for_verify);
    WS_FUZZ_CHECK(built.ok(), "a schedule's copies were refused: %s",
                  built.status().ToString().c_str());
    WS_FUZZ_CHECK(!for_verify || built->verifiable, "a plan for verification is not verifiable");
    u128 moved = 0;
    for (const plan::PlannedTensor& t : built->tensors) moved += t.nbytes;
    WS_FUZZ_CHECK(moved == built->total_bytes, "total_bytes disagrees with the planned tensors");
    WS_FUZZ_CHECK(for_verify || built->total_bytes == schedule->total_bytes,
                  "a plain region plan moves other bytes than its schedule");
    ExecutePlan(w, dests, *built);
  }
}

void FuzzWelcome(std::span<const uint8_t> payload, uint8_t params) {
  wire::Welcome w;
  if (!RoundTrip(payload, &w)) return;
  Status layout = plan::ValidateLayout(w);
  if (!layout.ok()) {
    WS_FUZZ_CHECK(layout.code() == StatusCode::kProtocolError, "%s", layout.ToString().c_str());
    return;
  }
  CheckLayout(w);
  const uint64_t bucket_bytes = kBucketBytes[params % 4];
  const int set = (params / 4) % 3;
  const Destinations& dests = GetDestinations(set);
  const bool convert = set == 2;
  for (MatchPolicy policy : {MatchPolicy::kStrict, MatchPolicy::kSubset}) {
    auto built = plan::BuildPlan(w, dests.planned, policy, bucket_bytes,
                                 plan::ConvertOptions{convert, "_scale_inv"});
    if (!built.ok()) {
      const StatusCode code = built.status().code();
      WS_FUZZ_CHECK(code == StatusCode::kInvalidArgument || code == StatusCode::kProtocolError,
                    "%s", built.status().ToString().c_str());
      continue;
    }
    WS_FUZZ_CHECK(set != 1, "a destination set with a duplicate name was planned");
    CheckPlan(w, dests, policy, bucket_bytes, convert, *built);
    ExecutePlan(w, dests, *built);
  }
  FuzzRegions(w, bucket_bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t selector = data[0];
  std::span<const uint8_t> payload(data + 1, size - 1);
  switch (selector % 8) {
    case 0:
      if ((selector / 8) % 3 == 0) {
        FuzzSimple<wire::Hello>(payload);
      } else if ((selector / 8) % 3 == 1) {
        FuzzSimple<wire::Redirect>(payload);
      } else {
        FuzzSimple<wire::MembersReport>(payload);
      }
      break;
    case 1:
      FuzzWelcome(payload, static_cast<uint8_t>(selector / 8));
      break;
    case 2:
      FuzzSimple<wire::UpdateRequest>(payload);
      break;
    case 3:
      FuzzSimple<wire::StepBegin>(payload);
      break;
    case 4:
      FuzzSimple<wire::CopyDone>(payload);
      break;
    case 5:
      if ((selector / 8) % 2 == 0) {
        FuzzSimple<wire::StepEnd>(payload);
      } else {
        FuzzSimple<wire::DeltaBegin>(payload);
      }
      break;
    case 6: {
      wire::ErrorMessage m;
      if (RoundTrip(payload, &m)) {
        Status s = wire::ToStatus(m);
        WS_FUZZ_CHECK(!s.ok() && s.code() == m.code, "ToStatus of a decoded error: %s",
                      s.ToString().c_str());
      }
      break;
    }
    case 7:
      FuzzSimple<wire::RingBucket>(payload);
      break;
  }
  return 0;
}
