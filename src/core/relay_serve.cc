#include "core/relay_serve.h"

#include <cstring>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "core/publisher_relay.h"
#include "transport/link/endpoint.h"
#include "util/fail_point.h"
#include "util/logging.h"

namespace weightsync::core {

RelayServe::RelayServe(const SubscriberOptions& options) {
  serving_.endpoint = options.serve_endpoint;
  // Every hop authenticates as the trainer's endpoint does (docs/security.md).
  serving_.token = options.token;
  serving_.token_file = options.token_file;
  serving_.timeout = options.timeout;
  serving_.copy_threads = options.copy_threads;
  serving_.max_direct = options.serve_max_direct;
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
  WS_ASSIGN_OR_RETURN(std::unique_ptr<Publisher> created, Publisher::Create(options));
  PublisherRelayAccess::OnMembersChanged(*created, members_changed_);
  {
    util::MutexLock lock(&swap_mu_);
    publisher_ = std::move(created);
  }
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
  std::unordered_map<std::string_view, const plan::Destination*> by_name;
  for (const plan::Destination& d : destinations) by_name.emplace(d.spec.name, &d);
  const plan::Destination* first = nullptr;  // the first published tensor's
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
    // One store serves: a host arena for host destinations, a GPU arena on their device for CUDA
    // ones (destinations the trainer does not publish do not matter).
    if (first == nullptr) first = &d;
    if (d.device != first->device) {
      return Status::FailedPrecondition(
          "serve_endpoint: published tensors '", first->spec.name, "' (",
          DeviceString(first->device), ") and '", p.spec.name, "' (", DeviceString(d.device),
          ") are held on different devices here; a relay serves from one store, in host memory "
          "or on one GPU (docs/relays.md)");
    }
  }
  // Its children verify the trainer's digests as that store's kind (xxh3 on the host, the GPU
  // digest on a GPU), so the trainer must have digested the same way.
  const bool on_gpu = first != nullptr && first->device.is_cuda();
  if (on_gpu && upstream.digest_kind != wire::DigestKind::kGpu64) {
    return Status::FailedPrecondition(
        "serve_endpoint: the destinations are CUDA memory, served from a GPU store whose children "
        "verify digests taken on a GPU, but the publisher digests on the host; relaying a host "
        "publisher's versions into CUDA memory is not built yet (docs/relays.md)");
  }
  if (!on_gpu && upstream.digest_kind != wire::DigestKind::kXxh3) {
    return Status::FailedPrecondition(
        "serve_endpoint: the publisher digests on its GPU; relaying its versions into host memory "
        "(whose children verify on the host) is not built yet (docs/relays.md)");
  }
  return Status::Ok();
}

// Whether the serving publisher still copies from `destinations`: the same tensors at the same
// addresses as when it registered them (an engine that slept may have registered new memory).
// No allocation: a steady step only compares.
bool RelayServe::SameSources(const std::vector<plan::Destination>& destinations) const {
  if (destinations.size() != destination_count_) return false;
  for (size_t i = 0; i < sources_.size(); ++i) {
    const plan::Destination& d = destinations[order_[i]];
    if (d.data != sources_[i] || d.spec.name != publisher_->manifest().tensors()[i].name) {
      return false;
    }
  }
  return true;
}

Status RelayServe::Register(const wire::Welcome& upstream,
                            const std::vector<plan::Destination>& destinations) {
  WS_RETURN_IF_ERROR(CheckServable(upstream, destinations));
  // The trainer's tensors in its manifest order, so that digest i names the same segment here.
  std::unordered_map<std::string_view, uint32_t> by_name;
  for (uint32_t i = 0; i < destinations.size(); ++i) by_name.emplace(destinations[i].spec.name, i);
  std::vector<NamedTensor> tensors;
  std::vector<uint32_t> order;
  std::vector<const uint8_t*> sources;
  for (const wire::TensorPlacement& p : upstream.tensors) {
    const uint32_t at = by_name.find(p.spec.name)->second;  // CheckServable found every one
    const plan::Destination& d = destinations[at];
    tensors.push_back({p.spec.name, TensorView{d.data, d.spec.dtype, d.spec.shape, d.device}});
    order.push_back(at);
    sources.push_back(d.data);
  }
  WS_RETURN_IF_ERROR(publisher_->Register(tensors));
  order_ = std::move(order);
  sources_ = std::move(sources);
  destination_count_ = destinations.size();
  on_gpu_ = !tensors.empty() && tensors[0].view.device.is_cuda();
  return Status::Ok();
}

