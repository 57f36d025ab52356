// register(..., quantization=...): the block-scaled format a subscriber's destination holds
// (docs/quantized.md). Translation only: the library's plan checks dtypes, shapes and scales.
#include <string>
#include <vector>

#include "binding.h"

namespace weightsync::python {
namespace {

Quantization::Format FormatArg(const std::string& text, const std::string& tensor) {
  if (text == "mxfp8") return Quantization::Format::kMxfp8;
  if (text == "nvfp4") return Quantization::Format::kNvfp4;
  throw StatusError(Status::InvalidArgument("quantization['", tensor, "']: format '", text,
                                            "': expected 'mxfp8' or 'nvfp4'"));
}

Quantization::ScaleLayout LayoutArg(const std::string& text, const std::string& tensor) {
  if (text == "row_major") return Quantization::ScaleLayout::kRowMajor;
  if (text == "swizzled_128x4") return Quantization::ScaleLayout::kSwizzled128x4;
  throw StatusError(Status::InvalidArgument("quantization['", tensor, "']: scale_layout '", text,
                                            "': expected 'row_major' or 'swizzled_128x4'"));
}

// A str (the format) or a dict {format, scale_layout, scales, global_scale}.
Quantization QuantizationArg(nb::handle value, const std::string& tensor) {
  Quantization q;
  if (nb::isinstance<nb::str>(value)) {
    q.format = FormatArg(Utf8Arg(value, "quantization format"), tensor);
    return q;
  }
  if (!PyDict_Check(value.ptr())) {
    throw nb::type_error(
        ("quantization['" + tensor + "']: expected 'mxfp8', 'nvfp4' or a dict with 'format'")
            .c_str());
  }
  for (nb::handle key : nb::borrow<nb::dict>(value).keys()) {
    const std::string k = Utf8Arg(key, "quantization key");
    if (k != "format" && k != "scale_layout" && k != "scales" && k != "global_scale") {
      throw StatusError(Status::InvalidArgument("quantization['", tensor, "']: unknown key '", k,
                                                "' (format, scale_layout, scales, global_scale)"));
    }
  }
  nb::dict d = nb::borrow<nb::dict>(value);
  if (!d.contains("format")) {
    throw nb::type_error(("quantization['" + tensor + "']: needs 'format'").c_str());
  }
  q.format = FormatArg(Utf8Arg(d["format"], "quantization format"), tensor);
  if (d.contains("scale_layout")) {
    q.scale_layout = LayoutArg(Utf8Arg(d["scale_layout"], "scale layout"), tensor);
  }
  if (d.contains("scales")) q.scales = Utf8Arg(d["scales"], "scale tensor name");
  if (d.contains("global_scale")) {
    q.global_scale = Utf8Arg(d["global_scale"], "global scale tensor name");
  }
  return q;
}

}  // namespace

void ApplyQuantization(nb::handle quantization, std::vector<ImportedTensor>* tensors) {
  ApplyByName(quantization, "quantization", "a mapping name → format or dict", tensors,
              QuantizationArg, [](NamedTensor& t, const Quantization& q) { t.quantization = q; });
}

}  // namespace weightsync::python
