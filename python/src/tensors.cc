// Tensors in and out: DLPack/NumPy objects on the CPU or a CUDA device → NamedTensor views (never
// a copy), and arena, subscriber-owned or device memory → views that keep their owner alive.
#include <cmath>
#include <cstddef>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>

#include "binding.h"

namespace weightsync::python {
namespace {

// Any device: the device type is checked after the import, so a refusal can say what is wrong.
using ContigArray = nb::ndarray<nb::c_contig>;
using ContigArrayRo = nb::ndarray<nb::ro, nb::c_contig>;
using AnyArrayRo = nb::ndarray<nb::ro>;

// DLPack device types (dlpack.h DLDeviceType).
constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDA = 2;
constexpr int32_t kDLCUDAHost = 3;  // pinned host memory: host memory to weightsync
constexpr int32_t kDLCUDAManaged = 13;

std::string DLDeviceName(int32_t type) {
  switch (type) {
    case 1:
      return "CPU";
    case 2:
      return "CUDA";
    case 3:
      return "CUDA host (pinned)";
    case 4:
      return "OpenCL";
    case 7:
      return "Vulkan";
    case 8:
      return "Metal";
    case 9:
      return "VPI";
    case 10:
      return "ROCm";
    case 11:
      return "ROCm host";
    case 12:
      return "ext_dev";
    case 13:
      return "CUDA managed";
    case 14:
      return "oneAPI";
    case 15:
      return "WebGPU";
    case 16:
      return "Hexagon";
    case 17:
      return "MAIA";
    default:
      return "unknown";
  }
}

[[noreturn]] void ThrowStatus(Status s) { throw StatusError(std::move(s)); }

nb::module_ Numpy() { return nb::module_::import_("numpy"); }

// ml_dtypes element types NumPy cannot export through DLPack or the buffer protocol; they travel
// as raw bits of the same width.
bool IsMlDtypesBits(std::string_view name) {
  return name == "bfloat16" || name == "float8_e4m3fn" || name == "float8_e5m2" ||
         name == "float8_e8m0fnu";
}

// Any Python object's str() as UTF-8, for messages; never fails.
std::string Text(nb::handle obj) {
  nb::object s = nb::steal(PyObject_Str(obj.ptr()));
  if (!s.is_valid()) {
    PyErr_Clear();
    return "<unprintable>";
  }
  nb::object bytes = nb::steal(PyUnicode_AsEncodedString(s.ptr(), "utf-8", "backslashreplace"));
  if (!bytes.is_valid()) {
    PyErr_Clear();
    return "<unprintable>";
  }
  return std::string(PyBytes_AS_STRING(bytes.ptr()), PyBytes_GET_SIZE(bytes.ptr()));
}
std::string Repr(nb::handle obj) {
  nb::object r = nb::steal(PyObject_Repr(obj.ptr()));
  if (!r.is_valid()) PyErr_Clear();
  return r.is_valid() ? Text(r) : "<unprintable>";
}

std::string TypeName(nb::handle obj) {
  return Text(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr()))).attr("__qualname__"));
}
std::string TypeModule(nb::handle obj) {
  nb::handle type(reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr())));
  return nb::hasattr(type, "__module__") ? Text(type.attr("__module__")) : std::string();
}
// obj.attr is truthy; false when absent or when asking raises (diagnostics never throw).
bool AttrTrue(nb::handle obj, const char* attr) {
  nb::object v = nb::steal(PyObject_GetAttrString(obj.ptr(), attr));
  const int r = v.is_valid() ? PyObject_IsTrue(v.ptr()) : -1;
  if (r < 0) PyErr_Clear();
  return r == 1;
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// The producer's own refusal: calls obj.__dlpack__() (which the import tried, and nanobind
// swallowed) and returns "Type: message" of what it raised, or "" if it did not.
std::string ProducerRefusal(nb::handle obj) {
  if (!nb::hasattr(obj, "__dlpack__")) return "";
  try {
    (void)obj.attr("__dlpack__")();  // an unconsumed capsule releases itself
  } catch (const nb::python_error& e) {
    return TypeName(e.value()) + ": " + Text(e.value());
  }
  return "";
}
std::string Quoted(const std::string& who, const std::string& refusal) {
  return refusal.empty() ? std::string() : " (" + who + "'s __dlpack__: " + refusal + ")";
}

// Complex numbers: not an element type weightsync moves, but their parts are.
std::string ComplexAdvice(const std::string& dtype, int bits) {
  const std::string parts = bits <= 128 ? "x.view(np.float" + std::to_string(bits / 2) + ")"
                                        : "x.astype(np.complex128).view(np.float64)";
  return dtype + " elements are not a weightsync dtype: pass " + parts +
         " (real and imaginary parts interleaved, last dimension doubled) and keep that object";
}

// What is wrong with a NumPy array's element type, or "" when it is one DLPack carries.
std::string NumpyDTypeProblem(nb::handle array) {
  nb::handle dtype = array.attr("dtype");
  const std::string kind = Text(dtype.attr("kind"));
  const std::string str = Text(dtype);
  const long itemsize = PyLong_AsLong(dtype.attr("itemsize").ptr());
  if (itemsize < 0) PyErr_Clear();
  if (kind == "O") {
    return "holds Python objects (dtype object), not numbers: convert it to a numeric array "
           "first (e.g. np.asarray(x, dtype=np.float32))";
  }
  if (kind == "U" || kind == "S") {
    return "holds strings (dtype " + str + "), not numbers: weightsync moves numeric tensors";
  }
  if (kind == "M" || kind == "m") {
    return "holds " + Text(dtype.attr("name")) +
           " values: pass their int64 ticks, x.view(np.int64), and keep that object";
  }
  if (kind == "V") {
    return "is a structured array (dtype " + str +
           "): register each field as its own "
           "contiguous array (np.ascontiguousarray(x['field']))";
  }
  if (kind == "f" && itemsize > 8) {
    return "holds " + Text(dtype.attr("name")) +
           " (np.longdouble, extended precision), which weightsync does not move: convert it "
           "(x.astype(np.float64)) or pass its raw bits with dtypes=";
  }
  if (kind == "c") return ComplexAdvice(Text(dtype.attr("name")), static_cast<int>(itemsize * 8));
  return "";
}

// PyTorch tensors that hold no plain strided CPU data.
std::string TorchProblem(nb::handle t) {
  if (AttrTrue(t, "is_meta")) {
    return "a PyTorch meta tensor has no data (device='meta'): materialize it first (e.g. "
           "module.to_empty(device='cpu'), then load its weights)";
  }
  if (AttrTrue(t, "is_quantized")) {
    return "a quantized PyTorch tensor (" + Text(t.attr("dtype")) +
           "): weightsync moves plain element types; pass x.int_repr() (its integers; send "
           "its scale and zero point separately) or x.dequantize()";
  }
  if (nb::hasattr(t, "layout") && Text(t.attr("layout")) != "torch.strided") {
    return "a sparse PyTorch tensor (layout " + Text(t.attr("layout")) +
           "): weightsync moves dense memory; pass x.to_dense() and keep that object";
  }
  return "";
}

// A JAX array (or tracer). Without importing JAX: if `jax` is not in sys.modules, no object is a
// jax.Array; the type's module covers arrays whose package was imported under another name.
bool IsJaxArray(nb::handle obj) {
  const std::string module = TypeModule(obj);
  if (StartsWith(module, "jax.") || StartsWith(module, "jaxlib")) return true;
  nb::object jax = nb::steal(PyImport_GetModule(nb::str("jax").ptr()));  // no import
  if (!jax.is_valid()) {
    PyErr_Clear();
    return false;
  }
  nb::object array_type = nb::steal(PyObject_GetAttrString(jax.ptr(), "Array"));
  if (!array_type.is_valid()) {
    PyErr_Clear();
    return false;
  }
  const int r = PyObject_IsInstance(obj.ptr(), array_type.ptr());
  if (r < 0) PyErr_Clear();
  return r == 1;
}

// True when `obj.__dlpack_device__()` names a CUDA device (diagnostics only; never throws).
bool OnCudaDevice(nb::handle obj) {
  nb::object method = nb::steal(PyObject_GetAttrString(obj.ptr(), "__dlpack_device__"));
  if (!method.is_valid()) {
    PyErr_Clear();
    return false;
  }
  nb::object device = nb::steal(PyObject_CallNoArgs(method.ptr()));
  if (!device.is_valid() || !PyTuple_Check(device.ptr()) || PyTuple_GET_SIZE(device.ptr()) < 1) {
    PyErr_Clear();
    return false;
  }
  const long type = PyLong_AsLong(PyTuple_GET_ITEM(device.ptr(), 0));
  if (type == -1 && PyErr_Occurred()) PyErr_Clear();
  return type == kDLCUDA;
}

// JAX arrays are immutable: a source registered once never changes, and a destination written in
// place changes a value JAX treats as constant. Both sides refuse them, saying what works.
[[noreturn]] void RefuseJaxArray(const std::string& name, nb::handle obj, bool writable) {
  if (OnCudaDevice(obj)) {
    if (!writable) {
      ThrowStatus(Status::InvalidArgument(
          "tensor '", name,
          "': a JAX array is immutable, so a registered one would never change: every publish() "
          "would copy these same bytes. Publish through a buffer of your own instead: once, "
          "buf = pub.allocate('",
          name,
          "', x.dtype, x.shape, framework='torch', "
          "device='cuda:N'); before each publish(), buf.copy_(torch.from_dlpack(new_x)) (or "
          "the CuPy equivalent). See docs/python.md, \"JAX\""));
    }
    ThrowStatus(Status::InvalidArgument(
        "tensor '", name,
        "': a JAX array is immutable; weightsync would overwrite it in place behind JAX's back "
        "(compiled code and caches assume it never changes). Let the subscriber own the buffer: "
        "view = sub.allocate('",
        name,
        "', dtype, shape, framework='dlpack', device='cuda:N'), "
        "and after each update take a JAX array of it: jnp.array(jax.dlpack.from_dlpack(view)) "
        "copies (safe); jax.dlpack.from_dlpack(view) alone shares the memory, which the next "
        "update overwrites"));
  }
  if (!writable) {
    ThrowStatus(Status::InvalidArgument(
        "tensor '", name,
        "': a JAX array is immutable, so a registered one would never change: every publish() "
        "would copy these same bytes (rebinding `params = new_params` does not reach the "
        "publisher). Publish through the arena instead: once, view = pub.allocate('",
        name,
        "', x.dtype, x.shape); before each publish(), pub.begin_write() and "
        "np.copyto(view, np.asarray(new_x)). See docs/python.md, \"JAX\""));
  }
  ThrowStatus(Status::InvalidArgument(
      "tensor '", name,
      "': a JAX array is immutable; weightsync would overwrite it in place behind JAX's back "
      "(compiled code and caches assume it never changes). Let the subscriber own the buffer: "
      "view = sub.allocate('",
      name,
      "', dtype, shape), and after each update take a JAX array of it: jnp.array(view) copies "
      "(safe); "
      "jax.dlpack.from_dlpack(view) shares the memory, which the next update overwrites"));
}

// Why `obj` was refused, once the strict import failed: a precise message beats "wrong type",
// and the producer's own refusal (Paddle: "... use tensor.detach()") is kept.
[[noreturn]] void ExplainRefusal(const std::string& name, nb::handle obj, bool writable) {
  const std::string tensor = "tensor '" + name + "': ";
  const std::string module = TypeModule(obj);
  if (module == "numpy") {
    if (std::string problem = NumpyDTypeProblem(obj); !problem.empty()) {
      ThrowStatus(Status::InvalidArgument(tensor, problem, Quoted("NumPy", ProducerRefusal(obj))));
    }
  }
  if (StartsWith(module, "torch")) {
    if (std::string problem = TorchProblem(obj); !problem.empty()) {
      ThrowStatus(Status::InvalidArgument(tensor, problem, Quoted("torch", ProducerRefusal(obj))));
    }
  }
  AnyArrayRo any;
  if (!nb::try_cast(obj, any, /*convert=*/false)) {
    if (std::string refusal = ProducerRefusal(obj); !refusal.empty()) {
      ThrowStatus(
          Status::InvalidArgument(tensor, "its __dlpack__() refused the export: ", refusal));
    }
    throw nb::type_error((tensor +
                          "expected a tensor with __dlpack__ (CPU or CUDA) or a NumPy "
                          "array, got " +
                          TypeName(obj))
                             .c_str());
  }
  bool contiguous = true;
  int64_t expected = 1;
  for (int64_t i = static_cast<int64_t>(any.ndim()) - 1; i >= 0; --i) {
    if (any.shape(i) != 1 && any.stride(i) != expected) contiguous = false;
    expected *= static_cast<int64_t>(any.shape(i));
  }
  if (!contiguous) {
    ThrowStatus(Status::InvalidArgument(
        "tensor '", name,
        "': not C-contiguous; weightsync registers memory in place and never "
        "copies (pass np.ascontiguousarray(x) / x.contiguous() and keep that object)"));
  }
  if (writable) {
    ThrowStatus(Status::InvalidArgument("tensor '", name,
                                        "': read-only; a subscriber writes into its tensors"));
  }
  ThrowStatus(Status::InvalidArgument("tensor '", name, "': not importable through DLPack"));
}

// Where an imported tensor's memory is, as the C++ API names it; refuses devices weightsync does
// not move, and CUDA tensors where this module cannot use CUDA (saying why).
Device ImportedDevice(const std::string& name, const nb::ndarray<>& array) {
  const int32_t type = array.device_type();
  if (type == kDLCPU || type == kDLCUDAHost) return Device{};  // pinned host memory is host memory
  if (type == kDLCUDA) {
    Device device{Device::Kind::kCUDA, array.device_id()};
    RequireCudaDevice(device, "tensor '" + name + "'");
    return device;
  }
  if (type == kDLCUDAManaged) {
    ThrowStatus(Status::InvalidArgument(
        "tensor '", name,
        "': in CUDA managed memory (DLPack device type 13), which weightsync "
        "does not move: pass device memory (e.g. torch.empty(..., device='cuda')) or host "
        "memory"));
  }
  ThrowStatus(Status::InvalidArgument("tensor '", name, "': on DLPack device type ", type, " (",
                                      DLDeviceName(type),
                                      "); weightsync moves CPU and CUDA tensors"));
}

template <typename Array>
bool TryImport(nb::handle obj, nb::ndarray<>* out) {
  Array a;
  if (!nb::try_cast(obj, a, /*convert=*/false)) return false;
  *out = nb::ndarray<>(a);
  return true;
}

ImportedTensor ImportOne(const std::string& name, nb::handle obj, std::optional<DType> override,
                         bool writable) {
  if (IsJaxArray(obj)) RefuseJaxArray(name, obj, writable);
  auto import = [&](nb::handle o, nb::ndarray<>* out) {
    return writable ? TryImport<ContigArray>(o, out) : TryImport<ContigArrayRo>(o, out);
  };
  nb::ndarray<> array;
  std::optional<DType> implied;  // from an ml_dtypes element type NumPy cannot export
  nb::object raw;                // the raw-bits view of such an array
  if (!import(obj, &array)) {
    nb::module_ np = Numpy();
    if (nb::isinstance(obj, np.attr("ndarray"))) {
      std::string dt = Text(obj.attr("dtype").attr("name"));
      if (dt == "float4_e2m1fn") {
        ThrowStatus(Status::InvalidArgument(
            "tensor '", name,
            "': ml_dtypes float4_e2m1fn stores one value per byte, weightsync's "
            "float4_e2m1fn packs two per byte: pass the packed uint8 bytes with "
            "dtypes={'",
            name, "': 'float4_e2m1fn'}"));
      }
      if (IsMlDtypesBits(dt)) {
        implied = ThrowIfError(DTypeFromName(dt));
        int bits = Info(*implied).bits;
        raw = obj.attr("view")(bits == 16 ? "uint16" : "uint8");
        if (!import(raw, &array)) ExplainRefusal(name, raw, writable);
      }
    }
    if (!array.is_valid()) ExplainRefusal(name, obj, writable);
  }

  const Device device = ImportedDevice(name, array);
  const nb::dlpack::dtype dt = array.dtype();
  if (dt.lanes != 1) {
    ThrowStatus(Status::InvalidArgument("tensor '", name, "': ", int(dt.lanes),
                                        "-lane vector elements are not supported"));
  }
  std::vector<int64_t> shape(array.shape_ptr(), array.shape_ptr() + array.ndim());
  DType dtype;
  if (override || implied) {
    dtype = override ? *override : *implied;
    // Raw bits reinterpreted: the last dimension scales with the element width (four uint8
    // bytes hold eight float4_e2m1fn values).
    const int bits = Info(dtype).bits;
    if (bits != dt.bits) {
      const int64_t last = shape.empty() ? 0 : shape.back();
      if (shape.empty() || (last * dt.bits) % bits != 0) {
        ThrowStatus(Status::InvalidArgument(
            "tensor '", name, "': ", int(dt.bits), "-bit elements of shape ", ShapeString(shape),
            " cannot be read as ", DTypeName(dtype), " (", bits,
            " bits): the last dimension's bytes must hold whole elements"));
      }
      shape.back() = last * dt.bits / bits;
    }
  } else {
    Result<DType> r = DTypeFromDLPack(dt.code, dt.bits);
    if (!r.ok() && dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Complex)) {
      ThrowStatus(Status::InvalidArgument(
          "tensor '", name, "': ", ComplexAdvice("complex" + std::to_string(dt.bits), dt.bits)));
    }
    if (!r.ok()) {
      ThrowStatus(Status::InvalidArgument(
          "tensor '", name, "': ", r.status().message(),
          "; pass its raw bits (e.g. .view(np.uint16)) with dtypes={'", name, "': '<dtype>'}"));
    }
    dtype = *r;
  }
  ImportedTensor out;
  out.tensor.name = name;
  out.tensor.view = TensorView{array.data(), dtype, std::move(shape), device};
  out.keep = std::move(array);
  return out;
}

}  // namespace

