// The transform kernels (kernels.h) and their Prepare* functions. One translation unit keeps nvcc
// time down. Each __global__ function is static_asserted against its kernel_table.h signature.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/gpu_digest_reference.h"
#include "cuda/kernel_prepare.h"
#include "cuda/kernels.h"

namespace weightsync::cuda {
namespace {

constexpr int kThreads = detail::kKernelThreads;
constexpr int kWarps = kThreads / 32;

// ---- casts ---------------------------------------------------------------------------------

__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(float x) { return x; }

template <typename D>
__device__ __forceinline__ D FromFloat(float f);
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float f) {
  return __float2bfloat16_rn(f);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float f) {
  return __float2half_rn(f);
}
template <>
__device__ __forceinline__ float FromFloat<float>(float f) {
  return f;
}

// Eight elements per thread per step: one or two 16-byte loads and stores when both pointers are
// 16-byte aligned; element by element for the rest (and for unaligned pointers).
template <typename S, typename D>
__global__ void __launch_bounds__(kThreads)
    CastKernel(const S* __restrict__ src, D* __restrict__ dst, uint64_t count) {
  constexpr int kVec = 8;
  constexpr int kSrcLoads = sizeof(S) * kVec / 16;
  constexpr int kDstStores = sizeof(D) * kVec / 16;
  const uint64_t tid = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0;
  const uint64_t vectors = aligned ? count / kVec : 0;
  const uint4* src4 = reinterpret_cast<const uint4*>(src);
  uint4* dst4 = reinterpret_cast<uint4*>(dst);
  for (uint64_t v = tid; v < vectors; v += stride) {
    uint4 raw[kSrcLoads];
#pragma unroll
    for (int k = 0; k < kSrcLoads; ++k) raw[k] = src4[v * kSrcLoads + k];
    S in[kVec];
    memcpy(in, raw, sizeof(in));
    D out[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) out[k] = FromFloat<D>(ToFloat(in[k]));
    uint4 packed[kDstStores];
    memcpy(packed, out, sizeof(out));
#pragma unroll
    for (int k = 0; k < kDstStores; ++k) dst4[v * kDstStores + k] = packed[k];
  }
  for (uint64_t i = vectors * kVec + tid; i < count; i += stride) {
    dst[i] = FromFloat<D>(ToFloat(src[i]));
  }
}

// ---- fp8 quantization ------------------------------------------------------------------------

constexpr int kTile = 128;                       // = kFp8BlockSize
constexpr int kTileVectors = kTile * kTile / 8;  // 8 bf16 (16 bytes) per vector
constexpr int kVectorsPerThread = kTileVectors / kThreads;
static_assert(kTile == kFp8BlockSize && kTileVectors % kThreads == 0);

__device__ __forceinline__ float AbsBits(uint32_t bf16_bits) {
  return __uint_as_float((bf16_bits & 0x7FFFu) << 16);
}

// The e8m0 scale: smallest 2^e with amax / 2^e <= 448, e in [-127, 127]. Written with frexpf;
// the CPU reference (transform_reference.cc) derives it from the float's bits instead.
__device__ __forceinline__ uint8_t E8M0ScaleFor(float amax) {
  if (!(amax > 0.0f)) return 127;
  int e;
  if (isinf(amax)) {
    e = 127;
  } else {
    int k;
    const float m = frexpf(amax, &k);  // amax = m * 2^k, m in [0.5, 1); 448 = 0.875 * 2^9
    e = (m <= 0.875f) ? k - 9 : k - 8;
    e = max(-127, min(127, e));
  }
  return static_cast<uint8_t>(e + 127);
}

__device__ __forceinline__ float E8M0ToFloat(uint8_t bits) {
  // 2^(bits - 127); bits 0 is 2^-127, a float32 subnormal (0x00400000). 0xFF never occurs here.
  return bits == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(uint32_t(bits) << 23);
}

// One 128x128 block (`tile`) of x[rows, cols]: every thread loads its 8 vectors of 8 bf16 into
// registers, the block reduces amax, thread 0 derives and writes the scale, then every thread
// quantizes its registers and stores 8 fp8 per vector. Elements past the matrix edge read as 0
// and are not stored. Ends with a barrier: the shared words are reused by the next tile.
template <Fp8ScaleFormat kFormat>
__device__ __forceinline__ void QuantizeFp8Tile(const uint16_t* __restrict__ xb,
                                                uint8_t* __restrict__ qb, void* __restrict__ scales,
                                                int64_t rows, int64_t cols, int64_t tile_cols,
                                                int64_t t, bool fast, float* warp_amax,
                                                float* block_scale) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r0 = (t / tile_cols) * kTile, c0 = (t % tile_cols) * kTile;
  uint4 raw[kVectorsPerThread];
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < kVectorsPerThread; ++k) {
    const int idx = k * kThreads + threadIdx.x;  // 16 vectors per tile row
    const int64_t r = r0 + idx / 16, c = c0 + (idx % 16) * 8;
    raw[k] = make_uint4(0, 0, 0, 0);
    if (r < rows && c < cols) {
      const uint16_t* p = xb + r * cols + c;
      if (fast) {
        raw[k] = *reinterpret_cast<const uint4*>(p);  // c + 8 <= cols since cols % 8 == 0
      } else {
        uint16_t e[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int j = 0; j < 8 && c + j < cols; ++j) e[j] = p[j];
        memcpy(&raw[k], e, sizeof(e));
      }
    }
    const uint32_t w[4] = {raw[k].x, raw[k].y, raw[k].z, raw[k].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      amax = fmaxf(amax, fmaxf(AbsBits(w[j] & 0xFFFFu), AbsBits(w[j] >> 16)));
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
  }
  if (lane == 0) warp_amax[warp] = amax;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = warp_amax[0];
#pragma unroll
    for (int i = 1; i < kWarps; ++i) m = fmaxf(m, warp_amax[i]);
    float s;
    if constexpr (kFormat == Fp8ScaleFormat::kE8M0) {
      const uint8_t bits = E8M0ScaleFor(m);
      static_cast<uint8_t*>(scales)[t] = bits;
      s = E8M0ToFloat(bits);
    } else {
      s = m > 0.0f ? __fdiv_rn(m, kE4M3Max) : 1.0f;
      static_cast<float*>(scales)[t] = s;
    }
    *block_scale = s;
  }
  __syncthreads();
  const float s = *block_scale;
