// The one Status → Python exception mapping. The classes live in weightsync/_errors.py (so they
// can multiply-inherit from built-ins); this file only looks them up by StatusCodeName.
#include <new>
#include <string>
#include <typeinfo>

#include "binding.h"

namespace weightsync::python {
namespace {

// Looked up on the first error, not at import: the module imports without the package around it
// (stub generation imports it as a top-level module).
PyObject* ErrorClass(StatusCode code) {
  // Process lifetime on purpose: exception classes outlive every binding object.
  static PyObject* by_code = nullptr;
  static PyObject* base = nullptr;
  if (by_code == nullptr) {
    try {
      nb::module_ errors = nb::module_::import_("weightsync._errors");
      by_code = errors.attr("BY_CODE").inc_ref().ptr();
      base = errors.attr("Error").inc_ref().ptr();
    } catch (const nb::python_error&) {
      PyErr_Clear();
      return PyExc_RuntimeError;  // only without the package (the module alone, stubgen)
    }
  }
  std::string_view name = StatusCodeName(code);
  nb::str key(name.data(), name.size());
  PyObject* cls = PyDict_GetItem(by_code, key.ptr());  // borrowed
  return cls != nullptr ? cls : base;
}

}  // namespace

void RegisterErrorTranslator() {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      PyErr_SetString(ErrorClass(e.status().code()), e.status().message().c_str());
    } catch (const nb::builtin_exception&) {
      throw;  // TypeError, ValueError, ...: nanobind's own translator
    } catch (const nb::python_error&) {
      throw;
    } catch (const std::bad_alloc&) {
      throw;  // MemoryError
    } catch (const std::exception& e) {
      // No bare C++ exception reaches Python (a failed nb::cast is a std::bad_cast): every
      // argument is converted with a message of its own, so one that gets here is a bug.
      PyErr_Format(ErrorClass(StatusCode::kInternal),
                   "weightsync binding: unexpected C++ exception %s: %s (a bug in weightsync; "
                   "please report it)",
                   typeid(e).name(), e.what());
    }
  });
}

}  // namespace weightsync::python
