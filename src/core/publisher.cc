#include "weightsync/publisher.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <unordered_map>

#include "plan/plan.h"
#include "transport/cuda_ipc/gpu_arena.h"
#include "transport/endpoint.h"
#include "transport/shm/arena.h"
#include "transport/shm/shm_server.h"
#include "transport/tcp/tcp_server.h"
#include "util/deadline.h"
#include "util/fail_point.h"
#include "util/hash.h"
#include "util/token.h"
#include "util/logging.h"
#include "util/worker_pool.h"
#include "wire/messages.h"

namespace weightsync {

using transport::shm::Arena;
using transport::shm::ShmServer;
using util::Deadline;

namespace {
// Address space reserved for arena-allocated tensors and slots; only what is used is committed.
constexpr uint64_t kDefaultReserve = 1ull << 40;
constexpr auto kWaitSlice = std::chrono::milliseconds(50);

uint64_t RandomU64() {
  std::random_device random;
  return random() | (uint64_t{random()} << 32);
}

// "a3f9c2e41b7d0c55": a fresh lineage for a publisher that names none.
std::string RandomLineage() {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(RandomU64()));
  return text;
}
}  // namespace

struct Publisher::Impl final : transport::VersionSource {
  PublisherOptions options;
  transport::Endpoint endpoint;
  std::unique_ptr<Arena> arena;
  std::unique_ptr<ShmServer> server;                    // local:// endpoints
  std::unique_ptr<transport::tcp::TcpServer> tcp_server;  // tcp:// endpoints
  std::string bound_endpoint;
  std::unique_ptr<util::WorkerPool> workers;
  int cuda_device = -1;  // ≥ 0: registered tensors are on this CUDA device (GPU arena)
  std::unique_ptr<transport::cuda_ipc::GpuArena> gpu_arena;

  // Registration (before the first Publish), in manifest order.
  struct Source {
    const uint8_t* data = nullptr;  // caller memory (registered) or nullptr (allocated)
    // ≥ 0: the same memory, dtype and shape as registered tensor `alias_of` (tied weights, e.g. an
    // embedding that is also the output projection): published once, under both names.
    int64_t alias_of = -1;
  };
  std::vector<wire::TensorPlacement> placements;
  std::vector<Source> sources;
  std::unordered_map<const uint8_t*, size_t> registered_at;  // data → first tensor registered there
  uint64_t slot_used = 0;         // slot bytes including alignment padding
  uint64_t registered_bytes = 0;  // bytes of registered (copied) tensors
  Manifest manifest;

  // One unit of Publish() work: copy (registered tensors) then hash one segment.
  struct Task {
    const uint8_t* src = nullptr;  // null: hash in place (allocated tensor)
    uint64_t arena_offset = 0;     // direct tensors: from arena start; slot tensors: from slot
    bool in_slot = false;
    uint64_t bytes = 0;
    uint32_t digest = 0;
  };
  std::vector<Task> tasks;
  // Digests of tied tensors' second names: copied from the first name's after hashing.
  std::vector<std::pair<uint32_t, uint32_t>> digest_copies;
  uint64_t copy_bytes = 0;  // bytes one Publish copies (registered tensors), from the tasks
  wire::Welcome welcome;  // identity (session, lineage) set by Create, the layout by Freeze

  mutable std::mutex mu;
  std::condition_variable cv;
  struct Version {
    int64_t step = -1;  // -1: holds no available version
    int readers = 0;
    bool writing = false;
    std::vector<uint64_t> digests;
  };
  std::vector<Version> versions;  // guarded by mu
  int latest = -1;                // guarded by mu
  int64_t latest_step = -1;       // guarded by mu
  bool direct_writing = false;    // guarded by mu
  bool closed = false;            // guarded by mu
  bool frozen = false;            // guarded by mu
  std::mutex publish_mu;          // serializes Publish/BeginWrite/Close