#pragma unroll
  for (int k = 0; k < kVectorsPerThread; ++k) {
    const int idx = k * kThreads + threadIdx.x;
    const int64_t r = r0 + idx / 16, c = c0 + (idx % 16) * 8;
    if (r >= rows || c >= cols) continue;
    const uint32_t w[4] = {raw[k].x, raw[k].y, raw[k].z, raw[k].w};
    uint32_t packed[2];
#pragma unroll
    for (int j = 0; j < 4; j += 2) {
      const float2 lo = make_float2(__fdiv_rn(__uint_as_float(w[j] << 16), s),
                                    __fdiv_rn(__uint_as_float(w[j] & 0xFFFF0000u), s));
      const float2 hi = make_float2(__fdiv_rn(__uint_as_float(w[j + 1] << 16), s),
                                    __fdiv_rn(__uint_as_float(w[j + 1] & 0xFFFF0000u), s));
      packed[j / 2] = uint32_t(__nv_cvt_float2_to_fp8x2(lo, __NV_SATFINITE, __NV_E4M3)) |
                      (uint32_t(__nv_cvt_float2_to_fp8x2(hi, __NV_SATFINITE, __NV_E4M3)) << 16);
    }
    uint8_t* out = qb + r * cols + c;
    if (fast) {
      *reinterpret_cast<uint2*>(out) = make_uint2(packed[0], packed[1]);
    } else {
      for (int j = 0; j < 8 && c + j < cols; ++j) {
        out[j] = uint8_t(packed[j / 4] >> (8 * (j % 4)));
      }
    }
  }
  __syncthreads();
}

// The 16-byte loads and 8-byte stores need aligned pointers and whole vectors per row.
__device__ __forceinline__ bool Fp8FastPath(const void* x, const void* q, int64_t cols) {
  return (reinterpret_cast<uintptr_t>(x) & 15) == 0 && (reinterpret_cast<uintptr_t>(q) & 7) == 0 &&
         (cols & 7) == 0;
}

template <Fp8ScaleFormat kFormat>
__global__ void __launch_bounds__(kThreads)
    QuantizeFp8Kernel(const __nv_bfloat16* __restrict__ x, __nv_fp8_e4m3* __restrict__ q,
                      void* __restrict__ scales, int64_t rows, int64_t cols) {
  __shared__ float warp_amax[kWarps];
  __shared__ float block_scale;
  const int64_t tile_rows = (rows + kTile - 1) / kTile;
  const int64_t tile_cols = (cols + kTile - 1) / kTile;
  const int64_t tiles = rows > 0 && cols > 0 ? tile_rows * tile_cols : 0;
  const bool fast = Fp8FastPath(x, q, cols);
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    QuantizeFp8Tile<kFormat>(reinterpret_cast<const uint16_t*>(x), reinterpret_cast<uint8_t*>(q),
                             scales, rows, cols, tile_cols, t, fast, warp_amax, &block_scale);
  }
}

// Many tensors in one launch: the grid walks the concatenated tile lists of every job, so no
// tensor waits for the previous one's last blocks (one kernel per tensor left the GPU idle at
// each tail and took 0.92x of the bf16 copy's time budget on the 7B-like model).
__global__ void __launch_bounds__(kThreads)
    QuantizeFp8GroupKernel(const Fp8GroupJob* __restrict__ jobs, uint32_t count, uint64_t tiles) {
  __shared__ float warp_amax[kWarps];
  __shared__ float block_scale;
  for (uint64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    // The job holding tile t: the last one whose first_tile <= t (first_tile ascends).
    uint32_t lo = 0, hi = count;
    while (hi - lo > 1) {
      const uint32_t mid = (lo + hi) / 2;
      if (jobs[mid].first_tile <= t)
        lo = mid;
      else
        hi = mid;
    }
    const Fp8GroupJob& j = jobs[lo];
    const bool fast = Fp8FastPath(j.x, j.q, j.cols);
    const int64_t local = int64_t(t - j.first_tile);
    if (j.e8m0) {
      QuantizeFp8Tile<Fp8ScaleFormat::kE8M0>(static_cast<const uint16_t*>(j.x),
                                             static_cast<uint8_t*>(j.q), j.scales, j.rows, j.cols,
                                             j.tile_cols, local, fast, warp_amax, &block_scale);
    } else {
      QuantizeFp8Tile<Fp8ScaleFormat::kFloat32>(
          static_cast<const uint16_t*>(j.x), static_cast<uint8_t*>(j.q), j.scales, j.rows, j.cols,
          j.tile_cols, local, fast, warp_amax, &block_scale);
    }
  }
}

// ---- digest ------------------------------------------------------------------------------------

__device__ __forceinline__ uint64_t Mix64(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z;
}