nb::list ManifestList(const Manifest& manifest) {
  // weightsync._manifest.PublishedTensor: the (name, dtype, shape) tuple, with alias_of.
  nb::object entry = nb::module_::import_("weightsync._manifest").attr("PublishedTensor");
  nb::list out;
  for (const TensorSpec& s : manifest.tensors()) {
    nb::list shape;
    for (int64_t d : s.shape) shape.append(d);
    std::string_view dt = DTypeName(s.dtype);
    out.append(
        entry(Utf8Out(s.name), nb::str(dt.data(), dt.size()), nb::tuple(shape),
              s.alias_of.empty() ? nb::object(nb::none()) : nb::object(Utf8Out(s.alias_of))));
  }
  return out;
}

std::chrono::milliseconds TimeoutArg(double seconds, const char* what) {
  if (!(seconds > 0) || std::isinf(seconds) || seconds > 1e9) {
    ThrowStatus(Status::InvalidArgument(what, " = ", seconds,
                                        ": must be a positive, finite number of seconds"));
  }
  return std::chrono::milliseconds(std::max<int64_t>(1, std::llround(std::ceil(seconds * 1000))));
}

std::string Utf8Arg(nb::handle text, const char* what) {
  if (!nb::isinstance<nb::str>(text)) {
    throw nb::type_error((std::string(what) + ": expected a str, got " + TypeName(text)).c_str());
  }
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(text.ptr(), &size);
  if (utf8 == nullptr) {
    PyErr_Clear();  // UnicodeEncodeError: lone surrogates, e.g. from errors='surrogateescape'
    ThrowStatus(Status::InvalidArgument(what, " ", Repr(text),
                                        ": not valid UTF-8 (it holds lone surrogates); weightsync "
                                        "names and endpoints are UTF-8 text"));
  }
  return std::string(utf8, static_cast<size_t>(size));
}