  struct PublishJob {
    Impl* self;
    uint32_t version;
  };
  static void RunTask(void* context, uint32_t index) {
    auto* job = static_cast<PublishJob*>(context);
    Impl* self = job->self;
    const Task& t = self->tasks[index];
    uint8_t* dst = t.in_slot ? self->arena->slot(job->version) + t.arena_offset
                             : self->arena->base() + t.arena_offset;
    if (t.src != nullptr) std::memcpy(dst, t.src, t.bytes);
    uint64_t digest = util::Hash64(dst, t.bytes);
    if (util::FailPoints::Check("publisher.corrupt_after_digest").action ==
        util::FailAction::kFlip) {
      dst[t.bytes / 2] ^= 0x01;  // the digest now describes bytes the arena no longer holds
    }
    self->versions[job->version].digests[t.digest] = digest;
  }

  Status Freeze();
  Result<std::pair<const wire::Welcome*, int>> WaitLayout(
      const Deadline& deadline, const std::function<bool()>& give_up) override;
  Result<wire::StepBegin> Acquire(const wire::UpdateRequest& request, const Deadline& deadline,
                                  const std::function<bool()>& give_up) override;
  void Unpin(const wire::StepBegin& begin, wire::StepEnd* end) override;
  const uint8_t* arena_base() const override { return arena->base(); }
  bool has_direct() const { return arena && arena->direct_bytes() > 0; }
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
    return Status::InvalidArgument("PublisherOptions.slots = ", options.slots,
                                   ": must be 1..", wire::kMaxSlots);
  }
  if (options.max_connections < 1) {
    return Status::InvalidArgument("PublisherOptions.max_connections must be ≥ 1");
  }
  if (options.resume_from_step < -1) {
    return Status::InvalidArgument("PublisherOptions.resume_from_step = ",
                                   options.resume_from_step, ": must be ≥ 0, or -1 for none");
  }
  if (options.resume_from_step >= 0 && options.lineage.empty()) {
    return Status::InvalidArgument(
        "PublisherOptions.resume_from_step = ", options.resume_from_step,
        " needs PublisherOptions.lineage: the lineage it resumes");
  }
  if (!options.lineage.empty()) {
    WS_RETURN_IF_ERROR(wire::CheckLineage(options.lineage).WithContext("PublisherOptions"));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  // A new session per Create: subscribers never take this publisher's step N for a step N of an
  // earlier one (a restarted trainer), even under the same lineage.
  impl->welcome.session_id = RandomU64();
  impl->welcome.lineage = options.lineage.empty() ? RandomLineage() : options.lineage;
  impl->welcome.resumed_from = options.resume_from_step;
  WS_ASSIGN_OR_RETURN(impl->endpoint, transport::ParseEndpoint(options.endpoint));
  WS_ASSIGN_OR_RETURN(impl->arena, Arena::Create(impl->endpoint.name, kDefaultReserve));
  if (impl->endpoint.kind == transport::Endpoint::Kind::kTcp) {
    transport::tcp::TcpServerOptions tcp_options;
    WS_ASSIGN_OR_RETURN(tcp_options.token, util::LoadToken(options.token, options.token_file));
    tcp_options.max_connections = options.max_connections;
    tcp_options.timeout = options.timeout;
    tcp_options.handshake_timeout = std::min(options.timeout, std::chrono::milliseconds(2000));
    WS_ASSIGN_OR_RETURN(impl->tcp_server, transport::tcp::TcpServer::Start(
                                              impl->endpoint, tcp_options, impl.get()));
    impl->bound_endpoint = impl->tcp_server->bound().ToString();
  } else {
    transport::shm::ServerOptions server_options{options.max_connections, options.timeout};
    WS_ASSIGN_OR_RETURN(impl->server,
                        ShmServer::Start(impl->endpoint, server_options, impl.get()));
    impl->bound_endpoint = impl->endpoint.ToString();
  }
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
  std::lock_guard<std::mutex> publish_lock(d.publish_mu);
  {
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.closed) return Status::FailedPrecondition("publisher is closed");
    if (d.frozen) return Status::FailedPrecondition("Register() after the first Publish()");
  }
  // One memory kind per publisher: host tensors, or tensors of one CUDA device.
  int device = d.placements.empty() ? (tensors.empty() || !tensors[0].view.device.is_cuda()
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
  if (device >= 0 && d.arena->direct_bytes() > 0) {
    return Status::InvalidArgument("CUDA tensors cannot join arena-allocated host tensors");
  }
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& t : tensors) specs.push_back({t.name, t.view.dtype, t.view.shape, 0});
  // Validates the new tensors, their names also against earlier registrations: O(new tensors).
  const size_t first = d.manifest.size();
  WS_RETURN_IF_ERROR(d.manifest.Append(std::move(specs)));
  for (size_t i = first; i < d.manifest.size(); ++i) {
    const TensorSpec& spec = d.manifest.tensors()[i];
    if (tensors[i - first].view.data == nullptr && spec.nbytes > 0) {
      d.manifest.RemoveLast(d.manifest.size() - first);
      return Status::InvalidArgument("tensor '", spec.name, "': null data pointer");
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
    if (alias >= 0) {
      d.placements.push_back({spec, wire::Region::kSlot, d.placements[alias].offset});
    } else {
      d.slot_used = (d.slot_used + 63) / 64 * 64;
      d.placements.push_back({spec, wire::Region::kSlot, d.slot_used});
      d.slot_used += spec.nbytes;
      d.registered_bytes += spec.nbytes;
    }
    d.sources.push_back({data, alias});
  }
  d.cuda_device = device;
  return Status::Ok();
}

