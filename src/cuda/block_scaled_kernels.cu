// MXFP8 and NVFP4 quantization kernels and their prepared group (block_scaled_kernels.h). The
// arithmetic is the CPU reference's (block_scaled_reference.h), step for step in float32 with
// IEEE division and no fused multiply-add (cmake/Cuda.cmake), rounding with CUDA's own
// conversions: __nv_cvt_float_to_fp8 (e4m3, satfinite) and __nv_cvt_float_to_fp4 (e2m1), the
// ones tests/cuda/block_scaled_host_conversion_test.cc checks the reference's rules against.
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "cuda/block_scaled_kernels.h"
#include "cuda/cuda_check.h"
#include "cuda/kernel_prepare.h"

namespace weightsync::cuda {
namespace {

constexpr int kThreads = detail::kKernelThreads;
constexpr int kChunk = 8;       // elements a thread takes
constexpr uint64_t kWarp = 32;  // each job's work is rounded up to whole warps
constexpr uint32_t kAll = 0xFFFFFFFFu;
constexpr uint32_t kInfBits = 0x7F800000u;

uint64_t RoundUpToWarp(uint64_t n) { return (n + kWarp - 1) / kWarp * kWarp; }

// ---- device helpers ------------------------------------------------------------------------

// Elements [offset, offset + n) of x as float32 (n <= 8; the rest read as 0). `vector`: offset is
// a multiple of 8 and x 16-byte aligned, so whole 16-byte loads.
__device__ __forceinline__ void LoadChunk(const BlockScaledJob& j, int64_t offset, int n,
                                          bool vector, float (&v)[kChunk]) {
  if (j.float32) {
    const float* x = static_cast<const float*>(j.x) + offset;
    if (vector && n == kChunk) {
      const float4 a = reinterpret_cast<const float4*>(x)[0];
      const float4 b = reinterpret_cast<const float4*>(x)[1];
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
      v[7] = b.w;
      return;
    }
#pragma unroll
    for (int k = 0; k < kChunk; ++k) v[k] = k < n ? x[k] : 0.0f;
    return;
  }
  const uint16_t* x = static_cast<const uint16_t*>(j.x) + offset;
  if (vector && n == kChunk) {
    const uint4 raw = *reinterpret_cast<const uint4*>(x);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[2 * k] = __uint_as_float(w[k] << 16);
      v[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < kChunk; ++k) v[k] = k < n ? __uint_as_float(uint32_t(x[k]) << 16) : 0.0f;
}

// The largest magnitude of v as float bits (non-negative floats order as their bits), NaNs left
// out as the references do; whether one was there.
__device__ __forceinline__ uint32_t AmaxBits(const float (&v)[kChunk], bool* nan) {
  uint32_t m = 0;
#pragma unroll
  for (int k = 0; k < kChunk; ++k) {
    const uint32_t bits = __float_as_uint(v[k]) & 0x7FFFFFFFu;
    if (bits > kInfBits) {
      *nan = true;
    } else {
      m = max(m, bits);
    }
  }
  return m;
}

__device__ __forceinline__ uint8_t ToE4M3(float v) {
  return uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float FromE4M3(uint8_t bits) {
  __nv_fp8_e4m3 f;
  f.__x = bits;
  return float(f);
}

__device__ __forceinline__ uint8_t ToE2M1(float v) {
  return uint8_t(__nv_cvt_float_to_fp4(v, __NV_E2M1, cudaRoundNearest));
}

// The job holding work item u: the last whose first item is <= u (firsts ascend; a job with no
// items shares its first with the next one, which wins). A thread's consecutive items are a grid
// apart and mostly in one tensor, so it keeps the last answer and the range of items it covers,
// and searches only when u leaves that range.
template <uint64_t BlockScaledJob::*kFirst>
struct JobCursor {
  uint32_t at = 0;
  uint64_t begin = 1, end = 0;  // empty: the first item searches

  __device__ __forceinline__ uint32_t Find(const BlockScaledJob* jobs, uint32_t count,
                                           uint64_t units, uint64_t u) {
    if (u >= begin && u < end) return at;
    uint32_t lo = 0, hi = count;
    while (hi - lo > 1) {
      const uint32_t mid = (lo + hi) / 2;
      if (jobs[mid].*kFirst <= u) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    at = lo;
    begin = jobs[lo].*kFirst;
    end = lo + 1 < count ? jobs[lo + 1].*kFirst : units;
    return at;
  }
};

// ---- NVFP4 tensor amax ---------------------------------------------------------------------

// Every NVFP4 job's amax (float bits) into its scratch word, which the launch zeroed: each thread
// keeps a running maximum while it stays in one job; the warp (always within one job: work is
// rounded to warps) reduces it and one lane folds it in with atomicMax (order-free, so the result
// does not depend on the schedule).
__global__ void __launch_bounds__(kThreads)
    BlockScaledAmaxKernel(const BlockScaledJob* __restrict__ jobs, uint32_t count, uint64_t units) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  int64_t current = -1;
  uint32_t running = 0;
  JobCursor<&BlockScaledJob::first_amax_unit> cursor;
  const auto flush = [&] {
    const uint32_t m = __reduce_max_sync(kAll, running);
    if (current >= 0 && (threadIdx.x & 31) == 0 && m > 0) atomicMax(jobs[current].amax, m);
  };
  for (uint64_t u = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += stride) {
    const uint32_t at = cursor.Find(jobs, count, units, u);
    if (int64_t(at) != current) {  // the same for the whole warp
      flush();
      current = at;
      running = 0;
    }
    const BlockScaledJob& j = jobs[at];
    const uint64_t local = u - j.first_amax_unit;
    if (local >= j.amax_units) continue;
    const int64_t elements = j.rows * j.cols, offset = int64_t(local) * kChunk;
    const int n = int(elements - offset < kChunk ? elements - offset : kChunk);
    float v[kChunk];
    LoadChunk(j, offset, n, j.x_aligned, v);
    bool nan = false;
    running = max(running, AmaxBits(v, &nan));
  }
  flush();
}

// ---- quantize ------------------------------------------------------------------------------

// NVFP4's tensor-wide scales from its amax (Nvfp4TensorScaleFor).
struct TensorScale {
  float encode, global;
};
__device__ __forceinline__ TensorScale Nvfp4TensorScale(uint32_t amax_bits) {
  const float amax = __uint_as_float(amax_bits);
  const float limit = kE2M1Max * 448.0f;
  const float encode = limit / amax;
  if (!(amax > 0.0f) || isinf(amax) || isinf(encode) || isnan(encode)) return {1.0f, 1.0f};
  return {encode, amax / limit};
}

// The e8m0 scale of an MXFP8 block (Mxfp8ScaleFor) and its inverse 2^(127 - bits), exact.
__device__ __forceinline__ uint8_t Mxfp8Scale(uint32_t amax_bits) {
  if (amax_bits == kInfBits) return 254;
  return uint8_t(min(max(int(amax_bits >> 23) - 8, 0), 254));
}
__device__ __forceinline__ float Mxfp8Inverse(uint8_t scale) {
  // 2^(127 - scale): biased exponent 254 - scale; scale 254 gives 2^-127, a subnormal.
  return scale == 254 ? __uint_as_float(0x00400000u) : __uint_as_float(uint32_t(254 - scale) << 23);
}

// One chunk of values: MXFP8 one byte each, NVFP4 two per byte (even element low). `vector`:
// the whole chunk lies in the row and the destination is aligned for one store.
__device__ __forceinline__ void StoreMxfp8(uint8_t* out, const float (&v)[kChunk], float factor,
                                           int n, bool vector) {
  uint8_t q[kChunk];
#pragma unroll
  for (int k = 0; k < kChunk; ++k) q[k] = ToE4M3(v[k] * factor);
  if (vector) {
    uint2 packed;
    memcpy(&packed, q, sizeof(q));
    *reinterpret_cast<uint2*>(out) = packed;
    return;
  }
  for (int k = 0; k < n; ++k) out[k] = q[k];
}
__device__ __forceinline__ void StoreNvfp4(uint8_t* out, const float (&v)[kChunk], float factor,
                                           int n, bool vector) {
  uint8_t bytes[kChunk / 2];
#pragma unroll
  for (int k = 0; k < kChunk; k += 2) {
    const uint8_t lo = ToE2M1(v[k] * factor), hi = k + 1 < n ? ToE2M1(v[k + 1] * factor) : 0;
    bytes[k / 2] = uint8_t(lo | (hi << 4));
  }
  if (vector) {
    uint32_t packed;
    memcpy(&packed, bytes, sizeof(bytes));
    *reinterpret_cast<uint32_t*>(out) = packed;
    return;
  }
  for (int k = 0; k < n; k += 2) out[k / 2] = bytes[k / 2];
}

// A work item is one 8-element chunk of one row of the scale grid (padded when swizzled): the
// neighbouring lanes of a block agree on its amax, the first of them writes the scale (0 for a
// padding position), each writes its values. The first item of an NVFP4 job writes the global
// scale (also for a tensor with no elements: 1, as the reference).
__global__ void __launch_bounds__(kThreads)
    QuantizeBlockScaledKernel(const BlockScaledJob* __restrict__ jobs, uint32_t count,
                              uint64_t units) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  JobCursor<&BlockScaledJob::first_unit> cursor;
  for (uint64_t u = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += stride) {
    const BlockScaledJob& j = jobs[cursor.Find(jobs, count, units, u)];
    const bool mx = j.format == uint8_t(BlockFormat::kMxfp8);  // the same for the whole warp
    const uint64_t local = u - j.first_unit;
    const bool live = local < j.units;
    const int per_block = int(BlockSize(BlockFormat(j.format)) / kChunk);  // 4 or 2 lanes
    int64_t r = 0, b = 0, c0 = 0;
    int part = 0, n = 0;
    if (live) {
      r = int64_t(local / uint64_t(j.chunks_per_row));
      const int64_t k = int64_t(local % uint64_t(j.chunks_per_row));
      b = k / per_block;
      part = int(k % per_block);
      c0 = b * BlockSize(BlockFormat(j.format)) + part * kChunk;
      if (r < j.rows && c0 < j.cols) n = int(j.cols - c0 < kChunk ? j.cols - c0 : kChunk);
    }
    float v[kChunk];
    LoadChunk(j, r * j.cols + c0, n, j.vector, v);
    bool nan = false;
    uint32_t amax = AmaxBits(v, &nan);
    amax = max(amax, __shfl_xor_sync(kAll, amax, 1));
    nan = __shfl_xor_sync(kAll, int(nan), 1) != 0 || nan;
    if (mx) {
      amax = max(amax, __shfl_xor_sync(kAll, amax, 2));
      nan = __shfl_xor_sync(kAll, int(nan), 2) != 0 || nan;
    }
    const ScaleShape shape{j.scale_rows, j.scale_cols};
    const ScaleLayout layout = ScaleLayout(j.layout);
    const bool real = r < j.rows && b < BlocksPerRow(BlockFormat(j.format), j.cols);
    if (mx) {
      const uint8_t scale = Mxfp8Scale(amax);
      if (live && part == 0) j.scales[ScaleOffset(layout, shape, r, b)] = real ? scale : 0;
      if (n > 0) {
        StoreMxfp8(j.values + r * j.row_bytes + c0, v, Mxfp8Inverse(scale), n, j.vector != 0);
      }
      continue;
    }
    const TensorScale tensor = Nvfp4TensorScale(*j.amax);
    if (local == 0) *j.global_scale = tensor.global;
    const uint8_t scale = ToE4M3((__uint_as_float(amax) / kE2M1Max) * tensor.encode);
    const float decoded = FromE4M3(scale);
    const float factor = decoded > 0.0f ? tensor.encode / decoded : 0.0f;
    if (live && part == 0) {
      j.scales[ScaleOffset(layout, shape, r, b)] = real ? (nan ? uint8_t(0x7F) : scale) : 0;
    }
    if (n > 0) StoreNvfp4(j.values + r * j.row_bytes + c0 / 2, v, factor, n, j.vector != 0);
  }
}

static_assert(KernelMatchesSignature(&BlockScaledAmaxKernel, kBlockScaledGroupSignature));
static_assert(KernelMatchesSignature(&QuantizeBlockScaledKernel, kBlockScaledGroupSignature));

// ---- preparing -----------------------------------------------------------------------------

bool Aligned(const void* p, uintptr_t to) { return (reinterpret_cast<uintptr_t>(p) % to) == 0; }

// Tensor i's job (units and firsts left to the caller), its pointers checked for their sizes.
Result<BlockScaledJob> JobFor(const BlockScaledTensor& t, size_t i) {
  const std::string_view name = Kernel(KernelId::kQuantizeBlockScaled).name;
  const std::string what = "tensor " + std::to_string(i);
  if (t.from != DType::kBFloat16 && t.from != DType::kFloat32) {
    return Status::InvalidArgument(name, ": ", what, " is ", DTypeName(t.from),
                                   "; block-scaled formats are converted from bfloat16 or float32");
  }
  if (t.rows < 0 || t.cols < 0) {
    return Status::InvalidArgument(name, ": ", what, " has a negative shape [", t.rows, ", ",
                                   t.cols, "]");
  }
  const ScaleShape shape = ScaleShapeFor(t.format, t.layout, t.rows, t.cols);
  const int64_t row_bytes = ValueBytesPerRow(t.format, t.cols);
  const uint64_t elements = uint64_t(t.rows) * uint64_t(t.cols);
  const bool nvfp4 = t.format == BlockFormat::kNvfp4;
  WS_RETURN_IF_ERROR(detail::CheckDevicePointer(name, what + " input", t.x,
                                                elements * (t.from == DType::kFloat32 ? 4 : 2)));
  WS_RETURN_IF_ERROR(
      detail::CheckDevicePointer(name, what + " values", t.values, uint64_t(t.rows * row_bytes)));
  WS_RETURN_IF_ERROR(
      detail::CheckDevicePointer(name, what + " scales", t.scales, uint64_t(shape.bytes())));
  if (nvfp4) {
    WS_RETURN_IF_ERROR(
        detail::CheckDevicePointer(name, what + " global scale", t.global_scale, sizeof(float)));
  }
  BlockScaledJob j{};
  j.x = t.x;
  j.values = static_cast<uint8_t*>(t.values);
  j.scales = static_cast<uint8_t*>(t.scales);
  j.global_scale = static_cast<float*>(t.global_scale);
  j.rows = t.rows;
  j.cols = t.cols;
  j.scale_rows = shape.rows;
  j.scale_cols = shape.cols;
  j.row_bytes = row_bytes;
  j.chunks_per_row = shape.cols * (BlockSize(t.format) / kChunk);
  j.units = uint64_t(shape.rows) * uint64_t(j.chunks_per_row);
  j.amax_units = nvfp4 ? (elements + kChunk - 1) / kChunk : 0;
  j.format = uint8_t(t.format);
  j.layout = uint8_t(t.layout);
  j.float32 = t.from == DType::kFloat32;
  j.x_aligned = Aligned(t.x, 16);
  j.vector = j.x_aligned && t.cols % kChunk == 0 && Aligned(t.values, nvfp4 ? 4 : 8);
  return j;
}

}  // namespace

const void* detail::BlockScaledKernelFunction(KernelId id) {
  switch (id) {
    case KernelId::kBlockScaledAmax:
      return reinterpret_cast<const void*>(&BlockScaledAmaxKernel);
    case KernelId::kQuantizeBlockScaled:
      return reinterpret_cast<const void*>(&QuantizeBlockScaledKernel);
    default:
      return nullptr;
  }
}

Result<PreparedBlockScaledGroup> PrepareQuantizeBlockScaledGroup(
    std::span<const BlockScaledTensor> tensors, StreamHandle stream) {
  WS_RETURN_IF_ERROR(CudaAvailable());
  PreparedBlockScaledGroup group;
  group.jobs_.reserve(tensors.size());
  uint64_t units = 0, amax_units = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    WS_ASSIGN_OR_RETURN(BlockScaledJob j, JobFor(tensors[i], i));
    j.first_unit = units;
    j.first_amax_unit = amax_units;
    // At least one warp a job: its first item writes an NVFP4 global scale even with no elements.
    units += RoundUpToWarp(std::max<uint64_t>(j.units, 1));
    amax_units += RoundUpToWarp(j.amax_units);
    group.has_nvfp4_ = group.has_nvfp4_ || j.format == uint8_t(BlockFormat::kNvfp4);
    group.jobs_.push_back(j);
  }
  if (group.jobs_.empty()) return Result<PreparedBlockScaledGroup>(std::move(group));
  WS_ASSIGN_OR_RETURN(group.amax_, DeviceBuffer::Allocate(group.jobs_.size() * sizeof(uint32_t)));
  for (size_t i = 0; i < group.jobs_.size(); ++i) {
    group.jobs_[i].amax = group.amax_.as<uint32_t>() + i;
  }
  const std::vector<BlockScaledJob>& jobs = group.jobs_;
  WS_ASSIGN_OR_RETURN(
      group.quantize_launch_,
      detail::PrepareGroupLaunch(KernelId::kQuantizeBlockScaled, jobs.data(), jobs.size(),
                                 sizeof(BlockScaledJob), (units + kThreads - 1) / kThreads, stream,
                                 &group.table_));
  group.quantize_launch_.args().Set(BlockScaledGroupArgs::kUnits, units);
  if (group.has_nvfp4_) {
    // The same table (uploaded once, above); only the grid and the work count differ.
    int per_sm = 0;
    WS_CUDA_RETURN_IF_ERROR(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, &BlockScaledAmaxKernel, kThreads, 0),
        "occupancy of ", Kernel(KernelId::kBlockScaledAmax).name);
    WS_ASSIGN_OR_RETURN(uint32_t grid, detail::GridFor(amax_units, kThreads, std::max(per_sm, 1)));
    WS_ASSIGN_OR_RETURN(group.amax_launch_,
                        detail::Make(KernelId::kBlockScaledAmax, grid, kThreads, stream));
    group.amax_launch_.args().Set(BlockScaledGroupArgs::kJobs, group.table_.data());
    group.amax_launch_.args().Set(BlockScaledGroupArgs::kCount, uint32_t(jobs.size()));
    group.amax_launch_.args().Set(BlockScaledGroupArgs::kUnits, amax_units);
  }
  group.units_ = units;
  return Result<PreparedBlockScaledGroup>(std::move(group));
}

Status PreparedBlockScaledGroup::Launch() {
  if (jobs_.empty()) return Status::Ok();
  if (has_nvfp4_) {
    WS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(amax_.data(), 0, amax_.size(),
                                            static_cast<cudaStream_t>(quantize_launch_.stream())),
                            "zeroing the amax words of ", jobs_.size(), " block-scaled tensor(s)");
    WS_RETURN_IF_ERROR(amax_launch_.Launch());
  }
  return quantize_launch_.Launch();
}

}  // namespace weightsync::cuda
