// A raw client on the publisher's socket sends malformed, truncated and oversized frames. Each gets
// a clear error (an Error frame naming the problem, or a closed connection with a logged reason),
// and the publisher keeps serving a legitimate subscriber throughout.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <thread>

#include "testing/local_pair.h"
#include "transport/link/channel.h"
#include "transport/link/endpoint.h"
#include "transport/link/link.h"
#include "util/hash.h"
#include "wire/frame.h"
#include "wire/handshake.h"
#include "wire/members_report.h"
#include "wire/messages.h"

namespace weightsync {
namespace {

using testing::LocalPair;
using testing::SyntheticModel;
using util::Deadline;

class HostileClient : public ::testing::Test {
 protected:
  void SetUp() override {
    pair_.timeout = publisher_timeout_;
    pair_.Start();
    pair_.Publish(1);
    sub_ = pair_.Connect();
    ASSERT_OK(sub_->Update());
  }

  util::UniqueFd Dial() {
    auto ep = transport::link::ParseEndpoint(pair_.endpoint);
    EXPECT_TRUE(ep.ok());
    auto fd = transport::link::ConnectUnix(ep->socket_path, Deadline(std::chrono::seconds(2)));
    EXPECT_TRUE(fd.ok()) << fd.status();
    return std::move(fd).value();
  }
  static void SendRaw(int fd, const std::vector<uint8_t>& bytes) {
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  static std::vector<uint8_t> Frame(uint16_t type, const std::vector<uint8_t>& payload,
                                    uint32_t magic = wire::kMagic,
                                    uint16_t version = wire::kProtocolVersion) {
    std::vector<uint8_t> f(wire::kHeaderBytes);
    uint32_t len = payload.size();
    uint32_t reserved = 0;
    uint64_t sum = util::Hash64(payload.data(), payload.size());
    std::memcpy(&f[0], &magic, 4);
    std::memcpy(&f[4], &version, 2);
    std::memcpy(&f[6], &type, 2);
    std::memcpy(&f[8], &len, 4);
    std::memcpy(&f[12], &reserved, 4);
    std::memcpy(&f[16], &sum, 8);
    f.insert(f.end(), payload.begin(), payload.end());
    return f;
  }
  static std::vector<uint8_t> HelloPayload(uint16_t version = wire::kProtocolVersion) {
    std::vector<uint8_t> out;
    wire::Encode(wire::Hello{version, wire::Role::kSubscriber, 1}, &out);
    return out;
  }
  // What the publisher answered: the Error frame's message, "closed", or "silent".
  static std::string Answer(util::UniqueFd fd) {
    transport::link::Channel ch(std::move(fd), "publisher");
    Deadline deadline(std::chrono::seconds(3));
    while (true) {
      auto header = ch.Receive(deadline);
      if (!header.ok()) {
        if (header.status().code() == StatusCode::kPeerLost) return "closed";
        if (header.status().code() == StatusCode::kTimeout) return "silent";
        return header.status().ToString();
      }
      if (header->type == wire::FrameType::kError) {
        wire::ErrorMessage err;
        EXPECT_OK(wire::Decode(ch.payload(), &err));
        return err.message;
      }
      // Welcome (after a valid hello) and other frames: keep reading until closed.
    }
  }
  void ExpectStillServing(int64_t step) {
    pair_.Publish(step);
    auto stats = sub_->Update(step);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_FALSE(stats->handle_created) << "legitimate subscriber's connection was disturbed";
    std::string why;
    EXPECT_TRUE(SyntheticModel::Holds(pair_.dst, step, &why)) << why;
  }

  std::chrono::milliseconds publisher_timeout_{500};
  LocalPair pair_;
  std::unique_ptr<Subscriber> sub_;
  testing::LogCapture logs_;
};

// A publisher that gives a slow peer 10 s: what it refuses at once must not wait for a deadline.
class HostileClientPatientPublisher : public HostileClient {
 protected:
  HostileClientPatientPublisher() { publisher_timeout_ = std::chrono::seconds(10); }
};

TEST_F(HostileClient, RandomBytes) {
  std::mt19937 rng(7);
  std::vector<uint8_t> junk(200);
  for (auto& b : junk) b = rng();
  util::UniqueFd fd = Dial();
  SendRaw(fd.get(), junk);
  std::string answer = Answer(std::move(fd));
  EXPECT_NE(answer.find("magic"), std::string::npos) << answer;
  // The reason is logged by the connection's thread right after it answers.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (!logs_.Contains("closed: protocol_error") && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_TRUE(logs_.Contains("closed: protocol_error")) << "no logged reason";
  ExpectStillServing(2);
}

TEST_F(HostileClient, WrongMagicAndWrongVersion) {
  {
    util::UniqueFd fd = Dial();
    SendRaw(fd.get(), Frame(1, HelloPayload(), 0xDEADBEEF));
    EXPECT_NE(Answer(std::move(fd)).find("magic"), std::string::npos);
  }
  {
    util::UniqueFd fd = Dial();
    SendRaw(fd.get(), Frame(1, HelloPayload(), wire::kMagic, 99));
    EXPECT_NE(Answer(std::move(fd)).find("version"), std::string::npos);
  }
  {
    // A well-formed frame announcing another protocol version in its hello.
    util::UniqueFd fd = Dial();
    const uint16_t other = wire::kProtocolVersion + 1;
    SendRaw(fd.get(), Frame(1, HelloPayload(other)));
    std::string answer = Answer(std::move(fd));
    EXPECT_NE(answer.find("protocol version " + std::to_string(other)), std::string::npos)
        << answer;
  }
  ExpectStillServing(2);
}

TEST_F(HostileClient, OversizedLengthIsRefusedBeforeAllocating) {
  util::UniqueFd fd = Dial();
  std::vector<uint8_t> f = Frame(1, HelloPayload());
  uint32_t huge = 0xFFFFFFF0u;
  std::memcpy(&f[8], &huge, 4);
  SendRaw(fd.get(), f);
  std::string answer = Answer(std::move(fd));
  EXPECT_NE(answer.find("length"), std::string::npos) << answer;
  ExpectStillServing(2);
}

TEST_F(HostileClient, TruncatedFrameThenCloseOrSilence) {
  {
    util::UniqueFd fd = Dial();
    std::vector<uint8_t> f = Frame(1, HelloPayload());
    f.resize(f.size() - 3);
    SendRaw(fd.get(), f);
    ::shutdown(fd.get(), SHUT_WR);  // the peer sees the rest will never come
    EXPECT_EQ(Answer(std::move(fd)), "closed");
  }
  {
    util::UniqueFd fd = Dial();
    std::vector<uint8_t> f = Frame(1, HelloPayload());
    f.resize(10);
    SendRaw(fd.get(), f);
    // Silence: the publisher's handshake deadline (500 ms) ends the connection, saying why.
    const std::string answer = Answer(std::move(fd));
    EXPECT_NE(answer.find("handshake"), std::string::npos) << answer;
    EXPECT_NE(answer.find("before the deadline"), std::string::npos) << answer;
  }
  ExpectStillServing(2);
}

TEST_F(HostileClient, CorruptChecksumAndBadPayloads) {
  {
    util::UniqueFd fd = Dial();
    std::vector<uint8_t> f = Frame(1, HelloPayload());
    f.back() ^= 0x01;  // payload no longer matches its checksum
    SendRaw(fd.get(), f);
    EXPECT_NE(Answer(std::move(fd)).find("checksum"), std::string::npos);
  }
  {
    // Valid hello, then an update request with trailing garbage: longer than any update_request,
    // it is refused from its header.
    util::UniqueFd fd = Dial();
    SendRaw(fd.get(), Frame(1, HelloPayload()));
    std::vector<uint8_t> req;
    wire::Encode(wire::UpdateRequest{-1, -1}, &req);
    req.push_back(0x42);
    SendRaw(fd.get(), Frame(3, req));
    std::string answer = Answer(std::move(fd));
    EXPECT_NE(answer.find("frame header (update_request): payload length 30 exceeds limit 29"),
              std::string::npos)
        << answer;
  }
  {
    // Valid hello, then a frame type a subscriber never sends.
    util::UniqueFd fd = Dial();
    SendRaw(fd.get(), Frame(1, HelloPayload()));
    std::vector<uint8_t> end;
    wire::Encode(wire::StepEnd{1, {1, 2, 3}}, &end);
    SendRaw(fd.get(), Frame(6, end));
    std::string answer = Answer(std::move(fd));
    EXPECT_NE(answer.find("expected update_request"), std::string::npos) << answer;
  }
  ExpectStillServing(2);
}

// Before its Hello is decoded a peer is owed no more than a handshake frame: a header claiming
// the full frame limit is refused from the header alone, without waiting for (or allocating) the
// 64 MiB it announces.
TEST_F(HostileClientPatientPublisher, HelloClaimingTheFrameLimitIsRefusedAtTheHeader) {
  util::UniqueFd fd = Dial();
  std::vector<uint8_t> header = Frame(1, {});
  const uint32_t claimed = wire::kMaxPayloadBytes;
  std::memcpy(&header[8], &claimed, 4);
  const auto t0 = std::chrono::steady_clock::now();
  SendRaw(fd.get(), header);  // and nothing else
  transport::link::Channel ch(std::move(fd), "publisher");
  const Deadline deadline(std::chrono::seconds(3));
  auto frame = ch.Receive(deadline);
  ASSERT_TRUE(frame.ok()) << frame.status();
  ASSERT_EQ(frame->type, wire::FrameType::kError);
  wire::ErrorMessage err;
  ASSERT_OK(wire::Decode(ch.payload(), &err));
  EXPECT_EQ(err.code, StatusCode::kProtocolError) << err.message;
  const std::string limit = "frame header (hello): payload length " + std::to_string(claimed) +
                            " exceeds limit " + std::to_string(wire::kMaxHelloBytes);
  EXPECT_NE(err.message.find(limit), std::string::npos) << err.message;
  ASSERT_STATUS_IS(kPeerLost, ch.Receive(deadline));  // and the connection is closed
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2))
      << "the refusal waited for something";
  ExpectStillServing(2);
}

TEST_F(HostileClient, ManyHalfOpenConnectionsDoNotBlockTheLegitimatePeer) {
  std::vector<util::UniqueFd> idle;
  for (int i = 0; i < 40; ++i) idle.push_back(Dial());  // connect, say nothing
  ExpectStillServing(2);
  ExpectStillServing(3);
}

// A member's report (between updates) is checked against what the publisher published: a step
// it never published, or a subtree from a member that announced nothing to serve on, ends that
// session with an error naming it, and nobody else notices.
TEST_F(HostileClient, AReportOfAStepNeverPublishedOrOfChildrenOfALeafEndsItsSession) {
  auto report_after_hello = [&](const wire::MembersReport& report) {
    util::UniqueFd fd = Dial();
    std::vector<uint8_t> payload;
    wire::Encode(report, &payload);
    std::vector<uint8_t> frames = Frame(1, HelloPayload());
    const std::vector<uint8_t> second =
        Frame(static_cast<uint16_t>(wire::FrameType::kMembersReport), payload);
    frames.insert(frames.end(), second.begin(), second.end());
    SendRaw(fd.get(), frames);
    return Answer(std::move(fd));
  };
  wire::MembersReport lie;
  lie.held_step = 99;
  std::string answer = report_after_hello(lie);
  EXPECT_NE(answer.find("members_report: the reporter holds step 99, this publisher's latest is 1"),
            std::string::npos)
      << answer;
  wire::MembersReport below;
  below.held_step = 1;
  below.below = 1;
  below.members.push_back(wire::ReportedMember{"10.0.0.9:4000", "", "", "", 7, 1, -1, 0, 1});
  answer = report_after_hello(below);
  EXPECT_NE(answer.find("'10.0.0.9:4000' holds step 7"), std::string::npos) << answer;
  below.members[0].held_step = 1;
  answer = report_after_hello(below);
  EXPECT_NE(answer.find("lists 1 members, but its hello announced no endpoint to serve on"),
            std::string::npos)
      << answer;
  // What is true is taken: a report of the step it holds keeps the session (silent, no error).
  wire::MembersReport truth;
  truth.held_step = 1;
  EXPECT_EQ(report_after_hello(truth), "silent");
  ExpectStillServing(2);
}

}  // namespace
}  // namespace weightsync
