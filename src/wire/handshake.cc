#include "wire/handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>

#include "wire/codec.h"

namespace weightsync::wire {
namespace {

template <size_t N>
void PutBytes(Writer& w, const std::array<uint8_t, N>& bytes) {
  for (uint8_t b : bytes) w.U8(b);
}

template <size_t N>
Status GetBytes(Reader& r, std::string_view field, std::array<uint8_t, N>* out) {
  for (size_t i = 0; i < N; ++i) {
    WS_ASSIGN_OR_RETURN((*out)[i], r.U8(field));
  }
  return Status::Ok();
}

}  // namespace

void Encode(const Challenge& m, std::vector<uint8_t>* out) {
  Writer w(out);
  w.U16(m.protocol_version);
  w.U64(m.session_id);
  PutBytes(w, m.server_nonce);
  w.U8(m.auth_required ? 1 : 0);
}

void Encode(const Auth& m, std::vector<uint8_t>* out) {
  Writer w(out);
  w.U8(static_cast<uint8_t>(m.role));
  PutBytes(w, m.client_nonce);
  PutBytes(w, m.mac);
}

void Encode(const AuthOk& m, std::vector<uint8_t>* out) {
  Writer w(out);
  PutBytes(w, m.mac);
}

void Encode(const Select& m, std::vector<uint8_t>* out) {
  Writer w(out);
  w.U32(static_cast<uint32_t>(m.ranges.size()));
  for (const SelectRange& range : m.ranges) {
    w.U32(range.tensor);
    w.U64(range.offset);
    w.U64(range.bytes);
  }
}

void Encode(const NcclSetup& m, std::vector<uint8_t>* out) {
  Writer w(out);
  w.U32(m.nccl_version);
  w.U32(m.device);
}

void Encode(const NcclId& m, std::vector<uint8_t>* out) {
  Writer w(out);
  w.U32(m.nccl_version);
  PutBytes(w, m.unique_id);
}

Status Decode(std::span<const uint8_t> payload, Challenge* m) {
  Reader r(payload, "challenge");
  WS_ASSIGN_OR_RETURN(m->protocol_version, r.U16("protocol_version"));
  WS_ASSIGN_OR_RETURN(m->session_id, r.U64("session_id"));
  WS_RETURN_IF_ERROR(GetBytes(r, "server_nonce", &m->server_nonce));
  WS_ASSIGN_OR_RETURN(uint8_t required, r.U8("auth_required"));
  if (required > 1) {
    return Status::ProtocolError("challenge: auth_required is ", int(required),
                                 ", expected 0 or 1");
  }
  m->auth_required = required == 1;
  return r.ExpectEnd();
}

Status Decode(std::span<const uint8_t> payload, Auth* m) {
  Reader r(payload, "auth");
  WS_ASSIGN_OR_RETURN(uint8_t role, r.U8("role"));
  if (role != static_cast<uint8_t>(Role::kSubscriber)) {
    return Status::ProtocolError("auth: unknown role ", int(role), ", expected 1 (subscriber)");
  }
  m->role = Role::kSubscriber;
  WS_RETURN_IF_ERROR(GetBytes(r, "client_nonce", &m->client_nonce));
  WS_RETURN_IF_ERROR(GetBytes(r, "mac", &m->mac));
  return r.ExpectEnd();
}

Status Decode(std::span<const uint8_t> payload, AuthOk* m) {
  Reader r(payload, "auth_ok");
  WS_RETURN_IF_ERROR(GetBytes(r, "mac", &m->mac));
  return r.ExpectEnd();
}

Status Decode(std::span<const uint8_t> payload, Select* m) {
  Reader r(payload, "select");
  WS_ASSIGN_OR_RETURN(uint32_t count, r.Count("range count", kMaxSelectRanges, 4 + 8 + 8));
  m->ranges.clear();
  m->ranges.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    SelectRange range;
    WS_ASSIGN_OR_RETURN(range.tensor, r.U32("range tensor"));
    WS_ASSIGN_OR_RETURN(range.offset, r.U64("range offset"));
    WS_ASSIGN_OR_RETURN(range.bytes, r.U64("range bytes"));
    uint64_t end = 0;
    if (range.bytes == 0 || __builtin_add_overflow(range.offset, range.bytes, &end)) {
      return Status::ProtocolError("select: range ", i, " of tensor ", range.tensor, " [",
                                   range.offset, ", +", range.bytes, ") is empty or overflows");
    }
    m->ranges.push_back(range);
  }
  return r.ExpectEnd();
}

Status Decode(std::span<const uint8_t> payload, NcclSetup* m) {
  Reader r(payload, "nccl_setup");
  WS_ASSIGN_OR_RETURN(m->nccl_version, r.U32("nccl_version"));
  if (m->nccl_version == 0) {
    return Status::ProtocolError("nccl_setup: nccl_version 0, expected an NCCL_VERSION_CODE");
  }
  WS_ASSIGN_OR_RETURN(m->device, r.U32("device"));
  return r.ExpectEnd();
}

Status Decode(std::span<const uint8_t> payload, NcclId* m) {
  Reader r(payload, "nccl_id");
  WS_ASSIGN_OR_RETURN(m->nccl_version, r.U32("nccl_version"));
  if (m->nccl_version == 0) {
    return Status::ProtocolError("nccl_id: nccl_version 0, expected an NCCL_VERSION_CODE");
  }
  WS_RETURN_IF_ERROR(GetBytes(r, "unique_id", &m->unique_id));
  return r.ExpectEnd();
}

Mac ComputeMac(std::string_view token, MacSide side, const Challenge& challenge,
               const Nonce& client_nonce, Role role) {
  // label | server_nonce | client_nonce | session_id (LE64) | role | version (LE16), in a fixed
  // buffer: the transcript has one shape and needs no allocation.
  const std::string_view label =
      side == MacSide::kClient ? "weightsync-auth-client" : "weightsync-auth-server";
  std::array<uint8_t, 22 + kNonceBytes * 2 + 8 + 1 + 2> msg{};
  static_assert(sizeof("weightsync-auth-client") - 1 == 22);
  size_t at = 0;
  std::memcpy(msg.data() + at, label.data(), label.size());
  at += label.size();
  std::memcpy(msg.data() + at, challenge.server_nonce.data(), kNonceBytes);
  at += kNonceBytes;
  std::memcpy(msg.data() + at, client_nonce.data(), kNonceBytes);
  at += kNonceBytes;
  for (int i = 0; i < 8; ++i) msg[at++] = static_cast<uint8_t>(challenge.session_id >> (8 * i));
  msg[at++] = static_cast<uint8_t>(role);
  msg[at++] = static_cast<uint8_t>(challenge.protocol_version);
  msg[at++] = static_cast<uint8_t>(challenge.protocol_version >> 8);
  Mac mac{};
  if (token.empty()) return mac;
  unsigned int len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), msg.data(), at, mac.data(),
       &len);
  return mac;
}

bool MacEquals(const Mac& a, const Mac& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Result<Nonce> RandomNonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) {
    return Status::Internal("RAND_bytes failed: no randomness for a handshake nonce");
  }
  return n;
}

}  // namespace weightsync::wire
