// PreparedLaunch::Launch with CUDA (WS_WITH_CUDA=1): the per-step hot path.
#include <cuda_runtime_api.h>

#include "cuda/cuda_check.h"
#include "cuda/prepared_launch.h"

namespace weightsync::cuda {

Status PreparedLaunch::Launch() {
  if (function_ == nullptr) [[unlikely]] {
    return Status::FailedPrecondition("launch of an unprepared kernel");
  }
  // The pack's kernelParams array is built once; cudaLaunchKernel copies the values it points at
  // when the launch is enqueued, so the pack may be rewritten right after this returns.
  WS_CUDA_RETURN_IF_ERROR(
      cudaLaunchKernel(function_, dim3(grid_.x, grid_.y, grid_.z),
                       dim3(block_.x, block_.y, block_.z), args_.kernel_params(), shared_bytes_,
                       static_cast<cudaStream_t>(stream_)),
      "launching ", name_);
  return Status::Ok();
}

}  // namespace weightsync::cuda
