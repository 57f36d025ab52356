#include "weightsync/publisher.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <unordered_map>

#include "core/destination_set.h"
#include "plan/plan.h"
#include "transport/link/endpoint.h"
#include "transport/link/server.h"
#include "transport/store/bucket_ring.h"
#include "transport/store/version_store.h"
#include "util/deadline.h"
#include "util/fail_point.h"
#include "util/logging.h"
#include "util/mutex.h"
#include "util/token.h"
#include "weightsync/region.h"
#include "wire/messages.h"

namespace weightsync {

using util::Deadline;

namespace {
constexpr auto kWaitSlice = std::chrono::milliseconds(50);

uint64_t RandomU64() {
  std::random_device random;
  return random() | (uint64_t{random()} << 32);
}

// The region of a global tensor that registered tensor `spec` holds (`regions`: none, or one
// part whose extent is the tensor's own shape, at its origin).
Status HeldShard(const TensorSpec& spec, const std::vector<RegionPart>& regions,
                 wire::ShardOf* shard) {
  if (regions.empty()) return Status::Ok();
  if (regions.size() > 1) {
    return Status::InvalidArgument("tensor '", spec.name, "': ", regions.size(),
                                   " region parts; a published tensor holds one region of one "
                                   "global tensor (register each region as its own tensor)");
  }
  const RegionPart& given = regions[0];
  if ((!given.extent.empty() && given.extent != spec.shape) ||
      std::any_of(given.at.begin(), given.at.end(), [](int64_t a) { return a != 0; })) {
    return Status::InvalidArgument("tensor '", spec.name, "': holds ", RegionPartString(given),
                                   " but its shape is ", ShapeString(spec.shape),
                                   ": a published region is the whole tensor (extent = its "
                                   "shape, at its origin)");
  }
  WS_ASSIGN_OR_RETURN(std::vector<RegionPart> parts, core::CompleteRegions(spec, regions));
  *shard = {parts[0].tensor, parts[0].global_shape, parts[0].offset};
  return Status::Ok();
}

// "a3f9c2e41b7d0c55": a fresh lineage for a publisher that names none.
std::string RandomLineage() {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(RandomU64()));
  return text;
}
}  // namespace

// The publisher core: registration, versions (which slot holds which step, who reads it) and the
// identity subscribers see. Where versions are kept is a store (transport/store/), how subscribers
// reach them a server (transport/link/server.h): this file names neither kind.
struct Publisher::Impl final : transport::link::VersionSource {
  PublisherOptions options;
  transport::link::Endpoint endpoint;
  std::unique_ptr<transport::link::Server> server;
  std::string bound_endpoint;
  // The host store exists from Create (Allocate() needs it); a publisher of CUDA tensors keeps
  // its versions in a GPU store instead, chosen at the first Publish.
  std::unique_ptr<transport::store::VersionStore> host_store;
  std::unique_ptr<transport::store::VersionStore> store;  // set by Freeze
  // Ring publishers (options.ring_buckets): who reads which bucket, set by Freeze.
  std::unique_ptr<transport::store::BucketRing> ring;
  int cuda_device = -1;  // ≥ 0: registered tensors are on this CUDA device

  // Registration (before the first Publish), in manifest order.
  std::vector<transport::store::PublishedTensor> tensors;
  std::unordered_map<const uint8_t*, size_t> registered_at;  // data → first tensor registered there
  uint64_t slot_used = 0;   // slot bytes including alignment padding
  bool has_direct = false;  // some tensor lives in the store (Allocate)
  Manifest manifest;
  wire::Welcome welcome;  // identity (session, lineage) set by Create, the layout by Freeze

