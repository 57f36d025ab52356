#include "transport/link/channel.h"

#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "util/fail_point.h"

namespace weightsync::transport::link {

Channel::Channel(util::UniqueFd fd, std::string peer, uint32_t max_payload)
    : fd_(std::move(fd)), peer_(std::move(peer)) {
  set_max_payload(max_payload);
}

void Channel::set_max_payload(uint32_t max_payload) {
  // The header's length field is checked against the format's cap too; keeping ours within it
  // keeps the send-side check meaningful.
  max_payload_ = std::min(max_payload, wire::kMaxPayloadBytes);
}

namespace {

// Waits until fd is ready for `events`, polling without sleeping for the first `spin`; Timeout
// when the deadline passes, Cancelled when the caller cancels.
Status WaitReady(int fd, short events, const util::Deadline& deadline, const std::string& peer,
                 const char* what, std::chrono::nanoseconds spin = std::chrono::nanoseconds(0)) {
  if (spin.count() > 0) {
    const auto spin_until = std::chrono::steady_clock::now() + spin;
    do {
      // What is there is read even past the deadline, as by the blocking wait below.
      pollfd p{fd, events, 0};
      int r = ::poll(&p, 1, 0);
      if (r > 0) return Status::Ok();
      if (r < 0 && errno != EINTR) return Status::FromErrno(errno, peer + ": poll");
      if (deadline.cancelled()) return Status::Cancelled(peer, ": cancelled while ", what);
      if (deadline.expired()) {
        return Status::Timeout(peer, ": no progress ", what, " before the deadline");
      }
    } while (std::chrono::steady_clock::now() < spin_until);
  }
  while (true) {
    if (deadline.cancelled()) return Status::Cancelled(peer, ": cancelled while ", what);
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, deadline.SliceMs());
    if (r > 0) return Status::Ok();
    if (r == 0) {
      if (deadline.expired()) {
        return Status::Timeout(peer, ": no progress ", what, " before the deadline");
      }
      continue;  // a slice ended: look at the cancel flag again
    }
    if (errno != EINTR) return Status::FromErrno(errno, peer + ": poll");
  }
}

}  // namespace

Status Channel::SendPayload(wire::FrameType type, std::span<const uint8_t> payload,
                            const util::Deadline& deadline, int pass_fd) {
  if (!fd_.valid()) return Status::FailedPrecondition(peer_, ": channel closed");
  if (payload.size() > max_payload_) {
    // Refuse here: the peer would refuse it anyway, and the 32-bit length would wrap.
    return Status::ResourceExhausted(wire::FrameTypeName(type), " frame of ", payload.size(),
                                     " bytes exceeds the ", max_payload_, "-byte frame limit");
  }
  uint8_t header[wire::kHeaderBytes];
  wire::EncodeHeader(type, payload, std::span<uint8_t, wire::kHeaderBytes>(header));
  iovec iov[2] = {{header, wire::kHeaderBytes},
                  {const_cast<uint8_t*>(payload.data()), payload.size()}};
  size_t total = wire::kHeaderBytes + payload.size();
  size_t sent = 0;
  bool fd_pending = pass_fd >= 0;
  while (sent < total) {
    WS_RETURN_IF_ERROR(WaitReady(fd_.get(), POLLOUT, deadline, peer_, "sending"));
    // Build the iovec for what is left.
    iovec left[2];
    int n = 0;
    size_t skip = sent;
    for (auto& v : iov) {
      if (skip >= v.iov_len) {
        skip -= v.iov_len;
        continue;
      }
      left[n++] = {static_cast<uint8_t*>(v.iov_base) + skip, v.iov_len - skip};
      skip = 0;
    }
    msghdr msg{};
    msg.msg_iov = left;
    msg.msg_iovlen = n;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    if (fd_pending) {
      std::memset(control, 0, sizeof(control));
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    ssize_t r = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      if (errno == EPIPE || errno == ECONNRESET) {
        return Status::PeerLost(peer_, ": connection closed while sending ",
                                wire::FrameTypeName(type));
      }
      if (errno == ETOOMANYREFS) {
        return Status::ResourceExhausted(
            peer_, ": sendmsg ", wire::FrameTypeName(type),
            ": too many fds in flight for this process's open-file limit (RLIMIT_NOFILE)");
      }
      return Status::FromErrno(errno,
                               peer_ + ": sendmsg " + std::string(wire::FrameTypeName(type)));
    }
    fd_pending = false;
    sent += static_cast<size_t>(r);
  }
  return Status::Ok();
}

Status Channel::ReadExact(uint8_t* dst, size_t n, const util::Deadline& deadline,
                          util::UniqueFd* received_fd, bool first) {
  size_t got = 0;
  while (got < n) {
    WS_RETURN_IF_ERROR(WaitReady(fd_.get(), POLLIN, deadline, peer_, "receiving",
                                 in_reply_ ? reply_spin_ : std::chrono::nanoseconds(0)));
    iovec iov{dst + got, n - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t r = ::recvmsg(fd_.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      if (errno == ECONNRESET) return Status::PeerLost(peer_, ": connection reset");
      return Status::FromErrno(errno, peer_ + ": recvmsg");
    }
    // Any fds that arrived are owned right away, so none leaks on an error path.
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        util::UniqueFd owned(fd);
        if (received_fd != nullptr && !received_fd->valid()) *received_fd = std::move(owned);
      }
    }
    if (msg.msg_flags & MSG_CTRUNC) {
      // The kernel also truncates when it cannot install a passed fd here: say both.
      rlimit limit{};
      ::getrlimit(RLIMIT_NOFILE, &limit);
      return Status::ProtocolError(
          peer_,
          ": control data truncated, a passed fd was dropped (too many fds passed, or this "
          "process is out of open files: RLIMIT_NOFILE ",
          static_cast<uint64_t>(limit.rlim_cur), " soft, ", static_cast<uint64_t>(limit.rlim_max),
          " hard)");
    }
    if (r == 0) {
      if (first && got == 0) return Status::PeerLost(peer_, ": connection closed");
      return Status::PeerLost(peer_, ": connection closed mid-frame (", got, " of ", n, " bytes)");
    }
    got += static_cast<size_t>(r);
  }
  return Status::Ok();
}

