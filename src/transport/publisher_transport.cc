#include "transport/publisher_transport.h"

#include <algorithm>

#include "transport/path_table.h"
#include "util/logging.h"

namespace weightsync::transport {

Result<std::unique_ptr<PublisherTransport>> PublisherTransport::ForEndpoint(
    const std::string& endpoint) {
  WS_ASSIGN_OR_RETURN(link::Endpoint parsed, link::ParseEndpoint(endpoint));
  return std::unique_ptr<PublisherTransport>(new PublisherTransport(std::move(parsed)));
}

PublisherTransport::~PublisherTransport() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "publisher") << "release: server: " << s;
}

Status PublisherTransport::Start(const PublisherOptions& options, VersionSource* source) {
  link::ServerOptions server_options;
  server_options.max_connections = options.max_connections;
  server_options.timeout = options.timeout;
  server_options.token = options.token;
  server_options.token_file = options.token_file;
  server_options.handshake_timeout = std::min(options.timeout, std::chrono::milliseconds(2000));
  server_options.deliver = &DeliverOverTcp;  // the path table's publisher end
  WS_ASSIGN_OR_RETURN(server_, link::StartServer(endpoint_, server_options, source));
  bound_ = server_->bound().ToString();
  return Status::Ok();
}

Status PublisherTransport::Close() {
  if (!server_) return Status::Ok();
  Status s = server_->Close();
  server_.reset();
  return s;
}

}  // namespace weightsync::transport
