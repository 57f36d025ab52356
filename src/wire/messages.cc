#include "wire/messages.h"

#include <bit>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "util/hash.h"
#include "weightsync/dtype.h"
#include "wire/codec.h"

namespace weightsync::wire {
namespace {

// The `what` of each message's Reader, the prefix of every decode error.
constexpr std::string_view kHelloWhat = "hello";
constexpr std::string_view kRedirectWhat = "redirect";
constexpr std::string_view kWelcomeWhat = "welcome";
constexpr std::string_view kUpdateRequestWhat = "update_request";
constexpr std::string_view kStepBeginWhat = "step_begin";
constexpr std::string_view kCopyDoneWhat = "copy_done";
constexpr std::string_view kAllocationFdWhat = "allocation_fd";
constexpr std::string_view kRingBucketWhat = "ring_bucket";
constexpr std::string_view kStepEndWhat = "step_end";
constexpr std::string_view kDeltaBeginWhat = "delta_begin";
constexpr std::string_view kErrorWhat = "error";

// Smallest encoding of one Welcome tensor: name (u16 length + ≥ 1 byte), dtype, ndim (no dims),
// nbytes, region, offset. Lets Reader::Count reject a count the payload cannot hold before the
// tensor vector is reserved.
constexpr uint32_t kMinTensorBytes = 2 + 1 + 1 + 1 + 8 + 1 + 8 + 1;
constexpr uint32_t kDigestBytes = 8;

// Names come from the peer: quote them with non-printable bytes escaped and long ones shortened,
// so an error message stays one readable line whatever was sent.
void AppendQuoted(std::string_view name, std::string* out) {
  constexpr size_t kMaxShown = 128;
  out->push_back('\'');
  for (size_t i = 0; i < name.size() && i < kMaxShown; ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c >= 0x7F || c == '\'' || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out->append(buf);
    } else {
      out->push_back(static_cast<char>(c));
    }
  }
  if (name.size() > kMaxShown) out->append("...");
  out->push_back('\'');
}

std::string Quote(std::string_view name) {
  std::string out;
  AppendQuoted(name, &out);
  return out;
}

// Field labels for one Welcome tensor ("tensor 3 'model.x' dtype"), built in one reused buffer:
// Reader wants a label for every read, and formatting a fresh string per field would dominate the
// decoding of a large manifest. Each view returned is valid until the next call.
class TensorFields {
 public:
  void Start(uint32_t index) {
    buf_.assign("tensor ");
    AppendNumber(index);
    base_ = buf_.size();
  }
  void SetName(std::string_view name) {
    buf_.resize(base_);
    buf_.push_back(' ');
    AppendQuoted(name, &buf_);
    base_ = buf_.size();
  }
  // "tensor 3 'model.x'"
  std::string_view label() {
    buf_.resize(base_);
    return buf_;
  }
  std::string_view Field(std::string_view suffix) {
    buf_.resize(base_);
    buf_.push_back(' ');
    buf_.append(suffix);
    return buf_;
  }
  std::string_view Field(std::string_view suffix, uint32_t n) {
    Field(suffix);
    buf_.push_back(' ');
    AppendNumber(n);
    return buf_;
  }

 private:
  void AppendNumber(uint32_t n) {
    char digits[16];
    auto [end, ec] = std::to_chars(digits, digits + sizeof(digits), n);
    buf_.append(digits, end);
  }
  std::string buf_;
  size_t base_ = 0;
};

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  out += "]";
  return out;
}

// Status codes a peer may send: every non-OK code this build knows. kInternal is the last
// enumerator of StatusCode.
bool IsErrorCode(uint8_t code) {
  return code > static_cast<uint8_t>(StatusCode::kOk) &&
         code <= static_cast<uint8_t>(StatusCode::kInternal);
}

