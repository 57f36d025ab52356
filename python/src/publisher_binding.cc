// weightsync.Publisher: translation of weightsync::Publisher.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>

#include "binding.h"

namespace weightsync::python {
namespace {

using namespace nb::literals;

// The Python-side state of a Publisher: what keeps registered caller memory alive, and how many
// arena views are still reachable (close() would unmap memory they point at).
struct PyPublisher {
  // Registered tensors and the owners of allocate()d device memory; declared first, released
  // last.
  std::vector<nb::object> sources;
  std::unique_ptr<Publisher> publisher;
  int live_views = 0;              // arena arrays from allocate() still alive
  bool close_when_unused = false;  // __exit__ with live views: close when the last one dies
  int cuda_device = -1;            // the device of the registered CUDA tensors, -1: host tensors

  void Registered(const std::vector<NamedTensor>& views) {
    for (const NamedTensor& t : views) {
      if (t.view.device.is_cuda()) cuda_device = t.view.device.index;
    }
  }

  // The bound endpoint (tcp://HOST:0 reports the port it got).
  const std::string& endpoint() const { return publisher->endpoint(); }

  Status Close() {
    nb::gil_scoped_release release;
    return publisher->Close();
  }
};

// Owner of one arena view: counts it and keeps the Python Publisher alive.
struct ViewOwner {
  PyPublisher* self;
  PyObject* self_object;
};

void ReleaseView(void* p) noexcept {
  auto* owner = static_cast<ViewOwner*>(p);
  PyPublisher* self = owner->self;
  if (--self->live_views == 0 && self->close_when_unused) {
    self->close_when_unused = false;
    if (Status s = self->Close(); !s.ok()) {
      PySys_WriteStderr("weightsync: Publisher(%s).close() after its last view: %s\n",
                        self->endpoint().c_str(), s.ToString().c_str());
    }
  }
  Py_DECREF(owner->self_object);
  delete owner;
}

// Any Python object's attribute as an int stream handle; false when absent or not an int.
bool IntAttr(nb::handle obj, const char* attr, nb::object* out) {
  nb::object v = nb::steal(PyObject_GetAttrString(obj.ptr(), attr));
  if (!v.is_valid()) {
    PyErr_Clear();
    return false;
  }
  if (!PyIndex_Check(v.ptr()) || PyBool_Check(v.ptr())) return false;
  *out = std::move(v);
  return true;
}

// The CUDA device a stream object says it belongs to, or -1 when it does not say: torch.cuda.Stream
// has .device (a torch.device with .index), cupy.cuda.Stream .device_id.
int StreamDevice(nb::handle stream) {
  nb::object v;
  if (IntAttr(stream, "device_id", &v)) return static_cast<int>(PyLong_AsLong(v.ptr()));
  nb::object device = nb::steal(PyObject_GetAttrString(stream.ptr(), "device"));
  if (!device.is_valid()) {
    PyErr_Clear();
    return -1;
  }
  if (IntAttr(device, "index", &v)) return static_cast<int>(PyLong_AsLong(v.ptr()));
  return -1;
}

// publish()'s `stream` argument as PublishOptions::cuda_stream. None: torch's current stream on
// the tensors' device when torch is imported (never imported here) and has initialised CUDA, else
// the legacy default stream (nullptr). Host tensors: the stream is not used.
void* StreamArg(nb::handle stream, int cuda_device) {
  if (stream.is_none()) {
    if (cuda_device < 0) return nullptr;
    nb::object torch = nb::steal(PyImport_GetModule(nb::str("torch").ptr()));
    if (!torch.is_valid()) {
      PyErr_Clear();
      return nullptr;
    }
    nb::object cuda = nb::steal(PyObject_GetAttrString(torch.ptr(), "cuda"));
    if (!cuda.is_valid()) {
      PyErr_Clear();
      return nullptr;
    }
    if (!nb::cast<bool>(cuda.attr("is_initialized")())) return nullptr;  // not torch's tensors
    nb::object current = cuda.attr("current_stream")(cuda_device);
    return StreamArg(current, cuda_device);
  }
  nb::object handle;
  if (PyIndex_Check(stream.ptr()) && !PyBool_Check(stream.ptr())) {
    handle = nb::borrow(stream);
  } else if (!IntAttr(stream, "cuda_stream", &handle) && !IntAttr(stream, "ptr", &handle)) {
    throw nb::type_error(("stream: expected None, an int (a cudaStream_t) or a stream object with "
                          ".cuda_stream (torch.cuda.Stream) or .ptr (cupy.cuda.Stream), got " +
                          std::string(Py_TYPE(stream.ptr())->tp_name))
                             .c_str());
  } else if (const int device = StreamDevice(stream);
             device >= 0 && cuda_device >= 0 && device != cuda_device) {
    ThrowIfError(Status::InvalidArgument("stream: it belongs to cuda:", device,
                                         ", but this publisher's tensors are on cuda:", cuda_device,
                                         "; pass a stream of cuda:", cuda_device,
                                         " (the one whose work wrote them)"));
  }
  const unsigned long long value = PyLong_AsUnsignedLongLong(handle.ptr());
  if (value == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    ThrowIfError(Status::InvalidArgument(
        "stream: ", nb::cast<std::string>(nb::repr(handle)),
        " is not a cudaStream_t (an address: 0 for the legacy default stream, 1 legacy, 2 "
        "per-thread)"));
  }
  return reinterpret_cast<void*>(static_cast<uintptr_t>(value));
}

DeltaMode DeltaModeArg(const std::string& delta) {
  if (delta == "auto") return DeltaMode::kAuto;
  if (delta == "off") return DeltaMode::kOff;
  if (delta == "always") return DeltaMode::kAlways;
  ThrowIfError(Status::InvalidArgument("delta '", delta, "': expected 'auto', 'off' or 'always'"));
  return DeltaMode::kAuto;
}

}  // namespace

void BindPublisher(nb::module_& m) {
  nb::class_<MemberInfo>(
      m, "MemberInfo", "One subscriber connected to a publisher (Publisher.members()), read-only.")
      .def_ro("peer", &MemberInfo::peer,
              "'10.0.0.7:51234' (tcp) or 'subscriber connection 3' (local).")
      .def_ro("held_step", &MemberInfo::held_step,
              "The step it holds, as it last said (in its latest update request, or after it\n"
              "committed a step; never newer than what it holds; -1: none of this publisher's\n"
              "session).")
      .def_ro("sent_step", &MemberInfo::sent_step,
              "The latest step it was sent whole (it may still be verifying it).")
      .def_ro("receiving_step", &MemberInfo::receiving_step,
              "The step being sent to it now; -1: none.")
      .def_ro("serves", &MemberInfo::serves,
              "A relay: the endpoint it serves on, as it announced itself (its serve_endpoint,\n"
              "or serve_announce); '' for a leaf (docs/relays.md).")
      .def_ro("below", &MemberInfo::below,
              "How many subscribers it serves, its children and theirs, as its latest request\n"
              "said (0 for a leaf).")
      .def_ro("locality", &MemberInfo::locality,
              "Where it runs, as it labelled itself (Subscriber's locality); '' for none.")
      .def_ro("depth", &MemberInfo::depth,
              "Publisher.tree(): how far below the publisher (1: its own member).")
      .def_ro("via", &MemberInfo::via,
              "Publisher.tree(): the endpoint of the relay that serves it ('' at depth 1).")
      .def("__repr__", [](const MemberInfo& m) {
        std::string text =
            "MemberInfo(peer='" + m.peer + "', held_step=" + std::to_string(m.held_step) +
            ", sent_step=" + std::to_string(m.sent_step) +
            ", receiving_step=" + std::to_string(m.receiving_step) + ", serves='" + m.serves +
            "', below=" + std::to_string(m.below) + ", locality='" + m.locality + "'";
        if (m.depth != 1) text += ", depth=" + std::to_string(m.depth) + ", via='" + m.via + "'";
        return text + ")";
      });

  nb::class_<DeltaStats>(m, "DeltaStats",
                         "What the encode of one version's deltas found (Publisher.deltas()).")
      .def_ro("step", &DeltaStats::step)
      .def_ro("base_step", &DeltaStats::base_step,
              "The step it was encoded against; -1: none (every segment goes whole).")
      .def_ro("delta_segments", &DeltaStats::delta_segments)
      .def_ro("whole_segments", &DeltaStats::whole_segments)
      .def_ro("delta_bytes", &DeltaStats::delta_bytes)
      .def_ro("changed_bytes", &DeltaStats::changed_bytes,
              "Bytes of the elements that changed, in the segments encoded.")
      .def_ro("encode_seconds", &DeltaStats::encode_seconds,
              "The encode's own time (after publish() returned, unless it waited for it).")
      .def("__repr__", [](const DeltaStats& s) {
        return "DeltaStats(step=" + std::to_string(s.step) +
               ", base_step=" + std::to_string(s.base_step) +
               ", delta_segments=" + std::to_string(s.delta_segments) +
               ", whole_segments=" + std::to_string(s.whole_segments) +
               ", delta_bytes=" + std::to_string(s.delta_bytes) +
               ", changed_bytes=" + std::to_string(s.changed_bytes) +
               ", encode_seconds=" + std::to_string(s.encode_seconds) + ")";
      });

  nb::class_<PublishStats>(m, "PublishStats", "What one Publisher.publish() did.")
      .def_ro("step", &PublishStats::step)
      .def_ro("bytes_copied", &PublishStats::bytes_copied,
              "Bytes copied into the arena (0 for allocate()d tensors).")
      .def_ro("seconds", &PublishStats::seconds)
      .def_ro("gbps", &PublishStats::gbps)
      .def_ro("wait_for_readers_seconds", &PublishStats::wait_for_readers_seconds,
              "How long the begin_write() before this publish waited for subscribers reading.")
      .def_ro("revoked_reads", &PublishStats::revoked_reads,
              "Reads that begin_write() revoked when they outlasted the publisher's timeout.")
      .def_ro("store_bytes", &PublishStats::store_bytes,
              "Memory the publisher's store holds for versions besides the tensors themselves:\n"
              "every slot of the arena, or the ring's buckets, as allocated; 0 for zero_copy.\n"
              "allocate()d tensors are not counted.")
      .def_ro("store_device", &PublishStats::store_device,
              "Where store_bytes is: -1 host memory, else the CUDA device index.")
      .def_ro("delta_base_step", &PublishStats::delta_base_step,
              "Delta updates (docs/deltas.md): the step this version is encoded against; -1:\n"
              "none (the first publish, delta='off', or a store that keeps no deltas).")
      .def_ro("delta_pending", &PublishStats::delta_pending,
              "Whether the encode of this version's deltas still ran when publish() returned\n"
              "(it runs off the trainer's path unless publish(wait_for_deltas=True)); the four\n"
              "counts below are 0 then.")
      .def_ro("delta_segments", &PublishStats::delta_segments, "Digest segments encoded as deltas.")
      .def_ro("whole_segments", &PublishStats::whole_segments,
              "Digest segments left whole (their delta too large for the room, or allocate()d).")
      .def_ro("delta_bytes", &PublishStats::delta_bytes, "Bytes of the deltas encoded.")
      .def_ro("changed_bytes", &PublishStats::changed_bytes,
              "Bytes of the elements that changed, in the segments encoded.")
      .def("__repr__", [](const PublishStats& s) {
        return "PublishStats(step=" + std::to_string(s.step) +
               ", bytes_copied=" + std::to_string(s.bytes_copied) +
               ", seconds=" + std::to_string(s.seconds) + ", gbps=" + std::to_string(s.gbps) +
               ", wait_for_readers_seconds=" + std::to_string(s.wait_for_readers_seconds) +
               ", revoked_reads=" + std::to_string(s.revoked_reads) +
               ", store_bytes=" + std::to_string(s.store_bytes) +
               ", store_device=" + std::to_string(s.store_device) +
               ", delta_base_step=" + std::to_string(s.delta_base_step) +
               (s.delta_pending ? ", delta_pending=True"
                                : ", delta_segments=" + std::to_string(s.delta_segments) +
                                      ", whole_segments=" + std::to_string(s.whole_segments) +
                                      ", delta_bytes=" + std::to_string(s.delta_bytes) +
                                      ", changed_bytes=" + std::to_string(s.changed_bytes)) +
               ")";
      });

  nb::class_<PyPublisher>(
      m, "Publisher",
      "Makes versions of named tensors (host tensors, or tensors of one CUDA device) available\n"
      "to Subscribers.\n\n"
      "Either register() tensors you own (publish() copies them into shared memory, or into\n"
      "GPU memory for CUDA tensors) or allocate() them in the shared-memory arena (publish()\n"
      "copies nothing; call begin_write() before changing them). Register/allocate before the\n"
      "first publish().")
      .def(
          "__init__",
          [](PyPublisher* self, nb::handle endpoint, int slots, double timeout,
             uint64_t segment_bytes, int copy_threads, int max_connections, nb::handle lineage,
             int64_t resume_from_step, bool zero_copy, int ring_buckets, uint64_t ring_bucket_bytes,
             nb::handle token, nb::handle token_file, const std::string& delta, int max_direct) {
            PublisherOptions o;
            o.max_direct = max_direct;
            o.delta = DeltaModeArg(delta);
            o.token = Utf8Arg(token, "token");
            o.token_file = Utf8Arg(token_file, "token_file");
            o.zero_copy = zero_copy;
            o.ring_buckets = ring_buckets;
            o.ring_bucket_bytes = ring_bucket_bytes;
            o.lineage = Utf8Arg(lineage, "lineage");
            o.resume_from_step = resume_from_step;
            o.endpoint = Utf8Arg(endpoint, "endpoint");
            o.slots = slots;
            o.timeout = TimeoutArg(timeout, "timeout");
            o.segment_bytes = segment_bytes;
            o.copy_threads = copy_threads;
            o.max_connections = max_connections;
            std::unique_ptr<Publisher> p;
            {
              nb::gil_scoped_release release;
              p = ThrowIfError(Publisher::Create(o));
            }
            new (self) PyPublisher();
            self->publisher = std::move(p);
          },
          // Defaults are the C++ options' own (test_stubs.py checks the signature text says them).
          "endpoint"_a, "slots"_a = kPublisherDefaults.slots,
          "timeout"_a = Seconds(kPublisherDefaults.timeout),
          "segment_bytes"_a = kPublisherDefaults.segment_bytes,
          "copy_threads"_a = kPublisherDefaults.copy_threads,
          "max_connections"_a = kPublisherDefaults.max_connections,
          "lineage"_a = kPublisherDefaults.lineage,
          "resume_from_step"_a = kPublisherDefaults.resume_from_step,
          "zero_copy"_a = kPublisherDefaults.zero_copy,
          "ring_buckets"_a = kPublisherDefaults.ring_buckets,
          "ring_bucket_bytes"_a = kPublisherDefaults.ring_bucket_bytes,
          "token"_a = kPublisherDefaults.token, "token_file"_a = kPublisherDefaults.token_file,
          "delta"_a = DeltaModeName(kPublisherDefaults.delta),
          "max_direct"_a = kPublisherDefaults.max_direct,
          nb::sig("def __init__(self, endpoint: str, slots: int = 2, timeout: float = 10.0, "
                  "segment_bytes: int = 0, copy_threads: int = 0, max_connections: int = "
                  "64, lineage: str = '', resume_from_step: int = -1, zero_copy: bool = False, "
                  "ring_buckets: int = 0, ring_bucket_bytes: int = 0, token: str = '', "
                  "token_file: str = '', delta: typing.Literal['auto', 'off', 'always'] = "
                  "'auto', max_direct: int = 0) -> None"),
          "Binds `endpoint` ('local://NAME') and starts serving. `timeout` (seconds) bounds a\n"
          "publish() waiting for a free slot and every control-frame read or write.\n"
          "lineage: the line of versions this trainer continues (e.g. its run name; '' = a new\n"
          "random one per start). resume_from_step: the step of `lineage` this trainer resumed\n"
          "from (its checkpoint); it publishes later steps only. Subscribers tell versions apart\n"
          "by (lineage, publisher session, step), so a restart is never taken for up to date.\n"
          "zero_copy (CUDA tensors): the registered tensors are the published version: no\n"
          "GPU arena and no copy; subscribers on this host (local://) read them in place and\n"
          "tcp sessions broadcast them over NCCL, so call begin_write() before the optimizer\n"
          "changes them (PyTorch's caching allocator, with or without expandable segments).\n"
          "ring_buckets (>= 2): a ring of that many buckets of\n"
          "ring_bucket_bytes (0: from free memory) instead of `slots` copies of the model, in\n"
          "shared memory for host tensors, on the tensors' GPU for CUDA tensors;\n"
          "publish() only hashes, each update streams the tensors through the ring, and\n"
          "begin_write() fences the optimizer's writes as with zero_copy. Over tcp sessions\n"
          "send the version from the tensors themselves (NCCL for CUDA tensors) and no\n"
          "bucket is allocated. segment_bytes: bytes per digest segment (0: 8 MiB for host\n"
          "tensors, 64 MiB on a GPU). delta (docs/deltas.md): 'auto' encodes each version's\n"
          "changes against the one before it when serving tcp:// (host tensors, no ring), so a\n"
          "subscriber holding that version receives only them; 'off' never; 'always' every\n"
          "segment on any endpoint. token / token_file (tcp): the shared secret, or a 0600\n"
          "file holding it; '' for both: $WEIGHTSYNC_TOKEN_FILE or $WEIGHTSYNC_TOKEN. Required\n"
          "to listen beyond loopback (docs/security.md). max_direct (docs/relays.md): how many\n"
          "subscribers this publisher serves directly; one past the bound is redirected to the\n"
          "direct subscriber relaying (serve_endpoint) with the fewest below it, or served\n"
          "directly when none relays (joining is never refused). 0: no bound.")
      .def(
          "register",
          [](PyPublisher& self, nb::handle tensors, nb::handle dtypes, nb::handle regions) {
            std::vector<ImportedTensor> imported = ImportTensors(tensors, dtypes, false);
            ApplyRegions(regions, &imported);
            std::vector<NamedTensor> views;
            for (const auto& t : imported) views.push_back(t.tensor);
            ThrowIfError(self.publisher->Register(views));
            self.Registered(views);
            for (auto& t : imported) self.sources.push_back(nb::cast(std::move(t.keep)));
          },
          "tensors"_a, "dtypes"_a = nb::none(), "regions"_a = nb::none(),
          nb::sig("def register(self, tensors: collections.abc.Mapping[str, typing.Any] | "
                  "collections.abc.Iterable[tuple[str, typing.Any]], dtypes: "
                  "collections.abc.Mapping[str, typing.Any] | None = None, regions: "
                  "collections.abc.Mapping[str, typing.Any] | None = None) -> None"),
          "Registers tensors (any __dlpack__ producer or NumPy array, C-contiguous) by name: host\n"
          "tensors, or tensors of one CUDA device (the publisher then keeps its versions in GPU\n"
          "memory). They stay in your memory: publish() copies them, so you may change them as\n"
          "soon as it returns. The Publisher keeps them alive. `dtypes` maps names to an element\n"
          "type for tensors passed as raw bits (e.g. a uint16 view of bfloat16 data).\n"
          "regions: name → the region of a global tensor that tensor holds (a sharded trainer's\n"
          "shard; weightsync.regions builds them), so nothing is gathered before publishing.")
      .def(
          "allocate",
          [](PyPublisher& self, nb::handle name_arg, nb::handle dtype, nb::handle shape,
             nb::handle framework_arg, nb::handle device_arg) {
            const std::string name = Utf8Arg(name_arg, "tensor name");
            DType dt = DTypeArg(dtype);
            std::vector<int64_t> dims = ShapeArg(shape);
            const Framework framework = FrameworkArg(framework_arg);
            const Device device = DeviceArg(device_arg);
            if (device.is_cuda()) {
              // A GPU arena cannot hold allocated tensors yet (Publisher::Allocate): the tensor is
              // device memory of the publisher's own (weightsync::DeviceMemory), registered, so
              // publish() copies it like a registered tensor; no begin_write() is needed.
              DeviceTensor t = AllocateDeviceTensor(name, dt, dims, framework, device);
              std::vector<NamedTensor> views{{name, TensorView{t.data, dt, dims, device}}};
              ThrowIfError(self.publisher->Register(views));
              self.Registered(views);
              self.sources.push_back(std::move(t.owner));
              return t.view;
            }
            // Allocate() cannot be undone, so whatever can fail here fails first: the byte count
            // (the library's rules), then the Python view itself, built once over a placeholder
            // address (nothing reads it) and dropped.
            ThrowIfError(TensorView{nullptr, dt, dims}.NumBytes());
            (void)ArrayView(PlaceholderAddress(), dt, dims, nb::str("placeholder"), framework);
            TensorView v = ThrowIfError(self.publisher->Allocate(name, dt, dims));
            nb::handle self_object = nb::find(&self);
            auto* owner = new ViewOwner{&self, self_object.inc_ref().ptr()};
            ++self.live_views;
            nb::capsule capsule(owner, &ReleaseView);  // owns `owner` from here on
            return ArrayView(v.data, v.dtype, v.shape, capsule, framework);
          },
          "name"_a, "dtype"_a, "shape"_a, "framework"_a = "numpy", "device"_a = nb::none(),
          nb::sig("def allocate(self, name: str, dtype: str | numpy.dtype | type, shape: int | "
                  "collections.abc.Sequence[int], framework: typing.Literal['numpy', 'torch', "
                  "'cupy', 'dlpack'] = 'numpy', device: str | int | typing.Any | None = None) "
                  "-> typing.Any"),
          "Allocates a zero-filled tensor in the shared-memory arena and returns a view of it\n"
          "(publish() then copies nothing). The view keeps the Publisher alive; close()\n"
          "refuses while views are alive. framework: 'numpy' (bfloat16/float8 as ml_dtypes\n"
          "arrays when ml_dtypes is installed, else raw uint16/uint8 bits), 'torch' (a\n"
          "torch.Tensor of the dtype itself), 'cupy' or 'dlpack' (an object any DLPack consumer\n"
          "imports: torch.from_dlpack, np.from_dlpack, jax.dlpack.from_dlpack). A failed\n"
          "allocate() registers nothing. device='cuda:N' (or 'cuda', N, a torch.device): the\n"
          "tensor is device memory of the publisher's own, registered like register()'s tensors:\n"
          "publish() copies it into the GPU arena (no begin_write() needed; a zero_copy\n"
          "publisher publishes it where it is: begin_write() before changing it), and close()\n"
          "does not wait for its views; not with framework='numpy'.")
      .def(
          "begin_write", [](PyPublisher& self) { ThrowIfError(self.publisher->BeginWrite()); },
          nb::call_guard<nb::gil_scoped_release>(),
          "Waits until no subscriber reads the allocate()d tensors; call before changing them.\n"
          "It waits at most the publisher's timeout: a subscriber still reading then has its read\n"
          "revoked (a Timeout at the end of its update, nothing committed) and begin_write()\n"
          "returns; the next publish()'s stats say how long it waited and how many it revoked.")
      .def(
          "publish",
          [](PyPublisher& self, int64_t step, nb::handle stream, bool wait_for_deltas) {
            PublishOptions options;
            options.cuda_stream = StreamArg(stream, self.cuda_device);
            options.wait_for_deltas = wait_for_deltas;
            nb::gil_scoped_release release;
            return ThrowIfError(self.publisher->Publish(step, options));
          },
          "step"_a, "stream"_a = nb::none(), "wait_for_deltas"_a = false,
          nb::sig("def publish(self, step: int, stream: int | typing.Any | None = None, "
                  "wait_for_deltas: bool = False) -> PublishStats"),
          "Makes `step` the latest version (steps must increase). Copies registered tensors.\n"
          "CUDA tensors are copied on the GPU after the work queued on `stream` (the kernels that\n"
          "wrote them), without blocking the host or synchronizing the device: a cudaStream_t as\n"
          "an int, or a stream object with .cuda_stream (torch.cuda.Stream) or .ptr\n"
          "(cupy.cuda.Stream), of the tensors' device. None: torch's current stream on that\n"
          "device if torch is imported and has initialised CUDA, else the legacy default stream.\n"
          "Returns once the version is complete. Host tensors: `stream` is not used.\n"
          "Its deltas (docs/deltas.md) are encoded after it returns, off the trainer's path;\n"
          "wait_for_deltas=True returns once they are too, with their counts in the stats.")
      .def_prop_ro(
          "latest_step", [](PyPublisher& self) { return self.publisher->latest_step(); },
          "The latest published step, -1 before the first publish().")
      .def(
          "members", [](PyPublisher& self) { return self.publisher->Members(); },
          "The subscribers connected now (a relay among them), in the order they connected:\n"
          "which step each holds, was sent, or is receiving (docs/relays.md).")
      .def(
          "deltas", [](PyPublisher& self) { return ThrowIfError(self.publisher->Deltas()); },
          nb::call_guard<nb::gil_scoped_release>(),
          "The latest version's deltas once encoded (docs/deltas.md): waits for the encode\n"
          "that runs on after publish(), at most the publisher's timeout. Before the next\n"
          "publish() (which waits for it anyway) it costs the trainer nothing.")
      .def(
          "tree", [](PyPublisher& self) { return self.publisher->Tree(); },
          "Every subscriber below this publisher, depth-first: each member followed by the\n"
          "subtree it serves, with depth and via (the relay that serves it). Below depth 1,\n"
          "as each relay last reported (docs/relays.md, 'Membership').")
      .def_prop_ro(
          "endpoint", [](PyPublisher& self) { return self.endpoint(); },
          "The endpoint subscribers connect to: for 'tcp://HOST:0', with the port bound.")
      .def_prop_ro(
          "lineage", [](PyPublisher& self) { return Utf8Out(self.publisher->lineage()); },
          "The lineage this publisher serves (given, or chosen at random when none was).")
      .def("__repr__",
           [](PyPublisher& self) {
             return "Publisher('" + self.endpoint() +
                    "', latest_step=" + std::to_string(self.publisher->latest_step()) + ")";
           })
      .def_prop_ro(
          "manifest", [](PyPublisher& self) { return ManifestList(self.publisher->manifest()); },
          nb::sig("def manifest(self) -> list[weightsync.PublishedTensor]"),
          "(name, dtype name, shape) of every tensor, in registration order: what a\n"
          "Subscriber.allocate() loop needs to mirror this publisher (alias_of None here: the\n"
          "subscriber's published_manifest() names tied weights).")
      .def(
          "close",
          [](PyPublisher& self) {
            if (self.live_views > 0) {
              ThrowIfError(Status::FailedPrecondition(
                  "Publisher(", self.endpoint(), ").close(): ", self.live_views,
                  " array(s) returned by allocate() are still alive and point into the arena; "
                  "delete them first"));
            }
            ThrowIfError(self.Close());
          },
          "Stops serving, closes connections and frees the arena. Idempotent.")
      .def(
          "__enter__", [](nb::handle self) { return nb::borrow(self); },
          nb::sig("def __enter__(self) -> typing.Self"))
      .def(
          "__exit__",
          [](PyPublisher& self, nb::args) {
            if (self.live_views > 0) {
              self.close_when_unused = true;  // the last view's release closes it
              return;
            }
            ThrowIfError(self.Close());
          },
          nb::sig("def __exit__(self, *args: object) -> None"),
          "Closes the publisher; while allocate()d arrays are alive, closing waits for the\n"
          "last of them to be released.");
}

}  // namespace weightsync::python
