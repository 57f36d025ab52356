// The tcp transfer handle (subscriber side): one authenticated connection to the publisher, the
// plan, and the scatter list that receives each step's bytes straight into the shadow buffer or
// the destinations. Prepared once, reused every step.
//
// When the publisher's arena is GPU memory and the destinations are CUDA tensors on one device,
// the connection stays the control channel and the bytes come over a two-rank NCCL communicator
// created once per handle (transport name "nccl"; src/transport/nccl/nccl_endpoints.h).
#pragma once

#include <memory>

#include "transport/transport.h"
#include "util/unique_fd.h"

namespace weightsync::transport::tcp {

std::unique_ptr<TransferHandle> NewTcpHandle(const Endpoint& endpoint,
                                             const SubscriberOptions& options);

// Resolves and connects within the deadline (asio), returning the connected socket's fd with
// TCP_NODELAY set. Shared with tests that play a raw client.
Result<util::UniqueFd> ConnectTcp(const Endpoint& endpoint, const util::Deadline& deadline);

}  // namespace weightsync::transport::tcp