  // Registration state above is written only before the first Publish (under publish_mu) and
  // read-only once `frozen`: the servers' threads read the Welcome and the store after that.
  util::Mutex publish_mu;  // serializes Register/Allocate/Publish/BeginWrite/Close
  mutable util::Mutex mu;  // the versions, between Publish and the session threads
  util::CondVar cv;
  struct Version {
    int64_t step = -1;   // -1: holds no available version
    int readers = 0;     // pins of the current epoch
    int revoked = 0;     // pins of earlier epochs (revoked), not yet unpinned
    uint64_t epoch = 0;  // incremented when the publisher revokes this version's readers
    bool writing = false;
  };
  // The publisher stops waiting for the readers of version k: their pins are revoked (they get
  // an error at Unpin and commit nothing) and no longer hold the version's memory.
  void Revoke(Version* v) WS_REQUIRES(mu) {
    v->revoked += v->readers;
    v->readers = 0;
    ++v->epoch;
  }
  std::vector<Version> versions WS_GUARDED_BY(mu);
  // Digests per slot: written by Publish while the slot is `writing` (no reader can pin it then),
  // copied out by Unpin under mu while the slot is pinned (Publish cannot take it then).
  std::vector<std::vector<uint64_t>> digests;
  int latest WS_GUARDED_BY(mu) = -1;
  int64_t latest_step WS_GUARDED_BY(mu) = -1;
  bool direct_writing WS_GUARDED_BY(mu) = false;
  // What waiting for readers cost the trainer since the last Publish (its BeginWrite and its own
  // wait for a free slot), reported by the next Publish.
  double wait_for_readers_seconds WS_GUARDED_BY(publish_mu) = 0;
  int revoked_reads WS_GUARDED_BY(publish_mu) = 0;
  bool closed WS_GUARDED_BY(mu) = false;
  bool frozen WS_GUARDED_BY(mu) = false;

  Status Freeze() WS_REQUIRES(mu);
  Result<std::pair<const wire::Welcome*, int>> WaitLayout(
      const Deadline& deadline, const std::function<bool()>& give_up) override;
  Result<util::UniqueFd> ExportAllocationFd(uint32_t index) override;
  Result<transport::link::Pin> Acquire(const wire::UpdateRequest& request, const Deadline& deadline,
                                       const std::function<bool()>& give_up) override;
  // Acquire without the ring: the version pinned.
  Result<transport::link::Pin> PinVersion(const wire::UpdateRequest& request,
                                          const Deadline& deadline,
                                          const std::function<bool()>& give_up);
  Status Unpin(const transport::link::Pin& pin, wire::StepEnd* end) override;
  Result<uint32_t> AwaitBucket(const transport::link::Pin& pin, uint32_t bucket,
                               const Deadline& deadline) override {
    return ring->Await(pin.ring_member, bucket, deadline);
  }
  Status ReleaseBucket(const transport::link::Pin& pin, uint32_t bucket) override {
    return ring->Release(pin.ring_member, bucket);
  }
  // Revokes the readers of `v` and, on a ring, every member of its round.
  void RevokeReaders(Version* v) WS_REQUIRES(mu) {
    Revoke(v);
    if (ring) ring->RevokeAll();
  }
  const uint8_t* arena_base() const override { return store->base(); }
  Result<transport::link::Pin> AcquireWhole(const wire::UpdateRequest& request,
                                            const Deadline& deadline,
                                            const std::function<bool()>& give_up) override {
    return PinVersion(request, deadline, give_up);  // a ring's round is for bucket readers
  }
  // `tensors` is read-only once frozen (Register refuses then), which sessions wait for. A ring's
  // or a zero-copy publisher's version is its registered tensors.
  const uint8_t* TensorBytes(uint32_t tensor) const override {
    return (options.ring_buckets > 0 || options.zero_copy) && tensor < tensors.size()
               ? tensors[tensor].source
               : nullptr;
  }
};

Publisher::Publisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Publisher::~Publisher() {
  if (impl_) {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "publisher") << "cleanup: " << s;
  }
}

