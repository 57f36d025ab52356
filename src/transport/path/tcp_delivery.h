// The publisher's end of the data paths over tcp (the path table's `deliver`): how a tcp session
// (transport/link/tcp_session.h) sends a pinned step's bytes once the subscriber's Select
// arrived — on the connection itself from a host store (path `tcp`: scatter-gather writes
// straight from the pinned version, or from a host ring publisher's tensors), or over a two-rank
// NCCL communicator set up right then from a GPU store (paths `nccl`, `nccl-zero-copy`,
// `nccl-ring`: nccl_path.h's NcclSender, from the arena or from the registered tensors).
#pragma once

#include <memory>

#include "transport/link/channel.h"
#include "transport/link/publisher_session.h"
#include "weightsync/status.h"
#include "wire/handshake.h"
#include "wire/messages.h"

namespace weightsync::transport::path {

Result<std::unique_ptr<link::StepDelivery>> DeliverOnSocket(link::Channel& ch,
                                                            const link::SessionConfig& config,
                                                            const wire::Welcome& welcome,
                                                            int store_fd,
                                                            const wire::Select& select);
Result<std::unique_ptr<link::StepDelivery>> DeliverOverNccl(link::Channel& ch,
                                                            const link::SessionConfig& config,
                                                            const wire::Welcome& welcome,
                                                            int store_fd,
                                                            const wire::Select& select);

}  // namespace weightsync::transport::path
