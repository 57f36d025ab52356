// Planning a destination that holds block-scaled weights (Quantization: MXFP8, NVFP4): the
// dtypes each format takes, the scale tensors it writes and their shapes in the layout the
// destination names. Called by BuildPlan for every destination whose quantization is set.
#pragma once

#include <string_view>
#include <unordered_map>
#include <vector>

#include "cuda/block_scaled_format.h"
#include "plan/plan.h"

namespace weightsync::plan {

// The scale layout a destination names, as the references and kernels take it.
cuda::ScaleLayout ScaleLayoutOf(Quantization::ScaleLayout layout);

// kQuantizeMxfp8 or kQuantizeNvfp4 for a destination's quantization; kCopy for kNone.
Transform BlockScaledTransform(const Quantization& quantization);

// Fills t's conversion fields (rows, cols, the scale and global scale destinations, the layout)
// for the published `src` into destination `t->destination`, whose quantization is set and whose
// shape equals src's (checked by the caller). InvalidArgument completes "tensor 'NAME': " and
// names every problem: the dtypes, an odd row for NVFP4, a missing or wrong scale tensor.
Status PlanBlockScaled(const TensorSpec& src, const std::vector<Destination>& destinations,
                       const std::unordered_map<std::string_view, uint32_t>& by_name,
                       const ConvertOptions& convert, PlannedTensor* t);

}  // namespace weightsync::plan
