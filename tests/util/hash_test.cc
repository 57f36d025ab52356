// util::Hash64Stream: a range fed in pieces hashes as the range does in one call (the host ring
// into CUDA destinations hashes each segment a bucket at a time).
#include "util/hash.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace weightsync::util {
namespace {

TEST(Hash64StreamTest, PiecesHashAsTheWholeRange) {
  std::mt19937 rng(3);
  std::vector<uint8_t> data(300000);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  Hash64Stream stream;
  for (size_t n : {size_t{0}, size_t{1}, size_t{240}, size_t{4096}, data.size()}) {
    for (int trial = 0; trial < 8; ++trial) {
      stream.Reset();  // one state, reused: what the last range fed is gone
      size_t at = 0;
      while (at < n) {
        const size_t piece = std::min(n - at, size_t(rng() % (trial < 4 ? 100 : 100000)));
        stream.Update(data.data() + at, piece);
        at += piece;
      }
      EXPECT_EQ(stream.Finish(), Hash64(data.data(), n)) << n << " bytes, trial " << trial;
    }
  }
  stream.Reset();
  stream.Update(data.data(), 100);
  const uint64_t before = stream.Finish();
  data[99] ^= 1;
  EXPECT_NE(before, Hash64(data.data(), 100));
  EXPECT_EQ(before, [&] {
    data[99] ^= 1;
    return Hash64(data.data(), 100);
  }());
}

}  // namespace
}  // namespace weightsync::util
