#include "plan/block_scaled_plan.h"

#include <string>

#include "cuda/block_scaled_format.h"

namespace weightsync::plan {
namespace {

cuda::BlockFormat FormatOf(Transform t) {
  return t == Transform::kQuantizeMxfp8 ? cuda::BlockFormat::kMxfp8 : cuda::BlockFormat::kNvfp4;
}

const char* FormatName(Transform t) { return t == Transform::kQuantizeMxfp8 ? "MXFP8" : "NVFP4"; }

// The registered auxiliary tensor `name` (a scale), or InvalidArgument saying what it must be.
Result<uint32_t> Auxiliary(const std::unordered_map<std::string_view, uint32_t>& by_name,
                           const std::string& name, const char* what, const std::string& wanted) {
  auto it = by_name.find(name);
  if (it == by_name.end()) {
    return Status::InvalidArgument(what, " needs a destination '", name, "' (", wanted,
                                   "); none is registered");
  }
  return it->second;
}

}  // namespace

cuda::ScaleLayout ScaleLayoutOf(Quantization::ScaleLayout layout) {
  return layout == Quantization::ScaleLayout::kRowMajor ? cuda::ScaleLayout::kRowMajor
                                                        : cuda::ScaleLayout::kSwizzled128x4;
}

Transform BlockScaledTransform(const Quantization& quantization) {
  switch (quantization.format) {
    case Quantization::Format::kMxfp8:
      return Transform::kQuantizeMxfp8;
    case Quantization::Format::kNvfp4:
      return Transform::kQuantizeNvfp4;
    case Quantization::Format::kNone:
      break;
  }
  return Transform::kCopy;
}

Status PlanBlockScaled(const TensorSpec& src, const std::vector<Destination>& destinations,
                       const std::unordered_map<std::string_view, uint32_t>& by_name,
                       const ConvertOptions& convert, PlannedTensor* t) {
  const Destination& dst = destinations[t->destination];
  const Quantization& q = dst.quantization;
  const char* format = FormatName(t->transform);
  const bool mx = t->transform == Transform::kQuantizeMxfp8;
  const DType values = mx ? DType::kFloat8E4M3FN : DType::kFloat4E2M1FN;
  if ((src.dtype != DType::kBFloat16 && src.dtype != DType::kFloat32) || dst.spec.dtype != values) {
    return Status::InvalidArgument(format, " quantizes bfloat16 or float32 into ",
                                   DTypeName(values), "; the publisher has ", DTypeName(src.dtype),
                                   ", the destination ", DTypeName(dst.spec.dtype));
  }
  t->cols = src.shape.empty() ? 1 : src.shape.back();
  t->rows = 1;
  for (size_t i = 0; i + 1 < src.shape.size(); ++i) t->rows *= src.shape[i];
  if (!mx && t->cols % 2 != 0) {
    return Status::InvalidArgument("NVFP4 packs two elements of a row per byte; rows of ", t->cols,
                                   " elements (odd) do not fill whole bytes");
  }
  t->scale_layout = q.scale_layout;
  const cuda::ScaleLayout layout = ScaleLayoutOf(q.scale_layout);
  const cuda::ScaleShape shape =
      cuda::ScaleShapeFor(FormatOf(t->transform), layout, t->rows, t->cols);
  const DType scale_dtype = mx ? DType::kFloat8E8M0FNU : DType::kFloat8E4M3FN;
  const std::string layout_name =
      layout == cuda::ScaleLayout::kRowMajor ? "row-major" : "swizzled 128x4";
  const std::string wanted = std::string(DTypeName(scale_dtype)) + " or uint8, " +
                             ShapeString({shape.rows, shape.cols}) + " (" + layout_name + ")";
  const std::string scale_name = q.scales.empty() ? src.name + convert.scale_suffix : q.scales;
  WS_ASSIGN_OR_RETURN(t->scale_destination,
                      Auxiliary(by_name, scale_name, format, "its scales: " + wanted));
  if (q.scale_layout == Quantization::ScaleLayout::kSwizzled128x4 && src.shape.size() > 2) {
    // Engines pad each leading index's rows separately (an MoE [E, N, K] is E swizzled [N, K/b]
    // matrices); flattening them into one would put every scale of a later expert elsewhere.
    return Status::InvalidArgument(
        format, " with swizzled scales of a tensor of ", src.shape.size(),
        " dimensions is not supported yet (engines swizzle each leading index's matrix on its "
        "own); register 2-D tensors or use row-major scales");
  }
  const TensorSpec& scale = destinations[t->scale_destination].spec;
  const bool shape_fits =
      scale.nbytes == static_cast<uint64_t>(shape.bytes()) &&
      (scale.shape.size() == 1 || (scale.shape.size() >= 2 && scale.shape.back() == shape.cols));
  if ((scale.dtype != scale_dtype && scale.dtype != DType::kUInt8) || !shape_fits) {
    return Status::InvalidArgument(format, " scale destination '", scale_name, "' is ",
                                   DTypeName(scale.dtype), " ", ShapeString(scale.shape), "; ",
                                   ShapeString({t->rows, t->cols}), " needs ", wanted);
  }
  if (mx) return Status::Ok();
  const std::string global_name = q.global_scale.empty() ? src.name + "_scale_2" : q.global_scale;
  WS_ASSIGN_OR_RETURN(t->global_scale_destination,
                      Auxiliary(by_name, global_name, format, "its global scale: float32, [1]"));
  const TensorSpec& global = destinations[t->global_scale_destination].spec;
  if (global.dtype != DType::kFloat32 || global.nbytes != 4) {
    return Status::InvalidArgument("NVFP4 global scale destination '", global_name, "' is ",
                                   DTypeName(global.dtype), " ", ShapeString(global.shape),
                                   "; one float32 expected");
  }
  return Status::Ok();
}

}  // namespace weightsync::plan
