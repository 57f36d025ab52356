#include "core/relay_serve.h"

#include <string_view>
#include <unordered_map>
#include <utility>

#include "core/publisher_relay.h"
#include "util/logging.h"

namespace weightsync::core {

RelayServe::RelayServe(const SubscriberOptions& options) {
  serving_.endpoint = options.serve_endpoint;
  // Every hop authenticates as the trainer's endpoint does (docs/security.md).
  serving_.token = options.token;
  serving_.token_file = options.token_file;
  serving_.timeout = options.timeout;
  serving_.copy_threads = options.copy_threads;
}

RelayServe::~RelayServe() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "relay") << "cleanup: " << s;
}

Result<std::unique_ptr<RelayServe>> RelayServe::Listen(const SubscriberOptions& options) {
  std::unique_ptr<RelayServe> relay(new RelayServe(options));
  WS_RETURN_IF_ERROR(
      relay->Open(nullptr).WithContext("serve_endpoint '" + options.serve_endpoint + "'"));
  return relay;
}

// A serving publisher on the endpoint (the one bound first, once bound); with `upstream`, under
// its identity.
Status RelayServe::Open(const wire::Welcome* upstream) {
  if (publisher_) WS_RETURN_IF_ERROR(Close());
  PublisherOptions options = serving_;
  if (!endpoint_.empty()) options.endpoint = endpoint_;  // the port bound first, kept
  WS_ASSIGN_OR_RETURN(publisher_, Publisher::Create(options));
  endpoint_ = publisher_->endpoint();
  adopted_ = false;
  if (upstream == nullptr) return Status::Ok();
  WS_RETURN_IF_ERROR(PublisherRelayAccess::AdoptIdentity(*publisher_, *upstream));
  session_ = upstream->session_id;
  adopted_ = true;
  return Status::Ok();
}

Status RelayServe::CheckServable(const wire::Welcome& upstream,
                                 const std::vector<plan::Destination>& destinations) {
  auto refuse = [&](std::string_view tensor, std::string_view why) {
    return Status::FailedPrecondition(
        "serve_endpoint: published tensor '", tensor, "' ", why,
        "; a relay serves the trainer's whole version as published (docs/relays.md)");
  };
  if (upstream.digest_kind != wire::DigestKind::kXxh3) {
    return Status::FailedPrecondition(
        "serve_endpoint: the publisher digests on its GPU; relaying its versions (whose digests "
        "children verify on the host) is not built yet (docs/relays.md)");
  }
  std::unordered_map<std::string_view, const plan::Destination*> by_name;
  for (const plan::Destination& d : destinations) by_name.emplace(d.spec.name, &d);
  for (const wire::TensorPlacement& p : upstream.tensors) {
    if (p.sharded) return refuse(p.spec.name, "is a region of a larger tensor");
    auto it = by_name.find(p.spec.name);
    if (it == by_name.end()) return refuse(p.spec.name, "is not registered here");
    const plan::Destination& d = *it->second;
    if (d.spec.dtype != p.spec.dtype || d.spec.shape != p.spec.shape) {
      return refuse(p.spec.name, "is " + std::string(DTypeName(p.spec.dtype)) +
                                     ShapeString(p.spec.shape) + " but registered here as " +
                                     std::string(DTypeName(d.spec.dtype)) +
                                     ShapeString(d.spec.shape));
    }
    if (!d.regions.empty()) return refuse(p.spec.name, "is registered here as regions");
    if (d.device.is_cuda()) {
      return refuse(p.spec.name, "is held in CUDA memory here; relays serve from host memory");
    }
  }
  return Status::Ok();
}

Result<PublishStats> RelayServe::Serve(const wire::Welcome& upstream,
                                       const std::vector<plan::Destination>& destinations,
                                       int64_t step, std::span<const uint64_t> digests) {
  if (publisher_ && adopted_ && session_ != upstream.session_id) {
    WS_LOG(INFO, "relay") << endpoint_ << ": the publisher's session changed (lineage '"
                          << upstream.lineage << "'); serving it anew";
  }
  if (!publisher_ || (adopted_ && session_ != upstream.session_id)) {
    WS_RETURN_IF_ERROR(Open(&upstream));
  } else if (!adopted_) {
    WS_RETURN_IF_ERROR(PublisherRelayAccess::AdoptIdentity(*publisher_, upstream));
    session_ = upstream.session_id;
    adopted_ = true;
  }
  if (publisher_->manifest().size() == 0) {
    WS_RETURN_IF_ERROR(CheckServable(upstream, destinations));
    // The trainer's tensors in its manifest order, so that digest i names the same segment here.
    std::unordered_map<std::string_view, const plan::Destination*> by_name;
    for (const plan::Destination& d : destinations) by_name.emplace(d.spec.name, &d);
    std::vector<NamedTensor> tensors;
    tensors.reserve(upstream.tensors.size());
    for (const wire::TensorPlacement& p : upstream.tensors) {
      const plan::Destination& d = *by_name.find(p.spec.name)->second;  // checked above
      tensors.push_back({p.spec.name, TensorView{d.data, d.spec.dtype, d.spec.shape, d.device}});
    }
    WS_RETURN_IF_ERROR(publisher_->Register(tensors));
  }
  if (step <= publisher_->latest_step()) {
    // A step of this session already served, or an older one (a subscriber rewriting its
    // destinations after a weights check or a registration change): the store still holds the
    // newest version served, intact, and children keep getting it.
    PublishStats same;
    same.step = publisher_->latest_step();
    return same;
  }
  return PublisherRelayAccess::PublishGiven(*publisher_, step, digests);
}

Status RelayServe::Close() {
  if (!publisher_) return Status::Ok();
  Status s = publisher_->Close();
  publisher_.reset();
  adopted_ = false;
  return s;
}

}  // namespace weightsync::core
