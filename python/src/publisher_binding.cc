// weightsync.Publisher: translation of weightsync::Publisher.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>

#include "binding.h"

namespace weightsync::python {
namespace {

using namespace nb::literals;

// The Python-side state of a Publisher: what keeps registered caller memory alive, and how many
// arena views are still reachable (close() would unmap memory they point at).
struct PyPublisher {
  std::vector<nb::ndarray<>> sources;  // registered tensors; declared first, released last
  std::unique_ptr<Publisher> publisher;
  int live_views = 0;              // arrays from allocate() still alive
  bool close_when_unused = false;  // __exit__ with live views: close when the last one dies

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

}  // namespace

void BindPublisher(nb::module_& m) {
  nb::class_<PublishStats>(m, "PublishStats", "What one Publisher.publish() did.")
      .def_ro("step", &PublishStats::step)
      .def_ro("bytes_copied", &PublishStats::bytes_copied,
              "Bytes copied into the arena (0 for allocate()d tensors).")
      .def_ro("seconds", &PublishStats::seconds)
      .def_ro("gbps", &PublishStats::gbps)
      .def("__repr__", [](const PublishStats& s) {
        return "PublishStats(step=" + std::to_string(s.step) +
               ", bytes_copied=" + std::to_string(s.bytes_copied) +
               ", seconds=" + std::to_string(s.seconds) + ", gbps=" + std::to_string(s.gbps) + ")";
      });

  nb::class_<PyPublisher>(
      m, "Publisher",
      "Makes versions of named CPU tensors available to Subscribers on the same host.\n\n"
      "Either register() tensors you own (publish() copies them into shared memory) or\n"
      "allocate() them in the shared-memory arena (publish() copies nothing; call\n"
      "begin_write() before changing them). Register/allocate before the first publish().")
      .def(
          "__init__",
          [](PyPublisher* self, nb::handle endpoint, int slots, double timeout,
             uint64_t segment_bytes, int copy_threads, int max_connections, nb::handle lineage,
             int64_t resume_from_step) {
            PublisherOptions o;
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
          "endpoint"_a, "slots"_a = 2, "timeout"_a = 10.0, "segment_bytes"_a = 8ull << 20,
          "copy_threads"_a = 0, "max_connections"_a = 64, "lineage"_a = "",
          "resume_from_step"_a = -1,
          nb::sig("def __init__(self, endpoint: str, slots: int = 2, timeout: float = 10.0, "
                  "segment_bytes: int = 8388608, copy_threads: int = 0, max_connections: int = "
                  "64, lineage: str = '', resume_from_step: int = -1) -> None"),
          "Binds `endpoint` ('local://NAME') and starts serving. `timeout` (seconds) bounds a\n"
          "publish() waiting for a free slot and every control-frame read or write.\n"
          "lineage: the line of versions this trainer continues (e.g. its run name; '' = a new\n"
          "random one per start). resume_from_step: the step of `lineage` this trainer resumed\n"
          "from (its checkpoint); it publishes later steps only. Subscribers tell versions apart\n"
          "by (lineage, publisher session, step), so a restart is never taken for up to date.")
      .def(
          "register",
          [](PyPublisher& self, nb::handle tensors, nb::handle dtypes) {
            std::vector<ImportedTensor> imported = ImportTensors(tensors, dtypes, false);
            std::vector<NamedTensor> views;
            for (const auto& t : imported) views.push_back(t.tensor);
            ThrowIfError(self.publisher->Register(views));
            for (auto& t : imported) self.sources.push_back(std::move(t.keep));
          },
          "tensors"_a, "dtypes"_a = nb::none(),
          nb::sig("def register(self, tensors: collections.abc.Mapping[str, typing.Any] | "
                  "collections.abc.Iterable[tuple[str, typing.Any]], dtypes: "
                  "collections.abc.Mapping[str, typing.Any] | None = None) -> None"),
          "Registers CPU tensors (any __dlpack__ producer or NumPy array, C-contiguous) by name.\n"
          "They stay in your memory: publish() copies them, so you may change them as soon as\n"
          "it returns. The Publisher keeps them alive. `dtypes` maps names to an element type\n"
          "for tensors passed as raw bits (e.g. a uint16 view of bfloat16 data).")
      .def(
          "allocate",
          [](PyPublisher& self, nb::handle name_arg, nb::handle dtype, nb::handle shape,
             nb::handle framework_arg) {
            const std::string name = Utf8Arg(name_arg, "tensor name");
            DType dt = DTypeArg(dtype);
            std::vector<int64_t> dims = ShapeArg(shape);
            const Framework framework = FrameworkArg(framework_arg);
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
          "name"_a, "dtype"_a, "shape"_a, "framework"_a = "numpy",
          nb::sig("def allocate(self, name: str, dtype: str | numpy.dtype | type, shape: int | "
                  "collections.abc.Sequence[int], framework: typing.Literal['numpy', 'torch', "
                  "'dlpack'] = 'numpy') -> typing.Any"),
          "Allocates a zero-filled tensor in the shared-memory arena and returns a view of it\n"
          "(publish() then copies nothing). The view keeps the Publisher alive; close()\n"
          "refuses while views are alive. framework: 'numpy' (bfloat16/float8 as ml_dtypes\n"
          "arrays when ml_dtypes is installed, else raw uint16/uint8 bits), 'torch' (a\n"
          "torch.Tensor of the dtype itself) or 'dlpack' (an object any DLPack consumer\n"
          "imports: torch.from_dlpack, np.from_dlpack, jax.dlpack.from_dlpack). A failed\n"
          "allocate() registers nothing.")
      .def(
          "begin_write", [](PyPublisher& self) { ThrowIfError(self.publisher->BeginWrite()); },
          nb::call_guard<nb::gil_scoped_release>(),
          "Waits until no subscriber reads the allocate()d tensors; call before changing them.")
      .def(
          "publish",
          [](PyPublisher& self, int64_t step) {
            return ThrowIfError(self.publisher->Publish(step));
          },
          "step"_a, nb::call_guard<nb::gil_scoped_release>(),
          "Makes `step` the latest version (steps must increase). Copies registered tensors.")
      .def_prop_ro(
          "latest_step", [](PyPublisher& self) { return self.publisher->latest_step(); },
          "The latest published step, -1 before the first publish().")
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
          "manifest",
          [](PyPublisher& self) { return ManifestList(self.publisher->manifest()); },
          nb::sig("def manifest(self) -> list[tuple[str, str, tuple[int, ...]]]"),
          "(name, dtype name, shape) of every tensor, in registration order: what a\n"
          "Subscriber.allocate() loop needs to mirror this publisher.")
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