Result<std::unique_ptr<Publisher>> Publisher::Create(const PublisherOptions& options) {
  WS_RETURN_IF_ERROR(util::FailPoints::LoadFromEnv());
  if (options.slots < 1 || options.slots > static_cast<int>(wire::kMaxSlots)) {
    return Status::InvalidArgument("PublisherOptions.slots = ", options.slots, ": must be 1..",
                                   wire::kMaxSlots);
  }
  if (options.segment_bytes % 8 != 0) {
    return Status::InvalidArgument("PublisherOptions.segment_bytes = ", options.segment_bytes,
                                   ": must be 0 (the default) or a multiple of 8, so a digest "
                                   "segment holds whole elements of every dtype");
  }
  if (options.max_connections < 1) {
    return Status::InvalidArgument("PublisherOptions.max_connections must be ≥ 1");
  }
  if (options.resume_from_step < -1) {
    return Status::InvalidArgument("PublisherOptions.resume_from_step = ", options.resume_from_step,
                                   ": must be ≥ 0, or -1 for none");
  }
  if (options.resume_from_step >= 0 && options.lineage.empty()) {
    return Status::InvalidArgument("PublisherOptions.resume_from_step = ", options.resume_from_step,
                                   " needs PublisherOptions.lineage: the lineage it resumes");
  }
  if (!options.lineage.empty()) {
    WS_RETURN_IF_ERROR(wire::CheckLineage(options.lineage).WithContext("PublisherOptions"));
  }
  if (options.ring_buckets != 0 &&
      (options.ring_buckets < 2 || options.ring_buckets > static_cast<int>(wire::kMaxSlots))) {
    return Status::InvalidArgument("PublisherOptions.ring_buckets = ", options.ring_buckets,
                                   ": must be 0 (no ring) or 2..", wire::kMaxSlots,
                                   " (one bucket is filled while subscribers read another)");
  }
  if (options.ring_bucket_bytes > 0 && options.ring_buckets == 0) {
    return Status::InvalidArgument("PublisherOptions.ring_bucket_bytes = ",
                                   options.ring_bucket_bytes, " without ring_buckets");
  }
  if (options.ring_buckets > 0 && options.zero_copy) {
    return Status::InvalidArgument(
        "PublisherOptions.ring_buckets with zero_copy: a zero-copy publisher stages nothing, a "
        "ring stages through buckets; choose one");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  // A new session per Create: subscribers never take this publisher's step N for a step N of an
  // earlier one (a restarted trainer), even under the same lineage.
  impl->welcome.session_id = RandomU64();
  impl->welcome.lineage = options.lineage.empty() ? RandomLineage() : options.lineage;
  impl->welcome.resumed_from = options.resume_from_step;
  WS_ASSIGN_OR_RETURN(impl->endpoint, transport::link::ParseEndpoint(options.endpoint));
  WS_ASSIGN_OR_RETURN(impl->host_store, transport::store::NewHostStore(impl->endpoint.name));
  transport::link::ServerOptions server_options;
  server_options.max_connections = options.max_connections;
  server_options.timeout = options.timeout;
  server_options.token = options.token;
  server_options.token_file = options.token_file;
  server_options.handshake_timeout = std::min(options.timeout, std::chrono::milliseconds(2000));
  WS_ASSIGN_OR_RETURN(impl->server,
                      transport::link::StartServer(impl->endpoint, server_options, impl.get()));
  impl->bound_endpoint = impl->server->bound().ToString();
  WS_LOG(INFO, "publisher") << impl->bound_endpoint << " serves lineage '" << impl->welcome.lineage
                            << "'"
                            << (options.resume_from_step >= 0
                                    ? " resumed from step " +
                                          std::to_string(options.resume_from_step)
                                    : std::string(options.lineage.empty() ? " (new)" : ""));
  return std::unique_ptr<Publisher>(new Publisher(std::move(impl)));
}

Status Publisher::Register(const std::vector<NamedTensor>& tensors) {
  Impl& d = *impl_;
  util::MutexLock publish_lock(&d.publish_mu);
  {
    util::MutexLock lock(&d.mu);
    if (d.closed) return Status::FailedPrecondition("publisher is closed");
    if (d.frozen) return Status::FailedPrecondition("Register() after the first Publish()");
  }
  // One memory kind per publisher: host tensors, or tensors of one CUDA device.
  int device = d.tensors.empty() ? (tensors.empty() || !tensors[0].view.device.is_cuda()
                                        ? -1
                                        : tensors[0].view.device.index)
                                 : d.cuda_device;
  for (const auto& t : tensors) {
    int here = t.view.device.is_cuda() ? t.view.device.index : -1;
    if (here != device) {
      return Status::InvalidArgument(
          "tensor '", t.name, "' is on ", DeviceString(t.view.device), " but this publisher's ",
          "tensors are on ", device < 0 ? std::string("cpu") : "cuda:" + std::to_string(device),
          ": one publisher holds host tensors or tensors of one CUDA device");
    }
  }
  if (device >= 0 && d.has_direct) {
    return Status::InvalidArgument("CUDA tensors cannot join arena-allocated host tensors");
  }
  if (d.options.zero_copy && device < 0 && !tensors.empty()) {
    return Status::InvalidArgument("tensor '", tensors[0].name, "' is on cpu: a zero_copy ",
                                   "publisher publishes CUDA tensors where they are (host tensors ",
                                   "are zero-copy through Allocate(), without zero_copy)");
  }
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& t : tensors) specs.push_back({t.name, t.view.dtype, t.view.shape, 0});
  // Validates the new tensors, their names also against earlier registrations: O(new tensors).
  const size_t first = d.manifest.size();
  WS_RETURN_IF_ERROR(d.manifest.Append(std::move(specs)));
  std::vector<wire::ShardOf> shards(tensors.size());
  for (size_t i = first; i < d.manifest.size(); ++i) {
    const TensorSpec& spec = d.manifest.tensors()[i];
    Status s = tensors[i - first].view.data == nullptr && spec.nbytes > 0
                   ? Status::InvalidArgument("tensor '", spec.name, "': null data pointer")
                   : HeldShard(spec, tensors[i - first].regions, &shards[i - first]);
    if (!s.ok()) {
      d.manifest.RemoveLast(d.manifest.size() - first);
      return s;
    }
  }
  for (size_t i = first; i < d.manifest.size(); ++i) {
    const TensorSpec& spec = d.manifest.tensors()[i];
    const auto* data = static_cast<const uint8_t*>(tensors[i - first].view.data);
    // Tied weights: a tensor registered again under another name is copied once.
    int64_t alias = -1;
    if (spec.nbytes > 0) {
      auto [it, fresh] = d.registered_at.emplace(data, i);
      const TensorSpec& earlier = d.manifest.tensors()[fresh ? i : it->second];
      if (!fresh && earlier.nbytes == spec.nbytes && earlier.dtype == spec.dtype &&
          earlier.shape == spec.shape) {
        alias = static_cast<int64_t>(it->second);
      }
    }
    transport::store::PublishedTensor published{{spec, wire::Region::kSlot, 0}, data, alias};
    published.placement.sharded = !tensors[i - first].regions.empty();
    published.placement.shard = std::move(shards[i - first]);
    if (alias >= 0) {
      published.placement.offset = d.tensors[alias].placement.offset;
    } else {
      d.slot_used = (d.slot_used + 63) / 64 * 64;
      published.placement.offset = d.slot_used;
      d.slot_used += spec.nbytes;
    }
    d.tensors.push_back(std::move(published));
  }
  d.cuda_device = device;
  return Status::Ok();
}

