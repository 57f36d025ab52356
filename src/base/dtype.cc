#include "weightsync/dtype.h"

#include <array>
#include <string>

namespace weightsync {
namespace {

// DLPack DLDataTypeCode values (dlpack.h v1.1).
constexpr uint8_t kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6,
                  kDLFloat8_e4m3fn = 10, kDLFloat8_e5m2 = 12, kDLFloat8_e8m0fnu = 14,
                  kDLFloat4_e2m1fn = 17;

constexpr std::array<DTypeInfo, kDTypeCount> kInfos = {{
    {DType::kBool, "bool", 8, kDLBool, 8},
    {DType::kInt8, "int8", 8, kDLInt, 8},
    {DType::kInt16, "int16", 16, kDLInt, 16},
    {DType::kInt32, "int32", 32, kDLInt, 32},
    {DType::kInt64, "int64", 64, kDLInt, 64},
    {DType::kUInt8, "uint8", 8, kDLUInt, 8},
    {DType::kUInt16, "uint16", 16, kDLUInt, 16},
    {DType::kUInt32, "uint32", 32, kDLUInt, 32},
    {DType::kUInt64, "uint64", 64, kDLUInt, 64},
    {DType::kFloat16, "float16", 16, kDLFloat, 16},
    {DType::kBFloat16, "bfloat16", 16, kDLBfloat, 16},
    {DType::kTFloat32, "tfloat32", 32, kNoDLPackCode, 32},
    {DType::kFloat32, "float32", 32, kDLFloat, 32},
    {DType::kFloat64, "float64", 64, kDLFloat, 64},
    {DType::kFloat8E4M3FN, "float8_e4m3fn", 8, kDLFloat8_e4m3fn, 8},
    {DType::kFloat8E5M2, "float8_e5m2", 8, kDLFloat8_e5m2, 8},
    {DType::kFloat8E8M0FNU, "float8_e8m0fnu", 8, kDLFloat8_e8m0fnu, 8},
    {DType::kFloat4E2M1FN, "float4_e2m1fn", 4, kDLFloat4_e2m1fn, 4},
}};

struct Alias {
  std::string_view alias;
  DType dtype;
};
constexpr Alias kAliases[] = {
    {"bf16", DType::kBFloat16},
    {"fp16", DType::kFloat16},
    {"half", DType::kFloat16},
    {"fp32", DType::kFloat32},
    {"float", DType::kFloat32},
    {"fp64", DType::kFloat64},
    {"double", DType::kFloat64},
    {"tf32", DType::kTFloat32},
    {"fp8_e4m3", DType::kFloat8E4M3FN},
    {"fp8_e5m2", DType::kFloat8E5M2},
    {"e8m0", DType::kFloat8E8M0FNU},
    {"fp4", DType::kFloat4E2M1FN},
    {"float8_e4m3", DType::kFloat8E4M3FN},
};

}  // namespace

const DTypeInfo* AllDTypes() { return kInfos.data(); }

bool IsValidDType(uint8_t wire_code) { return wire_code >= 1 && wire_code <= kDTypeCount; }

const DTypeInfo& Info(DType dtype) { return kInfos[static_cast<uint8_t>(dtype) - 1]; }

std::string_view DTypeName(DType dtype) {
  return IsValidDType(static_cast<uint8_t>(dtype)) ? Info(dtype).name : "unknown";
}

Result<DType> DTypeFromWire(uint8_t wire_code) {
  if (!IsValidDType(wire_code)) {
    return Status::InvalidArgument("unknown dtype code ", int(wire_code), " (valid: 1..",
                                   kDTypeCount, ")");
  }
  return static_cast<DType>(wire_code);
}

Result<DType> DTypeFromName(std::string_view name) {
  for (const auto& info : kInfos) {
    if (info.name == name) return info.dtype;
  }
  for (const auto& a : kAliases) {
    if (a.alias == name) return a.dtype;
  }
  return Status::InvalidArgument("unknown dtype name '", name, "'");
}

Result<DType> DTypeFromDLPack(uint8_t code, uint8_t bits) {
  for (const auto& info : kInfos) {
    if (info.dlpack_code == code && info.dlpack_bits == bits) return info.dtype;
  }
  return Status::InvalidArgument("unsupported DLPack dtype (code ", int(code), ", bits ", int(bits),
                                 ")");
}

Result<uint64_t> ByteSize(DType dtype, uint64_t elements) {
  if (!IsValidDType(static_cast<uint8_t>(dtype))) {
    return Status::InvalidArgument("unknown dtype code ", int(static_cast<uint8_t>(dtype)));
  }
  const uint64_t bits = Info(dtype).bits;
  uint64_t total_bits;
  if (__builtin_mul_overflow(elements, bits, &total_bits)) {
    return Status::InvalidArgument("byte size overflows: ", elements, " elements of ",
                                   DTypeName(dtype));
  }
  return total_bits / 8 + (total_bits % 8 != 0 ? 1 : 0);
}

}  // namespace weightsync