__device__ __forceinline__ uint64_t WordTerm(uint64_t i, uint64_t w) {
  return Mix64(w ^ (i * kGpuDigestWordKey));
}

// Word i of a chunk of `length` bytes, little-endian, zero past the end; any alignment.
__device__ __forceinline__ uint64_t WordBytes(const uint8_t* chunk, uint32_t i, uint32_t length) {
  uint64_t w = 0;
  const uint32_t at = i * 8;
  for (uint32_t b = 0; b < 8 && at + b < length; ++b) w |= uint64_t(chunk[at + b]) << (8 * b);
  return w;
}

__device__ __forceinline__ uint64_t BlockSum(uint64_t v, uint64_t* partial) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  uint64_t total = 0;
  if (threadIdx.x == 0) {
    for (int i = 0; i < int(blockDim.x / 32); ++i) total += partial[i];
  }
  return total;  // valid in thread 0
}

// This thread's share of the hash terms of one chunk of `length` bytes at `p` (its words
// threadIdx.x, threadIdx.x + kThreads, ...); the block adds the shares up.
__device__ __forceinline__ uint64_t ChunkTerms(const uint8_t* p, uint32_t length) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  const uint32_t full = length / 8, words = (length + 7) / 8;
  uint64_t sum = 0;
  uint32_t first_bytewise = 0;
  if ((addr & 15) == 0) {
    const uint32_t pairs = full / 2;
    const uint4* p4 = reinterpret_cast<const uint4*>(p);
    uint32_t j = threadIdx.x;
    for (; j + 3 * kThreads < pairs; j += 4 * kThreads) {  // four loads in flight
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = p4[j + u * kThreads];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const uint64_t at = 2ull * (j + u * kThreads);
        sum += WordTerm(at, v[u].x | (uint64_t(v[u].y) << 32)) +
               WordTerm(at + 1, v[u].z | (uint64_t(v[u].w) << 32));
      }
    }
    for (; j < pairs; j += kThreads) {
      const uint4 v = p4[j];
      sum += WordTerm(2ull * j, v.x | (uint64_t(v.y) << 32)) +
             WordTerm(2ull * j + 1, v.z | (uint64_t(v.w) << 32));
    }
    first_bytewise = pairs * 2;
  } else if ((addr & 7) == 0) {
    const uint64_t* p8 = reinterpret_cast<const uint64_t*>(p);
    for (uint32_t i = threadIdx.x; i < full; i += kThreads) sum += WordTerm(i, p8[i]);
    first_bytewise = full;
  }
  for (uint32_t i = first_bytewise + threadIdx.x; i < words; i += kThreads) {
    sum += WordTerm(i, WordBytes(p, i, length));
  }
  return sum;
}

// One block per 64 KiB chunk (grid-stride): each thread sums the terms of its words, the block
// adds them up (addition commutes: the order of the sum does not change the result). Chunks start
// at multiples of 64 KiB, so each is as aligned as `data`.
__global__ void __launch_bounds__(kThreads)
    DigestChunksKernel(const uint8_t* __restrict__ data, uint64_t bytes,
                       uint64_t* __restrict__ chunk_hashes) {
  __shared__ uint64_t partial[kWarps];
  const uint64_t chunks = (bytes + kGpuDigestChunkBytes - 1) / kGpuDigestChunkBytes;
  for (uint64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const uint8_t* p = data + c * kGpuDigestChunkBytes;
    const uint32_t length = uint32_t(min(kGpuDigestChunkBytes, bytes - c * kGpuDigestChunkBytes));
    const uint64_t total = BlockSum(ChunkTerms(p, length), partial);
    if (threadIdx.x == 0) chunk_hashes[c] = Mix64(total + length);
    __syncthreads();  // partial is reused by the next chunk
  }
}

// Block b hashes chunk jobs b, b + grid, ... of the group's table.
__global__ void __launch_bounds__(kThreads)
    DigestGroupChunksKernel(const DigestChunkJob* __restrict__ jobs, uint32_t count) {
  __shared__ uint64_t partial[kWarps];
  for (uint32_t j = blockIdx.x; j < count; j += gridDim.x) {
    const DigestChunkJob job = jobs[j];
    const uint32_t length = uint32_t(job.length);
    const uint64_t total = BlockSum(ChunkTerms(job.data, length), partial);
    if (threadIdx.x == 0) *job.hash = Mix64(total + length);
    __syncthreads();
  }
}

constexpr int kCombineThreads = 1024;

__global__ void __launch_bounds__(kCombineThreads)
    DigestCombineKernel(const uint64_t* __restrict__ chunk_hashes, uint64_t bytes,
                        uint64_t* __restrict__ digest) {
  __shared__ uint64_t partial[kCombineThreads / 32];
  const uint64_t chunks = (bytes + kGpuDigestChunkBytes - 1) / kGpuDigestChunkBytes;
  uint64_t sum = 0;
  for (uint64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    sum += Mix64(chunk_hashes[c] ^ (c * kGpuDigestChunkKey));
  }
  const uint64_t total = BlockSum(sum, partial);
  if (threadIdx.x == 0) *digest = Mix64(total + Mix64(bytes ^ kGpuDigestSeed));
}

