// Tests for the static plan: layout validation of a publisher's Welcome, manifest matching with
// its all-problems-in-one-error report, segment cutting, digest indexing and bucket grouping.

#include "plan/plan.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "testing/status_matchers.h"

namespace weightsync::plan {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

// Bytes of a tensor of the few dtypes these tests use, computed here rather than through
// ByteSize() so that a bug there cannot hide one in the plan.
uint64_t Bytes(DType dtype, const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  switch (dtype) {
    case DType::kUInt8:
      return n;
    case DType::kBFloat16:
      return 2 * n;
    case DType::kFloat32:
      return 4 * n;
    default:
      ADD_FAILURE() << "test helper does not know this dtype";
      return 0;
  }
}

TensorSpec Spec(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  TensorSpec s;
  s.name = name;
  s.dtype = dtype;
  s.shape = std::move(shape);
  s.nbytes = Bytes(s.dtype, s.shape);
  return s;
}

// A byte tensor of `n` bytes.
TensorSpec Raw(const std::string& name, uint64_t n) {
  return Spec(name, DType::kUInt8, {static_cast<int64_t>(n)});
}

// Builds a valid Welcome: direct tensors packed from the arena start, then `slot_count` slots
// just large enough for the slot tensors, packed in the order added.
class WelcomeBuilder {
 public:
  explicit WelcomeBuilder(uint64_t segment_bytes) { w_.segment_bytes = segment_bytes; }

  WelcomeBuilder& Add(TensorSpec spec, wire::Region region = wire::Region::kSlot) {
    uint64_t* used = region == wire::Region::kDirect ? &direct_used_ : &slot_used_;
    wire::TensorPlacement p;
    p.spec = std::move(spec);
    p.region = region;
    p.offset = *used;
    *used += p.spec.nbytes;
    w_.tensors.push_back(std::move(p));
    return *this;
  }

  wire::Welcome Build(uint32_t slot_count = 2) const {
    wire::Welcome w = w_;
    w.session_id = 7;
    w.direct_offset = 0;
    w.direct_bytes = direct_used_;
    w.slots_offset = direct_used_;
    w.slot_bytes = slot_used_;
    w.slot_count = slot_count;
    w.arena_bytes = w.slots_offset + w.slot_bytes * w.slot_count;
    return w;
  }

 private:
  wire::Welcome w_;
  uint64_t direct_used_ = 0;
  uint64_t slot_used_ = 0;
};

std::vector<Destination> Destinations(const std::vector<TensorSpec>& specs) {
  std::vector<Destination> out;
  for (const TensorSpec& s : specs) out.push_back(Destination{s, nullptr});
  return out;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

#define EXPECT_CONTAINS(haystack, needle)                          \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "expected to find \"" << (needle) << "\" in:\n"           \
      << (haystack)

// ---------------------------------------------------------------------------------------------
// SegmentCount

TEST(SegmentCountTest, RoundsUpAndHandlesEmptyAndHugeTensors) {
  EXPECT_EQ(SegmentCount(0, 8), 0u);
  EXPECT_EQ(SegmentCount(1, 8), 1u);
  EXPECT_EQ(SegmentCount(8, 8), 1u);
  EXPECT_EQ(SegmentCount(9, 8), 2u);
  EXPECT_EQ(SegmentCount(20 * kMiB, 8 * kMiB), 3u);
  EXPECT_EQ(SegmentCount(16 * kMiB, 8 * kMiB), 2u);
  // nbytes + segment_bytes - 1 would wrap here.
  EXPECT_EQ(SegmentCount(kU64Max, 1ull << 63), 2u);
  EXPECT_EQ(SegmentCount(kU64Max, kU64Max), 1u);
}

// ---------------------------------------------------------------------------------------------
// ValidateLayout

wire::Welcome ValidWelcome() {
  return WelcomeBuilder(4096)
      .Add(Raw("embed", 10000), wire::Region::kDirect)
      .Add(Raw("w1", 6000))
      .Add(Raw("w2", 123))
      .Add(Raw("empty", 0))
      .Build();
}

TEST(ValidateLayoutTest, AcceptsValidLayoutIncludingTensorsEndingAtRegionEnd) {
  wire::Welcome w = ValidWelcome();
  // The last slot tensor ends exactly at slot_bytes, the direct one exactly at direct_bytes, and
  // the last slot ends exactly at arena_bytes.
  ASSERT_EQ(w.tensors[2].offset + w.tensors[2].spec.nbytes, w.slot_bytes);
  ASSERT_EQ(w.tensors[0].spec.nbytes, w.direct_bytes);
  Status s = ValidateLayout(w);
  EXPECT_TRUE(s.ok()) << s;
}

// A ring: tensors lie in a version of version_buckets × slot_bytes, longer than one slot.
TEST(ValidateLayoutTest, ARingHoldsTensorsAcrossItsBucketsAndIsCheckedAsARing) {
  wire::Welcome w = WelcomeBuilder(4096).Add(Raw("w1", 6000)).Add(Raw("w2", 123)).Build();
  w.arena_kind = wire::ArenaKind::kHostRing;
  const uint64_t version = w.slot_bytes;
  w.slot_bytes = 1024;
  w.slot_count = 2;
  w.version_buckets = static_cast<uint32_t>((version + 1023) / 1024);
  w.arena_bytes = w.slots_offset + 2 * 1024;
  ASSERT_OK(ValidateLayout(w));
  wire::Welcome shorter = w;
  --shorter.version_buckets;
  EXPECT_STATUS_IS(kProtocolError, ValidateLayout(shorter), "exceeds slot size");
  wire::Welcome one_slot = w;
  one_slot.slot_count = 1;
  EXPECT_STATUS_IS(kProtocolError, ValidateLayout(one_slot), "2 or more slots");
  wire::Welcome empty_slots = w;
  empty_slots.slot_bytes = 0;
  EXPECT_STATUS_IS(kProtocolError, ValidateLayout(empty_slots), "2 or more slots of > 0 bytes");
  wire::Welcome no_buckets = w;
  no_buckets.version_buckets = 0;
  EXPECT_STATUS_IS(kProtocolError, ValidateLayout(no_buckets), "version_buckets 0");
  wire::Welcome direct = w;
  direct.direct_bytes = 64;
  EXPECT_STATUS_IS(kProtocolError, ValidateLayout(direct), "direct region");
  wire::Welcome huge = w;
  huge.slot_bytes = uint64_t{1} << 62;
  huge.arena_bytes = ~uint64_t{0};
  huge.slots_offset = 0;
  huge.version_buckets = 8;
  EXPECT_STATUS_IS(kProtocolError, ValidateLayout(huge), "overflows");
  // One bucket past the tensors is the publisher's padding; more would only cost the subscriber
  // batches and round trips (2^24 of them from a hostile Welcome).
  wire::Welcome padded = w;
  ++padded.version_buckets;
  ASSERT_OK(ValidateLayout(padded));
  wire::Welcome longer = padded;
  ++longer.version_buckets;
  EXPECT_STATUS_IS(kProtocolError, ValidateLayout(longer), "buckets of 1024 bytes",
                   "tensors end at byte");
}

TEST(ValidateLayoutTest, AcceptsEmptyWelcome) {
  wire::Welcome w;
  w.segment_bytes = 1;
  Status s = ValidateLayout(w);
  EXPECT_TRUE(s.ok()) << s;
}

TEST(ValidateLayoutTest, RejectsZeroSegmentBytes) {
  wire::Welcome w = ValidWelcome();
  w.segment_bytes = 0;
  Status s = ValidateLayout(w);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "segment_bytes");
}

TEST(ValidateLayoutTest, RejectsSlotOffsetPastRegionEnd) {
  wire::Welcome w = WelcomeBuilder(4096).Add(Raw("w1", 4096)).Build();
  w.slot_bytes = 6000;
  w.arena_bytes = w.slot_bytes * w.slot_count;
  w.tensors[0].offset = 4096;  // [4096, 8192) in a 6000-byte slot
  Status s = ValidateLayout(w);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_EQ(s.message(), "welcome: tensor 'w1' slot range [4096, 8192) exceeds slot size 6000");
}

TEST(ValidateLayoutTest, RejectsDirectOffsetPastRegionEnd) {
  wire::Welcome w = ValidWelcome();
  w.tensors[0].offset = 1;  // one byte past the direct region's end
  Status s = ValidateLayout(w);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "tensor 'embed' direct range [1, 10001) exceeds direct size 10000");
}

