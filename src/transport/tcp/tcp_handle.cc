#include "transport/tcp/tcp_handle.h"

#include <sys/uio.h>
#include <unistd.h>

#include <asio.hpp>
#include <thread>

#include "cuda/device.h"
#include "transport/host_data_path.h"
#include "transport/step_exchange.h"
#include "transport/nccl/nccl_endpoints.h"
#include "util/fail_point.h"
#include "util/ledger.h"
#include "util/logging.h"
#include "util/token.h"
#include "util/worker_pool.h"
#include "wire/channel.h"
#include "wire/handshake.h"

namespace weightsync::transport::tcp {
namespace {

using asio::ip::tcp;
using util::Deadline;
using util::LedgerAdd;
using util::LedgerItem;

class TcpHandle final : public TransferHandle {
 public:
  TcpHandle(Endpoint endpoint, SubscriberOptions options)
      : endpoint_(std::move(endpoint)), options_(std::move(options)) {}
  ~TcpHandle() override {
    if (Status s = Release(); !s.ok()) WS_LOG(WARN, "tcp") << "handle cleanup: " << s;
  }

  std::string_view transport_name() const override { return nccl_ ? "nccl" : "tcp"; }
  const plan::Plan& plan() const override { return plan_; }
  Result<const wire::Welcome*> Connect(const Deadline& deadline) override;
  Status Prepare(const std::vector<plan::Destination>& destinations,
                 const PrepareOptions& options, const Deadline& deadline) override;
  Result<int64_t> BeginStep(std::optional<int64_t> step, int64_t after_step,
                            const Deadline& deadline) override;
  Status CopyStep(bool verify, const Deadline& deadline) override;
  Result<std::span<const uint64_t>> EndStep(const Deadline& deadline) override;
  Status Verify(std::span<const uint64_t> digests, int64_t step,
                const Deadline& deadline) override {
    if (nccl_) return nccl_->Verify(digests, step, deadline);
    return host_.Verify(digests, welcome_.digest_kind, step);
  }
  Status Commit(const Deadline& deadline) override {
    if (nccl_) return nccl_->Commit(deadline);
    return host_.Commit();
  }
  Status Release() override;

 private:
  Status Authenticate(const std::string& token, const Deadline& deadline);
  // GPU arena: select, then set up the NCCL communicator that carries every step.
  Status PrepareNccl(const std::vector<plan::Destination>& destinations,
                     const PrepareOptions& options, const Deadline& deadline);
  // After a failed NCCL wait that saw the connection close: the publisher's Error frame, if it
  // sent one before closing, says more than "closed".
  Status PublisherReason(const Status& seen);

