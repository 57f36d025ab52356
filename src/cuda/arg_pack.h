// ArgPack: the typed scalar (and device pointer) arguments of one prepared kernel launch, stored
// once at plan time in stable memory, with the `void**` array that cudaLaunchKernel wants
// (`kernelParams`) pointing into it. A step rewrites values in place with Set(); nothing is
// allocated per launch.
//
// Host code only, no CUDA headers: it builds, and is tested, in a CPU-only build. The .cu files
// include it to check at compile time that a kernel's parameter list matches its signature
// (KernelMatchesSignature below).
//
// Element types: the 18 weightsync::DType values. Formats C++ has no type for travel as their raw
// bit patterns in the wrapper structs below (Float16Bits, BFloat16Bits, TFloat32Bits, Float8*Bits,
// Float4E2M1FNBits), so Set<T>() can tell a bfloat16 from a uint16 argument. A device pointer is
// its own argument type (8 bytes).
//
// Thread safety: none. One launch site owns a pack; Set() and Launch() on it are not concurrent.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "weightsync/dtype.h"
#include "weightsync/status.h"

namespace weightsync::cuda {

// clang-format off
// Raw bit patterns of the element types C++ has no native type for. Size and alignment are those
// of the storage the kernel sees (a __half, __nv_bfloat16, __nv_fp8_e4m3, ... parameter).
struct Float16Bits { uint16_t bits; };
struct BFloat16Bits { uint16_t bits; };
struct TFloat32Bits { uint32_t bits; };  // fp32 layout; the low 13 mantissa bits are ignored
struct Float8E4M3FNBits { uint8_t bits; };
struct Float8E5M2Bits { uint8_t bits; };
struct Float8E8M0FNUBits { uint8_t bits; };  // a power of two 2^(bits-127); 0xFF is NaN
struct Float4E2M1FNBits { uint8_t bits; };   // one value in the low nibble; the high nibble is 0

// The C++ type that carries a scalar of each DType, and back.
template <DType D> struct ScalarType;
template <> struct ScalarType<DType::kBool> { using type = bool; };
template <> struct ScalarType<DType::kInt8> { using type = int8_t; };
template <> struct ScalarType<DType::kInt16> { using type = int16_t; };
template <> struct ScalarType<DType::kInt32> { using type = int32_t; };
template <> struct ScalarType<DType::kInt64> { using type = int64_t; };
template <> struct ScalarType<DType::kUInt8> { using type = uint8_t; };
template <> struct ScalarType<DType::kUInt16> { using type = uint16_t; };
template <> struct ScalarType<DType::kUInt32> { using type = uint32_t; };
template <> struct ScalarType<DType::kUInt64> { using type = uint64_t; };
template <> struct ScalarType<DType::kFloat16> { using type = Float16Bits; };
template <> struct ScalarType<DType::kBFloat16> { using type = BFloat16Bits; };
template <> struct ScalarType<DType::kTFloat32> { using type = TFloat32Bits; };
template <> struct ScalarType<DType::kFloat32> { using type = float; };
template <> struct ScalarType<DType::kFloat64> { using type = double; };
template <> struct ScalarType<DType::kFloat8E4M3FN> { using type = Float8E4M3FNBits; };
template <> struct ScalarType<DType::kFloat8E5M2> { using type = Float8E5M2Bits; };
template <> struct ScalarType<DType::kFloat8E8M0FNU> { using type = Float8E8M0FNUBits; };
template <> struct ScalarType<DType::kFloat4E2M1FN> { using type = Float4E2M1FNBits; };
template <DType D>
using ScalarTypeT = typename ScalarType<D>::type;

template <typename T> struct DTypeOf;  // undefined for types that are no kernel scalar
template <> struct DTypeOf<bool> { static constexpr DType value = DType::kBool; };
template <> struct DTypeOf<int8_t> { static constexpr DType value = DType::kInt8; };
template <> struct DTypeOf<int16_t> { static constexpr DType value = DType::kInt16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kInt32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kInt64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::kUInt8; };
template <> struct DTypeOf<uint16_t> { static constexpr DType value = DType::kUInt16; };
template <> struct DTypeOf<uint32_t> { static constexpr DType value = DType::kUInt32; };
template <> struct DTypeOf<uint64_t> { static constexpr DType value = DType::kUInt64; };
template <> struct DTypeOf<Float16Bits> { static constexpr DType value = DType::kFloat16; };
template <> struct DTypeOf<BFloat16Bits> { static constexpr DType value = DType::kBFloat16; };
template <> struct DTypeOf<TFloat32Bits> { static constexpr DType value = DType::kTFloat32; };
template <> struct DTypeOf<float> { static constexpr DType value = DType::kFloat32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kFloat64; };
template <> struct DTypeOf<Float8E4M3FNBits> { static constexpr DType value = DType::kFloat8E4M3FN; };
template <> struct DTypeOf<Float8E5M2Bits> { static constexpr DType value = DType::kFloat8E5M2; };
template <> struct DTypeOf<Float8E8M0FNUBits> { static constexpr DType value = DType::kFloat8E8M0FNU; };
template <> struct DTypeOf<Float4E2M1FNBits> { static constexpr DType value = DType::kFloat4E2M1FN; };
// clang-format on

// A value Set() accepts: one of the 18 scalar carriers, or a pointer (a device address).
template <typename T>
concept KernelScalar = requires {
  DTypeOf<std::remove_cv_t<T>>::value;
};
template <typename T>
concept KernelArg = KernelScalar<T> || std::is_pointer_v<T> || std::is_null_pointer_v<T>;

// One parameter of a kernel signature: a scalar of a DType, or a device pointer.
class ArgType {
 public:
  static constexpr ArgType Scalar(DType dtype) { return ArgType(false, dtype); }
  static constexpr ArgType Pointer() { return ArgType(true, DType::kUInt64); }
  template <typename T>
  static constexpr ArgType Of() {
    if constexpr (std::is_pointer_v<T> || std::is_null_pointer_v<T>) {
      return Pointer();
    } else {
      return Scalar(DTypeOf<std::remove_cv_t<T>>::value);
    }
  }

