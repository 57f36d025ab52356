// The transform kernels of the GPU data plane, each reachable only through a prepared launch:
// dtype casts, blockwise fp8 quantization, a chunked 64-bit digest, a vectorized copy, and an
// argument probe. Host code, no CUDA headers; in a CPU-only build every Prepare* returns
// Unavailable("built without CUDA"). docs/gpu.md specifies formats, rounding and the digest.
//
// Pointers are device pointers (cudaMalloc, cuMem, IPC-mapped, or mapped pinned host memory);
// Prepare* checks the ones it is given with cudaPointerGetAttributes. Values rewritten later with
// args().Set() are not checked again: that is the caller's contract.
//
// Grids are sized at prepare time for the sizes given; every kernel loops over its work
// (grid-stride), so a size rewritten in place stays correct, only the grid may be less suited.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cuda/copy_batch.h"
#include "cuda/device.h"
#include "cuda/gpu_digest_reference.h"
#include "cuda/kernel_table.h"
#include "cuda/prepared_launch.h"
#include "weightsync/dtype.h"
#include "weightsync/status.h"

namespace weightsync::cuda {

// ---- casts ---------------------------------------------------------------------------------
// `count` elements from `src` (dtype `from`) to `dst` (dtype `to`); from and to are two different
// ones of float32, float16, bfloat16. Narrowing rounds to nearest even (as __float2bfloat16_rn /
// __float2half_rn); float16 overflow gives ±inf; NaN stays NaN. Widening is exact. Arguments:
// CastArgs. src and dst must not overlap.
Result<PreparedLaunch> PrepareCast(DType from, DType to, const void* src, void* dst, uint64_t count,
                                   StreamHandle stream);
// CastKernelFor(from, to) in kernel_table.h picks the kernel.

// ---- fp8 quantization ------------------------------------------------------------------------
inline constexpr int64_t kFp8BlockSize = 128;  // scale blocks are 128 x 128 elements
inline constexpr float kE4M3Max = 448.0f;      // largest finite float8_e4m3fn

enum class Fp8ScaleFormat : uint8_t {
  kFloat32,  // scale = amax / 448 (float32 division), 1 for an all-zero block
  kE8M0,     // scale = 2^e, the smallest power of two with amax / 2^e <= 448; e in [-127, 127]
};
// Scale tensor shape: [ceil(rows / 128), ceil(cols / 128)], row-major.
inline constexpr int64_t Fp8ScaleRows(int64_t rows) {
  return (rows + kFp8BlockSize - 1) / kFp8BlockSize;
}
inline constexpr int64_t Fp8ScaleCols(int64_t cols) {
  return (cols + kFp8BlockSize - 1) / kFp8BlockSize;
}

// Quantizes the row-major bf16 matrix x[rows, cols] to row-major float8_e4m3fn q[rows, cols] with
// one scale per 128x128 block (edge blocks partial) written to `scales` (float32 or e8m0 bytes):
// q = e4m3fn_rn_satfinite(x / scale), i.e. round to nearest even, saturating at ±448, NaN -> NaN.
// Arguments: QuantizeFp8Args. Fastest when x is 16-byte and q 8-byte aligned and cols % 8 == 0.
Result<PreparedLaunch> PrepareQuantizeFp8(const void* x_bf16, void* q_e4m3, void* scales,
                                          int64_t rows, int64_t cols, Fp8ScaleFormat format,
                                          StreamHandle stream);

// Many tensors quantized by one launch (one grid over all their blocks): what a transfer handle
// prepares for the fp8 tensors of a step, so no tensor waits for the tail of the previous one.
// Same arithmetic and results as PrepareQuantizeFp8 per tensor.
struct Fp8GroupTensor {
  const void* x_bf16 = nullptr;
  void* q_e4m3 = nullptr;
  void* scales = nullptr;
  int64_t rows = 0, cols = 0;
  Fp8ScaleFormat format = Fp8ScaleFormat::kFloat32;
};
// The job table entry the kernel reads (device memory, built at prepare time).
struct Fp8GroupJob {
  const void* x;
  void* q;
  void* scales;
  int64_t rows, cols, tile_cols;
  uint64_t first_tile;  // blocks of the jobs before this one
  uint32_t e8m0;        // 1: e8m0 scales, 0: float32
  uint32_t reserved;
};
class PreparedFp8Group {
 public:
  PreparedFp8Group() = default;
  Status Launch();  // nothing to do for an empty group
  bool empty() const { return jobs_.empty(); }
  size_t tensors() const { return jobs_.size(); }
  uint64_t tiles() const { return tiles_; }
  PreparedLaunch& launch() { return launch_; }

