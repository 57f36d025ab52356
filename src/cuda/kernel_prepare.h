// What the Prepare* functions of the kernel files share (kernels.cu defines it; the files of
// other kernel families, such as block_scaled_kernels.cu, use it): grid sizing, the device
// pointer check, a prepared launch of a KernelId, and a grouped kernel's job table. Internal to
// src/cuda; host code, no CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "cuda/device.h"
#include "cuda/kernel_table.h"
#include "cuda/prepared_launch.h"
#include "weightsync/status.h"

namespace weightsync::cuda::detail {

inline constexpr int kKernelThreads = 256;  // every kernel's block (8 warps)

// The host stub of each kernel, by KernelId (kernels.cu; the block-scaled ones come from
// BlockScaledKernelFunction, block_scaled_kernels.cu).
const void* KernelFunction(KernelId id);
const void* BlockScaledKernelFunction(KernelId id);

// A grid for `work` items of `per_block` each, capped at `waves` blocks per multiprocessor of the
// current device (the kernels loop over the rest); at least one block.
Result<uint32_t> GridFor(uint64_t work, uint64_t per_block, int waves);

// A pointer given at prepare time must be memory the device reaches for `bytes` (none needed for
// 0): InvalidArgument naming `kernel` and `what` otherwise.
Status CheckDevicePointer(std::string_view kernel, std::string_view what, const void* p,
                          uint64_t bytes);

Result<PreparedLaunch> Make(KernelId id, uint32_t grid, uint32_t block, StreamHandle stream);

// A grouped kernel's launch over `count` jobs of `job_bytes` each at `jobs`: the table uploaded
// once into *table (device memory) on `stream`, arguments 0 and 1 set to the table and the count,
// and as many blocks as stay resident at once for `work` items.
Result<PreparedLaunch> PrepareGroupLaunch(KernelId id, const void* jobs, size_t count,
                                          size_t job_bytes, uint64_t work, StreamHandle stream,
                                          DeviceBuffer* table);

}  // namespace weightsync::cuda::detail
