// weightsync.Subscriber: translation of weightsync::Subscriber, plus the one thing a binding must
// add to a blocking C++ call: Ctrl-C. Subscriber::Update() blocks (bounded by its timeout), so
// update() runs it on one worker thread per Subscriber and waits in 50 ms slices with the GIL
// released, checking for signals between slices; on an interrupt it calls Subscriber::Cancel()
// and waits for the update to end. See docs/python.md ("Interrupting update()") for what a
// KeyboardInterrupt leaves behind, including an update that committed before it could cancel.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "binding.h"

namespace weightsync::python {
namespace {

using namespace nb::literals;

constexpr auto kSignalSlice = std::chrono::milliseconds(50);

// Runs Subscriber::Update() calls on one thread, started once. Allocation-free per update: the
// request and the result live in fixed slots.
class UpdateWorker {
 public:
  explicit UpdateWorker(Subscriber* subscriber)
      : subscriber_(subscriber), thread_([this] { Loop(); }) {}
  ~UpdateWorker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();  // an update in flight finishes first (bounded by its timeout)
  }

  void Submit(const UpdateOptions& options) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      request_ = options;
      result_.reset();
    }
    cv_.notify_all();
  }
  // True once the submitted update has finished; waits at most `slice`.
  bool WaitDone(std::chrono::milliseconds slice) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, slice, [this] { return result_.has_value(); });
  }
  Result<UpdateStats> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!result_) return Status::Internal("binding: update result taken before it was ready");
    Result<UpdateStats> r = std::move(*result_);
    result_.reset();
    return r;
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return stop_ || request_.has_value(); });
      if (stop_) return;
      UpdateOptions options = *request_;
      request_.reset();
      lock.unlock();
      Result<UpdateStats> r = subscriber_->Update(options);
      lock.lock();
      result_.emplace(std::move(r));
      cv_.notify_all();
    }
  }

  Subscriber* subscriber_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<UpdateOptions> request_;       // guarded by mu_
  std::optional<Result<UpdateStats>> result_;  // guarded by mu_
  bool stop_ = false;                          // guarded by mu_
  std::thread thread_;                         // last: starts after the state above exists
};

UpdateMode ModeArg(const std::string& mode) {
  if (mode == "staged") return UpdateMode::kStaged;
  if (mode == "in_place") return UpdateMode::kInPlace;
  ThrowIfError(Status::InvalidArgument("mode '", mode, "': expected 'staged' or 'in_place'"));
  return UpdateMode::kStaged;
}

LineagePolicy LineagePolicyArg(const std::string& policy) {
  if (policy == "follow") return LineagePolicy::kFollow;
  if (policy == "strict") return LineagePolicy::kStrict;
  ThrowIfError(
      Status::InvalidArgument("lineage_policy '", policy, "': expected 'follow' or 'strict'"));
  return LineagePolicy::kFollow;
}

MatchPolicy PolicyArg(const std::string& policy) {
  if (policy == "strict") return MatchPolicy::kStrict;
  if (policy == "subset") return MatchPolicy::kSubset;
  ThrowIfError(Status::InvalidArgument("policy '", policy, "': expected 'strict' or 'subset'"));
  return MatchPolicy::kStrict;
}

// What receive() returns: an iterator over the allocate()d (name, tensor) pairs, carrying the
// stats of the update that filled them.
struct Received {
  UpdateStats stats;
  nb::list pairs;  // PySubscriber::owned: the same tuples every step
  size_t next = 0;
};

// The Python-side state of a Subscriber. Every field is touched with the GIL held.
struct PySubscriber {
  nb::dict kept;         // name → a registered caller tensor, kept alive while registered
  nb::list owned;        // (name, view) of allocate()d tensors, for receive()
  nb::dict owned_index;  // name → its position in `owned`
  // What each allocate()d name is, for an alias allocated over it (allocate(alias_of=...)).
  std::unordered_map<std::string, TensorView> allocated;

  // Keeps what a successful Register/Allocate of `name` points at, and forgets what the name
  // pointed at before (registering a name again replaces it): O(1) per name.
  void Keep(const std::string& name, nb::object keep, nb::object owned_entry) {
    nb::str key(name.c_str(), name.size());
    if (owned_entry.is_valid()) {
      if (kept.contains(key)) nb::del(kept[key]);
      if (owned_index.contains(key)) {
        owned[nb::cast<size_t>(owned_index[key])] = owned_entry;
      } else {
        owned_index[key] = nb::len(owned);
        owned.append(owned_entry);
      }
    } else {
      kept[key] = keep;
      if (owned_index.contains(key)) Forget({name});
      allocated.erase(name);
    }
  }
  // Drops every reference to the named tensors (after a successful Unregister or replacement).
  void Forget(const std::vector<std::string>& names) {
    bool reindex = false;
    for (const std::string& name : names) {
      nb::str key(name.c_str(), name.size());
      if (kept.contains(key)) nb::del(kept[key]);
      allocated.erase(name);
      reindex = reindex || owned_index.contains(key);
    }
    if (!reindex) return;
    nb::list kept_owned;
    owned_index.clear();
    for (nb::handle entry : owned) {
      nb::object key = nb::borrow(entry)[0];
      bool drop = false;
      for (const std::string& name : names) drop = drop || nb::cast<std::string>(key) == name;
      if (drop) continue;
      owned_index[key] = nb::len(kept_owned);
      kept_owned.append(entry);
    }
    owned.clear();
    for (nb::handle entry : kept_owned) owned.append(entry);
  }
  std::unique_ptr<Subscriber> subscriber;
  std::unique_ptr<UpdateWorker> worker;  // started at the first update
  std::string endpoint;
  // A Python thread waits on the worker (its update()). Only that thread touches the worker; any
  // other gets Busy, as the C++ API answers concurrent updates.
  bool waiting = false;
  bool closed = false;