// Keeps an outgoing error message within kMaxErrorMessageBytes without splitting a UTF-8
// sequence, so the peer's decoder accepts it and prints it intact.
std::string_view TruncateUtf8(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  size_t end = max_bytes;
  // Back off over continuation bytes (10xxxxxx) to the start of the cut sequence.
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return s.substr(0, end);
}

// A sharded tensor's place in its global tensor: u8 sharded (0 or 1); if 1, the global name, then
// ndim global dims and ndim offsets (ndim of the tensor itself). Every offset + dim must fit its
// global dim, so a subscriber can trust the box when it schedules regions.
Status DecodeShard(Reader* r, TensorFields* fields, TensorPlacement* t) {
  WS_ASSIGN_OR_RETURN(uint8_t sharded, r->U8(fields->Field("sharded")));
  if (sharded > 1) {
    return Status::ProtocolError(kWelcomeWhat, ": ", fields->label(), " sharded ",
                                 static_cast<unsigned>(sharded), ", expected 0 or 1");
  }
  t->sharded = sharded == 1;
  t->shard = ShardOf{};
  if (!t->sharded) return Status::Ok();
  WS_ASSIGN_OR_RETURN(t->shard.tensor, r->String(fields->Field("global name"), kMaxNameBytes));
  if (t->shard.tensor.empty()) {
    return Status::ProtocolError(kWelcomeWhat, ": ", fields->label(), " global name is empty");
  }
  const size_t ndim = t->spec.shape.size();
  t->shard.global_shape.resize(ndim);
  t->shard.offset.resize(ndim);
  for (size_t d = 0; d < ndim; ++d) {
    WS_ASSIGN_OR_RETURN(t->shard.global_shape[d], r->I64(fields->Field("global dim", d)));
  }
  for (size_t d = 0; d < ndim; ++d) {
    WS_ASSIGN_OR_RETURN(t->shard.offset[d], r->I64(fields->Field("shard offset", d)));
    const int64_t offset = t->shard.offset[d], global = t->shard.global_shape[d];
    int64_t end = 0;
    if (offset < 0 || global < 0 || __builtin_add_overflow(offset, t->spec.shape[d], &end) ||
        end > global) {
      return Status::ProtocolError(kWelcomeWhat, ": ", fields->label(), " dim ", d, " shard [",
                                   offset, ", +", t->spec.shape[d], ") does not fit global dim ",
                                   global);
    }
  }
  return Status::Ok();
}

