// The weightsync._weightsync extension module. Python users import `weightsync`, which re-exports
// these names next to the exception classes of weightsync/_errors.py.
#include <nanobind/stl/string.h>

#include "binding.h"

namespace weightsync::python {
namespace {

nb::dict LedgerDict() {
  LedgerSnapshot s = ReadLedger();
  nb::dict d;
  d["fds"] = s.fds;
  d["segments"] = s.segments;
  d["mappings"] = s.mappings;
  d["mapped_bytes"] = s.mapped_bytes;
  d["threads"] = s.threads;
  d["staging_bytes"] = s.staging_bytes;
  d["pinned_bytes"] = s.pinned_bytes;
  d["handles"] = s.handles;
  d["connections"] = s.connections;
  d["release_failures"] = s.release_failures;
  return d;
}

nb::list DTypeNames() {
  nb::list out;
  for (int i = 0; i < kDTypeCount; ++i) {
    std::string_view n = AllDTypes()[i].name;
    out.append(nb::str(n.data(), n.size()));
  }
  return out;
}

}  // namespace
}  // namespace weightsync::python

NB_MODULE(_weightsync, m) {
  using namespace weightsync::python;
  m.doc() = "weightsync: move model weights from a trainer to inference processes.";
  RegisterErrorTranslator();
  BindPublisher(m);
  BindSubscriber(m);
  m.def("ledger", &LedgerDict, nb::sig("def ledger() -> dict[str, int]"),
        "Live counts of what weightsync holds in this process (fds, segments, mappings,\n"
        "threads, staging bytes, handles, connections) and cumulative release failures.");
  m.def("dtypes", &DTypeNames, nb::sig("def dtypes() -> list[str]"),
        "Canonical names of the element types weightsync moves, in wire-code order.");
}
