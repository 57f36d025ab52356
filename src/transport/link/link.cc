#include "transport/link/link.h"

#include <dirent.h>
#include <sys/resource.h>

#include <cerrno>
#include <chrono>
#include <mutex>
#include <string>
#include <utility>

#include "plan/plan.h"
#include "transport/link/step_exchange.h"
#include "util/ledger.h"
#include "util/logging.h"
#include "wire/handshake.h"

namespace weightsync::transport::link {

using util::Deadline;
using util::LedgerAdd;
using util::LedgerItem;

// How long a subscriber's wait for a step's answer spins before it blocks (see Link::Connect).
constexpr std::chrono::milliseconds kReplySpin{1};

std::string_view LinkKindName(LinkKind kind) {
  switch (kind) {
    case LinkKind::kUnix:
      return "unix";
    case LinkKind::kTcp:
      return "tcp";
  }
  return "unknown";
}

Status SelectFits(size_t ranges) {
  if (ranges <= wire::kMaxSelectRanges) return Status::Ok();
  return Status::ResourceExhausted(
      "the plan reads ", ranges,
      " byte ranges of the publisher's tensors, more than one select "
      "frame carries (",
      wire::kMaxSelectRanges,
      "); row-parallel regions read one range per row: fewer, larger published tensors (or "
      "whole rows) need fewer");
}

std::unique_ptr<Link> NewLink(const Endpoint& endpoint, const SubscriberOptions& options) {
  switch (endpoint.kind) {
    case Endpoint::Kind::kLocal:
      return NewUnixLink(endpoint);
    case Endpoint::Kind::kTcp:
      return NewTcpLink(endpoint, options);
  }
  return nullptr;
}

Link::~Link() {
  if (Status s = Release(); !s.ok()) WS_LOG(WARN, "link") << "cleanup: " << s;
}

Result<const wire::Welcome*> Link::Connect(const Deadline& deadline) {
  if (connected_) return &welcome_;
  WS_ASSIGN_OR_RETURN(channel_,
                      Open(dial_bound_.count() > 0 ? deadline.Sooner(dial_bound_) : deadline));
  // Each step waits twice for the publisher's answer (StepBegin, StepEnd; a ring also for each
  // bucket's announcement), which comes once the publisher's session thread wakes (48-229 us on
  // the H200 machine): spinning through that wait spares the step this thread's own wake-up too
  // (Channel::ReceiveReply). The cost: up to 1 ms of a core per answer, on the thread waiting for
  // it (the caller's in Update; with several publishers, one pool thread each).
  channel_->set_reply_spin(kReplySpin);
  LedgerAdd(LedgerItem::kConnections, 1);
  counted_ = true;
  WS_RETURN_IF_ERROR(channel_->Send(
      wire::FrameType::kHello, SubscriberHello(deadline, serves_, avoid_, locality_), deadline));
  const bool fd_expected = kind_ == LinkKind::kUnix;
  WS_ASSIGN_OR_RETURN(wire::FrameHeader header,
                      channel_->Receive(deadline, fd_expected ? &store_fd_ : nullptr));
  if (header.type == wire::FrameType::kRedirect) {
    wire::Redirect redirect;
    WS_RETURN_IF_ERROR(wire::Decode(channel_->payload(), &redirect).WithContext(peer_));
    redirect_ = std::move(redirect.endpoint);
    return nullptr;
  }
  if (header.type != wire::FrameType::kWelcome) {
    return channel_->UnexpectedFrame(wire::FrameType::kWelcome, header);
  }
  WS_RETURN_IF_ERROR(wire::Decode(channel_->payload(), &welcome_).WithContext(peer_));
  // A zero-copy publisher's memory travels as CUDA IPC handles in the Welcome instead.
  if (fd_expected && !store_fd_.valid() && welcome_.arena_kind != wire::ArenaKind::kCudaIpc) {
    return Status::ProtocolError(peer_, ": welcome frame carried no arena fd");
  }
  WS_RETURN_IF_ERROR(plan::ValidateLayout(welcome_).WithContext(peer_));
  if (fd_expected) WS_RETURN_IF_ERROR(ReceiveAllocationFds(deadline));
  connected_ = true;
  return &welcome_;
}

namespace {

// Fds open in this process now (/proc/self/fd, less the directory's own); `full` when it cannot
// be read (most likely: no fd left to read it with).
uint64_t OpenFds(uint64_t full) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return full;
  uint64_t n = 0;
  while (const dirent* e = ::readdir(dir)) n += e->d_name[0] != '.';
  ::closedir(dir);
  return n > 0 ? n - 1 : 0;
}

// Fds promised to FdRoom holders and not yet released: links (and sessions) making room at the
// same time count each other's.
std::mutex& FdRoomMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
uint64_t& PendingFds() {
  static uint64_t pending = 0;
  return pending;
}

}  // namespace

