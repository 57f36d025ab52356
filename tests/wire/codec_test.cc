#include "wire/codec.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "testing/test_util.h"

namespace weightsync::wire {
namespace {

using testing::IsError;

TEST(WireWriterTest, EncodesLittleEndian) {
  std::vector<uint8_t> out;
  Writer w(&out);
  w.U8(0xAB);
  w.U16(0x1234);
  w.U32(0x89ABCDEFu);
  w.U64(0x0102030405060708ull);
  w.I64(-2);
  const std::vector<uint8_t> expected = {
      0xAB,                                            // u8
      0x34, 0x12,                                      // u16
      0xEF, 0xCD, 0xAB, 0x89,                          // u32
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // u64
      0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,  // i64 -2, two's complement
  };
  EXPECT_EQ(out, expected);
}

TEST(WireWriterTest, StringIsU16LengthThenBytes) {
  std::vector<uint8_t> out;
  Writer w(&out);
  w.String("hi");
  w.String("");
  EXPECT_EQ(out, (std::vector<uint8_t>{2, 0, 'h', 'i', 0, 0}));
}

TEST(WireWriterTest, AppendsAndNeverClears) {
  std::vector<uint8_t> out = {0xAA, 0xBB};
  Writer w(&out);
  w.U16(0x0102);
  EXPECT_EQ(out, (std::vector<uint8_t>{0xAA, 0xBB, 0x02, 0x01}));
  Writer again(&out);  // a second writer over the same buffer keeps appending
  again.U8(7);
  EXPECT_EQ(out.size(), 5u);
  EXPECT_EQ(out.front(), 0xAA);
  EXPECT_EQ(out.back(), 7);
}

TEST(WireWriterTest, ReusedBufferDoesNotReallocate) {
  std::vector<uint8_t> out;
  out.reserve(64);
  const uint8_t* data = out.data();
  for (int frame = 0; frame < 100; ++frame) {
    out.clear();  // the caller clears; capacity stays
    Writer w(&out);
    w.U64(frame);
    w.String("steady");
  }
  EXPECT_EQ(out.data(), data);
}

TEST(WireWriterTest, OversizeStringIsClampedNotDesynchronised) {
  // Out of contract, but the frame must stay parseable: the length written matches the bytes.
  std::vector<uint8_t> out;
  Writer w(&out);
  w.String(std::string(70000, 'x'));
  w.U8(0x5A);
  Reader r(out, "test");
  Result<std::string> s = r.String("s", 65535);
  ASSERT_OK(s);
  EXPECT_EQ(s->size(), 65535u);
  Result<uint8_t> tail = r.U8("tail");
  ASSERT_OK(tail);
  EXPECT_EQ(*tail, 0x5A);
  EXPECT_OK(r.ExpectEnd());
}

TEST(WireReaderTest, RoundTripsEveryWidth) {
  std::vector<uint8_t> out;
  Writer w(&out);
  w.U8(0);
  w.U8(255);
  w.U16(65535);
  w.U32(0xFFFFFFFFu);
  w.U64(~0ull);
  w.I64(INT64_MIN);
  w.I64(INT64_MAX);
  w.I64(-1);
  w.String("name.with.dots");

  Reader r(out, "test");
  EXPECT_EQ(*r.U8("a"), 0);
  EXPECT_EQ(*r.U8("b"), 255);
  EXPECT_EQ(*r.U16("c"), 65535);
  EXPECT_EQ(*r.U32("d"), 0xFFFFFFFFu);
  EXPECT_EQ(*r.U64("e"), ~0ull);
  EXPECT_EQ(*r.I64("f"), INT64_MIN);
  EXPECT_EQ(*r.I64("g"), INT64_MAX);
  EXPECT_EQ(*r.I64("h"), -1);
  EXPECT_EQ(*r.String("i", 100), "name.with.dots");
  EXPECT_EQ(r.remaining(), 0u);
  EXPECT_OK(r.ExpectEnd());
}

TEST(WireReaderTest, DecodesLittleEndianRegardlessOfHost) {
  const std::vector<uint8_t> bytes = {0x34, 0x12, 0x78, 0x56, 0x34, 0x12};
  Reader r(bytes, "test");
  EXPECT_EQ(*r.U16("a"), 0x1234);
  EXPECT_EQ(*r.U32("b"), 0x12345678u);
}

TEST(WireReaderTest, TruncationNamesWhatFieldAndSizes) {
  const std::vector<uint8_t> bytes = {1, 2, 3};
  {
    Reader r(bytes, "welcome");
    EXPECT_TRUE(IsError(r.U32("slot_count").status(), StatusCode::kProtocolError,
                        {"welcome: truncated reading slot_count", "need 4", "3 left"}));
    // A failed read does not consume anything.
    EXPECT_EQ(r.remaining(), 3u);
    EXPECT_EQ(*r.U16("ok"), 0x0201);
  }
  {
    Reader r(bytes, "m");
    EXPECT_TRUE(IsError(r.U64("x").status(), StatusCode::kProtocolError, {"need 8"}));
    EXPECT_TRUE(IsError(r.I64("y").status(), StatusCode::kProtocolError, {"y"}));
  }
  {
    Reader r({}, "m");
    EXPECT_TRUE(IsError(r.U8("only").status(), StatusCode::kProtocolError, {"only", "need 1"}));
    EXPECT_TRUE(IsError(r.U16("x").status(), StatusCode::kProtocolError, {"need 2"}));
    EXPECT_TRUE(IsError(r.String("s", 10).status(), StatusCode::kProtocolError, {"s"}));
    EXPECT_TRUE(IsError(r.Count("c", 10, 1).status(), StatusCode::kProtocolError, {"c"}));
  }
}

TEST(WireReaderTest, StringBodyTruncated) {
  const std::vector<uint8_t> bytes = {10, 0, 'a', 'b', 'c'};
  Reader r(bytes, "hello");
  EXPECT_TRUE(IsError(r.String("name", 100).status(), StatusCode::kProtocolError,
                      {"hello: truncated reading name", "need 12", "5 left"}));
}

TEST(WireReaderTest, StringOverCapRejectedBeforeBodyIsNeeded) {
  // The length alone is over the cap: reported as such even though the body is missing.
  const std::vector<uint8_t> bytes = {0x01, 0x04};  // 1025
  Reader r(bytes, "welcome");
  EXPECT_TRUE(IsError(r.String("tensor 0 name", 1024).status(), StatusCode::kProtocolError,
                      {"welcome: tensor 0 name length 1025 exceeds limit 1024"}));

  std::vector<uint8_t> exact = {4, 0, 'a', 'b', 'c', 'd'};
  Reader at_cap(exact, "m");
  EXPECT_EQ(*at_cap.String("s", 4), "abcd");
  Reader below(exact, "m");
  EXPECT_TRUE(IsError(below.String("s", 3).status(), StatusCode::kProtocolError,
                      {"length 4 exceeds limit 3"}));
}

TEST(WireReaderTest, StringMayHoldAnyBytes) {
  const std::vector<uint8_t> bytes = {3, 0, 0, 0xFF, '\n'};
  Reader r(bytes, "m");
  Result<std::string> s = r.String("s", 10);
  ASSERT_OK(s);
  EXPECT_EQ(*s, std::string("\0\xFF\n", 3));
}

TEST(WireReaderTest, CountWithinLimitsAccepted) {
  std::vector<uint8_t> bytes;
  Writer w(&bytes);
  w.U32(3);
  for (int i = 0; i < 3; ++i) w.U64(i);
  Reader r(bytes, "step_end");
  Result<uint32_t> count = r.Count("digest count", 3, 8);
  ASSERT_OK(count);
  EXPECT_EQ(*count, 3u);
  EXPECT_EQ(r.remaining(), 24u);
}

TEST(WireReaderTest, CountOverMaxRejected) {
  std::vector<uint8_t> bytes;
  Writer w(&bytes);
  w.U32(11);
  bytes.resize(bytes.size() + 1000);
  Reader r(bytes, "welcome");
  EXPECT_TRUE(IsError(r.Count("tensor count", 10, 1).status(), StatusCode::kProtocolError,
                      {"welcome: tensor count 11 exceeds limit 10"}));
}

TEST(WireReaderTest, CountLargerThanPayloadRejectedBeforeAllocating) {
  std::vector<uint8_t> bytes;
  Writer w(&bytes);
  w.U32(4);
  bytes.resize(bytes.size() + 31);  // one byte short of 4 x 8
  Reader r(bytes, "step_end");
  EXPECT_TRUE(IsError(r.Count("digest count", 1000, 8).status(), StatusCode::kProtocolError,
                      {"step_end: digest count 4 needs at least 32 bytes, only 31 left"}));
}

TEST(WireReaderTest, HugeCountTimesItemSizeDoesNotWrap) {
  // 0xFFFFFFFF * 0xFFFFFFFF would wrap in 32 bits; the check must still reject it.
  std::vector<uint8_t> bytes;
  Writer w(&bytes);
  w.U32(0xFFFFFFFFu);
  bytes.resize(bytes.size() + 16);
  Reader r(bytes, "m");
  EXPECT_TRUE(IsError(r.Count("c", 0xFFFFFFFFu, 0xFFFFFFFFu).status(), StatusCode::kProtocolError,
                      {"needs at least"}));
  Reader r2(bytes, "m");
  EXPECT_TRUE(IsError(r2.Count("c", 0xFFFFFFFFu, 1).status(), StatusCode::kProtocolError,
                      {"c 4294967295 needs at least 4294967295 bytes, only 16 left"}));
}

TEST(WireReaderTest, ZeroMinItemSizeOnlyChecksMax) {
  std::vector<uint8_t> bytes;
  Writer w(&bytes);
  w.U32(1000);
  Reader r(bytes, "m");
  Result<uint32_t> count = r.Count("c", 1000, 0);
  ASSERT_OK(count);
  EXPECT_EQ(*count, 1000u);
}

TEST(WireReaderTest, ExpectEndReportsTrailingBytes) {
  const std::vector<uint8_t> bytes = {1, 2, 3, 4, 5};
  Reader r(bytes, "copy_done");
  ASSERT_OK(r.U16("a"));
  EXPECT_TRUE(IsError(r.ExpectEnd(), StatusCode::kProtocolError,
                      {"copy_done: 3 trailing bytes", "payload 5 bytes", "fields end at 2"}));
  ASSERT_OK(r.U16("b"));
  ASSERT_OK(r.U8("c"));
  EXPECT_OK(r.ExpectEnd());
}

TEST(WireReaderTest, NeverReadsPastItsSpan) {
  // The reader sees a window of a larger buffer; the bytes after it must stay invisible.
  const std::vector<uint8_t> backing = {7, 0, 0, 0, 0xEE, 0xEE, 0xEE, 0xEE};
  Reader r(std::span<const uint8_t>(backing.data(), 3), "m");
  EXPECT_FALSE(r.U32("x").ok());
  EXPECT_EQ(*r.U16("y"), 7);
  EXPECT_FALSE(r.U16("z").ok());
  EXPECT_EQ(*r.U8("w"), 0);
  EXPECT_FALSE(r.U8("v").ok());
  EXPECT_OK(r.ExpectEnd());
}

}  // namespace
}  // namespace weightsync::wire
