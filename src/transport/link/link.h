// Link: the subscriber's end of the control connection to one publisher — connecting (and, over
// tcp, mutual authentication), Hello → Welcome, and the step exchange (step_exchange.h). What a
// link carries besides frames: over a Unix socket the store's fd arrives with the Welcome (the
// data paths then map or import it); over tcp the bytes of a step follow on the connection itself
// (or over NCCL, set up on it), so the subscriber first tells the publisher which tensors to send.
//
// Lifecycle: NewLink() is cheap; Connect() does the work; Release() closes everything. A failed
// call leaves the link unusable; its owner releases it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "plan/plan.h"
#include "transport/link/channel.h"
#include "transport/link/endpoint.h"
#include "util/deadline.h"
#include "util/unique_fd.h"
#include "weightsync/options.h"
#include "weightsync/status.h"
#include "wire/members_report.h"
#include "wire/messages.h"

namespace weightsync::transport::link {

enum class LinkKind : uint8_t {
  kUnix,  // same host: peer uid checked, the store's fd passed with the Welcome
  kTcp,   // any host: HMAC handshake; the bytes come on the connection (or over NCCL)
};
std::string_view LinkKindName(LinkKind kind);  // "unix", "tcp"

class Link {
 public:
  virtual ~Link();
  LinkKind kind() const { return kind_; }
  const std::string& peer() const { return peer_; }  // "publisher local://m", for errors

  // Connects (authenticating over tcp), says Hello and receives the Welcome, validated
  // (plan::ValidateLayout). Returns it, valid until Release(); a second call returns it again.
  // A publisher that answers with a redirect instead (PublisherOptions::max_direct): returns null,
  // and redirect() names the relay to dial; the link is then done.
  Result<const wire::Welcome*> Connect(const util::Deadline& deadline);
  const std::string& redirect() const { return redirect_; }
  // Topology (docs/relays.md): what the Hello says — the endpoint this subscriber serves as a
  // relay, the relay it just lost, where it runs — and, in each request, how many subscribers it
  // serves.
  void set_hello(std::string serves, std::string avoid, std::string locality) {
    serves_ = std::move(serves);
    avoid_ = std::move(avoid);
    locality_ = std::move(locality);
  }
  void set_below(uint32_t below) { below_ = below; }
  // Bounds reaching the peer (not the handshake after): a relay we were redirected to is up and
  // accepting, or is given up on within this, not at the end of the update's deadline.
  void set_dial_bound(std::chrono::milliseconds bound) { dial_bound_ = bound; }
  const wire::Welcome& welcome() const { return welcome_; }
  // The fd of the publisher's store that came with the Welcome (Unix links); invalid otherwise.
  util::UniqueFd TakeStoreFd() { return std::move(store_fd_); }
  // A zero-copy publisher's cuMem chunks (Unix links): the fds that followed the Welcome, one per
  // chunk in Welcome order (plan::AllocationFdCount); empty otherwise.
  std::vector<util::UniqueFd> TakeAllocationFds() { return std::move(allocation_fds_); }
  // Tells the publisher which of its tensors the plan reads: a tcp publisher streams exactly
  // those every step. Nothing to do over a Unix socket (the subscriber reads the store itself).
  virtual Status Select(const plan::Plan& plan, const util::Deadline& deadline);

  // The step exchange. BeginStep asks for `step` (nullopt: latest) newer than `after_step` and
  // returns the step offered (== after_step: up to date, nothing pinned); EndStep tells a Unix
  // publisher the copy is done (CopyDone) and receives the step's digests (StepEnd), which must
  // be `digest_count` of them; they stay valid until the next BeginStep. `delta`: ask for the
  // step as a delta against `after_step` (tcp; the path reads the DeltaBegin).
  Result<int64_t> BeginStep(std::optional<int64_t> step, int64_t after_step,
                            const util::Deadline& deadline, bool delta = false);
  const wire::StepBegin& begin() const { return begin_; }
  Result<std::span<const uint64_t>> EndStep(uint32_t digest_count, const util::Deadline& deadline);
  // Between steps only (the publisher reads it where it waits for the next request): the step
  // committed and, a relay, its subtree. FailedPrecondition when not connected.
  Status Report(const wire::MembersReport& report, const util::Deadline& deadline);

