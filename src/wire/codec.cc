#include "wire/codec.h"

#include <cstddef>
#include <cstdint>
#include <limits>

namespace weightsync::wire {
namespace {

// Explicit shifts rather than memcpy of the host representation: the wire is little-endian by
// definition, and compilers turn these loops into a single load/store on little-endian hosts.
template <typename T>
void AppendLittleEndian(std::vector<uint8_t>* out, T v) {
  uint8_t bytes[sizeof(T)];
  for (size_t i = 0; i < sizeof(T); ++i) bytes[i] = static_cast<uint8_t>(v >> (8 * i));
  out->insert(out->end(), bytes, bytes + sizeof(T));
}

template <typename T>
T LoadLittleEndian(const uint8_t* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<T>(p[i]) << (8 * i));
  return v;
}

constexpr size_t kMaxStringBytes = std::numeric_limits<uint16_t>::max();

}  // namespace

void Writer::U8(uint8_t v) { out_->push_back(v); }
void Writer::U16(uint16_t v) { AppendLittleEndian(out_, v); }
void Writer::U32(uint32_t v) { AppendLittleEndian(out_, v); }
void Writer::U64(uint64_t v) { AppendLittleEndian(out_, v); }

void Writer::String(std::string_view s) {
  // The contract says s fits a u16 length. If a caller breaks it, writing the low 16 bits of the
  // length followed by all the bytes would desynchronise every later field; clamping keeps the
  // frame self-consistent (the decoder's own name/message caps then reject or accept it).
  if (s.size() > kMaxStringBytes) s = s.substr(0, kMaxStringBytes);
  U16(static_cast<uint16_t>(s.size()));
  out_->insert(out_->end(), s.begin(), s.end());
}

Status Reader::Truncated(std::string_view field, size_t need) const {
  return Status::ProtocolError(what_, ": truncated reading ", field, ": need ", need, " bytes, ",
                               remaining(), " left");
}

// Each fixed-width read checks the bound first and leaves the position unchanged on failure.
Result<uint8_t> Reader::U8(std::string_view field) {
  if (remaining() < 1) return Truncated(field, 1);
  return bytes_[pos_++];
}

Result<uint16_t> Reader::U16(std::string_view field) {
  if (remaining() < 2) return Truncated(field, 2);
  uint16_t v = LoadLittleEndian<uint16_t>(bytes_.data() + pos_);
  pos_ += 2;
  return v;
}

Result<uint32_t> Reader::U32(std::string_view field) {
  if (remaining() < 4) return Truncated(field, 4);
  uint32_t v = LoadLittleEndian<uint32_t>(bytes_.data() + pos_);
  pos_ += 4;
  return v;
}

Result<uint64_t> Reader::U64(std::string_view field) {
  if (remaining() < 8) return Truncated(field, 8);
  uint64_t v = LoadLittleEndian<uint64_t>(bytes_.data() + pos_);
  pos_ += 8;
  return v;
}

Result<int64_t> Reader::I64(std::string_view field) {
  WS_ASSIGN_OR_RETURN(uint64_t v, U64(field));
  return static_cast<int64_t>(v);  // two's complement, well-defined since C++20
}

Result<std::string_view> Reader::StringView(std::string_view field, uint32_t max_len) {
  if (remaining() < 2) return Truncated(field, 2);
  const uint16_t len = LoadLittleEndian<uint16_t>(bytes_.data() + pos_);
  // Check the cap before the bytes are present so an oversize length is reported as such, not as
  // a truncation.
  if (len > max_len) {
    return Status::ProtocolError(what_, ": ", field, " length ", len, " exceeds limit ", max_len);
  }
  if (remaining() - 2 < len) return Truncated(field, size_t{2} + len);
  const char* start = reinterpret_cast<const char*>(bytes_.data() + pos_ + 2);
  pos_ += size_t{2} + len;
  return std::string_view(start, len);
}

Result<std::string> Reader::String(std::string_view field, uint32_t max_len) {
  WS_ASSIGN_OR_RETURN(std::string_view text, StringView(field, max_len));
  return std::string(text);
}

Status Reader::TextInto(std::string_view field, uint32_t max_len, bool may_be_empty, bool spaces,
                        std::string* out) {
  WS_ASSIGN_OR_RETURN(std::string_view text, StringView(field, max_len));
  if (text.empty() && !may_be_empty) return Status::ProtocolError(what_, ": ", field, " is empty");
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<uint8_t>(text[i]);
    if ((c == 0x20 && spaces) || (c > 0x20 && c < 0x7f)) continue;
    return Status::ProtocolError(what_, ": ", field, " byte ", i, " is ", unsigned{c},
                                 ", expected printable ASCII");
  }
  out->assign(text);  // into its storage: a steady decode allocates nothing
  return Status::Ok();
}

Result<std::string> Reader::Text(std::string_view field, uint32_t max_len, bool may_be_empty,
                                 bool spaces) {
  std::string text;
  WS_RETURN_IF_ERROR(TextInto(field, max_len, may_be_empty, spaces, &text));
  return text;
}

Result<uint32_t> Reader::Count(std::string_view field, uint32_t max, uint32_t min_item_bytes) {
  WS_ASSIGN_OR_RETURN(uint32_t count, U32(field));
  if (count > max) {
    return Status::ProtocolError(what_, ": ", field, " ", count, " exceeds limit ", max);
  }
  // 32 x 32 bits cannot overflow 64 bits. Rejecting here bounds any later reserve()/resize() by
  // the bytes actually received, so a few hostile bytes cannot make us allocate gigabytes.
  const uint64_t min_bytes = uint64_t{count} * min_item_bytes;
  if (min_bytes > remaining()) {
    return Status::ProtocolError(what_, ": ", field, " ", count, " needs at least ", min_bytes,
                                 " bytes, only ", remaining(), " left");
  }
  return count;
}

Status Reader::ExpectEnd() {
  if (remaining() != 0) {
    return Status::ProtocolError(what_, ": ", remaining(),
                                 " trailing bytes after the last field (payload ", bytes_.size(),
                                 " bytes, fields end at ", pos_, ")");
  }
  return Status::Ok();
}

}  // namespace weightsync::wire
