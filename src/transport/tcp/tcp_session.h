// One authenticated subscriber's session on the publisher, on its own thread:
//   Hello → Welcome → Select → { UpdateRequest → StepBegin → data bytes → StepEnd }*
// The data of a step is the selected tensors' bytes, in Select order, straight from the pinned
// version (scatter-gather send, no staging copy).
//
// When the arena is GPU memory the data goes over NCCL instead (src/transport/nccl/):
//   ... Select → NcclSetup → NcclId → (both join a two-rank communicator)
//   { UpdateRequest → StepBegin → grouped ncclBroadcast (root) of the slot's selected tensors → StepEnd }*
// The communicator lives as long as the session; any failure aborts it and ends the session.
#pragma once

#include <atomic>
#include <chrono>
#include <string>

#include "transport/version_source.h"

namespace weightsync::transport::tcp {

struct SessionConfig {
  std::chrono::milliseconds timeout;
  std::string peer;
  VersionSource* source;
  const std::atomic<bool>* stopping;
};

// Serves until the peer leaves, breaks the protocol or the server stops; logs why it ended.
// Borrows `fd` (the caller closes it).
void RunSession(int fd, const SessionConfig& config);

}  // namespace weightsync::transport::tcp