nb::str Utf8Out(std::string_view text) {
  PyObject* s =
      PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "surrogateescape");
  if (s == nullptr) throw nb::python_error();  // MemoryError: surrogateescape decodes any bytes
  return nb::steal<nb::str>(s);
}

DType DTypeArg(nb::handle dtype) {
  std::string name;
  if (nb::isinstance<nb::str>(dtype)) {
    name = Utf8Arg(dtype, "dtype");
  } else {
    nb::object np_dtype;
    try {
      np_dtype = Numpy().attr("dtype")(dtype);
    } catch (const nb::python_error&) {
      throw nb::type_error(("dtype: expected a name such as 'bfloat16', a NumPy dtype or an "
                            "ml_dtypes type, got " +
                            TypeName(dtype))
                               .c_str());
    }
    name = Text(np_dtype.attr("name"));
  }
  Result<DType> r = DTypeFromName(name);
  if (!r.ok()) {
    std::ostringstream valid;
    for (int i = 0; i < kDTypeCount; ++i) valid << (i ? ", " : "") << AllDTypes()[i].name;
    ThrowStatus(Status::InvalidArgument("dtype '", name, "' is not one weightsync moves (",
                                        valid.str(), ")"));
  }
  return *r;
}

namespace {

[[noreturn]] void ShapeTypeError(nb::handle got) {
  throw nb::type_error(
      ("shape: expected an int or a sequence of ints, got " + TypeName(got)).c_str());
}

int64_t Dimension(nb::handle d) {
  nb::object index = nb::steal(PyNumber_Index(d.ptr()));
  if (!index.is_valid()) {
    PyErr_Clear();
    ShapeTypeError(d);
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow != 0) {
    ThrowStatus(
        Status::InvalidArgument("shape: dimension ", Text(index), " is out of the int64 range"));
  }
  return v;
}

}  // namespace

