// libFuzzer target: the control-frame header decoder and payload verification (src/wire/frame.h),
// the first code that touches bytes from an unauthenticated peer.
//
// Input: 24 header bytes, then the payload. Properties checked besides "no sanitizer report":
//   - DecodeHeader fails only with ProtocolError, and never accepts a length above the cap;
//   - a lowered cap is honoured (a header accepted under a cap has length ≤ that cap);
//   - VerifyPayload fails only with ProtocolError (length) or Corruption (checksum), and rejects
//     any payload whose length differs from the header's;
//   - a header that decodes and verifies re-encodes to exactly the input bytes (the encoding is
//     canonical, so nothing the decoder ignored can smuggle information).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "fuzz_check.h"
#include "wire/frame.h"

using weightsync::StatusCode;
namespace wire = weightsync::wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < wire::kHeaderBytes) return 0;
  std::span<const uint8_t, wire::kHeaderBytes> header_bytes(data, wire::kHeaderBytes);
  std::span<const uint8_t> payload(data + wire::kHeaderBytes, size - wire::kHeaderBytes);

  auto header = wire::DecodeHeader(header_bytes);
  if (!header.ok()) {
    WS_FUZZ_CHECK(header.status().code() == StatusCode::kProtocolError, "%s",
                  header.status().ToString().c_str());
    return 0;
  }
  WS_FUZZ_CHECK(header->length <= wire::kMaxPayloadBytes, "length %u", header->length);
  const auto type = static_cast<uint16_t>(header->type);
  WS_FUZZ_CHECK(type >= wire::kMinFrameType && type <= wire::kMaxFrameType, "type %u", type);

  // A cap lowered to the actual payload size (what a reader that already knows how much it will
  // accept passes) and one below it.
  const auto cap = static_cast<uint32_t>(payload.size());
  auto capped = wire::DecodeHeader(header_bytes, cap);
  WS_FUZZ_CHECK(capped.ok() == (header->length <= cap), "cap %u, length %u, %s", cap,
                header->length, capped.status().ToString().c_str());
  if (header->length > 0) {
    auto below = wire::DecodeHeader(header_bytes, header->length - 1);
    WS_FUZZ_CHECK(!below.ok() && below.status().code() == StatusCode::kProtocolError,
                  "length %u accepted under cap %u", header->length, header->length - 1);
  }

  weightsync::Status verified = wire::VerifyPayload(*header, payload);
  if (payload.size() != header->length) {
    WS_FUZZ_CHECK(!verified.ok() && verified.code() == StatusCode::kProtocolError,
                  "payload of %zu bytes, header length %u: %s", payload.size(), header->length,
                  verified.ToString().c_str());
  }
  if (!verified.ok()) {
    WS_FUZZ_CHECK(
        verified.code() == StatusCode::kProtocolError || verified.code() == StatusCode::kCorruption,
        "%s", verified.ToString().c_str());
    // A truncated read of the same frame: the reader got fewer bytes than announced.
    if (!payload.empty()) {
      (void)wire::VerifyPayload(*header, payload.first(payload.size() - 1));
    }
    return 0;
  }

  uint8_t reencoded[wire::kHeaderBytes];
  wire::EncodeHeader(header->type, payload, std::span<uint8_t, wire::kHeaderBytes>(reencoded));
  WS_FUZZ_CHECK(std::memcmp(reencoded, data, wire::kHeaderBytes) == 0,
                "accepted header does not re-encode to the input bytes");
  return 0;
}
