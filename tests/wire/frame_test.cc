#include "wire/frame.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "testing/test_util.h"
#include "util/hash.h"
#include "wire/handshake.h"
#include "wire/messages.h"

namespace weightsync::wire {
namespace {

using Header = std::array<uint8_t, kHeaderBytes>;

using testing::IsError;

std::vector<uint8_t> Bytes(std::string_view s) { return std::vector<uint8_t>(s.begin(), s.end()); }

Header EncodeFor(FrameType type, const std::vector<uint8_t>& payload) {
  Header h{};
  EncodeHeader(type, payload, h);
  return h;
}

void Put16(Header& h, size_t at, uint16_t v) {
  h[at] = static_cast<uint8_t>(v);
  h[at + 1] = static_cast<uint8_t>(v >> 8);
}
void Put32(Header& h, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) h[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

// Every type the format defines: the range is the contract, so new types are covered as added.
std::vector<FrameType> AllTypes() {
  std::vector<FrameType> types;
  for (uint16_t t = kMinFrameType; t <= kMaxFrameType; ++t)
    types.push_back(static_cast<FrameType>(t));
  return types;
}

TEST(WireFrameTest, GoldenLayoutIsLittleEndian) {
  const std::vector<uint8_t> payload = Bytes("abc");
  const Header h = EncodeFor(FrameType::kStepEnd, payload);
  // "WSYN" as bytes, then version 10, type 6, length 3, reserved 0.
  const uint8_t expected_prefix[16] = {'W', 'S', 'Y', 'N', 11, 0, 6, 0, 3, 0, 0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(h[i], expected_prefix[i]) << "byte " << i;
  const uint64_t hash = util::Hash64(payload.data(), payload.size());
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(h[16 + i], static_cast<uint8_t>(hash >> (8 * i))) << "checksum byte " << i;
  }
}

TEST(WireFrameTest, ChecksumIsXxh3OfThePayload) {
  // XXH3_64bits of the empty input (seed 0), a published test vector: pins the algorithm the
  // documentation promises, independent of util::Hash64.
  const Header h = EncodeFor(FrameType::kHello, {});
  uint64_t checksum = 0;
  for (size_t i = 0; i < 8; ++i) checksum |= uint64_t{h[16 + i]} << (8 * i);
  EXPECT_EQ(checksum, 0x2D06800538D394C2ull);
}

TEST(WireFrameTest, RoundTripEveryType) {
  for (FrameType type : AllTypes()) {
    SCOPED_TRACE(std::string(FrameTypeName(type)));
    std::vector<uint8_t> payload = Bytes("payload of " + std::string(FrameTypeName(type)));
    payload.resize(std::min<size_t>(payload.size(), MaxPayloadOf(type)));  // what the type holds
    const Header h = EncodeFor(type, payload);
    Result<FrameHeader> decoded = DecodeHeader(h);
    ASSERT_OK(decoded);
    EXPECT_EQ(decoded->type, type);
    EXPECT_EQ(decoded->length, payload.size());
    EXPECT_EQ(decoded->checksum, util::Hash64(payload.data(), payload.size()));
    EXPECT_OK(VerifyPayload(*decoded, payload));
  }
}

TEST(WireFrameTest, EmptyPayloadRoundTrips) {
  const Header h = EncodeFor(FrameType::kCopyDone, {});
  Result<FrameHeader> decoded = DecodeHeader(h);
  ASSERT_OK(decoded);
  EXPECT_EQ(decoded->length, 0u);
  EXPECT_OK(VerifyPayload(*decoded, {}));
}

TEST(WireFrameTest, TypeNames) {
  EXPECT_EQ(FrameTypeName(FrameType::kHello), "hello");
  EXPECT_EQ(FrameTypeName(FrameType::kWelcome), "welcome");
  EXPECT_EQ(FrameTypeName(FrameType::kUpdateRequest), "update_request");
  EXPECT_EQ(FrameTypeName(FrameType::kStepBegin), "step_begin");
  EXPECT_EQ(FrameTypeName(FrameType::kCopyDone), "copy_done");
  EXPECT_EQ(FrameTypeName(FrameType::kStepEnd), "step_end");
  EXPECT_EQ(FrameTypeName(FrameType::kError), "error");
  EXPECT_EQ(FrameTypeName(FrameType::kChallenge), "challenge");
  EXPECT_EQ(FrameTypeName(FrameType::kAuth), "auth");
  EXPECT_EQ(FrameTypeName(FrameType::kAuthOk), "auth_ok");
  EXPECT_EQ(FrameTypeName(FrameType::kSelect), "select");
  EXPECT_EQ(FrameTypeName(FrameType::kNcclSetup), "nccl_setup");
  EXPECT_EQ(FrameTypeName(FrameType::kNcclId), "nccl_id");
  EXPECT_EQ(FrameTypeName(FrameType::kAllocationFd), "allocation_fd");
  EXPECT_EQ(FrameTypeName(FrameType::kDeltaBegin), "delta_begin");
  // Every defined type has a name of its own.
  for (FrameType type : AllTypes()) EXPECT_NE(FrameTypeName(type), "unknown");
  EXPECT_EQ(FrameTypeName(static_cast<FrameType>(0)), "unknown");
  EXPECT_EQ(FrameTypeName(static_cast<FrameType>(kMaxFrameType + 1)), "unknown");
}

TEST(WireFrameTest, BadMagicInAnyByteRejected) {
  for (size_t i = 0; i < 4; ++i) {
    Header h = EncodeFor(FrameType::kHello, Bytes("x"));
    h[i] ^= 0x20;
    EXPECT_TRUE(IsError(DecodeHeader(h).status(), StatusCode::kProtocolError,
                        {"frame header", "magic", "expected 0x4e595357"}))
        << "byte " << i;
  }
}

TEST(WireFrameTest, ForeignProtocolRejectedByMagic) {
  // An HTTP request on our socket: 24 bytes of "GET / HTTP/1.1\r\nHost: x\r\n".
  Header h{};
  const std::string_view http = "GET / HTTP/1.1\r\nHost: x\r\n";
  for (size_t i = 0; i < kHeaderBytes; ++i) h[i] = static_cast<uint8_t>(http[i]);
  EXPECT_TRUE(IsError(DecodeHeader(h).status(), StatusCode::kProtocolError, {"magic"}));
}

TEST(WireFrameTest, BadVersionRejected) {
  // 1: the protocol before nccl moved steps with broadcasts; 2: before versions carried a
  // lineage; 3: before tensors could be regions of global tensors; 4: before zero-copy
  // allocations could be cuMem chunks; 5: before ring publishers; 6: before GPU rings; 7: before
  // zero-copy and GPU ring publishers served over tcp; 8: before delta updates; 9: before relay
  // topology (hello's serves/avoid, update_request's below, redirect) — their peers must be
  // refused.
  for (uint16_t version : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 0x100, 0xFFFF}) {
    Header h = EncodeFor(FrameType::kHello, {});
    Put16(h, 4, version);
    EXPECT_TRUE(IsError(DecodeHeader(h).status(), StatusCode::kProtocolError,
                        {"protocol version " + std::to_string(version),
                         "expected " + std::to_string(kProtocolVersion)}))
        << version;
  }
}

TEST(WireFrameTest, UnknownTypeRejected) {
  for (uint16_t type : {0, kMaxFrameType + 1, 0x0100, 0xFFFF}) {
    Header h = EncodeFor(FrameType::kHello, {});
    Put16(h, 6, type);
    EXPECT_TRUE(IsError(
        DecodeHeader(h).status(), StatusCode::kProtocolError,
        {"frame type " + std::to_string(type), "expected 1.." + std::to_string(kMaxFrameType)}))
        << type;
  }
}

TEST(WireFrameTest, NonzeroReservedRejected) {
  for (size_t byte = 12; byte < 16; ++byte) {
    Header h = EncodeFor(FrameType::kStepBegin, {});
    h[byte] = 1;
    EXPECT_TRUE(IsError(DecodeHeader(h).status(), StatusCode::kProtocolError,
                        {"step_begin", "reserved", "expected 0"}))
        << "byte " << byte;
  }
}

TEST(WireFrameTest, LengthCapEnforced) {
  Header h = EncodeFor(FrameType::kWelcome, {});

  Put32(h, 8, kMaxPayloadBytes);
  EXPECT_OK(DecodeHeader(h));
  Put32(h, 8, kMaxPayloadBytes + 1);
  EXPECT_TRUE(IsError(DecodeHeader(h).status(), StatusCode::kProtocolError,
                      {"welcome", "payload length " + std::to_string(kMaxPayloadBytes + 1),
                       "exceeds limit " + std::to_string(kMaxPayloadBytes)}));
  Put32(h, 8, 0xFFFFFFFFu);
  EXPECT_TRUE(IsError(DecodeHeader(h).status(), StatusCode::kProtocolError, {"payload length"}));

  // A caller-lowered cap (e.g. before authentication).
  Put32(h, 8, 4096);
  EXPECT_OK(DecodeHeader(h, 4096));
  EXPECT_TRUE(IsError(DecodeHeader(h, 4095).status(), StatusCode::kProtocolError,
                      {"payload length 4096", "exceeds limit 4095"}));
  EXPECT_TRUE(IsError(DecodeHeader(h, 0).status(), StatusCode::kProtocolError, {"limit 0"}));

  // A caller cannot raise the cap past the format's.
  Put32(h, 8, kMaxPayloadBytes + 1);
  EXPECT_TRUE(IsError(DecodeHeader(h, 0xFFFFFFFFu).status(), StatusCode::kProtocolError,
                      {"exceeds limit " + std::to_string(kMaxPayloadBytes)}));
}

// Each frame type is bound by what its message can encode to: a header claiming one byte more is
// refused from the header alone, whatever cap the caller allows (a hello never promises 64 MiB).
TEST(WireFrameTest, EveryTypeIsBoundByWhatItsMessageHolds) {
  for (FrameType type : AllTypes()) {
    SCOPED_TRACE(std::string(FrameTypeName(type)));
    const uint32_t bound = MaxPayloadOf(type);
    ASSERT_GT(bound, 0u);
    ASSERT_LE(bound, kMaxPayloadBytes);
    Header h = EncodeFor(type, {});
    Put32(h, 8, bound);
    EXPECT_OK(DecodeHeader(h));
    if (bound == kMaxPayloadBytes) continue;  // the format's cap (LengthCapEnforced)
    Put32(h, 8, bound + 1);
    EXPECT_TRUE(IsError(
        DecodeHeader(h).status(), StatusCode::kProtocolError,
        {"frame header (" + std::string(FrameTypeName(type)) + ")",
         "payload length " + std::to_string(bound + 1), "exceeds limit " + std::to_string(bound)}));
  }
  EXPECT_EQ(MaxPayloadOf(static_cast<FrameType>(0)), 0u);
}

// The bounds are what the encoders write: a fixed-size message's encoding is exactly its bound,
// the largest variable one's exactly its (so no legitimate frame is ever refused).
TEST(WireFrameTest, TheBoundsAreTheEncodedSizesOfTheLargestMessages) {
  auto size_of = [](const auto& message) {
    std::vector<uint8_t> out;
    Encode(message, &out);
    return out.size();
  };
  EXPECT_EQ(
      size_of(Hello{0, Role::kSubscriber, 0, 0, std::string(kMaxEndpointBytes, 's'),
                    std::string(kMaxEndpointBytes, 'a'), std::string(kMaxLocalityBytes, 'l')}),
      MaxPayloadOf(FrameType::kHello));
  EXPECT_EQ(size_of(Redirect{std::string(kMaxEndpointBytes, 'r')}),
            MaxPayloadOf(FrameType::kRedirect));
  EXPECT_EQ(size_of(UpdateRequest{}), MaxPayloadOf(FrameType::kUpdateRequest));
  EXPECT_EQ(size_of(StepBegin{}), MaxPayloadOf(FrameType::kStepBegin));
  EXPECT_EQ(size_of(CopyDone{}), MaxPayloadOf(FrameType::kCopyDone));
  EXPECT_EQ(size_of(AllocationFd{}), MaxPayloadOf(FrameType::kAllocationFd));
  EXPECT_EQ(size_of(RingBucket{}), MaxPayloadOf(FrameType::kRingBucketReady));
  EXPECT_EQ(size_of(RingBucket{}), MaxPayloadOf(FrameType::kRingBucketDone));
  EXPECT_EQ(size_of(Challenge{}), MaxPayloadOf(FrameType::kChallenge));
  EXPECT_EQ(size_of(Auth{}), MaxPayloadOf(FrameType::kAuth));
  EXPECT_EQ(size_of(AuthOk{}), MaxPayloadOf(FrameType::kAuthOk));
  EXPECT_EQ(size_of(NcclSetup{}), MaxPayloadOf(FrameType::kNcclSetup));
  EXPECT_EQ(size_of(NcclId{}), MaxPayloadOf(FrameType::kNcclId));
  StepEnd end;
  end.digests.resize(kMaxDigests);
  EXPECT_EQ(size_of(end), MaxPayloadOf(FrameType::kStepEnd));
  DeltaBegin delta;
  delta.base_step = 0;
  delta.step = 1;
  delta.bytes.resize(kMaxDigests);
  EXPECT_EQ(size_of(delta), MaxPayloadOf(FrameType::kDeltaBegin));
  EXPECT_EQ(size_of(ErrorMessage{StatusCode::kInternal, std::string(kMaxErrorMessageBytes, 'x')}),
            MaxPayloadOf(FrameType::kError));
  Select select;
  select.ranges.assign(kMaxSelectRanges, SelectRange{0, 0, 1});
  EXPECT_EQ(size_of(select), MaxPayloadOf(FrameType::kSelect));
}

TEST(WireFrameTest, PayloadLengthMismatchIsProtocolError) {
  const std::vector<uint8_t> payload = Bytes("hello world");
  Result<FrameHeader> header = DecodeHeader(EncodeFor(FrameType::kError, payload));
  ASSERT_OK(header);
  std::vector<uint8_t> shorter(payload.begin(), payload.end() - 1);
  EXPECT_TRUE(IsError(VerifyPayload(*header, shorter), StatusCode::kProtocolError,
                      {"error", "payload has 10 bytes", "header says 11"}));
  std::vector<uint8_t> longer = payload;
  longer.push_back(0);
  EXPECT_TRUE(IsError(VerifyPayload(*header, longer), StatusCode::kProtocolError,
                      {"payload has 12 bytes"}));
}

TEST(WireFrameTest, EveryBitFlipInPayloadIsCorruption) {
  const std::vector<uint8_t> payload = Bytes("0123456789abcdef-weights");
  Result<FrameHeader> header = DecodeHeader(EncodeFor(FrameType::kStepEnd, payload));
  ASSERT_OK(header);
  for (size_t bit = 0; bit < payload.size() * 8; ++bit) {
    std::vector<uint8_t> flipped = payload;
    flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    EXPECT_TRUE(IsError(VerifyPayload(*header, flipped), StatusCode::kCorruption,
                        {"step_end", "checksum", "header says"}))
        << "bit " << bit;
  }
}

TEST(WireFrameTest, ChecksumFieldMismatchIsCorruption) {
  const std::vector<uint8_t> payload = Bytes("abc");
  Header h = EncodeFor(FrameType::kHello, payload);
  h[20] ^= 0x01;  // a checksum byte: the header stays well-formed
  Result<FrameHeader> header = DecodeHeader(h);
  ASSERT_OK(header);
  EXPECT_TRUE(IsError(VerifyPayload(*header, payload), StatusCode::kCorruption, {"checksum"}));
}

TEST(WireFrameTest, RandomHeadersNeverCrashAndOnlyValidOnesPass) {
  std::mt19937_64 rng(20261129);
  int accepted = 0;
  for (int iter = 0; iter < 10000; ++iter) {
    Header h;
    for (uint8_t& b : h) b = static_cast<uint8_t>(rng());
    // Mix fully random headers with valid prefixes of random length (so the later checks are
    // reached too) and with valid headers carrying a random length.
    const Header valid = EncodeFor(static_cast<FrameType>(1 + iter % kMaxFrameType), {});
    switch (iter % 3) {
      case 0:
        break;
      case 1:
        std::copy(valid.begin(), valid.begin() + rng() % (kHeaderBytes + 1), h.begin());
        break;
      case 2:
        std::copy(valid.begin(), valid.begin() + 16, h.begin());
        if (iter % 2 == 0) Put32(h, 8, static_cast<uint32_t>(rng() % (kMaxPayloadBytes + 1)));
        break;
    }
    Result<FrameHeader> decoded = DecodeHeader(h);
    if (decoded.ok()) {
      ++accepted;
      uint32_t magic = h[0] | h[1] << 8 | h[2] << 16 | uint32_t{h[3]} << 24;
      uint32_t reserved = h[12] | h[13] << 8 | h[14] << 16 | uint32_t{h[15]} << 24;
      EXPECT_EQ(magic, kMagic);
      EXPECT_EQ(h[4] | h[5] << 8, kProtocolVersion);
      EXPECT_EQ(reserved, 0u);
      EXPECT_LE(decoded->length, MaxPayloadOf(decoded->type));
    } else {
      EXPECT_EQ(decoded.status().code(), StatusCode::kProtocolError);
    }
  }
  // The valid headers with an in-cap length (a sixth of the iterations) must all pass.
  EXPECT_GE(accepted, 10000 / 6);
}

}  // namespace
}  // namespace weightsync::wire
