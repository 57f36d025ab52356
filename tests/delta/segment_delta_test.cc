// The segment delta (delta/segment_delta.h): bit-exact round trips at every changed fraction and
// element size, the cheapest form per chunk, "send it whole" when a delta would not be smaller,
// and a strict checker that refuses every malformed delta before a byte is written.
#include "delta/segment_delta.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "testing/status_matchers.h"

namespace weightsync::delta {
namespace {

using Bytes = std::vector<uint8_t>;

Bytes RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

// `base` with each element changed with probability `fraction` (a changed element differs in
// one random byte, as a small update to a bf16 value differs in its low bits).
Bytes Changed(const Bytes& base, uint32_t element_bytes, double fraction, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution pick(fraction);
  Bytes next = base;
  for (size_t e = 0; e < base.size() / element_bytes; ++e) {
    if (!pick(rng)) continue;
    next[e * element_bytes + rng() % element_bytes] ^= static_cast<uint8_t>(1 + rng() % 255);
  }
  return next;
}

uint64_t Differing(const Bytes& a, const Bytes& b, uint32_t element_bytes) {
  uint64_t n = 0;
  for (size_t e = 0; e < a.size() / element_bytes; ++e) {
    n += std::memcmp(&a[e * element_bytes], &b[e * element_bytes], element_bytes) != 0;
  }
  return n;
}

// Encodes with room for any delta (the segment plus its directory), so even a delta larger than
// the segment is written, and returns it.
Bytes EncodeAll(SegmentEncoder& encoder, const Bytes& base, const Bytes& next,
                uint32_t element_bytes, Encoded* encoded = nullptr) {
  Bytes out(next.size() + ChunkCount(next.size() / element_bytes));
  const auto result = encoder.Encode(base, next, element_bytes, out);
  EXPECT_TRUE(result.has_value());
  if (!result) return {};
  if (encoded != nullptr) *encoded = *result;
  out.resize(result->bytes);
  return out;
}

class RoundTrip : public ::testing::TestWithParam<std::tuple<uint32_t, double>> {};

TEST_P(RoundTrip, ApplyingTheDeltaToTheBaseGivesTheNewVersionBitForBit) {
  const auto [element_bytes, fraction] = GetParam();
  SegmentEncoder encoder;
  // Whole chunks plus a partial one, and a segment shorter than one chunk.
  for (const uint64_t elements : {uint64_t{3000}, uint64_t{37}, uint64_t{256}}) {
    const Bytes base = RandomBytes(elements * element_bytes, elements);
    const Bytes next = Changed(base, element_bytes, fraction, elements + 1);
    Encoded encoded;
    const Bytes delta = EncodeAll(encoder, base, next, element_bytes, &encoded);
    EXPECT_EQ(encoded.changed_elements, Differing(base, next, element_bytes));
    ASSERT_OK_AND_ASSIGN(const DeltaShape shape, CheckDelta(delta, next.size(), element_bytes));
    EXPECT_GE(shape.changed_elements, encoded.changed_elements);  // whole chunks carry them all
    Bytes segment = base;
    ASSERT_OK(ApplyDelta(delta, element_bytes, segment));
    EXPECT_EQ(segment, next) << elements << " elements";
    ASSERT_OK(ApplyDelta(delta, element_bytes, segment));  // the values are not XORs
    EXPECT_EQ(segment, next) << "applied twice";
  }
}

INSTANTIATE_TEST_SUITE_P(ElementSizesAndFractions, RoundTrip,
                         ::testing::Combine(::testing::Values(1u, 2u, 4u, 8u, 16u, 3u),
                                            ::testing::Values(0.0, 0.001, 0.03, 0.5, 1.0)));

TEST(SegmentDelta, AThousandChainedStepsOfRandomSparseChangesStayBitExact) {
  // The fractions of the issue, with whole segments unchanged and every element changed, in
  // turn; each step's delta is applied to the previous step's result, never to a fresh copy.
  const double fractions[] = {0.0, 0.001, 0.03, 0.5, 1.0, 0.01, 0.0, 0.02};
  SegmentEncoder encoder;
  Bytes published = RandomBytes(2 * 5000, 7);
  Bytes received = published;
  Bytes out(published.size());
  uint64_t sent_whole = 0;
  for (int step = 0; step < 1000; ++step) {
    const Bytes next = Changed(published, 2, fractions[step % 8], 100 + step);
    const auto encoded = encoder.Encode(published, next, 2, out);
    if (encoded) {
      ASSERT_OK(ApplyDelta(std::span(out).first(encoded->bytes), 2, received));
    } else {
      received = next;  // what a whole segment does
      ++sent_whole;
    }
    ASSERT_EQ(received, next) << "step " << step;
    published = next;
  }
  EXPECT_EQ(sent_whole, 125u);  // the every-element steps, and only those
}

TEST(SegmentDelta, TheWordKernelWritesTheSameDeltaAsTheVectorOne) {
  for (const uint32_t e : {1u, 2u, 4u}) {
    const Bytes base = RandomBytes(e * 3001, e);
    const Bytes next = Changed(base, e, 0.05, e + 1);
    SegmentEncoder vector;
    SegmentEncoder words(MaskKernel::kWords);
    EXPECT_EQ(EncodeAll(words, base, next, e), EncodeAll(vector, base, next, e)) << e;
  }
}

TEST(SegmentDelta, EachChunkTakesItsCheapestForm) {
  // bf16: a list up to 32 changes, a bitmap up to 239, every element from 240 (32 + 2k ≥ 512).
  const int changes[] = {0, 5, 32, 33, 239, 240, 256};
  const uint8_t codes[] = {0, 5, 32, kBitmap, kBitmap, kWhole, kWhole};
  Bytes base(2 * kChunkElements * 7, 0);
  Bytes next = base;
  for (int c = 0; c < 7; ++c) {
    for (int i = 0; i < changes[c]; ++i) next[2 * (c * kChunkElements + i)] = 1;
  }
  SegmentEncoder encoder;
  Encoded encoded;
  const Bytes delta = EncodeAll(encoder, base, next, 2, &encoded);
  for (int c = 0; c < 7; ++c) EXPECT_EQ(delta[c], codes[c]) << "chunk " << c;
  // Directory, values (changed, or the whole chunk), then the index (offsets, bitmaps).
  const uint64_t values = 2 * (5 + 32 + 33 + 239 + 256 + 256);
  const uint64_t index = 5 + 32 + 2 * kBitmapBytes;
  EXPECT_EQ(encoded.bytes, 7 + values + index);
  EXPECT_EQ(encoded.changed_elements, 5u + 32 + 33 + 239 + 240 + 256);
  EXPECT_EQ(delta[7], 1);           // the first value
  EXPECT_EQ(delta[7 + values], 0);  // the first offset of chunk 1
  EXPECT_EQ(delta[7 + values + 4], 4);
}

TEST(SegmentDelta, ADeltaCostsAboutOneIndexBytePerChangedElementAtRlFractions) {
  // 3% of a 1 MiB bf16 segment: values plus about one index byte per change, plus the directory.
  const Bytes base = RandomBytes(1 << 20, 1);
  const Bytes next = Changed(base, 2, 0.03, 2);
  SegmentEncoder encoder;
  Encoded encoded;
  EncodeAll(encoder, base, next, 2, &encoded);
  const uint64_t chunks = ChunkCount(base.size() / 2);
  EXPECT_LE(encoded.bytes, chunks + 3 * encoded.changed_elements);
  EXPECT_GE(encoded.bytes, chunks + 2 * encoded.changed_elements);
  EXPECT_LT(encoded.bytes, base.size() / 10);
}

TEST(SegmentDelta, TheSizeModelPredictsWhatTheEncoderWritesForSpreadChanges) {
  // Uniformly spread changes, as the model assumes: the encoder's bytes within sampling noise,
  // at each form's fractions and two element sizes.
  SegmentEncoder encoder;
  for (const uint32_t e : {2u, 4u}) {
    const Bytes base = RandomBytes(uint64_t{e} << 22, e);
    for (const double fraction : {0.001, 0.014, 0.03, 0.1, 0.4, 0.9}) {
      const Bytes next = Changed(base, e, fraction, 17);
      Encoded encoded;
      EncodeAll(encoder, base, next, e, &encoded);
      const double elements = static_cast<double>(base.size() / e);
      const double measured = std::min<double>(encoded.bytes, base.size()) / elements;
      // 1%, plus three standard deviations of the number of changes at (1 + e) bytes each.
      const double noise = 3 * std::sqrt(elements * fraction) * (1 + e) / elements;
      EXPECT_NEAR(ExpectedDeltaBytesPerElement(fraction, e), measured, 0.01 * measured + noise)
          << e << " bytes, " << fraction;
    }
  }
  EXPECT_DOUBLE_EQ(ExpectedDeltaBytesPerElement(0, 2), 1.0 / kChunkElements);  // the directory
  EXPECT_DOUBLE_EQ(ExpectedDeltaBytesPerElement(1, 2), 2.0);                   // whole
  EXPECT_DOUBLE_EQ(ExpectedDeltaBytesPerElement(0.999, 2), 2.0);
}

TEST(SegmentDelta, WhenTheDeltaWouldNotBeSmallerTheSegmentGoesWhole) {
  const Bytes base = RandomBytes(2 * 1000, 3);
  const Bytes next = Changed(base, 2, 1.0, 4);
  SegmentEncoder encoder;
  Bytes out(next.size());
  EXPECT_FALSE(encoder.Encode(base, next, 2, out).has_value());
  // A tighter limit refuses a sparse delta too, and a roomy one takes it.
  const Bytes sparse = Changed(base, 2, 0.05, 5);
  Bytes small(10);
  EXPECT_FALSE(encoder.Encode(base, sparse, 2, small).has_value());
  EXPECT_TRUE(encoder.Encode(base, sparse, 2, out).has_value());
  // Sizes that are not whole elements are never diffed.
  EXPECT_FALSE(encoder.Encode(base, next, 3, out).has_value());
  EXPECT_FALSE(encoder.Encode(base, std::span(next).first(10), 2, out).has_value());
  EXPECT_FALSE(encoder.Encode(base, next, 0, out).has_value());
}

TEST(SegmentDelta, AnEmptySegmentHasAnEmptyDelta) {
  SegmentEncoder encoder;
  Bytes out;
  const auto encoded = encoder.Encode({}, {}, 2, out);
  ASSERT_TRUE(encoded.has_value());
  EXPECT_EQ(encoded->bytes, 0u);
  Bytes segment;
  EXPECT_OK(ApplyDelta({}, 2, segment));
}

// A well-formed delta over 300 bf16 elements (one whole chunk, one of 44): chunk 0 a bitmap of
// 40, chunk 1 a list of 3; the tests below break one thing each.
struct Sample {
  Bytes base = RandomBytes(600, 11);
  Bytes next = base;
  Bytes delta;
  Sample() {
    for (int i = 0; i < 40; ++i) next[2 * (3 * i)] ^= 1;
    for (int i : {256, 260, 299}) next[2 * i + 1] ^= 0x80;
    SegmentEncoder encoder;
    delta = EncodeAll(encoder, base, next, 2);
  }
  uint64_t index_at() const { return delta.size() - kBitmapBytes - 3; }
};

TEST(CheckDelta, TheSampleIsWellFormed) {
  Sample s;
  ASSERT_EQ(s.delta[0], kBitmap);
  ASSERT_EQ(s.delta[1], 3);
  ASSERT_OK_AND_ASSIGN(const DeltaShape shape, CheckDelta(s.delta, 600, 2));
  EXPECT_EQ(shape.changed_elements, 43u);
  EXPECT_EQ(shape.value_bytes, 86u);
  EXPECT_EQ(shape.index_bytes, kBitmapBytes + 3);
}

// ApplyDelta refuses `delta` with the message parts and leaves the segment as it was.
void ExpectRefused(const Bytes& delta, uint64_t segment_bytes,
                   std::initializer_list<std::string_view> parts) {
  const Bytes poison(segment_bytes, 0xA5);
  Bytes segment = poison;
  const Status status = ApplyDelta(delta, 2, segment);
  EXPECT_TRUE(testing::IsError(status, StatusCode::kProtocolError, parts));
  EXPECT_EQ(segment, poison) << "a refused delta wrote bytes";
}

TEST(CheckDelta, ShortAndLongDeltasAreRefused) {
  Sample s;
  ExpectRefused(Bytes(1), 600, {"1 bytes, shorter than its directory of 2 chunks"});
  Bytes cut = s.delta;  // a value byte missing
  cut.erase(cut.begin() + 2);
  ExpectRefused(cut, 600, {"85 bytes of values for 43 elements of 2 bytes"});
  Bytes longer = s.delta;
  longer.insert(longer.begin() + 2, 0);
  ExpectRefused(longer, 600, {"87 bytes of values for 43 elements"});
  Bytes index_only = {kBitmap, kBitmap};  // two bitmaps need 64 index bytes
  ExpectRefused(index_only, 600, {"too short for a directory of 2 chunks and an index of 64"});
}

TEST(CheckDelta, UnknownCodesAndListsLongerThanTheirChunkAreRefused) {
  Sample s;
  Bytes bad = s.delta;
  bad[0] = 0x80;
  ExpectRefused(bad, 600, {"chunk 0 has the unknown code 128"});
  // 20 elements in a last chunk of 15 (a segment of 271 elements).
  Bytes listed(2 + 20 * 3, 0);
  listed[1] = 20;
  ExpectRefused(listed, 2 * 271, {"chunk 1 lists 20 elements of its 15"});
}

TEST(CheckDelta, OffsetsMustIncreaseInsideTheirChunk) {
  Sample s;
  const uint64_t list = s.delta.size() - 3;  // chunk 1's offsets: 0, 4, 43
  Bytes repeated = s.delta;
  repeated[list + 1] = 0;
  ExpectRefused(repeated, 600, {"chunk 1's offsets are not increasing", "(offset 0 at 1)"});
  Bytes beyond = s.delta;
  beyond[list + 2] = 44;  // chunk 1 has 44 elements
  ExpectRefused(beyond, 600, {"inside its 44 elements", "(offset 44 at 2)"});
}

TEST(CheckDelta, BitmapsMustMarkSomethingAndNothingPastTheEnd) {
  Sample s;
  Bytes empty = s.delta;
  std::fill(empty.begin() + s.index_at(), empty.begin() + s.index_at() + kBitmapBytes, 0);
  ExpectRefused(empty, 600, {"chunk 0's bitmap is empty"});
  // A 300-element segment as one bitmap chunk of 256 and one of 44 that marks element 50.
  Bytes past(2 + 2 * kBitmapBytes + 2 * 34, 0);
  past[0] = kBitmap;
  past[1] = kBitmap;
  const uint64_t index = past.size() - 2 * kBitmapBytes;
  std::fill(past.begin() + index, past.begin() + index + 4, 0xFF);  // 32 in chunk 0
  past[index + kBitmapBytes + 6] = 0x04;                            // element 50 of chunk 1
  past[index + kBitmapBytes] = 0x01;
  ExpectRefused(past, 600, {"chunk 1's bitmap marks elements past its end"});
}

TEST(CheckDelta, SegmentsThatAreNotWholeElementsAreInvalidArguments) {
  Bytes segment(7);
  EXPECT_STATUS_IS(kInvalidArgument, ApplyDelta({}, 2, segment),
                   "a segment of 7 bytes is not made of elements of 2 bytes");
  EXPECT_STATUS_IS(kInvalidArgument, CheckDelta({}, 64, 32), "elements of 32 bytes");
}

}  // namespace
}  // namespace weightsync::delta
