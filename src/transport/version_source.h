// VersionSource: what a transport's server needs from the publisher core — the arena layout and
// pinned versions. Implemented by Publisher::Impl; shared by the shm and tcp servers.
#pragma once

#include <functional>
#include <utility>

#include "util/deadline.h"
#include "weightsync/status.h"
#include "wire/messages.h"

namespace weightsync::transport {

// What the server needs from the publisher core.
class VersionSource {
 public:
  virtual ~VersionSource() = default;
  // Waits until the arena exists; returns its layout and fd (owned by the source).
  virtual Result<std::pair<const wire::Welcome*, int>> WaitLayout(
      const util::Deadline& deadline, const std::function<bool()>& give_up) = 0;
  // Waits until a version satisfies `request`, pins it and describes it. A StepBegin whose step
  // equals request.after_step means "up to date" and pins nothing.
  virtual Result<wire::StepBegin> Acquire(const wire::UpdateRequest& request,
                                          const util::Deadline& deadline,
                                          const std::function<bool()>& give_up) = 0;
  // Copies the pinned version's digests into `end` and unpins it.
  virtual void Unpin(const wire::StepBegin& begin, wire::StepEnd* end) = 0;
  // Address of arena offset 0 in this process (the TCP server sends from it).
  virtual const uint8_t* arena_base() const = 0;
};

}  // namespace weightsync::transport
