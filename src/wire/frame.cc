#include "wire/frame.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <string>

#include "util/hash.h"
#include "wire/handshake.h"
#include "wire/members_report.h"
#include "wire/messages.h"

namespace weightsync::wire {
namespace {

// Header field offsets; the layout is documented in frame.h and docs/wire_format.md.
constexpr size_t kMagicAt = 0;
constexpr size_t kVersionAt = 4;
constexpr size_t kTypeAt = 6;
constexpr size_t kLengthAt = 8;
constexpr size_t kReservedAt = 12;
constexpr size_t kChecksumAt = 16;
static_assert(kChecksumAt + 8 == kHeaderBytes);

template <typename T>
void StoreLittleEndian(uint8_t* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

template <typename T>
T LoadLittleEndian(const uint8_t* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<T>(p[i]) << (8 * i));
  return v;
}

std::string Hex(uint64_t v, int digits) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%0*" PRIx64, digits, v);
  return buf;
}

bool IsKnownType(uint16_t type) { return type >= kMinFrameType && type <= kMaxFrameType; }

}  // namespace

std::string_view FrameTypeName(FrameType type) {
  switch (type) {
    case FrameType::kHello:
      return "hello";
    case FrameType::kWelcome:
      return "welcome";
    case FrameType::kUpdateRequest:
      return "update_request";
    case FrameType::kStepBegin:
      return "step_begin";
    case FrameType::kCopyDone:
      return "copy_done";
    case FrameType::kStepEnd:
      return "step_end";
    case FrameType::kError:
      return "error";
    case FrameType::kChallenge:
      return "challenge";
    case FrameType::kAuth:
      return "auth";
    case FrameType::kAuthOk:
      return "auth_ok";
    case FrameType::kSelect:
      return "select";
    case FrameType::kNcclSetup:
      return "nccl_setup";
    case FrameType::kAllocationFd:
      return "allocation_fd";
    case FrameType::kNcclId:
      return "nccl_id";
    case FrameType::kRingBucketReady:
      return "ring_bucket_ready";
    case FrameType::kRingBucketDone:
      return "ring_bucket_done";
    case FrameType::kDeltaBegin:
      return "delta_begin";
    case FrameType::kRedirect:
      return "redirect";
    case FrameType::kMembersReport:
      return "members_report";
  }
  return "unknown";
}

void EncodeHeader(FrameType type, std::span<const uint8_t> payload,
                  std::span<uint8_t, kHeaderBytes> out) {
  StoreLittleEndian<uint32_t>(out.data() + kMagicAt, kMagic);
  StoreLittleEndian<uint16_t>(out.data() + kVersionAt, kProtocolVersion);
  StoreLittleEndian<uint16_t>(out.data() + kTypeAt, static_cast<uint16_t>(type));
  // Callers keep payloads ≤ kMaxPayloadBytes (the receiver rejects larger ones anyway).
  StoreLittleEndian<uint32_t>(out.data() + kLengthAt, static_cast<uint32_t>(payload.size()));
  StoreLittleEndian<uint32_t>(out.data() + kReservedAt, 0);
  StoreLittleEndian<uint64_t>(out.data() + kChecksumAt,
                              util::Hash64(payload.data(), payload.size()));
}

uint32_t MaxPayloadOf(FrameType type) {
  switch (type) {
    case FrameType::kHello:
      return kMaxHelloBytes;
    case FrameType::kWelcome:
      return kMaxPayloadBytes;  // up to kMaxTensors placements: the format's limit bounds it
    case FrameType::kUpdateRequest:
      return kUpdateRequestBytes;
    case FrameType::kStepBegin:
      return kStepBeginBytes;
    case FrameType::kCopyDone:
      return kCopyDoneBytes;
    case FrameType::kStepEnd:
      return kMaxStepEndBytes;
    case FrameType::kError:
      return kMaxErrorBytes;
    case FrameType::kChallenge:
      return kChallengeBytes;
    case FrameType::kAuth:
      return kAuthBytes;
    case FrameType::kAuthOk:
      return kAuthOkBytes;
    case FrameType::kSelect:
      return kMaxSelectBytes;
    case FrameType::kNcclSetup:
      return kNcclSetupBytes;
    case FrameType::kNcclId:
      return kNcclIdBytes;
    case FrameType::kAllocationFd:
      return kAllocationFdBytes;
    case FrameType::kRingBucketReady:
    case FrameType::kRingBucketDone:
      return kRingBucketBytes;
    case FrameType::kDeltaBegin:
      return kMaxDeltaBeginBytes;
    case FrameType::kRedirect:
      return kMaxRedirectBytes;
    case FrameType::kMembersReport:
      return kMaxMembersReportBytes;
  }
  return 0;
}

Result<FrameHeader> DecodeHeader(std::span<const uint8_t, kHeaderBytes> bytes,
                                 uint32_t max_payload) {
  const uint8_t* p = bytes.data();
  // Magic first: a peer speaking another protocol (or a stray connection) should be told so,
  // rather than getting an error about a field that only means something in our format.
  const uint32_t magic = LoadLittleEndian<uint32_t>(p + kMagicAt);
  if (magic != kMagic) {
    return Status::ProtocolError("frame header: magic ", Hex(magic, 8), ", expected ",
                                 Hex(kMagic, 8), " (\"WSYN\")");
  }
  const uint16_t version = LoadLittleEndian<uint16_t>(p + kVersionAt);
  if (version != kProtocolVersion) {
    return Status::ProtocolError("frame header: protocol version ", version, ", expected ",
                                 kProtocolVersion);
  }
  const uint16_t type = LoadLittleEndian<uint16_t>(p + kTypeAt);
  if (!IsKnownType(type)) {
    return Status::ProtocolError("frame header: frame type ", type, " unknown, expected ",
                                 kMinFrameType, "..", kMaxFrameType);
  }
  const std::string_view name = FrameTypeName(static_cast<FrameType>(type));
  const uint32_t reserved = LoadLittleEndian<uint32_t>(p + kReservedAt);
  if (reserved != 0) {
    return Status::ProtocolError("frame header (", name, "): reserved field ", Hex(reserved, 8),
                                 ", expected 0");
  }
  // A caller may lower the cap (e.g. before authentication) but never raise it past the format's,
  // nor past what a frame of this type can hold.
  const uint32_t cap =
      std::min({max_payload, kMaxPayloadBytes, MaxPayloadOf(static_cast<FrameType>(type))});
  const uint32_t length = LoadLittleEndian<uint32_t>(p + kLengthAt);
  if (length > cap) {
    return Status::ProtocolError("frame header (", name, "): payload length ", length,
                                 " exceeds limit ", cap);
  }
  FrameHeader header;
  header.type = static_cast<FrameType>(type);
  header.length = length;
  header.checksum = LoadLittleEndian<uint64_t>(p + kChecksumAt);
  return header;
}

Status VerifyPayload(const FrameHeader& header, std::span<const uint8_t> payload) {
  if (payload.size() != header.length) {
    return Status::ProtocolError("frame ", FrameTypeName(header.type), ": payload has ",
                                 payload.size(), " bytes, header says ", header.length);
  }
  const uint64_t actual = util::Hash64(payload.data(), payload.size());
  if (actual != header.checksum) {
    return Status::Corruption("frame ", FrameTypeName(header.type), ": payload checksum ",
                              Hex(actual, 16), ", header says ", Hex(header.checksum, 16), " (",
                              payload.size(), " bytes)");
  }
  return Status::Ok();
}

}  // namespace weightsync::wire