Status DecodeTensor(Reader* r, uint32_t index, TensorFields* fields, TensorPlacement* t) {
  fields->Start(index);
  WS_ASSIGN_OR_RETURN(t->spec.name, r->String(fields->Field("name"), kMaxNameBytes));
  if (t->spec.name.empty()) {
    return Status::ProtocolError(kWelcomeWhat, ": tensor ", index, " has an empty name");
  }
  fields->SetName(t->spec.name);

  WS_ASSIGN_OR_RETURN(uint8_t dtype_code, r->U8(fields->Field("dtype")));
  Result<DType> dtype = DTypeFromWire(dtype_code);
  if (!dtype.ok()) {
    return Status::ProtocolError(kWelcomeWhat, ": ", fields->label(), " dtype code ",
                                 static_cast<unsigned>(dtype_code), " is not a known dtype (1..",
                                 kDTypeCount, ")");
  }
  t->spec.dtype = *dtype;

  WS_ASSIGN_OR_RETURN(uint8_t ndim, r->U8(fields->Field("ndim")));
  if (ndim > kMaxDims) {
    return Status::ProtocolError(kWelcomeWhat, ": ", fields->label(), " ndim ",
                                 static_cast<unsigned>(ndim), " exceeds limit ", kMaxDims);
  }
  t->spec.shape.resize(ndim);
  // Element count as the mathematical product: any zero dim makes it 0 however large the others
  // are, otherwise every partial product must fit in 64 bits.
  uint64_t elements = 1;
  bool overflow = false;
  bool any_zero = false;
  for (uint8_t d = 0; d < ndim; ++d) {
    WS_ASSIGN_OR_RETURN(int64_t dim, r->I64(fields->Field("dim", d)));
    if (dim < 0) {
      return Status::ProtocolError(kWelcomeWhat, ": ", fields->label(), " dim ",
                                   static_cast<unsigned>(d), " is ", dim, ", expected >= 0");
    }
    t->spec.shape[d] = dim;
    if (dim == 0) any_zero = true;
    if (!overflow && __builtin_mul_overflow(elements, static_cast<uint64_t>(dim), &elements)) {
      overflow = true;
    }
  }
  if (any_zero) {
    elements = 0;
  } else if (overflow) {
    return Status::ProtocolError(kWelcomeWhat, ": ", fields->label(), " shape ",
                                 ShapeString(t->spec.shape), " element count overflows 64 bits");
  }
  Result<uint64_t> computed = ByteSize(t->spec.dtype, elements);
  if (!computed.ok()) {
    return Status::ProtocolError(kWelcomeWhat, ": ", fields->label(), " ", DTypeName(t->spec.dtype),
                                 " shape ", ShapeString(t->spec.shape), " (", elements,
                                 " elements) byte size overflows 64 bits");
  }

  WS_ASSIGN_OR_RETURN(t->spec.nbytes, r->U64(fields->Field("nbytes")));
  if (t->spec.nbytes != *computed) {
    return Status::ProtocolError(kWelcomeWhat, ": ", fields->label(), " nbytes ", t->spec.nbytes,
                                 ", expected ", *computed, " for ", DTypeName(t->spec.dtype),
                                 " shape ", ShapeString(t->spec.shape));
  }

  WS_ASSIGN_OR_RETURN(uint8_t region, r->U8(fields->Field("region")));
  if (region != static_cast<uint8_t>(Region::kDirect) &&
      region != static_cast<uint8_t>(Region::kSlot)) {
    return Status::ProtocolError(kWelcomeWhat, ": ", fields->label(), " region ",
                                 static_cast<unsigned>(region),
                                 " unknown, expected 0 (direct) or 1 (slot)");
  }
  t->region = static_cast<Region>(region);

  WS_ASSIGN_OR_RETURN(t->offset, r->U64(fields->Field("offset")));
  // Bounds against the arena are plan::ValidateLayout's job; an end that wraps around 2^64 can
  // never be valid, and catching it here keeps that arithmetic honest for every later reader.
  uint64_t end = 0;
  if (__builtin_add_overflow(t->offset, t->spec.nbytes, &end)) {
    return Status::ProtocolError(kWelcomeWhat, ": ", fields->label(), " offset ", t->offset,
                                 " + nbytes ", t->spec.nbytes, " overflows 64 bits");
  }
  return DecodeShard(r, fields, t);
}

}  // namespace

// ---- Hello: u16 protocol_version, u8 role, u32 pid, u64 wait_ms, string serves, string avoid,
// string locality ----

void Encode(const Hello& m, std::vector<uint8_t>* out) {
  Writer w(out);
  w.U16(m.protocol_version);
  w.U8(static_cast<uint8_t>(m.role));
  w.U32(m.pid);
  w.U64(m.wait_ms);
  w.String(m.serves);
  w.String(m.avoid);
  w.String(m.locality);
}

