// The select message of the tcp session (src/wire/handshake.h): the byte ranges a subscriber's
// plan reads, which the publisher streams every step. Golden layout, round trip, every truncation,
// and the decoder's own refusals (empty ranges, ends that wrap, counts the payload cannot hold);
// the publisher checks each range against its tensors (tests/transport/path/nccl_setup_test.cc).
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "testing/test_util.h"
#include "transport/link/link.h"
#include "wire/codec.h"
#include "wire/handshake.h"

namespace weightsync::wire {
namespace {

std::vector<uint8_t> EncodeOf(const Select& m) {
  std::vector<uint8_t> out;
  Encode(m, &out);
  return out;
}

TEST(WireSelectTest, GoldenLayoutAndRoundTrip) {
  const Select in{{{3, 16, 32}, {0, 0, 1}}};
  const std::vector<uint8_t> bytes = EncodeOf(in);
  // u32 count, then per range u32 tensor, u64 offset, u64 bytes, little-endian.
  const std::vector<uint8_t> expected = {2,  0, 0, 0,                           // count
                                         3,  0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0,  // tensor, offset
                                         32, 0, 0, 0, 0,  0, 0, 0,              // bytes
                                         0,  0, 0, 0, 0,  0, 0, 0, 0, 0, 0, 0,  // tensor, offset
                                         1,  0, 0, 0, 0,  0, 0, 0};             // bytes
  EXPECT_EQ(bytes, expected);
  Select out{{{9, 9, 9}}};  // replaced, not appended to
  ASSERT_OK(Decode(bytes, &out));
  EXPECT_EQ(out.ranges, in.ranges);
  for (size_t n = 0; n < bytes.size(); ++n) {
    Select cut;
    EXPECT_STATUS_IS(kProtocolError, Decode(std::span(bytes.data(), n), &cut), "select")
        << "prefix of " << n << " bytes";
  }
}

TEST(WireSelectTest, EmptyRangesAndWrappingEndsAreRefused) {
  Select out;
  EXPECT_STATUS_IS(kProtocolError, Decode(EncodeOf(Select{{{0, 8, 4}, {2, 4, 0}}}), &out),
                   "select: range 1 of tensor 2 [4, +0) is empty or overflows");
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  EXPECT_STATUS_IS(kProtocolError, Decode(EncodeOf(Select{{{1, max, 1}}}), &out),
                   "range 0 of tensor 1", "is empty or overflows");
  EXPECT_OK(Decode(EncodeOf(Select{{{1, max - 1, 1}}}), &out));
  EXPECT_OK(Decode(EncodeOf(Select{}), &out));
  EXPECT_TRUE(out.ranges.empty());
}

TEST(WireSelectTest, CountsBeyondTheLimitOrThePayloadAreRefusedBeforeAllocating) {
  std::vector<uint8_t> bytes;
  Writer w(&bytes);
  w.U32(kMaxSelectRanges + 1);
  Select out;
  EXPECT_STATUS_IS(kProtocolError, Decode(bytes, &out), "range count");
  bytes.clear();
  w.U32(1000);  // claims 1000 ranges, carries none
  EXPECT_STATUS_IS(kProtocolError, Decode(bytes, &out), "range count 1000 needs at least");
  EXPECT_LT(out.ranges.capacity(), 1000u);
}

// What the subscriber checks before sending: a plan of more ranges than one frame carries is
// refused with what to do about it.
TEST(WireSelectTest, APlanOfMoreRangesThanAFrameCarriesIsRefusedBeforeSending) {
  EXPECT_OK(transport::link::SelectFits(kMaxSelectRanges));
  EXPECT_STATUS_IS(kResourceExhausted, transport::link::SelectFits(kMaxSelectRanges + 1),
                   "more than one select frame carries", "one range per row");
}

}  // namespace
}  // namespace weightsync::wire
