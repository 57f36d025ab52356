#include "transport/store/version_slots.h"

#include <utility>

#include "util/logging.h"

namespace weightsync::transport::store {
namespace {
constexpr auto kWaitSlice = std::chrono::milliseconds(50);
}  // namespace

void VersionSlots::Arm(int versions, uint32_t digest_count, bool shared,
                       std::unique_ptr<BucketRing> ring, std::chrono::milliseconds timeout,
                       std::string who) {
  util::MutexLock lock(&mu_);
  versions_.assign(static_cast<size_t>(versions), Version{});
  digests_.assign(static_cast<size_t>(versions), std::vector<uint64_t>(digest_count, 0));
  latest_ = -1;
  shared_ = shared;
  ring_ = std::move(ring);
  timeout_ = timeout;
  who_ = std::move(who);
}

void VersionSlots::RevokeReaders(Version* v) {
  v->revoked += v->readers;
  v->readers = 0;
  ++v->epoch;
  if (ring_) ring_->RevokeAll();
}

template <typename Readers, typename Revoke, typename What>
void VersionSlots::WaitForReaders(Readers readers, Revoke revoke, What what, WaitCost* cost,
                                  const util::Deadline* writer) {
  const auto start = std::chrono::steady_clock::now();
  util::Deadline deadline(timeout_);
  while (int left = readers()) {
    if (deadline.expired() || (writer != nullptr && (writer->expired() || writer->cancelled()))) {
      // The trainer does not wait longer than its timeout for a slow or stalled subscriber: its
      // read is revoked. It gets a typed error at the end of its step instead of the digests, so
      // it never commits what it read while the trainer writes (staged: its old weights stay; in
      // place: they are marked invalid).
      cost->revoked += left;
      WS_LOG(WARN, "publisher") << who_ << " " << what() << ": revoked the read of " << left
                                << " subscriber(s) still reading after "
                                << std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::chrono::steady_clock::now() - start)
                                       .count()
                                << " ms"
                                << (deadline.expired()    ? ""
                                    : writer->cancelled() ? " (the writer was cancelled: a relay "
                                                            "closing)"
                                                          : " (the writer's own deadline ended "
                                                            "the wait)");
      revoke();
      break;
    }
    cv_.WaitFor(&mu_, kWaitSlice);
  }
  cost->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

uint32_t VersionSlots::TakeForWrite(int64_t step, WaitCost* cost, const util::Deadline* writer) {
  util::MutexLock lock(&mu_);
  // One nobody reads that is not the latest (unless it is the only slot), else the oldest such
  // one. It is taken out of service at once: no new reader pins a version about to be overwritten.
  int chosen = -1, oldest = -1;
  for (int i = 0; i < static_cast<int>(versions_.size()); ++i) {
    if (i == latest_ && versions_.size() > 1) continue;
    if (versions_[i].readers == 0) {
      chosen = i;
      break;
    }
    if (oldest < 0 || versions_[i].step < versions_[oldest].step) oldest = i;
  }
  if (chosen < 0) chosen = oldest;
  Version& v = versions_[chosen];
  const int64_t replaced = v.step;
  v.step = -1;
  if (latest_ == chosen) latest_ = -1;
  WaitForReaders([&]() WS_REQUIRES(mu_) { return v.readers; },
                 [&]() WS_REQUIRES(mu_) { RevokeReaders(&v); },
                 [&] {
                   return "Publish(" + std::to_string(step) + "), to reuse the slot of step " +
                          std::to_string(replaced);
                 },
                 cost, writer);
  v.writing = true;
  return static_cast<uint32_t>(chosen);
}

int VersionSlots::TakeIdle() {
  util::MutexLock lock(&mu_);
  for (int i = 0; i < static_cast<int>(versions_.size()); ++i) {
    Version& v = versions_[i];
    if ((i == latest_ && versions_.size() > 1) || v.readers > 0 || v.revoked > 0) continue;
    v.step = -1;
    if (latest_ == i) latest_ = -1;
    v.writing = true;
    return i;
  }
  return -1;
}

void VersionSlots::Published(uint32_t slot, int64_t step) {
  {
    util::MutexLock lock(&mu_);
    versions_[slot].writing = false;
    versions_[slot].step = step;
    versions_[slot].progress = nullptr;
    if (shared_) {
      // Tensors shared by every slot: older versions no longer match them.
      for (uint32_t i = 0; i < versions_.size(); ++i) {
        if (i != slot) versions_[i].step = -1;
      }
    }
    latest_ = static_cast<int>(slot);
    latest_step_ = step;
    shared_writing_ = false;
  }
  cv_.NotifyAll();
}

void VersionSlots::WriteFailed(uint32_t slot) {
  util::MutexLock lock(&mu_);
  versions_[slot].writing = false;  // the slot holds no version; the next write reuses it
}

void VersionSlots::Streaming(uint32_t slot, int64_t step, StreamProgress* progress) {
  {
    util::MutexLock lock(&mu_);
    before_stream_ = latest_;
    before_stream_step_ = latest_step_;
    Version& v = versions_[slot];
    v.writing = false;
    v.step = step;
    v.progress = progress;
    latest_ = static_cast<int>(slot);
    latest_step_ = step;
  }
  cv_.NotifyAll();
}

void VersionSlots::StreamFailed(uint32_t slot) {
  {
    util::MutexLock lock(&mu_);
    Version& v = versions_[slot];
    v.step = -1;
    v.progress = nullptr;
    v.writing = false;
    RevokeReaders(&v);
    if (latest_ == static_cast<int>(slot)) {
      const bool kept =
          before_stream_ >= 0 && versions_[before_stream_].step == before_stream_step_;
      latest_ = kept ? before_stream_ : -1;
      latest_step_ = kept ? before_stream_step_ : -1;
    }
  }
  cv_.NotifyAll();
}

void VersionSlots::BeginWrite(WaitCost* cost) {
  util::MutexLock lock(&mu_);
  if (!shared_) return;    // copied tensors: a write never touches what a reader reads
  shared_writing_ = true;  // no new reader from here on
  WaitForReaders(
      [&]() WS_REQUIRES(mu_) {
        int readers = 0;
        for (const Version& v : versions_) readers += v.readers;
        return readers;
      },
      [&]() WS_REQUIRES(mu_) {
        for (Version& v : versions_) RevokeReaders(&v);
      },
      [] { return std::string("BeginWrite"); }, cost);
  // The shared tensors are about to change: no held version describes them any more.
  for (Version& v : versions_) v.step = -1;
}

int64_t VersionSlots::latest_step() const {
  util::MutexLock lock(&mu_);
  return latest_step_;
}

std::pair<int, int64_t> VersionSlots::latest() const {
  util::MutexLock lock(&mu_);
  if (latest_ < 0 || versions_[latest_].step != latest_step_) return {-1, -1};
  return {latest_, latest_step_};
}

Result<Pin> VersionSlots::Acquire(const wire::UpdateRequest& request,
                                  const util::Deadline& deadline,
                                  const std::function<bool()>& give_up, bool whole) {
  WS_ASSIGN_OR_RETURN(Pin pin, PinVersion(request, deadline, give_up, /*landing_ok=*/whole));
  // A ring's round is for bucket readers; an up-to-date answer pins nothing.
  if (!ring_ || whole || pin.begin.slot == wire::kNoSlot) return pin;
  // The ring is joined outside mu_: joining may wait for another round to end.
  Result<int> member = ring_->Join(pin.begin.step, deadline, give_up);
  if (!member.ok()) {
    wire::StepEnd unused;
    (void)Unpin(pin, &unused);  // nothing was read
    return member.status();
  }
  pin.ring_member = *member;
  bool revoked = false;
  {
    // A write may have revoked the pin before it joined (RevokeAll did not see this member
    // then): leave at once rather than stream tensors the trainer is writing.
    util::MutexLock lock(&mu_);
    revoked = versions_[pin.begin.slot].epoch != pin.epoch;
  }
  if (revoked) {
    wire::StepEnd unused;
    Status s = Unpin(pin, &unused);  // the revocation's Timeout
    return s.ok() ? Status::Internal("a revoked pin unpinned without an error") : s;
  }
  return pin;
}

Result<Pin> VersionSlots::PinVersion(const wire::UpdateRequest& request,
                                     const util::Deadline& deadline,
                                     const std::function<bool()>& give_up, bool landing_ok) {
  util::MutexLock lock(&mu_);
  if (request.step >= 0 && request.step <= request.after_step) {
    return Status::FailedPrecondition("step ", request.step,
                                      " is not newer than the subscriber's committed step ",
                                      request.after_step, " (stale)");
  }
  while (true) {
    if (closed_) return Status::Unavailable("publisher closed");
    if (!shared_writing_ && latest_ >= 0) {
      int target = -1;
      if (request.step < 0) {
        if (latest_step_ == request.after_step) return Pin{{latest_step_, wire::kNoSlot}, 0};
        if (latest_step_ < request.after_step) {
          return Status::FailedPrecondition("subscriber has step ", request.after_step,
                                            " but the publisher's latest is ", latest_step_);
        }
        target = latest_;
      } else {
        for (int i = 0; i < static_cast<int>(versions_.size()); ++i) {
          if (versions_[i].step == request.step) target = i;
        }
        if (target < 0 && request.step < latest_step_) {
          return Status::NotFound("step ", request.step, " is no longer held (latest is ",
                                  latest_step_, ")");
        }
      }
      // A reader of the mapped store copies the slot as it is: it waits until the version is
      // whole.
      if (target >= 0 && (landing_ok || versions_[target].progress == nullptr)) {
        Version& v = versions_[target];
        ++v.readers;
        return Pin{{v.step, static_cast<uint32_t>(target)}, v.epoch, -1, v.progress};
      }
    }
    if (give_up()) return Status::PeerLost("subscriber left while waiting for a step");
    if (deadline.expired()) {
      return Status::Timeout(
          "step ", request.step < 0 ? std::string("latest") : std::to_string(request.step),
          " not available within the subscriber's wait of ", request.wait_ms, " ms (latest is ",
          latest_step_, ")");
    }
    cv_.WaitFor(&mu_, kWaitSlice);
  }
}

Status VersionSlots::Unpin(const Pin& pin, wire::StepEnd* end) {
  // A ring member revoked for holding a bucket too long (or a failed fill) has read nothing it
  // may commit, whatever the version's epoch says.
  Status result = pin.ring_member >= 0 ? ring_->Leave(pin.ring_member) : Status::Ok();
  {
    util::MutexLock lock(&mu_);
    Version& v = versions_[pin.begin.slot];
    if (pin.epoch != v.epoch) {
      --v.revoked;
      result = Status::Timeout("the read of step ", pin.begin.step,
                               " was revoked: the publisher needed its memory (to write a new "
                               "version, or its arena-allocated tensors) after waiting ",
                               timeout_.count(),
                               " ms (PublisherOptions.timeout) for this subscriber to finish; "
                               "nothing it read may be committed");
    } else if (!result.ok()) {
      --v.readers;
    } else if (v.progress != nullptr) {
      // Still landing (its session gave up before the version was whole): no digests yet.
      --v.readers;
      result = Status::Unavailable("step ", pin.begin.step, " was not whole when its read ended");
    } else {
      end->step = pin.begin.step;
      end->digests.assign(digests_[pin.begin.slot].begin(), digests_[pin.begin.slot].end());
      --v.readers;
    }
  }
  cv_.NotifyAll();
  return result;
}

Result<uint32_t> VersionSlots::AwaitBucket(const Pin& pin, uint32_t bucket,
                                           const util::Deadline& deadline) {
  if (!ring_) return Status::FailedPrecondition("bucket ", bucket, ": this publisher has no ring");
  return ring_->Await(pin.ring_member, bucket, deadline);
}

Status VersionSlots::ReleaseBucket(const Pin& pin, uint32_t bucket) {
  if (!ring_) return Status::FailedPrecondition("bucket ", bucket, ": this publisher has no ring");
  return ring_->Release(pin.ring_member, bucket);
}

void VersionSlots::Close() {
  {
    util::MutexLock lock(&mu_);
    closed_ = true;
  }
  cv_.NotifyAll();
}

}  // namespace weightsync::transport::store