TEST(ValidateLayoutTest, RejectsEmptyTensorOffsetPastRegionEnd) {
  wire::Welcome w = ValidWelcome();
  w.tensors[3].offset = w.slot_bytes + 1;
  Status s = ValidateLayout(w);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "tensor 'empty'");
}

TEST(ValidateLayoutTest, RejectsOffsetPlusNbytesOverflow) {
  wire::Welcome w = ValidWelcome();
  // Wraps to a small value that would pass a naive end <= slot_bytes check.
  w.tensors[1].offset = kU64Max - 100;
  Status s = ValidateLayout(w);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "tensor 'w1'");
  EXPECT_CONTAINS(s.message(), "overflows");
  EXPECT_CONTAINS(s.message(), std::to_string(kU64Max - 100));
}

TEST(ValidateLayoutTest, RejectsDirectRegionOutsideArena) {
  wire::Welcome w = ValidWelcome();
  w.direct_offset = w.arena_bytes - 100;
  Status s = ValidateLayout(w);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "direct region");
  EXPECT_CONTAINS(s.message(), "arena size " + std::to_string(w.arena_bytes));
}

// A GPU arena or ring holds registered tensors in its slots only: a direct region in such a
// layout is refused at the Welcome, before any path maps or receives anything.
TEST(ValidateLayoutTest, RejectsADirectRegionInAGpuArenaOrRing) {
  for (wire::ArenaKind kind : {wire::ArenaKind::kCudaMem, wire::ArenaKind::kCudaRing}) {
    wire::Welcome w = ValidWelcome();
    w.arena_kind = kind;
    if (wire::IsRing(kind)) w.version_buckets = 1;
    Status s = ValidateLayout(w);
    EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
    EXPECT_CONTAINS(s.message(), std::string("welcome: a GPU ") +
                                     (wire::IsRing(kind) ? "ring" : "arena") +
                                     " with a direct region of 10000 bytes");
  }
  wire::Welcome host = ValidWelcome();  // a host arena holds Allocate()d tensors there
  EXPECT_TRUE(ValidateLayout(host).ok());
}

TEST(ValidateLayoutTest, RejectsDirectRegionOffsetOverflow) {
  wire::Welcome w = ValidWelcome();
  w.direct_offset = kU64Max - 5;
  Status s = ValidateLayout(w);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "direct region");
  EXPECT_CONTAINS(s.message(), "overflows");
}

