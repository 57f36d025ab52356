// The publisher's transport in one object, as transport.h's TransferHandle is the subscriber's:
// the endpoint it owns, and the server (Unix socket or tcp, transport/link/server.h) that serves
// every subscriber a session over the core's VersionSource. core/publisher.cc names no link; what
// it needs to know of the endpoint is asked here.
#pragma once

#include <memory>
#include <string>

#include "transport/link/endpoint.h"
#include "transport/link/server.h"
#include "transport/link/version_source.h"
#include "weightsync/options.h"
#include "weightsync/status.h"

namespace weightsync::transport {

// What a server asks of the publisher core, and the versions it pins.
using VersionSource = link::VersionSource;
using Pin = link::Pin;

class PublisherTransport {
 public:
  // Parses PublisherOptions::endpoint; serves nothing yet.
  static Result<std::unique_ptr<PublisherTransport>> ForEndpoint(const std::string& endpoint);
  ~PublisherTransport();

  // The endpoint's name (names the store's host memory).
  const std::string& name() const { return endpoint_.name; }
  // Whether subscribers map the store (local://) rather than receive its bytes over the network
  // (tcp://): store::StoreLayout::local_readers.
  bool local_readers() const { return endpoint_.kind == link::Endpoint::Kind::kLocal; }
  // Binds the endpoint and serves `source` (AlreadyExists when a live publisher owns it).
  Status Start(const PublisherOptions& options, VersionSource* source);
  // The endpoint subscribers connect to (tcp://HOST:0: with the port bound), once started.
  const std::string& bound() const { return bound_; }
  // Stops serving: sessions ended, threads joined, the endpoint given up. Idempotent.
  Status Close();

 private:
  explicit PublisherTransport(link::Endpoint endpoint) : endpoint_(std::move(endpoint)) {}
  link::Endpoint endpoint_;
  std::unique_ptr<link::Server> server_;
  std::string bound_;
};

}  // namespace weightsync::transport
