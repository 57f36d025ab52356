// The tcp transport's security: mutual HMAC authentication with a shared token, refusal to listen
// on a non-loopback address without one, and hostile input against a live listener (random bytes,
// pickle, wrong magic, oversized frames, wrong token, replayed nonces, half-open floods) — each
// refused with a clear, logged reason while a legitimate subscriber keeps updating.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <thread>

#include "testing/local_pair.h"
#include "transport/link/channel.h"
#include "transport/link/endpoint.h"
#include "transport/link/link.h"
#include "util/hash.h"
#include "wire/handshake.h"

namespace weightsync {
namespace {

using testing::LocalPair;
using testing::SyntheticModel;
using util::Deadline;

constexpr char kToken[] = "correct horse battery staple 42";

std::unique_ptr<Publisher> StartPublisher(const std::string& endpoint, const std::string& token,
                                          SyntheticModel& model) {
  PublisherOptions o;
  o.endpoint = endpoint;
  o.token = token;
  o.timeout = std::chrono::milliseconds(3000);
  auto p = Publisher::Create(o);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return nullptr;
  EXPECT_OK((*p)->Register(model.Tensors()));
  return std::move(p).value();
}

std::unique_ptr<Subscriber> Connect(const std::string& endpoint, const std::string& token,
                                    const std::vector<NamedTensor>& dst) {
  SubscriberOptions o;
  o.endpoint = endpoint;
  o.token = token;
  o.verify = true;
  o.timeout = std::chrono::milliseconds(3000);
  return testing::NewSubscriber(o, dst);
}

class TcpAuth : public ::testing::Test {
 protected:
  void SetUp() override {
    pub_ = StartPublisher("tcp://127.0.0.1:0", kToken, model_);
    ASSERT_NE(pub_, nullptr);
    model_.Fill(1);
    ASSERT_TRUE(pub_->Publish(1).ok());
  }
  std::vector<NamedTensor> Destinations() {
    storage_.push_back(SyntheticModel::PoisonedStorage(tensors_));
    return SyntheticModel::Views(tensors_, storage_.back());
  }
  util::UniqueFd Dial() {
    auto ep = transport::link::ParseEndpoint(pub_->endpoint());
    EXPECT_TRUE(ep.ok()) << ep.status();
    auto fd = transport::link::ConnectTcp(*ep, Deadline(std::chrono::seconds(2)));
    EXPECT_TRUE(fd.ok()) << fd.status();
    return std::move(fd).value();
  }
  // Reads frames until an Error frame (returns its message), EOF ("closed") or silence.
  static std::string Answer(transport::link::Channel& ch, wire::Challenge* challenge = nullptr) {
    Deadline deadline(std::chrono::seconds(4));
    while (true) {
      auto h = ch.Receive(deadline);
      if (!h.ok()) {
        if (h.status().code() == StatusCode::kPeerLost) return "closed";
        if (h.status().code() == StatusCode::kTimeout) return "silent";
        return h.status().ToString();
      }
      if (h->type == wire::FrameType::kError) {
        wire::ErrorMessage e;
        EXPECT_OK(wire::Decode(ch.payload(), &e));
        return e.message;
      }
      if (h->type == wire::FrameType::kChallenge && challenge != nullptr) {
        EXPECT_OK(wire::Decode(ch.payload(), challenge));
        return "challenge";
      }
    }
  }
  void ExpectLegitimateUpdate(int64_t step) {
    if (!legit_) {
      legit_dst_ = Destinations();
      legit_ = Connect(pub_->endpoint(), kToken, legit_dst_);
    }
    model_.Fill(step);
    ASSERT_TRUE(pub_->Publish(step).ok());
    auto stats = legit_->Update(step);
    ASSERT_TRUE(stats.ok()) << stats.status();
    std::string why;
    EXPECT_TRUE(SyntheticModel::Holds(legit_dst_, step, &why)) << why;
  }

