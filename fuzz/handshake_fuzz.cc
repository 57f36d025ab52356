// libFuzzer target: the TCP session-setup decoders (src/wire/handshake.h). Challenge and Auth run
// before the peer is authenticated: Challenge and AuthOk are read by the subscriber, Auth, Select
// and NcclSetup by the publisher, NcclId by the subscriber.
//
// Input: one selector byte (% 6: Challenge, Auth, AuthOk, Select, NcclSetup, NcclId), then the
// payload.
// Properties checked besides "no sanitizer report":
//   - a decoder fails only with ProtocolError;
//   - a decoded message re-encodes to exactly the payload, also when decoded into a used object;
//   - a decoded Select has at most kMaxSelectRanges ranges, none empty, none whose end wraps;
//   - the MACs over a decoded Challenge/Auth are deterministic, differ between the client and
//     server side, and MacEquals agrees with byte equality.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "fuzz_check.h"
#include "wire/handshake.h"

namespace {

using weightsync::Status;
using weightsync::StatusCode;
namespace wire = weightsync::wire;

constexpr std::string_view kToken = "fuzz-token-0123456789abcdef";

template <typename M>
bool RoundTrip(std::span<const uint8_t> payload, M* m) {
  Status s = wire::Decode(payload, m);
  if (!s.ok()) {
    WS_FUZZ_CHECK(s.code() == StatusCode::kProtocolError, "%s", s.ToString().c_str());
    return false;
  }
  std::vector<uint8_t> out;
  wire::Encode(*m, &out);
  WS_FUZZ_CHECK(out.size() == payload.size() && std::equal(out.begin(), out.end(), payload.begin()),
                "decoded message re-encodes to %zu bytes that differ from the %zu-byte payload",
                out.size(), payload.size());
  Status again = wire::Decode(payload, m);
  WS_FUZZ_CHECK(again.ok(), "second decode failed: %s", again.ToString().c_str());
  out.clear();
  wire::Encode(*m, &out);
  WS_FUZZ_CHECK(out.size() == payload.size() && std::equal(out.begin(), out.end(), payload.begin()),
                "re-decoding into a used message changed its encoding");
  return true;
}

void CheckMacs(const wire::Challenge& challenge, const wire::Nonce& client_nonce,
               const wire::Mac& received) {
  const wire::Mac client = wire::ComputeMac(kToken, wire::MacSide::kClient, challenge, client_nonce,
                                            wire::Role::kSubscriber);
  const wire::Mac again = wire::ComputeMac(kToken, wire::MacSide::kClient, challenge, client_nonce,
                                           wire::Role::kSubscriber);
  const wire::Mac server = wire::ComputeMac(kToken, wire::MacSide::kServer, challenge, client_nonce,
                                            wire::Role::kSubscriber);
  WS_FUZZ_CHECK(client == again && wire::MacEquals(client, again), "MAC not deterministic");
  WS_FUZZ_CHECK(client != server && !wire::MacEquals(client, server),
                "client and server MACs coincide");
  WS_FUZZ_CHECK(wire::MacEquals(client, received) == (client == received),
                "MacEquals disagrees with byte equality");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::span<const uint8_t> payload(data + 1, size - 1);
  switch (data[0] % 6) {
    case 0: {
      wire::Challenge m;
      if (RoundTrip(payload, &m)) CheckMacs(m, wire::Nonce{}, wire::Mac{});
      break;
    }
    case 1: {
      wire::Auth m;
      if (RoundTrip(payload, &m)) {
        wire::Challenge challenge{1, 42, wire::Nonce{}, true};
        CheckMacs(challenge, m.client_nonce, m.mac);
      }
      break;
    }
    case 2: {
      wire::AuthOk m;
      if (RoundTrip(payload, &m)) {
        WS_FUZZ_CHECK(wire::MacEquals(m.mac, m.mac), "MacEquals(x, x) is false");
      }
      break;
    }
    case 3: {
      wire::Select m;
      if (RoundTrip(payload, &m)) {
        WS_FUZZ_CHECK(m.ranges.size() <= wire::kMaxSelectRanges, "select of %zu ranges",
                      m.ranges.size());
        for (const wire::SelectRange& range : m.ranges) {
          WS_FUZZ_CHECK(range.bytes > 0 && range.offset + range.bytes > range.offset,
                        "select range [%llu, +%llu) is empty or wraps",
                        static_cast<unsigned long long>(range.offset),
                        static_cast<unsigned long long>(range.bytes));
        }
      }
      break;
    }
    case 4: {
      wire::NcclSetup m;
      RoundTrip(payload, &m);
      break;
    }
    case 5: {
      wire::NcclId m;
      RoundTrip(payload, &m);
      break;
    }
  }
  return 0;
}