Status Decode(std::span<const uint8_t> payload, Hello* m) {
  Reader r(payload, kHelloWhat);
  // A different protocol_version is decoded, not rejected: the publisher answers it with an
  // Error frame that names both versions, which is more useful to the peer than a dropped socket.
  // (Another version's frame header is refused first, naming both, so a payload that gets here
  // has this version's fields.)
  WS_ASSIGN_OR_RETURN(m->protocol_version, r.U16("protocol_version"));
  WS_ASSIGN_OR_RETURN(uint8_t role, r.U8("role"));
  if (role != static_cast<uint8_t>(Role::kSubscriber)) {
    return Status::ProtocolError(kHelloWhat, ": role ", static_cast<unsigned>(role),
                                 " unknown, expected 1 (subscriber)");
  }
  m->role = static_cast<Role>(role);
  WS_ASSIGN_OR_RETURN(m->pid, r.U32("pid"));
  WS_ASSIGN_OR_RETURN(m->wait_ms, r.U64("wait_ms"));
  WS_ASSIGN_OR_RETURN(m->serves, r.Text("serves", kMaxEndpointBytes, true));
  WS_ASSIGN_OR_RETURN(m->avoid, r.Text("avoid", kMaxEndpointBytes, true));
  WS_ASSIGN_OR_RETURN(m->locality, r.Text("locality", kMaxLocalityBytes, true));
  return r.ExpectEnd();
}

// ---- Redirect: string endpoint ----

void Encode(const Redirect& m, std::vector<uint8_t>* out) {
  Writer w(out);
  w.String(m.endpoint);
}

Status Decode(std::span<const uint8_t> payload, Redirect* m) {
  Reader r(payload, kRedirectWhat);
  WS_ASSIGN_OR_RETURN(m->endpoint, r.Text("endpoint", kMaxEndpointBytes, false));
  return r.ExpectEnd();
}

// ---- Welcome ----

void Encode(const Welcome& m, std::vector<uint8_t>* out) {
  Writer w(out);
  w.U64(m.session_id);
  w.U64(m.arena_bytes);
  w.U64(m.direct_offset);
  w.U64(m.direct_bytes);
  w.U64(m.slots_offset);
  w.U64(m.slot_bytes);
  w.U32(m.slot_count);
  w.U64(m.segment_bytes);
  w.U8(static_cast<uint8_t>(m.arena_kind));
  w.U32(static_cast<uint32_t>(m.device));
  w.U8(static_cast<uint8_t>(m.digest_kind));
  w.String(m.lineage);
  w.I64(m.resumed_from);
  // The publisher's manifest was validated at Register(), so counts, names and ndim fit their
  // wire widths here.
  w.U32(static_cast<uint32_t>(m.tensors.size()));
  for (const TensorPlacement& t : m.tensors) {
    w.String(t.spec.name);
    w.U8(static_cast<uint8_t>(t.spec.dtype));
    w.U8(static_cast<uint8_t>(t.spec.shape.size()));
    for (int64_t dim : t.spec.shape) w.I64(dim);
    w.U64(t.spec.nbytes);
    w.U8(static_cast<uint8_t>(t.region));
    w.U64(t.offset);
    w.U8(t.sharded ? 1 : 0);
    if (!t.sharded) continue;
    w.String(t.shard.tensor);
    for (int64_t dim : t.shard.global_shape) w.I64(dim);
    for (int64_t offset : t.shard.offset) w.I64(offset);
  }
  if (IsRing(m.arena_kind)) w.U32(m.version_buckets);
  if (m.arena_kind != ArenaKind::kCudaIpc) return;
  w.U32(static_cast<uint32_t>(m.allocations.size()));
  for (const GpuAllocation& a : m.allocations) {
    w.U64(a.offset);
    w.U64(a.bytes);
    w.U8(static_cast<uint8_t>(a.kind));
    if (a.kind == AllocationKind::kPosixFdChunks) {
      w.U32(static_cast<uint32_t>(a.chunk_bytes.size()));
      for (uint64_t bytes : a.chunk_bytes) w.U64(bytes);
      continue;
    }
    for (size_t i = 0; i < a.ipc_handle.size(); i += 8) {
      uint64_t word;
      std::memcpy(&word, a.ipc_handle.data() + i, 8);
      w.U64(word);
    }
  }
}

