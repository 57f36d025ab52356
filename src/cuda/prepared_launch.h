// PreparedLaunch: everything one kernel launch needs, built once at plan time — the kernel, its
// grid, block, dynamic shared memory, stream and its typed arguments (ArgPack). Launch() is the
// hot path: one cudaLaunchKernel with the pack's kernelParams array, no allocation, no lookup.
// A step changes what differs between launches in place (args().Set(i, v), set_stream()).
//
// Created by the Prepare* functions of kernels.h, which size the grid and check the kernel's
// signature; Create() is the general form. Host code, no CUDA headers.
//
// Every live PreparedLaunch is counted (LivePreparedLaunches(), the startup log line).
// Thread safety: none; one launch site owns a prepared launch.
#pragma once

#include <cstdint>
#include <string_view>

#include "cuda/arg_pack.h"
#include "cuda/device.h"
#include "cuda/kernel_table.h"
#include "weightsync/status.h"

namespace weightsync::cuda {

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
};

class PreparedLaunch {
 public:
  PreparedLaunch() = default;
  // `function` is the address of the __global__ function that `kernel` describes (its host stub,
  // as cudaLaunchKernel takes it). The arguments start as zero bytes. InvalidArgument for a null
  // function or an empty grid/block dimension.
  static Result<PreparedLaunch> Create(const KernelInfo& kernel, const void* function, Dim3 grid,
                                       Dim3 block, uint32_t shared_bytes, StreamHandle stream);

  PreparedLaunch(PreparedLaunch&& o) noexcept { *this = std::move(o); }
  PreparedLaunch& operator=(PreparedLaunch&& o) noexcept;
  PreparedLaunch(const PreparedLaunch&) = delete;
  PreparedLaunch& operator=(const PreparedLaunch&) = delete;
  ~PreparedLaunch();

  // Enqueues the kernel on the stream. Returns at once (the kernel runs asynchronously); errors
  // are those cudaLaunchKernel reports, converted with the kernel's name. Allocates nothing when
  // it succeeds. Unavailable in a build without CUDA.
  Status Launch();

  ArgPack& args() { return args_; }
  const ArgPack& args() const { return args_; }
  std::string_view name() const { return name_; }
  KernelId kernel() const { return kernel_; }
  bool valid() const { return function_ != nullptr; }
  Dim3 grid() const { return grid_; }
  Dim3 block() const { return block_; }
  uint32_t shared_bytes() const { return shared_bytes_; }
  StreamHandle stream() const { return stream_; }
  void set_stream(StreamHandle stream) { stream_ = stream; }

 private:
  const void* function_ = nullptr;
  Dim3 grid_;
  Dim3 block_;
  uint32_t shared_bytes_ = 0;
  StreamHandle stream_ = nullptr;
  KernelId kernel_ = KernelId::kCount;
  std::string_view name_;
  ArgPack args_;
};

}  // namespace weightsync::cuda