 private:
  friend Result<PreparedFp8Group> PrepareQuantizeFp8Group(std::span<const Fp8GroupTensor>,
                                                          StreamHandle);
  std::vector<Fp8GroupJob> jobs_;  // host copy (kept: what the table holds)
  DeviceBuffer table_;
  PreparedLaunch launch_;
  uint64_t tiles_ = 0;
};
// Tensors with no elements are left out. Allocates the job table (device memory) once.
Result<PreparedFp8Group> PrepareQuantizeFp8Group(std::span<const Fp8GroupTensor> tensors,
                                                 StreamHandle stream);

// ---- digest ------------------------------------------------------------------------------------
// The 64-bit digest of a byte range (GpuDigest in gpu_digest_reference.h is the definition and
// the CPU implementation): one kernel hashes each 64 KiB chunk into `chunk_hashes`, a second one
// combines them into `*digest` (both device memory, on `stream`, in that order).
class PreparedDigest {
 public:
  PreparedDigest() = default;
  // Launches both kernels.
  Status Launch();
  // Points the prepared launches at another range (in place; no allocation). InvalidArgument when
  // the range needs more chunk hashes than the buffer given at prepare time holds.
  Status SetRange(const void* data, uint64_t bytes);
  uint64_t capacity_chunks() const { return capacity_chunks_; }
  PreparedLaunch& chunks() { return chunks_; }
  PreparedLaunch& combine() { return combine_; }
  void set_stream(StreamHandle stream) {
    chunks_.set_stream(stream);
    combine_.set_stream(stream);
  }

 private:
  friend Result<PreparedDigest> PrepareDigest(const void*, uint64_t, uint64_t*, uint64_t, uint64_t*,
                                              StreamHandle);
  PreparedLaunch chunks_;
  PreparedLaunch combine_;
  uint64_t capacity_chunks_ = 0;
};
// `chunk_hashes` holds `capacity_chunks` >= GpuDigestChunkCount(bytes) uint64 words.
Result<PreparedDigest> PrepareDigest(const void* data, uint64_t bytes, uint64_t* chunk_hashes,
                                     uint64_t capacity_chunks, uint64_t* digest,
                                     StreamHandle stream);

// ---- digest group ------------------------------------------------------------------------------
// The digests of many ranges in two launches — every 64 KiB chunk of every range, then every
// range's combine — equal to what PrepareDigest computes for each: a store of 10^5 tensors would
// otherwise make 2 * 10^5 launches a step (about 1.5 s on an H200) to hash 6.5 GB.
struct DigestRange {
  const void* data;  // device memory
  uint64_t bytes;
  uint64_t* digest;  // device memory: where the range's digest goes
};
// The job tables the kernels read: one chunk job per 64 KiB chunk, one combine job per range.
struct DigestChunkJob {
  const uint8_t* data;
  uint64_t length;  // ≤ kGpuDigestChunkBytes
  uint64_t* hash;   // the chunk's hash, in the group's scratch
};
struct DigestCombineJob {
  const uint64_t* chunk_hashes;
  uint64_t bytes;
  uint64_t* digest;
};
class PreparedDigestGroup {
 public:
  PreparedDigestGroup() = default;
  Status Launch();  // nothing to do for an empty group
  bool empty() const { return ranges_ == 0; }
  size_t ranges() const { return ranges_; }