Status Decode(std::span<const uint8_t> payload, Welcome* m) {
  Reader r(payload, kWelcomeWhat);
  WS_ASSIGN_OR_RETURN(m->session_id, r.U64("session_id"));
  WS_ASSIGN_OR_RETURN(m->arena_bytes, r.U64("arena_bytes"));
  WS_ASSIGN_OR_RETURN(m->direct_offset, r.U64("direct_offset"));
  WS_ASSIGN_OR_RETURN(m->direct_bytes, r.U64("direct_bytes"));
  WS_ASSIGN_OR_RETURN(m->slots_offset, r.U64("slots_offset"));
  WS_ASSIGN_OR_RETURN(m->slot_bytes, r.U64("slot_bytes"));
  WS_ASSIGN_OR_RETURN(m->slot_count, r.U32("slot_count"));
  if (m->slot_count > kMaxSlots) {
    return Status::ProtocolError(kWelcomeWhat, ": slot_count ", m->slot_count, " exceeds limit ",
                                 kMaxSlots);
  }
  WS_ASSIGN_OR_RETURN(m->segment_bytes, r.U64("segment_bytes"));
  if (m->segment_bytes == 0) {
    return Status::ProtocolError(kWelcomeWhat, ": segment_bytes 0, expected > 0");
  }
  WS_ASSIGN_OR_RETURN(uint8_t arena_kind, r.U8("arena_kind"));
  if (arena_kind > static_cast<uint8_t>(ArenaKind::kCudaRing)) {
    return Status::ProtocolError(kWelcomeWhat, ": unknown arena_kind ", int(arena_kind),
                                 ", expected 0..5");
  }
  m->arena_kind = static_cast<ArenaKind>(arena_kind);
  WS_ASSIGN_OR_RETURN(uint32_t device, r.U32("device"));
  m->device = static_cast<int32_t>(device);
  WS_ASSIGN_OR_RETURN(uint8_t digest_kind, r.U8("digest_kind"));
  if (digest_kind > static_cast<uint8_t>(DigestKind::kGpu64)) {
    return Status::ProtocolError(kWelcomeWhat, ": unknown digest_kind ", int(digest_kind),
                                 ", expected 0..1");
  }
  m->digest_kind = static_cast<DigestKind>(digest_kind);
  WS_ASSIGN_OR_RETURN(m->lineage, r.String("lineage", kMaxLineageBytes));
  if (Status s = CheckLineage(m->lineage); !s.ok()) {
    return Status::ProtocolError(kWelcomeWhat, ": ", s.message());
  }
  WS_ASSIGN_OR_RETURN(m->resumed_from, r.I64("resumed_from"));
  if (m->resumed_from < -1) {
    return Status::ProtocolError(kWelcomeWhat, ": resumed_from ", m->resumed_from,
                                 ", expected >= -1");
  }
  WS_ASSIGN_OR_RETURN(uint32_t count, r.Count("tensor count", kMaxTensors, kMinTensorBytes));

  m->tensors.clear();
  // Bounded by the payload through Count's minimum size. Reserving also keeps the name strings
  // in place, so the string_views in `seen` stay valid while the vector fills.
  m->tensors.reserve(count);
  std::unordered_map<std::string_view, uint32_t> seen;
  seen.reserve(count);
  TensorFields fields;
  for (uint32_t i = 0; i < count; ++i) {
    TensorPlacement& t = m->tensors.emplace_back();
    WS_RETURN_IF_ERROR(DecodeTensor(&r, i, &fields, &t));
    auto [it, inserted] = seen.emplace(t.spec.name, i);
    if (!inserted) {
      return Status::ProtocolError(kWelcomeWhat, ": tensor ", i, " ", Quote(t.spec.name),
                                   " duplicates the name of tensor ", it->second);
    }
  }
  m->version_buckets = 0;
  if (IsRing(m->arena_kind)) {
    WS_ASSIGN_OR_RETURN(m->version_buckets, r.U32("version_buckets"));
    if (m->version_buckets == 0 || m->version_buckets > kMaxVersionBuckets) {
      return Status::ProtocolError(kWelcomeWhat, ": version_buckets ", m->version_buckets,
                                   ", expected 1..", kMaxVersionBuckets);
    }
  }
  m->allocations.clear();
  if (m->arena_kind == ArenaKind::kCudaIpc) {
    WS_ASSIGN_OR_RETURN(uint32_t n, r.Count("allocation count", kMaxAllocations, 21));
    // Each allocation holds a tensor: bounded by the tensors before anything is allocated.
    if (n > m->tensors.size()) {
      return Status::ProtocolError(kWelcomeWhat, ": allocation count ", n, " exceeds the ",
                                   m->tensors.size(), " tensors");
    }
    m->allocations.resize(n);
    uint64_t chunks = 0;
    for (GpuAllocation& a : m->allocations) {
      WS_ASSIGN_OR_RETURN(a.offset, r.U64("allocation offset"));
      WS_ASSIGN_OR_RETURN(a.bytes, r.U64("allocation bytes"));
      WS_ASSIGN_OR_RETURN(uint8_t kind, r.U8("allocation kind"));
      if (kind > static_cast<uint8_t>(AllocationKind::kPosixFdChunks)) {
        return Status::ProtocolError(kWelcomeWhat, ": allocation kind ", int{kind},
                                     " is unknown (expected 0 or 1)");
      }
      a.kind = static_cast<AllocationKind>(kind);
      a.chunk_bytes.clear();
      if (a.kind == AllocationKind::kPosixFdChunks) {
        WS_ASSIGN_OR_RETURN(uint32_t count, r.Count("allocation chunk count", kMaxAllocations, 8));
        chunks += count;
        if (chunks > kMaxAllocations) {
          return Status::ProtocolError(kWelcomeWhat, ": more than ", kMaxAllocations,
                                       " allocation chunks");
        }
        a.chunk_bytes.resize(count);
        for (uint64_t& bytes : a.chunk_bytes) {
          WS_ASSIGN_OR_RETURN(bytes, r.U64("allocation chunk bytes"));
        }
        continue;
      }
      for (size_t i = 0; i < a.ipc_handle.size(); i += 8) {
        WS_ASSIGN_OR_RETURN(uint64_t word, r.U64("allocation ipc_handle"));
        std::memcpy(a.ipc_handle.data() + i, &word, 8);
      }
    }
  }
  return r.ExpectEnd();
}