Result<TensorView> Publisher::Allocate(const std::string& name, DType dtype,
                                       const std::vector<int64_t>& shape) {
  Impl& d = *impl_;
  std::lock_guard<std::mutex> publish_lock(d.publish_mu);
  {
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.closed) return Status::FailedPrecondition("publisher is closed");
    if (d.frozen) return Status::FailedPrecondition("Allocate() after the first Publish()");
  }
  if (d.cuda_device >= 0) {
    return Status::NotSupported("Allocate() on a publisher of CUDA tensors (cuda:",
                                d.cuda_device, "): arena-allocated GPU tensors are not supported "
                                "yet; register the tensors instead");
  }
  WS_RETURN_IF_ERROR(d.manifest.Append({{name, dtype, shape, 0}}));
  const TensorSpec& spec = d.manifest.tensors().back();
  Result<uint64_t> offset = d.arena->AllocateDirect(spec.nbytes);
  if (!offset.ok()) {
    d.manifest.RemoveLast(1);  // a failed Allocate leaves nothing behind
    return offset.status();
  }
  d.placements.push_back({spec, wire::Region::kDirect, *offset});
  d.sources.push_back({nullptr});
  return TensorView{d.arena->base() + *offset, dtype, shape};
}

// Builds everything a Publish needs. Idempotent: a failed Freeze keeps nothing it built (the
// arena's own Freeze may stay done), so a retried Publish freezes again from scratch and copies
// each tensor once.
Status Publisher::Impl::Freeze() {
  const bool gpu = cuda_device >= 0;
  const uint64_t segment_bytes =
      options.segment_bytes > 0 ? options.segment_bytes : (gpu ? 64ull << 20 : 8ull << 20);
  welcome.slot_count = static_cast<uint32_t>(options.slots);
  welcome.segment_bytes = segment_bytes;
  welcome.tensors = placements;

  std::vector<Task> new_tasks;
  std::vector<std::pair<uint32_t, uint32_t>> new_digest_copies;  // (alias digest, primary's)
  std::vector<uint32_t> first_digest(placements.size());
  uint64_t new_copy_bytes = 0;
  uint32_t digest = 0;
  for (size_t i = 0; i < placements.size(); ++i) {
    const auto& p = placements[i];
    first_digest[i] = digest;
    if (sources[i].alias_of >= 0) {
      // Published once: the alias's digests are its original's, segment for segment.
      const uint32_t original = first_digest[sources[i].alias_of];
      for (uint64_t off = 0, k = 0; off < p.spec.nbytes; off += segment_bytes, ++k) {
        new_digest_copies.emplace_back(digest++, original + static_cast<uint32_t>(k));
      }
      continue;
    }
    for (uint64_t off = 0; off < p.spec.nbytes; off += segment_bytes) {
      Task t;
      t.bytes = std::min(segment_bytes, p.spec.nbytes - off);
      t.in_slot = p.region == wire::Region::kSlot;
      t.arena_offset = p.offset + off;
      t.src = sources[i].data != nullptr ? sources[i].data + off : nullptr;
      t.digest = digest++;
      if (t.src != nullptr) new_copy_bytes += t.bytes;
      new_tasks.push_back(t);
    }
  }
  std::unique_ptr<transport::cuda_ipc::GpuArena> new_gpu_arena;
  if (gpu) {
    std::vector<transport::cuda_ipc::GpuArena::Copy> copies;
    for (size_t i = 0; i < placements.size(); ++i) {
      if (sources[i].alias_of >= 0) continue;
      copies.push_back({sources[i].data, placements[i].offset, placements[i].spec.nbytes});
    }
    std::vector<transport::cuda_ipc::GpuArena::Segment> segments;
    for (const Task& t : new_tasks) segments.push_back({t.arena_offset, t.bytes, t.digest});
    WS_ASSIGN_OR_RETURN(new_gpu_arena, transport::cuda_ipc::GpuArena::Create(
                                           cuda_device, slot_used, welcome.slot_count,
                                           std::move(copies), std::move(segments), digest));
    welcome.arena_kind = wire::ArenaKind::kCudaMem;
    welcome.device = cuda_device;
    welcome.digest_kind = wire::DigestKind::kGpu64;
    welcome.arena_bytes = new_gpu_arena->arena_bytes();
    welcome.direct_offset = 0;
    welcome.direct_bytes = 0;
    welcome.slots_offset = 0;
    welcome.slot_bytes = new_gpu_arena->slot_bytes();
  } else {
    WS_RETURN_IF_ERROR(arena->Freeze(slot_used, welcome.slot_count));
    welcome.arena_bytes = arena->arena_bytes();
    welcome.direct_offset = 0;
    welcome.direct_bytes = arena->direct_bytes();
    welcome.slots_offset = arena->slots_offset();
    welcome.slot_bytes = arena->slot_bytes();
  }
  WS_RETURN_IF_ERROR(plan::ValidateLayout(welcome).WithContext("publisher layout (bug)"));
  WS_FAIL_POINT_RETURN("publisher.freeze");
  int threads = options.copy_threads > 0 ? options.copy_threads : util::DefaultThreads();
  workers = std::make_unique<util::WorkerPool>(threads);
  versions.resize(options.slots);
  for (auto& v : versions) v.digests.assign(digest, 0);
  tasks = std::move(new_tasks);
  digest_copies = std::move(new_digest_copies);
  copy_bytes = gpu ? registered_bytes : new_copy_bytes;
  gpu_arena = std::move(new_gpu_arena);
  WS_LOG(INFO, "publisher") << bound_endpoint << " prepared: " << placements.size()
                            << " tensors, " << manifest.total_bytes() << " bytes ("
                            << welcome.direct_bytes << " arena-allocated), " << options.slots
                            << " slots of " << welcome.slot_bytes << " bytes "
                            << (gpu ? "on cuda:" + std::to_string(cuda_device)
                                    : std::string("in host memory"))
                            << ", " << tasks.size() << " segments, "
                            << (gpu ? std::to_string(tasks.size() * options.slots) +
                                          " prepared digest launches"
                                    : std::to_string(workers->size()) + " threads");
  return Status::Ok();
}

