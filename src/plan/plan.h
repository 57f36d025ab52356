// The static plan: which publisher bytes go to which destination bytes, cut into digest segments
// and grouped into buckets (the unit of parallel copy work). Built once per transfer handle; the
// hot path only walks its arrays.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "weightsync/manifest.h"
#include "weightsync/options.h"
#include "weightsync/status.h"
#include "weightsync/tensor_view.h"
#include "wire/messages.h"

namespace weightsync::plan {

inline constexpr uint32_t kNoDestination = 0xFFFFFFFFu;

// One registered destination tensor on the subscriber side.
struct Destination {
  TensorSpec spec;
  uint8_t* data = nullptr;
  Device device;  // host or a CUDA device; the transport decides what it can reach
  // An index into the same destination list: this tensor is the same memory, dtype and shape as
  // that one (tied weights). It is never written itself — writing the other writes it — so a
  // step moves its bytes once; where its name is published it must still match.
  uint32_t alias_of = kNoDestination;
  // Regions of global tensors that fill it (Subscriber registration, every field completed:
  // tensor, extent and at set); empty: the whole tensor `spec.name`.
  std::vector<RegionPart> regions;
  // Block-scaled quantized weights (MXFP8, NVFP4); kNone: the dtypes decide the transform.
  Quantization quantization;
};

// How a planned tensor's published bytes become its destination's (SubscriberOptions::
// convert_dtypes). The bytes move as published; the transform runs on the subscriber, from the
// staging buffer (staged) or the landing buffer (in place) into the destination, after verifying.
enum class Transform : uint8_t {
  kCopy,         // same dtype: the bytes as published
  kCast,         // one of float32/float16/bfloat16 to another (round to nearest even)
  kQuantizeFp8,  // bfloat16 → float8_e4m3fn, one scale per 128×128 block into a second tensor
  // bfloat16/float32 → a block-scaled format the destination names (Quantization): MXFP8 (e8m0
  // scale per 32 elements of a row) or NVFP4 (e4m3 scale per 16, and a float32 global scale).
  kQuantizeMxfp8,
  kQuantizeNvfp4,
  // Regions with verification: a digest segment the subscriber wants only part of (or scattered
  // over several destinations) is received whole, verified, and its wanted pieces (Extract) are
  // copied (or cast) out at commit.
  kExtract,
};
const char* TransformName(Transform t);
inline bool IsBlockScaled(Transform t) {
  return t == Transform::kQuantizeMxfp8 || t == Transform::kQuantizeNvfp4;
}
// The transform that turns `from` into `to`; kCopy when none is needed or none exists.
Transform TransformFor(DType from, DType to);

struct ConvertOptions {
  bool enabled = false;                     // off: any dtype difference is a mismatch
  std::string scale_suffix = "_scale_inv";  // fp8: scales go to destination NAME + suffix
  // In place over cuda-ipc: run the conversions on the publisher's GPU when this process can
  // (SubscriberOptions::convert_on_publisher_gpu).
  bool on_publisher_gpu = false;
};

// A contiguous byte range of one tensor, ≤ segment_bytes, covered by one publisher digest.
struct Segment {
  wire::Region region = wire::Region::kSlot;
  uint64_t src_offset = 0;     // from the region's base (direct region or the version's slot)
  uint32_t destination = 0;    // index into the destinations passed to BuildPlan
  uint64_t dst_offset = 0;     // byte offset inside that destination tensor
  uint64_t shadow_offset = 0;  // byte offset inside the staged shadow buffer
  uint64_t bytes = 0;
  uint32_t digest_index = 0;    // index into StepEnd::digests
  bool converted = false;       // its tensor has a transform: in place, it lands in the landing
  uint64_t landing_offset = 0;  // buffer at this offset instead of in the destination
};

// Consecutive segments copied by one worker in one go.
struct Bucket {
  uint32_t first_segment = 0;
  uint32_t segment_count = 0;
  uint64_t bytes = 0;
};

// A planned tensor is a contiguous range of one published tensor copied to a contiguous range of
// one destination: the whole tensor into the whole destination without regions; with regions
// (BuildRegionPlan) a run of one region's copy, or a kExtract digest segment.
struct PlannedTensor {
  uint32_t publisher_index = 0;  // index into Welcome::tensors
  uint32_t destination = 0;      // index into destinations
  uint64_t src_offset = 0;       // bytes into the published tensor
  uint64_t dst_offset = 0;       // bytes into the destination
  uint64_t nbytes = 0;
  uint64_t shadow_offset = 0;
  uint32_t first_segment = 0;
  uint32_t segment_count = 0;
  // Conversions (kCopy for none).
  Transform transform = Transform::kCopy;
  DType from = DType::kUInt8;  // published dtype
  DType to = DType::kUInt8;    // destination dtype
  uint64_t elements = 0;
  int64_t rows = 0, cols = 0;  // kQuantizeFp8: cols = last dimension, rows = the rest
  uint32_t scale_destination = kNoDestination;  // kQuantizeFp8: index into destinations
  bool e8m0_scales = false;                     // kQuantizeFp8: power-of-two scales (else float32)
  Quantization::ScaleLayout scale_layout = Quantization::ScaleLayout::kRowMajor;  // MXFP8, NVFP4
  uint32_t global_scale_destination = kNoDestination;                             // NVFP4
  uint64_t landing_offset = 0;  // converted tensors: offset in the in-place landing buffer
  uint32_t first_extract = 0;   // kExtract: its pieces in Plan::extracts
  uint32_t extract_count = 0;
};

// A piece of a kExtract tensor: `bytes` at `offset` of what landed go to `destination` at
// `dst_offset`, cast to `to` when that is not the published dtype.
struct Extract {
  uint64_t offset = 0;
  uint32_t destination = 0;
  uint64_t dst_offset = 0;
  uint64_t bytes = 0;
  DType to = DType::kUInt8;
};

struct Plan {
  std::vector<PlannedTensor> tensors;  // in publisher manifest order
  std::vector<Segment> segments;       // in publisher manifest order
  std::vector<Bucket> buckets;
  uint64_t total_bytes = 0;         // bytes moved per step
  uint64_t shadow_bytes = 0;        // staged shadow buffer size (tensors 64-byte aligned)
  uint64_t landing_bytes = 0;       // in-place landing buffer size (converted tensors only)
  std::vector<uint32_t> converted;  // indices into `tensors` with a transform
  uint32_t digest_count = 0;        // digests the publisher sends per step (all its tensors)
  bool uses_slots = false;          // some planned tensor lives in a slot
  bool uses_direct = false;         // some planned tensor lives in the direct region
  // Regions (BuildRegionPlan): planned tensors are runs of published tensors, not whole ones.
  bool regions = false;
  // Every segment is a whole publisher digest segment, so Verify can check it. Always true
  // without regions; with regions, only for a plan built for verification (or one that happens to
  // read only whole segments).
  bool verifiable = true;
  std::vector<Extract> extracts;   // kExtract pieces
  uint32_t destination_count = 0;  // distinct destinations written (UpdateStats::tensors)
};

// What a plan converts every step (UpdateStats::converted_*): its tensors with a transform — a
// kExtract one only when a piece changes dtype — and the bytes they are published in.
struct ConvertedFootprint {
  uint32_t tensors = 0;
  uint64_t bytes = 0;
};
ConvertedFootprint ConvertedOf(const Plan& plan);

// Checks a Welcome against itself: regions inside the arena, every placement inside its region,
// segment_bytes > 0, slot_count ≥ 1 when any tensor is in a slot. ProtocolError names the tensor,
// the field and both values.
Status ValidateLayout(const wire::Welcome& welcome);

// Tied weights in a publisher's layout: for each of its tensors, the index of the earlier one whose
// bytes it is (same region, offset, dtype and shape, not empty, neither a shard), or -1. The
// publisher places a tensor registered under a second name at its original's offset, so the
// match is exact. Requires ValidateLayout(welcome).
std::vector<int64_t> PublishedAliases(const wire::Welcome& welcome);

// kCudaIpc stores: the index of the publisher allocation holding [offset, offset + bytes) of the
// direct region, or -1 (ValidateLayout checked that every tensor has one).
int64_t AllocationHolding(const wire::Welcome& welcome, uint64_t offset, uint64_t bytes);

// kCudaIpc stores: how many fd chunks the Welcome's kPosixFdChunks allocations have in all (the
// AllocationFd frames that follow it).
uint32_t AllocationFdCount(const wire::Welcome& welcome);

// FailedPrecondition unless every segment of `plan` is a whole publisher digest segment (a region
// plan built without verification may read parts of them): what every Verify checks first. The
// subscriber prepares a verifiable plan before it asks for verification, so this is a bug guard.
Status CheckVerifiable(const Plan& plan, int64_t step);

// Number of segments of a tensor of `nbytes` (0 for an empty tensor).
uint64_t SegmentCount(uint64_t nbytes, uint64_t segment_bytes);

// Matches the publisher's placements with the subscriber's destinations. InvalidArgument lists
// every mismatch, one per line: missing on either side (subset policy allows publisher extras),
// dtype, shape. Requires ValidateLayout(welcome) to have passed.
// Buckets hold consecutive segments totalling about `bucket_bytes` (a single larger segment forms
// its own bucket).
// With `convert` enabled, a dtype difference that a Transform covers is planned instead of
// reported; fp8 also needs the scale destination (float32 or float8_e8m0fnu, shape
// [ceil(rows/128), ceil(cols/128)]), and any problem with it is listed too.
Result<Plan> BuildPlan(const wire::Welcome& welcome, const std::vector<Destination>& destinations,
                       MatchPolicy policy, uint64_t bucket_bytes,
                       const ConvertOptions& convert = {});

}  // namespace weightsync::plan
