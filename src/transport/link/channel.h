// Channel: framed control messages over a connected stream socket, every call bounded by a
// deadline. Distinguishes a peer that closed (PeerLost) from one that stayed silent (Timeout) and
// from one that sent garbage (ProtocolError / Corruption). Optionally passes one fd per frame
// (SCM_RIGHTS, Unix sockets only). Buffers are reused: steady-state frames do not allocate.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "util/deadline.h"
#include "util/unique_fd.h"
#include "weightsync/status.h"
#include "wire/frame.h"

namespace weightsync::transport::link {

// Told how far a Channel::ReadAll got, after each read: parts [0, part) are whole and the first
// `offset` bytes of `part` are in (part == the number of parts at the end). Cut-through relays
// forward what landed (transport/path/data_path.h's LandingObserver).
class ReadObserver {
 public:
  virtual void Read(size_t part, size_t offset) = 0;

 protected:
  ~ReadObserver() = default;
};

class Channel {
 public:
  // `peer` names the other side in error messages ("publisher local://m"). `max_payload` is the
  // largest payload sent or accepted; see set_max_payload().
  Channel(util::UniqueFd fd, std::string peer, uint32_t max_payload = wire::kMaxPayloadBytes);

  // Lowers or raises the payload cap (never above kMaxPayloadBytes) for the frames that follow.
  // A received header claiming more is refused (ProtocolError naming the frame type, the length
  // and the cap) before any of its payload is read or buffer allocated for it. A channel whose
  // peer is not authenticated yet is created with kMaxHandshakePayloadBytes (wire/handshake.h)
  // and raised to kMaxPayloadBytes at the one point where the peer has proven itself: a state of
  // the channel rather than an argument of each receive, so no handshake receive can forget it.
  void set_max_payload(uint32_t max_payload);
  uint32_t max_payload() const { return max_payload_; }

  // Encodes `message` (a struct from messages.h) and sends it.
  template <typename Message>
  Status Send(wire::FrameType type, const Message& message, const util::Deadline& deadline,
              int pass_fd = -1) {
    send_buffer_.clear();
    Encode(message, &send_buffer_);
    return SendPayload(type, send_buffer_, deadline, pass_fd);
  }
  Status SendPayload(wire::FrameType type, std::span<const uint8_t> payload,
                     const util::Deadline& deadline, int pass_fd = -1);

  // Receives one frame; its payload stays valid until the next Receive. If the frame carried an
  // fd and `received_fd` is non-null, it is stored there (otherwise closed).
  Result<wire::FrameHeader> Receive(const util::Deadline& deadline,
                                    util::UniqueFd* received_fd = nullptr);
  std::span<const uint8_t> payload() const { return {recv_buffer_.data(), payload_size_}; }
  // The error for a frame `got` where `expected` was due: the peer's own, if it sent an Error.
  Status UnexpectedFrame(wire::FrameType expected, const wire::FrameHeader& got);

  // Receives a frame that must be of `type` and decodes it into `message`. A kError frame from
  // the peer is returned as its Status.
  template <typename Message>
  Status ReceiveExpect(wire::FrameType type, Message* message, const util::Deadline& deadline,
                       util::UniqueFd* received_fd = nullptr);

  // Bulk bytes outside frames (the TCP data path): sends / fills `parts` in order, scatter-gather,
  // bounded by the deadline. No allocation.
  Status WriteAll(std::span<const iovec> parts, const util::Deadline& deadline);
  Status ReadAll(std::span<const iovec> parts, const util::Deadline& deadline,
                 ReadObserver* observer = nullptr);

  // ReceiveExpect for an answer due within microseconds (a step's StepBegin, StepEnd, a ring
  // bucket's announcement): if nothing is there yet it polls without sleeping for up to the
  // channel's reply spin before it blocks, so the answer is read without this thread's wake-up
  // from a blocking poll (13-153 us on the H200 machine, twice per step). The deadline and a
  // cancel bound the spin as they bound the wait. Every other receive blocks at once.
  template <typename Message>
  Status ReceiveReply(wire::FrameType type, Message* message, const util::Deadline& deadline);
  // The reply spin; zero (the default, and the publisher's: its sessions wait for requests that
  // may be minutes away) never spins.
  void set_reply_spin(std::chrono::nanoseconds spin) { reply_spin_ = spin; }

  // True if the peer has closed or sent data (non-blocking check).
  bool PeerHungUpOrSpoke() const;

  int fd() const { return fd_.get(); }
  const std::string& peer() const { return peer_; }
  Status Close() { return fd_.Close(); }

 private:
  Status ReadExact(uint8_t* dst, size_t n, const util::Deadline& deadline,
                   util::UniqueFd* received_fd, bool first);

  util::UniqueFd fd_;
  std::string peer_;
  uint32_t max_payload_;
  std::vector<uint8_t> send_buffer_;
  std::vector<uint8_t> recv_buffer_;
  size_t payload_size_ = 0;
  std::chrono::nanoseconds reply_spin_{0};
  bool in_reply_ = false;  // inside ReceiveReply: ReadExact spins for reply_spin_
};

}  // namespace weightsync::transport::link

#include "wire/messages.h"

namespace weightsync::transport::link {

template <typename Message>
Status Channel::ReceiveExpect(wire::FrameType type, Message* message,
                              const util::Deadline& deadline, util::UniqueFd* received_fd) {
  WS_ASSIGN_OR_RETURN(wire::FrameHeader header, Receive(deadline, received_fd));
  if (header.type != type) return UnexpectedFrame(type, header);
  Status s = Decode(payload(), message);
  if (!s.ok()) return s.WithContext(peer_);
  return Status::Ok();
}

template <typename Message>
Status Channel::ReceiveReply(wire::FrameType type, Message* message,
                             const util::Deadline& deadline) {
  in_reply_ = true;
  Status s = ReceiveExpect(type, message, deadline);
  in_reply_ = false;
  return s;
}

}  // namespace weightsync::transport::link
