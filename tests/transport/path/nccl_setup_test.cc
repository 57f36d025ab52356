// The nccl transport's set-up, where it can be checked without a GPU: the run-time loader
// (missing library, missing symbol, version strings), and the tcp conversation around it — a
// subscriber of CUDA tensors facing a publisher whose arena is GPU memory gets Unavailable with a
// clear reason when this machine has no NCCL or no GPU (and sends the publisher nothing it cannot
// follow through); a host-arena publisher refuses nccl_setup; host and CUDA destinations at once
// are NotSupported naming the tensor, CUDA ones without a device Unavailable. The GPU end to end is
// tests/gpu/nccl_test.cc.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <thread>

#include "cuda/device.h"
#include "cuda/nccl_api.h"
#include "cuda/nccl_link.h"
#include "testing/test_util.h"
#include "transport/link/channel.h"
#include "transport/link/endpoint.h"
#include "transport/link/link.h"
#include "transport/path/nccl_path.h"
#include "wire/handshake.h"

namespace weightsync {
namespace {

using testing::SyntheticModel;
using util::Deadline;

// ---- the loader ----------------------------------------------------------------------------

TEST(NcclLoader, MissingLibraryIsUnavailableNamingIt) {
  auto lib = cuda::nccl::OpenNcclLibrary("libweightsync-no-such-nccl.so.2");
  ASSERT_STATUS_IS(kUnavailable, lib, "libweightsync-no-such-nccl.so.2", "WEIGHTSYNC_NCCL_LIBRARY");
}

TEST(NcclLoader, LibraryWithoutTheSymbolsIsUnavailableNamingTheSymbol) {
  // libc loads fine but is not NCCL: the first entry point is missing.
  auto lib = cuda::nccl::OpenNcclLibrary("libc.so.6");
  ASSERT_STATUS_IS(kUnavailable, lib, "ncclGetVersion", "libc.so.6");
}

TEST(NcclLoader, VersionStringsAndCompatibility) {
  EXPECT_EQ(cuda::nccl::NcclVersionString(22809), "2.28.9");
  EXPECT_EQ(cuda::nccl::NcclVersionString(21800), "2.18.0");
  EXPECT_EQ(cuda::nccl::NcclVersionString(2804), "2.8.4");  // the old encoding
  EXPECT_TRUE(transport::path::CompatibleVersions(22809, 22803));
  EXPECT_FALSE(transport::path::CompatibleVersions(22809, 22705));
}

TEST(NcclLoader, AvailabilityIsAnsweredWithAReason) {
  // Whatever this machine has, the answer is OK or Unavailable with a reason, never a crash; a
  // build without CUDA says so.
  Status s = cuda::nccl::NcclAvailable();
  if (!s.ok()) {
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
    EXPECT_FALSE(s.message().empty());
    EXPECT_EQ(cuda::nccl::NcclVersionCode(), 0);
  } else {
    EXPECT_GE(cuda::nccl::NcclVersionCode(), cuda::nccl::kMinNcclVersionCode);
  }
  if (!cuda::BuiltWithCuda()) {
    EXPECT_STATUS_IS(kUnavailable, s, "built without CUDA");
  }
  EXPECT_EQ(cuda::nccl::LiveCommunicators(), 0);
}

// ---- a publisher that says its arena is GPU memory -------------------------------------------

// Speaks the publisher's side of a tcp session up to Welcome (a GPU arena on cuda:0 with one
// float32 tensor), then reports what the subscriber sent next.
class FakeGpuPublisher {
 public:
  FakeGpuPublisher() {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listen_, 4), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(listen_, reinterpret_cast<sockaddr*>(&addr), &len);
    endpoint_ = "tcp://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeGpuPublisher() {
    ::shutdown(listen_, SHUT_RDWR);  // wakes an accept that never got a connection
    if (thread_.joinable()) thread_.join();
    ::close(listen_);
  }
  const std::string& endpoint() const { return endpoint_; }
  // What followed the Welcome: a frame type name, "closed" or "silent".
  std::string next() {
    if (thread_.joinable()) thread_.join();
    return next_;
  }