Result<TensorView> Publisher::Allocate(const std::string& name, DType dtype,
                                       const std::vector<int64_t>& shape) {
  Impl& d = *impl_;
  util::MutexLock publish_lock(&d.publish_mu);
  {
    util::MutexLock lock(&d.mu);
    if (d.closed) return Status::FailedPrecondition("publisher is closed");
    if (d.frozen) return Status::FailedPrecondition("Allocate() after the first Publish()");
  }
  if (d.options.zero_copy) {
    return Status::FailedPrecondition(
        "Allocate() on a zero_copy publisher: register CUDA "
        "tensors, which are published where they are");
  }
  if (d.options.ring_buckets > 0) {
    return Status::FailedPrecondition(
        "Allocate() on a ring publisher (PublisherOptions.ring_buckets): register the tensors; "
        "allocated tensors are read in place and need no ring");
  }
  if (d.cuda_device >= 0) {
    return Status::NotSupported("Allocate() on a publisher of CUDA tensors (cuda:", d.cuda_device,
                                "): arena-allocated GPU tensors are not supported "
                                "yet; register the tensors instead");
  }
  WS_RETURN_IF_ERROR(d.manifest.Append({{name, dtype, shape, 0}}));
  const TensorSpec& spec = d.manifest.tensors().back();
  Result<uint64_t> offset = d.host_store->AllocateDirect(spec.nbytes);
  if (!offset.ok()) {
    d.manifest.RemoveLast(1);  // a failed Allocate leaves nothing behind
    return offset.status();
  }
  d.tensors.push_back({{spec, wire::Region::kDirect, *offset}, nullptr, -1});
  d.has_direct = true;
  return TensorView{d.host_store->direct_base() + *offset, dtype, shape};
}