// Block b combines the ranges of jobs b, b + grid, ...: as DigestCombineKernel, kThreads wide.
__global__ void __launch_bounds__(kThreads)
    DigestGroupCombineKernel(const DigestCombineJob* __restrict__ jobs, uint32_t count) {
  __shared__ uint64_t partial[kWarps];
  for (uint32_t j = blockIdx.x; j < count; j += gridDim.x) {
    const DigestCombineJob job = jobs[j];
    const uint64_t chunks = (job.bytes + kGpuDigestChunkBytes - 1) / kGpuDigestChunkBytes;
    uint64_t sum = 0;
    for (uint64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      sum += Mix64(job.chunk_hashes[c] ^ (c * kGpuDigestChunkKey));
    }
    const uint64_t total = BlockSum(sum, partial);
    if (threadIdx.x == 0) *job.digest = Mix64(total + Mix64(job.bytes ^ kGpuDigestSeed));
    __syncthreads();
  }
}

// ---- copy --------------------------------------------------------------------------------------

// Thread `tid` of `stride` cooperating threads' share of copying `bytes` from src to dst.
__device__ __forceinline__ void CopyShare(const uint8_t* __restrict__ src,
                                          uint8_t* __restrict__ dst, uint64_t bytes, uint64_t tid,
                                          uint64_t stride) {
  const uintptr_t s = reinterpret_cast<uintptr_t>(src), d = reinterpret_cast<uintptr_t>(dst);
  if (((s ^ d) & 15) != 0) {  // no common 16-byte alignment: bytes
    for (uint64_t i = tid; i < bytes; i += stride) dst[i] = src[i];
    return;
  }
  const uint64_t head = min(uint64_t((16 - (s & 15)) & 15), bytes);
  for (uint64_t i = tid; i < head; i += stride) dst[i] = src[i];
  const uint4* s4 = reinterpret_cast<const uint4*>(src + head);
  uint4* d4 = reinterpret_cast<uint4*>(dst + head);
  const uint64_t vectors = (bytes - head) / 16;
  uint64_t v = tid;
  for (; v + 3 * stride < vectors; v += 4 * stride) {  // four 16-byte loads in flight
    const uint4 a = s4[v], b = s4[v + stride], c = s4[v + 2 * stride], e = s4[v + 3 * stride];
    d4[v] = a;
    d4[v + stride] = b;
    d4[v + 2 * stride] = c;
    d4[v + 3 * stride] = e;
  }
  for (; v < vectors; v += stride) d4[v] = s4[v];
  for (uint64_t i = head + vectors * 16 + tid; i < bytes; i += stride) dst[i] = src[i];
}

__global__ void __launch_bounds__(kThreads)
    CopyKernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, uint64_t bytes) {
  CopyShare(src, dst, bytes, uint64_t(blockIdx.x) * blockDim.x + threadIdx.x,
            uint64_t(gridDim.x) * blockDim.x);
}

// Block b copies jobs b, b + grid, ...: each job by the whole block.
__global__ void __launch_bounds__(kThreads)
    CopyGroupKernel(const CopyGroupJob* __restrict__ jobs, uint32_t count) {
  for (uint32_t j = blockIdx.x; j < count; j += gridDim.x) {
    const CopyGroupJob job = jobs[j];
    CopyShare(static_cast<const uint8_t*>(job.src), static_cast<uint8_t*>(job.dst), job.bytes,
              threadIdx.x, blockDim.x);
  }
}

// ---- argument probe ------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ uint64_t Widen(T v) {
  uint64_t w = 0;
  memcpy(&w, &v, sizeof(T));
  return w;
}

__global__ void ArgProbeKernel(uint64_t* out, bool b, int8_t i8, int16_t i16, int32_t i32,
                               int64_t i64, uint8_t u8, uint16_t u16, uint32_t u32, uint64_t u64,
                               Float16Bits f16, BFloat16Bits bf16, TFloat32Bits tf32, float f32,
                               double f64, Float8E4M3FNBits e4m3, Float8E5M2Bits e5m2,
                               Float8E8M0FNUBits e8m0, Float4E2M1FNBits e2m1) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  out[0] = Widen(b);
  out[1] = Widen(i8);
  out[2] = Widen(i16);
  out[3] = Widen(i32);
  out[4] = Widen(i64);
  out[5] = Widen(u8);
  out[6] = Widen(u16);
  out[7] = Widen(u32);
  out[8] = Widen(u64);
  out[9] = Widen(f16);
  out[10] = Widen(bf16);
  out[11] = Widen(tf32);
  out[12] = Widen(f32);
  out[13] = Widen(f64);
  out[14] = Widen(e4m3);
  out[15] = Widen(e5m2);
  out[16] = Widen(e8m0);
  out[17] = Widen(e2m1);
  out[18] += 1;
}

// ---- signatures ----------------------------------------------------------------------------

static_assert(KernelMatchesSignature(&CastKernel<__nv_bfloat16, float>, kCastSignature));
static_assert(KernelMatchesSignature(&CastKernel<__nv_bfloat16, __half>, kCastSignature));
static_assert(KernelMatchesSignature(&CastKernel<__half, float>, kCastSignature));
static_assert(KernelMatchesSignature(&CastKernel<__half, __nv_bfloat16>, kCastSignature));
static_assert(KernelMatchesSignature(&CastKernel<float, __nv_bfloat16>, kCastSignature));
static_assert(KernelMatchesSignature(&CastKernel<float, __half>, kCastSignature));
static_assert(KernelMatchesSignature(&QuantizeFp8Kernel<Fp8ScaleFormat::kFloat32>,
                                     kQuantizeFp8Signature));
static_assert(KernelMatchesSignature(&QuantizeFp8Kernel<Fp8ScaleFormat::kE8M0>,
                                     kQuantizeFp8Signature));