std::vector<int64_t> ShapeArg(nb::handle shape) {
  if (PyIndex_Check(shape.ptr())) return {Dimension(shape)};
  if (nb::isinstance<nb::str>(shape) || nb::isinstance<nb::bytes>(shape)) ShapeTypeError(shape);
  nb::object items = nb::steal(PyObject_GetIter(shape.ptr()));
  if (!items.is_valid()) {
    PyErr_Clear();
    ShapeTypeError(shape);
  }
  std::vector<int64_t> out;
  for (nb::handle d : items) out.push_back(Dimension(d));
  return out;
}

std::vector<ImportedTensor> ImportTensors(nb::handle tensors, nb::handle dtypes, bool writable) {
  // Overrides by name; each must name a tensor of this call (a typo is an error, not a no-op).
  std::vector<std::pair<std::string, DType>> overrides;
  std::vector<bool> used;
  if (!dtypes.is_none()) {
    if (!nb::hasattr(dtypes, "items")) {
      throw nb::type_error("dtypes: expected a mapping name → dtype");
    }
    for (nb::handle item : dtypes.attr("items")()) {
      nb::object key = item[0];
      if (!nb::isinstance<nb::str>(key)) throw nb::type_error("dtypes: keys must be tensor names");
      overrides.emplace_back(Utf8Arg(key, "tensor name"), DTypeArg(item[1]));
    }
    used.assign(overrides.size(), false);
  }
  nb::object items = nb::hasattr(tensors, "items") ? tensors.attr("items")() : nb::borrow(tensors);
  std::vector<ImportedTensor> out;
  for (nb::handle item : items) {
    if (!nb::isinstance<nb::tuple>(item) && !nb::isinstance<nb::list>(item)) {
      throw nb::type_error("tensors: expected a mapping name → tensor or (name, tensor) pairs");
    }
    if (nb::len(item) != 2) throw nb::type_error("tensors: each pair must be (name, tensor)");
    nb::object key = item[0];
    if (!nb::isinstance<nb::str>(key)) {
      throw nb::type_error(("tensors: names must be str, got " + TypeName(key)).c_str());
    }
    std::string name = Utf8Arg(key, "tensor name");
    std::optional<DType> override;
    for (size_t i = 0; i < overrides.size(); ++i) {
      if (overrides[i].first == name) {
        override = overrides[i].second;
        used[i] = true;
      }
    }
    out.push_back(ImportOne(name, item[1], override, writable));
  }
  std::string unused;
  for (size_t i = 0; i < overrides.size(); ++i) {
    if (!used[i]) unused += (unused.empty() ? "'" : ", '") + overrides[i].first + "'";
  }
  if (!unused.empty()) {
    ThrowStatus(Status::InvalidArgument("dtypes names tensors not in this call: ", unused));
  }
  return out;
}

