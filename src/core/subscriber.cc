#include "weightsync/subscriber.h"

#include <chrono>
#include <cstring>
#include <mutex>
#include <sstream>

#include "plan/plan.h"
#include "transport/endpoint.h"
#include "transport/transport.h"
#include "util/deadline.h"
#include "util/fail_point.h"
#include "util/logging.h"

namespace weightsync {

using util::Deadline;
using Clock = std::chrono::steady_clock;

namespace {
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

struct Subscriber::Impl {
  SubscriberOptions options;
  transport::Endpoint endpoint;
  std::vector<plan::Destination> destinations;

  // The transfer handle: connection, mappings, plan, staging, workers.
  std::unique_ptr<transport::TransferHandle> handle;

  std::mutex update_mu;  // one update at a time; held for the whole update
  std::atomic<bool> cancel{false};  // set by Cancel(), cleared when an update starts
  int64_t committed = -1;
  bool valid = true;
  bool closed = false;
  uint64_t prepare_count = 0;

  Status ReleaseHandle(std::string_view why);
  Status Prepare(const Deadline& deadline);
};

Subscriber::Subscriber(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Subscriber::~Subscriber() {
  if (impl_) {
    if (Status s = Close(); !s.ok()) WS_LOG(WARN, "subscriber") << "cleanup: " << s;
  }
}

Result<std::unique_ptr<Subscriber>> Subscriber::Create(const SubscriberOptions& options) {
  WS_RETURN_IF_ERROR(util::FailPoints::LoadFromEnv());
  if (options.timeout.count() <= 0) {
    return Status::InvalidArgument("SubscriberOptions.timeout must be > 0 ms");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  WS_ASSIGN_OR_RETURN(impl->endpoint, transport::ParseEndpoint(options.endpoint));
  return std::unique_ptr<Subscriber>(new Subscriber(std::move(impl)));
}

Status Subscriber::Register(const std::vector<NamedTensor>& tensors) {
  Impl& d = *impl_;
  std::unique_lock<std::mutex> lock(d.update_mu, std::try_to_lock);
  if (!lock.owns_lock()) return Status::Busy("Register() during an update");
  if (d.closed) return Status::FailedPrecondition("subscriber is closed");
  if (d.handle) {
    return Status::FailedPrecondition(
        "Register() while prepared: call Sleep() first so no mapping points at old memory");
  }
  std::vector<NamedTensor> all;
  for (const auto& dst : d.destinations) {
    all.push_back(
        {dst.spec.name, TensorView{dst.data, dst.spec.dtype, dst.spec.shape, dst.device}});
  }
  all.insert(all.end(), tensors.begin(), tensors.end());
  WS_ASSIGN_OR_RETURN(Manifest m, Manifest::FromTensors(all));
  std::vector<plan::Destination> dests;
  for (size_t i = 0; i < all.size(); ++i) {
    const TensorSpec& spec = m.tensors()[i];
    if (all[i].view.data == nullptr && spec.nbytes > 0) {
      return Status::InvalidArgument("tensor '", spec.name, "': null data pointer");
    }
    dests.push_back({spec, static_cast<uint8_t*>(all[i].view.data), all[i].view.device});
  }
  d.destinations = std::move(dests);
  return Status::Ok();
}

Status Subscriber::Impl::ReleaseHandle(std::string_view why) {
  Status result;
  if (handle) {
    result.Update(handle->Release());
    handle.reset();
  }
  if (!result.ok()) {
    WS_LOG(WARN, "subscriber") << "releasing the transfer handle (" << why << "): " << result;
  }
  return result;
}

Status Subscriber::Impl::Prepare(const Deadline& deadline) {
  WS_ASSIGN_OR_RETURN(handle, transport::NewTransferHandle(endpoint, options));
  WS_RETURN_IF_ERROR(handle->Prepare(destinations, {options.policy, options.mode}, deadline));
  ++prepare_count;
  return Status::Ok();
}

Result<UpdateStats> Subscriber::Update(const UpdateOptions& update) {
  Impl& d = *impl_;
  auto t0 = Clock::now();
  std::unique_lock<std::mutex> lock(d.update_mu, std::try_to_lock);
  if (!lock.owns_lock()) return Status::Busy("another update is in flight on this subscriber");
  if (d.closed) return Status::FailedPrecondition("subscriber is closed");
  if (d.destinations.empty()) {
    return Status::FailedPrecondition("Update() before Register(): no destination tensors");
  }
  if (update.step && *update.step <= d.committed) {
    return Status::FailedPrecondition("step ", *update.step,
                                      " is not newer than the committed step ", d.committed,
                                      " (steps only move forward)");
  }
  const bool verify = update.verify.value_or(d.options.verify);
  d.cancel.store(false, std::memory_order_release);
  Deadline deadline(d.options.timeout, &d.cancel);
  UpdateStats stats;
  std::string step_text = update.step ? std::to_string(*update.step) : std::string("latest");
  bool touched_destinations = false;

  // Any failure from here on destroys the handle; the next update prepares a new one.
  auto fail = [&](const Status& s) -> Status {
    if (touched_destinations) d.valid = false;
    (void)d.ReleaseHandle("update failed");
    Status out = s.WithContext("update to step " + step_text + " from " + d.options.endpoint);
    if (touched_destinations) {
      out = Status(out.code(), out.message() + " (in_place: weights are now marked invalid)");
    }
    return out;
  };

  if (!d.handle) {
    Status s = d.Prepare(deadline);
    if (!s.ok()) return fail(s.WithContext("prepare"));
    stats.handle_created = true;
    stats.prepare_seconds = Seconds(t0, Clock::now());
  }
  stats.prepare_count = d.prepare_count;
  const plan::Plan& plan = d.handle->plan();

  auto t_wait = Clock::now();
  Result<int64_t> step = d.handle->BeginStep(update.step, d.committed, deadline);
  if (!step.ok()) return fail(step.status());
  auto t_copy = Clock::now();
  stats.wait_seconds = Seconds(t_wait, t_copy);
  stats.step = *step;
  step_text = std::to_string(*step);
  if (*step == d.committed) {
    stats.up_to_date = true;
    stats.seconds = Seconds(t0, Clock::now());
    return stats;
  }

  const bool staged = d.options.mode == UpdateMode::kStaged;
  touched_destinations = !staged;
  WS_FAIL_POINT_RETURN_VIA(fail, "subscriber.before_copy");
  Status s = d.handle->CopyStep(deadline);
  if (!s.ok()) return fail(s);
  Result<std::span<const uint64_t>> digests = d.handle->EndStep(deadline);
  if (!digests.ok()) return fail(digests.status());
  auto t_verify = Clock::now();
  stats.copy_seconds = Seconds(t_copy, t_verify);

  if (verify) {
    s = d.handle->Verify(*digests, *step, deadline);
    if (!s.ok()) return fail(s);
    stats.verified = true;
  }
  auto t_commit = Clock::now();
  stats.verify_seconds = verify ? Seconds(t_verify, t_commit) : 0;
  if (staged) {
    // From here the destinations change: a failure now leaves them partly written.
    touched_destinations = true;
    s = d.handle->Commit(deadline);
    if (!s.ok()) return fail(s);
  }
  auto t_end = Clock::now();
  stats.commit_seconds = staged ? Seconds(t_commit, t_end) : 0;
  d.committed = *step;
  d.valid = true;
  stats.bytes = plan.total_bytes;
  stats.tensors = plan.tensors.size();
  stats.seconds = Seconds(t0, t_end);
  stats.gbps = stats.seconds > 0 ? stats.bytes / stats.seconds / 1e9 : 0;
  return stats;
}

Status Subscriber::Sleep() {
  Impl& d = *impl_;
  std::unique_lock<std::mutex> lock(d.update_mu, std::try_to_lock);
  if (!lock.owns_lock()) return Status::Busy("Sleep() during an update");
  return d.ReleaseHandle("sleep");
}

Status Subscriber::Close() {
  Impl& d = *impl_;
  // Waits for an update in flight (bounded by its deadline) rather than pulling memory from
  // under it.
  std::lock_guard<std::mutex> lock(d.update_mu);
  if (d.closed) return Status::Ok();
  d.closed = true;
  return d.ReleaseHandle("close");
}

Status Subscriber::Cancel() {
  // Release pairs with the acquire in Deadline::cancelled(): waits see it within one slice.
  impl_->cancel.store(true, std::memory_order_release);
  return Status::Ok();
}

int64_t Subscriber::committed_step() const { return impl_->committed; }
bool Subscriber::weights_valid() const { return impl_->valid; }

}  // namespace weightsync
