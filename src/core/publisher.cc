#include "weightsync/publisher.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <unordered_map>

#include "core/destination_set.h"
#include "core/publisher_relay.h"
#include "plan/plan.h"
#include "transport/publisher_transport.h"
#include "transport/store/bucket_ring.h"
#include "transport/store/store_table.h"
#include "transport/store/stream_progress.h"
#include "transport/store/version_store.h"
#include "util/deadline.h"
#include "util/fail_point.h"
#include "util/logging.h"
#include "util/mutex.h"
#include "util/token.h"
#include "weightsync/region.h"
#include "wire/members_report.h"
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
struct Publisher::Impl final : transport::VersionSource {
  PublisherOptions options;
  std::unique_ptr<transport::PublisherTransport> transport;  // the endpoint and its server
  std::string bound_endpoint;
  // The host store exists from Create (Allocate() needs it); a publisher of CUDA tensors keeps
  // its versions in a GPU store instead, chosen at the first Publish.
  std::unique_ptr<transport::store::VersionStore> host_store;
  std::unique_ptr<transport::store::VersionStore> store;  // set by Freeze
  int cuda_device = -1;  // ≥ 0: registered tensors are on this CUDA device

  // Registration (before the first Publish), in manifest order.
  std::vector<transport::store::PublishedTensor> tensors;
  std::unordered_map<const uint8_t*, size_t> registered_at;  // data → first tensor registered there
  uint64_t slot_used = 0;   // slot bytes including alignment padding
  bool has_direct = false;  // some tensor is read where it is (Allocate, or the store's kind)
  // The store's versions are the registered tensors (zero-copy, rings; StoreEntry): sessions
  // read or send them where they are.
  bool version_is_tensors = false;
  Manifest manifest;
  wire::Welcome welcome;  // identity (session, lineage) set by Create, the layout by Freeze

  // Registration state above is written only before the first Publish (under publish_mu) and
  // read-only once `frozen`: the servers' threads read the Welcome and the store after that.
  util::Mutex publish_mu;  // serializes Register/Allocate/Publish/BeginWrite/Close
  mutable util::Mutex mu;  // frozen and closed, which sessions wait on
  util::CondVar cv;
  // Which slot holds which step, who reads it (store/version_slots.h); armed by Freeze.
  transport::store::VersionSlots versions;
  // What waiting for readers cost the trainer since the last Publish (its BeginWrite and its own
  // wait for a free slot), reported by the next Publish.
  transport::store::WaitCost waited WS_GUARDED_BY(publish_mu);
  bool closed WS_GUARDED_BY(mu) = false;
  bool frozen WS_GUARDED_BY(mu) = false;

  // Cut-through (PublisherRelayAccess::BeginStream): the version streaming into `stream_slot`
  // (-1: none), how much of each slot's last streamed version landed (one per slot, so a session
  // still sending a finished version never sees the next one's progress), and each tensor's place
  // in a slot and size (set once).
  std::unique_ptr<transport::store::StreamProgress[]> streams WS_GUARDED_BY(publish_mu);
  int stream_slot WS_GUARDED_BY(publish_mu) = -1;
  int64_t stream_step WS_GUARDED_BY(publish_mu) = -1;
  std::chrono::steady_clock::time_point stream_start WS_GUARDED_BY(publish_mu);
  std::vector<uint64_t> stream_offsets WS_GUARDED_BY(publish_mu);
  std::vector<uint64_t> stream_bytes WS_GUARDED_BY(publish_mu);