const char* RelayServe::ReplaceReason(const wire::Welcome& upstream,
                                      const std::vector<plan::Destination>& destinations,
                                      int64_t step, bool moved) const {
  const bool registered = publisher_ && publisher_->manifest().size() > 0;
  // A serving publisher serves one session, copying from the memory it registered; its store
  // holds what it copied. Anything else needs a new one on the same endpoint (children dial
  // again): a new session (a restarted trainer), destinations registered anew (after Sleep), or
  // a step committed again (after a weights check found the destinations differ, the copy in the
  // store may be of those bytes: it is taken again from the rewritten ones).
  if (adopted_ && session_ != upstream.session_id) return "the publisher's session changed";
  if (registered && !SameSources(destinations)) return "its destinations were registered anew";
  if (registered && moved && step <= publisher_->latest_step()) {
    return "it committed a step it serves again";
  }
  return nullptr;
}

Status RelayServe::Ready(const wire::Welcome& upstream,
                         const std::vector<plan::Destination>& destinations, int64_t step,
                         bool moved) {
  const char* why = ReplaceReason(upstream, destinations, step, moved);
  if (why != nullptr || !publisher_) {
    if (why != nullptr) {
      WS_LOG(INFO, "relay") << endpoint_ << ": " << why << " (lineage '" << upstream.lineage
                            << "', step " << step << "); serving anew";
    }
    WS_RETURN_IF_ERROR(Open(&upstream));
  } else if (!adopted_) {
    WS_RETURN_IF_ERROR(PublisherRelayAccess::AdoptIdentity(*publisher_, upstream));
    session_ = upstream.session_id;
    adopted_ = true;
  }
  if (publisher_->manifest().size() == 0) WS_RETURN_IF_ERROR(Register(upstream, destinations));
  return Status::Ok();
}

Result<PublishStats> RelayServe::Serve(const wire::Welcome& upstream,
                                       const std::vector<plan::Destination>& destinations,
                                       int64_t step, std::span<const uint64_t> digests, bool moved,
                                       const util::Deadline& deadline) {
  auto fail = [&](const Status& s) {
    AbortStream(s);
    return s;
  };
  WS_FAIL_POINT_RETURN_VIA(fail, "relay.serve");
  if (forward_.streaming() >= 0) {
    // Served while it landed: the trainer's digests end the step for the children reading it.
    const int64_t streamed = forward_.streaming();
    if (streamed != step) {
      AbortStream(Status::Internal("relay streamed step ", streamed, " but committed ", step));
    } else {
      forward_.Stop();
      (void)util::FailPoints::Check("relay.before_finish");  // tests: sleep:<ms> holds it here
      return PublisherRelayAccess::FinishStream(*publisher_, digests);
    }
  }
  WS_RETURN_IF_ERROR(Ready(upstream, destinations, step, moved));
  if (step <= publisher_->latest_step()) {
    // Up to date: the step this relay committed and serves already.
    PublishStats same;
    same.step = publisher_->latest_step();
    return same;
  }
  return PublisherRelayAccess::PublishGiven(*publisher_, step, digests, deadline);
}

transport::path::LandingObserver* RelayServe::Stream(
    const wire::Welcome& upstream, const std::vector<plan::Destination>& destinations,
    int64_t step) {
  forward_.Stop();
  // A serving publisher to replace is replaced once the step is committed (Serve), as before:
  // children of a relay whose update then fails keep being served the step before.
  if (ReplaceReason(upstream, destinations, step, /*moved=*/true) != nullptr) return nullptr;
  if (Status s = Ready(upstream, destinations, step, /*moved=*/true); !s.ok()) {
    WS_LOG(WARN, "relay") << endpoint_ << ": not serving step " << step << " while it lands: " << s;
    return nullptr;
  }
  forward_.Arm(step);
  return &forward_;
}

void RelayServe::AbortStream(const Status& why) {
  if (forward_.streaming() < 0) return;
  WS_LOG(INFO, "relay") << endpoint_ << ": step " << forward_.streaming()
                        << " is not served: " << why;
  forward_.Stop();
  if (publisher_) PublisherRelayAccess::AbortStream(*publisher_, why);
}

bool RelayServe::Forward::Begin(int64_t step, std::span<const transport::path::LandingPart> parts) {
  if (armed_ != step || !relay_->publisher_) return false;
  armed_ = -1;
  Result<PublisherRelayAccess::StreamTarget> target =
      PublisherRelayAccess::BeginStream(*relay_->publisher_, step);
  if (!target.ok()) {
    // Busy: a slow child still reads the other slot; the step is stored and forwarded.
    if (target.status().code() == StatusCode::kBusy) {
      WS_LOG(INFO, "relay") << relay_->endpoint_ << ": " << target.status().message()
                            << ": served once committed, not while it lands";
    } else {
      WS_LOG(WARN, "relay") << relay_->endpoint_ << ": step " << step
                            << " is served once committed, not while it lands: " << target.status();
    }
    return false;
  }
  for (const transport::path::LandingPart& p : parts) {
    if (p.tensor >= target->offsets.size()) {  // our own plan: never, but never out of bounds
      PublisherRelayAccess::AbortStream(
          *relay_->publisher_,
          Status::Internal("landing part of tensor ", p.tensor, " of ", target->offsets.size()));
      return false;
    }
  }
  target_ = *target;
  parts_ = parts;
  part_ = 0;
  copied_ = 0;
  streaming_ = step;
  return true;
}

