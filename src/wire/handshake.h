// TCP session setup: mutual HMAC-SHA256 challenge-response over fresh nonces, then the
// subscriber's tensor selection. Nothing is allocated for a peer before its Auth verifies.
//
//   publisher → Challenge{version, session_id, server_nonce, auth_required}
//   subscriber → Auth{role, client_nonce, client_mac}
//       client_mac = HMAC(token, "weightsync-auth-client" | transcript)
//   publisher → AuthOk{server_mac}
//       server_mac = HMAC(token, "weightsync-auth-server" | transcript)
//   transcript = server_nonce | client_nonce | session_id (LE64) | role (u8) | version (LE16)
// Fresh nonces on both sides make every MAC single-use: a recorded Auth fails against a new
// challenge, a recorded AuthOk fails against a new client nonce. Without a token (loopback only)
// the MACs are all zero and auth_required is 0.
//
// When the Welcome names a GPU store (ArenaKind::kCudaMem, or a zero-copy or GPU ring publisher's
// tensors: kCudaIpc, kCudaRing) and the destinations are CUDA tensors, the bytes move over NCCL:
// after Select the subscriber sends NcclSetup and the publisher answers NcclId, whose unique id
// both sides use to join a two-rank communicator (publisher rank 0, subscriber rank 1), once per
// connection (src/transport/nccl/).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "weightsync/status.h"
#include "wire/frame.h"
#include "wire/messages.h"

namespace weightsync::wire {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

struct Challenge {
  uint16_t protocol_version = 0;
  uint64_t session_id = 0;
  Nonce server_nonce{};
  bool auth_required = false;
};

struct Auth {
  Role role = Role::kSubscriber;
  Nonce client_nonce{};
  Mac mac{};
};

struct AuthOk {
  Mac mac{};
};

// Encoded payload sizes, fixed for each message.
inline constexpr uint32_t kChallengeBytes = 2 + 8 + kNonceBytes + 1;
inline constexpr uint32_t kAuthBytes = 1 + kNonceBytes + kMacBytes;
inline constexpr uint32_t kAuthOkBytes = kMacBytes;

// The payload cap of a channel whose peer is not authenticated yet: the largest frame a peer may
// send before that — Hello (shm), Challenge, Auth, AuthOk (tcp), or an Error frame standing in
// for any of them (a publisher's "connection cap reached", "authentication failed"). Until then a
// header claiming more is refused from the header alone, so a stranger cannot make us reserve a
// full-size frame buffer (kMaxPayloadBytes) with 24 bytes. The Error frame sets the bound.
inline constexpr uint32_t kMaxHandshakePayloadBytes = std::max(
    {kMaxHelloBytes, kMaxRedirectBytes, kChallengeBytes, kAuthBytes, kAuthOkBytes, kMaxErrorBytes});

// The byte ranges of the publisher's tensors the subscriber's plan reads: a whole tensor, or the
// part of one a sharded subscriber wants (regions). The publisher streams exactly these bytes, in
// this order, every step, and checks each range against its tensor before the first step.
struct SelectRange {
  uint32_t tensor = 0;  // index into Welcome::tensors
  uint64_t offset = 0;  // bytes into that tensor
  uint64_t bytes = 0;   // > 0
  bool operator==(const SelectRange&) const = default;
};
// As many as one frame holds: a u32 count, then 20 bytes per range.
inline constexpr uint32_t kMaxSelectRanges = (kMaxPayloadBytes - 4) / 20;
static_assert(4 + uint64_t{kMaxSelectRanges} * 20 <= kMaxPayloadBytes);
struct Select {
  std::vector<SelectRange> ranges;
};

// Subscriber → publisher, after Select, when the arena is GPU memory: "set up NCCL".
struct NcclSetup {
  uint32_t nccl_version = 0;  // the subscriber's NCCL_VERSION_CODE (e.g. 22809 for 2.28.9); > 0
  uint32_t device = 0;        // CUDA ordinal of the subscriber's destinations (for logs)
};
inline constexpr uint32_t kNcclSetupBytes = 4 + 4;

// Publisher → subscriber: the communicator to join. The unique id is a bearer capability (it
// names NCCL's bootstrap listener): it only travels on an authenticated connection and is never
// logged.
inline constexpr size_t kNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
struct NcclId {
  uint32_t nccl_version = 0;  // the publisher's NCCL_VERSION_CODE; > 0
  std::array<uint8_t, kNcclUniqueIdBytes> unique_id{};
};
inline constexpr uint32_t kNcclIdBytes = 4 + kNcclUniqueIdBytes;
// The largest encoded Select: a u32 count, then 20 bytes per range.
inline constexpr uint32_t kMaxSelectBytes = 4 + kMaxSelectRanges * 20;

void Encode(const Challenge& m, std::vector<uint8_t>* out);
void Encode(const Auth& m, std::vector<uint8_t>* out);
void Encode(const AuthOk& m, std::vector<uint8_t>* out);
void Encode(const Select& m, std::vector<uint8_t>* out);
void Encode(const NcclSetup& m, std::vector<uint8_t>* out);
void Encode(const NcclId& m, std::vector<uint8_t>* out);
Status Decode(std::span<const uint8_t> payload, Challenge* m);
Status Decode(std::span<const uint8_t> payload, Auth* m);
Status Decode(std::span<const uint8_t> payload, AuthOk* m);
// Bounded by kMaxSelectRanges; rejects empty ranges and ranges whose end overflows (the indices
// and ends are checked against the Welcome by the publisher).
Status Decode(std::span<const uint8_t> payload, Select* m);
Status Decode(std::span<const uint8_t> payload, NcclSetup* m);
Status Decode(std::span<const uint8_t> payload, NcclId* m);

enum class MacSide { kClient, kServer };
Mac ComputeMac(std::string_view token, MacSide side, const Challenge& challenge,
               const Nonce& client_nonce, Role role);
// Constant-time comparison.
bool MacEquals(const Mac& a, const Mac& b);
// Cryptographically random nonce (OpenSSL RAND_bytes).
Result<Nonce> RandomNonce();

}  // namespace weightsync::wire
