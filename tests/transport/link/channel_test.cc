// The channel's payload cap: lowered while the peer is unauthenticated, a header claiming more is
// refused from the header alone; raised afterwards, full-size frames pass. And the handshake bound
// itself: computed from the encodings of the frames a peer may send before it is authenticated.
#include "transport/link/channel.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "testing/test_util.h"
#include "wire/handshake.h"
#include "wire/messages.h"

namespace weightsync::transport::link {
namespace {

using util::Deadline;
using namespace wire;

std::vector<uint8_t> FrameBytes(FrameType type, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out(kHeaderBytes);
  EncodeHeader(type, payload, std::span<uint8_t, kHeaderBytes>(out.data(), kHeaderBytes));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

// A channel on one end of a socket pair, the raw other end for the test to write.
struct Pair {
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    channel = std::make_unique<Channel>(util::UniqueFd(fds[0]), "peer", kMaxHandshakePayloadBytes);
    raw = util::UniqueFd(fds[1]);
  }
  void Write(const std::vector<uint8_t>& bytes) {
    ASSERT_EQ(::send(raw.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  std::unique_ptr<Channel> channel;
  util::UniqueFd raw;
};

TEST(WireHandshakeBound, SizesMatchTheEncodings) {
  std::vector<uint8_t> out;
  Encode(Hello{kProtocolVersion, Role::kSubscriber, 1, 2, std::string(kMaxEndpointBytes, 's'),
               std::string(kMaxEndpointBytes, 'a'), std::string(kMaxLocalityBytes, 'l')},
         &out);
  EXPECT_EQ(out.size(), kMaxHelloBytes);
  out.clear();
  Encode(Redirect{std::string(kMaxEndpointBytes, 'r')}, &out);
  EXPECT_EQ(out.size(), kMaxRedirectBytes);
  out.clear();
  Encode(Challenge{kProtocolVersion, 1, Nonce{}, true}, &out);
  EXPECT_EQ(out.size(), kChallengeBytes);
  out.clear();
  Encode(Auth{Role::kSubscriber, Nonce{}, Mac{}}, &out);
  EXPECT_EQ(out.size(), kAuthBytes);
  out.clear();
  Encode(AuthOk{Mac{}}, &out);
  EXPECT_EQ(out.size(), kAuthOkBytes);
  out.clear();
  Encode(ErrorMessage{StatusCode::kInternal, std::string(kMaxErrorMessageBytes + 100, 'e')}, &out);
  EXPECT_EQ(out.size(), kMaxErrorBytes);
  // The largest of them, and no larger: 4 KiB instead of 64 MiB for a stranger's header.
  EXPECT_EQ(kMaxHandshakePayloadBytes, kMaxErrorBytes);
  EXPECT_EQ(kMaxHandshakePayloadBytes, 4099u);
}

TEST(WireChannelCap, HeaderClaimingMoreThanTheCapIsRefusedWithoutItsPayload) {
  Pair p;
  // A welcome may be large, so only the channel's cap refuses this one.
  std::vector<uint8_t> header = FrameBytes(FrameType::kWelcome, {});
  const uint32_t claimed = kMaxHandshakePayloadBytes + 1;
  for (int i = 0; i < 4; ++i) header[8 + i] = static_cast<uint8_t>(claimed >> (8 * i));
  p.Write(header);  // the payload never follows
  const auto t0 = std::chrono::steady_clock::now();
  auto r = p.channel->Receive(Deadline(std::chrono::seconds(5)));
  ASSERT_STATUS_IS(kProtocolError, r,
                   "peer: frame header (welcome): payload length 4100 exceeds limit 4099");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
}

TEST(WireChannelCap, RaisedCapAcceptsFullFrames) {
  Pair p;
  std::vector<uint8_t> at_cap(kMaxHandshakePayloadBytes, 0x5A);
  p.Write(FrameBytes(FrameType::kError, at_cap));
  auto r = p.channel->Receive(Deadline(std::chrono::seconds(5)));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->length, kMaxHandshakePayloadBytes);

  p.channel->set_max_payload(kMaxPayloadBytes);
  EXPECT_EQ(p.channel->max_payload(), kMaxPayloadBytes);
  std::vector<uint8_t> big(64 << 10, 0xA5);
  p.Write(FrameBytes(FrameType::kWelcome, big));
  r = p.channel->Receive(Deadline(std::chrono::seconds(5)));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->length, big.size());
}

TEST(WireChannelCap, CapAppliesToSendingAndNeverExceedsTheFormat) {
  Pair p;
  std::vector<uint8_t> over(kMaxHandshakePayloadBytes + 1, 0);
  ASSERT_STATUS_IS(kResourceExhausted, p.channel->SendPayload(FrameType::kWelcome, over,
                                                              Deadline(std::chrono::seconds(1))));
  p.channel->set_max_payload(0xFFFFFFFFu);
  EXPECT_EQ(p.channel->max_payload(), kMaxPayloadBytes);
  Channel wide(util::UniqueFd(), "nobody", 0xFFFFFFFFu);
  EXPECT_EQ(wide.max_payload(), kMaxPayloadBytes);
}

// An fd the kernel cannot install (this process is out of open files) is dropped with the frame
// still delivered: the error says that may be why (in a child: the limit is lowered there).
[[noreturn]] void ReceiveAnFdWithNoRoomForIt() {
  Pair pair;
  util::UniqueFd passed(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  const std::vector<uint8_t> frame = FrameBytes(FrameType::kCopyDone, {});
  iovec iov{const_cast<uint8_t*>(frame.data()), frame.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  const int fd = passed.get();
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  if (::sendmsg(pair.raw.get(), &msg, 0) != static_cast<ssize_t>(frame.size())) std::_Exit(2);
  // No free slot: the limit just above the fds open now, and every number below it taken.
  const int next = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const rlimit none{static_cast<rlim_t>(next + 1), static_cast<rlim_t>(next + 1)};
  if (next < 0 || ::setrlimit(RLIMIT_NOFILE, &none) != 0) std::_Exit(3);
  while (::open("/dev/null", O_RDONLY | O_CLOEXEC) >= 0) {  // any lower numbers still free
  }
  util::UniqueFd received;
  Result<FrameHeader> h =
      pair.channel->Receive(Deadline(std::chrono::milliseconds(1000)), &received);
  const bool named =
      !h.ok() && h.status().code() == StatusCode::kProtocolError &&
      h.status().message().find("out of open files: RLIMIT_NOFILE") != std::string::npos;
  if (!named) std::fprintf(stderr, "got: %s\n", h.ok() ? "ok" : h.status().ToString().c_str());
  std::_Exit(named ? 0 : 1);
}

TEST(WireChannelFds, AnFdDroppedForWantOfOpenFilesSaysSo) {
  // The sanitizers' runtimes open fds of their own to check memory (UBSan's vptr check reports a
  // false error when it cannot); the plain build runs this.
  if (testing::kUnderSanitizer) GTEST_SKIP() << "a sanitizer runtime needs free fds";
  EXPECT_EXIT(ReceiveAnFdWithNoRoomForIt(), ::testing::ExitedWithCode(0), "");
}

// A reply's spin (Channel::ReceiveReply with set_reply_spin, the subscriber's) is bounded like the
// wait after it: a frame that comes during it is read, one already there is read even past the
// deadline (as the blocking wait does), and the deadline or a cancel ends it long before the spin
// would (a minute here).
TEST(WireChannelSpin, AReplyDuringTheSpinIsReadAndTheDeadlineAndACancelEndIt) {
  using Clock = std::chrono::steady_clock;
  std::vector<uint8_t> payload;
  Encode(CopyDone{7}, &payload);
  Pair p;
  p.channel->set_reply_spin(std::chrono::minutes(1));
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    p.Write(FrameBytes(FrameType::kCopyDone, payload));
  });
  CopyDone done;
  Status s =
      p.channel->ReceiveReply(FrameType::kCopyDone, &done, Deadline(std::chrono::seconds(5)));
  writer.join();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(done.step, 7);

  p.Write(FrameBytes(FrameType::kCopyDone, payload));
  done.step = 0;
  ASSERT_OK(
      p.channel->ReceiveReply(FrameType::kCopyDone, &done, Deadline(std::chrono::milliseconds(0))));
  EXPECT_EQ(done.step, 7) << "a reply already there is read past the deadline";

  auto t0 = Clock::now();
  EXPECT_STATUS_IS(
      kTimeout,
      p.channel->ReceiveReply(FrameType::kCopyDone, &done, Deadline(std::chrono::milliseconds(50))),
      "before the deadline");
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10)) << "the deadline ends the spin";

  std::atomic<bool> cancel{true};
  t0 = Clock::now();
  EXPECT_STATUS_IS(kCancelled,
                   p.channel->ReceiveReply(FrameType::kCopyDone, &done,
                                           Deadline(std::chrono::seconds(30), &cancel)),
                   "cancelled while receiving");
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10)) << "a cancel ends the spin";
}

}  // namespace
}  // namespace weightsync::transport::link