 private:
  void Serve() {
    int fd = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    transport::link::Channel ch(util::UniqueFd(fd), "fake subscriber");
    Deadline deadline(std::chrono::seconds(5));
    wire::Challenge challenge{wire::kProtocolVersion, 7, *wire::RandomNonce(), false};
    if (!ch.Send(wire::FrameType::kChallenge, challenge, deadline).ok()) return;
    wire::Auth auth;
    if (!ch.ReceiveExpect(wire::FrameType::kAuth, &auth, deadline).ok()) return;
    wire::AuthOk ok{};  // no token: all-zero MACs
    if (!ch.Send(wire::FrameType::kAuthOk, ok, deadline).ok()) return;
    wire::Hello hello;
    if (!ch.ReceiveExpect(wire::FrameType::kHello, &hello, deadline).ok()) return;
    wire::Welcome w;
    w.session_id = 7;
    w.lineage = "fake";
    w.arena_bytes = 4u << 20;
    w.slots_offset = 0;
    w.slot_bytes = 2u << 20;
    w.slot_count = 2;
    w.segment_bytes = 64u << 20;
    w.arena_kind = wire::ArenaKind::kCudaMem;
    w.device = 0;
    w.digest_kind = wire::DigestKind::kGpu64;
    w.tensors.push_back({TensorSpec{"w", DType::kFloat32, {4}, 16}, wire::Region::kSlot, 0});
    if (!ch.Send(wire::FrameType::kWelcome, w, deadline).ok()) return;
    auto h = ch.Receive(Deadline(std::chrono::seconds(3)));
    if (h.ok()) {
      next_ = std::string(wire::FrameTypeName(h->type));
    } else {
      next_ = h.status().code() == StatusCode::kPeerLost ? "closed" : "silent";
    }
  }

