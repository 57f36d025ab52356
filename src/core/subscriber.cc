#include "weightsync/subscriber.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <span>
#include <sstream>
#include <type_traits>
#include <unordered_map>

#include "core/destination_set.h"
#include "core/relay_serve.h"
#include "core/subtree_reporter.h"
#include "core/weights_check.h"
#include "cuda/vmm.h"
#include "plan/mismatch_list.h"
#include "plan/plan.h"
#include "plan/published_manifest.h"
#include "plan/regions.h"
#include "plan/schedule.h"
#include "plan/subscriber_regions.h"
#include "transport/link/endpoint.h"
#include "transport/transport.h"
#include "util/deadline.h"
#include "util/fail_point.h"
#include "util/logging.h"
#include "util/mutex.h"
#include "util/worker_pool.h"

namespace weightsync {

using util::Deadline;
using Clock = std::chrono::steady_clock;

namespace {
// A relay's subtree changes in bursts (a step reaching each child): one report upward for what
// changed within this (docs/relays.md, "Membership").
constexpr std::chrono::milliseconds kReportCoalesce{20};
// A members report is one small frame into the socket's buffer.
constexpr std::chrono::milliseconds kReportBound{2000};

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The GPU transports switch the calling thread's current CUDA device (to the destinations', or
// the publisher's); a call that may touch a GPU gives the caller its own device back on return.
class CallerDevice {
 public:
  explicit CallerDevice(bool gpu) {
    if (gpu) saved_.emplace();
  }

 private:
  std::optional<cuda::ScopedDevice> saved_;
};
}  // namespace

// One publisher feeding this subscriber and its transfer handle.
struct Source {
  std::string name;  // the endpoint as the user wrote it
  transport::link::Endpoint endpoint;
  std::unique_ptr<transport::TransferHandle> handle;
  // With several publishers: the share of the destinations this one delivers (the handle's plan
  // indexes into it, so it lives as long as the handle).
  std::vector<plan::Destination> share;
  std::vector<uint32_t> share_at;  // per share entry, its index among the registered ones
  // With regions: this publisher's part of the region schedule (held = its Welcome's tensors).
  std::vector<plan::RegionCopy> copies;
  std::span<const uint64_t> digests;  // from EndStep, valid until the next BeginStep
  Status status;                      // of the last per-source phase run on the pool
  // The publisher's identity and layout, from connecting (valid while `handle` lives).
  const wire::Welcome* welcome = nullptr;
  // Whose version this source last delivered into a committed update: its session and lineage.
  uint64_t committed_session = 0;
  std::string committed_lineage;
  // A relay this source's handle lost a step through (dead or stalled): its next Hello asks the
  // publisher not to redirect it there again (docs/relays.md). Kept until another is lost.
  std::string avoid;
  // The publisher's digests of the committed version (for CheckWeights): copied at each commit
  // (the capacity kept, so a steady update allocates nothing), kept across Sleep() — a handle
  // prepared again for the same session and step serves the same version.
  std::vector<uint64_t> committed_digests;
};

// What the committed version is to the publishers now prepared.
enum class Held : uint8_t {
  kNothing,       // nothing committed yet
  kSameSession,   // a version of these very publisher sessions: steps compare
  kRestarted,     // a version of an earlier session of the same lineage (a restarted trainer)
  kOtherLineage,  // a version of another lineage
};

struct Subscriber::Impl {
  // The reporter's thread uses everything below: it ends before any of it goes (Close() stops it
  // too, before it takes update_mu).
  ~Impl() {
    if (reporter) reporter->Stop();
  }
  SubscriberOptions options;
  std::string sources_text;  // "local://a" or "local://a, local://b" for error context

  // One update at a time, held for the whole update, and by every call that changes what an
  // update uses (Register, Sleep, Close, ...). The sources' handles are driven from the pool's
  // threads during an update, on behalf of the thread holding it.
  util::Mutex update_mu;
  std::vector<Source> sources WS_GUARDED_BY(update_mu);
  core::DestinationSet registered WS_GUARDED_BY(update_mu);  // what Register/Unregister left
  // The registration changed since the last commit: the destinations do not all hold the
  // committed version, so the next update moves every byte even if the step is the same.
  bool registration_changed WS_GUARDED_BY(update_mu) = false;
  // A weights check found destinations that differ from the committed version: like a changed
  // registration, the next update moves every byte, even at the committed step.
  bool weights_differ WS_GUARDED_BY(update_mu) = false;
  // The prepared state: the sources that deliver something (each with its transfer handle:
  // connection, mappings, plan, staging, workers) and, with several, one thread per source so
  // their links carry their shares at the same time.
  bool prepared WS_GUARDED_BY(update_mu) = false;
  // The prepared handles were planned from a region schedule (some tensor is a region on either
  // side), and whether that plan can verify every segment (see plan/region_plan.h).
  bool regions WS_GUARDED_BY(update_mu) = false;
  bool prepared_for_verify WS_GUARDED_BY(update_mu) = false;
  std::vector<Source*> active WS_GUARDED_BY(update_mu);
  std::unique_ptr<util::WorkerPool> pool WS_GUARDED_BY(update_mu);
  bool closed WS_GUARDED_BY(update_mu) = false;
  uint64_t prepare_count WS_GUARDED_BY(update_mu) = 0;
  // A relay reports its subtree upward between its updates too (core/subtree_reporter.h); set at
  // Create, stopped by Close(). Declared before `relay`, whose serving publisher tells it of
  // changes, so that it outlives the relay.
  std::unique_ptr<core::SubtreeReporter> reporter;
  // A report that could not be sent may have left part of a frame on the connection: the next
  // update prepares anew before asking for a step.
  bool report_failed WS_GUARDED_BY(update_mu) = false;
  // What the last report said (its handles' prepare_count and held step): an up-to-date update of
  // a leaf, or of a relay whose subtree did not change, reports nothing new.
  uint64_t reported_prepare WS_GUARDED_BY(update_mu) = 0;
  uint64_t reported_changes WS_GUARDED_BY(update_mu) = 0;
  int64_t reported_held WS_GUARDED_BY(update_mu) = -2;
  wire::MembersReport report WS_GUARDED_BY(update_mu);
  // A relay (SubscriberOptions::serve_endpoint): serves each committed version to children.
  std::unique_ptr<core::RelayServe> relay WS_GUARDED_BY(update_mu);
  std::string serve_endpoint;  // as bound at Create; constant after
  // The endpoint it is announced by in its Hello (SubscriberOptions::serve_announce); empty: not
  // announced. Constant after Create.
  std::string announce;
  core::RelayServe* serving =
      nullptr;  // `relay`, for ServedMembers(): set at Create, then constant
  void ServeCommitted(UpdateStats* stats, bool moved, const Deadline& deadline)
      WS_REQUIRES(update_mu);