  ~PySubscriber() {
    if (!subscriber) return;
    {
      // Close() waits for an update in flight on another thread (bounded by its timeout).
      nb::gil_scoped_release release;
      Status s = subscriber->Close();
      worker.reset();
      if (!s.ok()) {
        nb::gil_scoped_acquire acquire;
        PySys_WriteStderr("weightsync: Subscriber(%s) cleanup: %s\n", endpoint.c_str(),
                          s.ToString().c_str());
      }
    }
    subscriber.reset();
  }

  // Marks this thread as the one waiting on the worker for the scope's duration.
  struct WaitingScope {
    explicit WaitingScope(PySubscriber* self) : self_(self) {
      if (self_->waiting) {
        ThrowIfError(Status::Busy("another update() is in flight on this subscriber"));
      }
      self_->waiting = true;
    }
    ~WaitingScope() { self_->waiting = false; }
    PySubscriber* self_;
  };

  // Waits for the worker's update, in slices, with the GIL released; a pending signal's handler
  // runs between slices and its exception (KeyboardInterrupt) propagates.
  void WaitInterruptibly() {
    while (true) {
      bool done;
      {
        nb::gil_scoped_release release;
        done = worker->WaitDone(kSignalSlice);
      }
      if (done) return;
      if (PyErr_CheckSignals() != 0) throw nb::python_error();
    }
  }

  // Verifying and committing are not interruptible: an update past its last cancellable wait
  // commits. The interrupt still propagates (the caller asked to stop), and says so: a note and
  // `update_stats` on the exception (KeyboardInterrupt), so no one takes the step for undone.
  static void NoteCommitted(const nb::python_error& interrupt, const UpdateStats& stats) {
    nb::handle exc = interrupt.value();
    const std::string note =
        stats.up_to_date
            ? "weightsync: the interrupted update had found step " + std::to_string(stats.step) +
                  " already committed (nothing moved)"
            : "weightsync: the interrupted update had already committed step " +
                  std::to_string(stats.step) + " of lineage '" + std::string(stats.lineage.view()) +
                  "' (it was verifying or committing, which is not interruptible); the "
                  "subscriber holds that step; its UpdateStats are in .update_stats";
    try {
      exc.attr("update_stats") = nb::cast(stats);
      if (nb::hasattr(exc, "add_note")) {
        exc.attr("add_note")(Utf8Out(note));
      } else {  // Python < 3.11: what add_note() does
        if (!nb::hasattr(exc, "__notes__")) exc.attr("__notes__") = nb::list();
        exc.attr("__notes__").attr("append")(Utf8Out(note));
      }
    } catch (const nb::python_error&) {
      // An exception type that takes no attributes: it propagates as it is.
    }
  }

  UpdateStats Update(std::optional<int64_t> step, std::optional<bool> verify,
                     bool accept_new_lineage = false, bool check_weights = false) {
    const UpdateOptions options{step, verify, accept_new_lineage, check_weights};
    if (closed) return ThrowIfError(subscriber->Update(options));  // its error
    WaitingScope scope(this);
    if (!worker) worker = std::make_unique<UpdateWorker>(subscriber.get());
    worker->Submit(options);
    try {
      WaitInterruptibly();
    } catch (nb::python_error& interrupt) {
      // Cancel it and wait for it: nothing keeps running after the exception.
      Result<UpdateStats> r = [&] {
        // Repeated: the worker may not have entered Update() when the first Cancel() ran.
        nb::gil_scoped_release release;
        (void)subscriber->Cancel();
        while (!worker->WaitDone(kSignalSlice)) (void)subscriber->Cancel();
        return worker->Take();
      }();
      if (r.ok()) NoteCommitted(interrupt, *r);
      throw;
    }
    return ThrowIfError(worker->Take());
  }

  void Close() {
    closed = true;
    Status s;
    {
      nb::gil_scoped_release release;
      s = subscriber->Close();  // waits for an update another thread may have in flight
    }
    if (!waiting) worker.reset();  // idle now: joins at once
    ThrowIfError(s);
  }
};