Result<wire::FrameHeader> Channel::Receive(const util::Deadline& deadline,
                                           util::UniqueFd* received_fd) {
  if (!fd_.valid()) return Status::FailedPrecondition(peer_, ": channel closed");
  uint8_t header_bytes[wire::kHeaderBytes];
  util::UniqueFd fd_in;
  WS_RETURN_IF_ERROR(ReadExact(header_bytes, wire::kHeaderBytes, deadline, &fd_in, true));
  Result<wire::FrameHeader> header =
      wire::DecodeHeader(std::span<const uint8_t, wire::kHeaderBytes>(header_bytes), max_payload_);
  if (!header.ok()) return header.status().WithContext(peer_);
  // Grows once to the largest frame seen; reused afterwards.
  if (recv_buffer_.size() < header->length) recv_buffer_.resize(header->length);
  WS_RETURN_IF_ERROR(ReadExact(recv_buffer_.data(), header->length, deadline, &fd_in, false));
  payload_size_ = header->length;
  WS_RETURN_IF_ERROR(wire::VerifyPayload(*header, payload()).WithContext(peer_));
  if (received_fd != nullptr) *received_fd = std::move(fd_in);
  return header;
}

Status Channel::UnexpectedFrame(wire::FrameType expected, const wire::FrameHeader& got) {
  if (got.type == wire::FrameType::kError) {
    wire::ErrorMessage err;
    Status s = Decode(payload(), &err);
    if (!s.ok()) return s.WithContext(peer_ + ": undecodable error frame");
    return wire::ToStatus(err).WithContext(peer_);
  }
  return Status::ProtocolError(peer_, ": expected ", wire::FrameTypeName(expected), " frame, got ",
                               wire::FrameTypeName(got.type));
}

namespace {

// Fills `out` with up to kBatch iovecs starting `done` bytes into `parts`, skipping what is done.
constexpr int kBatch = 64;
int NextBatch(std::span<const iovec> parts, size_t* index, size_t* offset, iovec* out) {
  int n = 0;
  size_t i = *index, off = *offset;
  while (i < parts.size() && n < kBatch) {
    if (off >= parts[i].iov_len) {
      ++i;
      off = 0;
      continue;
    }
    out[n++] = {static_cast<uint8_t*>(parts[i].iov_base) + off, parts[i].iov_len - off};
    ++i;
    off = 0;
  }
  return n;
}

void Advance(std::span<const iovec> parts, size_t* index, size_t* offset, size_t bytes) {
  while (bytes > 0 && *index < parts.size()) {
    size_t left = parts[*index].iov_len - *offset;
    if (bytes < left) {
      *offset += bytes;
      return;
    }
    bytes -= left;
    ++*index;
    *offset = 0;
  }
  while (*index < parts.size() && parts[*index].iov_len == 0) ++*index;
}

}  // namespace

Status Channel::WriteAll(std::span<const iovec> parts, const util::Deadline& deadline) {
  size_t index = 0, offset = 0;
  Advance(parts, &index, &offset, 0);
  iovec batch[kBatch];
  while (index < parts.size()) {
    WS_RETURN_IF_ERROR(WaitReady(fd_.get(), POLLOUT, deadline, peer_, "sending data"));
    int n = NextBatch(parts, &index, &offset, batch);
    msghdr msg{};
    msg.msg_iov = batch;
    msg.msg_iovlen = n;
    ssize_t r = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      if (errno == EPIPE || errno == ECONNRESET) {
        return Status::PeerLost(peer_, ": connection closed while sending data");
      }
      return Status::FromErrno(errno, peer_ + ": sending data");
    }
    Advance(parts, &index, &offset, static_cast<size_t>(r));
  }
  return Status::Ok();
}

Status Channel::ReadAll(std::span<const iovec> parts, const util::Deadline& deadline,
                        ReadObserver* observer) {
  size_t index = 0, offset = 0;
  Advance(parts, &index, &offset, 0);
  iovec batch[kBatch];
  while (index < parts.size()) {
    int n = NextBatch(parts, &index, &offset, batch);
    msghdr msg{};
    msg.msg_iov = batch;
    msg.msg_iovlen = n;
    // Try first, poll only when the socket is drained: at high rates most reads find data.
    ssize_t r = ::recvmsg(fd_.get(), &msg, MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        WS_RETURN_IF_ERROR(WaitReady(fd_.get(), POLLIN, deadline, peer_, "receiving data"));
        continue;
      }
      if (errno == EINTR) continue;
      if (errno == ECONNRESET) return Status::PeerLost(peer_, ": connection reset mid-data");
      return Status::FromErrno(errno, peer_ + ": receiving data");
    }
    if (r == 0) return Status::PeerLost(peer_, ": connection closed mid-data");
    Advance(parts, &index, &offset, static_cast<size_t>(r));
    if (observer != nullptr) observer->Read(index, offset);
    if (deadline.expired() && index < parts.size()) {
      return Status::Timeout(peer_, ": data did not arrive before the deadline");
    }
  }
  return Status::Ok();
}

bool Channel::PeerHungUpOrSpoke() const {
  pollfd p{fd_.get(), POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

}  // namespace weightsync::transport::link
