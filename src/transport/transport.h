// The transfer handle: everything a subscriber needs to receive steps from one publisher, prepared
// once and reused — a link (the control connection: transport/link/link.h), the plan, and a data
// path (how the bytes move: transport/path/data_path.h) chosen from the path table
// (transport/path_table.h) by the link, the publisher's store and the destinations. The
// subscriber core (src/core/subscriber.cc) drives the handle and owns the semantics (staged/in
// place, verification, commit, invalidation); the handle only moves bytes.
//
// Lifecycle: NewTransferHandle() is cheap; Prepare() does the expensive work; a failed call of any
// method leaves the handle unusable, and the core destroys it (Release() then destructor).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "plan/plan.h"
#include "plan/regions.h"
#include "transport/link/endpoint.h"
#include "transport/link/link.h"
#include "transport/path/data_path.h"
#include "transport/path/destination_check.h"
#include "transport/path_table.h"
#include "util/deadline.h"
#include "weightsync/options.h"
#include "weightsync/status.h"
#include "wire/messages.h"

namespace weightsync::transport {

struct PrepareOptions {
  MatchPolicy policy = MatchPolicy::kStrict;
  UpdateMode mode = UpdateMode::kStaged;
  plan::ConvertOptions convert;
  // Regions: this publisher's share of the subscriber's region schedule (RegionCopy::held indexes
  // its Welcome's tensors); the plan is built from it (plan::BuildRegionPlan) instead of by
  // matching names. `for_verify`: plan so that every segment can be verified.
  const std::vector<plan::RegionCopy>* region_copies = nullptr;
  bool for_verify = false;
};

class TransferHandle {
 public:
  TransferHandle(const link::Endpoint& endpoint, const SubscriberOptions& options);
  ~TransferHandle();
  TransferHandle(const TransferHandle&) = delete;
  TransferHandle& operator=(const TransferHandle&) = delete;

  // The data path's name in the path table ("shm", "cuda-ipc", "nccl", ...), once prepared.
  std::string_view transport_name() const { return entry_ ? entry_->name : std::string_view(); }

  // Connects and handshakes; returns the publisher's manifest and layout, valid while the handle
  // lives. Lets a subscriber with several publishers decide which one delivers which tensor
  // before any of them is prepared. Prepare() connects first when this was not called.
  // A publisher past its max_direct redirects it to a relay (docs/relays.md): it dials that one
  // instead, at most wire::kMaxRedirects in a row; a relay it was sent to that does not answer
  // sends it back to the endpoint it was made for, saying to avoid that relay.
  Result<const wire::Welcome*> Connect(const util::Deadline& deadline);
  // Topology, before Connect: the endpoint this subscriber serves as a relay (empty: a leaf) and
  // a relay it lost a step through, which it asks not to be sent to again (empty: none); its
  // Hello also says SubscriberOptions::locality.
  void set_hello(std::string serves, std::string avoid);
  // Before each BeginStep: how many subscribers this one serves (its subtree).
  void set_below(uint32_t below) { link_->set_below(below); }
  // Between steps: tells the publisher the step committed and, a relay, its subtree
  // (docs/relays.md, "Membership").
  Status Report(const wire::MembersReport& report, const util::Deadline& deadline) {
    return link_ ? link_->Report(report, deadline) : Status::FailedPrecondition("not connected");
  }
  // Cut-through relays: who is told where the steps' bytes land (DataPath::ObserveLanding), from
  // the next Copy on; null: nobody.
  void ObserveLanding(path::LandingObserver* observer) {
    if (path_) path_->ObserveLanding(observer);
  }
  // The relay this handle was redirected to and connected to; empty: the endpoint it was made for.
  const std::string& relay() const { return relay_; }
  // Connects (if needed), matches manifests into a plan, chooses the data path, checks what this
  // machine needs for it, tells the publisher what to send, prepares the path. Logs one line.
  Status Prepare(const std::vector<plan::Destination>& destinations, const PrepareOptions& options,
                 const util::Deadline& deadline);
  const plan::Plan& plan() const { return plan_; }
  // Bytes of staging the prepared path holds (DataPath::staging_bytes); 0 unprepared.
  uint64_t staging_bytes() const { return path_ ? path_->staging_bytes() : 0; }
  // What each step converts and where (DataPath::conversion); nothing unprepared.
  path::ConversionReport conversion() const {
    return path_ ? path_->conversion() : path::ConversionReport{};
  }

  // Asks for `step` (nullopt: the latest) newer than `after_step`; returns the step the publisher
  // holds for us. Returning `after_step` means "already up to date": no copy follows.
  // `base_digests` (delta updates, docs/deltas.md): the digests of `after_step`, given when the
  // destinations hold exactly that version; a path that can apply deltas against it then asks
  // for them. Empty: whole segments.
  Result<int64_t> BeginStep(std::optional<int64_t> step, int64_t after_step,
                            const util::Deadline& deadline,
                            std::span<const uint64_t> base_digests = {});
  // Moves every planned byte of the step into staging (staged) or the destinations (in place).
  // `verify`: Verify will follow (a path that reads some publisher bytes in place hashes them now).
  Status CopyStep(bool verify, const util::Deadline& deadline);
  // What the last CopyStep received: deltas against which step, and the bytes that came.
  path::DeltaReceipt delta_receipt() const;
  // Tells the publisher the copy is finished; returns its digests of the step (valid until the
  // next BeginStep). Only after this returns may the core commit.
  Result<std::span<const uint64_t>> EndStep(const util::Deadline& deadline);
  // Checks the received bytes against the digests. Corruption names the tensor and byte range.
  Status Verify(std::span<const uint64_t> digests, int64_t step, const util::Deadline& deadline);
  // Staged: staging → destinations. Both modes: converted tensors into their destinations.
  Status Commit(const util::Deadline& deadline);

  // Subscriber::CheckWeights over this handle's share: digests `destinations` (the list Prepare
  // was given) where they lie and compares them with `digests`, the committed version's
  // (path/destination_check.h). Prepared at the first call, reused until Release.
  Status CheckDestinations(const std::vector<plan::Destination>& destinations,
                           std::span<const uint64_t> digests, const util::Deadline& deadline,
                           std::span<uint64_t> checked_bytes, std::span<uint8_t> unchecked,
                           std::vector<path::DestinationCheck::Difference>* differing);

  // Releases the path, then the link (reverse order of creation). Each failure is logged with its
  // cause and the release continues; the aggregated Status is returned.
  Status Release();

 private:
  SubscriberOptions options_;
  link::Endpoint home_;  // the endpoint the handle was made for
  std::string serves_;
  std::string avoid_;
  std::string relay_;
  std::unique_ptr<link::Link> link_;
  std::unique_ptr<path::DataPath> path_;
  path::DestinationCheck check_;  // made at the first CheckDestinations
  const PathEntry* entry_ = nullptr;
  plan::Plan plan_;
  bool counted_ = false;  // ledger "handles"
};

// An unprepared handle for the publisher at `endpoint`.
Result<std::unique_ptr<TransferHandle>> NewTransferHandle(const link::Endpoint& endpoint,
                                                          const SubscriberOptions& options);

}  // namespace weightsync::transport