  int listen_ = -1;
  std::string endpoint_;
  std::thread thread_;
  std::string next_ = "nothing";
};

std::unique_ptr<Subscriber> Connect(const std::string& endpoint,
                                    const std::vector<NamedTensor>& dst) {
  SubscriberOptions o;
  o.endpoint = endpoint;
  o.timeout = std::chrono::milliseconds(4000);
  return testing::NewSubscriber(o, dst);
}

// Destinations "on cuda:0" that are never written: every test here fails before any byte moves.
std::vector<NamedTensor> FakeCudaDestinations() {
  static float never_written[4];
  return {{"w", TensorView{never_written, DType::kFloat32, {4}, {Device::Kind::kCUDA, 0}}}};
}

TEST(NcclSetup, WithoutNcclOrGpuASubscriberOfCudaTensorsGetsUnavailable) {
  if (cuda::nccl::NcclAvailable().ok() && cuda::CudaAvailable().ok()) {
    GTEST_SKIP() << "this machine can run nccl: tests/gpu/nccl_test.cc covers it";
  }
  FakeGpuPublisher pub;
  auto sub = Connect(pub.endpoint(), FakeCudaDestinations());
  auto stats = sub->Update();
  ASSERT_STATUS_IS(kUnavailable, stats, "needs the nccl transport", "cuda:0");
  const Status& s = stats.status();
  // Why exactly: no CUDA in this build, no NCCL library, or no device.
  EXPECT_TRUE(testing::IsError(s, StatusCode::kUnavailable, {"built without CUDA"}) ||
              testing::IsError(s, StatusCode::kUnavailable, {"NCCL library"}) ||
              testing::IsError(s, StatusCode::kUnavailable, {"no CUDA device"}))
      << s;
  // Nothing was asked of the publisher that this side could not follow through.
  EXPECT_EQ(pub.next(), "closed");
  EXPECT_EQ(cuda::nccl::LiveCommunicators(), 0);
  EXPECT_EQ(static_cast<float*>(FakeCudaDestinations()[0].view.data)[0], 0.0f);
}

TEST(NcclSetup, HostDestinationsForAGpuArenaAreNotSupported) {
  FakeGpuPublisher pub;
  std::vector<float> host(4, -1.0f);
  auto sub = Connect(pub.endpoint(), {{"w", TensorView{host.data(), DType::kFloat32, {4}}}});
  auto stats = sub->Update();
  ASSERT_STATUS_IS(kNotSupported, stats,
                   "keeps its arena in GPU memory (cuda:0); no data path moves it over tcp into "
                   "host memory",
                   "destination 'w' is on cpu");
  EXPECT_EQ(pub.next(), "closed");
  EXPECT_EQ(host[0], -1.0f);
}

// ---- a real publisher of host tensors --------------------------------------------------------

class HostTcpPublisher : public ::testing::Test {
 protected:
  void SetUp() override {
    PublisherOptions o;
    o.endpoint = "tcp://127.0.0.1:0";
    o.timeout = std::chrono::milliseconds(3000);
    ASSERT_OK_AND_ASSIGN(pub_, Publisher::Create(o));
    ASSERT_OK(pub_->Register(model_.Tensors()));
    model_.Fill(1);
    ASSERT_TRUE(pub_->Publish(1).ok());
  }
  SyntheticModel model_{3, 1000};
  std::unique_ptr<Publisher> pub_;
};

// A raw client past the handshake, holding the Welcome: what a subscriber sends next is the test's.
std::unique_ptr<transport::link::Channel> HelloedClient(const std::string& endpoint,
                                                        const Deadline& deadline,
                                                        wire::Welcome* welcome) {
  auto ep = transport::link::ParseEndpoint(endpoint);
  EXPECT_OK(ep);
  auto fd = transport::link::ConnectTcp(*ep, deadline);
  EXPECT_OK(fd);
  if (!fd.ok()) return nullptr;
  auto ch = std::make_unique<transport::link::Channel>(std::move(fd).value(), "publisher");
  wire::Challenge challenge;
  EXPECT_OK(ch->ReceiveExpect(wire::FrameType::kChallenge, &challenge, deadline));
  wire::Auth auth{wire::Role::kSubscriber, *wire::RandomNonce(), {}};
  EXPECT_OK(ch->Send(wire::FrameType::kAuth, auth, deadline));
  wire::AuthOk ok;
  EXPECT_OK(ch->ReceiveExpect(wire::FrameType::kAuthOk, &ok, deadline));
  EXPECT_OK(ch->Send(wire::FrameType::kHello,
                     wire::Hello{wire::kProtocolVersion, wire::Role::kSubscriber, 1}, deadline));
  EXPECT_OK(ch->ReceiveExpect(wire::FrameType::kWelcome, welcome, deadline));
  return ch;
}

TEST_F(HostTcpPublisher, RefusesNcclSetupWithAReason) {
  Deadline deadline(std::chrono::seconds(4));
  wire::Welcome welcome;
  auto client = HelloedClient(pub_->endpoint(), deadline, &welcome);
  ASSERT_NE(client, nullptr);
  transport::link::Channel& ch = *client;
  EXPECT_NE(welcome.arena_kind, wire::ArenaKind::kCudaMem);
  ASSERT_OK(
      ch.Send(wire::FrameType::kSelect, wire::Select{{{0, 0, 4}, {1, 0, 4}, {2, 4, 8}}}, deadline));
  ASSERT_OK(ch.Send(wire::FrameType::kNcclSetup, wire::NcclSetup{22809, 0}, deadline));
  wire::NcclId id;
  Status s = ch.ReceiveExpect(wire::FrameType::kNcclId, &id, deadline);
  ASSERT_STATUS_IS(kFailedPrecondition, s, "nccl_setup refused", "host memory");
}

// The publisher streams every selected range from its pinned version each step: a range past
// its tensor is refused before the first step, with the tensor named, and it keeps serving.
TEST_F(HostTcpPublisher, RefusesASelectedRangeOutsideItsTensor) {
  Deadline deadline(std::chrono::seconds(4));
  wire::Welcome welcome;
  auto client = HelloedClient(pub_->endpoint(), deadline, &welcome);
  ASSERT_NE(client, nullptr);
  ASSERT_GE(welcome.tensors.size(), 2u);
  const uint64_t size = welcome.tensors[1].spec.nbytes;
  ASSERT_OK(client->Send(wire::FrameType::kSelect, wire::Select{{{0, 0, 4}, {1, size - 4, 8}}},
                         deadline));
  wire::UpdateRequest request{-1, -1, 1000};
  (void)client->Send(wire::FrameType::kUpdateRequest, request, deadline);
  wire::StepBegin begin;
  Status s = client->ReceiveExpect(wire::FrameType::kStepBegin, &begin, deadline);
  ASSERT_STATUS_IS(kProtocolError, s, "select: bytes", welcome.tensors[1].spec.name);
  // Still serving everyone else.
  auto like = model_.Tensors();
  auto storage = SyntheticModel::PoisonedStorage(like);
  auto dst = SyntheticModel::Views(like, storage);
  auto sub = Connect(pub_->endpoint(), dst);
  ASSERT_OK(sub->Update());
}

// A host arena over tcp into CUDA tensors takes the tcp-to-gpu path (tests/gpu/tcp_to_gpu_test.cc
// runs it); without a CUDA device the subscriber is told that is what is missing.
TEST_F(HostTcpPublisher, CudaDestinationsForAHostArenaWithoutADeviceAreToldWhatIsMissing) {
  if (cuda::CudaAvailable().ok()) GTEST_SKIP() << "a CUDA device: tests/gpu runs this path";
  auto like = model_.Tensors();
  auto storage = SyntheticModel::PoisonedStorage(like);
  auto dst = SyntheticModel::Views(like, storage);
  for (auto& t : dst) t.view.device = {Device::Kind::kCUDA, 0};
  auto sub = Connect(pub_->endpoint(), dst);
  auto stats = sub->Update();
  ASSERT_STATUS_IS(kUnavailable, stats,
                   "streams its host store over tcp and the destinations are CUDA tensors");
}

TEST_F(HostTcpPublisher, MixedHostAndCudaDestinationsAreNotSupported) {
  auto like = model_.Tensors();
  auto storage = SyntheticModel::PoisonedStorage(like);
  auto dst = SyntheticModel::Views(like, storage);
  dst[1].view.device = {Device::Kind::kCUDA, 0};
  auto sub = Connect(pub_->endpoint(), dst);
  auto stats = sub->Update();
  ASSERT_STATUS_IS(kNotSupported, stats, "'" + like[1].name + "' is on cuda:0");
  // The same subscriber with host destinations only still works.
  ASSERT_OK(sub->Close());
  auto host_dst = SyntheticModel::Views(like, storage);
  auto good = Connect(pub_->endpoint(), host_dst);
  auto ok = good->Update();
  ASSERT_TRUE(ok.ok()) << ok.status();
  std::string why;
  EXPECT_TRUE(SyntheticModel::Holds(host_dst, 1, &why)) << why;
}

// ---- a sender over the publisher's own tensors ----------------------------------------------

// A zero-copy or ring publisher's sessions send from its registered tensors (no GPU needed to
// build the send list): one whose tensor has no bytes in this process (an arena publisher's, say,
// or host tensors) is an internal error naming it rather than a broadcast from a null pointer.
TEST(NcclSenderFromTensors, RefusesATensorWithoutBytesAndAStoreThatIsNotItsTensors) {
  wire::Welcome w;
  w.arena_kind = wire::ArenaKind::kCudaIpc;
  w.device = 0;
  wire::TensorPlacement t;
  t.spec = {"layers.0.w", DType::kFloat32, {1024}, 4096};
  t.region = wire::Region::kDirect;
  w.tensors = {t};
  const std::vector<wire::SelectRange> selected = {{0, 1024, 2048}};
  std::vector<uint8_t> bytes(4096);
  auto none = [](uint32_t) -> const uint8_t* { return nullptr; };
  auto held = [&](uint32_t) -> const uint8_t* { return bytes.data(); };
  EXPECT_STATUS_IS(kInternal, transport::path::NcclSender::FromTensors(w, selected, none),
                   "'layers.0.w'", "no bytes in this process");
  EXPECT_OK(transport::path::NcclSender::FromTensors(w, selected, held));
  w.arena_kind = wire::ArenaKind::kCudaRing;
  EXPECT_OK(transport::path::NcclSender::FromTensors(w, selected, held));
  w.device = -1;  // host tensors
  EXPECT_STATUS_IS(kInternal, transport::path::NcclSender::FromTensors(w, selected, held),
                   "not CUDA tensors");
}

}  // namespace
}  // namespace weightsync