  constexpr bool is_pointer() const { return pointer_; }
  constexpr DType dtype() const { return dtype_; }  // meaningful for scalars only
  // Bytes and alignment of the argument as a kernel parameter (natural alignment; a 4-bit float
  // takes one byte).
  constexpr size_t size() const {
    if (pointer_) return sizeof(void*);
    switch (dtype_) {
      case DType::kInt16:
      case DType::kUInt16:
      case DType::kFloat16:
      case DType::kBFloat16:
        return 2;
      case DType::kInt32:
      case DType::kUInt32:
      case DType::kTFloat32:
      case DType::kFloat32:
        return 4;
      case DType::kInt64:
      case DType::kUInt64:
      case DType::kFloat64:
        return 8;
      default:
        return 1;
    }
  }
  constexpr size_t alignment() const { return size(); }
  // "bfloat16", "pointer".
  std::string_view name() const {
    return pointer_ ? std::string_view("pointer") : DTypeName(dtype_);
  }

  constexpr bool operator==(const ArgType& o) const {
    return pointer_ == o.pointer_ && (pointer_ || dtype_ == o.dtype_);
  }

 private:
  constexpr ArgType(bool pointer, DType dtype) : pointer_(pointer), dtype_(dtype) {}
  bool pointer_;
  DType dtype_;
};

// Largest parameter block cudaLaunchKernel accepts on every supported architecture.
inline constexpr size_t kMaxKernelParamBytes = 4096;

class ArgPack {
 public:
  ArgPack() = default;  // an empty signature: kernel_params() is a valid empty array
  // Lays out `signature` (each argument at its natural alignment, in order, as the CUDA ABI lays
  // out a kernel's parameters) in one allocation holding the values, the kernelParams array and
  // the signature itself. All values start as zero bytes. `label` (a string with static storage,
  // e.g. the kernel's name) prefixes error messages. InvalidArgument if the values exceed
  // kMaxKernelParamBytes.
  static Result<ArgPack> Create(std::span<const ArgType> signature, std::string_view label = {});