  std::atomic<bool> cancel{false};  // set by Cancel() and Close(), cleared when an update starts
  // Set by Close() before it waits for update_mu: an update that clears `cancel` after Close set
  // it sees this instead (both sequentially consistent), so no update outlives a Close for long.
  std::atomic<bool> closing{false};
  // Clears a Cancel() from before this call; FailedPrecondition once Close() began.
  Status StartCancellable() {
    cancel.store(false);
    if (closing.load()) return Status::FailedPrecondition("subscriber is closed");
    return Status::Ok();
  }
  // Written under update_mu; atomic because committed_step()/weights_valid() read them from any
  // thread (e.g. Python while its worker thread updates).
  std::atomic<int64_t> committed{-1};
  std::atomic<bool> valid{true};
  mutable util::Mutex lineage_mu;
  std::string committed_lineage WS_GUARDED_BY(lineage_mu);  // the first active source's

  // Takes update_mu for a user's call (Update, Register, Sleep, ...); false: another call holds
  // it (the caller answers Busy). The reporter holds it only for one report: that is waited for.
  // `report_gate` makes "the reporter holds it" exact: the reporter takes update_mu and says so,
  // and says so no more and lets it go, each under the gate.
  bool TryLockForCall() WS_TRY_ACQUIRE(true, update_mu) {
    if (update_mu.TryLock()) return true;
    {
      util::MutexLock gate(&report_gate);
      if (update_mu.TryLock()) return true;
      if (!reporting) return false;
    }
    update_mu.Lock();
    return true;
  }
  util::Mutex report_gate;
  bool reporting WS_GUARDED_BY(report_gate) = false;
  // Tells each publisher the step committed and, a relay, its subtree (docs/relays.md,
  // "Membership"); `between_updates`: sent by the reporter (always; its own deadline, which
  // Cancel() does not end), else at the end of an update (when something changed).
  void ReportMembers(bool between_updates) WS_REQUIRES(update_mu);
  // The reporter's send: false when a call holds update_mu.
  bool ReportBetweenUpdates();
  Status ReleaseHandles(std::string_view why) WS_REQUIRES(update_mu);
  // A step failed: each source reached through a relay asks not to be sent to that relay again.
  void AvoidRelays() WS_REQUIRES(update_mu) {
    for (Source& source : sources) {
      if (source.handle && !source.handle->relay().empty()) source.avoid = source.handle->relay();
    }
  }
  plan::ConvertOptions Convert() const {
    return {options.convert_dtypes, options.fp8_scale_suffix, options.convert_on_publisher_gpu};
  }
  Status CheckCanRegister(const char* what) const WS_REQUIRES(update_mu);
  Status Prepare(const Deadline& deadline, bool for_verify) WS_REQUIRES(update_mu);
  Status PrepareShares(const Deadline& deadline) WS_REQUIRES(update_mu);
  Status PrepareRegions(const Deadline& deadline, bool for_verify) WS_REQUIRES(update_mu);
  // Releases the handles that deliver nothing and starts one pool thread per remaining source.
  void KeepDelivering(const std::vector<bool>& delivers) WS_REQUIRES(update_mu);
  Held HeldVersion() const WS_REQUIRES(update_mu);
  Status CheckLineage(Held held, const UpdateOptions& update) const WS_REQUIRES(update_mu);
  Result<int64_t> BeginStep(std::optional<int64_t> step, int64_t after, bool delta,
                            const Deadline& deadline) WS_REQUIRES(update_mu);
  void RecordCommitted(int64_t step) WS_REQUIRES(update_mu);
  // CheckWeights against the committed version through the prepared handles; a difference marks
  // the weights invalid and makes the next update rewrite them.
  Status CheckCommitted(const Deadline& deadline, WeightsCheck* out) WS_REQUIRES(update_mu);
  // UpdateOptions::check_weights: the check of what this update committed (or found committed).
  Status CheckAfterCommit(const Deadline& deadline, UpdateStats* stats) WS_REQUIRES(update_mu) {
    WeightsCheck check;
    Status s = CheckCommitted(deadline, &check);
    stats->check_seconds = check.seconds;
    stats->weights_checked = s.ok();
    return s.WithContext("update to step " + std::to_string(stats->step) + " from " + sources_text +
                         ": weights check");
  }
  // One Update() in flight: what its phases share.
  struct UpdateRun {
    const UpdateOptions& request;
    bool verify = false;
    Deadline deadline;
    Clock::time_point t0;
    Clock::time_point t_wait;
    UpdateStats stats;
    std::string step_text;  // for error context: the step asked for, then the one served
    bool touched_destinations = false;
    Held held = Held::kNothing;
    int64_t after = -1;  // the committed step where it is one of these sessions' steps, else -1
    int64_t committed_step = -1;
  };
  Status Fail(const UpdateRun& run, const Status& s) WS_REQUIRES(update_mu);
  Result<int64_t> OpenStep(UpdateRun& run) WS_REQUIRES(update_mu);
  void LogLineageChange(const UpdateRun& run, int64_t step) const WS_REQUIRES(update_mu);
  Status MoveStep(UpdateRun& run, int64_t step) WS_REQUIRES(update_mu);
  Result<UpdateStats> Update(const UpdateOptions& update) WS_REQUIRES(update_mu);