Status Publisher::BeginWrite() {
  Impl& d = *impl_;
  std::lock_guard<std::mutex> publish_lock(d.publish_mu);
  std::unique_lock<std::mutex> lock(d.mu);
  if (d.closed) return Status::FailedPrecondition("publisher is closed");
  if (!d.frozen) return Status::Ok();  // nothing published yet: nobody can be reading
  d.direct_writing = true;
  Deadline deadline(d.options.timeout);
  while (true) {
    int readers = 0;
    for (const auto& v : d.versions) readers += v.readers;
    if (readers == 0) break;
    if (deadline.expired()) {
      d.direct_writing = false;
      d.cv.notify_all();
      return Status::Timeout("BeginWrite: ", readers, " subscriber(s) still reading after ",
                             d.options.timeout.count(), " ms");
    }
    d.cv.wait_for(lock, kWaitSlice);
  }
  // The allocated tensors are about to change: no held version describes them any more.
  if (d.has_direct()) {
    for (auto& v : d.versions) v.step = -1;
  }
  return Status::Ok();
}

Result<PublishStats> Publisher::Publish(int64_t step, const PublishOptions& options) {
  Impl& d = *impl_;
  auto start = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> publish_lock(d.publish_mu);
  uint32_t k = 0;
  {
    std::unique_lock<std::mutex> lock(d.mu);
    if (d.closed) return Status::FailedPrecondition("publisher is closed");
    if (step < 0) return Status::InvalidArgument("step ", step, " is negative");
    if (step <= d.latest_step) {
      return Status::InvalidArgument("steps must increase: step ", step, " after step ",
                                     d.latest_step);
    }
    if (step <= d.options.resume_from_step) {
      return Status::InvalidArgument("step ", step, " is not after step ",
                                     d.options.resume_from_step, ", which this publisher resumes "
                                     "lineage '", d.welcome.lineage, "' from");
    }
    if (d.placements.empty()) {
      return Status::FailedPrecondition("Publish() with no tensors registered or allocated");
    }
    if (!d.frozen) {
      WS_RETURN_IF_ERROR(d.Freeze());
      d.frozen = true;
    }
    // A slot nobody reads and that is not the latest (unless it is the only slot).
    Deadline deadline(d.options.timeout);
    int chosen = -1;
    while (true) {
      for (int i = 0; i < static_cast<int>(d.versions.size()); ++i) {
        if ((i != d.latest || d.versions.size() == 1) && d.versions[i].readers == 0) {
          chosen = i;
          break;
        }
      }
      if (chosen >= 0) break;
      if (deadline.expired()) {
        return Status::Timeout("Publish(", step, "): every slot is still being read after ",
                               d.options.timeout.count(), " ms");
      }
      d.cv.wait_for(lock, kWaitSlice);
    }
    k = static_cast<uint32_t>(chosen);
    d.versions[k].step = -1;
    d.versions[k].writing = true;
    if (d.latest == chosen) d.latest = -1;
  }
  if (d.gpu_arena) {
    Status s = d.gpu_arena->Publish(k, d.versions[k].digests.data(), options.cuda_stream,
                                    Deadline(d.options.timeout));
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(d.mu);
      d.versions[k].writing = false;  // the slot holds no version; the next Publish reuses it
      return s.WithContext("Publish(" + std::to_string(step) + ")");
    }
  } else {
    Impl::PublishJob job{&d, k};
    d.workers->Run(static_cast<uint32_t>(d.tasks.size()), &Impl::RunTask, &job);
  }
  std::vector<uint64_t>& digests = d.versions[k].digests;
  for (auto [alias, original] : d.digest_copies) digests[alias] = digests[original];
  PublishStats stats;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    d.versions[k].writing = false;
    d.versions[k].step = step;
    if (d.has_direct()) {
      // Allocated tensors are shared by every slot: older versions no longer match them.
      for (uint32_t i = 0; i < d.versions.size(); ++i) {
        if (i != k) d.versions[i].step = -1;
      }
    }
    d.latest = static_cast<int>(k);
    d.latest_step = step;
    d.direct_writing = false;
  }
  d.cv.notify_all();
  stats.step = step;
  stats.bytes_copied = d.copy_bytes;
  stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats.gbps = stats.seconds > 0 ? d.manifest.total_bytes() / stats.seconds / 1e9 : 0;
  return stats;
}