  // Membership (Publisher::Members): the sessions admitted, in the order they came; listed once
  // ready.
  struct Member {
    uint64_t id = 0;
    MemberInfo info;
    bool ready = false;
    std::vector<wire::ReportedMember> subtree;  // as its latest report said (a relay's)
    // As its latest report said: how many more children it takes directly (a relay that has not
    // reported yet: no bound known).
    uint32_t room = wire::kNoBound;
  };
  mutable util::Mutex members_mu;
  std::vector<Member> members WS_GUARDED_BY(members_mu);
  // Newcomers redirected to each relay (by endpoint) that its reports do not show yet: counted
  // against its room and load until a report shows its room smaller by as many, or
  // kSentForgottenAfter passed (a newcomer that never arrived, or children that left meanwhile).
  struct Redirects {
    int64_t count = 0;
    uint32_t room_seen = wire::kNoBound;  // its room as reported when they were sent
    std::chrono::steady_clock::time_point last;
  };
  std::unordered_map<std::string, Redirects> sent_to WS_GUARDED_BY(members_mu);
  static constexpr std::chrono::seconds kSentForgottenAfter{5};
  int64_t SentTo(const std::string& relay) const WS_REQUIRES(members_mu) {
    const auto it = sent_to.find(relay);
    if (it == sent_to.end()) return 0;
    return std::chrono::steady_clock::now() - it->second.last > kSentForgottenAfter
               ? 0
               : it->second.count;
  }
  // A report says relay `relay` has room `room` now: the newcomers it took since count no more.
  void Arrived(const std::string& relay, uint32_t room) WS_REQUIRES(members_mu) {
    const auto it = sent_to.find(relay);
    if (it == sent_to.end()) return;
    Redirects& sent = it->second;
    if (sent.room_seen != wire::kNoBound && room < sent.room_seen) {
      sent.count -= sent.room_seen - room;
    }
    sent.room_seen = room;
    if (sent.count <= 0 || std::chrono::steady_clock::now() - sent.last > kSentForgottenAfter) {
      sent_to.erase(it);
    }
  }
  // A relay's serving publisher tells its relay when its membership changed (a member joined,
  // left, asked or reported), so the relay reports its subtree upward (PublisherRelayAccess).
  std::function<void()> members_changed WS_GUARDED_BY(members_mu);
  void MembersChanged() WS_EXCLUDES(members_mu) {
    std::function<void()> tell;
    {
      util::MutexLock lock(&members_mu);
      tell = members_changed;
    }
    if (tell) tell();
  }
  uint64_t next_member WS_GUARDED_BY(members_mu) = 1;
  bool said_no_relay WS_GUARDED_BY(members_mu) = false;
  Member* FindMember(uint64_t id) WS_REQUIRES(members_mu) {
    for (Member& m : members) {
      if (m.id == id) return &m;
    }
    return nullptr;
  }
  // The relay a newcomer past max_direct goes to (docs/relays.md, "Topology"): anywhere in the
  // tree as the members' reports list it, one with room for a child of its own (its bound less
  // the children it reported and the newcomers sent to it since), the nearest first: of the
  // newcomer's locality, then the shallowest (a relay re-attaching with its subtree lands high),
  // then the one with the fewest below it. Never the relay it just lost (hello.avoid) nor itself
  // (a relay re-attaching), nor anything below either (its steps would go through them). With no
  // relay that has room: the direct relay with the fewest below it, which sends it further down.
  // Empty when there is no relay at all.
  struct Placement {
    Member* member = nullptr;  // the direct member it goes to, or whose subtree holds the relay
    const wire::ReportedMember* below = nullptr;  // that relay, when deeper than depth 1
    const std::string& endpoint() const { return below ? below->serves : member->info.serves; }
  };
  Placement RelayFor(const wire::Hello& hello) WS_REQUIRES(members_mu) {
    auto near = [&](const std::string& locality) {
      return !hello.locality.empty() && locality == hello.locality;
    };
    auto shunned = [&](const std::string& serves) {
      return serves.empty() || serves == hello.avoid || serves == hello.serves;
    };
    Placement best, fallback;
    // Ordered by: locality, then depth, then load (below + newcomers sent since it said).
    std::tuple<bool, uint32_t, int64_t> best_key{}, fallback_key{};
    auto consider = [&](Placement p, bool is_near, uint32_t depth, int64_t load, int64_t room) {
      const std::tuple<bool, uint32_t, int64_t> key{!is_near, depth, load};
      if (room > 0 && (best.member == nullptr || key < best_key)) {
        best = p;
        best_key = key;
      }
      if (depth == 1 && (fallback.member == nullptr || key < fallback_key)) {
        fallback = p;
        fallback_key = key;
      }
    };
    auto room_left = [](uint32_t room, int64_t sent) {
      return room == wire::kNoBound ? INT64_MAX : static_cast<int64_t>(room) - sent;
    };
    for (Member& m : members) {
      if (shunned(m.info.serves)) continue;
      const int64_t sent = SentTo(m.info.serves);
      consider({&m, nullptr}, near(m.info.locality), 1, m.info.below + sent,
               room_left(m.room, sent));
      uint32_t skip_below = 0;  // > 0: inside the subtree of a shunned relay at this depth
      for (const wire::ReportedMember& e : m.subtree) {
        if (skip_below > 0 && e.depth > skip_below) continue;
        skip_below = 0;
        if (e.serves.empty()) continue;
        if (shunned(e.serves)) {
          skip_below = e.depth;
          continue;
        }
        const int64_t since = SentTo(e.serves);
        consider({&m, &e}, near(e.locality), e.depth + 1, e.below + since,
                 room_left(e.room, since));
      }
    }
    return best.member != nullptr ? best : fallback;
  }
  std::string Admit(const std::string& peer, const wire::Hello& hello, uint64_t* member) override {
    util::MutexLock lock(&members_mu);
    if (options.max_direct > 0 && members.size() >= static_cast<size_t>(options.max_direct)) {
      if (Placement relay = RelayFor(hello); relay.member != nullptr) {
        Redirects& sent = sent_to[relay.endpoint()];
        sent.count = SentTo(relay.endpoint()) + 1;
        sent.room_seen = relay.below ? relay.below->room : relay.member->room;
        sent.last = std::chrono::steady_clock::now();
        return relay.endpoint();
      }
      if (!said_no_relay) {
        said_no_relay = true;
        WS_LOG(INFO, "topology") << "past max_direct=" << options.max_direct
                                 << " with no relay to redirect to: " << peer
                                 << " is served directly (said once)";
      }
    }
    Member m{next_member++, MemberInfo{peer}};
    m.info.serves = hello.serves;
    m.info.locality = hello.locality;
    members.push_back(std::move(m));
    *member = members.back().id;
    return {};
  }
  void Ready(uint64_t member) override {
    {
      util::MutexLock lock(&members_mu);
      if (Member* m = FindMember(member); m != nullptr) m->ready = true;
    }
    MembersChanged();
  }
  void Requested(uint64_t member, int64_t held, int64_t sending, uint32_t below) override {
    // A request names the step it holds to be answered "up to date" or sent a newer one; under
    // the strict lineage policy, after a restart, that is a step of the session before, which may
    // lie past this session's latest: not one it holds here (MemberInfo::held_step).
    const int64_t latest = versions.latest_step();
    {
      util::MutexLock lock(&members_mu);
      if (Member* m = FindMember(member); m != nullptr) {
        m->info.held_step = held > latest ? -1 : held;
        m->info.receiving_step = sending;
        m->info.below = below;
      }
    }
    MembersChanged();
  }
  Status Reported(uint64_t member, wire::MembersReport& report) override;
  // How many it serves: its ready members and everyone they said they serve.
  uint32_t Below() const WS_REQUIRES(members_mu) {
    uint64_t below = 0;
    for (const Member& m : members) {
      if (m.ready) below += 1 + static_cast<uint64_t>(m.info.below);
    }
    return static_cast<uint32_t>(std::min<uint64_t>(below, UINT32_MAX));
  }
  // How many more members it takes directly before it redirects newcomers (wire::kNoBound: no
  // bound); the sessions admitted count, as Admit counts them.
  uint32_t Room() const WS_REQUIRES(members_mu) {
    if (options.max_direct <= 0) return wire::kNoBound;
    const auto bound = static_cast<size_t>(options.max_direct);
    return static_cast<uint32_t>(bound > members.size() ? bound - members.size() : 0);
  }
  // Every ready member followed by the subtree it reported, depth-first (Publisher::Tree), into
  // `out`'s entries (their storage reused: a steady relay's report allocates nothing): at most
  // `max` of them, none deeper than `max_depth` (dropping deeper ones keeps it depth-first).
  void FillTree(std::vector<wire::ReportedMember>* out, size_t max, uint32_t max_depth) const
      WS_REQUIRES(members_mu);
  void Sent(uint64_t member, int64_t step) override {
    util::MutexLock lock(&members_mu);
    if (Member* m = FindMember(member); m != nullptr) {
      m->info.sent_step = step;
      m->info.receiving_step = -1;
    }
  }
  void Left(uint64_t member) override {
    {
      util::MutexLock lock(&members_mu);
      std::erase_if(members, [&](const Member& m) { return m.id == member; });
    }
    MembersChanged();
  }

