// Shared pieces of the weightsync Python binding. The binding only translates (STYLE §10):
// Python objects → TensorView/options, Status → typed exceptions, TensorView → NumPy views.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "weightsync/weightsync.h"

namespace weightsync::python {

namespace nb = nanobind;

// The C++ options' defaults: the Python constructors' keyword defaults are these values, and
// _option_defaults() reports them for the test that the documented signatures say the same.
inline const PublisherOptions kPublisherDefaults{};
inline const SubscriberOptions kSubscriberDefaults{};
inline double Seconds(std::chrono::milliseconds ms) {
  return static_cast<double>(ms.count()) / 1e3;
}
inline const char* ModeName(UpdateMode mode) {
  return mode == UpdateMode::kStaged ? "staged" : "in_place";
}
inline const char* PolicyName(MatchPolicy policy) {
  return policy == MatchPolicy::kStrict ? "strict" : "subset";
}
inline const char* LineagePolicyName(LineagePolicy policy) {
  return policy == LineagePolicy::kFollow ? "follow" : "strict";
}
inline const char* DeltaModeName(DeltaMode mode) {
  return mode == DeltaMode::kAuto ? "auto" : mode == DeltaMode::kOff ? "off" : "always";
}

// A non-OK Status on its way to Python. Thrown where the GIL may be released; the translator
// registered by RegisterErrorTranslator() turns it into the class _errors.BY_CODE names.
class StatusError : public std::exception {
 public:
  explicit StatusError(Status status) : status_(std::move(status)) {}
  const char* what() const noexcept override { return status_.message().c_str(); }
  const Status& status() const { return status_; }

