// The shared-memory transfer handle (subscriber side): a Unix-socket control channel to the
// publisher, the publisher's arena mapped read-only once, a copy worker pool and the plan.
#pragma once

#include <memory>

#include "transport/transport.h"
#include "util/unique_fd.h"

namespace weightsync::transport::shm {

std::unique_ptr<TransferHandle> NewShmHandle(const Endpoint& endpoint,
                                             const SubscriberOptions& options);

// Connects a stream Unix socket to `path` within the deadline and checks that the peer runs as
// this user (SO_PEERCRED). Shared with tests that play a raw client.
Result<util::UniqueFd> ConnectUnix(const std::string& path, const util::Deadline& deadline);

}  // namespace weightsync::transport::shm