TEST(ValidateLayoutTest, RejectsSlotsOutsideArena) {
  wire::Welcome w = ValidWelcome();
  w.arena_bytes -= 1;  // the last slot's final byte now lies outside the arena
  Status s = ValidateLayout(w);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "slots region");
  EXPECT_CONTAINS(s.message(), "arena size " + std::to_string(w.arena_bytes));
}

TEST(ValidateLayoutTest, RejectsSlotBytesTimesSlotCountOverflow) {
  wire::Welcome w = ValidWelcome();
  w.slot_bytes = 1ull << 60;
  w.slot_count = 32;  // 2^65: wraps to 0, which a naive product would accept
  w.arena_bytes = kU64Max;
  Status s = ValidateLayout(w);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "slot_bytes " + std::to_string(1ull << 60));
  EXPECT_CONTAINS(s.message(), "slot_count 32");
  EXPECT_CONTAINS(s.message(), "overflows");
}

TEST(ValidateLayoutTest, RejectsSlotsOffsetPlusSizeOverflow) {
  wire::Welcome w = ValidWelcome();
  w.slots_offset = kU64Max - 10;
  w.arena_bytes = kU64Max;
  Status s = ValidateLayout(w);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "slots region");
  EXPECT_CONTAINS(s.message(), "overflows");
}

TEST(ValidateLayoutTest, RejectsSlotTensorWithoutSlots) {
  wire::Welcome w = ValidWelcome();
  w.slot_count = 0;
  Status s = ValidateLayout(w);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "tensor 'w1'");
  EXPECT_CONTAINS(s.message(), "slot_count is 0");
}

TEST(ValidateLayoutTest, AcceptsNoSlotsWhenAllTensorsAreDirect) {
  wire::Welcome w = WelcomeBuilder(64).Add(Raw("a", 100), wire::Region::kDirect).Build(0);
  w.slots_offset = 12345678;  // ignored: no slots
  Status s = ValidateLayout(w);
  EXPECT_TRUE(s.ok()) << s;
}

TEST(ValidateLayoutTest, RejectsTooManySlots) {
  wire::Welcome w = ValidWelcome();
  w.slot_count = wire::kMaxSlots + 1;
  w.arena_bytes = w.slots_offset + w.slot_bytes * w.slot_count;
  Status s = ValidateLayout(w);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "slot_count " + std::to_string(wire::kMaxSlots + 1));
}

TEST(ValidateLayoutTest, RejectsUnknownRegion) {
  wire::Welcome w = ValidWelcome();
  w.tensors[2].region = static_cast<wire::Region>(9);
  Status s = ValidateLayout(w);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "tensor 'w2' region 9");
}

TEST(ValidateLayoutTest, RejectsDuplicateNames) {
  wire::Welcome w = ValidWelcome();
  w.tensors[3].spec.name = "w1";
  Status s = ValidateLayout(w);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "tensor 'w1' appears twice (indices 1 and 3)");
}

TEST(ValidateLayoutTest, RejectsMoreDigestsThanStepEndCarries) {
  // One byte per segment: a 2^24 + 1 byte tensor needs one digest more than StepEnd may carry.
  wire::Welcome w = WelcomeBuilder(1).Add(Raw("big", wire::kMaxDigests + 1ull)).Build();
  Status s = ValidateLayout(w);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "'big'");
  EXPECT_CONTAINS(s.message(), std::to_string(wire::kMaxDigests));

  wire::Welcome ok = WelcomeBuilder(1).Add(Raw("big", wire::kMaxDigests)).Build();
  Status s2 = ValidateLayout(ok);
  EXPECT_TRUE(s2.ok()) << s2;
}

// A zero-copy publisher's layout: its tensors in a direct region where each of its CUDA
// allocations has a range (two allocations, a gap between them).
wire::Welcome ZeroCopyWelcome() {
  wire::Welcome w = WelcomeBuilder(4096)
                        .Add(Raw("a0", 1000), wire::Region::kDirect)
                        .Add(Raw("a1", 3000), wire::Region::kDirect)
                        .Add(Raw("empty", 0), wire::Region::kDirect)
                        .Build(2);
  w.arena_kind = wire::ArenaKind::kCudaIpc;
  w.slot_bytes = 0;
  w.tensors[1].offset = 8192;  // the second allocation
  w.tensors[2].offset = 0;
  w.direct_bytes = w.arena_bytes = 8192 + 4096;
  w.allocations = {{0, 4096, {}}, {8192, 4096, {}}};
  return w;
}

TEST(ValidateLayoutTest, AcceptsZeroCopyAllocationsAndFindsEachTensorsAllocation) {
  const wire::Welcome w = ZeroCopyWelcome();
  Status s = ValidateLayout(w);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(AllocationHolding(w, 0, 1000), 0);
  EXPECT_EQ(AllocationHolding(w, 8192, 3000), 1);
  EXPECT_EQ(AllocationHolding(w, 8192 + 4095, 1), 1);
  EXPECT_EQ(AllocationHolding(w, 4000, 200), -1) << "past the end of allocation 0";
  EXPECT_EQ(AllocationHolding(w, 5000, 1), -1) << "in the gap";
  EXPECT_EQ(AllocationHolding(w, 8192 + 4096, 1), -1) << "past the last allocation";
}