 private:
  friend Result<PreparedDigestGroup> PrepareDigestGroup(std::span<const DigestRange>, StreamHandle);
  size_t ranges_ = 0;
  bool has_chunks_ = false;  // some range has bytes
  DeviceBuffer scratch_;     // one hash per chunk
  DeviceBuffer chunk_table_, combine_table_;
  PreparedLaunch chunks_, combine_;
};
// Every pointer must be device memory for its bytes (InvalidArgument names the range otherwise).
// Allocates the tables and the chunk scratch once, uploaded on `stream`.
Result<PreparedDigestGroup> PrepareDigestGroup(std::span<const DigestRange> ranges,
                                               StreamHandle stream);

// ---- copy --------------------------------------------------------------------------------------
// Copies `bytes` from src to dst (device memory of this device, or peer memory it can reach,
// e.g. a CUDA-IPC mapping). 16-byte loads and stores when src and dst share their alignment
// modulo 16; byte copies otherwise. Arguments: CopyArgs. src and dst must not overlap.
Result<PreparedLaunch> PrepareCopy(const void* src, void* dst, uint64_t bytes, StreamHandle stream);

// ---- copy group --------------------------------------------------------------------------------
// Many device-to-device copies in one launch, over a job table in device memory built once: what
// a transfer handle prepares for the small copies of a step on one GPU. The runtime makes each
// same-device copy a launch of its own (339 copies of 128 bytes took 1.7 ms as one
// cudaMemcpyBatchAsync on an H200, about 5 us each); here they cost one launch. Each block copies
// whole jobs with the copy kernel's loop (16-byte vectors where a job's src and dst share their
// alignment modulo 16); copies above kCopyGroupChunkBytes are split into jobs of that size so
// the blocks share the work. Copies must not overlap each other's destinations.
// The job table entry the kernel reads.
struct CopyGroupJob {
  const void* src;
  void* dst;
  uint64_t bytes;
};
inline constexpr uint64_t kCopyGroupChunkBytes = uint64_t{1} << 20;
// Which copies of a prepared batch on one GPU go to a copy group (SplitOffSmallCopies):
// those under 16 MiB, where ~5 us per runtime copy costs about as much as moving the bytes at
// HBM speed. Larger ones, and every copy between GPUs or to or from host memory, stay with
// cudaMemcpyBatchAsync and the copy engines.
inline constexpr size_t kCopyGroupBelowBytes = size_t{16} << 20;
class PreparedCopyGroup {
 public:
  PreparedCopyGroup() = default;
  Status Launch();  // nothing to do for an empty group
  bool empty() const { return jobs_.empty(); }
  size_t jobs() const { return jobs_.size(); }
  uint64_t bytes() const { return bytes_; }

 private:
  friend Result<PreparedCopyGroup> PrepareCopyGroup(std::span<const SingleCopy>, StreamHandle);
  std::vector<CopyGroupJob> jobs_;  // host copy (kept: what the table holds)
  DeviceBuffer table_;
  PreparedLaunch launch_;
  uint64_t bytes_ = 0;
};
// Zero-byte copies are left out. Every pointer must be device memory (or memory the device can
// reach) for its bytes: InvalidArgument names the copy otherwise. Allocates the table once.
Result<PreparedCopyGroup> PrepareCopyGroup(std::span<const SingleCopy> copies, StreamHandle stream);
// Moves `batch`'s singles under kCopyGroupBelowBytes into one copy group on `stream` (the current
// device's). When that cannot be prepared (memory of another device, no memory for the table) the
// batch keeps every copy for the copy engines and the error says why: not fatal, log it.
Result<PreparedCopyGroup> SplitOffSmallCopies(CopyBatch& batch, StreamHandle stream);

// ---- argument probe ----------------------------------------------------------------------------
// One thread writes its 18 scalar arguments' bytes, zero-extended, to out[0..17] and increments
// out[18]; `out` holds kArgProbeWords uint64 words. Checks on a device that an ArgPack lays out
// every scalar type as the kernel reads it. Arguments: ArgProbeArgs.
Result<PreparedLaunch> PrepareArgProbe(uint64_t* out, StreamHandle stream);

}  // namespace weightsync::cuda
