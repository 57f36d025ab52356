#include "transport/link/server.h"

namespace weightsync::transport::link {

Result<std::unique_ptr<Server>> StartServer(const Endpoint& endpoint, const ServerOptions& options,
                                            VersionSource* source) {
  switch (endpoint.kind) {
    case Endpoint::Kind::kLocal:
      return StartUnixServer(endpoint, options, source);
    case Endpoint::Kind::kTcp:
      return StartTcpServer(endpoint, options, source);
  }
  return Status::InvalidArgument("no link serves endpoint '", endpoint.ToString(), "'");
}

}  // namespace weightsync::transport::link