// allocate(name, ..., alias_of=original): `name` registered over the memory of the allocate()d
// `original` (an exact alias: the subscriber writes it once); returns the original's view.
nb::object AllocateAlias(PySubscriber& self, const std::string& name, DType dtype,
                         const std::vector<int64_t>& shape, const Device& device,
                         nb::handle alias_arg) {
  const std::string original = Utf8Arg(alias_arg, "alias_of");
  auto it = self.allocated.find(original);
  nb::str original_key(original.c_str(), original.size());
  if (it == self.allocated.end() || !self.owned_index.contains(original_key)) {
    ThrowIfError(Status::InvalidArgument("allocate('", name, "', alias_of='", original, "'): '",
                                         original,
                                         "' is no allocate()d tensor of this subscriber "
                                         "(allocate the original first)"));
  }
  const TensorView& v = it->second;
  if (v.dtype != dtype || v.shape != shape || v.device != device) {
    ThrowIfError(Status::InvalidArgument("allocate('", name, "', alias_of='", original,
                                         "'): an alias shares its original's memory, ",
                                         DTypeName(v.dtype), " ", ShapeString(v.shape), " on ",
                                         DeviceString(v.device), ", not ", DTypeName(dtype), " ",
                                         ShapeString(shape), " on ", DeviceString(device)));
  }
  const TensorView registered = v;  // `allocated` may rehash below
  ThrowIfError(self.subscriber->Register({{name, registered}}));
  nb::object view = nb::borrow(self.owned[nb::cast<size_t>(self.owned_index[original_key])])[1];
  self.Keep(name, nb::object(), nb::make_tuple(nb::str(name.c_str(), name.size()), view));
  self.allocated[name] = registered;
  return view;
}

// UpdateStats.converted_on as Python shows it.
std::string ConvertedOnText(const UpdateStats& s) {
  const std::string device = "cuda:" + std::to_string(s.converted_device);
  switch (s.converted_on) {
    case ConvertedOn::kNone:
      return "";
    case ConvertedOn::kHost:
      return "host";
    case ConvertedOn::kDestinationGpu:
      return device;
    case ConvertedOn::kPublisherGpu:
      return device + " (publisher's GPU)";
  }
  return std::string(ConvertedOnName(s.converted_on));
}

}  // namespace

