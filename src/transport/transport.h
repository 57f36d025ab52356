// The one transport interface. A transport turns a plan into a *transfer handle*: everything a
// subscriber needs to receive a step (connection, mappings, staging, workers), prepared once and
// reused. The subscriber core (src/core/subscriber.cc) drives the handle and owns the semantics
// (staged/in-place, verification, commit, invalidation); the handle only moves bytes.
//
// Lifecycle: NewTransferHandle() is cheap; Prepare() does the expensive work; a failed call of
// any method leaves the handle unusable, and the core destroys it (Release() then destructor).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "plan/plan.h"
#include "transport/endpoint.h"
#include "util/deadline.h"
#include "weightsync/options.h"
#include "weightsync/status.h"
#include "wire/messages.h"

namespace weightsync::transport {

struct PrepareOptions {
  MatchPolicy policy = MatchPolicy::kStrict;
  UpdateMode mode = UpdateMode::kStaged;
  plan::ConvertOptions convert;
};

class TransferHandle {
 public:
  virtual ~TransferHandle() = default;
  virtual std::string_view transport_name() const = 0;

  // Connects and handshakes; returns the publisher's manifest and layout, valid while the handle
  // lives. Lets a subscriber with several publishers decide which one delivers which tensor
  // before any of them is prepared. Prepare() connects first when this was not called.
  virtual Result<const wire::Welcome*> Connect(const util::Deadline& deadline) = 0;
  // Connects (if needed), matches manifests into a plan, maps memory, allocates staging (staged
  // mode), starts workers. Logs one line saying what it prepared.
  virtual Status Prepare(const std::vector<plan::Destination>& destinations,
                         const PrepareOptions& options, const util::Deadline& deadline) = 0;
  virtual const plan::Plan& plan() const = 0;

  // Asks for `step` (nullopt: the latest) newer than `after_step`; returns the step the publisher
  // holds for us. Returning `after_step` means "already up to date": no copy follows.
  virtual Result<int64_t> BeginStep(std::optional<int64_t> step, int64_t after_step,
                                    const util::Deadline& deadline) = 0;
  // Moves every planned byte of the step into the staging buffer (staged) or straight into the
  // destinations (in place). `verify`: Verify will follow; a handle that reads some of the
  // publisher's bytes in place (cuda-ipc conversions) hashes them now, while the step is pinned.
  virtual Status CopyStep(bool verify, const util::Deadline& deadline) = 0;
  // Tells the publisher the copy is finished; returns its digests of the step (valid until the
  // next BeginStep). Only after this returns may the core commit.
  virtual Result<std::span<const uint64_t>> EndStep(const util::Deadline& deadline) = 0;
  // Checks the received bytes against the digests. Corruption names the tensor and byte range.
  virtual Status Verify(std::span<const uint64_t> digests, int64_t step,
                        const util::Deadline& deadline) = 0;
  // Staged: staging → destinations. Both modes: converted tensors from where they landed into
  // their destinations. In place without conversions: nothing to do.
  virtual Status Commit(const util::Deadline& deadline) = 0;

  // Releases what the handle holds in reverse order of creation. Each failure is logged with its
  // cause and the release continues; the aggregated Status is returned.
  virtual Status Release() = 0;
};

// An unprepared handle for the transport serving `endpoint`.
Result<std::unique_ptr<TransferHandle>> NewTransferHandle(const Endpoint& endpoint,
                                                          const SubscriberOptions& options);

}  // namespace weightsync::transport