void RelayServe::Forward::CopyLanded(size_t part, uint64_t from, uint64_t to) {
  const transport::path::LandingPart& p = parts_[part];
  uint8_t* dst = target_.slot + target_.offsets[p.tensor] + p.offset + from;
  std::memcpy(dst, p.bytes + from, to - from);
  // Tests: a relay that corrupts what it serves (its children's verify must refuse it).
  if (util::FailPoints::Check("relay.corrupt_served").action == util::FailAction::kFlip) {
    dst[(to - from) / 2] ^= 0x01;
  }
  target_.progress->Landed(p.tensor, p.offset + to);
}

void RelayServe::Forward::Read(size_t part, size_t offset) {
  // Copied in chunks of at least this much (or a part's end): a child is at most one chunk
  // behind, and the relay's read loop is not slowed by a copy per small read.
  constexpr uint64_t kChunk = 1ull << 20;
  if (streaming_ < 0) return;
  if (part == part_ && offset - copied_ < kChunk) return;
  for (; part_ < part && part_ < parts_.size(); ++part_, copied_ = 0) {
    if (parts_[part_].size > copied_) CopyLanded(part_, copied_, parts_[part_].size);
  }
  if (part_ < parts_.size() && offset > copied_) {
    CopyLanded(part_, copied_, offset);
    copied_ = offset;
  }
}

uint32_t RelayServe::Below() const {
  return publisher_ ? PublisherRelayAccess::Below(*publisher_) : 0;
}

Result<std::string> RelayServe::Announced(const SubscriberOptions& options,
                                          const std::string& bound) {
  if (!options.serve_announce.empty()) {
    if (options.serve_announce.size() > wire::kMaxEndpointBytes) {
      return Status::InvalidArgument("SubscriberOptions.serve_announce is ",
                                     options.serve_announce.size(), " bytes, more than ",
                                     wire::kMaxEndpointBytes);
    }
    WS_RETURN_IF_ERROR(transport::link::ParseEndpoint(options.serve_announce)
                           .status()
                           .WithContext("SubscriberOptions.serve_announce"));
    return options.serve_announce;
  }
  WS_ASSIGN_OR_RETURN(transport::link::Endpoint endpoint, transport::link::ParseEndpoint(bound));
  const bool wildcard =
      endpoint.kind == transport::link::Endpoint::Kind::kTcp &&
      (endpoint.host == "0.0.0.0" || endpoint.host == "::" || endpoint.host == "[::]");
  if (wildcard) {
    WS_LOG(INFO, "relay") << bound
                          << " binds a wildcard address: not announced to the publisher (set "
                             "serve_announce to the address children reach it by)";
    return std::string();
  }
  if (bound.size() > wire::kMaxEndpointBytes) return std::string();
  return bound;
}

std::vector<MemberInfo> RelayServe::Members() const {
  util::MutexLock lock(&swap_mu_);
  return publisher_ ? publisher_->Members() : std::vector<MemberInfo>();
}

void RelayServe::OnMembersChanged(std::function<void()> tell) {
  members_changed_ = std::move(tell);
  if (publisher_) PublisherRelayAccess::OnMembersChanged(*publisher_, members_changed_);
}

void RelayServe::FillReport(wire::MembersReport* report) const {
  if (publisher_) {
    PublisherRelayAccess::FillReport(*publisher_, report);
  } else {
    report->members.clear();
    report->below = 0;
    report->room = 0;
  }
}

std::vector<MemberInfo> RelayServe::Tree() const {
  util::MutexLock lock(&swap_mu_);
  return publisher_ ? publisher_->Tree() : std::vector<MemberInfo>();
}

Status RelayServe::Sleep() {
  if (!on_gpu_ || !publisher_) return Status::Ok();
  WS_LOG(INFO, "relay") << endpoint_
                        << ": sleeping, its GPU store given back; serving again after the next "
                           "update";
  return Close();
}

Status RelayServe::Close() {
  AbortStream(Status::Unavailable("relay closing"));
  if (!publisher_) return Status::Ok();
  Status s = publisher_->Close();
  {
    util::MutexLock lock(&swap_mu_);
    publisher_.reset();
  }
  adopted_ = false;
  return s;
}

}  // namespace weightsync::core