  Channel& channel() { return *channel_; }
  // ", authenticated" and the like, for the handle's prepare log line.
  virtual std::string Describe() const { return ""; }
  // After a failed wait that saw the connection close: the publisher's Error frame, if it sent
  // one before closing, says more than "closed".
  Status PublisherReason(const Status& seen);
  Status Release();

 protected:
  Link(LinkKind kind, std::string peer) : kind_(kind), peer_(std::move(peer)) {}
  // Connects and authenticates: the channel ready for Hello.
  virtual Result<std::unique_ptr<Channel>> Open(const util::Deadline& deadline) = 0;
  // Whether the publisher waits for CopyDone before StepEnd (the subscriber reads its store).
  virtual bool confirms_copy() const = 0;

 private:
  // The AllocationFd frames that follow a Welcome with cuMem chunks, in order.
  Status ReceiveAllocationFds(const util::Deadline& deadline);

  LinkKind kind_;
  std::string peer_;
  std::unique_ptr<Channel> channel_;
  bool connected_ = false;
  bool counted_ = false;  // ledger "handles"
  wire::Welcome welcome_;
  util::UniqueFd store_fd_;
  std::vector<util::UniqueFd> allocation_fds_;
  wire::StepBegin begin_;
  wire::StepEnd end_;
  std::string serves_;
  std::string avoid_;
  std::string locality_;
  std::string redirect_;
  uint32_t below_ = 0;
  std::chrono::milliseconds dial_bound_{0};  // 0: none
};

// Room in this process's fd table for `count` more fds while it lives: a zero-copy publisher's
// cuMem chunks all arrive at a subscriber before any is imported, and a publisher's fds in flight
// count against its own limit (sendmsg fails with ETOOMANYREFS past it). Make raises the soft
// RLIMIT_NOFILE (never lowers it) to the fds open now, plus those promised to other live rooms,
// plus `count` and a spare; ResourceExhausted saying so when the hard limit is lower.
class FdRoom {
 public:
  FdRoom() = default;
  static Result<FdRoom> Make(uint64_t count);
  FdRoom(FdRoom&& o) noexcept { *this = std::move(o); }
  FdRoom& operator=(FdRoom&& o) noexcept;
  ~FdRoom() { Release(); }
  void Release();  // the promised fds are no longer this room's

 private:
  uint64_t count_ = 0;
};

// Ok if a plan reading `ranges` byte ranges of a tcp publisher's tensors fits one select frame;
// ResourceExhausted saying why not (row-parallel regions read one range per row).
Status SelectFits(size_t ranges);

// The link serving `endpoint`: a Unix socket for local://, tcp for tcp://.
std::unique_ptr<Link> NewLink(const Endpoint& endpoint, const SubscriberOptions& options);
// The two links (unix_link.cc, tcp_link.cc).
std::unique_ptr<Link> NewUnixLink(const Endpoint& endpoint);
std::unique_ptr<Link> NewTcpLink(const Endpoint& endpoint, const SubscriberOptions& options);

// Connects a stream Unix socket to `path` within the deadline and checks that the peer runs as
// this user (SO_PEERCRED). Shared with the server (is anyone listening?) and tests of raw clients.
Result<util::UniqueFd> ConnectUnix(const std::string& path, const util::Deadline& deadline);
// Resolves and connects within the deadline (asio), returning the connected socket's fd with
// TCP_NODELAY set. Shared with tests that play a raw client.
Result<util::UniqueFd> ConnectTcp(const Endpoint& endpoint, const util::Deadline& deadline);

}  // namespace weightsync::transport::link
