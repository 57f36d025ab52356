// One authenticated subscriber's session on the tcp publisher, on its own thread:
//   Hello → Welcome → Select → { UpdateRequest → StepBegin → data bytes → StepEnd }*
// The data of a step is the selected tensors' bytes, in Select order, straight from the pinned
// version (scatter-gather send, no staging copy). When the store is GPU memory the data goes over
// NCCL instead (path/nccl_path.h):
//   ... Select → NcclSetup → NcclId → (both join a two-rank communicator)
//   { UpdateRequest → StepBegin → grouped ncclBroadcast (root) of the slot's selected tensors →
//   StepEnd }*
// From a zero-copy or ring GPU publisher the broadcast reads its registered tensors themselves
// (fenced by BeginWrite); nothing is mapped, and no CUDA IPC handle leaves the host.
// The communicator lives as long as the session; any failure aborts it and ends the session. The
// step loop itself is publisher_session.h's, shared with the Unix link.
#pragma once

#include "transport/link/publisher_session.h"
#include "weightsync/status.h"
#include "wire/messages.h"

namespace weightsync::transport::link {

// FailedPrecondition when `welcome` must not go on a network connection: it lists a zero-copy
// publisher's exported CUDA allocations (IPC handles, chunk fds).
Status CheckServableOverTcp(const wire::Welcome& welcome);

// Serves until the peer leaves, breaks the protocol or the server stops; logs why it ended.
// Borrows `fd` (the caller closes it).
void RunSession(int fd, const SessionConfig& config);

}  // namespace weightsync::transport::link
