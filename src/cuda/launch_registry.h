// What the GPU data plane has ready: the scalar argument types a prepared launch can carry, the
// kernels it can prepare (kernel_table.h) and how many prepared launches are live. Whoever
// prepares a transfer handle calls LogPreparedLaunchesReady() once the handle is built; the line
// is the startup report the design asks for:
//   weightsync I cuda: prepared launches ready: 18 scalar types, 37 launches (13 kernels)
// Host code, no CUDA headers; works the same in a CPU-only build.
#pragma once

#include <cstdint>

namespace weightsync::cuda {

// Scalar element types an ArgPack can carry, counted by laying each DType out in a pack and
// checking its size and alignment (18 when all is well).
int ReadyScalarTypeCount();

// Kernels that a prepared launch can run (the rows of kernel_table.h).
int ReadyKernelCount();

// PreparedLaunch objects alive in this process.
int64_t LivePreparedLaunches();

// Logs the line above at INFO under component "cuda" and returns the launch count it reported.
int64_t LogPreparedLaunchesReady();

namespace internal {
void CountPreparedLaunch(int delta);  // PreparedLaunch's constructor/destructor only
}  // namespace internal

}  // namespace weightsync::cuda
