// The host-only half of PreparedLaunch (construction, moves, counting); Launch() is in
// prepared_launch.cu, or in no_cuda.cc for a CPU-only build.
#include "cuda/prepared_launch.h"

#include <utility>

#include "cuda/launch_registry.h"

namespace weightsync::cuda {

Result<PreparedLaunch> PreparedLaunch::Create(const KernelInfo& kernel, const void* function,
                                              Dim3 grid, Dim3 block, uint32_t shared_bytes,
                                              StreamHandle stream) {
  if (function == nullptr) {
    return Status::InvalidArgument(kernel.name, ": no kernel function");
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0) {
    return Status::InvalidArgument(kernel.name, ": empty launch: grid ", grid.x, "x", grid.y, "x",
                                   grid.z, ", block ", block.x, "x", block.y, "x", block.z);
  }
  WS_ASSIGN_OR_RETURN(ArgPack args, ArgPack::Create(kernel.signature, kernel.name));
  PreparedLaunch launch;
  launch.function_ = function;
  launch.grid_ = grid;
  launch.block_ = block;
  launch.shared_bytes_ = shared_bytes;
  launch.stream_ = stream;
  launch.kernel_ = kernel.id;
  launch.name_ = kernel.name;
  launch.args_ = std::move(args);
  internal::CountPreparedLaunch(+1);
  return launch;
}

PreparedLaunch& PreparedLaunch::operator=(PreparedLaunch&& o) noexcept {
  if (this != &o) {
    if (function_ != nullptr) internal::CountPreparedLaunch(-1);
    function_ = std::exchange(o.function_, nullptr);
    grid_ = o.grid_;
    block_ = o.block_;
    shared_bytes_ = o.shared_bytes_;
    stream_ = o.stream_;
    kernel_ = o.kernel_;
    name_ = o.name_;
    args_ = std::move(o.args_);
  }
  return *this;
}

PreparedLaunch::~PreparedLaunch() {
  if (function_ != nullptr) internal::CountPreparedLaunch(-1);
}

}  // namespace weightsync::cuda
