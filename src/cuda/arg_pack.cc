#include "cuda/arg_pack.h"

#include <cstdlib>
#include <new>
#include <utility>

namespace weightsync::cuda {
namespace {

constexpr size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }
// The block's alignment: every argument's (at most 8) and a cache line, so the value block of a
// pack never straddles more lines than it must.
constexpr size_t kBlockAlign = 64;

}  // namespace

Result<ArgPack> ArgPack::Create(std::span<const ArgType> signature, std::string_view label) {
  ArgPack pack;
  pack.label_ = label;
  pack.count_ = signature.size();
  if (signature.empty()) return pack;

  size_t value_bytes = 0;
  for (const ArgType& t : signature) {
    value_bytes = AlignUp(value_bytes, t.alignment()) + t.size();
  }
  if (value_bytes > kMaxKernelParamBytes) {
    return Status::InvalidArgument(
        label.empty() ? "kernel" : label, ": ", signature.size(), " arguments take ", value_bytes,
        " parameter bytes; a launch takes at most ", kMaxKernelParamBytes);
  }
  // One block: [void* params[n]] [uint32 offsets[n]] [ArgType types[n]] [values], each part at
  // its own alignment, the values at kBlockAlign.
  const size_t n = signature.size();
  const size_t params_at = 0;
  const size_t offsets_at = AlignUp(params_at + n * sizeof(void*), alignof(uint32_t));
  const size_t types_at = AlignUp(offsets_at + n * sizeof(uint32_t), alignof(ArgType));
  const size_t values_at = AlignUp(types_at + n * sizeof(ArgType), kBlockAlign);
  const size_t total = AlignUp(values_at + value_bytes, kBlockAlign);
  void* block = ::operator new (total, std::align_val_t{kBlockAlign}, std::nothrow);
  if (block == nullptr) {
    return Status::ResourceExhausted(label.empty() ? "kernel" : label, ": allocating ", total,
                                     " bytes of kernel arguments failed");
  }
  std::memset(block, 0, total);
  auto* base = static_cast<std::byte*>(block);
  pack.block_ = block;
  pack.params_ = reinterpret_cast<void**>(base + params_at);
  pack.offsets_ = reinterpret_cast<uint32_t*>(base + offsets_at);
  pack.types_ = reinterpret_cast<ArgType*>(base + types_at);
  std::byte* values = base + values_at;
  size_t at = 0;
  for (size_t i = 0; i < n; ++i) {
    at = AlignUp(at, signature[i].alignment());
    new (&pack.types_[i]) ArgType(signature[i]);
    pack.offsets_[i] = static_cast<uint32_t>(at);
    pack.params_[i] = values + at;
    at += signature[i].size();
  }
  pack.value_bytes_ = value_bytes;
  return pack;
}

ArgPack& ArgPack::operator=(ArgPack&& o) noexcept {
  if (this != &o) {
    Release();
    block_ = std::exchange(o.block_, nullptr);
    params_ = std::exchange(o.params_, nullptr);
    offsets_ = std::exchange(o.offsets_, nullptr);
    types_ = std::exchange(o.types_, nullptr);
    count_ = std::exchange(o.count_, 0);
    value_bytes_ = std::exchange(o.value_bytes_, 0);
    label_ = std::exchange(o.label_, {});
  }
  return *this;
}

ArgPack::~ArgPack() { Release(); }

void ArgPack::Release() {
  if (block_ != nullptr) ::operator delete (block_, std::align_val_t{kBlockAlign});
  block_ = nullptr;
  params_ = nullptr;
  offsets_ = nullptr;
  types_ = nullptr;
  count_ = 0;
  value_bytes_ = 0;
}

Status ArgPack::Mismatch(size_t index, ArgType actual) const {
  std::string_view what = label_.empty() ? std::string_view("kernel") : label_;
  if (index >= count_) {
    return Status::InvalidArgument(what, " argument ", index, ": out of range (the signature has ",
                                   count_, " arguments)");
  }
  return Status::InvalidArgument(what, " argument ", index, ": expected ", types_[index].name(),
                                 ", got ", actual.name());
}

Status ArgPack::BadFloat4(size_t index, uint8_t bits) const {
  return Status::InvalidArgument(label_.empty() ? std::string_view("kernel") : label_, " argument ",
                                 index, ": float4_e2m1fn value ", static_cast<int>(bits),
                                 " does not fit in 4 bits (0..15)");
}

}  // namespace weightsync::cuda
