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
  d["device_bytes"] = s.device_bytes;
  d["handles"] = s.handles;
  d["connections"] = s.connections;
  d["retained_allocations"] = s.retained_allocations;
  d["release_failures"] = s.release_failures;
  return d;
}

// What weightsync.cuda_status() returns: whether the GPU paths can be used in this process, and
// if not, why (weightsync::CudaStatus()).
struct PyCudaStatus {
  bool available = false;
  bool built_with_cuda = false;
  int device_count = 0;
  std::string reason;  // empty when available
};

PyCudaStatus ReadCudaStatus() {
  PyCudaStatus out;
  out.built_with_cuda = WS_WITH_CUDA != 0;  // the weightsync target's PUBLIC definition
  Status s;
  {
    nb::gil_scoped_release release;  // the first call probes the driver
    s = CudaStatus();
    out.device_count = CudaDeviceCount();
  }
  out.available = s.ok();
  if (!s.ok()) out.reason = s.message();
  return out;
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
        "threads, staging bytes, pinned bytes, GPU memory it allocated (device_bytes), handles,\n"
        "connections) and cumulative release failures.");
  nb::class_<PyCudaStatus>(
      m, "CudaStatus",
      "What weightsync.cuda_status() returns. True (bool()) when the GPU paths can be used.")
      .def_ro("available", &PyCudaStatus::available,
              "CUDA tensors can be registered and allocated in this process.")
      .def_ro("built_with_cuda", &PyCudaStatus::built_with_cuda,
              "The extension was built with the GPU data plane (the CUDA toolkit was found).")
      .def_ro("device_count", &PyCudaStatus::device_count,
              "Usable CUDA devices (0 unless available).")
      .def_ro("reason", &PyCudaStatus::reason,
              "Why the GPU paths cannot be used ('' when available), e.g. 'built without CUDA'\n"
              "or 'no CUDA device: cudaErrorNoDevice: no CUDA-capable device is detected'.")
      .def("__bool__", [](const PyCudaStatus& s) { return s.available; })
      .def("__repr__", [](const PyCudaStatus& s) {
        std::string r = "CudaStatus(available=";
        r += s.available ? "True" : "False";
        r += ", built_with_cuda=";
        r += s.built_with_cuda ? "True" : "False";
        r += ", device_count=" + std::to_string(s.device_count) + ", reason=" +
             nb::cast<std::string>(nb::repr(nb::str(s.reason.c_str(), s.reason.size()))) + ")";
        return r;
      });
  m.def("cuda_status", &ReadCudaStatus, nb::sig("def cuda_status() -> CudaStatus"),
        "Whether this process can use the GPU paths (CUDA tensors in register() and\n"
        "allocate(device=...), cuda-ipc, nccl, host <-> GPU), and if not, why. Probes the driver\n"
        "once; the answer is cached for the life of the process.");
  m.def(
      "_option_defaults",
      [] {
        const weightsync::PublisherOptions& p = kPublisherDefaults;
        const weightsync::SubscriberOptions& s = kSubscriberDefaults;
        nb::dict publisher, subscriber;
        publisher["slots"] = p.slots;
        publisher["timeout"] = Seconds(p.timeout);
        publisher["segment_bytes"] = p.segment_bytes;
        publisher["copy_threads"] = p.copy_threads;
        publisher["max_connections"] = p.max_connections;
        publisher["lineage"] = p.lineage;
        publisher["resume_from_step"] = p.resume_from_step;
        publisher["zero_copy"] = p.zero_copy;
        publisher["ring_buckets"] = p.ring_buckets;
        publisher["ring_bucket_bytes"] = p.ring_bucket_bytes;
        publisher["delta"] = DeltaModeName(p.delta);
        publisher["token"] = p.token;
        publisher["token_file"] = p.token_file;
        publisher["max_direct"] = p.max_direct;
        subscriber["mode"] = ModeName(s.mode);
        subscriber["policy"] = PolicyName(s.policy);
        subscriber["timeout"] = Seconds(s.timeout);
        subscriber["verify"] = s.verify;
        subscriber["copy_threads"] = s.copy_threads;
        subscriber["convert_dtypes"] = s.convert_dtypes;
        subscriber["convert_on_publisher_gpu"] = s.convert_on_publisher_gpu;
        subscriber["lineage_policy"] = LineagePolicyName(s.lineage_policy);
        subscriber["delta"] = s.delta;
        subscriber["token"] = s.token;
        subscriber["token_file"] = s.token_file;
        subscriber["serve_endpoint"] = s.serve_endpoint;
        subscriber["serve_max_direct"] = s.serve_max_direct;
        subscriber["serve_announce"] = s.serve_announce;
        subscriber["locality"] = s.locality;
        nb::dict out;
        out["Publisher"] = publisher;
        out["Subscriber"] = subscriber;
        return out;
      },
      nb::sig("def _option_defaults() -> dict[str, dict[str, typing.Any]]"),
      "The C++ PublisherOptions/SubscriberOptions defaults under the Python keyword names (for\n"
      "tests: the constructors' documented defaults must equal them).");
  m.def("dtypes", &DTypeNames, nb::sig("def dtypes() -> list[str]"),
        "Canonical names of the element types weightsync moves, in wire-code order.");
}