static_assert(KernelMatchesSignature(&QuantizeFp8GroupKernel, kQuantizeFp8GroupSignature));
static_assert(KernelMatchesSignature(&DigestChunksKernel, kDigestChunksSignature));
static_assert(KernelMatchesSignature(&DigestCombineKernel, kDigestCombineSignature));
static_assert(KernelMatchesSignature(&CopyKernel, kCopySignature));
static_assert(KernelMatchesSignature(&CopyGroupKernel, kCopyGroupSignature));
static_assert(KernelMatchesSignature(&DigestGroupChunksKernel, kDigestGroupSignature));
static_assert(KernelMatchesSignature(&DigestGroupCombineKernel, kDigestGroupSignature));
static_assert(KernelMatchesSignature(&ArgProbeKernel, kArgProbeSignature));

}  // namespace

// The host stub of each kernel, by KernelId.
const void* detail::KernelFunction(KernelId id) {
  switch (id) {
    case KernelId::kCastBF16ToF32:
      return reinterpret_cast<const void*>(&CastKernel<__nv_bfloat16, float>);
    case KernelId::kCastBF16ToF16:
      return reinterpret_cast<const void*>(&CastKernel<__nv_bfloat16, __half>);
    case KernelId::kCastF16ToF32:
      return reinterpret_cast<const void*>(&CastKernel<__half, float>);
    case KernelId::kCastF16ToBF16:
      return reinterpret_cast<const void*>(&CastKernel<__half, __nv_bfloat16>);
    case KernelId::kCastF32ToBF16:
      return reinterpret_cast<const void*>(&CastKernel<float, __nv_bfloat16>);
    case KernelId::kCastF32ToF16:
      return reinterpret_cast<const void*>(&CastKernel<float, __half>);
    case KernelId::kQuantizeFp8ScaleF32:
      return reinterpret_cast<const void*>(&QuantizeFp8Kernel<Fp8ScaleFormat::kFloat32>);
    case KernelId::kQuantizeFp8ScaleE8M0:
      return reinterpret_cast<const void*>(&QuantizeFp8Kernel<Fp8ScaleFormat::kE8M0>);
    case KernelId::kQuantizeFp8Group:
      return reinterpret_cast<const void*>(&QuantizeFp8GroupKernel);
    case KernelId::kDigestChunks:
      return reinterpret_cast<const void*>(&DigestChunksKernel);
    case KernelId::kDigestCombine:
      return reinterpret_cast<const void*>(&DigestCombineKernel);
    case KernelId::kDigestGroupChunks:
      return reinterpret_cast<const void*>(&DigestGroupChunksKernel);
    case KernelId::kDigestGroupCombine:
      return reinterpret_cast<const void*>(&DigestGroupCombineKernel);
    case KernelId::kCopy:
      return reinterpret_cast<const void*>(&CopyKernel);
    case KernelId::kCopyGroup:
      return reinterpret_cast<const void*>(&CopyGroupKernel);
    case KernelId::kArgProbe:
      return reinterpret_cast<const void*>(&ArgProbeKernel);
    case KernelId::kBlockScaledAmax:
    case KernelId::kQuantizeBlockScaled:
      return detail::BlockScaledKernelFunction(id);
    case KernelId::kCount:
      break;
  }
  return nullptr;
}

namespace detail {

// ---- preparing (kernel_prepare.h) --------------------------------------------------------------
namespace {

Result<int> MultiprocessorCount() {
  int device = 0;
  WS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "cudaGetDevice");
  int sms = 0;
  WS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                          "reading the multiprocessor count of device ", device);
  return std::max(sms, 1);
}

}  // namespace

// A grid for `work` items of `per_block` each, capped at `waves` blocks per multiprocessor
// (the kernels loop over the rest); at least one block.
Result<uint32_t> GridFor(uint64_t work, uint64_t per_block, int waves) {
  WS_ASSIGN_OR_RETURN(int sms, MultiprocessorCount());
  const uint64_t wanted = (work + per_block - 1) / per_block;
  return uint32_t(std::clamp<uint64_t>(wanted, 1, uint64_t(sms) * waves));
}

// Device pointers given at prepare time must be reachable by the device.
Status CheckDevicePointer(std::string_view kernel, std::string_view what, const void* p,
                          uint64_t bytes) {
  if (bytes == 0) return Status::Ok();
  if (p == nullptr) {
    return Status::InvalidArgument(kernel, ": ", what, " is null for ", bytes, " bytes");
  }
  cudaPointerAttributes attr{};
  WS_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, p), kernel, ": inspecting ", what,
                          " pointer ", p);
  if (attr.type == cudaMemoryTypeUnregistered ||
      (attr.type == cudaMemoryTypeHost && attr.devicePointer == nullptr)) {
    return Status::InvalidArgument(kernel, ": ", what, " pointer ", p,
                                   " is host memory the device cannot reach (",
                                   "expected device, managed or mapped pinned memory)");
  }
  return Status::Ok();
}

Result<PreparedLaunch> Make(KernelId id, uint32_t grid, uint32_t block, StreamHandle stream) {
  return PreparedLaunch::Create(Kernel(id), KernelFunction(id), Dim3{grid, 1, 1}, Dim3{block, 1, 1},
                                0, stream);
}

