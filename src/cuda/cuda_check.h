// CUDA runtime errors become Status where they happen:
//   WS_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes), "allocating ", bytes, " bytes");
// returns e.g. resource_exhausted: "allocating 4096 bytes: cudaErrorMemoryAllocation: out of
// memory (cuda error 2)". Only .cu files include this (it needs the CUDA headers).
#pragma once

#include <cuda_runtime_api.h>

#include <sstream>
#include <string>

#include "weightsync/status.h"

namespace weightsync::cuda {

// The StatusCode a CUDA runtime error maps to: missing driver or device -> Unavailable (the
// capability is not present at run time), out of memory -> ResourceExhausted, bad arguments ->
// InvalidArgument, anything else (a fault in a kernel, a broken context) -> Internal.
inline StatusCode CudaErrorCode(cudaError_t err) {
  switch (err) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorInitializationError:
      return StatusCode::kUnavailable;
    case cudaErrorMemoryAllocation:
      return StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorInvalidDeviceFunction:
      return StatusCode::kInvalidArgument;
    default:
      return StatusCode::kInternal;
  }
}

// "<context...>: <cudaErrorName>: <description> (cuda error N)". Also clears the runtime's
// last-error slot, so a non-sticky error is reported once, here, and not again by a later check.
template <typename... Context>
Status CudaErrorStatus(cudaError_t err, const Context&... context) {
  (void)cudaGetLastError();
  std::ostringstream os;
  (os << ... << context);
  os << ": " << cudaGetErrorName(err) << ": " << cudaGetErrorString(err) << " (cuda error "
     << static_cast<int>(err) << ")";
  return Status(CudaErrorCode(err), os.str());
}

}  // namespace weightsync::cuda

// Evaluates a CUDA runtime call once; on failure returns its Status from the enclosing function
// (a Status or a Result<T>). The context arguments are streamed only on failure.
#define WS_CUDA_RETURN_IF_ERROR(call, ...)                                   \
  do {                                                                       \
    const cudaError_t ws_cuda_err_ = (call);                                 \
    if (ws_cuda_err_ != cudaSuccess) [[unlikely]] {                          \
      return ::weightsync::cuda::CudaErrorStatus(ws_cuda_err_, __VA_ARGS__); \
    }                                                                        \
  } while (0)