  ArgPack(ArgPack&& o) noexcept { *this = std::move(o); }
  ArgPack& operator=(ArgPack&& o) noexcept;
  ArgPack(const ArgPack&) = delete;
  ArgPack& operator=(const ArgPack&) = delete;
  ~ArgPack();

  size_t size() const { return count_; }
  ArgType type(size_t index) const { return types_[index]; }
  size_t offset(size_t index) const { return offsets_[index]; }  // into the value block
  size_t value_bytes() const { return value_bytes_; }            // the parameter block's size
  std::string_view label() const { return label_; }

  // The kernelParams array: entry i points at argument i's bytes. Stable for the pack's life,
  // moves included (it lives in the heap block, not in this object).
  void** kernel_params() const { return params_; }
  const void* value_ptr(size_t index) const { return params_[index]; }

  // Writes argument `index` in place. The hot path: a debug build asserts that T matches the
  // signature; a release build does not check. Allocates nothing.
  template <KernelArg T>
  void Set(size_t index, T value) {
    assert(index < count_ && types_[index] == ArgType::Of<T>());
    Store(index, value);
  }
  // The same, checked in every build: InvalidArgument naming the argument index, the expected and
  // the actual type. Allocates only when it fails.
  template <KernelArg T>
  Status SetChecked(size_t index, T value) {
    if (index >= count_ || !(types_[index] == ArgType::Of<T>())) {
      return Mismatch(index, ArgType::Of<T>());
    }
    if constexpr (std::is_same_v<std::remove_cv_t<T>, Float4E2M1FNBits>) {
      if (value.bits > 0xF) return BadFloat4(index, value.bits);
    }
    Store(index, value);
    return Status::Ok();
  }

  // Reads argument `index` back (type-checked like SetChecked).
  template <KernelArg T>
  Result<T> Get(size_t index) const {
    if (index >= count_ || !(types_[index] == ArgType::Of<T>())) {
      return Mismatch(index, ArgType::Of<T>());
    }
    if constexpr (std::is_pointer_v<T>) {
      const void* p;
      std::memcpy(&p, params_[index], sizeof(p));
      return static_cast<T>(const_cast<void*>(p));
    } else {
      T v;
      std::memcpy(&v, params_[index], sizeof(T));
      return v;
    }
  }

 private:
  template <typename T>
  void Store(size_t index, T value) {
    if constexpr (std::is_pointer_v<T> || std::is_null_pointer_v<T>) {
      const void* p = value;
      std::memcpy(params_[index], &p, sizeof(p));
    } else {
      static_assert(std::is_trivially_copyable_v<T>);
      std::memcpy(params_[index], &value, sizeof(T));
    }
  }
  Status Mismatch(size_t index, ArgType actual) const;
  Status BadFloat4(size_t index, uint8_t bits) const;
  void Release();

  void* block_ = nullptr;    // the one allocation: params_, offsets_, types_, values
  void** params_ = nullptr;  // count_ entries
  uint32_t* offsets_ = nullptr;
  ArgType* types_ = nullptr;
  size_t count_ = 0;
  size_t value_bytes_ = 0;
  std::string_view label_;
};

// Compile-time check, used by the .cu files next to every kernel: does `Kernel`'s parameter list
// match `signature` (pointer for pointer, and for scalars the same DType, or for CUDA's own types
// such as __nv_bfloat16 the same size and alignment)?
template <typename P>
constexpr bool ParamMatches(ArgType t) {
  if constexpr (std::is_pointer_v<P>) {
    return t.is_pointer();
  } else if constexpr (KernelScalar<P>) {
    return !t.is_pointer() && t.dtype() == DTypeOf<std::remove_cv_t<P>>::value;
  } else {
    return !t.is_pointer() && sizeof(P) == t.size() && alignof(P) == t.alignment();
  }
}
template <typename... P, size_t N>
constexpr bool KernelMatchesSignature(void (*)(P...), const ArgType (&signature)[N]) {
  if (sizeof...(P) != N) return false;
  size_t i = 0;
  bool ok = true;
  ((ok = ok && ParamMatches<P>(signature[i++])), ...);
  return ok;
}

}  // namespace weightsync::cuda