// A grouped kernel's launch over a job table: the table in device memory (*table), uploaded on
// `stream`, the one its launches use (a cudaMemcpy from pageable memory may return before its DMA
// lands, and the legacy stream it runs on does not order a non-blocking one; `jobs` lives with
// the group that owns the table); as many blocks as stay resident at once, each looping over its
// share of `work` items. Arguments 0 and 1 of every grouped kernel: the table and the job count.
Result<PreparedLaunch> PrepareGroupLaunch(KernelId id, const void* jobs, size_t count,
                                          size_t job_bytes, uint64_t work, StreamHandle stream,
                                          DeviceBuffer* table) {
  const std::string_view name = Kernel(id).name;
  if (count > UINT32_MAX) {
    return Status::InvalidArgument(name, ": ", count, " jobs, at most ", UINT32_MAX);
  }
  const size_t bytes = count * job_bytes;
  WS_ASSIGN_OR_RETURN(*table, DeviceBuffer::Allocate(bytes));
  WS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(table->data(), jobs, bytes, cudaMemcpyHostToDevice,
                                          static_cast<cudaStream_t>(stream)),
                          "uploading the job table of ", name);
  int per_sm = 0;
  WS_CUDA_RETURN_IF_ERROR(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, KernelFunction(id), kThreads, 0),
      "occupancy of ", name);
  WS_ASSIGN_OR_RETURN(uint32_t grid, GridFor(work, 1, std::max(per_sm, 1)));
  WS_ASSIGN_OR_RETURN(PreparedLaunch launch, Make(id, grid, kThreads, stream));
  launch.args().Set(0, table->data());
  launch.args().Set(1, uint32_t(count));
  return Result<PreparedLaunch>(std::move(launch));
}

}  // namespace detail

namespace {

using detail::CheckDevicePointer;
using detail::GridFor;
using detail::Make;

// A copy group reads and writes with this device's SMs: memory of another GPU (or host memory,
// even mapped) stays with the copy engines, so only this device's memory is accepted.
Status CheckOnThisDevice(std::string_view what, const void* p, int device) {
  cudaPointerAttributes attr{};
  WS_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, p), "copy_group: inspecting ", what,
                          " pointer ", p);
  if (attr.type != cudaMemoryTypeDevice || attr.device != device) {
    return Status::InvalidArgument("copy_group: ", what, " pointer ", p,
                                   " is not memory of cuda:", device, " (memory type ",
                                   int(attr.type), ", device ", attr.device, ")");
  }
  return Status::Ok();
}

// An fp8 quantization's shape and pointers (input, output, scales reachable for their sizes);
// its number of 128x128 blocks, 0 for an empty matrix.
Result<uint64_t> CheckFp8Tensor(std::string_view kernel, const Fp8GroupTensor& t) {
  if (t.rows < 0 || t.cols < 0) {
    return Status::InvalidArgument(kernel, ": negative shape [", t.rows, ", ", t.cols, "]");
  }
  const uint64_t elements = uint64_t(t.rows) * uint64_t(t.cols);
  if (elements == 0) return uint64_t{0};
  const uint64_t tiles = uint64_t(Fp8ScaleRows(t.rows)) * uint64_t(Fp8ScaleCols(t.cols));
  WS_RETURN_IF_ERROR(CheckDevicePointer(kernel, "input", t.x_bf16, elements * 2));
  WS_RETURN_IF_ERROR(CheckDevicePointer(kernel, "output", t.q_e4m3, elements));
  WS_RETURN_IF_ERROR(CheckDevicePointer(kernel, "scales", t.scales,
                                        tiles * (t.format == Fp8ScaleFormat::kE8M0 ? 1 : 4)));
  return tiles;
}

template <typename Job>
Result<PreparedLaunch> PrepareGroupLaunch(KernelId id, const std::vector<Job>& jobs, uint64_t work,
                                          StreamHandle stream, DeviceBuffer* table) {
  return detail::PrepareGroupLaunch(id, jobs.data(), jobs.size(), sizeof(Job), work, stream, table);
}

uint64_t ElementBytes(DType d) { return Info(d).bits / 8; }

}  // namespace

Result<PreparedLaunch> PrepareCast(DType from, DType to, const void* src, void* dst, uint64_t count,
                                   StreamHandle stream) {
  WS_RETURN_IF_ERROR(CudaAvailable());
  WS_ASSIGN_OR_RETURN(KernelId id, CastKernelFor(from, to));
  const std::string_view name = Kernel(id).name;
  WS_RETURN_IF_ERROR(CheckDevicePointer(name, "source", src, count * ElementBytes(from)));
  WS_RETURN_IF_ERROR(CheckDevicePointer(name, "destination", dst, count * ElementBytes(to)));
  WS_ASSIGN_OR_RETURN(uint32_t grid, GridFor(count, uint64_t(kThreads) * 8, 8));
  WS_ASSIGN_OR_RETURN(PreparedLaunch launch, Make(id, grid, kThreads, stream));
  launch.args().Set(CastArgs::kSrc, src);
  launch.args().Set(CastArgs::kDst, dst);
  launch.args().Set(CastArgs::kCount, count);
  return Result<PreparedLaunch>(std::move(launch));
}

Result<PreparedLaunch> PrepareQuantizeFp8(const void* x_bf16, void* q_e4m3, void* scales,
                                          int64_t rows, int64_t cols, Fp8ScaleFormat format,
                                          StreamHandle stream) {
  const KernelId id = format == Fp8ScaleFormat::kE8M0 ? KernelId::kQuantizeFp8ScaleE8M0
                                                      : KernelId::kQuantizeFp8ScaleF32;
  WS_RETURN_IF_ERROR(CudaAvailable());
  WS_ASSIGN_OR_RETURN(const uint64_t tiles, CheckFp8Tensor(Kernel(id).name, {x_bf16, q_e4m3, scales,
                                                                             rows, cols, format}));
  WS_ASSIGN_OR_RETURN(uint32_t grid, GridFor(tiles, 1, 16));
  WS_ASSIGN_OR_RETURN(PreparedLaunch launch, Make(id, grid, kThreads, stream));
  launch.args().Set(QuantizeFp8Args::kX, x_bf16);
  launch.args().Set(QuantizeFp8Args::kQ, q_e4m3);
  launch.args().Set(QuantizeFp8Args::kScales, scales);
  launch.args().Set(QuantizeFp8Args::kRows, rows);
  launch.args().Set(QuantizeFp8Args::kCols, cols);
  return Result<PreparedLaunch>(std::move(launch));
}