void BindSubscriber(nb::module_& m) {
  nb::class_<UpdateStats>(m, "UpdateStats", "What one Subscriber.update() did (read-only).")
      .def_ro("step", &UpdateStats::step, "Version now committed.")
      .def_ro("bytes", &UpdateStats::bytes, "Bytes moved into destinations.")
      .def_ro("tensors", &UpdateStats::tensors)
      .def_ro("seconds", &UpdateStats::seconds, "Wall time of the whole update.")
      .def_ro("gbps", &UpdateStats::gbps, "bytes / seconds / 1e9")
      .def_ro("prepare_seconds", &UpdateStats::prepare_seconds,
              "Connect + handshake + plan + map (0 when the handle was reused).")
      .def_ro("wait_seconds", &UpdateStats::wait_seconds, "Waiting for the step.")
      .def_ro("copy_seconds", &UpdateStats::copy_seconds)
      .def_ro("verify_seconds", &UpdateStats::verify_seconds)
      .def_ro("commit_seconds", &UpdateStats::commit_seconds, "Shadow → destinations (staged).")
      .def_ro("handle_created", &UpdateStats::handle_created,
              "True if this update prepared a new transfer handle.")
      .def_ro("prepare_count", &UpdateStats::prepare_count)
      .def_ro("verified", &UpdateStats::verified, "Every segment matched its digest.")
      .def_ro("up_to_date", &UpdateStats::up_to_date,
              "The latest step was already committed; nothing moved.")
      .def_prop_ro(
          "lineage", [](const UpdateStats& s) { return Utf8Out(s.lineage.view()); },
          "The publisher's lineage of the committed version (PublisherOptions.lineage).")
      .def_prop_ro(
          "path", [](const UpdateStats& s) { return std::string(s.path); },
          "The data path the bytes took, as the path table names it: 'shm', 'host-to-gpu',\n"
          "'gpu-to-host', 'cuda-ipc', 'tcp' or 'nccl'.")
      .def_ro("lineage_changed", &UpdateStats::lineage_changed,
              "This update replaced a version of another publisher session (a restarted\n"
              "trainer, or a new lineage).")
      .def_ro("staging_bytes", &UpdateStats::staging_bytes,
              "Bytes of staging this subscriber holds to receive (host or device memory): the\n"
              "shadow in 'staged' mode; in 'in_place' only the landing buffer of converted\n"
              "tensors (0 without). Held until sleep(), close() or a failed update.")
      .def_ro("delta_base_step", &UpdateStats::delta_base_step,
              "Delta updates (docs/deltas.md): the committed step the changes were applied to;\n"
              "-1: no base, every byte came whole (a step sent against a base may still carry\n"
              "every segment whole: delta_segments 0).")
      .def_ro("delta_segments", &UpdateStats::delta_segments,
              "Digest segments that came as deltas.")
      .def_ro("received_bytes", &UpdateStats::received_bytes,
              "Bytes that came for the tensors: deltas plus whole segments (== bytes without\n"
              "deltas).")
      .def_ro("weights_checked", &UpdateStats::weights_checked,
              "update(check_weights=True): the destinations' memory matched the committed\n"
              "version.")
      .def_ro("check_seconds", &UpdateStats::check_seconds, "The weights check's wall time.")
      .def_ro("served_step", &UpdateStats::served_step,
              "A relay (serve_endpoint): the step it serves after this update (-1 before it\n"
              "serves any; after a failed hand-over, logged with its cause, the step it served\n"
              "before, or -1 when it failed while replacing its serving publisher).")
      .def_ro("serve_seconds", &UpdateStats::serve_seconds,
              "A relay: the time taken to hand the version to its store.")
      .def_ro("converted_tensors", &UpdateStats::converted_tensors,
              "convert_dtypes: tensors this update converted in flight (casts, fp8 blocks,\n"
              "MXFP8, NVFP4); 0 when nothing moved.")
      .def_ro("converted_bytes", &UpdateStats::converted_bytes,
              "The bytes those tensors were published in.")
      .def_prop_ro(
          "converted_on", [](const UpdateStats& s) { return ConvertedOnText(s); },
          "Where the conversions ran: 'host', 'cuda:N' (the destinations' GPU),\n"
          "'cuda:N (publisher's GPU)' (only converted bytes crossed the link), or '' (none).")
      .def_ro("converted_device", &UpdateStats::converted_device,
              "The CUDA device that converted (-1: none, or the host).")
      .def("__repr__", [](const UpdateStats& s) {
        auto b = [](bool v) { return v ? "True" : "False"; };
        return "UpdateStats(step=" + std::to_string(s.step) + ", bytes=" + std::to_string(s.bytes) +
               ", tensors=" + std::to_string(s.tensors) + ", seconds=" + std::to_string(s.seconds) +
               ", gbps=" + std::to_string(s.gbps) + ", handle_created=" + b(s.handle_created) +
               ", prepare_count=" + std::to_string(s.prepare_count) +
               ", verified=" + b(s.verified) + ", up_to_date=" + b(s.up_to_date) + ", path='" +
               std::string(s.path) + "'" + ", lineage='" + std::string(s.lineage.view()) +
               "', lineage_changed=" + b(s.lineage_changed) +
               ", staging_bytes=" + std::to_string(s.staging_bytes) +
               ", delta_base_step=" + std::to_string(s.delta_base_step) +
               ", received_bytes=" + std::to_string(s.received_bytes) +
               (s.served_step >= 0 ? ", served_step=" + std::to_string(s.served_step) : "") +
               (s.converted_tensors > 0
                    ? ", converted_tensors=" + std::to_string(s.converted_tensors) +
                          ", converted_bytes=" + std::to_string(s.converted_bytes) +
                          ", converted_on='" + ConvertedOnText(s) + "'"
                    : "") +
               ")";
      });

  nb::class_<WeightsCheck>(m, "WeightsCheck",
                           "What Subscriber.check_weights() compared (read-only).")
      .def_ro("step", &WeightsCheck::step, "The committed step checked against.")
      .def_ro("tensors", &WeightsCheck::tensors, "Destinations every byte of which was checked.")
      .def_ro("bytes", &WeightsCheck::bytes, "Bytes digested.")
      .def_ro("unchecked_tensors", &WeightsCheck::unchecked_tensors,
              "Destinations holding bytes no digest describes (converted in flight, or filled\n"
              "from parts of digest segments).")
      .def_ro("seconds", &WeightsCheck::seconds)
      .def("__repr__", [](const WeightsCheck& c) {
        return "WeightsCheck(step=" + std::to_string(c.step) +
               ", tensors=" + std::to_string(c.tensors) + ", bytes=" + std::to_string(c.bytes) +
               ", unchecked_tensors=" + std::to_string(c.unchecked_tensors) +
               ", seconds=" + std::to_string(c.seconds) + ")";
      });

  nb::class_<Received>(m, "Received",
                       "What Subscriber.receive() returns: an iterator over the allocate()d\n"
                       "(name, tensor) pairs, with the UpdateStats of the update in .stats.")
      .def_ro("stats", &Received::stats, "The UpdateStats of the update that filled the tensors.")
      .def(
          "__iter__", [](nb::handle self) { return nb::borrow(self); },
          nb::sig("def __iter__(self) -> Received"))
      .def(
          "__next__",
          [](Received& r) -> nb::object {
            if (r.next >= nb::len(r.pairs)) throw nb::stop_iteration();
            return r.pairs[r.next++];
          },
          nb::sig("def __next__(self) -> tuple[str, typing.Any]"))
      .def("__repr__", [](const Received& r) {
        return "Received(step=" + std::to_string(r.stats.step) + ", " +
               std::to_string(nb::len(r.pairs)) + " tensors)";
      });

  nb::class_<PySubscriber>(
      m, "Subscriber",
      "Applies published weight versions into tensors you own (register()) or that it owns\n"
      "(allocate(), receive()). Connects lazily at the first update().")
      .def(
          "__init__",
          [](PySubscriber* self, nb::handle endpoint_arg, const std::string& mode,
             const std::string& policy, double timeout, bool verify, int copy_threads,
             bool convert_dtypes, bool convert_on_publisher_gpu, const std::string& lineage_policy,
             nb::handle token, nb::handle token_file, bool delta, nb::handle serve_endpoint,
             int serve_max_direct, nb::handle serve_announce, nb::handle locality) {
            SubscriberOptions o;
            o.delta = delta;
            o.serve_endpoint = Utf8Arg(serve_endpoint, "serve_endpoint");
            o.serve_max_direct = serve_max_direct;
            o.serve_announce = Utf8Arg(serve_announce, "serve_announce");
            o.locality = Utf8Arg(locality, "locality");
            o.token = Utf8Arg(token, "token");
            o.token_file = Utf8Arg(token_file, "token_file");
            std::string endpoint;
            if (nb::isinstance<nb::str>(endpoint_arg)) {
              o.endpoint = Utf8Arg(endpoint_arg, "endpoint");
              endpoint = o.endpoint;
            } else {
              // Several publishers (e.g. one per trainer rank), each holding part of the model.
              for (nb::handle item : nb::iter(endpoint_arg)) {
                if (!nb::isinstance<nb::str>(item)) {
                  throw nb::type_error("endpoint: expected a str or a sequence of str");
                }
                o.endpoints.push_back(Utf8Arg(item, "endpoint"));
                endpoint += (endpoint.empty() ? "" : ", ") + o.endpoints.back();
              }
              if (o.endpoints.empty()) throw nb::value_error("endpoint: empty sequence");
            }
            o.mode = ModeArg(mode);
            o.policy = PolicyArg(policy);
            o.timeout = TimeoutArg(timeout, "timeout");
            o.verify = verify;
            o.copy_threads = copy_threads;
            o.convert_dtypes = convert_dtypes;
            o.convert_on_publisher_gpu = convert_on_publisher_gpu;
            o.lineage_policy = LineagePolicyArg(lineage_policy);
            std::unique_ptr<Subscriber> s = ThrowIfError(Subscriber::Create(o));
            new (self) PySubscriber();
            self->subscriber = std::move(s);
            self->endpoint = endpoint;
          },
          // Defaults are the C++ options' own (test_stubs.py checks the signature text says them).
          "endpoint"_a, "mode"_a = ModeName(kSubscriberDefaults.mode),
          "policy"_a = PolicyName(kSubscriberDefaults.policy),
          "timeout"_a = Seconds(kSubscriberDefaults.timeout),
          "verify"_a = kSubscriberDefaults.verify,
          "copy_threads"_a = kSubscriberDefaults.copy_threads,
          "convert_dtypes"_a = kSubscriberDefaults.convert_dtypes,
          "convert_on_publisher_gpu"_a = kSubscriberDefaults.convert_on_publisher_gpu,
          "lineage_policy"_a = LineagePolicyName(kSubscriberDefaults.lineage_policy),
          "token"_a = kSubscriberDefaults.token, "token_file"_a = kSubscriberDefaults.token_file,
          "delta"_a = kSubscriberDefaults.delta,
          "serve_endpoint"_a = kSubscriberDefaults.serve_endpoint,
          "serve_max_direct"_a = kSubscriberDefaults.serve_max_direct,
          "serve_announce"_a = kSubscriberDefaults.serve_announce,
          "locality"_a = kSubscriberDefaults.locality,
          nb::sig("def __init__(self, endpoint: str | typing.Sequence[str], mode: "
                  "typing.Literal['staged', 'in_place'] "
                  "= 'staged', policy: typing.Literal['strict', 'subset'] = 'strict', "
                  "timeout: float = 10.0, verify: bool = False, copy_threads: int = 0, "
                  "convert_dtypes: bool = False, convert_on_publisher_gpu: bool = False, "
                  "lineage_policy: typing.Literal['follow', 'strict'] = 'follow', "
                  "token: str = '', token_file: str = '', delta: bool = True, "
                  "serve_endpoint: str = '', serve_max_direct: int = 0, serve_announce: str = '', "
                  "locality: str = '') -> None"),
          "endpoint: 'local://NAME' or 'tcp://HOST:PORT', or a list of them when several\n"
          "publishers (e.g. trainer ranks) each hold part of the model: every tensor then\n"
          "comes from exactly one of them, and no share is committed before all arrived.\n"
          "mode: 'staged' (receive into a shadow buffer, then commit: old weights untouched on\n"
          "failure) or 'in_place' (no extra memory; a failure marks weights invalid).\n"
          "policy: 'strict' (same names on both sides) or 'subset' (a subset of the\n"
          "publisher's). timeout: seconds for each update, end to end. verify: check xxHash3\n"
          "digests before committing (per update overridable). convert_dtypes: let a\n"
          "destination's dtype differ where weightsync converts in flight (casts among\n"
          "float32/float16/bfloat16; bfloat16 -> float8_e4m3fn with block scales in NAME +\n"
          "'_scale_inv'); see docs/gpu.md. convert_on_publisher_gpu: in place over cuda-ipc,\n"
          "run those conversions on the publisher's GPU when this process can use it (only\n"
          "the converted bytes cross the link; costs a CUDA context and SM time on that GPU).\n"
          "lineage_policy: after the publisher restarts (a new session), 'follow' applies its\n"
          "latest step whatever its number; 'strict' applies a restart of the same lineage only\n"
          "once its steps pass the committed one and refuses another lineage (FailedPrecondition)\n"
          "until update(accept_new_lineage=True). delta (tcp, docs/deltas.md): when the\n"
          "weights hold exactly the committed version, receive only what changed since it\n"
          "(proven against its digests; anything else comes whole). token / token_file (tcp): the "
          "publisher's\n"
          "shared secret, or a 0600 file holding it; '' for both: $WEIGHTSYNC_TOKEN_FILE or\n"
          "$WEIGHTSYNC_TOKEN. serve_endpoint (docs/relays.md): 'local://NAME' or\n"
          "'tcp://HOST:PORT' makes this subscriber a relay: it also serves each version it\n"
          "commits there, under the trainer's lineage and digests, to subscribers that dial it\n"
          "as they would the trainer (one publisher, every tensor registered whole in host\n"
          "memory; two copies of the model in host memory). serve_max_direct: a relay's own\n"
          "bound on direct children (as Publisher's max_direct; 0: no bound). serve_announce:\n"
          "the endpoint it is announced by to its publisher, which redirects newcomers there\n"
          "('': serve_endpoint as bound, unless a wildcard address). Both need serve_endpoint.\n"
          "locality: where this subscriber runs, as you label it (a host, a rack; <= 64\n"
          "printable characters): a publisher past its max_direct redirects it to a relay of the\n"
          "same locality first.")
      .def(
          "register",
          [](PySubscriber& self, nb::handle tensors, nb::handle dtypes, nb::handle regions,
             nb::handle quantization) {
            std::vector<ImportedTensor> imported = ImportTensors(tensors, dtypes, true);
            ApplyRegions(regions, &imported);
            ApplyQuantization(quantization, &imported);
            std::vector<NamedTensor> views;
            for (const auto& t : imported) views.push_back(t.tensor);
            ThrowIfError(self.subscriber->Register(views));
            for (auto& t : imported) {
              self.Keep(t.tensor.name, nb::cast(std::move(t.keep)), nb::object());
            }
          },
          "tensors"_a, "dtypes"_a = nb::none(), "regions"_a = nb::none(),
          "quantization"_a = nb::none(),
          nb::sig("def register(self, tensors: collections.abc.Mapping[str, typing.Any] | "
                  "collections.abc.Iterable[tuple[str, typing.Any]], dtypes: "
                  "collections.abc.Mapping[str, typing.Any] | None = None, regions: "
                  "collections.abc.Mapping[str, typing.Any] | None = None, quantization: "
                  "collections.abc.Mapping[str, typing.Any] | None = None) -> None"),
          "Registers writable, C-contiguous tensors (any __dlpack__ producer on the CPU or a\n"
          "CUDA device, or a NumPy array) as destinations, by name. Updates write them in place\n"
          "(addresses never change) and return with the bytes in place, so any CUDA stream may\n"
          "read them then; the Subscriber keeps them alive. Before the first update or after\n"
          "sleep() (or a failed update); a name registered before takes the new tensor, and the\n"
          "next update writes every destination. Destinations must not share memory, except\n"
          "exact aliases (tied weights: the same memory, dtype and shape under two names), which\n"
          "are written once. `dtypes` maps names to an element type for tensors passed as raw\n"
          "bits. regions: name → the region(s) of global tensors that fill that destination (a\n"
          "sharded engine's slice, or a fused parameter such as qkv_proj; weightsync.regions\n"
          "builds them): only those bytes move, from whichever publisher holds them.\n"
          "quantization (convert_dtypes=True; docs/quantized.md): name → 'mxfp8' or 'nvfp4', or\n"
          "a dict {'format', 'scale_layout': 'row_major' | 'swizzled_128x4', 'scales': name,\n"
          "'global_scale': name}: the destination holds block-scaled values; its scales (default\n"
          "NAME + fp8_scale_suffix) and NVFP4's float32 global scale (default NAME + '_scale_2')\n"
          "are registered in the same or an earlier call.")
      .def(
          "unregister",
          [](PySubscriber& self, nb::handle names) {
            std::vector<std::string> list;
            if (nb::isinstance<nb::str>(names)) {
              list.push_back(Utf8Arg(names, "tensor name"));
            } else {
              for (nb::handle n : names) list.push_back(Utf8Arg(n, "tensor name"));
            }
            ThrowIfError(self.subscriber->Unregister(list));
            self.Forget(list);
          },
          "names"_a,
          nb::sig("def unregister(self, names: str | collections.abc.Iterable[str]) -> None"),
          "Forgets the named destinations (registered or allocate()d), before the first update\n"
          "or after sleep(); the next update no longer writes them. NotFound (a LookupError)\n"
          "lists unknown names, and nothing is removed then.")
      .def(
          "allocate",
          [](PySubscriber& self, nb::handle name_arg, nb::handle dtype, nb::handle shape,
             nb::handle framework_arg, nb::handle device_arg, nb::handle alias_arg) {
            const std::string name = Utf8Arg(name_arg, "tensor name");
            DType dt = DTypeArg(dtype);
            std::vector<int64_t> dims = ShapeArg(shape);
            const Framework framework = FrameworkArg(framework_arg);
            const Device device = DeviceArg(device_arg);
            // Negative dims, overflow: the library's rules, before NumPy sees them.
            ThrowIfError(TensorView{nullptr, dt, dims}.NumBytes());
            if (!alias_arg.is_none()) return AllocateAlias(self, name, dt, dims, device, alias_arg);
            if (device.is_cuda()) {
              // Device memory of its own (weightsync::DeviceMemory), owned by the views' base:
              // buffer and view first, registration last, as on the CPU.
              DeviceTensor t = AllocateDeviceTensor(name, dt, dims, framework, device);
              nb::object entry = nb::make_tuple(nb::str(name.c_str(), name.size()), t.view);
              const TensorView registered{t.data, dt, dims, device};
              ThrowIfError(self.subscriber->Register({{name, registered}}));
              self.Keep(name, nb::object(), entry);
              self.allocated[name] = registered;
              return t.view;
            }
            // Buffer and view first, registration last: a failure leaves nothing registered.
            auto [raw_dtype, raw_shape] = RawLayout(dt, dims);
            nb::list raw_dims;
            for (int64_t d : raw_shape) raw_dims.append(d);
            std::string_view raw_name = DTypeName(raw_dtype);
            nb::object raw = nb::module_::import_("numpy").attr("zeros")(
                nb::tuple(raw_dims), nb::str(raw_name.data(), raw_name.size()));
            nb::ndarray<> raw_array = nb::cast<nb::ndarray<>>(raw, /*convert=*/false);
            nb::object view = ArrayView(raw_array.data(), dt, dims, raw, framework);
            nb::object entry = nb::make_tuple(nb::str(name.c_str(), name.size()), view);
            const TensorView registered{raw_array.data(), dt, dims};
            ThrowIfError(self.subscriber->Register({{name, registered}}));
            self.Keep(name, nb::object(), entry);
            self.allocated[name] = registered;
            return view;
          },
          "name"_a, "dtype"_a, "shape"_a, "framework"_a = "numpy", "device"_a = nb::none(),
          "alias_of"_a = nb::none(),
          nb::sig("def allocate(self, name: str, dtype: str | numpy.dtype | type, shape: int | "
                  "collections.abc.Sequence[int], framework: typing.Literal['numpy', 'torch', "
                  "'cupy', 'dlpack'] = 'numpy', device: str | int | typing.Any | None = None, "
                  "alias_of: str | None = None) -> typing.Any"),
          "Creates a zero-filled destination the Subscriber owns and registers it; returns a view\n"
          "of it (the same object receive() yields every step, updated in place). framework:\n"
          "'numpy' (bfloat16/float8 as ml_dtypes arrays when ml_dtypes is installed, else raw\n"
          "uint16/uint8 bits), 'torch' (a torch.Tensor of the dtype itself, e.g. bfloat16,\n"
          "float8_e4m3fn), 'cupy' (a cupy.ndarray) or 'dlpack' (an object any DLPack consumer\n"
          "imports: torch.from_dlpack, cupy.from_dlpack, np.from_dlpack, jax.dlpack.from_dlpack).\n"
          "device: None or 'cpu' (host memory), 'cuda:N' / 'cuda' (= 'cuda:0') / N / a\n"
          "torch.device: device memory allocated once (cudaMalloc), freed when the last view of\n"
          "it and the subscriber are gone (not 'numpy'). Zero-copy. alias_of: the name of an\n"
          "allocate()d tensor of the same dtype, shape and device whose memory this name shares\n"
          "(tied weights: published_manifest() says which names are one tensor); returns that\n"
          "tensor's view, and updates move the bytes once. A failed allocate() registers nothing.")
      .def("update", &PySubscriber::Update, "step"_a = nb::none(), "verify"_a = nb::none(),
           "accept_new_lineage"_a = false, "check_weights"_a = false,
           "Applies version `step` (None: the latest) and returns its UpdateStats. Blocks until\n"
           "the step is published, up to `timeout`; the GIL is released meanwhile and Ctrl-C\n"
           "interrupts it within ~50 ms (see docs/python.md for what that leaves behind; an\n"
           "interrupt during the commit raises after it, with .update_stats on the exception).\n"
           "accept_new_lineage: with lineage_policy='strict', follow the publisher into a new\n"
           "lineage (or a restart whose steps are not newer) instead of refusing it.\n"
           "check_weights: then check_weights(): a difference raises Corruption naming every\n"
           "tensor that differs, and the weights are marked invalid.")
      .def(
          "receive",
          [](PySubscriber& self, std::optional<int64_t> step, std::optional<bool> verify,
             bool accept_new_lineage, bool check_weights) {
            if (nb::len(self.owned) == 0) {
              ThrowIfError(Status::FailedPrecondition(
                  "receive() yields the tensors created with Subscriber.allocate(); there are "
                  "none (use update() for tensors you register)"));
            }
            return Received{self.Update(step, verify, accept_new_lineage, check_weights),
                            self.owned};
          },
          "step"_a = nb::none(), "verify"_a = nb::none(), "accept_new_lineage"_a = false,
          "check_weights"_a = false,
          nb::sig("def receive(self, step: int | None = None, verify: bool | None = None, "
                  "accept_new_lineage: bool = False, check_weights: bool = False) -> Received"),
          "update(step) into the allocate()d tensors, then iterate (name, tensor) pairs for an\n"
          "engine's own loader (e.g. model.load_weights(sub.receive())); the result's .stats is\n"
          "the update's UpdateStats. The tensors are created once, by allocate(): every step\n"
          "yields the same objects, updated in place.")
      .def(
          "published_manifest",
          [](PySubscriber& self) {
            Result<Manifest> m = [&] {
              nb::gil_scoped_release release;
              return self.subscriber->PublishedManifest();
            }();
            return ManifestList(ThrowIfError(std::move(m)));
          },
          nb::sig("def published_manifest(self) -> list[weightsync.PublishedTensor]"),
          "(name, dtype name, shape) of every tensor the publisher(s) publish, read over a\n"
          "short-lived connection without preparing: what an allocate() loop needs to mirror\n"
          "them. Several publishers: the union, each name once. Each entry unpacks as that\n"
          "3-tuple; its .alias_of names the earlier tensor whose bytes it is when the publisher\n"
          "serves one tensor under two names (tied weights), else None: allocate(...,\n"
          "alias_of=entry.alias_of) then moves those bytes once.")
      .def(
          "check_weights",
          [](PySubscriber& self) {
            nb::gil_scoped_release release;
            return ThrowIfError(self.subscriber->CheckWeights());
          },
          "Digests the destinations' own memory (the engine's weights as they are now; the GPU\n"
          "digest kernels for CUDA tensors) and compares it with the publisher's digests of the\n"
          "committed version. Corruption names every tensor that differs; the weights are then\n"
          "marked invalid and the next update() rewrites every destination, even at the\n"
          "committed step. Needs the prepared handle (FailedPrecondition before the first\n"
          "update or after sleep()). Returns a WeightsCheck.")
      .def(
          "sleep",
          [](PySubscriber& self) {
            nb::gil_scoped_release release;
            ThrowIfError(self.subscriber->Sleep());
          },
          "Releases the transfer handle (mapping, connection, staging); the next update\n"
          "re-prepares. Call before freeing or replacing destination memory.")
      .def("close", &PySubscriber::Close, "Releases everything. Idempotent.")
      .def_prop_ro(
          "committed_step", [](PySubscriber& self) { return self.subscriber->committed_step(); },
          "The committed step, -1 before the first successful update.")
      .def_prop_ro(
          "weights_valid", [](PySubscriber& self) { return self.subscriber->weights_valid(); },
          "False after a failed in_place update, until the next successful one.")
      .def_prop_ro(
          "committed_lineage",
          [](PySubscriber& self) { return Utf8Out(self.subscriber->committed_lineage()); },
          "The publisher's lineage of the committed version ('' before the first update).")
      .def_prop_ro("endpoint", [](PySubscriber& self) { return self.endpoint; })
      .def(
          "served_members", [](PySubscriber& self) { return self.subscriber->ServedMembers(); },
          "A relay's children connected now (as Publisher.members()); [] otherwise.")
      .def(
          "served_tree", [](PySubscriber& self) { return self.subscriber->ServedTree(); },
          "A relay's whole subtree (as Publisher.tree()); [] otherwise.")
      .def_prop_ro(
          "serve_endpoint", [](PySubscriber& self) { return self.subscriber->serve_endpoint(); },
          "A relay's endpoint as bound (tcp://HOST:0 with its port); '' when it serves nothing.")
      .def("__repr__",
           [](PySubscriber& self) {
             return "Subscriber('" + self.endpoint +
                    "', committed_step=" + std::to_string(self.subscriber->committed_step()) +
                    (self.closed ? ", closed)" : ")");
           })
      .def(
          "__enter__", [](nb::handle self) { return nb::borrow(self); },
          nb::sig("def __enter__(self) -> typing.Self"))
      .def(
          "__exit__", [](PySubscriber& self, nb::args) { self.Close(); },
          nb::sig("def __exit__(self, *args: object) -> None"));
}

}  // namespace weightsync::python
