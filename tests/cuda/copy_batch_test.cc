// CopyBatch keeps every copy it is given, exactly once, while folding runs of equal rows at
// constant strides into strided (2-D) copies. Host code: addresses are never dereferenced here
// (tests/gpu/copy_test.cc moves real bytes through a batch).
#include "cuda/copy_batch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

#include "cuda/kernels.h"

namespace weightsync::cuda {
namespace {

using Copy = std::tuple<uintptr_t, uintptr_t, size_t>;  // dst, src, bytes

void* D(uintptr_t a) { return reinterpret_cast<void*>(a); }
const void* S(uintptr_t a) { return reinterpret_cast<const void*>(a); }
uintptr_t A(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// Every single copy a batch will perform: its singles plus each strided copy's rows.
std::vector<Copy> Expand(const CopyBatch& b) {
  std::vector<Copy> out;
  for (size_t i = 0; i < b.sizes().size(); ++i) {
    out.emplace_back(A(b.dsts()[i]), A(b.srcs()[i]), b.sizes()[i]);
  }
  for (const StridedCopy& g : b.strided()) {
    EXPECT_GE(g.height, CopyBatch::kMinRows);
    EXPECT_GE(g.dst_pitch, g.width);
    EXPECT_GE(g.src_pitch, g.width);
    EXPECT_LE(g.dst_pitch, CopyBatch::kMaxPitch);
    EXPECT_LE(g.src_pitch, CopyBatch::kMaxPitch);
    for (size_t r = 0; r < g.height; ++r) {
      out.emplace_back(A(g.dst) + r * g.dst_pitch, A(g.src) + r * g.src_pitch, g.width);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(CopyBatch, RowsAtConstantStridesBecomeOneStridedCopy) {
  CopyBatch b;
  // A row-parallel cut: 1000 rows of 3584 bytes out of 7168-byte source rows into a packed
  // destination.
  for (uintptr_t r = 0; r < 1000; ++r)
    b.Add(D(0x100000 + r * 3584), S(0x900000 + r * 7168), 3584, 0);
  ASSERT_EQ(b.strided().size(), 1u);
  EXPECT_TRUE(b.sizes().empty());
  const StridedCopy& g = b.strided()[0];
  EXPECT_EQ(A(g.dst), 0x100000u);
  EXPECT_EQ(A(g.src), 0x900000u);
  EXPECT_EQ(g.dst_pitch, 3584u);
  EXPECT_EQ(g.src_pitch, 7168u);
  EXPECT_EQ(g.width, 3584u);
  EXPECT_EQ(g.height, 1000u);
  EXPECT_EQ(b.copies(), 1000u);
  EXPECT_EQ(b.bytes(), 1000u * 3584u);
}

TEST(CopyBatch, FewerRowsThanTheMinimumStaySingles) {
  CopyBatch b;
  for (uintptr_t r = 0; r + 1 < CopyBatch::kMinRows; ++r)
    b.Add(D(0x1000 + r * 64), S(r * 128), 64, 0);
  EXPECT_TRUE(b.strided().empty());
  EXPECT_EQ(b.sizes().size(), CopyBatch::kMinRows - 1);
  b.Add(D(0x1000 + (CopyBatch::kMinRows - 1) * 64), S((CopyBatch::kMinRows - 1) * 128), 64, 0);
  EXPECT_EQ(b.strided().size(), 1u);
  EXPECT_TRUE(b.sizes().empty());
}

TEST(CopyBatch, RowsThatOverlapGoBackwardsOrStepTooFarStaySingles) {
  struct Case {
    const char* what;
    intptr_t dst_step, src_step;
  };
  const intptr_t too_far = static_cast<intptr_t>(CopyBatch::kMaxPitch) + 1;
  for (const Case& c :
       {Case{"dst overlaps", 32, 128}, Case{"src overlaps", 128, 63},
        Case{"dst backwards", -64, 128}, Case{"src backwards", 128, -64},
        Case{"dst pitch too large", too_far, 64}, Case{"src pitch too large", 64, too_far}}) {
    SCOPED_TRACE(c.what);
    CopyBatch b;
    const uintptr_t base = uintptr_t{1} << 40;
    for (intptr_t r = 0; r < 10; ++r)
      b.Add(D(base + r * c.dst_step), S(base + r * c.src_step), 64, 0);
    EXPECT_TRUE(b.strided().empty());
    EXPECT_EQ(b.sizes().size(), 10u);
  }
}

TEST(CopyBatch, ABreakEndsTheStridedCopyAndANewRunStartsAfterIt) {
  CopyBatch b;
  for (uintptr_t r = 0; r < 6; ++r) b.Add(D(r * 100), S(r * 200), 100, 0);  // run 1
  b.Add(D(0x10000), S(0x20000), 7, 0);                                      // a different size
  for (uintptr_t r = 0; r < 5; ++r)
    b.Add(D(0x30000 + r * 50), S(0x40000 + r * 60), 50, 0);  // run 2
  b.Add(D(0), S(0), 0, 0);                                   // dropped
  ASSERT_EQ(b.strided().size(), 2u);
  EXPECT_EQ(b.strided()[0].height, 6u);
  EXPECT_EQ(b.strided()[1].height, 5u);
  EXPECT_EQ(b.strided()[1].width, 50u);
  ASSERT_EQ(b.sizes().size(), 1u);
  EXPECT_EQ(b.sizes()[0], 7u);
  EXPECT_EQ(b.copies(), 12u);
  b.Clear();
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.copies(), 0u);
  // After Clear nothing of the old run continues.
  b.Add(D(6 * 100), S(6 * 200), 100, 0);
  EXPECT_TRUE(b.strided().empty());
  EXPECT_EQ(b.sizes().size(), 1u);
}

// Small tensors the caching allocator placed at a regular stride look like rows, but each is its
// own allocation: a 2-D copy across them is refused by the runtime (cudaErrorInvalidValue).
TEST(CopyBatch, CopiesOfDifferentSpansAreNeverCombined) {
  CopyBatch b;
  for (uint64_t t = 0; t < 10; ++t) b.Add(D(0x10000 + t * 512), S(0x90000 + t * 128), 128, t);
  EXPECT_TRUE(b.strided().empty());
  EXPECT_EQ(b.sizes().size(), 10u);
  // A span change in the middle of a run of rows ends it there; the rows after it start anew.
  CopyBatch c;
  for (uintptr_t r = 0; r < 12; ++r) c.Add(D(r * 100), S(r * 300), 100, r < 6 ? 1 : 2);
  ASSERT_EQ(c.strided().size(), 2u);
  EXPECT_EQ(c.strided()[0].height, 6u);
  EXPECT_EQ(A(c.strided()[1].dst), 600u);
  EXPECT_EQ(c.strided()[1].height, 6u);
  // Only a copy of the same span extends the rows; one of another span stays a single.
  c.Add(D(1200), S(3600), 100, 2);
  EXPECT_EQ(c.strided()[1].height, 7u);
  c.Add(D(1300), S(3900), 100, 1);
  EXPECT_EQ(c.strided()[1].height, 7u);
  EXPECT_EQ(c.sizes().size(), 1u);
}

TEST(CopyBatch, AStrideChangeMidRunStartsANewRunAtThePreviousRow) {
  CopyBatch b;
  for (uintptr_t r = 0; r < 3; ++r) b.Add(D(r * 100), S(r * 100), 100, 0);
  // From row 2 on the source steps by 300: rows 2..7 are one progression.
  for (uintptr_t r = 3; r < 8; ++r) b.Add(D(r * 100), S(200 + (r - 2) * 300), 100, 0);
  ASSERT_EQ(b.strided().size(), 1u);
  EXPECT_EQ(b.strided()[0].height, 6u);
  EXPECT_EQ(A(b.strided()[0].src), 200u);
  EXPECT_EQ(b.sizes().size(), 2u);
}

TEST(CopyBatch, TheSmallSinglesAreListedThenDroppedLeavingTheRestInOrder) {
  CopyBatch b;
  b.Add(D(0x1000), S(0x9000), 100, 0);
  b.Add(D(0x2000), S(0xA000), 5000, 1);
  for (uintptr_t r = 0; r < 8; ++r) b.Add(D(0x10000 + r * 64), S(0x20000 + r * 128), 64, 2);
  b.Add(D(0x3000), S(0xB000), 10, 3);
  b.Add(D(0x4000), S(0xC000), 6000, 4);
  const std::vector<SingleCopy> small = b.SinglesBelow(1000);
  ASSERT_EQ(small.size(), 2u);
  EXPECT_EQ(A(small[0].dst), 0x1000u);
  EXPECT_EQ(small[0].bytes, 100u);
  EXPECT_EQ(A(small[1].src), 0xB000u);
  EXPECT_EQ(b.sizes().size(), 4u);  // listing takes nothing away
  b.DropSinglesBelow(1000);
  ASSERT_EQ(b.sizes().size(), 2u);  // the large singles, in order
  EXPECT_EQ(b.sizes()[0], 5000u);
  EXPECT_EQ(b.sizes()[1], 6000u);
  EXPECT_EQ(b.strided().size(), 1u);  // strided copies stay whatever their row size
  EXPECT_EQ(b.copies(), 10u);
}

// After a drop the singles left are no run: copies added later start afresh (a trail counted
// before the drop would point at singles that are gone).
TEST(CopyBatch, NothingAddedAfterADropContinuesARunBegunBeforeIt) {
  CopyBatch b;
  for (uintptr_t r = 0; r < 3; ++r) b.Add(D(r * 100), S(r * 200), 100, 0);  // a trail of 3
  b.DropSinglesBelow(50);                                                   // drops nothing
  b.Add(D(300), S(600), 100, 0);  // would be the 4th row of that trail
  EXPECT_TRUE(b.strided().empty());
  EXPECT_EQ(b.sizes().size(), 4u);
}

// An open strided copy grows only by a row that matches it in width, destination step and source
// step; a row that matches two of the three starts over as a single.
TEST(CopyBatch, AStridedCopyGrowsOnlyByARowMatchingWidthAndBothSteps) {
  struct Case {
    const char* what;
    uintptr_t dst, src;
    size_t bytes;
  };
  // Rows 0..4 are dst 1000 + 100 r, src 5000 + 300 r, 100 bytes: the next row is 1500 / 6500.
  for (const Case& c :
       {Case{"other width", 1500, 6500, 99}, Case{"other dst step", 1504, 6500, 100},
        Case{"other src step", 1500, 6504, 100}}) {
    SCOPED_TRACE(c.what);
    CopyBatch b;
    for (uintptr_t r = 0; r < 5; ++r) b.Add(D(1000 + r * 100), S(5000 + r * 300), 100, 0);
    ASSERT_EQ(b.strided().size(), 1u);
    b.Add(D(c.dst), S(c.src), c.bytes, 0);
    EXPECT_EQ(b.strided()[0].height, 5u);
    EXPECT_EQ(b.sizes().size(), 1u);
    EXPECT_EQ(b.copies(), 6u);
  }
  CopyBatch b;
  for (uintptr_t r = 0; r < 6; ++r) b.Add(D(1000 + r * 100), S(5000 + r * 300), 100, 0);
  EXPECT_EQ(b.strided()[0].height, 6u);
}

// Before a run reaches kMinRows, a row of another size or destination step ends it too.
TEST(CopyBatch, ATrailBreaksOnAnotherSizeOrDestinationStep) {
  {
    CopyBatch b;
    b.Add(D(0), S(0), 100, 0);
    b.Add(D(100), S(200), 100, 0);
    b.Add(D(200), S(400), 100, 0);
    b.Add(D(300), S(600), 50, 0);  // other size: the trail is over
    b.Add(D(350), S(650), 50, 0);
    EXPECT_TRUE(b.strided().empty());
    EXPECT_EQ(b.sizes().size(), 5u);
  }
  {
    CopyBatch b;
    b.Add(D(0), S(0), 100, 0);
    b.Add(D(100), S(200), 100, 0);
    b.Add(D(200), S(400), 100, 0);
    b.Add(D(304), S(600), 100, 0);  // same source step, other destination step
    EXPECT_TRUE(b.strided().empty());
    EXPECT_EQ(b.sizes().size(), 4u);
  }
}

// A copy group that cannot be prepared (here: addresses no device owns, on any machine; without
// a GPU, no device at all) leaves every copy in the batch, for the copy engines.
TEST(CopyBatch, ASmallCopyGroupThatCannotBePreparedLeavesTheBatchWhole) {
  CopyBatch b;
  b.Add(D(0x1000), S(0x9000), 100, 0);
  b.Add(D(0x2000), S(0xA000), kCopyGroupBelowBytes, 1);
  for (uintptr_t r = 0; r < 8; ++r) b.Add(D(0x10000 + r * 64), S(0x20000 + r * 128), 64, 2);
  Result<PreparedCopyGroup> group = SplitOffSmallCopies(b, nullptr);
  EXPECT_FALSE(group.ok());
  EXPECT_EQ(b.sizes().size(), 2u);
  EXPECT_EQ(b.strided().size(), 1u);
  EXPECT_EQ(b.copies(), 10u);
  EXPECT_EQ(b.bytes(), 100u + kCopyGroupBelowBytes + 8 * 64);
}

// Random mixes of runs, breaks and zero-byte copies: the batch performs exactly the non-empty
// copies it was given, each once, and its byte count is theirs.
TEST(CopyBatch, ExpandsToExactlyTheCopiesAdded) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    CopyBatch b;
    std::vector<Copy> want;
    uint64_t want_bytes = 0;
    uintptr_t dst = 1 << 20, src = 1 << 30;
    const int groups = 1 + static_cast<int>(rng() % 20);
    for (int g = 0; g < groups; ++g) {
      const size_t width = rng() % 5 == 0 ? 0 : 1 + rng() % 300;
      const size_t dpitch = width + rng() % 3 * (rng() % 100);
      const size_t spitch = width + rng() % 3 * (rng() % 100);
      const size_t rows = 1 + rng() % 12;
      for (size_t r = 0; r < rows; ++r) {
        b.Add(D(dst + r * dpitch), S(src + r * spitch), width, 0);
        if (width > 0) want.emplace_back(dst + r * dpitch, src + r * spitch, width);
        want_bytes += width;
      }
      if (rng() % 4 == 0) {
        // The next group starts exactly where this one's next row would be.
        dst += rows * dpitch;
        src += rows * spitch;
      } else {
        dst += rows * (dpitch + 1) + rng() % 2 * 1000;
        src += rows * (spitch + 1) + rng() % 2 * 1000;
      }
    }
    std::sort(want.begin(), want.end());
    ASSERT_EQ(Expand(b), want) << "trial " << trial;
    EXPECT_EQ(b.copies(), want.size());
    EXPECT_EQ(b.bytes(), want_bytes);
  }
}

// The runs of CutIntoLanes, as (begin, end) pairs.
std::vector<std::pair<size_t, size_t>> Runs(const std::vector<size_t>& sizes, size_t lanes) {
  const LaneCuts cuts = CutIntoLanes(sizes, lanes);
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t r = 0; r < cuts.count; ++r) runs.emplace_back(cuts.begin[r], cuts.begin[r + 1]);
  return runs;
}

using RunList = std::vector<std::pair<size_t, size_t>>;

TEST(CutIntoLanes, EqualCopiesGoEvenlyIntoTheLanes) {
  EXPECT_EQ(Runs(std::vector<size_t>(8, 10), 4), (RunList{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  EXPECT_EQ(Runs(std::vector<size_t>(8, 10), 1), (RunList{{0, 8}}));
  EXPECT_EQ(Runs({}, 4), RunList{});
}

TEST(CutIntoLanes, CutsByBytesNotByCount) {
  // Half the bytes in the first copy: it is a lane of its own, the other seven share the rest.
  EXPECT_EQ(Runs({70, 10, 10, 10, 10, 10, 10, 10}, 2), (RunList{{0, 1}, {1, 8}}));
  EXPECT_EQ(Runs({10, 10, 10, 10, 10, 10, 10, 70}, 2), (RunList{{0, 7}, {7, 8}}));
}

TEST(CutIntoLanes, NeverMoreRunsThanCopiesOrLanes) {
  EXPECT_EQ(Runs({5, 5, 5}, 8), (RunList{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_EQ(Runs(std::vector<size_t>(100, 1), 0).size(), 1u);  // 0 lanes: one
  EXPECT_EQ(Runs(std::vector<size_t>(100, 1), 1000).size(), kMaxCopyLanes);
}

// Random batches: the runs are contiguous, non-empty, in order, cover every copy, and none holds
// more than a lane's share of the bytes plus one copy (the largest).
TEST(CutIntoLanes, RunsCoverTheBatchAndStayBalanced) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<size_t> sizes(1 + rng() % 400);
    for (size_t& b : sizes) b = rng() % 8 == 0 ? 1 + rng() % (1 << 30) : 1 + rng() % 4096;
    const size_t lanes = 1 + rng() % kMaxCopyLanes;
    const RunList runs = Runs(sizes, lanes);
    uint64_t total = 0, largest = 0;
    for (size_t b : sizes) total += b, largest = std::max<uint64_t>(largest, b);
    ASSERT_FALSE(runs.empty());
    ASSERT_LE(runs.size(), std::min(lanes, sizes.size())) << "trial " << trial;
    EXPECT_EQ(runs.front().first, 0u);
    EXPECT_EQ(runs.back().second, sizes.size());
    for (size_t r = 0; r < runs.size(); ++r) {
      ASSERT_LT(runs[r].first, runs[r].second) << "trial " << trial << " run " << r;
      if (r > 0) {
        ASSERT_EQ(runs[r].first, runs[r - 1].second);
      }
      uint64_t bytes = 0;
      for (size_t i = runs[r].first; i < runs[r].second; ++i) bytes += sizes[i];
      EXPECT_LE(bytes, total / lanes + 1 + largest) << "trial " << trial << " run " << r;
    }
  }
}

}  // namespace
}  // namespace weightsync::cuda