TEST(ValidateLayoutTest, RejectsZeroCopyAllocationsThatOverlapOrLeaveATensorOut) {
  wire::Welcome overlap = ZeroCopyWelcome();
  overlap.allocations[1].offset = 4000;
  overlap.tensors[1].offset = 4000;
  Status s = ValidateLayout(overlap);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "allocation 1 at 4000 overlaps");

  wire::Welcome outside = ZeroCopyWelcome();
  outside.allocations[1].bytes = 8192;  // past the direct region
  s = ValidateLayout(outside);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "allocation 1");
  EXPECT_CONTAINS(s.message(), "exceeds direct region size");

  wire::Welcome stray = ZeroCopyWelcome();
  stray.tensors[1].offset = 4096;  // in the gap between the allocations
  s = ValidateLayout(stray);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "tensor 'a1' [4096, 7096) lies in none");

  wire::Welcome slot = ZeroCopyWelcome();
  slot.tensors[0].region = wire::Region::kSlot;  // inside allocation 0, but not a direct tensor
  slot.slot_bytes = 4096;  // (a slot it fits in: the layout is otherwise valid)
  slot.slots_offset = 0;
  s = ValidateLayout(slot);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "tensor 'a0' [0, 1000) lies in none");

  wire::Welcome empty = ZeroCopyWelcome();
  empty.allocations[0].bytes = 0;
  s = ValidateLayout(empty);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "allocation 0 is empty");

  wire::Welcome wraps = ZeroCopyWelcome();
  wraps.allocations[1].bytes = ~uint64_t{0} - 100;  // offset + bytes wraps around
  s = ValidateLayout(wraps);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "overflows uint64");

  wire::Welcome many = ZeroCopyWelcome();  // more allocations than tensors: each is opened
  many.allocations = {{0, 1024, {}}, {1024, 1024, {}}, {2048, 1024, {}}, {8192, 4096, {}}};
  s = ValidateLayout(many);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "4 CUDA IPC allocations for 3 tensors");

  wire::Welcome arena = ValidWelcome();
  arena.allocations = {{0, 16, {}}};
  s = ValidateLayout(arena);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "CUDA IPC allocations in a store of another kind");
}

// A zero-copy publisher serving over tcp exports nothing: its layout lists no allocation (NCCL
// reads its tensors on its side) and is valid as long as the tensors fit the direct region. A
// local subscriber refuses that form (ChoosePath: tests/transport/path_table_test.cc).
TEST(ValidateLayoutTest, AcceptsAZeroCopyLayoutWithoutAllocationsForTcp) {
  wire::Welcome w = ZeroCopyWelcome();
  w.allocations.clear();
  Status s = ValidateLayout(w);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(AllocationFdCount(w), 0u);

  w.tensors[1].offset = 8192 + 2000;  // 3000 bytes: past the direct region's 12288
  s = ValidateLayout(w);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "tensor 'a1'");
  EXPECT_CONTAINS(s.message(), "exceeds direct size 12288");
}

// A cuMem allocation's chunks are mapped back to back by the subscriber: they must tile it.
TEST(ValidateLayoutTest, ChecksThatFdChunksTileTheirAllocation) {
  wire::Welcome w = ZeroCopyWelcome();
  w.allocations[1].kind = wire::AllocationKind::kPosixFdChunks;
  w.allocations[1].chunk_bytes = {2048, 1024, 1024};
  Status s = ValidateLayout(w);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(AllocationFdCount(w), 3u);

  wire::Welcome short_chunks = w;
  short_chunks.allocations[1].chunk_bytes = {2048, 1024};
  s = ValidateLayout(short_chunks);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "allocation 1 has 4096 bytes but its 2 chunks hold 3072");

  wire::Welcome none = w;
  none.allocations[1].chunk_bytes.clear();
  s = ValidateLayout(none);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
  EXPECT_CONTAINS(s.message(), "its 0 chunks hold 0");

  for (std::vector<uint64_t> bad : {std::vector<uint64_t>{2048, 0, 2048},
                                    std::vector<uint64_t>{2048, ~uint64_t{0} - 1000, 1}}) {
    wire::Welcome hostile = w;
    hostile.allocations[1].chunk_bytes = bad;
    s = ValidateLayout(hostile);
    EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
    EXPECT_CONTAINS(s.message(), "allocation 1 chunk 1");
    EXPECT_CONTAINS(s.message(), "is empty or runs past its 4096 bytes");
  }
}

// ---------------------------------------------------------------------------------------------
// BuildPlan: matching