// Builds everything a Publish needs: picks the store for the registered tensors and fixes its
// layout. A failed Freeze keeps nothing it built, so a retried Publish freezes again from
// scratch and copies each tensor once.
Status Publisher::Impl::Freeze() {
  if (options.zero_copy && !store) {
    // The tensors are the version: shared by every slot, fenced by BeginWrite like Allocate()d
    // ones.
    WS_ASSIGN_OR_RETURN(store, transport::store::NewZeroCopyGpuStore(cuda_device));
    has_direct = true;
  } else if (options.ring_buckets > 0 && !store) {
    // Streamed from the tensors bucket by bucket: fenced by BeginWrite like allocated ones. Over
    // tcp the sessions send from the tensors and the store allocates no bucket.
    if (cuda_device >= 0) {
      WS_ASSIGN_OR_RETURN(store, transport::store::NewGpuRingStore(cuda_device));
    } else {
      WS_ASSIGN_OR_RETURN(store, transport::store::NewHostRingStore(endpoint.name));
    }
    has_direct = true;
  } else if (cuda_device >= 0 && !store) {
    WS_ASSIGN_OR_RETURN(store, transport::store::NewGpuStore(cuda_device));
  } else if (!store) {
    store = std::move(host_store);
  }
  transport::store::StoreLayout layout;
  layout.tensors = tensors;
  layout.slot_bytes = slot_used;
  layout.slots = static_cast<uint32_t>(options.slots);
  layout.segment_bytes = options.segment_bytes;
  layout.copy_threads = options.copy_threads;
  layout.ring_slots = static_cast<uint32_t>(options.ring_buckets);
  layout.ring_bucket_bytes = options.ring_bucket_bytes;
  layout.fill_wait = options.timeout;
  layout.local_readers = endpoint.kind == transport::link::Endpoint::Kind::kLocal;
  WS_RETURN_IF_ERROR(store->Freeze(layout, &welcome));
  if (Status s =
          [&] {
            WS_RETURN_IF_ERROR(plan::ValidateLayout(welcome).WithContext("publisher layout (bug)"));
            WS_FAIL_POINT_RETURN("publisher.freeze");
            return Status::Ok();
          }();
      !s.ok()) {
    // What the store's Freeze made (a GPU arena, a ring) goes now, not at a retry or Close: the
    // retry makes it again. The host store stays: its arena holds the Allocate()d tensors.
    if (host_store != nullptr) {  // `store` is not the host store (that one moved into it)
      if (Status closed = store->Close(); !closed.ok()) {
        WS_LOG(WARN, "publisher") << "release after a failed prepare: " << closed;
      }
    }
    return s;
  }
  // A ring holds one version: the tensors themselves, streamed on demand.
  const int held = options.ring_buckets > 0 ? 1 : options.slots;
  if (options.ring_buckets > 0) {
    ring = std::make_unique<transport::store::BucketRing>(
        welcome.slot_count, store->version_buckets(), options.max_connections, options.timeout,
        [store = store.get()](uint32_t bucket, uint32_t slot) {
          // Tests: a fill after the first, so that a subscriber has copied part of the version.
          if (bucket > 0) WS_FAIL_POINT_RETURN("publisher.ring_fill");
          return store->FillBucket(bucket, slot);
        });
  }
  versions.resize(held);
  digests.assign(held, std::vector<uint64_t>(store->digest_count(), 0));
  WS_LOG(INFO, "publisher") << bound_endpoint << " prepared: " << tensors.size() << " tensors, "
                            << manifest.total_bytes() << " bytes (" << welcome.direct_bytes
                            << " arena-allocated), " << store->Describe();
  return Status::Ok();
}

