// The publisher's half of a subscriber session, the same for every link:
//   Hello → (layout) → ... → { UpdateRequest → StepBegin → delivery → StepEnd }*
// What differs by link is only the handshake around the Welcome (a Unix socket passes the store's
// fd with it; tcp authenticates first and then takes the subscriber's Select) and how a pinned
// step's bytes reach the subscriber (StepDelivery). The subscriber's half of the same exchange
// is step_exchange.h.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "transport/link/channel.h"
#include "transport/link/version_source.h"
#include "util/deadline.h"
#include "weightsync/status.h"
#include "wire/handshake.h"
#include "wire/messages.h"

namespace weightsync::transport::link {

struct SessionConfig;
class StepDelivery;
// Makes the delivery of a tcp session once the subscriber's Select arrived: the publisher's end
// of the data path the store takes over tcp (the path table's `deliver`, transport/path_table.h;
// handed in by the server's creator, so this layer names no path). `store_fd`: the store's fd
// from the layout (an arena's, which a GPU delivery maps).
using DeliveryFactory = Result<std::unique_ptr<StepDelivery>> (*)(Channel& ch,
                                                                  const SessionConfig& config,
                                                                  const wire::Welcome& welcome,
                                                                  int store_fd,
                                                                  const wire::Select& select);

struct SessionConfig {
  std::chrono::milliseconds timeout;  // each frame; a subscriber reading a pinned step
  std::string peer;                   // for logs: "subscriber 10.0.0.7:5123"
  VersionSource* source = nullptr;
  const std::atomic<bool>* stopping = nullptr;
  DeliveryFactory deliver = nullptr;  // tcp sessions
};

// How the bytes of a pinned step reach the subscriber over this session.
class StepDelivery {
 public:
  virtual ~StepDelivery() = default;
  // Runs after StepBegin went out, with the version pinned for `request`; returns once the
  // subscriber has what it needs: over a Unix socket its CopyDone (it read the shared memory
  // itself; from a ring, bucket by bucket as each is filled: ring_bucket_ready / _done); over tcp
  // the bytes written to the connection (as deltas where the request asked and the store has
  // them: delta_begin first), or sent over NCCL. `streaming`: set while a step's bytes are on the
  // connection (an error frame sent then would land in the middle of them).
  virtual Status Deliver(const Pin& pin, const wire::UpdateRequest& request, Channel& ch,
                         const util::Deadline& deadline, bool* streaming) = 0;
  // Whether delivering is bounded by the publisher's timeout instead of the subscriber's own wait:
  // for a delivery that holds resources a stalled peer must not keep (an NCCL communicator's
  // kernels). Otherwise a slow reader keeps its pin as long as it waits, and the publisher, when
  // it needs the version's memory, revokes the pin instead (VersionSource::Unpin).
  virtual bool BoundedByPublisher() const { return false; }
  // Whether it reads the whole pinned version at once (VersionSource::AcquireWhole) rather than,
  // from a ring, bucket by bucket.
  virtual bool WholeVersion() const { return false; }
  // A frame other than update_request arrived where one was due: the error that ends the session.
  virtual Status Unexpected(wire::FrameType type);
};

// A session's place in the publisher's membership (VersionSource::Admit), from its Hello until the
// session ends.
class Membership {
 public:
  Membership() = default;
  Membership(VersionSource* source, uint64_t id) : source_(source), id_(id) {}
  Membership(Membership&& other) noexcept
      : source_(std::exchange(other.source_, nullptr)), id_(other.id_) {}
  Membership& operator=(Membership&& other) noexcept {
    if (this != &other) {
      Leave();
      source_ = std::exchange(other.source_, nullptr);
      id_ = other.id_;
    }
    return *this;
  }
  ~Membership() { Leave(); }
  uint64_t id() const { return id_; }

 private:
  void Leave() {
    if (source_ != nullptr) source_->Left(std::exchange(id_, 0));
    source_ = nullptr;
  }
  VersionSource* source_ = nullptr;
  uint64_t id_ = 0;
};

// What answering a Hello gave: the Welcome and the store's fd to send, and the session's
// membership; or, `welcome` null, nothing: the subscriber was redirected and the session is over.
struct Admitted {
  const wire::Welcome* welcome = nullptr;
  int store_fd = -1;
  Membership member;
};

// Receives the subscriber's Hello (its protocol version, how long it waits, whether it relays),
// and either redirects it to a relay (a redirect frame; Admitted::welcome null) or admits it and
// waits for the layout (the first Publish) as long as it waits.
Result<Admitted> ReceiveHello(Channel& ch, const SessionConfig& config);

// Serves steps until the subscriber leaves, breaks the protocol or the server stops. Waiting for
// a step and delivering it are bounded by the subscriber's wait (UpdateRequest::wait_ms; except a
// delivery BoundedByPublisher), so a live subscriber is never dropped because a wait of the
// publisher's own ran out; a pin the publisher revoked meanwhile ends the session with its error.
// `member`: the session's Membership id, listed as ready from here.
Status ServeSteps(Channel& ch, const SessionConfig& config, const wire::Welcome& welcome,
                  StepDelivery& delivery, bool* streaming, uint64_t member);

// Ends a session with what `s` says: logged (a departed peer quietly), and — unless the peer left
// or a step's bytes were streaming — an error frame telling the subscriber why.
void EndSession(Channel& ch, const SessionConfig& config, const Status& s, bool streaming,
                std::string_view component);

}  // namespace weightsync::transport::link
