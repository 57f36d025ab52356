// The kernels a prepared launch can run: one id, name and argument signature each, declared once.
// Host code, no CUDA headers. kernels.cu static_asserts every __global__ function against its row
// here, so a signature and its kernel cannot drift apart; the argument-index constants are what
// callers pass to ArgPack::Set() to rewrite an argument in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "cuda/arg_pack.h"

namespace weightsync::cuda {

enum class KernelId : uint8_t {
  kCastBF16ToF32,
  kCastBF16ToF16,
  kCastF16ToF32,
  kCastF16ToBF16,
  kCastF32ToBF16,
  kCastF32ToF16,
  kQuantizeFp8ScaleF32,   // bf16 [rows, cols] -> e4m3fn, float32 scale per 128x128 block
  kQuantizeFp8ScaleE8M0,  // bf16 [rows, cols] -> e4m3fn, e8m0 scale per 128x128 block
  kQuantizeFp8Group,      // many such tensors (a device table of them) in one launch
  kDigestChunks,          // one hash per 64 KiB chunk of a byte range
  kDigestCombine,         // chunk hashes -> the range's 64-bit digest
  kDigestGroupChunks,     // every 64 KiB chunk of many ranges (a device table of them)
  kDigestGroupCombine,    // ... then every range's digest from its chunk hashes
  kCopy,                  // bytes, 16-byte vectors where src and dst allow
  kCopyGroup,             // many copies (a device table of them) in one launch
  kBlockScaledAmax,       // NVFP4 tensors' amax (their global scales need it first)
  kQuantizeBlockScaled,   // bf16/f32 -> MXFP8 or NVFP4, many tensors (a device table of them)
  kArgProbe,              // writes back its 18 typed scalars: checks the argument ABI on a device
  kCount,
};
inline constexpr int kKernelCount = static_cast<int>(KernelId::kCount);

// cast: (const Src* src, Dst* dst, uint64 count)
struct CastArgs {
  static constexpr size_t kSrc = 0, kDst = 1, kCount = 2;
};
inline constexpr ArgType kCastSignature[] = {ArgType::Pointer(), ArgType::Pointer(),
                                             ArgType::Scalar(DType::kUInt64)};

// quantize fp8: (const bf16* x, e4m3fn* q, scale* scales, int64 rows, int64 cols)
struct QuantizeFp8Args {
  static constexpr size_t kX = 0, kQ = 1, kScales = 2, kRows = 3, kCols = 4;
};
inline constexpr ArgType kQuantizeFp8Signature[] = {
    ArgType::Pointer(), ArgType::Pointer(), ArgType::Pointer(), ArgType::Scalar(DType::kInt64),
    ArgType::Scalar(DType::kInt64)};

// quantize fp8, grouped: (const Fp8GroupJob* jobs, uint32 count, uint64 tiles) — `tiles` is the
// sum of every job's 128x128 blocks; the job table lives in device memory (kernels.cu).
struct QuantizeFp8GroupArgs {
  static constexpr size_t kJobs = 0, kCount = 1, kTiles = 2;
};
inline constexpr ArgType kQuantizeFp8GroupSignature[] = {
    ArgType::Pointer(), ArgType::Scalar(DType::kUInt32), ArgType::Scalar(DType::kUInt64)};

// block-scaled, grouped: (const BlockScaledJob* jobs, uint32 count, uint64 units) — both
// kernels (amax, quantize) walk `units` work items of the job table (block_scaled_kernels.h).
struct BlockScaledGroupArgs {
  static constexpr size_t kJobs = 0, kCount = 1, kUnits = 2;
};
inline constexpr ArgType kBlockScaledGroupSignature[] = {
    ArgType::Pointer(), ArgType::Scalar(DType::kUInt32), ArgType::Scalar(DType::kUInt64)};

// digest chunks: (const uint8* data, uint64 bytes, uint64* chunk_hashes)
struct DigestChunksArgs {
  static constexpr size_t kData = 0, kBytes = 1, kChunkHashes = 2;
};
inline constexpr ArgType kDigestChunksSignature[] = {
    ArgType::Pointer(), ArgType::Scalar(DType::kUInt64), ArgType::Pointer()};

// digest combine: (const uint64* chunk_hashes, uint64 bytes, uint64* digest)
struct DigestCombineArgs {
  static constexpr size_t kChunkHashes = 0, kBytes = 1, kDigest = 2;
};
inline constexpr ArgType kDigestCombineSignature[] = {
    ArgType::Pointer(), ArgType::Scalar(DType::kUInt64), ArgType::Pointer()};

// digest, grouped: (const DigestChunkJob* / DigestCombineJob* jobs, uint32 count) — the job
// tables live in device memory (kernels.h); one block hashes (or combines) one job at a time.
struct DigestGroupArgs {
  static constexpr size_t kJobs = 0, kCount = 1;
};
inline constexpr ArgType kDigestGroupSignature[] = {ArgType::Pointer(),
                                                    ArgType::Scalar(DType::kUInt32)};

// copy: (const uint8* src, uint8* dst, uint64 bytes)
struct CopyArgs {
  static constexpr size_t kSrc = 0, kDst = 1, kBytes = 2;
};
inline constexpr ArgType kCopySignature[] = {ArgType::Pointer(), ArgType::Pointer(),
                                             ArgType::Scalar(DType::kUInt64)};

// copy, grouped: (const CopyGroupJob* jobs, uint32 count) — the job table lives in device memory
// (kernels.h); one block copies one job at a time.
struct CopyGroupArgs {
  static constexpr size_t kJobs = 0, kCount = 1;
};
inline constexpr ArgType kCopyGroupSignature[] = {ArgType::Pointer(),
                                                  ArgType::Scalar(DType::kUInt32)};

// arg probe: (uint64* out, then one scalar of each of the 18 dtypes in wire-code order).
// out[k] receives scalar k's bytes zero-extended to 64 bits (k = wire code - 1); out[18] counts
// launches (incremented by each launch).
struct ArgProbeArgs {
  static constexpr size_t kOut = 0;
  static constexpr size_t Scalar(DType d) { return static_cast<size_t>(d); }  // wire code
};
inline constexpr int kArgProbeWords = kDTypeCount + 1;
inline constexpr ArgType kArgProbeSignature[] = {
    ArgType::Pointer(),
    ArgType::Scalar(DType::kBool),
    ArgType::Scalar(DType::kInt8),
    ArgType::Scalar(DType::kInt16),
    ArgType::Scalar(DType::kInt32),
    ArgType::Scalar(DType::kInt64),
    ArgType::Scalar(DType::kUInt8),
    ArgType::Scalar(DType::kUInt16),
    ArgType::Scalar(DType::kUInt32),
    ArgType::Scalar(DType::kUInt64),
    ArgType::Scalar(DType::kFloat16),
    ArgType::Scalar(DType::kBFloat16),
    ArgType::Scalar(DType::kTFloat32),
    ArgType::Scalar(DType::kFloat32),
    ArgType::Scalar(DType::kFloat64),
    ArgType::Scalar(DType::kFloat8E4M3FN),
    ArgType::Scalar(DType::kFloat8E5M2),
    ArgType::Scalar(DType::kFloat8E8M0FNU),
    ArgType::Scalar(DType::kFloat4E2M1FN),
};

struct KernelInfo {
  KernelId id;
  std::string_view name;  // static storage; labels launches, errors and the startup log
  std::span<const ArgType> signature;
};

inline constexpr KernelInfo kKernels[kKernelCount] = {
    {KernelId::kCastBF16ToF32, "cast_bf16_to_f32", kCastSignature},
    {KernelId::kCastBF16ToF16, "cast_bf16_to_f16", kCastSignature},
    {KernelId::kCastF16ToF32, "cast_f16_to_f32", kCastSignature},
    {KernelId::kCastF16ToBF16, "cast_f16_to_bf16", kCastSignature},
    {KernelId::kCastF32ToBF16, "cast_f32_to_bf16", kCastSignature},
    {KernelId::kCastF32ToF16, "cast_f32_to_f16", kCastSignature},
    {KernelId::kQuantizeFp8ScaleF32, "quantize_fp8_e4m3_block128_scale_f32", kQuantizeFp8Signature},
    {KernelId::kQuantizeFp8ScaleE8M0, "quantize_fp8_e4m3_block128_scale_e8m0",
     kQuantizeFp8Signature},
    {KernelId::kQuantizeFp8Group, "quantize_fp8_e4m3_block128_group", kQuantizeFp8GroupSignature},
    {KernelId::kDigestChunks, "digest_chunks", kDigestChunksSignature},
    {KernelId::kDigestCombine, "digest_combine", kDigestCombineSignature},
    {KernelId::kDigestGroupChunks, "digest_group_chunks", kDigestGroupSignature},
    {KernelId::kDigestGroupCombine, "digest_group_combine", kDigestGroupSignature},
    {KernelId::kCopy, "copy", kCopySignature},
    {KernelId::kCopyGroup, "copy_group", kCopyGroupSignature},
    {KernelId::kBlockScaledAmax, "block_scaled_amax", kBlockScaledGroupSignature},
    {KernelId::kQuantizeBlockScaled, "quantize_block_scaled", kBlockScaledGroupSignature},
    {KernelId::kArgProbe, "arg_probe", kArgProbeSignature},
};

constexpr const KernelInfo& Kernel(KernelId id) { return kKernels[static_cast<int>(id)]; }

// The table is in KernelId order.
constexpr bool KernelTableInOrder() {
  for (int i = 0; i < kKernelCount; ++i) {
    if (static_cast<int>(kKernels[i].id) != i) return false;
  }
  return true;
}
static_assert(KernelTableInOrder(), "kKernels must list kernels in KernelId order");

// The cast kernel for a pair of dtypes; InvalidArgument names an unsupported pair.
inline Result<KernelId> CastKernelFor(DType from, DType to) {
  using D = DType;
  if (from == D::kBFloat16 && to == D::kFloat32) return KernelId::kCastBF16ToF32;
  if (from == D::kBFloat16 && to == D::kFloat16) return KernelId::kCastBF16ToF16;
  if (from == D::kFloat16 && to == D::kFloat32) return KernelId::kCastF16ToF32;
  if (from == D::kFloat16 && to == D::kBFloat16) return KernelId::kCastF16ToBF16;
  if (from == D::kFloat32 && to == D::kBFloat16) return KernelId::kCastF32ToBF16;
  if (from == D::kFloat32 && to == D::kFloat16) return KernelId::kCastF32ToF16;
  return Status::InvalidArgument("cast: no kernel from ", DTypeName(from), " to ", DTypeName(to),
                                 " (casts go between float32, float16 and bfloat16)");
}

}  // namespace weightsync::cuda