Result<std::pair<const wire::Welcome*, int>> Publisher::Impl::WaitLayout(
    const Deadline& deadline, const std::function<bool()>& give_up) {
  std::unique_lock<std::mutex> lock(mu);
  while (!frozen) {
    if (closed) return Status::Unavailable("publisher closed");
    if (give_up()) return Status::PeerLost("subscriber left before the first publish");
    if (deadline.expired()) {
      return Status::Timeout("no version published while the subscriber waited");
    }
    cv.wait_for(lock, kWaitSlice);
  }
  if (closed) return Status::Unavailable("publisher closed");
  return std::make_pair(static_cast<const wire::Welcome*>(&welcome),
                        gpu_arena ? gpu_arena->fd() : arena->fd());
}

Result<wire::StepBegin> Publisher::Impl::Acquire(const wire::UpdateRequest& request,
                                                 const Deadline& deadline,
                                                 const std::function<bool()>& give_up) {
  std::unique_lock<std::mutex> lock(mu);
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
        if (latest_step == request.after_step) return wire::StepBegin{latest_step, wire::kNoSlot};
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
        return wire::StepBegin{versions[target].step, static_cast<uint32_t>(target)};
      }
    }
    if (give_up()) return Status::PeerLost("subscriber left while waiting for a step");
    if (deadline.expired()) {
      return Status::Timeout("step ", request.step < 0 ? std::string("latest")
                                                       : std::to_string(request.step),
                             " not available within the subscriber's wait of ", request.wait_ms,
                             " ms (latest is ", latest_step, ")");
    }
    cv.wait_for(lock, kWaitSlice);
  }
}