TEST(BuildPlanTest, ListsEveryMismatchInOneError) {
  wire::Welcome w = WelcomeBuilder(1024)
                        .Add(Spec("ok", DType::kFloat32, {16}))
                        .Add(Spec("proj", DType::kBFloat16, {4, 8}))
                        .Add(Spec("norm", DType::kFloat32, {4, 8}))
                        .Add(Spec("lm_head", DType::kFloat32, {8}))
                        .Build();
  // proj's dtype differs, norm's shape differs, lm_head is missing on the subscriber side.
  std::vector<Destination> dst =
      Destinations({Spec("ok", DType::kFloat32, {16}), Spec("proj", DType::kFloat32, {4, 8}),
                    Spec("norm", DType::kFloat32, {4, 9})});
  Result<Plan> r = BuildPlan(w, dst, MatchPolicy::kStrict, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  const std::string& msg = r.status().message();
  std::vector<std::string> lines = Lines(msg);
  ASSERT_EQ(lines.size(), 4u) << msg;
  EXPECT_EQ(lines[0], "plan: 3 mismatches between publisher and subscriber manifests:");
  // Publisher manifest order.
  EXPECT_CONTAINS(lines[1],
                  "tensor 'proj': dtype mismatch: publisher bfloat16, subscriber float32");
  EXPECT_CONTAINS(lines[2], "tensor 'norm': shape mismatch: publisher [4, 8], subscriber [4, 9]");
  EXPECT_CONTAINS(lines[3], "tensor 'lm_head'");
  EXPECT_CONTAINS(lines[3], "not registered by subscriber");
  EXPECT_EQ(msg.find("'ok'"), std::string::npos) << msg;
}

TEST(BuildPlanTest, StrictReportsSubscriberOnlyNamesAfterPublisherOrder) {
  wire::Welcome w = WelcomeBuilder(1024).Add(Raw("a", 10)).Add(Raw("b", 10)).Build();
  std::vector<Destination> dst = Destinations({Raw("z", 10), Raw("a", 10), Raw("y", 10)});
  Result<Plan> r = BuildPlan(w, dst, MatchPolicy::kStrict, 0);
  ASSERT_FALSE(r.ok());
  std::vector<std::string> lines = Lines(r.status().message());
  ASSERT_EQ(lines.size(), 4u) << r.status();
  EXPECT_CONTAINS(lines[0], "3 mismatches");
  EXPECT_CONTAINS(lines[1], "tensor 'b': published but not registered by subscriber");
  EXPECT_CONTAINS(lines[2], "tensor 'z': registered by subscriber but not published");
  EXPECT_CONTAINS(lines[3], "tensor 'y': registered by subscriber but not published");
}

TEST(BuildPlanTest, SubsetIgnoresPublisherExtras) {
  wire::Welcome w =
      WelcomeBuilder(1024).Add(Raw("a", 10)).Add(Raw("b", 20)).Add(Raw("c", 30)).Build();
  Result<Plan> r = BuildPlan(w, Destinations({Raw("b", 20)}), MatchPolicy::kSubset, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->tensors.size(), 1u);
  EXPECT_EQ(r->tensors[0].publisher_index, 1u);
  EXPECT_EQ(r->tensors[0].destination, 0u);
  EXPECT_EQ(r->total_bytes, 20u);
  EXPECT_EQ(r->digest_count, 3u);  // the publisher still hashes a, b and c

  // Strict refuses the same pair, naming both extras.
  Result<Plan> strict = BuildPlan(w, Destinations({Raw("b", 20)}), MatchPolicy::kStrict, 0);
  ASSERT_FALSE(strict.ok());
  EXPECT_CONTAINS(strict.status().message(), "2 mismatches");
  EXPECT_CONTAINS(strict.status().message(), "'a'");
  EXPECT_CONTAINS(strict.status().message(), "'c'");
}

TEST(BuildPlanTest, SubsetStillReportsSubscriberOnlyNames) {
  wire::Welcome w =
      WelcomeBuilder(1024).Add(Raw("a", 10)).Add(Raw("b", 20)).Add(Raw("c", 30)).Build();
  Result<Plan> r =
      BuildPlan(w, Destinations({Raw("b", 20), Raw("ghost", 4)}), MatchPolicy::kSubset, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  const std::string& msg = r.status().message();
  EXPECT_CONTAINS(msg, "plan: 1 mismatch between");
  EXPECT_CONTAINS(msg, "tensor 'ghost': registered by subscriber but not published");
  EXPECT_EQ(msg.find("'a'"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("'c'"), std::string::npos) << msg;
}

TEST(BuildPlanTest, ReportsByteSizeMismatchWhenDtypeAndShapeAgree) {
  wire::Welcome w = WelcomeBuilder(1024).Add(Raw("a", 10)).Build();
  std::vector<Destination> dst = Destinations({Raw("a", 10)});
  dst[0].spec.nbytes = 8;  // a subscriber that computed its size wrongly must not be overrun
  Result<Plan> r = BuildPlan(w, dst, MatchPolicy::kStrict, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(),
                  "tensor 'a': byte size mismatch: publisher 10, subscriber 8");
}

TEST(BuildPlanTest, ReportsDuplicateDestinations) {
  wire::Welcome w = WelcomeBuilder(1024).Add(Raw("a", 10)).Build();
  Result<Plan> r =
      BuildPlan(w, Destinations({Raw("a", 10), Raw("a", 10)}), MatchPolicy::kStrict, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(),
                  "tensor 'a': registered twice by subscriber (destinations 0 and 1)");
}

TEST(BuildPlanTest, CapsListedMismatchesAt100) {
  wire::Welcome w = WelcomeBuilder(1024).Build();
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 150; ++i) specs.push_back(Raw("t" + std::to_string(i), 1));
  Result<Plan> r = BuildPlan(w, Destinations(specs), MatchPolicy::kSubset, 0);
  ASSERT_FALSE(r.ok());
  std::vector<std::string> lines = Lines(r.status().message());
  ASSERT_EQ(lines.size(), 102u);  // summary + 100 listed + "... and 50 more"
  EXPECT_CONTAINS(lines[0], "150 mismatches");
  EXPECT_CONTAINS(lines[1], "'t0'");
  EXPECT_CONTAINS(lines[100], "'t99'");
  EXPECT_CONTAINS(lines[101], "... and 50 more");
}

TEST(BuildPlanTest, RejectsInvalidLayout) {
  wire::Welcome w = ValidWelcome();
  w.segment_bytes = 0;
  Result<Plan> r = BuildPlan(w, {}, MatchPolicy::kSubset, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kProtocolError);
}

TEST(BuildPlanTest, EmptyManifestsGiveEmptyPlan) {
  wire::Welcome w = WelcomeBuilder(1024).Build(0);
  Result<Plan> r = BuildPlan(w, {}, MatchPolicy::kStrict, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->tensors.empty());
  EXPECT_TRUE(r->segments.empty());
  EXPECT_TRUE(r->buckets.empty());
  EXPECT_EQ(r->total_bytes, 0u);
  EXPECT_EQ(r->digest_count, 0u);
  EXPECT_FALSE(r->uses_slots);
  EXPECT_FALSE(r->uses_direct);
}

// ---------------------------------------------------------------------------------------------
// BuildPlan: segments, digests, shadow layout

TEST(BuildPlanTest, CutsSegmentsAtMultiplesAndRemainders) {
  wire::Welcome w = WelcomeBuilder(8 * kMiB)
                        .Add(Raw("pad", 100))  // shifts the next tensors' source offsets
                        .Add(Raw("rem", 20 * kMiB))
                        .Add(Raw("exact", 16 * kMiB))
                        .Add(Raw("small", 5))
                        .Build();
  Result<Plan> r =
      BuildPlan(w, Destinations({Raw("rem", 20 * kMiB), Raw("exact", 16 * kMiB), Raw("small", 5)}),
                MatchPolicy::kSubset, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  const Plan& p = *r;
  ASSERT_EQ(p.tensors.size(), 3u);
  ASSERT_EQ(p.segments.size(), 6u);

  const uint64_t rem_src = w.tensors[1].offset;
  ASSERT_EQ(rem_src, 100u);
  EXPECT_EQ(p.tensors[0].first_segment, 0u);
  EXPECT_EQ(p.tensors[0].segment_count, 3u);
  const uint64_t rem_sizes[] = {8 * kMiB, 8 * kMiB, 4 * kMiB};
  for (int k = 0; k < 3; ++k) {
    const Segment& s = p.segments[k];
    EXPECT_EQ(s.bytes, rem_sizes[k]) << k;
    EXPECT_EQ(s.src_offset, rem_src + k * 8 * kMiB) << k;
    EXPECT_EQ(s.dst_offset, k * 8 * kMiB) << k;
    EXPECT_EQ(s.shadow_offset, p.tensors[0].shadow_offset + k * 8 * kMiB) << k;
    EXPECT_EQ(s.destination, 0u);
    EXPECT_EQ(s.region, wire::Region::kSlot);
  }

  EXPECT_EQ(p.tensors[1].first_segment, 3u);
  EXPECT_EQ(p.tensors[1].segment_count, 2u);
  EXPECT_EQ(p.segments[3].bytes, 8 * kMiB);
  EXPECT_EQ(p.segments[4].bytes, 8 * kMiB);
  EXPECT_EQ(p.segments[4].src_offset, w.tensors[2].offset + 8 * kMiB);
  EXPECT_EQ(p.segments[4].destination, 1u);

  EXPECT_EQ(p.tensors[2].segment_count, 1u);
  EXPECT_EQ(p.segments[5].bytes, 5u);
  EXPECT_EQ(p.segments[5].destination, 2u);

  EXPECT_EQ(p.total_bytes, 36 * kMiB + 5);
}

TEST(BuildPlanTest, DigestIndicesSkipUnmatchedPublisherTensors) {
  // Segments per publisher tensor: a 3, b 2, c 1, d 0, e 2 → digests a:0-2 b:3-4 c:5 e:6-7.
  wire::Welcome w = WelcomeBuilder(100)
                        .Add(Raw("a", 250))
                        .Add(Raw("b", 200))
                        .Add(Raw("c", 1))
                        .Add(Raw("d", 0))
                        .Add(Raw("e", 101))
                        .Build();
  // Subscriber order differs from publisher order; the plan follows the publisher.
  Result<Plan> r =
      BuildPlan(w, Destinations({Raw("e", 101), Raw("b", 200)}), MatchPolicy::kSubset, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  const Plan& p = *r;
  EXPECT_EQ(p.digest_count, 8u);
  ASSERT_EQ(p.tensors.size(), 2u);
  EXPECT_EQ(p.tensors[0].publisher_index, 1u);
  EXPECT_EQ(p.tensors[0].destination, 1u);
  EXPECT_EQ(p.tensors[1].publisher_index, 4u);
  EXPECT_EQ(p.tensors[1].destination, 0u);
  ASSERT_EQ(p.segments.size(), 4u);
  EXPECT_EQ(p.segments[0].digest_index, 3u);
  EXPECT_EQ(p.segments[1].digest_index, 4u);
  EXPECT_EQ(p.segments[2].digest_index, 6u);
  EXPECT_EQ(p.segments[3].digest_index, 7u);
  EXPECT_EQ(p.segments[3].bytes, 1u);
  EXPECT_EQ(p.total_bytes, 301u);
}

TEST(BuildPlanTest, EmptyTensorIsMatchedButHasNoSegments) {
  wire::Welcome w =
      WelcomeBuilder(64).Add(Raw("x", 10)).Add(Spec("e", DType::kFloat32, {0, 4})).Build();
  // Validation still applies to the empty tensor.
  Result<Plan> bad = BuildPlan(w, Destinations({Raw("x", 10), Spec("e", DType::kFloat32, {0, 5})}),
                               MatchPolicy::kStrict, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_CONTAINS(bad.status().message(), "tensor 'e': shape mismatch");

  Result<Plan> r = BuildPlan(w, Destinations({Raw("x", 10), Spec("e", DType::kFloat32, {0, 4})}),
                             MatchPolicy::kStrict, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->tensors.size(), 2u);
  EXPECT_EQ(r->tensors[1].nbytes, 0u);
  EXPECT_EQ(r->tensors[1].segment_count, 0u);
  EXPECT_EQ(r->tensors[1].first_segment, 1u);
  EXPECT_EQ(r->segments.size(), 1u);
  EXPECT_EQ(r->digest_count, 1u);
}

TEST(BuildPlanTest, ShadowOffsetsAre64ByteAlignedAndTotalIsBytesMoved) {
  wire::Welcome w = WelcomeBuilder(1000)
                        .Add(Raw("a", 1))
                        .Add(Raw("b", 64))
                        .Add(Raw("c", 65))
                        .Add(Raw("d", 3))
                        .Build();
  Result<Plan> r =
      BuildPlan(w, Destinations({Raw("a", 1), Raw("b", 64), Raw("c", 65), Raw("d", 3)}),
                MatchPolicy::kStrict, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->tensors.size(), 4u);
  EXPECT_EQ(r->tensors[0].shadow_offset, 0u);
  EXPECT_EQ(r->tensors[1].shadow_offset, 64u);
  EXPECT_EQ(r->tensors[2].shadow_offset, 128u);
  EXPECT_EQ(r->tensors[3].shadow_offset, 256u);
  EXPECT_EQ(r->total_bytes, 133u);  // padding is not moved
  // The staged shadow buffer must span up to the last tensor's end.
  EXPECT_EQ(r->tensors[3].shadow_offset + r->tensors[3].nbytes, 259u);
}

TEST(BuildPlanTest, RegionFlagsFollowPlannedTensorsOnly) {
  wire::Welcome w = WelcomeBuilder(64)
                        .Add(Raw("d", 10), wire::Region::kDirect)
                        .Add(Raw("s", 10), wire::Region::kSlot)
                        .Build();
  Result<Plan> direct_only = BuildPlan(w, Destinations({Raw("d", 10)}), MatchPolicy::kSubset, 0);
  ASSERT_TRUE(direct_only.ok()) << direct_only.status();
  EXPECT_TRUE(direct_only->uses_direct);
  EXPECT_FALSE(direct_only->uses_slots);
  EXPECT_EQ(direct_only->segments[0].region, wire::Region::kDirect);
  EXPECT_EQ(direct_only->segments[0].src_offset, 0u);

  Result<Plan> slot_only = BuildPlan(w, Destinations({Raw("s", 10)}), MatchPolicy::kSubset, 0);
  ASSERT_TRUE(slot_only.ok()) << slot_only.status();
  EXPECT_FALSE(slot_only->uses_direct);
  EXPECT_TRUE(slot_only->uses_slots);
  EXPECT_EQ(slot_only->segments[0].region, wire::Region::kSlot);

  Result<Plan> both =
      BuildPlan(w, Destinations({Raw("s", 10), Raw("d", 10)}), MatchPolicy::kStrict, 0);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_TRUE(both->uses_direct);
  EXPECT_TRUE(both->uses_slots);
}

// ---------------------------------------------------------------------------------------------
// BuildPlan: buckets

struct BucketCase {
  uint64_t bucket_bytes;
  std::vector<std::vector<uint64_t>> expected;  // segment sizes per bucket
};

std::vector<std::vector<uint64_t>> BucketSizes(const Plan& p) {
  std::vector<std::vector<uint64_t>> out;
  uint32_t next = 0;
  for (const Bucket& b : p.buckets) {
    EXPECT_EQ(b.first_segment, next) << "buckets must tile the segments in order";
    std::vector<uint64_t> sizes;
    uint64_t total = 0;
    for (uint32_t i = b.first_segment; i < b.first_segment + b.segment_count; ++i) {
      sizes.push_back(p.segments[i].bytes);
      total += p.segments[i].bytes;
    }
    EXPECT_EQ(b.bytes, total);
    next = b.first_segment + b.segment_count;
    out.push_back(sizes);
  }
  EXPECT_EQ(next, p.segments.size());
  return out;
}

TEST(BuildPlanTest, GroupsConsecutiveSegmentsIntoBuckets) {
  // Segments (segment_bytes 25): 10 | 20 | 25 5 | 25 15 — buckets cross tensor boundaries.
  wire::Welcome w = WelcomeBuilder(25)
                        .Add(Raw("a", 10))
                        .Add(Raw("b", 20))
                        .Add(Raw("c", 30))
                        .Add(Raw("d", 40))
                        .Build();
  std::vector<Destination> dst =
      Destinations({Raw("a", 10), Raw("b", 20), Raw("c", 30), Raw("d", 40)});
  const BucketCase cases[] = {
      {0, {{10}, {20}, {25}, {5}, {25}, {15}}},   // every segment alone
      {1, {{10}, {20}, {25}, {5}, {25}, {15}}},   // every segment larger than a bucket
      {30, {{10, 20}, {25, 5}, {25}, {15}}},      // exact fits close at the limit
      {29, {{10}, {20}, {25}, {5}, {25}, {15}}},  // 10+20 > 29; 25+5 > 29; 5+25 > 29
      {60, {{10, 20, 25, 5}, {25, 15}}},          // 10+20+25+5 = 60 fits exactly
      {1000, {{10, 20, 25, 5, 25, 15}}},
  };
  for (const BucketCase& c : cases) {
    SCOPED_TRACE("bucket_bytes " + std::to_string(c.bucket_bytes));
    Result<Plan> r = BuildPlan(w, dst, MatchPolicy::kStrict, c.bucket_bytes);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(BucketSizes(*r), c.expected);
  }
}

TEST(BuildPlanTest, OversizedSegmentFormsItsOwnBucketBetweenSmallOnes) {
  wire::Welcome w =
      WelcomeBuilder(1000).Add(Raw("a", 3)).Add(Raw("big", 500)).Add(Raw("b", 4)).Build();
  Result<Plan> r = BuildPlan(w, Destinations({Raw("a", 3), Raw("big", 500), Raw("b", 4)}),
                             MatchPolicy::kStrict, 100);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(BucketSizes(*r), (std::vector<std::vector<uint64_t>>{{3}, {500}, {4}}));
}

// ---------------------------------------------------------------------------------------------
// A model-sized plan

TEST(BuildPlanTest, ManyTensorPlanIsConsistent) {
  constexpr int kTensors = 400;
  constexpr uint64_t kSegment = 1 * kMiB;
  WelcomeBuilder builder(kSegment);
  std::vector<TensorSpec> subscriber;
  for (int i = 0; i < kTensors; ++i) {
    // Mixed sizes: empty, sub-segment, exact multiples and remainders; mixed regions.
    const uint64_t n = (i % 7 == 0) ? 0 : (static_cast<uint64_t>(i) * 37'987) % (5 * kMiB) + 1;
    const wire::Region region = (i % 3 == 0) ? wire::Region::kDirect : wire::Region::kSlot;
    TensorSpec spec = Raw("layer" + std::to_string(i), n);
    builder.Add(spec, region);
    // The subscriber skips every fifth tensor (subset) and registers in reverse order.
    if (i % 5 != 4) subscriber.insert(subscriber.begin(), spec);
  }
  wire::Welcome w = builder.Build();
  ASSERT_TRUE(ValidateLayout(w).ok());
  std::vector<Destination> dst = Destinations(subscriber);
  Result<Plan> r = BuildPlan(w, dst, MatchPolicy::kSubset, 4 * kMiB);
  ASSERT_TRUE(r.ok()) << r.status();
  const Plan& p = *r;

  uint64_t digests = 0;
  for (const wire::TensorPlacement& t : w.tensors) digests += SegmentCount(t.spec.nbytes, kSegment);
  EXPECT_EQ(p.digest_count, digests);
  ASSERT_EQ(p.tensors.size(), dst.size());

  uint64_t moved = 0;
  uint64_t shadow_end = 0;
  uint32_t next_segment = 0;
  uint32_t prev_publisher = 0;
  for (size_t k = 0; k < p.tensors.size(); ++k) {
    const PlannedTensor& t = p.tensors[k];
    const wire::TensorPlacement& src = w.tensors[t.publisher_index];
    if (k > 0) {
      EXPECT_GT(t.publisher_index, prev_publisher);  // publisher order
    }
    prev_publisher = t.publisher_index;
    EXPECT_EQ(dst[t.destination].spec.name, src.spec.name);
    EXPECT_EQ(t.nbytes, src.spec.nbytes);
    EXPECT_EQ(t.shadow_offset % 64, 0u);
    EXPECT_GE(t.shadow_offset, shadow_end);  // no overlap in the shadow buffer
    shadow_end = t.shadow_offset + t.nbytes;
    EXPECT_EQ(t.first_segment, next_segment);
    EXPECT_EQ(t.segment_count, SegmentCount(t.nbytes, kSegment));
    uint64_t covered = 0;
    for (uint32_t s = t.first_segment; s < t.first_segment + t.segment_count; ++s) {
      const Segment& seg = p.segments[s];
      EXPECT_EQ(seg.destination, t.destination);
      EXPECT_EQ(seg.region, src.region);
      EXPECT_EQ(seg.dst_offset, covered);
      EXPECT_EQ(seg.src_offset, src.offset + covered);
      EXPECT_EQ(seg.shadow_offset, t.shadow_offset + covered);
      EXPECT_GT(seg.bytes, 0u);
      EXPECT_LE(seg.bytes, kSegment);
      EXPECT_LT(seg.digest_index, p.digest_count);
      covered += seg.bytes;
    }
    EXPECT_EQ(covered, t.nbytes);
    next_segment += t.segment_count;
    moved += t.nbytes;
  }
  EXPECT_EQ(next_segment, p.segments.size());
  EXPECT_EQ(p.total_bytes, moved);
  for (size_t s = 1; s < p.segments.size(); ++s) {
    EXPECT_GT(p.segments[s].digest_index, p.segments[s - 1].digest_index);
  }
  for (const Bucket& b : p.buckets) {
    EXPECT_TRUE(b.bytes <= 4 * kMiB || b.segment_count == 1);
  }
  BucketSizes(p);  // checks the buckets tile the segments
  EXPECT_TRUE(p.uses_direct);
  EXPECT_TRUE(p.uses_slots);
}

}  // namespace
}  // namespace weightsync::plan