Result<PreparedFp8Group> PrepareQuantizeFp8Group(std::span<const Fp8GroupTensor> tensors,
                                                 StreamHandle stream) {
  WS_RETURN_IF_ERROR(CudaAvailable());
  const std::string_view name = Kernel(KernelId::kQuantizeFp8Group).name;
  PreparedFp8Group group;
  group.jobs_.reserve(tensors.size());
  uint64_t tiles = 0;
  for (const Fp8GroupTensor& t : tensors) {
    WS_ASSIGN_OR_RETURN(const uint64_t n, CheckFp8Tensor(name, t));
    if (n == 0) continue;
    group.jobs_.push_back(Fp8GroupJob{t.x_bf16, t.q_e4m3, t.scales, t.rows, t.cols,
                                      Fp8ScaleCols(t.cols), tiles,
                                      t.format == Fp8ScaleFormat::kE8M0 ? 1u : 0u, 0u});
    tiles += n;
  }
  if (group.jobs_.empty()) return Result<PreparedFp8Group>(std::move(group));
  WS_ASSIGN_OR_RETURN(group.launch_, PrepareGroupLaunch(KernelId::kQuantizeFp8Group, group.jobs_,
                                                        tiles, stream, &group.table_));
  group.launch_.args().Set(QuantizeFp8GroupArgs::kTiles, tiles);
  group.tiles_ = tiles;
  return Result<PreparedFp8Group>(std::move(group));
}

Status PreparedFp8Group::Launch() {
  if (jobs_.empty()) return Status::Ok();
  return launch_.Launch();
}

Result<PreparedDigest> PrepareDigest(const void* data, uint64_t bytes, uint64_t* chunk_hashes,
                                     uint64_t capacity_chunks, uint64_t* digest,
                                     StreamHandle stream) {
  WS_RETURN_IF_ERROR(CudaAvailable());
  const uint64_t chunks = GpuDigestChunkCount(bytes);
  if (chunks > capacity_chunks) {
    return Status::InvalidArgument("digest: ", bytes, " bytes need ", chunks,
                                   " chunk hashes, the buffer holds ", capacity_chunks);
  }
  WS_RETURN_IF_ERROR(CheckDevicePointer("digest", "data", data, bytes));
  WS_RETURN_IF_ERROR(CheckDevicePointer("digest", "chunk hash", chunk_hashes, capacity_chunks * 8));
  WS_RETURN_IF_ERROR(CheckDevicePointer("digest", "result", digest, 8));
  WS_ASSIGN_OR_RETURN(uint32_t grid, GridFor(chunks, 1, 8));
  PreparedDigest d;
  WS_ASSIGN_OR_RETURN(d.chunks_, Make(KernelId::kDigestChunks, grid, kThreads, stream));
  WS_ASSIGN_OR_RETURN(d.combine_, Make(KernelId::kDigestCombine, 1, kCombineThreads, stream));
  d.capacity_chunks_ = capacity_chunks;
  d.chunks_.args().Set(DigestChunksArgs::kData, data);
  d.chunks_.args().Set(DigestChunksArgs::kBytes, bytes);
  d.chunks_.args().Set(DigestChunksArgs::kChunkHashes, chunk_hashes);
  d.combine_.args().Set(DigestCombineArgs::kChunkHashes,
                        static_cast<const uint64_t*>(chunk_hashes));
  d.combine_.args().Set(DigestCombineArgs::kBytes, bytes);
  d.combine_.args().Set(DigestCombineArgs::kDigest, digest);
  return Result<PreparedDigest>(std::move(d));
}

Status PreparedDigest::Launch() {
  WS_RETURN_IF_ERROR(chunks_.Launch());
  return combine_.Launch();
}

Status PreparedDigest::SetRange(const void* data, uint64_t bytes) {
  const uint64_t chunks = GpuDigestChunkCount(bytes);
  if (chunks > capacity_chunks_) {
    return Status::InvalidArgument("digest: ", bytes, " bytes need ", chunks,
                                   " chunk hashes, the buffer holds ", capacity_chunks_);
  }
  chunks_.args().Set(DigestChunksArgs::kData, data);
  chunks_.args().Set(DigestChunksArgs::kBytes, bytes);
  combine_.args().Set(DigestCombineArgs::kBytes, bytes);
  return Status::Ok();
}