void Publisher::Impl::Unpin(const wire::StepBegin& begin, wire::StepEnd* end) {
  {
    std::lock_guard<std::mutex> lock(mu);
    Version& v = versions[begin.slot];
    end->step = begin.step;
    end->digests.assign(v.digests.begin(), v.digests.end());
    --v.readers;
  }
  cv.notify_all();
}

int64_t Publisher::latest_step() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->latest_step;
}

const Manifest& Publisher::manifest() const { return impl_->manifest; }

const std::string& Publisher::endpoint() const { return impl_->bound_endpoint; }

const std::string& Publisher::lineage() const { return impl_->welcome.lineage; }

Status Publisher::Close() {
  Impl& d = *impl_;
  std::lock_guard<std::mutex> publish_lock(d.publish_mu);
  {
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.closed) return Status::Ok();
    d.closed = true;
  }
  d.cv.notify_all();
  Status result;
  // Reverse order of creation: server (connections), workers, arena.
  if (d.server) {
    if (Status s = d.server->Close(); !s.ok()) {
      WS_LOG(WARN, "publisher") << "release: server: " << s;
      result.Update(s);
    }
    d.server.reset();
  }
  if (d.tcp_server) {
    if (Status s = d.tcp_server->Close(); !s.ok()) {
      WS_LOG(WARN, "publisher") << "release: tcp server: " << s;
      result.Update(s);
    }
    d.tcp_server.reset();
  }
  d.workers.reset();
  if (d.gpu_arena) {
    if (Status s = d.gpu_arena->Close(); !s.ok()) {
      WS_LOG(WARN, "publisher") << "release: GPU arena: " << s;
      result.Update(s);
    }
    d.gpu_arena.reset();
  }
  if (d.arena) {
    if (Status s = d.arena->Close(); !s.ok()) result.Update(s);  // logged by the arena
    d.arena.reset();
  }
  return result;
}

}  // namespace weightsync