std::pair<DType, std::vector<int64_t>> RawLayout(DType dtype, const std::vector<int64_t>& shape) {
  switch (dtype) {
    case DType::kTFloat32:
      return {DType::kFloat32, shape};  // tf32 is stored in float32 bits
    case DType::kBFloat16:
      return {DType::kUInt16, shape};
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
    case DType::kFloat8E8M0FNU:
      return {DType::kUInt8, shape};
    case DType::kFloat4E2M1FN: {
      TensorView v{nullptr, dtype, shape};
      uint64_t bytes = ThrowIfError(v.NumBytes());
      return {DType::kUInt8, {static_cast<int64_t>(bytes)}};
    }
    default:
      return {dtype, shape};  // NumPy has it, under the same name
  }
}

Framework FrameworkArg(nb::handle framework) {
  const std::string name = Utf8Arg(framework, "framework");
  if (name == "numpy") return Framework::kNumpy;
  if (name == "torch") return Framework::kTorch;
  if (name == "cupy") return Framework::kCupy;
  if (name == "dlpack") return Framework::kDLPack;
  ThrowStatus(Status::InvalidArgument("framework '", name,
                                      "': expected 'numpy', 'torch', 'cupy' or 'dlpack'"));
}

Device DeviceArg(nb::handle device) {
  if (device.is_none()) return Device{};
  auto bad = [&](const std::string& text) {
    ThrowStatus(Status::InvalidArgument(
        "device ", text, ": expected None, 'cpu', 'cuda', 'cuda:N' or a torch.device"));
  };
  if (PyIndex_Check(device.ptr()) && !PyBool_Check(device.ptr())) {
    const long long index = PyLong_AsLongLong(device.ptr());
    if (index == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      bad(Repr(device));
    }
    if (index < 0 || index > std::numeric_limits<int>::max()) bad(Repr(device));
    return Device{Device::Kind::kCUDA, static_cast<int>(index)};
  }
  // str, or anything whose str() is one (torch.device('cuda:1') -> 'cuda:1').
  const std::string text =
      nb::isinstance<nb::str>(device) ? Utf8Arg(device, "device") : Text(device);
  if (text == "cpu") return Device{};
  if (text == "cuda") return Device{Device::Kind::kCUDA, 0};
  if (StartsWith(text, "cuda:") && text.size() > 5 && text.size() <= 14) {
    int64_t index = 0;
    for (char c : text.substr(5)) {
      if (c < '0' || c > '9') bad("'" + text + "'");
      index = index * 10 + (c - '0');
    }
    if (index > std::numeric_limits<int>::max()) bad("'" + text + "'");
    return Device{Device::Kind::kCUDA, static_cast<int>(index)};
  }
  bad("'" + text + "'");
  return Device{};
}