// ---- UpdateRequest: i64 step, i64 after_step, u64 wait_ms, u8 delta, u32 below ----
// Step values carry meaning only against the publisher's state (latest, held versions), so the
// receiver validates them, not the decoder.

void Encode(const UpdateRequest& m, std::vector<uint8_t>* out) {
  Writer w(out);
  w.I64(m.step);
  w.I64(m.after_step);
  w.U64(m.wait_ms);
  w.U8(m.delta ? 1 : 0);
  w.U32(m.below);
}

Status Decode(std::span<const uint8_t> payload, UpdateRequest* m) {
  Reader r(payload, kUpdateRequestWhat);
  WS_ASSIGN_OR_RETURN(m->step, r.I64("step"));
  WS_ASSIGN_OR_RETURN(m->after_step, r.I64("after_step"));
  WS_ASSIGN_OR_RETURN(m->wait_ms, r.U64("wait_ms"));
  WS_ASSIGN_OR_RETURN(uint8_t delta, r.U8("delta"));
  if (delta > 1) {
    return Status::ProtocolError(kUpdateRequestWhat, ": delta ", int{delta}, ", expected 0 or 1");
  }
  if (delta == 1 && m->after_step < 0) {
    return Status::ProtocolError(kUpdateRequestWhat, ": delta 1 with after_step ", m->after_step,
                                 ", expected a committed step to apply it to");
  }
  m->delta = delta == 1;
  WS_ASSIGN_OR_RETURN(m->below, r.U32("below"));
  return r.ExpectEnd();
}

// ---- StepBegin: i64 step, u32 slot ----

