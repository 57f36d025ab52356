#include "transport/transport.h"

#include "plan/region_plan.h"
#include "util/ledger.h"
#include "util/logging.h"

namespace weightsync::transport {

using util::Deadline;
using util::LedgerAdd;
using util::LedgerItem;

// How long dialing a relay we were redirected to may take, its tcp handshake included (see
// Connect): a live relay answers in milliseconds; 2 s leaves room for a loaded host.
constexpr std::chrono::milliseconds kRelayDialBound{2000};

TransferHandle::TransferHandle(const link::Endpoint& endpoint, const SubscriberOptions& options)
    : options_(options), home_(endpoint), link_(link::NewLink(endpoint, options)) {}

TransferHandle::~TransferHandle() {
  if (Status s = Release(); !s.ok()) WS_LOG(WARN, "subscriber") << "handle cleanup: " << s;
}

Result<const wire::Welcome*> TransferHandle::Connect(const Deadline& deadline) {
  if (!counted_) {
    counted_ = true;
    LedgerAdd(LedgerItem::kHandles, 1);
  }
  for (int hops = 0;; ++hops) {
    Result<const wire::Welcome*> welcome = link_->Connect(deadline);
    if (welcome.ok() && *welcome != nullptr) return welcome;
    std::string next;
    if (welcome.ok()) {
      next = link_->redirect();
    } else if (!relay_.empty() && !deadline.expired() && !deadline.cancelled()) {
      // A relay we were sent to that cannot take us (dead, stopped, gone): back to the endpoint
      // we were made for, which sends us elsewhere.
      WS_LOG(INFO, "topology") << "relay " << relay_ << " did not answer (" << welcome.status()
                               << "); asking " << home_.ToString() << " again, avoiding it";
      avoid_ = relay_;
    } else {
      return welcome.status();
    }
    if (hops >= wire::kMaxRedirects) {
      return Status::ProtocolError(link_->peer(), ": ", hops + 1,
                                   " redirects in a row (a loop of relays?); the last to '",
                                   next.empty() ? home_.ToString() : next, "'");
    }
    link::Endpoint endpoint = home_;
    if (!next.empty()) {
      Result<link::Endpoint> parsed = link::ParseEndpoint(next);
      if (!parsed.ok()) {
        return parsed.status().WithContext(link_->peer() + " redirected to '" + next + "'");
      }
      endpoint = std::move(*parsed);
    }
    WS_RETURN_IF_ERROR(link_->Release());
    relay_ = next;
    link_ = link::NewLink(endpoint, options_);
    link_->set_hello(serves_, avoid_, options_.locality);
    // A live relay accepts at once; one that died since the publisher listed it is given up on
    // soon (and avoided), not at the end of the update's deadline.
    if (!relay_.empty()) link_->set_dial_bound(kRelayDialBound);
  }
}

void TransferHandle::set_hello(std::string serves, std::string avoid) {
  serves_ = std::move(serves);
  avoid_ = std::move(avoid);
  link_->set_hello(serves_, avoid_, options_.locality);
}

Status TransferHandle::Prepare(const std::vector<plan::Destination>& destinations,
                               const PrepareOptions& options, const Deadline& deadline) {
  WS_RETURN_IF_ERROR(Connect(deadline).status());
  const wire::Welcome& welcome = link_->welcome();
  WS_ASSIGN_OR_RETURN(entry_, ChoosePath(*link_, welcome, destinations));
  path_ = entry_->make();
  util::UniqueFd store_fd = link_->TakeStoreFd();
  std::vector<util::UniqueFd> allocation_fds = link_->TakeAllocationFds();
  path::PathContext ctx;
  ctx.link = link_.get();
  ctx.welcome = &welcome;
  ctx.store_fd = &store_fd;
  ctx.allocation_fds = &allocation_fds;
  ctx.plan = &plan_;
  ctx.destinations = &destinations;
  ctx.mode = options.mode;
  ctx.options = &options_;
  ctx.deadline = &deadline;
  // What this machine lacks is said before anything is asked of the publisher.
  WS_RETURN_IF_ERROR(path_->Available(ctx));
  constexpr uint64_t kBucketBytes = 4ull << 20;
  if (options.region_copies != nullptr) {
    WS_ASSIGN_OR_RETURN(plan_, plan::BuildRegionPlan(welcome, destinations, *options.region_copies,
                                                     kBucketBytes, options.for_verify));
  } else {
    WS_ASSIGN_OR_RETURN(plan_, plan::BuildPlan(welcome, destinations, options.policy, kBucketBytes,
                                               options.convert));
  }
  WS_RETURN_IF_ERROR(link_->Select(plan_, deadline));
  WS_RETURN_IF_ERROR(path_->Prepare(ctx).WithContext(link_->peer()));
  WS_LOG(INFO, "subscriber") << "prepared " << entry_->name << " handle for " << link_->peer()
                             << ": "
                             << (plan_.regions
                                     ? std::to_string(plan_.tensors.size()) + " region runs into " +
                                           std::to_string(plan_.destination_count) + " tensors"
                                     : std::to_string(plan_.tensors.size()) + " tensors")
                             << ", " << plan_.total_bytes << " bytes, " << plan_.buckets.size()
                             << " buckets, " << plan_.segments.size() << " segments, "
                             << welcome.slot_count << " slots (" << welcome.arena_bytes << " bytes)"
                             << link_->Describe() << path_->Describe();
  return Status::Ok();
}

Result<int64_t> TransferHandle::BeginStep(std::optional<int64_t> step, int64_t after_step,
                                          const Deadline& deadline,
                                          std::span<const uint64_t> base_digests) {
  // The base's digests index every segment: given only while the weights hold `after_step`.
  const bool delta =
      after_step >= 0 && base_digests.size() == plan_.digest_count && path_->AcceptsDeltas();
  path_->ExpectDeltas(delta ? after_step : -1, base_digests);
  WS_ASSIGN_OR_RETURN(int64_t offered, link_->BeginStep(step, after_step, deadline, delta));
  const wire::StepBegin& begin = link_->begin();
  const wire::Welcome& welcome = link_->welcome();
  if (offered != after_step && plan_.uses_slots && begin.slot >= welcome.slot_count) {
    return Status::ProtocolError(link_->peer(), ": step ", begin.step, " in slot ", begin.slot,
                                 " but the arena has ", welcome.slot_count, " slots");
  }
  return offered;
}

Status TransferHandle::CopyStep(bool verify, const Deadline& deadline) {
  return path_->Copy(link_->begin(), verify, deadline);
}

path::DeltaReceipt TransferHandle::delta_receipt() const {
  path::DeltaReceipt receipt = path_->delta_receipt();
  if (receipt.base_step < 0) receipt.received_bytes = plan_.total_bytes;
  return receipt;
}

Result<std::span<const uint64_t>> TransferHandle::EndStep(const Deadline& deadline) {
  return link_->EndStep(plan_.digest_count, deadline);
}

Status TransferHandle::Verify(std::span<const uint64_t> digests, int64_t step,
                              const Deadline& deadline) {
  return path_->Verify(digests, step, deadline);
}

Status TransferHandle::Commit(const Deadline& deadline) { return path_->Commit(deadline); }

Status TransferHandle::CheckDestinations(
    const std::vector<plan::Destination>& destinations, std::span<const uint64_t> digests,
    const Deadline& deadline, std::span<uint64_t> checked_bytes, std::span<uint8_t> unchecked,
    std::vector<path::DestinationCheck::Difference>* differing) {
  if (!path_) return Status::FailedPrecondition("weights check on a handle not prepared");
  if (!check_.prepared()) {
    const int threads = options_.copy_threads > 0 ? options_.copy_threads : util::HashThreads();
    WS_RETURN_IF_ERROR(check_.Prepare(plan_, destinations, link_->welcome().digest_kind, threads));
  }
  return check_.Run(digests, deadline, checked_bytes, unchecked, differing);
}

Status TransferHandle::Release() {
  Status result;
  // Reverse order of creation: the weights check (made last), the path (staging, workers,
  // mappings), then the connection.
  result.Update(check_.Release());  // logged by the check
  if (path_) {
    result.Update(path_->Release());  // logged by the path
    path_.reset();
  }
  entry_ = nullptr;
  if (link_) result.Update(link_->Release());
  if (counted_) {
    counted_ = false;
    LedgerAdd(LedgerItem::kHandles, -1);
  }
  return result;
}

Result<std::unique_ptr<TransferHandle>> NewTransferHandle(const link::Endpoint& endpoint,
                                                          const SubscriberOptions& options) {
  return std::make_unique<TransferHandle>(endpoint, options);
}

}  // namespace weightsync::transport