 private:
  Status status_;
};

inline void ThrowIfError(const Status& status) {
  if (!status.ok()) throw StatusError(status);
}
template <typename T>
T ThrowIfError(Result<T> result) {
  if (!result.ok()) throw StatusError(result.status());
  return std::move(result).value();
}

// errors.cc: installs the one Status → exception translation.
void RegisterErrorTranslator();

// ---- tensors.cc -------------------------------------------------------------------------------

// An input tensor as the C++ API wants it, plus the DLPack import that keeps its memory alive for
// as long as the Publisher/Subscriber holds the view.
struct ImportedTensor {
  NamedTensor tensor;
  nb::ndarray<> keep;
};

// Converts `tensors` (a mapping name → tensor, or an iterable of (name, tensor) pairs; a tensor
// is any DLPack producer on the CPU or a CUDA device, or a NumPy array) into views. `dtypes`
// (mapping name → dtype or None) overrides the element type of raw-bits tensors. `writable`:
// destinations must accept writes. Never copies: a tensor that is not C-contiguous, or on a
// device weightsync does not move, is an InvalidArgument; a CUDA tensor where this module cannot
// use CUDA is Unavailable, saying why (RequireCudaDevice).
std::vector<ImportedTensor> ImportTensors(nb::handle tensors, nb::handle dtypes, bool writable);

// regions.cc: `regions` (None, or a mapping name → a region part or a list of them; a part is any
// object, or a dict, with tensor, global_shape, offset and optionally extent and at, e.g.
// weightsync.regions.Region) set on the named tensors of this call; a name not among them is an
// InvalidArgument.
void ApplyRegions(nb::handle regions, std::vector<ImportedTensor>* tensors);

// quantization.cc: `quantization` (None, or a mapping name → 'mxfp8' / 'nvfp4', or a dict with
// format, scale_layout ('row_major' / 'swizzled_128x4'), scales and global_scale names) set on the
// named destinations of this call; a name not among them, an unknown format, layout or key is an
// InvalidArgument.
void ApplyQuantization(nb::handle quantization, std::vector<ImportedTensor>* tensors);

// Text in: a str that has a UTF-8 encoding. `what` names the argument ("tensor name", "endpoint").
// Not a str: TypeError; a str with lone surrogates (no UTF-8 encoding): InvalidArgument.
std::string Utf8Arg(nb::handle text, const char* what);

// For register(..., regions=/quantization=): `mapping` (None, or a mapping name → value) walked
// once; each value read by `parse(value, name)` (its errors first), then `set(tensor, parsed)` on
// each tensor of this call with that name. `what` names the
// argument in errors ("regions"), `expected` says what it takes; a key that is not a str is a
// TypeError, a name not among `tensors` an InvalidArgument listing all of them.
template <typename Parse, typename Set>
void ApplyByName(nb::handle mapping, const char* what, const char* expected,
                 std::vector<ImportedTensor>* tensors, Parse parse, Set set) {
  if (mapping.is_none()) return;
  if (!nb::hasattr(mapping, "items")) {
    throw nb::type_error((std::string(what) + ": expected " + expected).c_str());
  }
  std::string unknown;
  for (nb::handle item : mapping.attr("items")()) {
    nb::object key = item[0];
    if (!nb::isinstance<nb::str>(key)) {
      throw nb::type_error((std::string(what) + ": keys must be tensor names").c_str());
    }
    const std::string name = Utf8Arg(key, "tensor name");
    const auto parsed = parse(nb::handle(item[1]), name);
    bool found = false;
    for (ImportedTensor& t : *tensors) {
      if (t.tensor.name != name) continue;
      set(t.tensor, parsed);
      found = true;
    }
    if (!found) unknown += (unknown.empty() ? "'" : ", '") + name + "'";
  }
  if (!unknown.empty()) {
    throw StatusError(Status::InvalidArgument(what, " names tensors not in this call: ", unknown));
  }
}
// Text out: UTF-8 from C++ (names, lineages from a peer); bytes that are not UTF-8 come back as
// surrogate escapes, as os.fsdecode() does, instead of failing the whole call.
nb::str Utf8Out(std::string_view text);

// A dtype argument: a name ("bfloat16", "bf16"), a NumPy dtype or scalar type, an ml_dtypes type.
DType DTypeArg(nb::handle dtype);
// An int or a sequence of ints (anything with __index__); each must fit in int64 (InvalidArgument
// otherwise, naming it), a non-integer is a TypeError. Range rules are the C++ library's.
std::vector<int64_t> ShapeArg(nb::handle shape);

// What allocate() returns its tensors as (its `framework` argument).
enum class Framework {
  kNumpy,   // numpy.ndarray ("numpy"); CPU memory only
  kTorch,   // torch.Tensor, through torch.utils.dlpack.from_dlpack ("torch")
  kCupy,    // cupy.ndarray, through cupy.from_dlpack ("cupy")
  kDLPack,  // an object with __dlpack__/__dlpack_device__ (and, on the CPU, the buffer protocol)
};
Framework FrameworkArg(nb::handle framework);

// A device argument: None or 'cpu' → the CPU; 'cuda' (= 'cuda:0'), 'cuda:N', an int N or anything
// whose str() is one of those (torch.device) → CUDA device N. Anything else: InvalidArgument.
Device DeviceArg(nb::handle device);
// Returns if `device` is the CPU, or a CUDA device this module can use. Otherwise raises
// Unavailable (no usable CUDA: the reason CudaStatus() gives, e.g. "built without CUDA", "no CUDA
// device: ...") or InvalidArgument (an index past CudaDeviceCount()), naming `what` and `device`.
void RequireCudaDevice(const Device& device, const std::string& what);

// A view over `data` (`dtype`, `shape`) on `device` in `framework`'s type, whose base keeps
// `owner` alive; no copy. For NumPy, element types it lacks come back as ml_dtypes arrays when
// ml_dtypes is installed, else as raw bits (uint16 for bfloat16, uint8 for float8), and CuPy
// always gets those raw bits; torch and DLPack get their DLPack codes (bfloat16 4, float8_e4m3fn
// 10, float8_e5m2 12, float8_e8m0fnu 14). tfloat32 comes back as float32; float4_e2m1fn as the
// packed uint8 bytes. CUDA memory in NumPy, and host memory in CuPy, is an InvalidArgument.
nb::object ArrayView(void* data, DType dtype, const std::vector<int64_t>& shape, nb::handle owner,
                     Framework framework = Framework::kNumpy, const Device& device = Device{});

// allocate(name, dtype, shape, framework, device=CUDA device) on either side: zero-filled
// weightsync::DeviceMemory (at least 1 byte) on `device` and a `framework` view of it, whose base
// is `owner`, the capsule that frees the memory when it goes. Refuses framework 'numpy' and devices
// this module cannot use (RequireCudaDevice) before allocating anything.
struct DeviceTensor {
  void* data = nullptr;
  nb::object owner;
  nb::object view;
};
DeviceTensor AllocateDeviceTensor(const std::string& name, DType dtype,
                                  const std::vector<int64_t>& shape, Framework framework,
                                  const Device& device);

// A non-null, aligned address no view built over it ever reads: for building a view before the
// memory it will describe exists (Publisher.allocate()).
void* PlaceholderAddress();

// A manifest as Python sees it: [(name, dtype name, shape tuple), ...] in manifest order.
nb::list ManifestList(const Manifest& manifest);

// The raw storage of `dtype` elements in a type NumPy has (its name is the DTypeName), and the
// raw array's shape.
std::pair<DType, std::vector<int64_t>> RawLayout(DType dtype, const std::vector<int64_t>& shape);

// ---- options -----------------------------------------------------------------------------------
std::chrono::milliseconds TimeoutArg(double seconds, const char* what);

// ---- bindings ----------------------------------------------------------------------------------
void BindPublisher(nb::module_& m);
void BindSubscriber(nb::module_& m);

}  // namespace weightsync::python