void Encode(const StepBegin& m, std::vector<uint8_t>* out) {
  Writer w(out);
  w.I64(m.step);
  w.U32(m.slot);
}

Status Decode(std::span<const uint8_t> payload, StepBegin* m) {
  Reader r(payload, kStepBeginWhat);
  WS_ASSIGN_OR_RETURN(m->step, r.I64("step"));
  WS_ASSIGN_OR_RETURN(m->slot, r.U32("slot"));
  // Whether the slot exists in this arena is the receiver's check (Welcome::slot_count); a value
  // no arena can have is rejected here.
  if (m->slot != kNoSlot && m->slot >= kMaxSlots) {
    return Status::ProtocolError(kStepBeginWhat, ": slot ", m->slot, " exceeds limit ",
                                 kMaxSlots - 1, " (or ", kNoSlot, " for none)");
  }
  return r.ExpectEnd();
}

// ---- CopyDone: i64 step ----

void Encode(const CopyDone& m, std::vector<uint8_t>* out) {
  Writer w(out);
  w.I64(m.step);
}

Status Decode(std::span<const uint8_t> payload, CopyDone* m) {
  Reader r(payload, kCopyDoneWhat);
  WS_ASSIGN_OR_RETURN(m->step, r.I64("step"));
  return r.ExpectEnd();
}

// ---- AllocationFd: u32 index ----

void Encode(const AllocationFd& m, std::vector<uint8_t>* out) {
  Writer w(out);
  w.U32(m.index);
}

Status Decode(std::span<const uint8_t> payload, AllocationFd* m) {
  Reader r(payload, kAllocationFdWhat);
  WS_ASSIGN_OR_RETURN(m->index, r.U32("index"));
  return r.ExpectEnd();
}

// ---- RingBucket: i64 step, u32 bucket, u32 slot ----

void Encode(const RingBucket& m, std::vector<uint8_t>* out) {
  Writer w(out);
  w.I64(m.step);
  w.U32(m.bucket);
  w.U32(m.slot);
}

Status Decode(std::span<const uint8_t> payload, RingBucket* m) {
  Reader r(payload, kRingBucketWhat);
  WS_ASSIGN_OR_RETURN(m->step, r.I64("step"));
  WS_ASSIGN_OR_RETURN(m->bucket, r.U32("bucket"));
  if (m->bucket >= kMaxVersionBuckets) {
    return Status::ProtocolError(kRingBucketWhat, ": bucket ", m->bucket, " exceeds limit ",
                                 kMaxVersionBuckets - 1);
  }
  WS_ASSIGN_OR_RETURN(m->slot, r.U32("slot"));
  if (m->slot >= kMaxSlots) {
    return Status::ProtocolError(kRingBucketWhat, ": slot ", m->slot, " exceeds limit ",
                                 kMaxSlots - 1);
  }
  return r.ExpectEnd();
}

// ---- StepEnd: i64 step, u32 count, u64 digests[count] ----

void Encode(const StepEnd& m, std::vector<uint8_t>* out) {
  Writer w(out);
  w.I64(m.step);
  w.U32(static_cast<uint32_t>(m.digests.size()));
  for (uint64_t digest : m.digests) w.U64(digest);
}

Status Decode(std::span<const uint8_t> payload, StepEnd* m) {
  Reader r(payload, kStepEndWhat);
  WS_ASSIGN_OR_RETURN(m->step, r.I64("step"));
  WS_ASSIGN_OR_RETURN(uint32_t count, r.Count("digest count", kMaxDigests, kDigestBytes));
  // resize() keeps the buffer when its capacity suffices: the per-step decode does not allocate.
  m->digests.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    WS_ASSIGN_OR_RETURN(m->digests[i], r.U64("digest"));
  }
  return r.ExpectEnd();
}

// ---- DeltaBegin: i64 step, i64 base_step, u64 base_digest, u32 count, u64 bytes[count] ----