  // Runs fn(source) for every active source, concurrently when there are several, and combines
  // the results. Allocates nothing on success.
  template <typename Fn>
  Status ForEachSource(Fn&& fn) WS_REQUIRES(update_mu);
  Status CombinedStatus() const WS_REQUIRES(update_mu);
};

template <typename Fn>
Status Subscriber::Impl::ForEachSource(Fn&& fn) {
  if (active.size() == 1) {
    Status s = fn(*active[0]);
    return s.ok() || sources.size() == 1 ? s : s.WithContext(active[0]->name);
  }
  struct Context {
    std::vector<Source*>* active;
    std::remove_reference_t<Fn>* fn;
  } context{&active, &fn};
  pool->Run(
      static_cast<uint32_t>(active.size()),
      [](void* c, uint32_t i) {
        auto* ctx = static_cast<Context*>(c);
        Source& source = *(*ctx->active)[i];
        source.status = (*ctx->fn)(source);
      },
      &context);
  return CombinedStatus();
}

// Every failing source named, in source order; the code is the first failure's.
Status Subscriber::Impl::CombinedStatus() const {
  Status first;
  std::string message;
  for (const Source* source : active) {
    if (source->status.ok()) continue;
    if (first.ok()) first = source->status;
    message += (message.empty() ? "" : "; ") + source->name + ": " + source->status.message();
  }
  return first.ok() ? first : Status(first.code(), message);
}

Subscriber::Subscriber(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Subscriber::~Subscriber() {
  if (impl_) {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "subscriber") << "cleanup: " << s;
  }
}

namespace {

// SubscriberOptions::locality travels in the Hello (wire::Hello::locality): bounded printable text.
Status CheckLocality(const std::string& locality) {
  if (locality.size() > wire::kMaxLocalityBytes) {
    return Status::InvalidArgument("SubscriberOptions.locality is ", locality.size(),
                                   " bytes, more than ", wire::kMaxLocalityBytes);
  }
  if (const int64_t i = wire::FirstUnprintable(locality); i >= 0) {
    return Status::InvalidArgument("SubscriberOptions.locality byte ", i, " is ",
                                   unsigned{static_cast<uint8_t>(locality[i])},
                                   ": printable ASCII without spaces only");
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Subscriber>> Subscriber::Create(const SubscriberOptions& options) {
  WS_RETURN_IF_ERROR(util::FailPoints::LoadFromEnv());
  if (options.timeout.count() <= 0) {
    return Status::InvalidArgument("SubscriberOptions.timeout must be > 0 ms");
  }
  if (options.serve_max_direct < 0) {
    return Status::InvalidArgument(
        "SubscriberOptions.serve_max_direct must be ≥ 0 (0: no bound), got ",
        options.serve_max_direct);
  }
  if (Status s = CheckLocality(options.locality); !s.ok()) return s;
  if (options.serve_endpoint.empty() &&
      (options.serve_max_direct != 0 || !options.serve_announce.empty())) {
    return Status::InvalidArgument(
        "SubscriberOptions.serve_max_direct and serve_announce need serve_endpoint (they shape "
        "how a relay serves)");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  {
    util::MutexLock lock(&impl->update_mu);  // nobody else sees it yet; the analysis wants it held
    std::vector<std::string> names;
    if (!options.endpoint.empty() || options.endpoints.empty()) names.push_back(options.endpoint);
    names.insert(names.end(), options.endpoints.begin(), options.endpoints.end());
    for (const std::string& name : names) {
      for (const Source& seen : impl->sources) {
        if (seen.name == name) {
          return Status::InvalidArgument("publisher endpoint '", name, "' is listed twice");
        }
      }
      Source source;
      source.name = name;
      WS_ASSIGN_OR_RETURN(source.endpoint, transport::link::ParseEndpoint(name));
      impl->sources_text += (impl->sources_text.empty() ? "" : ", ") + name;
      impl->sources.push_back(std::move(source));
    }
    if (!options.serve_endpoint.empty()) {
      if (impl->sources.size() != 1) {
        return Status::InvalidArgument("SubscriberOptions.serve_endpoint with ",
                                       impl->sources.size(),
                                       " publishers: a relay serves one publisher's versions");
      }
      WS_ASSIGN_OR_RETURN(impl->relay, core::RelayServe::Listen(options));
      impl->serve_endpoint = impl->relay->endpoint();
      impl->serving = impl->relay.get();
      WS_ASSIGN_OR_RETURN(impl->announce,
                          core::RelayServe::Announced(options, impl->serve_endpoint));
      // Last: nothing fails after its thread starts.
      Impl* d = impl.get();
      impl->reporter = std::make_unique<core::SubtreeReporter>(
          [d] { return d->ReportBetweenUpdates(); }, kReportCoalesce);
      impl->relay->OnMembersChanged([r = impl->reporter.get()] { r->Changed(); });
    }
  }
  return std::unique_ptr<Subscriber>(new Subscriber(std::move(impl)));
}

// Registration changes only while nothing points at the destinations (before the first update,
// after Sleep() or a failed update).
Status Subscriber::Impl::CheckCanRegister(const char* what) const {
  if (closed) return Status::FailedPrecondition("subscriber is closed");
  if (prepared) {
    return Status::FailedPrecondition(
        what, " while prepared: call Sleep() first so no mapping points at old memory");
  }
  return Status::Ok();
}

Status Subscriber::Register(const std::vector<NamedTensor>& tensors) {
  Impl& d = *impl_;
  if (!d.TryLockForCall()) return Status::Busy("Register() during an update");
  util::MutexLock lock(&d.update_mu, util::kAdoptLock);
  WS_RETURN_IF_ERROR(d.CheckCanRegister("Register()"));
  WS_RETURN_IF_ERROR(d.registered.Add(tensors));
  d.registration_changed = true;
  return Status::Ok();
}

Status Subscriber::Unregister(const std::vector<std::string>& names) {
  Impl& d = *impl_;
  if (!d.TryLockForCall()) return Status::Busy("Unregister() during an update");
  util::MutexLock lock(&d.update_mu, util::kAdoptLock);
  WS_RETURN_IF_ERROR(d.CheckCanRegister("Unregister()"));
  WS_RETURN_IF_ERROR(d.registered.Remove(names));
  d.registration_changed = true;
  return Status::Ok();
}

Result<Manifest> Subscriber::PublishedManifest() {
  Impl& d = *impl_;
  if (!d.TryLockForCall()) return Status::Busy("PublishedManifest() during an update");
  util::MutexLock lock(&d.update_mu, util::kAdoptLock);
  if (d.closed) return Status::FailedPrecondition("subscriber is closed");
  WS_RETURN_IF_ERROR(d.StartCancellable());
  Deadline deadline(d.options.timeout, &d.cancel);
  plan::PublishedManifest published;
  for (const Source& source : d.sources) {
    // Its own handle, released before returning: a prepared one may exist and stays untouched.
    WS_ASSIGN_OR_RETURN(auto handle, transport::NewTransferHandle(source.endpoint, d.options));
    Result<const wire::Welcome*> welcome = handle->Connect(deadline);  // validated there
    Status read = welcome.ok() ? published.Add(**welcome, source.name) : welcome.status();
    Status released = handle->Release();
    WS_RETURN_IF_ERROR(read.WithContext("reading the manifest of " + source.name));
    WS_RETURN_IF_ERROR(released.WithContext("closing the manifest connection to " + source.name));
  }
  return std::move(published).Finish();
}

Status Subscriber::Impl::ReleaseHandles(std::string_view why) {
  Status result;
  // Reverse order of creation: the pool (idle between updates), then each source's handle.
  pool.reset();
  active.clear();
  for (auto it = sources.rbegin(); it != sources.rend(); ++it) {
    if (!it->handle) continue;
    if (Status s = it->handle->Release(); !s.ok()) {
      result.Update(sources.size() > 1 ? s.WithContext(it->name) : s);
    }
    it->handle.reset();
    it->welcome = nullptr;
    it->share.clear();
    it->share_at.clear();
    it->copies.clear();
  }
  prepared = false;
  regions = false;
  if (!result.ok()) {
    WS_LOG(WARN, "subscriber") << "releasing the transfer handle (" << why << "): " << result;
  }
  return result;
}

Status Subscriber::Impl::Prepare(const Deadline& deadline, bool for_verify) {
  for (Source& source : sources) {
    WS_ASSIGN_OR_RETURN(source.handle, transport::NewTransferHandle(source.endpoint, options));
    source.handle->set_hello(announce, source.avoid);
  }
  // Every manifest first: whether a region schedule is needed depends on all of them.
  for (Source& source : sources) {
    Result<const wire::Welcome*> welcome = source.handle->Connect(deadline);
    if (!welcome.ok()) {
      return sources.size() == 1 ? welcome.status() : welcome.status().WithContext(source.name);
    }
    source.welcome = *welcome;
  }
  std::vector<const wire::Welcome*> welcomes;
  for (const Source& source : sources) welcomes.push_back(source.welcome);
  if (plan::UsesRegions(welcomes, registered.destinations())) {
    WS_RETURN_IF_ERROR(PrepareRegions(deadline, for_verify));
    regions = true;
    prepared_for_verify = for_verify;
  } else if (sources.size() == 1) {
    WS_RETURN_IF_ERROR(sources[0].handle->Prepare(
        registered.destinations(), {options.policy, options.mode, Convert()}, deadline));
    active.push_back(&sources[0]);
  } else {
    WS_RETURN_IF_ERROR(PrepareShares(deadline));
  }
  prepared = true;
  ++prepare_count;
  return Status::Ok();
}

void Subscriber::Impl::KeepDelivering(const std::vector<bool>& delivers) {
  for (size_t i = 0; i < sources.size(); ++i) {
    Source& source = sources[i];
    if (!delivers[i]) {
      // Nothing of what we registered comes from it: no handle, no traffic. A failing release
      // is logged (by the handle) and does not fail the update.
      if (Status s = source.handle->Release(); !s.ok()) {
        WS_LOG(WARN, "subscriber") << source.name << " delivers nothing; releasing it: " << s;
      }
      source.handle.reset();
      continue;
    }
    active.push_back(&source);
  }
  if (active.size() > 1) pool = std::make_unique<util::WorkerPool>(static_cast<int>(active.size()));
}

// Regions (a sharded trainer, a sharded engine, or both): what every publisher holds is
// intersected with what every destination wants, once (plan/subscriber_regions.h); each
// publisher's handle is then prepared for its runs only.
Status Subscriber::Impl::PrepareRegions(const Deadline& deadline, bool for_verify) {
  std::vector<const wire::Welcome*> welcomes;
  for (const Source& source : sources) welcomes.push_back(source.welcome);
  const std::vector<plan::Destination>& destinations = registered.destinations();
  WS_ASSIGN_OR_RETURN(plan::SourceShares shares,
                      plan::ScheduleSubscriberRegions(welcomes, destinations, options.policy,
                                                      options.convert_dtypes));
  std::vector<bool> delivers(sources.size(), false);
  std::ostringstream line;
  line << "region schedule over " << sources.size() << " publisher(s), " << shares.total_copies
       << " copies:";
  for (size_t i = 0; i < sources.size(); ++i) {
    sources[i].copies = std::move(shares.copies[i]);
    delivers[i] = !sources[i].copies.empty();
    line << " " << sources[i].name << " " << shares.bytes[i] << " bytes;";
  }
  WS_LOG(INFO, "subscriber") << line.str();
  KeepDelivering(delivers);
  if (active.empty()) return Status::InvalidArgument("no publisher delivers any destination byte");
  return ForEachSource([&](Source& source) {
    transport::PrepareOptions prepare{MatchPolicy::kSubset, options.mode, Convert()};
    prepare.region_copies = &source.copies;
    prepare.for_verify = for_verify;
    return source.handle->Prepare(destinations, prepare, deadline);
  });
}

// Several publishers: decide once which one delivers each tensor, then prepare each handle for
// its share only.
Status Subscriber::Impl::PrepareShares(const Deadline& deadline) {
  std::vector<plan::SourceManifest> manifests;
  for (Source& source : sources) manifests.push_back({source.name, source.welcome});
  WS_ASSIGN_OR_RETURN(
      plan::Schedule schedule,
      plan::AssignSources(manifests, registered.destinations(), options.policy, Convert()));
  std::ostringstream line;
  line << "schedule over " << sources.size() << " publishers:";
  std::vector<bool> delivers(sources.size(), false);
  for (size_t i = 0; i < sources.size(); ++i) {
    Source& source = sources[i];
    line << " " << source.name << " " << schedule.destinations[i].size() << " tensors "
         << schedule.bytes[i] << " bytes;";
    delivers[i] = !schedule.destinations[i].empty();
    // The share's plan indexes into the share: tied destinations point at their share index.
    std::unordered_map<uint32_t, uint32_t> share_index;
    for (uint32_t d : schedule.destinations[i]) {
      share_index.emplace(d, static_cast<uint32_t>(source.share.size()));
      source.share.push_back(registered.destinations()[d]);
      source.share_at.push_back(d);
    }
    for (plan::Destination& dst : source.share) {
      if (dst.alias_of != plan::kNoDestination) dst.alias_of = share_index.at(dst.alias_of);
    }
  }
  WS_LOG(INFO, "subscriber") << line.str();
  KeepDelivering(delivers);
  // All at once: each publisher waits for its subscriber's selection under its own deadline, and
  // communicator setup (nccl) takes a while per source.
  return ForEachSource([&](Source& source) {
    // Subset: the publisher may also hold tensors another one delivers.
    return source.handle->Prepare(source.share, {MatchPolicy::kSubset, options.mode, Convert()},
                                  deadline);
  });
}

Held Subscriber::Impl::HeldVersion() const {
  if (committed.load(std::memory_order_relaxed) < 0 || registration_changed || weights_differ) {
    return Held::kNothing;
  }
  bool same_session = true, same_lineage = true;
  for (const Source* source : active) {
    same_session = same_session && source->welcome->session_id == source->committed_session;
    same_lineage = same_lineage && source->welcome->lineage == source->committed_lineage;
  }
  if (same_session) return Held::kSameSession;
  return same_lineage ? Held::kRestarted : Held::kOtherLineage;
}

// LineagePolicy::kStrict refuses another lineage (the handle stays prepared: nothing is wrong
// with it). A restart of the same lineage is checked by its step number, in Update().
Status Subscriber::Impl::CheckLineage(Held held, const UpdateOptions& update) const {
  if (held != Held::kOtherLineage || options.lineage_policy != LineagePolicy::kStrict ||
      update.accept_new_lineage) {
    return Status::Ok();
  }
  std::string serving;
  for (const Source* source : active) {
    if (source->welcome->lineage == source->committed_lineage) continue;
    serving = source->name + " serves lineage '" + source->welcome->lineage + "' (committed: '" +
              source->committed_lineage + "')";
    break;
  }
  return Status::FailedPrecondition(
      serving, ", committed step ", committed.load(std::memory_order_relaxed),
      ": the strict lineage policy refuses a lineage change; update with accept_new_lineage to "
      "follow it");
}

// Every active source must serve the same step. "Latest" is the first source's latest; the others
// are asked for exactly that step (waiting, within the deadline, for one that is behind). `after`:
// the committed step where it is a step of these publishers' sessions, else -1.
Result<int64_t> Subscriber::Impl::BeginStep(std::optional<int64_t> step, int64_t after, bool delta,
                                            const Deadline& deadline) {
  // Deltas apply against the committed version: each source's own digests of it prove its base.
  auto base = [&](const Source& source) {
    return delta ? std::span<const uint64_t>(source.committed_digests)
                 : std::span<const uint64_t>();
  };
  Source& lead = *active[0];
  if (relay) lead.handle->set_below(relay->Below());  // a relay serves one publisher's versions
  Result<int64_t> got = lead.handle->BeginStep(step, after, deadline, base(lead));
  if (!got.ok() || active.size() == 1) return got;
  if (*got == after) return got;  // up to date: nothing pinned anywhere
  for (size_t i = 1; i < active.size(); ++i) {
    Result<int64_t> other = active[i]->handle->BeginStep(*got, after, deadline, base(*active[i]));
    if (!other.ok()) {
      return other.status().WithContext(active[i]->name + " (publishers out of step? " + lead.name +
                                        " offered step " + std::to_string(*got) + ")");
    }
    if (*other != *got) {
      return Status::ProtocolError(active[i]->name, " offered step ", *other, " when asked for ",
                                   *got);
    }
  }
  return got;
}

void Subscriber::Impl::RecordCommitted(int64_t step) {
  for (Source* source : active) {
    source->committed_session = source->welcome->session_id;
    source->committed_lineage = source->welcome->lineage;
    source->committed_digests.assign(source->digests.begin(), source->digests.end());
  }
  committed.store(step, std::memory_order_relaxed);
  registration_changed = false;
  weights_differ = false;
  util::MutexLock lock(&lineage_mu);
  committed_lineage = active[0]->welcome->lineage;  // SSO or reused capacity: no allocation
}

Status Subscriber::Impl::CheckCommitted(const Deadline& deadline, WeightsCheck* out) {
  std::vector<core::CheckedShare> shares;
  for (Source* source : active) {
    shares.push_back({source->handle.get(),
                      source->share.empty() ? &registered.destinations() : &source->share,
                      source->share_at, source->committed_digests});
  }
  Status s = core::CheckWeights(shares, registered.destinations(),
                                committed.load(std::memory_order_relaxed), deadline, out);
  if (s.code() == StatusCode::kCorruption) {
    valid.store(false, std::memory_order_relaxed);
    weights_differ = true;
    return Status(s.code(), s.message() +
                                "; the weights are marked invalid and the next update rewrites "
                                "every destination");
  }
  return s;
}

Result<WeightsCheck> Subscriber::CheckWeights() {
  Impl& d = *impl_;
  if (!d.TryLockForCall()) return Status::Busy("CheckWeights() during an update");
  util::MutexLock lock(&d.update_mu, util::kAdoptLock);
  if (d.closed) return Status::FailedPrecondition("subscriber is closed");
  if (!d.prepared || d.committed.load(std::memory_order_relaxed) < 0) {
    return Status::FailedPrecondition(
        "CheckWeights() compares the destinations with the committed version through the prepared "
        "transfer handle: there is none (before the first update, after Sleep() or a failed "
        "update)");
  }
  if (d.registration_changed) {
    return Status::FailedPrecondition(
        "CheckWeights(): destinations were registered since the last commit; they hold no "
        "committed version until the next update");
  }
  WS_RETURN_IF_ERROR(d.StartCancellable());
  CallerDevice caller_device(d.registered.any_cuda());
  WeightsCheck check;
  WS_RETURN_IF_ERROR(d.CheckCommitted(Deadline(d.options.timeout, &d.cancel), &check));
  return check;
}

Result<UpdateStats> Subscriber::Update(const UpdateOptions& update) {
  Impl& d = *impl_;
  if (!d.TryLockForCall()) return Status::Busy("another update is in flight on this subscriber");
  util::MutexLock lock(&d.update_mu, util::kAdoptLock);
  return d.Update(update);
}

// Any failure of an update destroys the handle; the next update prepares a new one. Bytes already
// in the destinations (in place, or a failed commit) mark the weights invalid.
Status Subscriber::Impl::Fail(const UpdateRun& run, const Status& s) {
  if (run.touched_destinations) valid.store(false, std::memory_order_relaxed);
  AvoidRelays();
  (void)ReleaseHandles("update failed");
  Status out = s.WithContext("update to step " + run.step_text + " from " + sources_text);
  if (!run.touched_destinations) return out;
  return Status(out.code(), out.message() + (options.mode == UpdateMode::kInPlace
                                                 ? " (in_place: weights are now marked invalid)"
                                                 : " (failed while committing: weights are now "
                                                   "marked invalid)"));
}

// Prepares (if needed) and asks for the step. A reused handle whose publisher went away (a trainer
// that restarted while this one slept between updates) fails at its first request, before
// anything moved: no failure of the update, so it prepares once more, against whoever serves the
// endpoint now.
Result<int64_t> Subscriber::Impl::OpenStep(UpdateRun& run) {
  const bool strict =
      options.lineage_policy == LineagePolicy::kStrict && !run.request.accept_new_lineage;
  if (prepared && regions && run.verify && !prepared_for_verify) {
    // A region plan moves only the wanted bytes, which need not be whole digest segments; one
    // that can verify is prepared now (plan/region_plan.h).
    WS_LOG(INFO, "subscriber") << sources_text
                               << ": verification asked of region handles prepared without it; "
                                  "preparing again";
    (void)ReleaseHandles("verification asked");
  }
  if (report_failed) {
    report_failed = false;
    (void)ReleaseHandles("a members report failed");
  }
  for (bool retried = false;; retried = true) {
    if (!prepared) {
      Status s = Prepare(run.deadline, run.verify);
      if (!s.ok()) return Fail(run, s.WithContext("prepare"));
      if (relay) {
        // Before anything moves: a relay must be able to serve what it is about to receive.
        s = core::RelayServe::CheckServable(*active[0]->welcome, registered.destinations());
        if (!s.ok()) return Fail(run, s);
      }
      run.stats.handle_created = true;
      run.stats.prepare_seconds = Seconds(run.t0, Clock::now());
    }
    run.stats.prepare_count = prepare_count;
    // Steps compare only within one publisher session: after a restart the committed step number
    // says nothing about what the new session's step of that number holds.
    run.held = HeldVersion();
    run.after = run.held == Held::kSameSession || (run.held == Held::kRestarted && strict)
                    ? run.committed_step
                    : -1;
    // Refusals that leave the prepared handle as it is: nothing failed, the request was refused.
    if (Status s = CheckLineage(run.held, run.request); !s.ok()) {
      return s.WithContext("update to step " + run.step_text + " from " + sources_text);
    }
    if (run.request.step && *run.request.step <= run.after) {
      return Status::FailedPrecondition("step ", *run.request.step,
                                        " is not newer than the committed step ", run.after,
                                        " (steps only move forward)");
    }
    run.t_wait = Clock::now();
    // Deltas (docs/deltas.md) only onto exactly the committed version of these sessions: a handle
    // asks only with an `after` step (-1 after a weights check that found differences, a
    // registration change or a restart under the follow policy) and only after it committed a
    // step itself (DataPath::AcceptsDeltas): a failed update, a restart or Sleep() leaves no
    // prepared handle.
    const bool delta = options.delta;
    Result<int64_t> step = BeginStep(run.request.step, run.after, delta, run.deadline);
    if (step.ok()) return step;
    if (retried || run.stats.handle_created || step.status().code() != StatusCode::kPeerLost) {
      return Fail(run, step.status());
    }
    WS_LOG(INFO, "subscriber") << sources_text << " went away since the last update ("
                               << step.status() << "); preparing again";
    AvoidRelays();
    (void)ReleaseHandles("publisher went away");
  }
}

void Subscriber::Impl::LogLineageChange(const UpdateRun& run, int64_t step) const {
  const wire::Welcome& now = *active[0]->welcome;
  WS_LOG(WARN, "subscriber") << sources_text << ": "
                             << (run.held == Held::kRestarted
                                     ? "publisher restarted lineage '" + now.lineage + "'"
                                     : "new lineage '" + now.lineage + "'")
                             << (now.resumed_from >= 0
                                     ? " resumed from step " + std::to_string(now.resumed_from)
                                     : std::string())
                             << ": its step " << step << " replaces committed step "
                             << run.committed_step << " of lineage '"
                             << active[0]->committed_lineage << "'";
}

// Copy → the publisher's digests → verify (when asked) → commit, every source together.
Status Subscriber::Impl::MoveStep(UpdateRun& run, int64_t step) {
  auto fail = [&](const Status& s) WS_REQUIRES(update_mu) { return Fail(run, s); };
  UpdateStats& stats = run.stats;
  const auto t_copy = Clock::now();
  run.touched_destinations = options.mode == UpdateMode::kInPlace;
  WS_FAIL_POINT_RETURN_VIA(fail, "subscriber.before_copy");
  // A relay serves a step that comes whole while it lands (cut-through, docs/relays.md).
  if (relay) {
    active[0]->handle->ObserveLanding(
        relay->Stream(*active[0]->welcome, registered.destinations(), step));
  }
  Status s =
      ForEachSource([&](Source& src) { return src.handle->CopyStep(run.verify, run.deadline); });
  if (!s.ok()) return fail(s);
  // Tests: counts the updates whose bytes are all in, before the step's end (cut-through relays).
  (void)util::FailPoints::Check("subscriber.after_copy");
  for (const Source* src : active) {
    const transport::path::DeltaReceipt receipt = src->handle->delta_receipt();
    if (src == active[0]) stats.delta_base_step = receipt.base_step;
    stats.delta_segments += receipt.delta_segments;
    stats.received_bytes += receipt.received_bytes;
  }
  s = ForEachSource([&](Source& src) {
    Result<std::span<const uint64_t>> digests = src.handle->EndStep(run.deadline);
    if (!digests.ok()) return digests.status();
    src.digests = *digests;
    return Status::Ok();
  });
  if (!s.ok()) return fail(s);
  const auto t_verify = Clock::now();
  stats.copy_seconds = Seconds(t_copy, t_verify);
  if (run.verify) {
    s = ForEachSource(
        [&](Source& src) { return src.handle->Verify(src.digests, step, run.deadline); });
    if (!s.ok()) return fail(s);
    stats.verified = true;
  }
  const auto t_commit = Clock::now();
  stats.verify_seconds = run.verify ? Seconds(t_verify, t_commit) : 0;
  // Staged: staging → destinations. Both modes: converted tensors (convert_dtypes) are written
  // now, from verified bytes. From here the destinations change: a failure leaves them partly
  // written.
  WS_FAIL_POINT_RETURN_VIA(fail, "subscriber.before_commit");
  run.touched_destinations = true;
  s = ForEachSource([&](Source& src) { return src.handle->Commit(run.deadline); });
  if (!s.ok()) return fail(s);
  stats.commit_seconds = Seconds(t_commit, Clock::now());
  RecordCommitted(step);
  valid.store(true, std::memory_order_relaxed);
  for (const Source* src : active) {
    stats.bytes += src->handle->plan().total_bytes;
    stats.tensors += src->handle->plan().destination_count;
  }
  // With regions several publishers may write parts of one destination: count it once.
  if (regions) stats.tensors = registered.written_count();
  return Status::Ok();
}

Result<UpdateStats> Subscriber::Impl::Update(const UpdateOptions& update) {
  const auto t0 = Clock::now();
  if (closed) return Status::FailedPrecondition("subscriber is closed");
  CallerDevice caller_device(registered.any_cuda());
  if (registered.empty()) {
    return Status::FailedPrecondition("Update() before Register(): no destination tensors");
  }
  WS_RETURN_IF_ERROR(StartCancellable());
  UpdateRun run{update, update.verify.value_or(options.verify), Deadline(options.timeout, &cancel),
                t0};
  run.step_text = update.step ? std::to_string(*update.step) : std::string("latest");
  run.committed_step = committed.load(std::memory_order_relaxed);
  // A relay update that returns without serving the step it began to serve while it landed gives
  // that step up: its children's reads fail, nothing committed downstream.
  struct AbortUnserved {
    core::RelayServe* relay;
    ~AbortUnserved() {
      if (relay != nullptr && relay->streaming()) {
        relay->AbortStream(Status::Unavailable("the relay's update failed"));
      }
    }
  } abort_unserved{relay.get()};
  WS_ASSIGN_OR_RETURN(const int64_t step, OpenStep(run));
  UpdateStats& stats = run.stats;
  stats.wait_seconds = Seconds(run.t_wait, Clock::now());
  stats.step = step;
  run.step_text = std::to_string(step);
  stats.lineage.Assign(active[0]->welcome->lineage);
  stats.path = active[0]->handle->transport_name();
  if (step == run.after) {
    if (run.held != Held::kSameSession) {  // strict: a restarted publisher not past our step yet
      return Status::FailedPrecondition(
          "update from ", sources_text, ": the publisher restarted lineage '",
          active[0]->welcome->lineage, "' and its latest step ", step,
          " is not newer than the committed step ", run.committed_step,
          " of its previous session; the strict lineage policy waits for a newer step (or "
          "update with accept_new_lineage)");
    }
    stats.up_to_date = true;
  } else {
    if (run.held == Held::kRestarted || run.held == Held::kOtherLineage) {
      LogLineageChange(run, step);
      stats.lineage_changed = true;
    }
    WS_RETURN_IF_ERROR(MoveStep(run, step));
    for (const Source* src : active) {
      const transport::path::ConversionReport c = src->handle->conversion();
      if (c.tensors == 0) continue;
      stats.converted_tensors += c.tensors;
      stats.converted_bytes += c.bytes;
      if (stats.converted_on == ConvertedOn::kNone) {
        stats.converted_on = c.where;
        stats.converted_device = c.device;
      }
    }
  }
  // What the prepared handles hold, after the copy (a delta buffer may have grown in it), reported
  // by up-to-date updates too (no allocation).
  for (const Source* src : active) stats.staging_bytes += src->handle->staging_bytes();
  const auto t_end = Clock::now();
  if (update.check_weights) WS_RETURN_IF_ERROR(CheckAfterCommit(run.deadline, &stats));
  // A relay serves what it committed once it is checked; an up-to-date update serves it too if an
  // earlier hand-over failed.
  // Its own budget, as a publisher's wait for readers (a relay that waited long for its step does
  // not cut off a child that just began reading), ended at once by Cancel() or Close().
  ServeCommitted(&stats, /*moved=*/!stats.up_to_date, Deadline(options.timeout, &cancel));
  ReportMembers(/*between_updates=*/false);
  stats.seconds = Seconds(t0, t_end);
  stats.gbps = stats.seconds > 0 ? stats.bytes / stats.seconds / 1e9 : 0;
  return stats;
}

// A relay hands the version it committed to its children. Its own update succeeded whatever
// happens here: a failure is logged with its cause, UpdateStats::served_step says what the
// children get, and the next update (up to date or not) hands it over again.
void Subscriber::Impl::ServeCommitted(UpdateStats* stats, bool moved, const Deadline& deadline) {
  if (!relay) return;
  const Source& source = *active[0];
  const auto t0 = Clock::now();
  Result<PublishStats> served =
      relay->Serve(*source.welcome, registered.destinations(), stats->step,
                   source.committed_digests, moved, deadline);
  stats->serve_seconds = Seconds(t0, Clock::now());
  if (!served.ok()) {
    WS_LOG(WARN, "relay") << serve_endpoint << ": serving step " << stats->step
                          << " failed: " << served.status();
  }
  stats->served_step = relay->served_step();
}

void Subscriber::Impl::ReportMembers(bool between_updates) {
  if (!prepared || active.empty() || report_failed) return;
  const uint64_t covered = reporter ? reporter->Snapshot() : 0;
  const int64_t held =
      HeldVersion() == Held::kSameSession ? committed.load(std::memory_order_relaxed) : -1;
  const bool tree_changed = reporter && covered != reported_changes;
  if (!between_updates && !tree_changed && held == reported_held &&
      prepare_count == reported_prepare) {
    return;
  }
  report.held_step = held;
  if (relay) {
    relay->FillReport(&report);
  } else {
    report.below = report.room = 0;
    report.members.clear();
  }
  // One frame into the socket's buffer: bounded on its own, not by what the update left; between
  // updates not ended by a Cancel() meant for an update.
  const auto bound = std::min(options.timeout, kReportBound);
  const Deadline deadline = between_updates ? Deadline(bound) : Deadline(bound, &cancel);
  for (Source* source : active) {
    // Tests: an update's report that fails (the reporter's are not injected).
    const bool injected = !between_updates && util::FailPoints::Check("subscriber.report").action ==
                                                  util::FailAction::kError;
    Status s = injected ? Status::Unavailable("injected failure at fail point 'subscriber.report'")
                        : source->handle->Report(report, deadline);
    if (!s.ok()) {
      WS_LOG(INFO, "subscriber") << source->name << ": members report failed (" << s
                                 << "); the next update prepares anew";
      report_failed = true;
      return;
    }
  }
  reported_held = held;
  reported_prepare = prepare_count;
  reported_changes = covered;
  if (reporter) reporter->Reported(covered);
}

bool Subscriber::Impl::ReportBetweenUpdates() {
  {
    util::MutexLock gate(&report_gate);
    if (!update_mu.TryLock()) return false;
    reporting = true;
  }
  // Tests: a report that holds the subscriber a while (sleep), as a slow socket would.
  (void)util::FailPoints::Check("subscriber.report_between");
  if (!closed) ReportMembers(/*between_updates=*/true);
  util::MutexLock gate(&report_gate);
  reporting = false;
  update_mu.Unlock();  // under the gate: a caller sees it held only while `reporting` says whose
  return true;
}

Status Subscriber::Sleep() {
  Impl& d = *impl_;
  if (!d.TryLockForCall()) return Status::Busy("Sleep() during an update");
  util::MutexLock lock(&d.update_mu, util::kAdoptLock);
  if (d.closed) return Status::FailedPrecondition("subscriber is closed");
  CallerDevice caller_device(d.registered.any_cuda());
  Status s = d.ReleaseHandles("sleep");
  // A relay of CUDA destinations gives its GPU store back too (docs/relays.md).
  if (d.relay) s.Update(d.relay->Sleep().WithContext("relay " + d.serve_endpoint));
  return s;
}

Status Subscriber::Close() {
  Impl& d = *impl_;
  // An update in flight on another thread is cancelled (it stops at its next wait, within about
  // 20 ms plus the copy chunk under way, and fails as any update does: staged, the old weights
  // intact; in place, marked invalid once bytes moved), then waited for, rather than pulling
  // memory from under it or waiting for its whole timeout. One starting later is refused.
  d.closing.store(true);
  d.cancel.store(true);
  if (d.reporter) d.reporter->Stop();  // it takes update_mu for a report: not once we close
  util::FailPoints::Check("subscriber.closing");  // tests: sleep:<ms> widens the window
  util::MutexLock lock(&d.update_mu);
  if (d.closed) return Status::Ok();
  d.closed = true;
  CallerDevice caller_device(d.registered.any_cuda());
  Status s = d.ReleaseHandles("close");
  if (d.relay) s.Update(d.relay->Close().WithContext("relay " + d.serve_endpoint));
  return s;
}

Status Subscriber::Cancel() {
  // Release pairs with the acquire in Deadline::cancelled(): waits see it within one slice.
  impl_->cancel.store(true, std::memory_order_release);
  return Status::Ok();
}

int64_t Subscriber::committed_step() const {
  return impl_->committed.load(std::memory_order_relaxed);
}
std::string Subscriber::serve_endpoint() const { return impl_->serve_endpoint; }
std::vector<MemberInfo> Subscriber::ServedMembers() const {
  // The relay lives from Create to destruction; it swaps its serving publisher under its own lock.
  return impl_->serving != nullptr ? impl_->serving->Members() : std::vector<MemberInfo>();
}
std::vector<MemberInfo> Subscriber::ServedTree() const {
  return impl_->serving != nullptr ? impl_->serving->Tree() : std::vector<MemberInfo>();
}
bool Subscriber::weights_valid() const { return impl_->valid.load(std::memory_order_relaxed); }
std::string Subscriber::committed_lineage() const {
  util::MutexLock lock(&impl_->lineage_mu);
  return impl_->committed_lineage;
}

}  // namespace weightsync
