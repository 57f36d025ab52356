// Bounded little-endian payload writer and reader. The reader never reads past its span and
// reports what was malformed; the writer appends to a caller-owned buffer that is reused across
// frames (clear() keeps capacity, so steady-state encoding does not allocate).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "weightsync/status.h"

namespace weightsync::wire {

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>* out) : out_(out) {}
  void U8(uint8_t v);
  void U16(uint16_t v);
  void U32(uint32_t v);
  void U64(uint64_t v);
  void I64(int64_t v) { U64(static_cast<uint64_t>(v)); }
  void String(std::string_view s);  // u16 length + bytes; caller keeps s ≤ 65535 bytes

 private:
  std::vector<uint8_t>* out_;
};

class Reader {
 public:
  // `what` names the message in errors: "welcome: truncated reading tensor 3 name".
  Reader(std::span<const uint8_t> bytes, std::string_view what) : bytes_(bytes), what_(what) {}
  Result<uint8_t> U8(std::string_view field);
  Result<uint16_t> U16(std::string_view field);
  Result<uint32_t> U32(std::string_view field);
  Result<uint64_t> U64(std::string_view field);
  Result<int64_t> I64(std::string_view field);
  // u16 length, then bytes; length > max_len → ProtocolError.
  Result<std::string> String(std::string_view field, uint32_t max_len);
  // A String that a peer names and we log or dial (an endpoint, a locality, a peer's address):
  // printable ASCII (0x21..0x7E, and the space too where `spaces`), empty only where
  // `may_be_empty`; anything else → ProtocolError naming the first byte outside.
  Result<std::string> Text(std::string_view field, uint32_t max_len, bool may_be_empty,
                           bool spaces = false);
  // Text into `out`, reusing its storage.
  Status TextInto(std::string_view field, uint32_t max_len, bool may_be_empty, bool spaces,
                  std::string* out);
  // Count fields: value > max → ProtocolError; also rejects a count whose minimum encoded size
  // (count * min_item_bytes) exceeds the bytes left, before anything is allocated.
  Result<uint32_t> Count(std::string_view field, uint32_t max, uint32_t min_item_bytes);
  size_t remaining() const { return bytes_.size() - pos_; }
  // ProtocolError if bytes remain.
  Status ExpectEnd();

 private:
  Status Truncated(std::string_view field, size_t need) const;
  // String's bounds checks; the bytes stay in the payload.
  Result<std::string_view> StringView(std::string_view field, uint32_t max_len);
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
  std::string_view what_;
};

}  // namespace weightsync::wire
