// BuildRegionPlan: one publisher's share of a region schedule as the plan the data paths walk.
// Runs merge where they continue each other on both sides; a plan for verification receives any
// digest segment it reads in part (or scatters) whole, as a kExtract tensor with its pieces, and
// leaves whole segments as plain copies; a schedule copy outside its tensors is refused.
#include "plan/region_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "testing/test_util.h"

namespace weightsync::plan {
namespace {

// One publisher tensor "w" of `bytes` uint8 elements in slot 0, digests of `segment` bytes.
wire::Welcome OneTensor(uint64_t bytes, uint64_t segment) {
  wire::Welcome w;
  w.arena_bytes = 1 << 20;
  w.slots_offset = 0;
  w.slot_bytes = 1 << 19;
  w.slot_count = 1;
  w.segment_bytes = segment;
  wire::TensorPlacement p;
  p.spec = {"w", DType::kUInt8, {static_cast<int64_t>(bytes)}, bytes};
  w.tensors.push_back(p);
  return w;
}

std::vector<Destination> Destinations(std::vector<uint64_t> sizes) {
  std::vector<Destination> out;
  for (uint64_t n : sizes) {
    Destination d;
    d.spec = {"d" + std::to_string(out.size()), DType::kUInt8, {static_cast<int64_t>(n)}, n};
    out.push_back(d);
  }
  return out;
}

// rows x run from src (pitch) to dst (pitch).
RegionCopy Copy(uint32_t dst, uint64_t src_offset, uint64_t src_pitch, uint64_t dst_offset,
                uint64_t dst_pitch, uint64_t run, uint64_t rows) {
  return {0, dst, src_offset, src_pitch, dst_offset, dst_pitch, run, rows};
}

// 4 rows of 32 bytes of "w" (256 bytes, 64-byte segments) contiguous on both sides into d0, then
// 2 rows contiguous in "w" but strided in d1.
Result<Plan> TwoCopies(bool for_verify) {
  return BuildRegionPlan(OneTensor(256, 64), Destinations({128, 100}),
                         {Copy(0, 0, 32, 0, 32, 32, 4), Copy(1, 128, 32, 0, 50, 32, 2)}, 1 << 20,
                         for_verify);
}

TEST(RegionPlan, RowsThatContinueEachOtherOnBothSidesBecomeOneRun) {
  ASSERT_OK_AND_ASSIGN(Plan p, TwoCopies(/*for_verify=*/false));
  EXPECT_TRUE(p.regions);
  ASSERT_EQ(p.tensors.size(), 3u);
  EXPECT_EQ(p.tensors[0].nbytes, 128u);
  EXPECT_EQ(p.tensors[1].src_offset, 128u);
  EXPECT_EQ(p.tensors[1].dst_offset, 0u);
  EXPECT_EQ(p.tensors[2].src_offset, 160u);
  EXPECT_EQ(p.tensors[2].dst_offset, 50u);
  EXPECT_EQ(p.total_bytes, 192u);
  EXPECT_EQ(p.destination_count, 2u);
  EXPECT_TRUE(p.extracts.empty());
  // [0, 128) is two whole segments, [128, 160) half of one: not verifiable as planned.
  EXPECT_FALSE(p.verifiable);
}

TEST(RegionPlan, ForVerifyReceivesPartlyReadSegmentsWholeAndExtractsTheirPieces) {
  ASSERT_OK_AND_ASSIGN(Plan p, TwoCopies(/*for_verify=*/true));
  EXPECT_TRUE(p.verifiable);
  // [0, 128): segments 0 and 1 whole → one copy; segment 2 [128, 192) holds both pieces of the
  // second copy (one contiguous in the source, two places in the destination) → one extract.
  ASSERT_EQ(p.tensors.size(), 2u);
  EXPECT_EQ(p.tensors[0].transform, Transform::kCopy);
  EXPECT_EQ(p.tensors[0].nbytes, 128u);
  const PlannedTensor& e = p.tensors[1];
  EXPECT_EQ(e.transform, Transform::kExtract);
  EXPECT_EQ(e.src_offset, 128u);
  EXPECT_EQ(e.nbytes, 64u);
  ASSERT_EQ(e.extract_count, 2u);
  const Extract& a = p.extracts[e.first_extract];
  const Extract& b = p.extracts[e.first_extract + 1];
  EXPECT_EQ(a.offset, 0u);
  EXPECT_EQ(a.destination, 1u);
  EXPECT_EQ(a.dst_offset, 0u);
  EXPECT_EQ(a.bytes, 32u);
  EXPECT_EQ(b.offset, 32u);
  EXPECT_EQ(b.dst_offset, 50u);
  EXPECT_EQ(p.total_bytes, 192u);  // segment 2 moves whole
  EXPECT_EQ(p.converted, std::vector<uint32_t>{1});
  EXPECT_GE(p.landing_bytes, 64u);
  // Every segment is one whole digest segment, numbered as the publisher numbers them.
  ASSERT_EQ(p.segments.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(p.segments[i].digest_index, i);
    EXPECT_EQ(p.segments[i].bytes, 64u);
    EXPECT_EQ(p.segments[i].src_offset, 64u * i);
  }
  EXPECT_TRUE(p.segments[2].converted);
}

TEST(RegionPlan, TheLastShortSegmentOfATensorCountsAsWhole) {
  const wire::Welcome w = OneTensor(100, 64);  // segments [0, 64) and [64, 100)
  ASSERT_OK_AND_ASSIGN(
      Plan p, BuildRegionPlan(w, Destinations({36}), {Copy(0, 64, 0, 0, 0, 36, 1)}, 1 << 20, true));
  ASSERT_EQ(p.tensors.size(), 1u);
  EXPECT_EQ(p.tensors[0].transform, Transform::kCopy);
  EXPECT_EQ(p.total_bytes, 36u);
  EXPECT_TRUE(p.verifiable);
  ASSERT_OK_AND_ASSIGN(Plan plain, BuildRegionPlan(w, Destinations({36}),
                                                   {Copy(0, 64, 0, 0, 0, 36, 1)}, 1 << 20, false));
  EXPECT_TRUE(plain.verifiable);  // it happens to read whole segments only
}

// Runs `p` as the host landing does (staged): what lands in each destination.
std::vector<std::vector<uint8_t>> Execute(const Plan& p, const std::vector<uint8_t>& published,
                                          const std::vector<Destination>& destinations) {
  std::vector<std::vector<uint8_t>> out;
  for (const Destination& d : destinations) out.emplace_back(d.spec.nbytes, 0xEE);
  for (const PlannedTensor& t : p.tensors) {
    const uint8_t* src = published.data() + t.src_offset;
    if (t.transform == Transform::kCopy) {
      std::copy(src, src + t.nbytes, out[t.destination].begin() + t.dst_offset);
      continue;
    }
    for (uint32_t e = 0; e < t.extract_count; ++e) {
      const Extract& piece = p.extracts[t.first_extract + e];
      std::copy(src + piece.offset, src + piece.offset + piece.bytes,
                out[piece.destination].begin() + piece.dst_offset);
    }
  }
  return out;
}

// Digest segments need not hold whole elements (a peer's Welcome may say 6 bytes of float32):
// verification pieces of a copy still land byte for byte; a cast cut inside an element is
// refused.
TEST(RegionPlan, SegmentsThatSplitElementsStillPlaceEveryByteAndRefuseCasts) {
  wire::Welcome w = OneTensor(32, 6);
  w.tensors[0].spec = {"w", DType::kFloat32, {8}, 32};
  std::vector<Destination> dst = Destinations({28});
  dst[0].spec = {"d0", DType::kFloat32, {7}, 28};
  std::vector<uint8_t> published(32);
  for (size_t i = 0; i < published.size(); ++i) published[i] = static_cast<uint8_t>(i);
  ASSERT_OK_AND_ASSIGN(Plan p, BuildRegionPlan(w, dst, {Copy(0, 4, 0, 0, 0, 28, 1)}, 1 << 20,
                                               /*for_verify=*/true));
  EXPECT_TRUE(p.verifiable);
  const auto landed = Execute(p, published, dst);
  EXPECT_EQ(landed[0], std::vector<uint8_t>(published.begin() + 4, published.end()));
  dst[0].spec = {"d0", DType::kBFloat16, {7}, 14};
  RegionCopy cast = Copy(0, 4, 0, 0, 0, 28, 1);
  cast.dst_run_bytes = 14;
  EXPECT_STATUS_IS(kInvalidArgument, BuildRegionPlan(w, dst, {cast}, 1 << 20, true),
                   "tensor 'w' is cast from float32 and verified",
                   "digest segments of 6 bytes split its 4-byte elements");
  ASSERT_OK(BuildRegionPlan(w, dst, {cast}, 1 << 20, /*for_verify=*/false));
}

TEST(RegionPlan, VerifyRefusesAPlanThatReadsPartsOfSegments) {
  Plan p;
  EXPECT_OK(CheckVerifiable(p, 3));
  p.verifiable = false;
  EXPECT_STATUS_IS(kFailedPrecondition, CheckVerifiable(p, 3), "step 3",
                   "was not prepared for verification");
}

TEST(RegionPlan, ACopyOutsideEitherTensorIsRefused) {
  const wire::Welcome w = OneTensor(256, 64);
  EXPECT_STATUS_IS(
      kInternal,
      BuildRegionPlan(w, Destinations({64}), {Copy(0, 200, 0, 0, 0, 64, 1)}, 1 << 20, false),
      "row 0 of a copy from 'w' into 'd0' lies outside one of them");
  EXPECT_STATUS_IS(
      kInternal,
      BuildRegionPlan(w, Destinations({64}), {Copy(0, 0, 64, 0, 1, 64, 2)}, 1 << 20, false),
      "row 1");
  // A pitch whose product wraps around 2^64.
  EXPECT_STATUS_IS(kInternal,
                   BuildRegionPlan(w, Destinations({64}),
                                   {Copy(0, 0, ~uint64_t{0} / 2 + 1, 0, 0, 1, 3)}, 1 << 20, false),
                   "lies outside");
  // A copy that claims to write more (or fewer) bytes than it reads without a cast between the
  // two dtypes.
  RegionCopy widening = Copy(0, 0, 0, 0, 0, 8, 1);
  widening.dst_run_bytes = 16;
  EXPECT_STATUS_IS(kInternal, BuildRegionPlan(w, Destinations({64}), {widening}, 1 << 20, false),
                   "(uint8) of 8 bytes per row writes 16");
  RegionCopy bad = Copy(3, 0, 0, 0, 0, 1, 1);
  EXPECT_STATUS_IS(kInternal, BuildRegionPlan(w, Destinations({64}), {bad}, 1 << 20, false),
                   "into destination 3");
}

}  // namespace
}  // namespace weightsync::plan
