// How a ring version is cut (plan/ring_cut.h): at bucket edges and at the piece limit, covering
// the range exactly once in order; and pieces grouped by bucket.
#include "plan/ring_cut.h"

#include <gtest/gtest.h>

#include <vector>

namespace weightsync::plan {
namespace {

TEST(CutAtBuckets, ARangeIsCutAtEveryBucketEdgeAndAtThePieceLimit) {
  std::vector<RingPiece> cut;
  // Bytes [90, 350) of buckets of 100, pieces of at most 60.
  CutAtBuckets(90, 260, 100, 60, &cut);
  const std::vector<RingPiece> expected = {{0, 0, 90, 10},  {1, 10, 0, 60},   {1, 70, 60, 40},
                                           {2, 110, 0, 60}, {2, 170, 60, 40}, {3, 210, 0, 50}};
  ASSERT_EQ(cut.size(), expected.size());
  for (size_t i = 0; i < cut.size(); ++i) {
    EXPECT_EQ(cut[i].bucket, expected[i].bucket) << i;
    EXPECT_EQ(cut[i].at, expected[i].at) << i;
    EXPECT_EQ(cut[i].bucket_offset, expected[i].bucket_offset) << i;
    EXPECT_EQ(cut[i].bytes, expected[i].bytes) << i;
  }
}

TEST(CutAtBuckets, AnEmptyRangeHasNoPiecesAndPiecesAppend) {
  std::vector<RingPiece> cut = {{9, 9, 9, 9}};
  CutAtBuckets(500, 0, 100, 60, &cut);
  EXPECT_EQ(cut.size(), 1u);
  CutAtBuckets(200, 100, 100, UINT64_MAX, &cut);  // exactly bucket 2
  ASSERT_EQ(cut.size(), 2u);
  EXPECT_EQ(cut[1].bucket, 2u);
  EXPECT_EQ(cut[1].bucket_offset, 0u);
  EXPECT_EQ(cut[1].bytes, 100u);
}

TEST(ByBucket, ListsKeepTheirBucketsAndOrder) {
  const auto grouped = ByBucket<int>::From({{1, 2}, {}, {3}});
  EXPECT_EQ(grouped.items, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(grouped.count(0), 2u);
  EXPECT_EQ(grouped.count(1), 0u);
  EXPECT_EQ(grouped.count(2), 1u);
  EXPECT_EQ(*grouped.begin(2), 3);
}

}  // namespace
}  // namespace weightsync::plan
