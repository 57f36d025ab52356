// RelayServe: the serving side of a relay (SubscriberOptions::serve_endpoint, docs/relays.md).
// After each update it commits, the subscriber hands the version to its RelayServe, which
// publishes it to other subscribers from a host store of its own: under the trainer's lineage,
// session and step numbers, with the trainer's digests (copied, never hashed again), so a child
// tells versions apart and verifies exactly as it would against the trainer, and a relay that
// corrupts what it serves is caught by its children's verify. Over tcp its children get deltas
// against the previous version as from any publisher.
//
// Cut-through: a step the relay receives whole over tcp is served while it arrives. Before the
// relay's copy, Stream arms an observer its read path tells as bytes land; at the first it takes
// a slot of the store nobody reads, then copies each landed chunk there and says how far, so its
// tcp children receive the step a chunk behind the relay (a level of a tree adds about one chunk,
// not one model). Their step ends once the relay committed it (Serve sets the trainer's digests);
// a relay update that fails gives the version up (AbortStream), and their reads fail with nothing
// committed. A step that comes as deltas or over another path, one whose serving publisher must
// be replaced, or one for which every slot but the latest is still read by a child is stored and
// forwarded: served once committed, copied then from the destinations. The store holds two
// copies of the model: in host memory for host destinations, on their GPU for CUDA ones (served
// over cuda-ipc, and nccl to tcp children, with the trainer's GPU digests).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/publisher_relay.h"
#include "plan/plan.h"
#include "transport/path/data_path.h"
#include "util/deadline.h"
#include "util/mutex.h"
#include "weightsync/options.h"
#include "weightsync/publisher.h"
#include "weightsync/status.h"
#include "wire/messages.h"

namespace weightsync::core {

class RelayServe {
 public:
  // Binds `options.serve_endpoint` now, so children can dial it (and read its port) before the
  // first version arrives: they wait for it as for any publisher's first step.
  static Result<std::unique_ptr<RelayServe>> Listen(const SubscriberOptions& options);
  ~RelayServe();

  // The endpoint children dial (for tcp://HOST:0, with the port bound).
  const std::string& endpoint() const { return endpoint_; }
  // The endpoint the relay is announced by to its publisher (SubscriberOptions::serve_announce,
  // else `bound` unless it binds a wildcard address; then empty: not announced).
  // InvalidArgument for a serve_announce that is no endpoint.
  static Result<std::string> Announced(const SubscriberOptions& options, const std::string& bound);

  // Whether the version `upstream` serves, landed in `destinations`, can be served as the trainer
  // published it: every published tensor held whole under its name, with its dtype and shape, all
  // in host memory (an xxh3 publisher's) or all on one GPU (a publisher that digests on its GPU).
  // FailedPrecondition naming what is missing otherwise (nothing has moved yet).
  static Status CheckServable(const wire::Welcome& upstream,
                              const std::vector<plan::Destination>& destinations);

  // Serves `step` of `upstream`'s session from `destinations` with the trainer's `digests` (every
  // one of the version's); `moved`: the update that committed it moved bytes (else it found the
  // step committed already, and a step already served stays as it is). A new session (a
  // restarted trainer), destinations registered anew, or a step committed again make a new serving
  // publisher on the same endpoint: children connected to the old one see it go and dial again.
  // `deadline`: the relay's update's (with its cancel): a child still reading the slot the version
  // goes into is waited for no longer (its read revoked; it asks again).
  Result<PublishStats> Serve(const wire::Welcome& upstream,
                             const std::vector<plan::Destination>& destinations, int64_t step,
                             std::span<const uint64_t> digests, bool moved,
                             const util::Deadline& deadline);

  // Cut-through: before the relay's copy of `step` from `upstream`, the observer its read path
  // tells as the step's bytes land (TransferHandle::ObserveLanding); null when the step cannot be
  // served while it lands (the serving publisher must be replaced, or could not be readied: Serve
  // does that after the commit).
  transport::path::LandingObserver* Stream(const wire::Welcome& upstream,
                                           const std::vector<plan::Destination>& destinations,
                                           int64_t step);
  // The relay's update failed: a version served while it landed is given up (its children's reads
  // fail, nothing committed) and the step before is served again. No-op otherwise.
  void AbortStream(const Status& why);
  // Whether a step is being served while it lands (Stream's observer began, Serve not yet).
  bool streaming() const { return forward_.streaming() >= 0; }

