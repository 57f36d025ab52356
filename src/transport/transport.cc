#include "transport/transport.h"

#include "transport/shm/shm_handle.h"
#include "transport/tcp/tcp_handle.h"

namespace weightsync::transport {

Result<std::unique_ptr<TransferHandle>> NewTransferHandle(const Endpoint& endpoint,
                                                          const SubscriberOptions& options) {
  switch (endpoint.kind) {
    case Endpoint::Kind::kLocal:
      return shm::NewShmHandle(endpoint, options);
    case Endpoint::Kind::kTcp:
      return tcp::NewTcpHandle(endpoint, options);
  }
  return Status::Unavailable("no transport serves endpoint '", endpoint.name, "'");
}

}  // namespace weightsync::transport
