// Control-frame envelope: a fixed 24-byte header followed by a payload.
//
//   offset size field
//   0      4    magic     0x4E595357 ("WSYN" as little-endian bytes W S Y N)
//   4      2    version   kProtocolVersion
//   6      2    type      FrameType
//   8      4    length    payload bytes, ≤ the decoder's cap (kMaxPayloadBytes at most)
//   12     4    reserved  must be 0
//   16     8    checksum  XXH3_64bits(payload)
// All integers little-endian. See docs/wire_format.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "weightsync/status.h"

namespace weightsync::wire {

inline constexpr uint32_t kMagic = 0x4E595357u;
// 7: GPU ring publishers (ArenaKind::kCudaRing); 6: ring publishers (ArenaKind::kHostRing,
// ring_bucket_ready/done frames); 5: zero-copy Welcomes list the publisher's allocations (IPC
// handles or cuMem chunks, whose fds follow in AllocationFd frames); 4: Welcome tensors may be
// regions, Select names byte ranges; 3: Welcome carries the publisher's lineage, UpdateRequest the
// subscriber's wait (2: nccl steps are grouped ncclBroadcast calls; 1: grouped ncclSend/ncclRecv).
// The header check refuses a peer of another version at once.
inline constexpr uint16_t kProtocolVersion = 11;
inline constexpr size_t kHeaderBytes = 24;
inline constexpr uint32_t kMaxPayloadBytes = 64u << 20;

enum class FrameType : uint16_t {
  kHello = 1,          // subscriber → publisher
  kWelcome = 2,        // publisher → subscriber, carries the arena fd (SCM_RIGHTS)
  kUpdateRequest = 3,  // subscriber → publisher
  kStepBegin = 4,      // publisher → subscriber: where the version lies
  kCopyDone = 5,       // subscriber → publisher: finished reading
  kStepEnd = 6,        // publisher → subscriber: segment digests; the version may be committed
  kError = 7,          // either way: a typed error, then the sender closes
  // TCP only (src/wire/handshake.h): mutual authentication, then the subscriber's selection.
  kChallenge = 8,  // publisher → subscriber, first frame on a TCP connection
  kAuth = 9,       // subscriber → publisher
  kAuthOk = 10,    // publisher → subscriber
  kSelect = 11,    // subscriber → publisher: which tensors to stream each step
  // TCP with a GPU arena (src/wire/handshake.h): the bytes move over NCCL, set up once.
  kNcclSetup = 12,  // subscriber → publisher: asks for an NCCL communicator
  kNcclId = 13,     // publisher → subscriber: the ncclUniqueId to join it with
  // Unix links to a zero-copy publisher of cuMem memory: one frame per chunk, right after the
  // Welcome, each carrying that chunk's POSIX fd (SCM_RIGHTS).
  kAllocationFd = 14,
  // Ring publishers (ArenaKind::kHostRing, kCudaRing), inside a step: bucket ready (publisher →
  // subscriber) and bucket read (subscriber → publisher), each a RingBucket.
  kRingBucketReady = 15,
  kRingBucketDone = 16,
  // TCP, a step a subscriber asked to receive as a delta (UpdateRequest::delta): publisher →
  // subscriber after step_begin, before the step's bytes (DeltaBegin).
  kDeltaBegin = 17,
  // Publisher → subscriber, answering a Hello instead of a Welcome: dial this relay (Redirect).
  kRedirect = 18,
  // Subscriber → publisher between updates: the step it committed and, for a relay, its subtree
  // (MembersReport, wire/members_report.h).
  kMembersReport = 19,
};
inline constexpr uint16_t kMinFrameType = 1;
inline constexpr uint16_t kMaxFrameType = 19;

std::string_view FrameTypeName(FrameType type);  // "hello", ..., "unknown"

struct FrameHeader {
  FrameType type = FrameType::kError;
  uint32_t length = 0;
  uint64_t checksum = 0;
};

// Writes the header for `payload` into `out`.
void EncodeHeader(FrameType type, std::span<const uint8_t> payload,
                  std::span<uint8_t, kHeaderBytes> out);

// The largest payload a frame of `type` can carry: what its message encodes to at most (the
// fixed size of a fixed-size message). A header claiming more can only be hostile or broken, so
// DecodeHeader refuses it before a byte of payload is read or a buffer reserved for it: a 24-byte
// header can never make a peer hold more than its frame type needs (a 15-byte hello never
// promises 64 MiB). 0 for an unknown type.
uint32_t MaxPayloadOf(FrameType type);

// Strict: wrong magic, version, unknown type, nonzero reserved or length > min(max_payload,
// MaxPayloadOf(type)) → ProtocolError naming the field, the expected and the actual value.
Result<FrameHeader> DecodeHeader(std::span<const uint8_t, kHeaderBytes> bytes,
                                 uint32_t max_payload = kMaxPayloadBytes);

// Corruption if the payload's XXH3 differs from the header's checksum, ProtocolError if its
// length differs from header.length.
Status VerifyPayload(const FrameHeader& header, std::span<const uint8_t> payload);

}  // namespace weightsync::wire