  Status Freeze() WS_REQUIRES(mu);
  // The checks every new version passes (steps increase, tensors registered, not closed), and
  // the layout frozen at the first.
  Status BeginVersion(int64_t step) WS_REQUIRES(publish_mu);
  // What Publish (and a finished stream) reports of the version written into `slot`.
  PublishStats Report(int64_t step, uint32_t slot, std::chrono::steady_clock::time_point start)
      WS_REQUIRES(publish_mu);
  // PublishOptions::wait_for_deltas: the version's delta encoded, as Publish's own work.
  Status AwaitDeltas(int64_t step, uint32_t slot);
  // A relay's version comes with its trainer's digests, one per segment of this store's layout.
  Status CheckGiven(int64_t step, size_t digests) const {
    if (digests == store->digest_count()) return Status::Ok();
    return Status::InvalidArgument(
        "relay ", bound_endpoint, ": step ", step, " comes with ", digests,
        " digests from its publisher, but this relay's store cuts the version into ",
        store->digest_count(), " segments of at most ", welcome.segment_bytes,
        " bytes (a layout that differs from the publisher's: a bug)");
  }
  // Publish; with `given` (a relay's, PublisherRelayAccess) the version's digests as its trainer
  // published them: the store copies without hashing.
  // `writer`: a relay's update deadline, which also bounds the wait for a slot's readers.
  Result<PublishStats> PublishVersion(int64_t step, const PublishOptions& call,
                                      const std::span<const uint64_t>* given,
                                      const Deadline* writer = nullptr);
  Result<std::pair<const wire::Welcome*, int>> WaitLayout(
      const Deadline& deadline, const std::function<bool()>& give_up) override;
  Result<util::UniqueFd> ExportAllocationFd(uint32_t index) override;
  Result<transport::Pin> Acquire(const wire::UpdateRequest& request, const Deadline& deadline,
                                 const std::function<bool()>& give_up) override {
    return versions.Acquire(request, deadline, give_up);
  }
  // A session reading the whole version at once (tcp) pins it without joining a ring's round.
  Result<transport::Pin> AcquireWhole(const wire::UpdateRequest& request, const Deadline& deadline,
                                      const std::function<bool()>& give_up) override {
    return versions.Acquire(request, deadline, give_up, /*whole=*/true);
  }
  Status Unpin(const transport::Pin& pin, wire::StepEnd* end) override {
    return versions.Unpin(pin, end);
  }
  Result<uint32_t> AwaitBucket(const transport::Pin& pin, uint32_t bucket,
                               const Deadline& deadline) override {
    return versions.AwaitBucket(pin, bucket, deadline);
  }
  Status ReleaseBucket(const transport::Pin& pin, uint32_t bucket) override {
    return versions.ReleaseBucket(pin, bucket);
  }
  const uint8_t* arena_base() const override { return store->base(); }
  Result<const transport::store::SlotDelta*> AwaitDelta(const transport::Pin& pin,
                                                        int64_t base_step,
                                                        const Deadline& deadline) override {
    if (pin.begin.slot == wire::kNoSlot) return nullptr;
    // The base is set before the version is published (only the encode runs on after it): a
    // session that will send the step whole never waits for an encode.
    const transport::store::SlotDelta* delta = store->delta(pin.begin.slot);
    if (delta == nullptr || base_step < 0 || delta->base_step != base_step) return nullptr;
    return store->AwaitDelta(pin.begin.slot, deadline);
  }
  // `tensors` is read-only once frozen (Register refuses then), which sessions wait for. A ring's
  // or a zero-copy publisher's version is its registered tensors.
  bool VersionIsTensors() const override { return version_is_tensors; }
  const uint8_t* TensorBytes(uint32_t tensor) const override {
    return version_is_tensors && tensor < tensors.size() ? tensors[tensor].source : nullptr;
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
  if (options.max_direct < 0) {
    return Status::InvalidArgument("PublisherOptions.max_direct must be ≥ 0 (0: no bound), got ",
                                   options.max_direct);
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
  WS_ASSIGN_OR_RETURN(impl->transport,
                      transport::PublisherTransport::ForEndpoint(options.endpoint));
  WS_ASSIGN_OR_RETURN(impl->host_store, transport::store::NewHostStore(impl->transport->name()));
  WS_RETURN_IF_ERROR(impl->transport->Start(options, impl.get()));
  impl->bound_endpoint = impl->transport->bound();
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
  if (!store) {
    transport::store::StoreRequest request{&options, cuda_device, transport->name(), &host_store};
    WS_ASSIGN_OR_RETURN(const transport::store::StoreEntry* entry,
                        transport::store::ChooseStore(request));
    WS_ASSIGN_OR_RETURN(store, entry->make(request));
    // Versions that are the tensors are read where they are: the trainer fences its writes.
    version_is_tensors = entry->versions_are_the_tensors;
    has_direct = has_direct || version_is_tensors;
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
  layout.local_readers = transport->local_readers();
  // Deltas pay where bytes are dear: over tcp (kAuto), or wherever asked (kAlways).
  layout.delta_room = options.delta == DeltaMode::kAlways ? transport::store::DeltaRoom::kWhole
                      : options.delta == DeltaMode::kAuto && !layout.local_readers
                          ? transport::store::DeltaRoom::kQuarter
                          : transport::store::DeltaRoom::kNone;
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
  const bool ring_store = store->version_buckets() > 0;
  const int held = ring_store ? 1 : options.slots;
  std::unique_ptr<transport::store::BucketRing> ring;
  if (ring_store) {
    ring = std::make_unique<transport::store::BucketRing>(
        welcome.slot_count, store->version_buckets(), options.max_connections, options.timeout,
        [store = store.get()](uint32_t bucket, uint32_t slot) {
          // Tests: a fill after the first, so that a subscriber has copied part of the version.
          if (bucket > 0) WS_FAIL_POINT_RETURN("publisher.ring_fill");
          return store->FillBucket(bucket, slot);
        });
  }
  versions.Arm(held, store->digest_count(), has_direct, std::move(ring), options.timeout,
               bound_endpoint);
  WS_LOG(INFO, "publisher") << bound_endpoint << " prepared: " << tensors.size() << " tensors, "
                            << manifest.total_bytes() << " bytes (" << welcome.direct_bytes
                            << " arena-allocated), " << store->Describe();
  return Status::Ok();
}

Status Publisher::BeginWrite() {
  Impl& d = *impl_;
  util::MutexLock publish_lock(&d.publish_mu);
  {
    util::MutexLock lock(&d.mu);
    if (d.closed) return Status::FailedPrecondition("publisher is closed");
    // Nothing published yet: nothing to wait for. Registered tensors copied into slots are never
    // read in place: VersionSlots waits only where the tensors are shared (has_direct).
    if (!d.frozen) return Status::Ok();
  }
  d.versions.BeginWrite(&d.waited);
  return Status::Ok();
}

Result<PublishStats> Publisher::Publish(int64_t step, const PublishOptions& options) {
  return impl_->PublishVersion(step, options, nullptr);
}

Status Publisher::Impl::BeginVersion(int64_t step) {
  const int64_t latest = versions.latest_step();  // only Publish moves it, and we hold that
  {
    util::MutexLock lock(&mu);
    if (closed) return Status::FailedPrecondition("publisher is closed");
    if (step < 0) return Status::InvalidArgument("step ", step, " is negative");
    // A stale step is the state's fault, not the argument's (the same step was fine a moment
    // earlier, e.g. before another thread published it): FailedPrecondition, as a subscriber's
    // stale step is.
    if (step <= latest) {
      return Status::FailedPrecondition("steps must increase: step ", step, " after step ", latest);
    }
    if (step <= options.resume_from_step) {
      return Status::FailedPrecondition(
          "step ", step, " is not after step ", options.resume_from_step,
          ", which this publisher resumes lineage '", welcome.lineage, "' from");
    }
    if (tensors.empty()) {
      return Status::FailedPrecondition("Publish() with no tensors registered or allocated");
    }
    if (stream_slot >= 0) {
      return Status::FailedPrecondition("step ", step, " while step ", stream_step,
                                        " is still being received (a relay's cut-through)");
    }
    if (!frozen) {
      WS_RETURN_IF_ERROR(Freeze());
      frozen = true;
    }
  }
  cv.NotifyAll();  // sessions waiting for the layout
  return Status::Ok();
}

namespace {
// What an encode counted, into PublishStats or DeltaStats (the same four fields).
template <typename Stats>
void CopyDeltaCounts(const transport::store::SlotDelta& delta, Stats* stats) {
  stats->delta_segments = delta.delta_segments;
  stats->whole_segments = delta.whole_segments;
  stats->delta_bytes = delta.delta_bytes;
  stats->changed_bytes = delta.changed_bytes;
}
}  // namespace

PublishStats Publisher::Impl::Report(int64_t step, uint32_t slot,
                                     std::chrono::steady_clock::time_point start) {
  PublishStats stats;
  stats.step = step;
  stats.bytes_copied = store->copy_bytes();
  stats.store_bytes = store->held_bytes();
  stats.store_device = welcome.device;  // read-only once frozen; -1: host memory
  if (const transport::store::SlotDelta* delta = store->delta(slot); delta != nullptr) {
    stats.delta_base_step = delta->base_step;
    stats.delta_pending = store->DeltaPending(slot);
    if (!stats.delta_pending) CopyDeltaCounts(*delta, &stats);  // the encode finished
  }
  stats.wait_for_readers_seconds = waited.seconds;
  stats.revoked_reads = waited.revoked;
  waited = {};
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats.gbps = stats.seconds > 0 ? manifest.total_bytes() / stats.seconds / 1e9 : 0;
  return stats;
}

Status Publisher::Impl::AwaitDeltas(int64_t step, uint32_t slot) {
  return store->AwaitDelta(slot, Deadline(options.timeout))
      .status()
      .WithContext("Publish(" + std::to_string(step) + ", wait_for_deltas)");
}

Result<PublishStats> Publisher::Impl::PublishVersion(int64_t step, const PublishOptions& call,
                                                     const std::span<const uint64_t>* given,
                                                     const Deadline* writer) {
  Impl& d = *this;
  auto start = std::chrono::steady_clock::now();
  util::MutexLock publish_lock(&d.publish_mu);
  WS_RETURN_IF_ERROR(d.BeginVersion(step));
  if (given != nullptr) WS_RETURN_IF_ERROR(d.CheckGiven(step, given->size()));
  // The latest version, whole in its slot while this one is written into another: the base its
  // deltas are encoded against (the store keeps none without delta room).
  const auto [base_slot, base_step] = d.versions.latest();
  const uint32_t k = d.versions.TakeForWrite(step, &d.waited, writer);
  transport::store::DeltaBase base;
  if (base_slot >= 0 && static_cast<uint32_t>(base_slot) != k) {
    base = {static_cast<uint32_t>(base_slot), base_step,
            d.versions.published_digests(static_cast<uint32_t>(base_slot))};
  }
  const transport::store::DeltaBase* delta_base = base.step >= 0 ? &base : nullptr;
  Status published;
  if (given == nullptr) {
    published = d.store->Publish(k, d.versions.digests(k), delta_base, call.cuda_stream,
                                 Deadline(d.options.timeout));
  } else {
    published = d.store->PublishCopy(k, delta_base, Deadline(d.options.timeout));
    if (published.ok()) std::copy(given->begin(), given->end(), d.versions.digests(k).begin());
  }
  if (!published.ok()) {
    d.versions.WriteFailed(k);
    return published.WithContext("Publish(" + std::to_string(step) + ")");
  }
  d.versions.Published(k, step);
  // The version is whole and served; a failed wait for its deltas fails only this call.
  if (call.wait_for_deltas) WS_RETURN_IF_ERROR(d.AwaitDeltas(step, k));
  return d.Report(step, k, start);
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

int64_t Publisher::latest_step() const { return impl_->versions.latest_step(); }

Result<DeltaStats> Publisher::Deltas() {
  Impl& d = *impl_;
  util::MutexLock publish_lock(&d.publish_mu);  // the latest stays the latest meanwhile
  {
    util::MutexLock lock(&d.mu);
    if (d.closed) return Status::FailedPrecondition("Deltas(): the publisher is closed");
  }
  const auto [slot, step] = d.versions.latest();
  if (slot < 0) return Status::FailedPrecondition("Deltas(): nothing published yet");
  DeltaStats stats;
  stats.step = step;
  WS_ASSIGN_OR_RETURN(
      const transport::store::SlotDelta* delta,
      d.store->AwaitDelta(static_cast<uint32_t>(slot), Deadline(d.options.timeout)));
  if (delta == nullptr) return stats;  // a store that keeps no deltas
  stats.base_step = delta->base_step;
  CopyDeltaCounts(*delta, &stats);
  stats.encode_seconds = delta->encode_seconds;
  return stats;
}

const Manifest& Publisher::manifest() const { return impl_->manifest; }

const std::string& Publisher::endpoint() const { return impl_->bound_endpoint; }

const std::string& Publisher::lineage() const { return impl_->welcome.lineage; }

// A member's report: nobody below can hold a step this publisher never published (the relays
// between hold what they serve), so such a report is a lie and ends the session. Swapped in, so
// the session decodes its next report into the storage of this one's predecessor.
Status Publisher::Impl::Reported(uint64_t member, wire::MembersReport& report) {
  const int64_t latest = versions.latest_step();
  auto check = [&](int64_t step, const std::string& who) {
    if (step <= latest) return Status::Ok();
    return Status::ProtocolError("members_report: ", who.empty() ? "the reporter" : "'" + who + "'",
                                 " holds step ", step, ", this publisher's latest is ", latest);
  };
  WS_RETURN_IF_ERROR(check(report.held_step, ""));
  for (const wire::ReportedMember& e : report.members) {
    for (int64_t step : {e.held_step, e.sent_step, e.receiving_step}) {
      WS_RETURN_IF_ERROR(check(step, e.peer));
    }
  }
  {
    util::MutexLock lock(&members_mu);
    Member* m = FindMember(member);
    if (m != nullptr && m->info.serves.empty() && !report.members.empty()) {
      return Status::ProtocolError("members_report: lists ", report.members.size(),
                                   " members, but its hello announced no endpoint to serve on");
    }
    if (m != nullptr) {
      m->info.held_step = report.held_step;
      m->info.below = report.below;
      m->room = report.room;
      m->subtree.swap(report.members);
      // The newcomers sent to these relays that their rooms now show count no more.
      if (!sent_to.empty()) {
        if (!m->info.serves.empty()) Arrived(m->info.serves, m->room);
        for (const wire::ReportedMember& e : m->subtree) {
          if (!e.serves.empty()) Arrived(e.serves, e.room);
        }
      }
    }
  }
  MembersChanged();
  return Status::Ok();
}

void Publisher::Impl::FillTree(std::vector<wire::ReportedMember>* out, size_t max,
                               uint32_t max_depth) const {
  size_t n = 0;
  auto add = [&]() -> wire::ReportedMember& {
    if (n == out->size()) out->emplace_back();
    return (*out)[n++];
  };
  for (const Member& m : members) {
    if (!m.ready || n == max) continue;
    wire::ReportedMember& own = add();
    own.peer.assign(m.info.peer, 0, wire::kMaxPeerBytes);
    own.serves = m.info.serves;
    own.locality = m.info.locality;
    own.via.clear();
    own.held_step = m.info.held_step;
    own.sent_step = m.info.sent_step;
    own.receiving_step = m.info.receiving_step;
    own.below = static_cast<uint32_t>(std::clamp<int64_t>(m.info.below, 0, UINT32_MAX));
    own.depth = 1;
    own.room = m.info.serves.empty() ? 0 : m.room;
    for (const wire::ReportedMember& e : m.subtree) {
      if (n == max) break;
      if (e.depth + 1 > max_depth) continue;
      wire::ReportedMember& below = add();
      below = e;
      below.depth = e.depth + 1;
      // The reporter's own children are served by the reporter, known by its endpoint.
      if (e.via.empty()) below.via = m.info.serves;
    }
  }
  out->resize(n);
}

std::vector<MemberInfo> Publisher::Tree() const {
  std::vector<wire::ReportedMember> entries;
  {
    util::MutexLock lock(&impl_->members_mu);
    impl_->FillTree(&entries, SIZE_MAX, UINT32_MAX);
  }
  std::vector<MemberInfo> out(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const wire::ReportedMember& e = entries[i];
    MemberInfo& info = out[i];
    info.peer = e.peer;
    info.held_step = e.held_step;
    info.sent_step = e.sent_step;
    info.receiving_step = e.receiving_step;
    info.serves = e.serves;
    info.below = e.below;
    info.locality = e.locality;
    info.depth = static_cast<int>(e.depth);
    info.via = e.via;
  }
  return out;
}

std::vector<MemberInfo> Publisher::Members() const {
  util::MutexLock lock(&impl_->members_mu);
  std::vector<MemberInfo> out;
  out.reserve(impl_->members.size());
  for (const Impl::Member& m : impl_->members) {
    if (m.ready) out.push_back(m.info);
  }
  return out;
}

Status Publisher::Close() {
  Impl& d = *impl_;
  util::MutexLock publish_lock(&d.publish_mu);
  {
    util::MutexLock lock(&d.mu);
    if (d.closed) return Status::Ok();
    d.closed = true;
  }
  d.cv.NotifyAll();
  d.versions.Close();
  // Sessions sending a version still landing stop now, not at their subscriber's deadline.
  if (d.stream_slot >= 0) d.streams[d.stream_slot].Fail(Status::Unavailable("publisher closed"));
  d.stream_slot = -1;
  Status result;
  // Reverse order of creation: the server (connections), then the store.
  if (d.transport) {
    if (Status s = d.transport->Close(); !s.ok()) {
      WS_LOG(WARN, "publisher") << "release: server: " << s;
      result.Update(s);
    }
    d.transport.reset();
  }
  for (auto* store : {&d.store, &d.host_store}) {
    if (!*store) continue;
    if (Status s = (*store)->Close(); !s.ok()) result.Update(s);  // logged by the store
    store->reset();
  }
  return result;
}

void PublisherRelayAccess::OnMembersChanged(Publisher& publisher, std::function<void()> tell) {
  Publisher::Impl& d = *publisher.impl_;
  util::MutexLock lock(&d.members_mu);
  d.members_changed = std::move(tell);
}

void PublisherRelayAccess::FillReport(const Publisher& publisher, wire::MembersReport* report) {
  const Publisher::Impl& d = *publisher.impl_;
  util::MutexLock lock(&d.members_mu);  // one look: `below` and `room` count what it lists
  d.FillTree(&report->members, wire::kMaxReportedMembers, wire::kMaxTreeDepth);
  report->below = d.Below();
  report->room = d.Room();
}

uint32_t PublisherRelayAccess::Below(const Publisher& publisher) {
  const Publisher::Impl& d = *publisher.impl_;
  util::MutexLock lock(&d.members_mu);
  return d.Below();
}

Status PublisherRelayAccess::AdoptIdentity(Publisher& publisher, const wire::Welcome& upstream) {
  Publisher::Impl& d = *publisher.impl_;
  util::MutexLock publish_lock(&d.publish_mu);
  util::MutexLock lock(&d.mu);
  if (d.frozen) {
    return Status::FailedPrecondition("relay ", d.bound_endpoint, ": cannot take session ",
                                      upstream.session_id, " of lineage '", upstream.lineage,
                                      "' after it began serving (a new session needs a new "
                                      "serving publisher)");
  }
  d.welcome.session_id = upstream.session_id;
  d.welcome.lineage = upstream.lineage;
  d.welcome.resumed_from = upstream.resumed_from;
  d.options.lineage = upstream.lineage;
  d.options.resume_from_step = upstream.resumed_from;
  d.options.segment_bytes = upstream.segment_bytes;
  WS_LOG(INFO, "relay") << d.bound_endpoint << " serves lineage '" << upstream.lineage
                        << "' as its publisher does (its session, steps and digests)";
  return Status::Ok();
}

Result<PublishStats> PublisherRelayAccess::PublishGiven(Publisher& publisher, int64_t step,
                                                        std::span<const uint64_t> digests,
                                                        const util::Deadline& writer) {
  return publisher.impl_->PublishVersion(step, PublishOptions{}, &digests, &writer);
}

Result<PublisherRelayAccess::StreamTarget> PublisherRelayAccess::BeginStream(Publisher& publisher,
                                                                             int64_t step) {
  Publisher::Impl& d = *publisher.impl_;
  util::MutexLock publish_lock(&d.publish_mu);
  WS_RETURN_IF_ERROR(d.BeginVersion(step));
  // Each tensor's place in a slot and size, found once (no stream begins without them).
  if (d.stream_offsets.size() != d.tensors.size()) {
    d.stream_offsets.clear();
    d.stream_bytes.clear();
    for (const transport::store::PublishedTensor& t : d.tensors) {
      const bool in_slot = t.source != nullptr && t.alias_of < 0 &&
                           t.placement.region == wire::Region::kSlot && !d.version_is_tensors;
      if (!in_slot && t.placement.spec.nbytes > 0) {
        return Status::FailedPrecondition("relay ", d.bound_endpoint, ": tensor '",
                                          t.placement.spec.name,
                                          "' is not copied into a slot: no cut-through");
      }
      d.stream_offsets.push_back(t.placement.offset);
      d.stream_bytes.push_back(t.placement.spec.nbytes);
    }
  }
  if (!d.streams) d.streams.reset(new transport::store::StreamProgress[d.welcome.slot_count]);
  d.stream_start = std::chrono::steady_clock::now();
  // Never waits: a slot a child still reads (a slow one, two versions behind) makes this step go
  // store-and-forward, whose wait for that child has its own budget after the relay's commit.
  const int taken = d.versions.TakeIdle();
  if (taken < 0) {
    return Status::Busy("step ", step,
                        ": every slot of the relay's store but the latest is still "
                        "read by a child");
  }
  const uint32_t k = static_cast<uint32_t>(taken);
  Result<uint8_t*> slot = d.store->WriteFromOutside(k);
  if (!slot.ok()) {
    d.versions.WriteFailed(k);
    return slot.status();
  }
  transport::store::StreamProgress& progress = d.streams[k];
  progress.Begin(step, d.stream_bytes);
  d.versions.Streaming(k, step, &progress);
  d.stream_slot = taken;
  d.stream_step = step;
  return StreamTarget{*slot, d.stream_offsets, &progress};
}

Result<PublishStats> PublisherRelayAccess::FinishStream(Publisher& publisher,
                                                        std::span<const uint64_t> digests) {
  Publisher::Impl& d = *publisher.impl_;
  util::MutexLock publish_lock(&d.publish_mu);
  if (d.stream_slot < 0) return Status::FailedPrecondition("no version is being streamed");
  const uint32_t k = static_cast<uint32_t>(d.stream_slot);
  const int64_t step = d.stream_step;
  if (Status wrong = d.CheckGiven(step, digests.size()); !wrong.ok()) {
    d.streams[k].Fail(wrong);
    d.versions.StreamFailed(k);
    d.stream_slot = -1;
    return wrong;
  }
  // Digests first, then Published (sessions unpin only a whole version), then Finish (which lets
  // the sessions that pinned it end the step with those digests).
  std::copy(digests.begin(), digests.end(), d.versions.digests(k).begin());
  d.versions.Published(k, step);
  d.streams[k].Finish();
  d.stream_slot = -1;
  return d.Report(step, k, d.stream_start);
}

void PublisherRelayAccess::AbortStream(Publisher& publisher, const Status& why) {
  Publisher::Impl& d = *publisher.impl_;
  util::MutexLock publish_lock(&d.publish_mu);
  if (d.stream_slot < 0) return;
  d.streams[d.stream_slot].Fail(why);
  d.versions.StreamFailed(static_cast<uint32_t>(d.stream_slot));
  d.stream_slot = -1;
}

}  // namespace weightsync
