#include "transport/tcp/tcp_handle.h"

#include <sys/uio.h>
#include <unistd.h>

#include <asio.hpp>

#include "util/fail_point.h"
#include "util/ledger.h"
#include "util/logging.h"
#include "util/token.h"
#include "transport/host_data_path.h"
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

  std::string_view transport_name() const override { return "tcp"; }
  const plan::Plan& plan() const override { return plan_; }
  Status Prepare(const std::vector<plan::Destination>& destinations,
                 const PrepareOptions& options, const Deadline& deadline) override;
  Result<int64_t> BeginStep(std::optional<int64_t> step, int64_t after_step,
                            const Deadline& deadline) override;
  Status CopyStep(const Deadline& deadline) override;
  Result<std::span<const uint64_t>> EndStep(const Deadline& deadline) override;
  Status Verify(std::span<const uint64_t> digests, int64_t step,
                const Deadline& deadline) override {
    return host_.Verify(digests, welcome_.digest_kind, step);
  }
  Status Commit(const Deadline& deadline) override {
    host_.Commit();
    return Status::Ok();
  }
  Status Release() override;

 private:
  Status Authenticate(const std::string& token, const Deadline& deadline);

  Endpoint endpoint_;
  SubscriberOptions options_;
  std::string peer_;
  std::unique_ptr<wire::Channel> channel_;
  HostDataPath host_;  // staging, verification, commit
  bool counted_ = false;
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
  return Status::Ok();
}

Status TcpHandle::Prepare(const std::vector<plan::Destination>& destinations,
                          const PrepareOptions& options, const Deadline& deadline) {
  peer_ = "publisher " + endpoint_.ToString();
  for (const auto& d : destinations) {
    if (d.device.is_cuda()) {
      return Status::NotSupported("tcp: destination '", d.spec.name, "' is on ",
                                  DeviceString(d.device),
                                  "; the tcp transport receives into host memory only");
    }
  }
  counted_ = true;
  LedgerAdd(LedgerItem::kHandles, 1);
  WS_FAIL_POINT_RETURN("tcp.prepare");
  WS_ASSIGN_OR_RETURN(std::string token, util::LoadToken(options_.token, options_.token_file));
  WS_ASSIGN_OR_RETURN(util::UniqueFd fd, ConnectTcp(endpoint_, deadline));
  channel_ = std::make_unique<wire::Channel>(std::move(fd), peer_);
  LedgerAdd(LedgerItem::kConnections, 1);
  WS_RETURN_IF_ERROR(Authenticate(token, deadline));

  wire::Hello hello{wire::kProtocolVersion, wire::Role::kSubscriber,
                    static_cast<uint32_t>(::getpid())};
  WS_RETURN_IF_ERROR(channel_->Send(wire::FrameType::kHello, hello, deadline));
  WS_RETURN_IF_ERROR(channel_->ReceiveExpect(wire::FrameType::kWelcome, &welcome_, deadline));
  WS_RETURN_IF_ERROR(plan::ValidateLayout(welcome_).WithContext(peer_));
  if (welcome_.arena_kind == wire::ArenaKind::kCudaMem) {
    return Status::NotSupported(peer_, " keeps its arena on a GPU; the tcp transport sends from "
                                       "host memory only");
  }
  WS_ASSIGN_OR_RETURN(plan_,
                      plan::BuildPlan(welcome_, destinations, options.policy, 4ull << 20));
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
                      << (token.empty() ? "no token (loopback)" : "authenticated");
  return Status::Ok();
}

Result<int64_t> TcpHandle::BeginStep(std::optional<int64_t> step, int64_t after_step,
                                     const Deadline& deadline) {
  wire::UpdateRequest req{step.value_or(-1), after_step};
  WS_RETURN_IF_ERROR(channel_->Send(wire::FrameType::kUpdateRequest, req, deadline));
  WS_RETURN_IF_ERROR(channel_->ReceiveExpect(wire::FrameType::kStepBegin, &begin_, deadline));
  if (begin_.step == after_step) return begin_.step;
  if (begin_.step < after_step || (step && begin_.step != *step)) {
    return Status::ProtocolError(peer_, ": asked for step ",
                                 step ? std::to_string(*step) : std::string("latest"),
                                 " after ", after_step, ", publisher offered step ", begin_.step);
  }
  return begin_.step;
}

Status TcpHandle::CopyStep(const Deadline& deadline) {
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
  WS_RETURN_IF_ERROR(channel_->ReceiveExpect(wire::FrameType::kStepEnd, &end_, deadline));
  if (end_.step != begin_.step) {
    return Status::ProtocolError(peer_, ": step end for step ", end_.step, ", expected ",
                                 begin_.step);
  }
  if (end_.digests.size() != plan_.digest_count) {
    return Status::ProtocolError(peer_, ": step ", end_.step, " carries ", end_.digests.size(),
                                 " digests, the plan needs ", plan_.digest_count);
  }
  return std::span<const uint64_t>(end_.digests);
}

Status TcpHandle::Release() {
  Status result;
  if (Status s = host_.Release(); !s.ok()) {
    WS_LOG(WARN, "tcp") << "release: " << s;
    result.Update(s);
  }
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
  tcp::socket socket(io);
  asio::error_code result = asio::error::would_block;
  tcp::resolver resolver(io);
  asio::error_code ec;
  auto addresses = resolver.resolve(endpoint.host, std::to_string(endpoint.port),
                                    tcp::resolver::numeric_service, ec);
  if (ec) {
    return Status::NotFound("cannot resolve '", endpoint.host, "': ", ec.message());
  }
  asio::async_connect(socket, addresses,
                      [&](const asio::error_code& e, const tcp::endpoint&) { result = e; });
  io.run_for(std::chrono::milliseconds(deadline.RemainingMs()));
  if (result == asio::error::would_block) {
    return Status::Timeout("connecting to ", endpoint.ToString(), ": no answer before the deadline");
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

std::unique_ptr<TransferHandle> NewTcpHandle(const Endpoint& endpoint,
                                             const SubscriberOptions& options) {
  return std::make_unique<TcpHandle>(endpoint, options);
}

}  // namespace weightsync::transport::tcp