Status Publisher::BeginWrite() {
  Impl& d = *impl_;
  util::MutexLock publish_lock(&d.publish_mu);
  util::MutexLock lock(&d.mu);
  if (d.closed) return Status::FailedPrecondition("publisher is closed");
  // Nothing published yet, or no tensor subscribers read in place (registered tensors are copied
  // into slots, which Publish never takes from a reader): nothing to wait for.
  if (!d.frozen || !d.has_direct) return Status::Ok();
  d.direct_writing = true;  // no new reader from here on
  const auto start = std::chrono::steady_clock::now();
  Deadline deadline(d.options.timeout);
  while (true) {
    int readers = 0;
    for (const auto& v : d.versions) readers += v.readers;
    if (readers == 0) break;
    if (deadline.expired()) {
      // The trainer does not wait longer than its timeout for a slow or stalled subscriber: its
      // read is revoked. It gets a typed error at the end of its step instead of the digests,
      // so it never commits what it read while the trainer writes (staged: its old weights
      // stay; in place: they are marked invalid).
      for (auto& v : d.versions) d.RevokeReaders(&v);
      d.revoked_reads += readers;
      WS_LOG(WARN, "publisher") << d.bound_endpoint << " BeginWrite: revoked the read of "
                                << readers << " subscriber(s) still reading after "
                                << d.options.timeout.count() << " ms";
      break;
    }
    d.cv.WaitFor(&d.mu, kWaitSlice);
  }
  d.wait_for_readers_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The allocated tensors are about to change: no held version describes them any more.
  if (d.has_direct) {
    for (auto& v : d.versions) v.step = -1;
  }
  return Status::Ok();
}

Result<PublishStats> Publisher::Publish(int64_t step, const PublishOptions& options) {
  Impl& d = *impl_;
  auto start = std::chrono::steady_clock::now();
  util::MutexLock publish_lock(&d.publish_mu);
  uint32_t k = 0;
  {
    util::MutexLock lock(&d.mu);
    if (d.closed) return Status::FailedPrecondition("publisher is closed");
    if (step < 0) return Status::InvalidArgument("step ", step, " is negative");
    // A stale step is the state's fault, not the argument's (the same step was fine a moment
    // earlier, e.g. before another thread published it): FailedPrecondition, as a subscriber's
    // stale step is.
    if (step <= d.latest_step) {
      return Status::FailedPrecondition("steps must increase: step ", step, " after step ",
                                        d.latest_step);
    }
    if (step <= d.options.resume_from_step) {
      return Status::FailedPrecondition(
          "step ", step, " is not after step ", d.options.resume_from_step,
          ", which this publisher resumes lineage '", d.welcome.lineage, "' from");
    }
    if (d.tensors.empty()) {
      return Status::FailedPrecondition("Publish() with no tensors registered or allocated");
    }
    if (!d.frozen) {
      WS_RETURN_IF_ERROR(d.Freeze());
      d.frozen = true;
    }
    // The slot to write: one nobody reads that is not the latest (unless it is the only slot),
    // else the oldest such one. That one is taken out of service at once (no new reader pins a
    // version about to be overwritten) and its readers are waited for; past the timeout their
    // pins are revoked (an error at the end of their step, nothing committed), so a stalled
    // subscriber never stalls the trainer.
    int chosen = -1, oldest = -1;
    for (int i = 0; i < static_cast<int>(d.versions.size()); ++i) {
      if (i == d.latest && d.versions.size() > 1) continue;
      if (d.versions[i].readers == 0) {
        chosen = i;
        break;
      }
      if (oldest < 0 || d.versions[i].step < d.versions[oldest].step) oldest = i;
    }
    if (chosen < 0) chosen = oldest;
    Impl::Version& v = d.versions[chosen];
    const int64_t replaced = v.step;
    v.step = -1;
    if (d.latest == chosen) d.latest = -1;
    const auto wait_start = std::chrono::steady_clock::now();
    Deadline deadline(d.options.timeout);
    while (v.readers > 0) {
      if (deadline.expired()) {
        d.revoked_reads += v.readers;
        WS_LOG(WARN, "publisher") << d.bound_endpoint << " Publish(" << step << "): revoked the "
                                  << v.readers << " read(s) of step " << replaced
                                  << " still going after " << d.options.timeout.count()
                                  << " ms, to reuse its slot";
        d.RevokeReaders(&v);
        break;
      }
      d.cv.WaitFor(&d.mu, kWaitSlice);
    }
    d.wait_for_readers_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
    k = static_cast<uint32_t>(chosen);
    v.writing = true;
  }
  Status published =
      d.store->Publish(k, d.digests[k], options.cuda_stream, Deadline(d.options.timeout));
  if (!published.ok()) {
    util::MutexLock lock(&d.mu);
    d.versions[k].writing = false;  // the slot holds no version; the next Publish reuses it
    return published.WithContext("Publish(" + std::to_string(step) + ")");
  }
  PublishStats stats;
  {
    util::MutexLock lock(&d.mu);
    d.versions[k].writing = false;
    d.versions[k].step = step;
    if (d.has_direct) {
      // Allocated tensors are shared by every slot: older versions no longer match them.
      for (uint32_t i = 0; i < d.versions.size(); ++i) {
        if (i != k) d.versions[i].step = -1;
      }
    }
    d.latest = static_cast<int>(k);
    d.latest_step = step;
    d.direct_writing = false;
  }
  d.cv.NotifyAll();
  stats.step = step;
  stats.bytes_copied = d.store->copy_bytes();
  stats.store_bytes = d.store->held_bytes();
  stats.store_device = d.welcome.device;  // read-only once frozen; -1: host memory
  stats.wait_for_readers_seconds = d.wait_for_readers_seconds;
  stats.revoked_reads = d.revoked_reads;
  d.wait_for_readers_seconds = 0;
  d.revoked_reads = 0;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats.gbps = stats.seconds > 0 ? d.manifest.total_bytes() / stats.seconds / 1e9 : 0;
  return stats;
}