uint64_t DigestOfDigests(std::span<const uint64_t> digests) {
  static_assert(std::endian::native == std::endian::little, "digests are hashed as stored");
  return util::Hash64(digests.data(), digests.size_bytes());
}

void Encode(const DeltaBegin& m, std::vector<uint8_t>* out) {
  Writer w(out);
  w.I64(m.step);
  w.I64(m.base_step);
  w.U64(m.base_digest);
  w.U32(static_cast<uint32_t>(m.bytes.size()));
  for (uint64_t bytes : m.bytes) w.U64(bytes);
}

Status Decode(std::span<const uint8_t> payload, DeltaBegin* m) {
  Reader r(payload, kDeltaBeginWhat);
  WS_ASSIGN_OR_RETURN(m->step, r.I64("step"));
  WS_ASSIGN_OR_RETURN(m->base_step, r.I64("base_step"));
  WS_ASSIGN_OR_RETURN(m->base_digest, r.U64("base_digest"));
  WS_ASSIGN_OR_RETURN(uint32_t count, r.Count("segment count", kMaxDigests, kDigestBytes));
  if (m->base_step < -1 || (m->base_step >= 0 && m->base_step >= m->step)) {
    return Status::ProtocolError(kDeltaBeginWhat, ": base_step ", m->base_step, " for step ",
                                 m->step, ", expected -1 or an earlier step");
  }
  if (m->base_step == -1 && (count != 0 || m->base_digest != 0)) {
    return Status::ProtocolError(kDeltaBeginWhat, ": base_step -1 with ", count,
                                 " segments and base_digest ", m->base_digest,
                                 ", expected none and 0 (every segment whole)");
  }
  m->bytes.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    WS_ASSIGN_OR_RETURN(m->bytes[i], r.U64("segment bytes"));
  }
  return r.ExpectEnd();
}

// ---- ErrorMessage: u8 code, string message ----

void Encode(const ErrorMessage& m, std::vector<uint8_t>* out) {
  Writer w(out);
  w.U8(static_cast<uint8_t>(m.code));
  // Errors are often built from other errors and can grow; truncating here, rather than sending
  // something the peer's decoder refuses, keeps the error deliverable.
  w.String(TruncateUtf8(m.message, kMaxErrorMessageBytes));
}

Status Decode(std::span<const uint8_t> payload, ErrorMessage* m) {
  Reader r(payload, kErrorWhat);
  WS_ASSIGN_OR_RETURN(uint8_t code, r.U8("code"));
  if (!IsErrorCode(code)) {
    return Status::ProtocolError(kErrorWhat, ": code ", static_cast<unsigned>(code),
                                 " is not an error status code, expected 1..",
                                 static_cast<unsigned>(StatusCode::kInternal));
  }
  m->code = static_cast<StatusCode>(code);
  WS_ASSIGN_OR_RETURN(m->message, r.String("message", kMaxErrorMessageBytes));
  return r.ExpectEnd();
}

Status CheckLineage(std::string_view lineage) {
  if (lineage.empty() || lineage.size() > kMaxLineageBytes) {
    return Status::InvalidArgument("lineage of ", lineage.size(), " bytes; expected 1..",
                                   kMaxLineageBytes);
  }
  for (char c : lineage) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == ':' || c == '-';
    if (!ok) {
      return Status::InvalidArgument("lineage ", Quote(lineage),
                                     " has a character outside [A-Za-z0-9._:-]");
    }
  }
  return Status::Ok();
}

Status ToStatus(const ErrorMessage& m) {
  const uint8_t code = static_cast<uint8_t>(m.code);
  // An ErrorMessage built by hand (not decoded) may hold kOk or an unknown code; turning it into
  // an OK Status would report success for a failure.
  if (!IsErrorCode(code)) {
    return Status::ProtocolError("peer sent error code ", static_cast<unsigned>(code),
                                 ", not an error status code: ", m.message);
  }
  return Status(m.code, "peer: " + m.message);
}

}  // namespace weightsync::wire
