// The copies of a step for the paths whose copy engines move the bytes of every planned tensor as
// published (host-to-gpu, gpu-to-host): per unit of the store's view (a slot, a ring's bucket),
// one batch of every planned tensor's bytes that unit holds, from where the view says they lie
// into received(t) — where the landing receives tensor t. Each destination tensor is one span
// (cuda/copy_batch.h). Prepared once per handle.
#pragma once

#include <vector>

#include "cuda/copy_batch.h"
#include "plan/plan.h"
#include "transport/view/store_view.h"
#include "util/function_ref.h"
#include "wire/messages.h"

namespace weightsync::transport::path {

std::vector<cuda::CopyBatch> UnitCopyBatches(
    const view::StoreView& view, const wire::Welcome& welcome, const plan::Plan& plan,
    util::FunctionRef<uint8_t*(const plan::PlannedTensor&)> received);

}  // namespace weightsync::transport::path