Result<std::pair<const wire::Welcome*, int>> Publisher::Impl::WaitLayout(
    const Deadline& deadline, const std::function<bool()>& give_up) {
  util::MutexLock lock(&mu);
  while (!frozen) {
    if (closed) return Status::Unavailable("publisher closed");
    if (give_up()) return Status::PeerLost("subscriber left before the first publish");
    if (deadline.expired()) {
      return Status::Timeout("no version published while the subscriber waited");
    }
    cv.WaitFor(&mu, kWaitSlice);
  }
  if (closed) return Status::Unavailable("publisher closed");
  return std::make_pair(static_cast<const wire::Welcome*>(&welcome), store->fd());
}

Result<util::UniqueFd> Publisher::Impl::ExportAllocationFd(uint32_t index) {
  util::MutexLock lock(&mu);
  if (closed || !frozen) return Status::Unavailable("publisher closed");
  return store->ExportAllocationFd(index);
}

Result<transport::link::Pin> Publisher::Impl::Acquire(const wire::UpdateRequest& request,
                                                      const Deadline& deadline,
                                                      const std::function<bool()>& give_up) {
  WS_ASSIGN_OR_RETURN(transport::link::Pin pin, PinVersion(request, deadline, give_up));
  if (!ring || pin.begin.slot == wire::kNoSlot) return pin;
  // The ring is joined outside `mu`: joining may wait for another round to end.
  Result<int> member = ring->Join(pin.begin.step, deadline, give_up);
  if (!member.ok()) {
    wire::StepEnd unused;
    (void)Unpin(pin, &unused);  // nothing was read
    return member.status();
  }
  pin.ring_member = *member;
  bool revoked = false;
  {
    // Publish or BeginWrite may have revoked the pin before it joined (RevokeAll did not see this
    // member then): leave at once rather than stream tensors the trainer is writing.
    util::MutexLock lock(&mu);
    revoked = versions[pin.begin.slot].epoch != pin.epoch;
  }
  if (revoked) {
    wire::StepEnd unused;
    Status s = Unpin(pin, &unused);  // the revocation's Timeout
    return s.ok() ? Status::Internal("a revoked pin unpinned without an error") : s;
  }
  return pin;
}