void RequireCudaDevice(const Device& device, const std::string& what) {
  if (!device.is_cuda()) return;
  if (Status s = CudaStatus(); !s.ok()) {
    ThrowStatus(Status::Unavailable(what, " is on ", DeviceString(device),
                                    ", but this weightsync module cannot use CUDA: ", s.message(),
                                    " (weightsync.cuda_status())"));
  }
  if (device.index >= CudaDeviceCount()) {
    ThrowStatus(Status::InvalidArgument(what, " is on ", DeviceString(device), ", but ",
                                        CudaDeviceCount(),
                                        " CUDA device(s) are visible to this process"));
  }
}

namespace {

// Owner of device memory behind allocate()d views: freed when the last view and the
// Publisher/Subscriber that registered it are gone.
void FreeDeviceMemory(void* p) noexcept {
  auto* memory = static_cast<DeviceMemory*>(p);
  Status s = memory->Close();
  if (!s.ok()) {
    PySys_WriteStderr("weightsync: freeing %llu bytes of device memory: %s\n",
                      static_cast<unsigned long long>(memory->size()), s.ToString().c_str());
  }
  delete memory;
}

}  // namespace

DeviceTensor AllocateDeviceTensor(const std::string& name, DType dtype,
                                  const std::vector<int64_t>& shape, Framework framework,
                                  const Device& device) {
  if (framework == Framework::kNumpy) {
    ThrowStatus(Status::InvalidArgument("allocate('", name, "', device='", DeviceString(device),
                                        "'): framework='numpy' cannot hold CUDA memory; use "
                                        "framework='torch', 'cupy' or 'dlpack'"));
  }
  RequireCudaDevice(device, "allocate('" + name + "')");
  const uint64_t bytes = ThrowIfError(TensorView{nullptr, dtype, shape}.NumBytes());
  // One byte at least, so that every view has an address of its own.
  Result<DeviceMemory> memory = [&] {
    nb::gil_scoped_release release;
    return DeviceMemory::Allocate(device.index, std::max<uint64_t>(bytes, 1));
  }();
  auto* owned = new DeviceMemory(ThrowIfError(std::move(memory)));
  DeviceTensor out;
  out.data = owned->data();
  out.owner = nb::capsule(owned, &FreeDeviceMemory);  // frees `owned` from here on
  out.view = ArrayView(out.data, dtype, shape, out.owner, framework, device);
  return out;
}

