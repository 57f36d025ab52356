// register(..., regions=...): which region of a global tensor each registered tensor is (publisher)
// or which regions fill it (subscriber). Translation only: the library checks the layouts.
#include <string>
#include <vector>

#include "binding.h"

namespace weightsync::python {
namespace {

// A field of a region part: an attribute (weightsync.regions.Region, any object) or a key (a
// dict). Missing: None.
nb::object Field(nb::handle part, const char* name) {
  if (PyDict_Check(part.ptr())) {
    PyObject* value = PyDict_GetItemString(part.ptr(), name);  // borrowed
    return value == nullptr ? nb::none() : nb::borrow(value);
  }
  if (!nb::hasattr(part, name)) return nb::none();
  return part.attr(name);
}

std::vector<int64_t> Dims(nb::handle part, const char* name, const std::string& tensor,
                          bool required) {
  nb::object value = Field(part, name);
  if (value.is_none()) {
    if (required) {
      throw nb::type_error(("regions['" + tensor + "']: a part needs '" + name + "'").c_str());
    }
    return {};
  }
  return ShapeArg(value);
}

RegionPart PartArg(nb::handle part, const std::string& tensor) {
  RegionPart out;
  nb::object global = Field(part, "tensor");
  if (!global.is_none()) out.tensor = Utf8Arg(global, "region tensor name");
  out.global_shape = Dims(part, "global_shape", tensor, true);
  out.offset = Dims(part, "offset", tensor, true);
  out.extent = Dims(part, "extent", tensor, false);
  out.at = Dims(part, "at", tensor, false);
  return out;
}

}  // namespace

void ApplyRegions(nb::handle regions, std::vector<ImportedTensor>* tensors) {
  ApplyByName(
      regions, "regions", "a mapping name → region part or list of parts", tensors,
      [](nb::handle value, const std::string& name) {
        std::vector<RegionPart> parts;
        if (nb::isinstance<nb::list>(value) || nb::isinstance<nb::tuple>(value)) {
          for (nb::handle part : value) parts.push_back(PartArg(part, name));
        } else {
          parts.push_back(PartArg(value, name));
        }
        return parts;
      },
      [](NamedTensor& t, const std::vector<RegionPart>& parts) { t.regions = parts; });
}

}  // namespace weightsync::python