Result<transport::link::Pin> Publisher::Impl::PinVersion(const wire::UpdateRequest& request,
                                                         const Deadline& deadline,
                                                         const std::function<bool()>& give_up) {
  util::MutexLock lock(&mu);
  if (request.step >= 0 && request.step <= request.after_step) {
    return Status::FailedPrecondition("step ", request.step,
                                      " is not newer than the subscriber's committed step ",
                                      request.after_step, " (stale)");
  }
  while (true) {
    if (closed) return Status::Unavailable("publisher closed");
    if (!direct_writing && latest >= 0) {
      int target = -1;
      if (request.step < 0) {
        if (latest_step == request.after_step) {
          return transport::link::Pin{{latest_step, wire::kNoSlot}, 0};
        }
        if (latest_step < request.after_step) {
          return Status::FailedPrecondition("subscriber has step ", request.after_step,
                                            " but the publisher's latest is ", latest_step);
        }
        target = latest;
      } else {
        for (int i = 0; i < static_cast<int>(versions.size()); ++i) {
          if (versions[i].step == request.step) target = i;
        }
        if (target < 0 && request.step < latest_step) {
          return Status::NotFound("step ", request.step, " is no longer held (latest is ",
                                  latest_step, ")");
        }
      }
      if (target >= 0) {
        ++versions[target].readers;
        return transport::link::Pin{{versions[target].step, static_cast<uint32_t>(target)},
                                    versions[target].epoch};
      }
    }
    if (give_up()) return Status::PeerLost("subscriber left while waiting for a step");
    if (deadline.expired()) {
      return Status::Timeout(
          "step ", request.step < 0 ? std::string("latest") : std::to_string(request.step),
          " not available within the subscriber's wait of ", request.wait_ms, " ms (latest is ",
          latest_step, ")");
    }
    cv.WaitFor(&mu, kWaitSlice);
  }
}

Status Publisher::Impl::Unpin(const transport::link::Pin& pin, wire::StepEnd* end) {
  // A ring member revoked for holding a bucket too long (or a failed fill) has read nothing it
  // may commit, whatever the version's epoch says.
  Status result = pin.ring_member >= 0 ? ring->Leave(pin.ring_member) : Status::Ok();
  {
    util::MutexLock lock(&mu);
    Version& v = versions[pin.begin.slot];
    if (pin.epoch != v.epoch) {
      --v.revoked;
      result = Status::Timeout("the read of step ", pin.begin.step,
                               " was revoked: the publisher needed its memory (to write a new "
                               "version, or its arena-allocated tensors) after waiting ",
                               options.timeout.count(),
                               " ms (PublisherOptions.timeout) for this subscriber to finish; "
                               "nothing it read may be committed");
    } else if (!result.ok()) {
      --v.readers;
    } else {
      end->step = pin.begin.step;
      end->digests.assign(digests[pin.begin.slot].begin(), digests[pin.begin.slot].end());
      --v.readers;
    }
  }
  cv.NotifyAll();
  return result;
}

int64_t Publisher::latest_step() const {
  util::MutexLock lock(&impl_->mu);
  return impl_->latest_step;
}

const Manifest& Publisher::manifest() const { return impl_->manifest; }

const std::string& Publisher::endpoint() const { return impl_->bound_endpoint; }

const std::string& Publisher::lineage() const { return impl_->welcome.lineage; }

Status Publisher::Close() {
  Impl& d = *impl_;
  util::MutexLock publish_lock(&d.publish_mu);
  {
    util::MutexLock lock(&d.mu);
    if (d.closed) return Status::Ok();
    d.closed = true;
  }
  d.cv.NotifyAll();
  Status result;
  // Reverse order of creation: the server (connections), then the store.
  if (d.server) {
    if (Status s = d.server->Close(); !s.ok()) {
      WS_LOG(WARN, "publisher") << "release: server: " << s;
      result.Update(s);
    }
    d.server.reset();
  }
  for (auto* store : {&d.store, &d.host_store}) {
    if (!*store) continue;
    if (Status s = (*store)->Close(); !s.ok()) result.Update(s);  // logged by the store
    store->reset();
  }
  return result;
}

}  // namespace weightsync