void* PlaceholderAddress() {
  alignas(64) static std::byte placeholder[64];
  return placeholder;
}

nb::object ArrayView(void* data, DType dtype, const std::vector<int64_t>& shape, nb::handle owner,
                     Framework framework, const Device& device) {
  // DLPack consumers get the element type's own code (bfloat16, float8); NumPy and CuPy, which
  // have none of those, get the raw bits (NumPy then an ml_dtypes view). DLPack has no tfloat32
  // (float32 bits), and weightsync's packed float4 travels as its bytes, as for NumPy.
  auto [raw, raw_shape] = RawLayout(dtype, shape);
  // CuPy has no bfloat16/float8 dtypes either: it gets the raw bits, as NumPy without ml_dtypes.
  const bool own_code = framework != Framework::kNumpy && framework != Framework::kCupy &&
                        Info(dtype).dlpack_code != kNoDLPackCode && dtype != DType::kFloat4E2M1FN;
  const DTypeInfo& element = Info(own_code ? dtype : raw);
  const std::vector<int64_t>& dims64 = own_code ? shape : raw_shape;
  const nb::dlpack::dtype dl{element.dlpack_code, element.dlpack_bits, 1};
  std::vector<size_t> dims(dims64.begin(), dims64.end());
  if (framework == Framework::kCupy && !device.is_cuda()) {
    ThrowStatus(Status::InvalidArgument(
        "framework='cupy' holds CUDA memory: pass device='cuda:N' (or 'numpy', 'torch', 'dlpack' "
        "for host memory)"));
  }
  const int device_type = device.is_cuda() ? kDLCUDA : kDLCPU;
  const int device_id = device.is_cuda() ? device.index : 0;
  switch (framework) {
    case Framework::kTorch:
      return nb::ndarray<nb::pytorch>(data, dims.size(), dims.data(), owner, nullptr, dl,
                                      device_type, device_id)
          .cast();
    case Framework::kCupy:
      return nb::ndarray<nb::cupy>(data, dims.size(), dims.data(), owner, nullptr, dl, device_type,
                                   device_id)
          .cast();
    case Framework::kDLPack:
      return nb::ndarray<nb::array_api>(data, dims.size(), dims.data(), owner, nullptr, dl,
                                        device_type, device_id)
          .cast();
    case Framework::kNumpy:
      break;
  }
  if (device.is_cuda()) {
    ThrowStatus(Status::InvalidArgument("framework='numpy' cannot view memory on ",
                                        DeviceString(device),
                                        ": use framework='torch', 'cupy' or 'dlpack'"));
  }
  nb::object array =
      nb::ndarray<nb::numpy>(data, dims.size(), dims.data(), owner, nullptr, dl).cast();
  if (raw != dtype && dtype != DType::kTFloat32 && dtype != DType::kFloat4E2M1FN) {
    try {
      nb::module_ ml = nb::module_::import_("ml_dtypes");
      std::string_view n = DTypeName(dtype);
      nb::str attr(n.data(), n.size());
      if (nb::hasattr(ml, attr)) array = array.attr("view")(ml.attr(attr));
    } catch (const nb::python_error&) {
      // No ml_dtypes: the raw bits are the documented fallback.
    }
  }
  return array;
}

}  // namespace weightsync::python