  // The step children are served now; -1 before the first.
  int64_t served_step() const { return publisher_ ? publisher_->latest_step() : -1; }

  // Its children connected now (Publisher::Members); any thread.
  std::vector<MemberInfo> Members() const;
  // Its whole subtree (Publisher::Tree); any thread.
  std::vector<MemberInfo> Tree() const;
  // Its subtree, `below` and `room` into `report` (PublisherRelayAccess::FillReport); under the
  // subscriber's update lock. A relay not serving yet: nobody below, no room.
  void FillReport(wire::MembersReport* report) const;
  // Told whenever its membership changes (PublisherRelayAccess::OnMembersChanged), by the serving
  // publisher it has and every one it opens from now on. Under the subscriber's update lock.
  void OnMembersChanged(std::function<void()> tell);
  // How many subscribers it serves, children and theirs; under the subscriber's update lock.
  uint32_t Below() const;

  // The relay's engine sleeps (Subscriber::Sleep): a GPU store is given back, so that sleeping
  // frees the GPU memory the relay holds. Its children's reads fail and they find no publisher on
  // the endpoint until the relay's next update serves again there. A host store keeps serving.
  Status Sleep();
  // Stops serving; idempotent.
  Status Close();

 private:
  explicit RelayServe(const SubscriberOptions& options);
  Status Open(const wire::Welcome* upstream);
  Status Register(const wire::Welcome& upstream,
                  const std::vector<plan::Destination>& destinations);
  bool SameSources(const std::vector<plan::Destination>& destinations) const;
  // Why the serving publisher cannot serve `step` of `upstream` from `destinations` and must be
  // replaced (a new session, new memory, a step committed again); null when it can.
  const char* ReplaceReason(const wire::Welcome& upstream,
                            const std::vector<plan::Destination>& destinations, int64_t step,
                            bool moved) const;
  // The serving publisher made ready for `step` of `upstream`: a new one where its session,
  // sources or served steps no longer fit, its identity adopted, the destinations registered.
  Status Ready(const wire::Welcome& upstream, const std::vector<plan::Destination>& destinations,
               int64_t step, bool moved);

  // The observer a streamed step's bytes are copied into the store by (Stream).
  class Forward final : public transport::path::LandingObserver {
   public:
    explicit Forward(RelayServe* relay) : relay_(relay) {}
    void Arm(int64_t step) { armed_ = step; }
    bool Begin(int64_t step, std::span<const transport::path::LandingPart> parts) override;
    void Read(size_t part, size_t offset) override;
    // The step being streamed, -1 when none; Stop forgets it.
    int64_t streaming() const { return streaming_; }
    void Stop() { streaming_ = armed_ = -1; }

   private:
    void CopyLanded(size_t part, uint64_t from, uint64_t to);
    RelayServe* relay_;
    int64_t armed_ = -1;
    int64_t streaming_ = -1;
    PublisherRelayAccess::StreamTarget target_;
    std::span<const transport::path::LandingPart> parts_;
    size_t part_ = 0;      // the part being copied
    uint64_t copied_ = 0;  // its bytes copied so far
  };

  PublisherOptions serving_;  // the endpoint, token and timeouts children are served with
  std::string endpoint_;
  // Replaced (Open, Close) under the subscriber's update lock and `swap_mu_`; read without
  // `swap_mu_` under the update lock, with it by Members() and Tree() from any thread.
  mutable util::Mutex swap_mu_;
  std::unique_ptr<Publisher> publisher_;
  bool adopted_ = false;  // publisher_ holds a session's identity and layout
  uint64_t session_ = 0;  // the session whose versions publisher_ serves
  // What publisher_ copies from, in the trainer's manifest order: each tensor's destination index
  // and address when registered, and how many destinations there were.
  std::vector<uint32_t> order_;
  std::vector<const uint8_t*> sources_;
  size_t destination_count_ = 0;
  bool on_gpu_ = false;  // publisher_ serves from a GPU store (CUDA destinations)
  std::function<void()> members_changed_;
  Forward forward_{this};
};

}  // namespace weightsync::core