Result<FdRoom> FdRoom::Make(uint64_t count) {
  FdRoom room;
  if (count == 0) return room;
  std::lock_guard<std::mutex> lock(FdRoomMutex());
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return Status::FromErrno(errno, "getrlimit(NOFILE)");
  constexpr uint64_t kSpare = 64;  // for what the process opens meanwhile
  const uint64_t soft = r.rlim_cur == RLIM_INFINITY ? ~uint64_t{0} : r.rlim_cur;
  const uint64_t need = OpenFds(soft) + PendingFds() + count + kSpare;
  if (soft < need) {
    if (r.rlim_max != RLIM_INFINITY && r.rlim_max < need) {
      return Status::ResourceExhausted(
          "the publisher's cuMem memory travels as ", count, " fds (one per chunk), which needs ",
          need, " open files but RLIMIT_NOFILE's hard limit is ", r.rlim_max,
          " (an administrator raises it: limits.conf, systemd LimitNOFILE=, docker --ulimit "
          "nofile=; or publish without zero_copy)");
    }
    // Only ever raised: another holder's room stays.
    const rlimit raised{need, r.rlim_max};
    if (::setrlimit(RLIMIT_NOFILE, &raised) != 0) {
      return Status::FromErrno(errno, "setrlimit(NOFILE) to " + std::to_string(need));
    }
    WS_LOG(INFO, "link") << "raised this process's open-file limit from " << soft << " to " << need
                         << " for " << count << " cuMem chunk fds";
  }
  PendingFds() += count;
  room.count_ = count;
  return room;
}

FdRoom& FdRoom::operator=(FdRoom&& o) noexcept {
  if (this != &o) {
    Release();
    count_ = std::exchange(o.count_, 0);
  }
  return *this;
}

void FdRoom::Release() {
  if (count_ == 0) return;
  std::lock_guard<std::mutex> lock(FdRoomMutex());
  PendingFds() -= std::exchange(count_, 0);
}

Status Link::ReceiveAllocationFds(const Deadline& deadline) {
  const uint32_t count = plan::AllocationFdCount(welcome_);
  // Every chunk's fd is held until the path imports them all.
  Result<FdRoom> room = FdRoom::Make(count);
  if (!room.ok()) return room.status().WithContext(peer_);
  allocation_fds_.clear();
  allocation_fds_.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    wire::AllocationFd frame;
    util::UniqueFd fd;
    WS_RETURN_IF_ERROR(
        channel_->ReceiveExpect(wire::FrameType::kAllocationFd, &frame, deadline, &fd));
    if (frame.index != i) {
      return Status::ProtocolError(peer_, ": allocation fd frame ", frame.index, " where chunk ", i,
                                   " of ", count, " was due");
    }
    if (!fd.valid()) {
      // (An fd this process had no room for is reported by the channel, as truncated control
      // data naming the open-file limit.)
      return Status::ProtocolError(peer_, ": allocation fd frame ", i, " of ", count,
                                   " carried no fd (the publisher attached none)");
    }
    allocation_fds_.push_back(std::move(fd));
  }
  return Status::Ok();
}

Status Link::Select(const plan::Plan& /*plan*/, const Deadline& /*deadline*/) {
  return Status::Ok();
}

Result<int64_t> Link::BeginStep(std::optional<int64_t> step, int64_t after_step,
                                const Deadline& deadline, bool delta) {
  return RequestStep(*channel_, peer_, step, after_step, &begin_, deadline, delta, below_);
}

Result<std::span<const uint64_t>> Link::EndStep(uint32_t digest_count, const Deadline& deadline) {
  if (confirms_copy()) {
    WS_RETURN_IF_ERROR(
        channel_->Send(wire::FrameType::kCopyDone, wire::CopyDone{begin_.step}, deadline));
  }
  return ReceiveStepEnd(*channel_, peer_, begin_.step, digest_count, &end_, deadline);
}

Status Link::Report(const wire::MembersReport& report, const Deadline& deadline) {
  if (!channel_) return Status::FailedPrecondition(peer_, ": not connected");
  return channel_->Send(wire::FrameType::kMembersReport, report, deadline);
}

Status Link::PublisherReason(const Status& seen) {
  if (seen.code() != StatusCode::kPeerLost || !channel_) return seen;
  Result<wire::FrameHeader> h = channel_->Receive(Deadline(std::chrono::milliseconds(100)));
  if (!h.ok() || h->type != wire::FrameType::kError) return seen;
  wire::ErrorMessage err;
  if (!wire::Decode(channel_->payload(), &err).ok()) return seen;
  Status reason = wire::ToStatus(err).WithContext(peer_);
  return Status(reason.code(), reason.message() + " (" + seen.message() + ")");
}

Status Link::Release() {
  Status result;
  if (Status s = store_fd_.Close(); !s.ok()) {  // connected but never prepared
    WS_LOG(WARN, "link") << "release: store fd of " << peer_ << ": " << s;
    result.Update(s);
  }
  for (util::UniqueFd& fd : allocation_fds_) {
    if (Status s = fd.Close(); !s.ok()) {
      WS_LOG(WARN, "link") << "release: allocation fd of " << peer_ << ": " << s;
      result.Update(s);
    }
  }
  allocation_fds_.clear();
  connected_ = false;
  if (channel_) {
    if (Status s = channel_->Close(); !s.ok()) {
      WS_LOG(WARN, "link") << "release: connection to " << peer_ << ": " << s;
      result.Update(s);
    }
    channel_.reset();
  }
  if (counted_) {
    counted_ = false;
    LedgerAdd(LedgerItem::kConnections, -1);
  }
  return result;
}

}  // namespace weightsync::transport::link
