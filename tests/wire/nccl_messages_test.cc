// The nccl set-up messages of the tcp session (src/wire/handshake.h): nccl_setup (subscriber →
// publisher) and nccl_id (publisher → subscriber). Golden layout, round trip, every truncation,
// trailing bytes, the zero-version refusal, and seeded random payloads that must never crash.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "testing/test_util.h"
#include "wire/frame.h"
#include "wire/handshake.h"

namespace weightsync::wire {
namespace {

template <typename M>
std::vector<uint8_t> EncodeOf(const M& m) {
  std::vector<uint8_t> out;
  Encode(m, &out);
  return out;
}

template <typename M>
void ExpectEveryPrefixAndTrailingByteRejected(const std::vector<uint8_t>& bytes) {
  for (size_t n = 0; n < bytes.size(); ++n) {
    M out;
    Status s = Decode(std::span(bytes.data(), n), &out);
    EXPECT_STATUS_IS(kProtocolError, s, "truncated") << "prefix of " << n << " bytes";
  }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  M out;
  Status s = Decode(longer, &out);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
}

TEST(WireNcclFrames, TypesAndNames) {
  EXPECT_EQ(static_cast<uint16_t>(FrameType::kNcclSetup), 12);
  EXPECT_EQ(static_cast<uint16_t>(FrameType::kNcclId), 13);
  EXPECT_EQ(static_cast<uint16_t>(FrameType::kAllocationFd), 14);
  EXPECT_EQ(static_cast<uint16_t>(FrameType::kRingBucketReady), 15);
  EXPECT_EQ(static_cast<uint16_t>(FrameType::kRingBucketDone), 16);
  EXPECT_EQ(kMaxFrameType, 19);  // members_report (members_report_test.cc) is the last
  EXPECT_EQ(FrameTypeName(FrameType::kRingBucketReady), "ring_bucket_ready");
  EXPECT_EQ(FrameTypeName(FrameType::kRingBucketDone), "ring_bucket_done");
  EXPECT_EQ(FrameTypeName(FrameType::kNcclSetup), "nccl_setup");
  EXPECT_EQ(FrameTypeName(FrameType::kNcclId), "nccl_id");
  // Both frame types pass the header check (type range) and carry their payload checksum.
  for (FrameType type : {FrameType::kNcclSetup, FrameType::kNcclId}) {
    std::vector<uint8_t> payload = {1, 2, 3};
    std::array<uint8_t, kHeaderBytes> h{};
    EncodeHeader(type, payload, h);
    auto decoded = DecodeHeader(h);
    ASSERT_OK(decoded);
    EXPECT_EQ(decoded->type, type);
    EXPECT_OK(VerifyPayload(*decoded, payload));
  }
}

TEST(WireNcclSetup, GoldenLayoutAndRoundTrip) {
  const NcclSetup in{22809, 1};
  const std::vector<uint8_t> bytes = EncodeOf(in);
  const std::vector<uint8_t> golden = {0x19, 0x59, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00};
  EXPECT_EQ(bytes, golden);
  NcclSetup out;
  ASSERT_OK(Decode(bytes, &out));
  EXPECT_EQ(out.nccl_version, 22809u);
  EXPECT_EQ(out.device, 1u);
}

TEST(WireNcclSetup, TruncatedTrailingAndZeroVersionRejected) {
  ExpectEveryPrefixAndTrailingByteRejected<NcclSetup>(EncodeOf(NcclSetup{22809, 0}));
  NcclSetup out;
  Status s = Decode(EncodeOf(NcclSetup{0, 3}), &out);
  EXPECT_STATUS_IS(kProtocolError, s, "nccl_setup", "nccl_version 0");
  s = Decode(std::span(EncodeOf(NcclSetup{22809, 0}).data(), 5), &out);
  EXPECT_STATUS_IS(kProtocolError, s, "nccl_setup: truncated reading device");
}

TEST(WireNcclId, GoldenLayoutAndRoundTrip) {
  NcclId in;
  in.nccl_version = 22809;
  for (size_t i = 0; i < in.unique_id.size(); ++i) in.unique_id[i] = static_cast<uint8_t>(i * 7);
  const std::vector<uint8_t> bytes = EncodeOf(in);
  ASSERT_EQ(bytes.size(), 4u + kNcclUniqueIdBytes);
  EXPECT_EQ(bytes[0], 0x19);
  EXPECT_EQ(bytes[1], 0x59);
  EXPECT_EQ(bytes[2], 0x00);
  EXPECT_EQ(bytes[3], 0x00);
  for (size_t i = 0; i < kNcclUniqueIdBytes; ++i) EXPECT_EQ(bytes[4 + i], in.unique_id[i]);
  NcclId out;
  ASSERT_OK(Decode(bytes, &out));
  EXPECT_EQ(out.nccl_version, in.nccl_version);
  EXPECT_EQ(out.unique_id, in.unique_id);
}

TEST(WireNcclId, TruncatedTrailingAndZeroVersionRejected) {
  NcclId in;
  in.nccl_version = 22809;
  in.unique_id.fill(0xAB);
  ExpectEveryPrefixAndTrailingByteRejected<NcclId>(EncodeOf(in));
  in.nccl_version = 0;
  NcclId out;
  Status s = Decode(EncodeOf(in), &out);
  EXPECT_STATUS_IS(kProtocolError, s, "nccl_id", "nccl_version 0");
}

TEST(WireNcclFrames, SeededRandomPayloadsNeverCrash) {
  std::mt19937_64 rng(20261130);
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> bytes(rng() % 160);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    NcclSetup setup;
    Status a = Decode(bytes, &setup);
    if (a.ok()) {
      EXPECT_EQ(bytes.size(), 8u);
      EXPECT_EQ(EncodeOf(setup), bytes);  // canonical: decode → encode gives the same bytes
    }
    NcclId id;
    Status b = Decode(bytes, &id);
    if (b.ok()) {
      EXPECT_EQ(bytes.size(), 4u + kNcclUniqueIdBytes);
      EXPECT_EQ(EncodeOf(id), bytes);
    }
  }
  // Mutations of a valid nccl_id: any single-byte change decodes (no field is constrained but
  // the version) and re-encodes to itself, or is refused as a protocol error.
  NcclId in;
  in.nccl_version = 22809;
  const std::vector<uint8_t> valid = EncodeOf(in);
  for (size_t at = 0; at < valid.size(); ++at) {
    std::vector<uint8_t> m = valid;
    m[at] ^= static_cast<uint8_t>(1 + rng() % 255);
    NcclId out;
    Status s = Decode(m, &out);
    if (s.ok()) {
      EXPECT_EQ(EncodeOf(out), m);
    } else {
      EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s;
    }
  }
}

}  // namespace
}  // namespace weightsync::wire