  SyntheticModel model_{6, 5000};
  std::vector<NamedTensor> tensors_ = model_.Tensors();
  std::vector<std::vector<std::vector<uint8_t>>> storage_;
  std::unique_ptr<Publisher> pub_;
  std::unique_ptr<Subscriber> legit_;
  std::vector<NamedTensor> legit_dst_;
  testing::LogCapture logs_;
};

TEST_F(TcpAuth, RightTokenRoundTripsBitExact) {
  auto dst = Destinations();
  auto sub = Connect(pub_->endpoint(), kToken, dst);
  auto stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats->verified);
  EXPECT_EQ(stats->path, "tcp");
  std::string why;
  EXPECT_TRUE(SyntheticModel::Holds(dst, 1, &why)) << why;
  for (int step = 2; step <= 30; ++step) {
    model_.Fill(step);
    ASSERT_TRUE(pub_->Publish(step).ok());
    auto s = sub->Update();
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_FALSE(s->handle_created);
  }
  EXPECT_TRUE(SyntheticModel::Holds(dst, 30, &why)) << why;
}

TEST_F(TcpAuth, WrongTokenIsRefusedOnBothSides) {
  auto dst = Destinations();
  auto sub = Connect(pub_->endpoint(), "this is not the right token!!", dst);
  auto stats = sub->Update();
  ASSERT_STATUS_IS(kUnauthenticated, stats, "token");
  EXPECT_TRUE(logs_.Contains("refused")) << "publisher did not log the refusal";
  // The secret itself never reaches a log line.
  for (const auto& line : logs_.Lines()) {
    EXPECT_EQ(line.find(kToken), std::string::npos) << line;
    EXPECT_EQ(line.find("this is not the right token"), std::string::npos) << line;
  }
  EXPECT_EQ(static_cast<uint8_t*>(dst[0].view.data)[0], 0xFF);  // nothing written
  ExpectLegitimateUpdate(2);
}

TEST_F(TcpAuth, MissingTokenOnEitherSideIsRefused) {
  auto dst = Destinations();
  auto no_token = Connect(pub_->endpoint(), "", dst);
  auto a = no_token->Update();
  ASSERT_STATUS_IS(kUnauthenticated, a, "requires a token");

  // A publisher without a token (loopback) cannot prove itself to a subscriber that has one.
  SyntheticModel model(2, 100);
  auto open_pub = StartPublisher("tcp://127.0.0.1:0", "", model);
  model.Fill(1);
  ASSERT_TRUE(open_pub->Publish(1).ok());
  auto like = model.Tensors();
  auto storage = SyntheticModel::PoisonedStorage(like);
  auto views = SyntheticModel::Views(like, storage);
  auto careful = Connect(open_pub->endpoint(), kToken, views);
  auto b = careful->Update();
  ASSERT_STATUS_IS(kUnauthenticated, b, "does not authenticate");
}

TEST(TcpListen, NonLoopbackWithoutTokenIsRefusedAtStartup) {
  PublisherOptions o;
  o.endpoint = "tcp://0.0.0.0:0";
  auto p = Publisher::Create(o);
  ASSERT_STATUS_IS(kUnauthenticated, p, "refusing to listen");
  o.token = kToken;
  auto q = Publisher::Create(o);
  ASSERT_TRUE(q.ok()) << q.status();
}

TEST(TcpListen, TokenFileMustBeOwnerOnly) {
  std::string path = ::testing::TempDir() + "/ws_token_" + std::to_string(::getpid());
  {
    std::ofstream f(path);
    f << kToken << "\n";
  }
  ::chmod(path.c_str(), 0644);
  PublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:0";
  o.token_file = path;
  auto p = Publisher::Create(o);
  ASSERT_STATUS_IS(kUnauthenticated, p, "chmod 600");
  ::chmod(path.c_str(), 0600);
  auto q = Publisher::Create(o);
  ASSERT_TRUE(q.ok()) << q.status();
  ::unlink(path.c_str());
}

TEST_F(TcpAuth, GarbageAndPickleBeforeAuthAreRefused) {
  const std::vector<std::vector<uint8_t>> payloads = {
      {0x80, 0x04, 0x95, 0x10, 0, 0, 0, 0, 0, 0, 0, 0x8c, 0x02, 'o', 's', 0x94},  // pickle
      std::vector<uint8_t>(64, 0xAB),                                             // junk
  };
  for (const auto& bytes : payloads) {
    util::UniqueFd fd = Dial();
    transport::link::Channel ch(std::move(fd), "publisher");
    wire::Challenge challenge;
    ASSERT_EQ(Answer(ch, &challenge), "challenge");
    ASSERT_EQ(::send(ch.fd(), bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
    // Short junk never completes a header: the handshake deadline closes it.
    std::string answer = Answer(ch);
    EXPECT_TRUE(answer.find("magic") != std::string::npos || answer == "closed") << answer;
  }
  ExpectLegitimateUpdate(2);
}

TEST_F(TcpAuth, OversizedHandshakeFrameIsRefusedBeforeAllocating) {
  util::UniqueFd fd = Dial();
  transport::link::Channel ch(std::move(fd), "publisher");
  wire::Challenge challenge;
  ASSERT_EQ(Answer(ch, &challenge), "challenge");
  std::vector<uint8_t> big(1 << 20, 0);
  // Header announcing 1 MiB: larger than any handshake frame may be.
  Status s = ch.SendPayload(wire::FrameType::kAuth, big, Deadline(std::chrono::seconds(1)));
  (void)s;  // the publisher may close before all of it is written
  std::string answer = Answer(ch);
  EXPECT_TRUE(answer.find("exceeds limit") != std::string::npos || answer == "closed") << answer;
  ExpectLegitimateUpdate(2);
}

// A "publisher" that is only a listening socket on loopback: it accepts one connection, writes
// `bytes` and then stays silent with the connection open until destroyed.
class FakeTcpPublisher {
 public:
  explicit FakeTcpPublisher(std::vector<uint8_t> bytes) {
    listen_ = util::UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(::bind(listen_.get(), reinterpret_cast<sockaddr*>(&addr), len), 0);
    EXPECT_EQ(::listen(listen_.get(), 1), 0);
    EXPECT_EQ(::getsockname(listen_.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, bytes = std::move(bytes)] {
      pollfd p{listen_.get(), POLLIN, 0};
      if (::poll(&p, 1, 10000) != 1) return;
      conn_ = util::UniqueFd(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      EXPECT_EQ(::send(conn_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL),
                static_cast<ssize_t>(bytes.size()));
    });
  }
  ~FakeTcpPublisher() { thread_.join(); }
  std::string endpoint() const { return "tcp://127.0.0.1:" + std::to_string(port_); }

  static std::vector<uint8_t> Frame(wire::FrameType type, const std::vector<uint8_t>& payload) {
    std::vector<uint8_t> out(wire::kHeaderBytes);
    wire::EncodeHeader(type, payload,
                       std::span<uint8_t, wire::kHeaderBytes>(out.data(), wire::kHeaderBytes));
    out.insert(out.end(), payload.begin(), payload.end());
    return out;
  }
  // A header alone, announcing `claimed` payload bytes that never follow.
  static std::vector<uint8_t> HeaderClaiming(wire::FrameType type, uint32_t claimed) {
    std::vector<uint8_t> out = Frame(type, {});
    for (int i = 0; i < 4; ++i) out[8 + i] = static_cast<uint8_t>(claimed >> (8 * i));
    return out;
  }

 private:
  util::UniqueFd listen_, conn_;
  uint16_t port_ = 0;
  std::thread thread_;
};

// A subscriber that gives its publisher 10 s, tried against `fake`: Update's result, and how long
// it took.
std::pair<Status, std::chrono::milliseconds> UpdateAgainst(const FakeTcpPublisher& fake,
                                                           const std::vector<NamedTensor>& dst) {
  SubscriberOptions o;
  o.endpoint = fake.endpoint();
  o.timeout = std::chrono::seconds(10);
  auto sub = Subscriber::Create(o);
  EXPECT_TRUE(sub.ok()) << sub.status();
  if (!sub.ok()) return {sub.status(), {}};
  EXPECT_OK((*sub)->Register(dst));
  const auto t0 = std::chrono::steady_clock::now();
  Status s = ToStatus((*sub)->Update());
  return {s, std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now() - t0)};
}

// Until the publisher has proven it holds the token (AuthOk's MAC), it is owed no more than a
// handshake frame: a header claiming the full frame limit is refused from the header alone,
// instead of the subscriber reserving 64 MiB and waiting for them until its deadline.
TEST_F(TcpAuth, ChallengeClaimingTheFrameLimitIsRefusedAtTheHeader) {
  FakeTcpPublisher fake(
      FakeTcpPublisher::HeaderClaiming(wire::FrameType::kChallenge, wire::kMaxPayloadBytes));
  auto [s, elapsed] = UpdateAgainst(fake, Destinations());
  ASSERT_STATUS_IS(kProtocolError, s,
                   "frame header (challenge): payload length " +
                       std::to_string(wire::kMaxPayloadBytes) + " exceeds limit " +
                       std::to_string(wire::kChallengeBytes));
  EXPECT_LT(elapsed.count(), 2000) << "the refusal waited for something: " << s;
}

TEST_F(TcpAuth, AuthOkClaimingTheFrameLimitIsRefusedAtTheHeader) {
  // A genuine-looking challenge (no token on either side), then an oversized AuthOk.
  std::vector<uint8_t> challenge;
  wire::Encode(wire::Challenge{wire::kProtocolVersion, 7, *wire::RandomNonce(), false}, &challenge);
  std::vector<uint8_t> bytes = FakeTcpPublisher::Frame(wire::FrameType::kChallenge, challenge);
  std::vector<uint8_t> header =
      FakeTcpPublisher::HeaderClaiming(wire::FrameType::kAuthOk, wire::kMaxPayloadBytes);
  bytes.insert(bytes.end(), header.begin(), header.end());
  FakeTcpPublisher fake(bytes);
  auto [s, elapsed] = UpdateAgainst(fake, Destinations());
  ASSERT_STATUS_IS(kProtocolError, s,
                   "frame header (auth_ok): payload length " +
                       std::to_string(wire::kMaxPayloadBytes) + " exceeds limit " +
                       std::to_string(wire::kAuthOkBytes));
  EXPECT_LT(elapsed.count(), 2000) << "the refusal waited for something: " << s;
}

// The handshake bound still lets through the longest Error frame a publisher may send instead of
// a handshake frame, so its reason reaches the subscriber whole.
TEST_F(TcpAuth, LongestErrorFrameDuringTheHandshakeArrivesWhole) {
  const std::string reason(wire::kMaxErrorMessageBytes, 'r');
  std::vector<uint8_t> error;
  wire::Encode(wire::ErrorMessage{StatusCode::kResourceExhausted, reason}, &error);
  ASSERT_EQ(error.size(), wire::kMaxErrorBytes);
  FakeTcpPublisher fake(FakeTcpPublisher::Frame(wire::FrameType::kError, error));
  auto [s, elapsed] = UpdateAgainst(fake, Destinations());
  ASSERT_STATUS_IS(kResourceExhausted, s, reason);
}

TEST_F(TcpAuth, ReplayedAuthIsRefused) {
  // A genuine first handshake, recorded.
  util::UniqueFd fd1 = Dial();
  transport::link::Channel ch1(std::move(fd1), "publisher");
  wire::Challenge c1;
  ASSERT_EQ(Answer(ch1, &c1), "challenge");
  wire::Nonce nonce = *wire::RandomNonce();
  wire::Auth auth{
      wire::Role::kSubscriber, nonce,
      wire::ComputeMac(kToken, wire::MacSide::kClient, c1, nonce, wire::Role::kSubscriber)};
  ASSERT_OK(ch1.Send(wire::FrameType::kAuth, auth, Deadline(std::chrono::seconds(1))));
  wire::AuthOk ok;
  ASSERT_OK(ch1.ReceiveExpect(wire::FrameType::kAuthOk, &ok, Deadline(std::chrono::seconds(2))));

  // The same Auth replayed on a new connection fails: the challenge is fresh.
  util::UniqueFd fd2 = Dial();
  transport::link::Channel ch2(std::move(fd2), "publisher");
  wire::Challenge c2;
  ASSERT_EQ(Answer(ch2, &c2), "challenge");
  ASSERT_NE(c1.server_nonce, c2.server_nonce);
  ASSERT_OK(ch2.Send(wire::FrameType::kAuth, auth, Deadline(std::chrono::seconds(1))));
  EXPECT_NE(Answer(ch2).find("authentication failed"), std::string::npos);

  // Even a correct MAC over the new challenge is refused when it reuses the client nonce.
  util::UniqueFd fd3 = Dial();
  transport::link::Channel ch3(std::move(fd3), "publisher");
  wire::Challenge c3;
  ASSERT_EQ(Answer(ch3, &c3), "challenge");
  wire::Auth reused{
      wire::Role::kSubscriber, nonce,
      wire::ComputeMac(kToken, wire::MacSide::kClient, c3, nonce, wire::Role::kSubscriber)};
  ASSERT_OK(ch3.Send(wire::FrameType::kAuth, reused, Deadline(std::chrono::seconds(1))));
  EXPECT_NE(Answer(ch3).find("replayed nonce"), std::string::npos);
  ExpectLegitimateUpdate(2);
}

// A loopback listener without a token authenticates anyone who computes the MAC of the empty token,
// so after AuthOk its channel takes full-size frames. A 24-byte header claiming a 64 MiB hello (a
// 15-byte message) is still refused from the header alone, by what a hello can hold: the
// publisher reserves nothing for it and does not wait for the payload.
TEST(TcpNoToken, AHelloClaimingTheFrameLimitIsRefusedAtTheHeaderAfterAuthentication) {
  SyntheticModel model(2, 1000);
  auto pub = StartPublisher("tcp://127.0.0.1:0", "", model);
  ASSERT_NE(pub, nullptr);
  model.Fill(1);
  ASSERT_OK(pub->Publish(1));
  auto ep = transport::link::ParseEndpoint(pub->endpoint());
  ASSERT_OK(ep);
  auto fd = transport::link::ConnectTcp(*ep, Deadline(std::chrono::seconds(2)));
  ASSERT_OK(fd);
  transport::link::Channel ch(std::move(fd).value(), "publisher");
  const Deadline deadline(std::chrono::seconds(3));
  wire::Challenge challenge;
  ASSERT_OK(ch.ReceiveExpect(wire::FrameType::kChallenge, &challenge, deadline));
  ASSERT_FALSE(challenge.auth_required);
  const wire::Nonce nonce = *wire::RandomNonce();
  const wire::Auth auth{
      wire::Role::kSubscriber, nonce,
      wire::ComputeMac("", wire::MacSide::kClient, challenge, nonce, wire::Role::kSubscriber)};
  ASSERT_OK(ch.Send(wire::FrameType::kAuth, auth, deadline));
  wire::AuthOk ok;
  ASSERT_OK(ch.ReceiveExpect(wire::FrameType::kAuthOk, &ok, deadline));
  ch.set_max_payload(wire::kMaxPayloadBytes);  // to read whatever the publisher answers

  std::vector<uint8_t> header(wire::kHeaderBytes);
  wire::EncodeHeader(wire::FrameType::kHello, {}, std::span<uint8_t, wire::kHeaderBytes>(header));
  const uint32_t claimed = wire::kMaxPayloadBytes;
  std::memcpy(&header[8], &claimed, 4);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::send(ch.fd(), header.data(), header.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(header.size()));  // and nothing else
  auto frame = ch.Receive(deadline);
  ASSERT_TRUE(frame.ok()) << frame.status();
  ASSERT_EQ(frame->type, wire::FrameType::kError);
  wire::ErrorMessage err;
  ASSERT_OK(wire::Decode(ch.payload(), &err));
  EXPECT_EQ(err.code, StatusCode::kProtocolError) << err.message;
  EXPECT_NE(err.message.find("frame header (hello): payload length " + std::to_string(claimed) +
                             " exceeds limit " + std::to_string(wire::kMaxHelloBytes)),
            std::string::npos)
      << err.message;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2))
      << "the refusal waited for the payload";
}

TEST_F(TcpAuth, ThousandHalfOpenConnectionsDuringLegitimateUpdates) {
  ExpectLegitimateUpdate(2);
  std::vector<util::UniqueFd> idle;
  for (int i = 0; i < 1000; ++i) idle.push_back(Dial());
  for (int step = 3; step <= 6; ++step) ExpectLegitimateUpdate(step);
  EXPECT_EQ(idle.size(), 1000u);
}

TEST_F(TcpAuth, StaleStepIsRefused) {
  auto dst = Destinations();
  auto sub = Connect(pub_->endpoint(), kToken, dst);
  model_.Fill(2);
  ASSERT_TRUE(pub_->Publish(2).ok());
  ASSERT_OK(sub->Update(2));
  ASSERT_STATUS_IS(kFailedPrecondition, sub->Update(1));
}

}  // namespace
}  // namespace weightsync