  Endpoint endpoint_;
  SubscriberOptions options_;
  std::string peer_;
  std::unique_ptr<wire::Channel> channel_;
  HostDataPath host_;  // host arena: staging, verification, commit
  std::unique_ptr<nccl::NcclReceiver> nccl_;  // GPU arena: NCCL receives, GPU staging/verify
  nccl::Watch watch_;  // what NCCL waits watch: this connection
  bool counted_ = false;
  bool connected_ = false;
  std::string token_;
  wire::Welcome welcome_;
  plan::Plan plan_;
  std::vector<iovec> parts_;  // one per planned tensor, refilled per step without allocating
  wire::StepBegin begin_;
  wire::StepEnd end_;
};

Status TcpHandle::Authenticate(const std::string& token, const Deadline& deadline) {
  wire::Challenge challenge;
  WS_RETURN_IF_ERROR(channel_->ReceiveExpect(wire::FrameType::kChallenge, &challenge, deadline));
  if (challenge.protocol_version != wire::kProtocolVersion) {
    return Status::FailedPrecondition(peer_, " speaks protocol version ",
                                      challenge.protocol_version, ", this subscriber speaks ",
                                      wire::kProtocolVersion);
  }
  if (challenge.auth_required && token.empty()) {
    return Status::Unauthenticated(peer_, " requires a token and none is configured "
                                          "(SubscriberOptions.token_file, WEIGHTSYNC_TOKEN_FILE "
                                          "or WEIGHTSYNC_TOKEN)");
  }
  if (!challenge.auth_required && !token.empty()) {
    return Status::Unauthenticated(peer_, " does not authenticate, but this subscriber has a "
                                          "token: refusing an unauthenticated publisher");
  }
  WS_ASSIGN_OR_RETURN(wire::Nonce nonce, wire::RandomNonce());
  wire::Auth auth{wire::Role::kSubscriber, nonce,
                  wire::ComputeMac(token, wire::MacSide::kClient, challenge, nonce,
                                   wire::Role::kSubscriber)};
  WS_RETURN_IF_ERROR(channel_->Send(wire::FrameType::kAuth, auth, deadline));
  wire::AuthOk ok;
  WS_RETURN_IF_ERROR(channel_->ReceiveExpect(wire::FrameType::kAuthOk, &ok, deadline));
  wire::Mac expected = wire::ComputeMac(token, wire::MacSide::kServer, challenge, nonce,
                                        wire::Role::kSubscriber);
  if (!wire::MacEquals(expected, ok.mac)) {
    return Status::Unauthenticated(peer_, " failed to prove it holds the token");
  }
  // The publisher has proven itself (or, without a token, loopback is all the proof there is):
  // the Welcome and step frames may be full-size.
  channel_->set_max_payload(wire::kMaxPayloadBytes);
  return Status::Ok();
}

Result<const wire::Welcome*> TcpHandle::Connect(const Deadline& deadline) {
  if (connected_) return &welcome_;
  peer_ = "publisher " + endpoint_.ToString();
  counted_ = true;
  LedgerAdd(LedgerItem::kHandles, 1);
  WS_FAIL_POINT_RETURN("tcp.prepare");
  WS_ASSIGN_OR_RETURN(token_, util::LoadToken(options_.token, options_.token_file));
  WS_ASSIGN_OR_RETURN(util::UniqueFd fd, ConnectTcp(endpoint_, deadline));
  // Handshake-sized frames only until Authenticate() has checked the publisher's MAC: an
  // impostor must not make us reserve a full-size frame buffer with one 24-byte header.
  channel_ = std::make_unique<wire::Channel>(std::move(fd), peer_,
                                             wire::kMaxHandshakePayloadBytes);
  LedgerAdd(LedgerItem::kConnections, 1);
  WS_RETURN_IF_ERROR(Authenticate(token_, deadline));

  WS_RETURN_IF_ERROR(channel_->Send(wire::FrameType::kHello, SubscriberHello(deadline), deadline));
  WS_RETURN_IF_ERROR(channel_->ReceiveExpect(wire::FrameType::kWelcome, &welcome_, deadline));
  WS_RETURN_IF_ERROR(plan::ValidateLayout(welcome_).WithContext(peer_));
  connected_ = true;
  return &welcome_;
}

Status TcpHandle::Prepare(const std::vector<plan::Destination>& destinations,
                          const PrepareOptions& options, const Deadline& deadline) {
  // Host destinations take a host arena's bytes from this connection; CUDA destinations (all on
  // one device) take a GPU arena's bytes over NCCL. Which one the publisher has, its Welcome says.
  const bool cuda = !destinations.empty() && destinations[0].device.is_cuda();
  for (const auto& d : destinations) {
    if (d.device.is_cuda() != cuda) {
      return Status::NotSupported("tcp: destination '", d.spec.name, "' is on ",
                                  DeviceString(d.device), " but '", destinations[0].spec.name,
                                  "' is on ", DeviceString(destinations[0].device),
                                  ": a tcp subscriber receives into host memory (from a host "
                                  "arena) or into one CUDA device (from a GPU arena, over nccl)");
    }
  }
  WS_RETURN_IF_ERROR(Connect(deadline).status());
  if (welcome_.arena_kind == wire::ArenaKind::kCudaMem) {
    if (!cuda) {
      return Status::NotSupported(
          peer_, " keeps its arena on cuda:", welcome_.device, ", which tcp moves over nccl into "
          "CUDA destinations only; destination '", destinations[0].spec.name, "' is on ",
          DeviceString(destinations[0].device));
    }
    return PrepareNccl(destinations, options, deadline);
  }
  if (cuda) {
    return Status::NotSupported(peer_, " keeps its arena in host memory, which the tcp transport "
                                       "delivers into host memory only; destination '",
                                destinations[0].spec.name, "' is on ",
                                DeviceString(destinations[0].device),
                                " (publish from CUDA tensors to use nccl)");
  }
  WS_ASSIGN_OR_RETURN(plan_,
                      plan::BuildPlan(welcome_, destinations, options.policy, 4ull << 20,
                                      options.convert));
  wire::Select select;
  for (const auto& t : plan_.tensors) select.tensors.push_back(t.publisher_index);
  WS_RETURN_IF_ERROR(channel_->Send(wire::FrameType::kSelect, select, deadline));

  parts_.assign(plan_.tensors.size(), iovec{});
  int threads = options_.copy_threads > 0 ? options_.copy_threads : util::DefaultThreads();
  WS_RETURN_IF_ERROR(host_.Prepare(&plan_, destinations, options.mode, threads));
  end_.digests.reserve(plan_.digest_count);
  WS_LOG(INFO, "tcp") << "prepared handle for " << peer_ << ": " << plan_.tensors.size()
                      << " tensors, " << plan_.total_bytes << " bytes, " << plan_.buckets.size()
                      << " buckets, " << plan_.segments.size() << " segments, "
                      << (token_.empty() ? "no token (loopback)" : "authenticated");
  return Status::Ok();
}

Status TcpHandle::PrepareNccl(const std::vector<plan::Destination>& destinations,
                              const PrepareOptions& options, const Deadline& deadline) {
  if (welcome_.digest_kind != wire::DigestKind::kGpu64) {
    return Status::ProtocolError(peer_, ": a GPU arena with digest kind ",
                                 static_cast<int>(welcome_.digest_kind),
                                 ", expected 1 (GPU digest)");
  }
  if (welcome_.direct_bytes > 0) {
    return Status::NotSupported("nccl: arena-allocated GPU tensors are not supported yet");
  }
  // Everything this side needs is checked before the publisher is asked for anything.
  const std::string why = peer_ + " keeps its arena on cuda:" + std::to_string(welcome_.device) +
                          " and the destinations are CUDA tensors, which needs the nccl transport";
  WS_RETURN_IF_ERROR(nccl::NcclAvailable().WithContext(why));
  WS_RETURN_IF_ERROR(gpu::CudaAvailable().WithContext(why));
  WS_ASSIGN_OR_RETURN(plan_,
                      plan::BuildPlan(welcome_, destinations, options.policy, 4ull << 20,
                                      options.convert));
  if (plan_.uses_direct) {
    return Status::NotSupported("nccl: arena-allocated GPU tensors are not supported yet");
  }
  wire::Select select;
  for (const auto& t : plan_.tensors) select.tensors.push_back(t.publisher_index);
  WS_RETURN_IF_ERROR(channel_->Send(wire::FrameType::kSelect, select, deadline));

  // Staging, digests and the receive list first: the communicator is created last and released
  // first, so no NCCL kernel can outlive the memory it writes.
  nccl_ = std::make_unique<nccl::NcclReceiver>();
  WS_RETURN_IF_ERROR(nccl_->Prepare(&plan_, destinations, options.mode).WithContext(peer_));
  const int version = nccl::NcclVersionCode();
  wire::NcclSetup setup{static_cast<uint32_t>(version), static_cast<uint32_t>(nccl_->device())};
  WS_RETURN_IF_ERROR(channel_->Send(wire::FrameType::kNcclSetup, setup, deadline));
  wire::NcclId id;
  WS_RETURN_IF_ERROR(channel_->ReceiveExpect(wire::FrameType::kNcclId, &id, deadline));
  if (!nccl::CompatibleVersions(version, static_cast<int>(id.nccl_version))) {
    return Status::FailedPrecondition(
        peer_, ": NCCL versions differ: publisher ",
        nccl::NcclVersionString(static_cast<int>(id.nccl_version)), ", subscriber ",
        nccl::NcclVersionString(version),
        " (both ranks of a communicator need the same NCCL major.minor)");
  }
  watch_ = nccl::Watch{channel_->fd(), nullptr, peer_};
  Status s = nccl_->Connect(id.unique_id, deadline, watch_);
  if (!s.ok()) return PublisherReason(s);
  end_.digests.reserve(plan_.digest_count);
  WS_LOG(INFO, "tcp") << "prepared nccl handle for " << peer_ << ": " << plan_.tensors.size()
                      << " tensors, " << plan_.total_bytes << " bytes, " << plan_.segments.size()
                      << " segments; communicator rank 1 on cuda:" << nccl_->device()
                      << " (publisher rank 0 on cuda:" << welcome_.device << "), NCCL "
                      << nccl::NcclVersionString(version) << ", joined in "
                      << static_cast<int>(nccl_->link()->connect_seconds() * 1000) << " ms, "
                      << (options.mode == UpdateMode::kStaged
                              ? std::to_string(nccl_->staging_bytes()) + " staging bytes"
                              : std::string("in place"));
  return Status::Ok();
}

Status TcpHandle::PublisherReason(const Status& seen) {
  if (seen.code() != StatusCode::kPeerLost || !channel_) return seen;
  Result<wire::FrameHeader> h = channel_->Receive(Deadline(std::chrono::milliseconds(100)));
  if (!h.ok() || h->type != wire::FrameType::kError) return seen;
  wire::ErrorMessage err;
  if (!wire::Decode(channel_->payload(), &err).ok()) return seen;
  Status reason = wire::ToStatus(err).WithContext(peer_);
  return Status(reason.code(), reason.message() + " (" + seen.message() + ")");
}

Result<int64_t> TcpHandle::BeginStep(std::optional<int64_t> step, int64_t after_step,
                                     const Deadline& deadline) {
  return RequestStep(*channel_, peer_, step, after_step, &begin_, deadline);
}

Status TcpHandle::CopyStep(bool /*verify*/, const Deadline& deadline) {
  if (nccl_) {
    WS_FAIL_POINT_RETURN("tcp.before_data");
    Status s = nccl_->Receive(deadline, watch_);
    if (!s.ok()) {
      return PublisherReason(s).WithContext("step " + std::to_string(begin_.step) + " data");
    }
    return Status::Ok();
  }
  for (size_t i = 0; i < plan_.tensors.size(); ++i) {
    const plan::PlannedTensor& t = plan_.tensors[i];
    parts_[i] = {host_.ReceivedTensor(t), t.nbytes};
  }
  WS_FAIL_POINT_RETURN("tcp.before_data");
  Status s = channel_->ReadAll(parts_, deadline);
  if (!s.ok()) return s.WithContext("step " + std::to_string(begin_.step) + " data");
  host_.MaybeInjectBitFlip();
  return Status::Ok();
}

Result<std::span<const uint64_t>> TcpHandle::EndStep(const Deadline& deadline) {
  return ReceiveStepEnd(*channel_, peer_, begin_.step, plan_.digest_count, &end_, deadline);
}

Status TcpHandle::Release() {
  Status result;
  // Reverse order of creation: the communicator and GPU staging (nccl), host staging, then the
  // connection.
  if (nccl_) {
    if (Status s = nccl_->Release(); !s.ok()) {
      WS_LOG(WARN, "nccl") << "release: " << s;
      result.Update(s);
    }
    nccl_.reset();
  }
  if (Status s = host_.Release(); !s.ok()) {
    WS_LOG(WARN, "tcp") << "release: " << s;
    result.Update(s);
  }
  connected_ = false;
  if (channel_) {
    if (Status s = channel_->Close(); !s.ok()) {
      WS_LOG(WARN, "tcp") << "release: connection to " << peer_ << ": " << s;
      result.Update(s);
    }
    channel_.reset();
    LedgerAdd(LedgerItem::kConnections, -1);
  }
  if (counted_) {
    counted_ = false;
    LedgerAdd(LedgerItem::kHandles, -1);
  }
  return result;
}

}  // namespace

Result<util::UniqueFd> ConnectTcp(const Endpoint& endpoint, const Deadline& deadline) {
  asio::io_context io;
  tcp::resolver resolver(io);
  asio::error_code ec;
  auto addresses = resolver.resolve(endpoint.host, std::to_string(endpoint.port),
                                    tcp::resolver::numeric_service, ec);
  if (ec) {
    return Status::NotFound("cannot resolve '", endpoint.host, "': ", ec.message());
  }
  // "No route to host" right after a link comes back (neighbour entry still failed) is
  // transient: retry within the deadline, as for a refused local connect.
  while (true) {
    tcp::socket socket(io);
    asio::error_code result = asio::error::would_block;
    asio::async_connect(socket, addresses,
                        [&](const asio::error_code& e, const tcp::endpoint&) { result = e; });
    io.restart();
    io.run_for(std::chrono::milliseconds(deadline.RemainingMs()));
    if (result == asio::error::would_block) {
      return Status::Timeout("connecting to ", endpoint.ToString(),
                             ": no answer before the deadline");
    }
    const bool transient =
        result == asio::error::host_unreachable || result == asio::error::network_unreachable;
    if (transient && !deadline.expired() && !deadline.cancelled()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    if (result) {
      if (result == asio::error::connection_refused) {
        return Status::NotFound("no publisher listens on ", endpoint.ToString(), " (",
                                result.message(), ")");
      }
      return Status::IoError("connecting to ", endpoint.ToString(), ": ", result.message());
    }
    socket.set_option(tcp::no_delay(true), ec);
    int fd = socket.release(ec);
    if (ec) return Status::IoError("connecting to ", endpoint.ToString(), ": ", ec.message());
    return util::UniqueFd(fd);
  }
}

std::unique_ptr<TransferHandle> NewTcpHandle(const Endpoint& endpoint,
                                             const SubscriberOptions& options) {
  return std::make_unique<TcpHandle>(endpoint, options);
}

}  // namespace weightsync::transport::tcp
