// The view of a zero-copy publisher's store (store_view.h): its own CUDA allocations, each opened
// once here — a cudaMalloc allocation by its CUDA IPC handle, a run of cuMem chunks (PyTorch's
// expandable segments) imported from the fds that followed the Welcome and mapped back to back.
// The direct region of the Welcome is a virtual range in which every allocation has its place, so
// a tensor's bytes are located by one offset; one unit serves every version (the tensors are the
// version, fenced by the publisher's BeginWrite).
#pragma once

#include <memory>
#include <vector>

#include "transport/view/store_view.h"

namespace weightsync::transport::view {

// `fds`: one per cuMem chunk (link.h), each closed once imported.
Result<std::unique_ptr<StoreView>> OpenZeroCopyAllocations(const wire::Welcome& welcome,
                                                           std::vector<util::UniqueFd>* fds,
                                                           int device);

}  // namespace weightsync::transport::view
