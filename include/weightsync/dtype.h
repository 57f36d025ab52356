// DType: the 18 element types weightsync moves, with their wire code, bit width and DLPack code.
// The wire code (the enum value) is stable and is what manifests carry; never renumber it.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "weightsync/status.h"

namespace weightsync {

enum class DType : uint8_t {
  kBool = 1,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt8,
  kUInt16,
  kUInt32,
  kUInt64,
  kFloat16,
  kBFloat16,
  kTFloat32,  // stored in 32 bits; DLPack has no code for it (see DTypeInfo::dlpack_code)
  kFloat32,
  kFloat64,
  kFloat8E4M3FN,
  kFloat8E5M2,
  kFloat8E8M0FNU,
  kFloat4E2M1FN,  // packed two per byte: a tensor of n elements holds ceil(n/2) bytes
};

inline constexpr int kDTypeCount = 18;

struct DTypeInfo {
  DType dtype;
  std::string_view name;  // canonical lower-case name, e.g. "bfloat16"
  uint8_t bits;           // bits per element (4 for float4_e2m1fn)
  uint8_t dlpack_code;    // DLDataTypeCode; kNoDLPackCode where DLPack has none
  uint8_t dlpack_bits;    // bits as DLPack spells them
};
inline constexpr uint8_t kNoDLPackCode = 0xFF;

// Every dtype in wire-code order.
const DTypeInfo* AllDTypes();             // kDTypeCount entries
const DTypeInfo& Info(DType dtype);       // dtype must be valid (IsValidDType)
std::string_view DTypeName(DType dtype);  // "unknown" for an invalid value

bool IsValidDType(uint8_t wire_code);
Result<DType> DTypeFromWire(uint8_t wire_code);      // InvalidArgument names the code
Result<DType> DTypeFromName(std::string_view name);  // accepts canonical names and "bf16" etc.
Result<DType> DTypeFromDLPack(uint8_t code, uint8_t bits);

// Bytes needed for `elements` elements, overflow-checked; float4 rounds up to whole bytes.
Result<uint64_t> ByteSize(DType dtype, uint64_t elements);

}  // namespace weightsync