Result<PreparedDigestGroup> PrepareDigestGroup(std::span<const DigestRange> ranges,
                                               StreamHandle stream) {
  WS_RETURN_IF_ERROR(CudaAvailable());
  PreparedDigestGroup g;
  if (ranges.empty()) return Result<PreparedDigestGroup>(std::move(g));
  uint64_t chunks = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const std::string what = "range " + std::to_string(i);
    WS_RETURN_IF_ERROR(CheckDevicePointer("digest_group", what, ranges[i].data, ranges[i].bytes));
    WS_RETURN_IF_ERROR(CheckDevicePointer("digest_group", what + "'s digest", ranges[i].digest, 8));
    chunks += GpuDigestChunkCount(ranges[i].bytes);
  }
  WS_ASSIGN_OR_RETURN(g.scratch_, DeviceBuffer::Allocate(std::max<uint64_t>(chunks, 1) * 8));
  std::vector<DigestChunkJob> chunk_jobs;
  std::vector<DigestCombineJob> combine_jobs;
  chunk_jobs.reserve(chunks);
  combine_jobs.reserve(ranges.size());
  uint64_t* hashes = g.scratch_.as<uint64_t>();
  for (const DigestRange& r : ranges) {
    const uint64_t n = GpuDigestChunkCount(r.bytes);
    const auto* data = static_cast<const uint8_t*>(r.data);
    for (uint64_t c = 0; c < n; ++c) {
      const uint64_t at = c * kGpuDigestChunkBytes;
      chunk_jobs.push_back({data + at, std::min(kGpuDigestChunkBytes, r.bytes - at), hashes + c});
    }
    combine_jobs.push_back({hashes, r.bytes, r.digest});
    hashes += n;
  }
  if (!chunk_jobs.empty()) {
    WS_ASSIGN_OR_RETURN(g.chunks_, PrepareGroupLaunch(KernelId::kDigestGroupChunks, chunk_jobs,
                                                      chunk_jobs.size(), stream, &g.chunk_table_));
    g.has_chunks_ = true;
  }
  WS_ASSIGN_OR_RETURN(g.combine_,
                      PrepareGroupLaunch(KernelId::kDigestGroupCombine, combine_jobs,
                                         combine_jobs.size(), stream, &g.combine_table_));
  g.ranges_ = ranges.size();
  return Result<PreparedDigestGroup>(std::move(g));
}

Status PreparedDigestGroup::Launch() {
  if (ranges_ == 0) return Status::Ok();
  if (has_chunks_) WS_RETURN_IF_ERROR(chunks_.Launch());
  return combine_.Launch();
}

Result<PreparedLaunch> PrepareCopy(const void* src, void* dst, uint64_t bytes,
                                   StreamHandle stream) {
  WS_RETURN_IF_ERROR(CudaAvailable());
  WS_RETURN_IF_ERROR(CheckDevicePointer("copy", "source", src, bytes));
  WS_RETURN_IF_ERROR(CheckDevicePointer("copy", "destination", dst, bytes));
  WS_ASSIGN_OR_RETURN(uint32_t grid, GridFor(bytes, uint64_t(kThreads) * 16 * 4, 8));
  WS_ASSIGN_OR_RETURN(PreparedLaunch launch, Make(KernelId::kCopy, grid, kThreads, stream));
  launch.args().Set(CopyArgs::kSrc, src);
  launch.args().Set(CopyArgs::kDst, dst);
  launch.args().Set(CopyArgs::kBytes, bytes);
  return Result<PreparedLaunch>(std::move(launch));
}

Result<PreparedCopyGroup> PrepareCopyGroup(std::span<const SingleCopy> copies,
                                           StreamHandle stream) {
  WS_RETURN_IF_ERROR(CudaAvailable());
  int device = -1;
  WS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "cudaGetDevice");
  PreparedCopyGroup group;
  for (size_t i = 0; i < copies.size(); ++i) {
    const SingleCopy& c = copies[i];
    if (c.bytes == 0) continue;
    for (auto [what, p] : {std::pair<const char*, const void*>{"source", c.src},
                           std::pair<const char*, const void*>{"destination", c.dst}}) {
      Status on_device = CheckOnThisDevice(what, p, device);
      if (!on_device.ok()) return on_device.WithContext("copy " + std::to_string(i));
    }
    for (uint64_t at = 0; at < c.bytes; at += kCopyGroupChunkBytes) {
      group.jobs_.push_back({static_cast<const uint8_t*>(c.src) + at,
                             static_cast<uint8_t*>(c.dst) + at,
                             std::min(kCopyGroupChunkBytes, c.bytes - at)});
    }
    group.bytes_ += c.bytes;
  }
  if (group.jobs_.empty()) return Result<PreparedCopyGroup>(std::move(group));
  WS_ASSIGN_OR_RETURN(group.launch_, PrepareGroupLaunch(KernelId::kCopyGroup, group.jobs_,
                                                        group.jobs_.size(), stream, &group.table_));
  return Result<PreparedCopyGroup>(std::move(group));
}

Result<PreparedCopyGroup> SplitOffSmallCopies(CopyBatch& batch, StreamHandle stream) {
  WS_ASSIGN_OR_RETURN(PreparedCopyGroup group,
                      PrepareCopyGroup(batch.SinglesBelow(kCopyGroupBelowBytes), stream));
  batch.DropSinglesBelow(kCopyGroupBelowBytes);
  return Result<PreparedCopyGroup>(std::move(group));
}

Status PreparedCopyGroup::Launch() {
  if (jobs_.empty()) return Status::Ok();
  return launch_.Launch();
}

Result<PreparedLaunch> PrepareArgProbe(uint64_t* out, StreamHandle stream) {
  WS_RETURN_IF_ERROR(CudaAvailable());
  WS_RETURN_IF_ERROR(CheckDevicePointer("arg_probe", "output", out, kArgProbeWords * 8));
  WS_ASSIGN_OR_RETURN(PreparedLaunch launch, Make(KernelId::kArgProbe, 1, 32, stream));
  launch.args().Set(ArgProbeArgs::kOut, out);
  return Result<PreparedLaunch>(std::move(launch));
}

}  // namespace weightsync::cuda
