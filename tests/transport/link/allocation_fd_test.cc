// A zero-copy publisher of cuMem memory (PyTorch's expandable segments) shares each chunk as a
// POSIX fd: one AllocationFd frame per chunk right after the Welcome. These tests drive that
// exchange with memfds standing in for the chunks (no GPU needed): the real Unix server and link
// pass them in order, a chunk the publisher cannot export ends the session with its reason, the
// open-file limit is made room for (or its hard limit named), and a publisher that sends frames
// out of order or without their fd is refused on the subscriber's side.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>

#include "testing/test_util.h"
#include "transport/link/channel.h"
#include "transport/link/link.h"
#include "transport/link/server.h"
#include "util/ledger.h"
#include "weightsync/weightsync.h"

namespace weightsync {
namespace {

using std::chrono::milliseconds;
using transport::link::Channel;
using util::UniqueFd;

Status FdRoomFor(uint64_t count) { return transport::link::FdRoom::Make(count).status(); }

// A zero-copy layout: one tensor in one allocation of `chunks` cuMem chunks of 4096 bytes.
wire::Welcome ChunkedWelcome(int chunks) {
  wire::Welcome w;
  w.session_id = 1;
  w.lineage = "allocation-fd-test";
  w.segment_bytes = 64;
  w.arena_kind = wire::ArenaKind::kCudaIpc;
  w.slot_count = 1;
  w.direct_bytes = w.arena_bytes = 4096ull * chunks;
  wire::GpuAllocation a;
  a.kind = wire::AllocationKind::kPosixFdChunks;
  a.bytes = w.direct_bytes;
  a.chunk_bytes.assign(chunks, 4096);
  w.allocations = {a};
  wire::TensorPlacement t;
  t.spec = {"w", DType::kUInt8, {static_cast<int64_t>(a.bytes)}, a.bytes};
  t.region = wire::Region::kDirect;
  w.tensors = {t};
  return w;
}

// A memfd whose first bytes say which chunk it stands for.
UniqueFd ChunkFd(int index) {
  UniqueFd fd(::memfd_create("chunk", MFD_CLOEXEC));
  const std::string text = "chunk " + std::to_string(index);
  EXPECT_EQ(::write(fd.get(), text.data(), text.size()), static_cast<ssize_t>(text.size()));
  return fd;
}

std::string ContentOf(const UniqueFd& fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd.get(), buf, sizeof(buf) - 1, 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

// Serves one chunked layout; exports the fds of its first `exported` chunks. Never a version.
class ChunkedSource final : public transport::link::VersionSource {
 public:
  ChunkedSource(wire::Welcome welcome, int exported)
      : welcome_(std::move(welcome)), exported_(exported) {}
  Result<std::pair<const wire::Welcome*, int>> WaitLayout(const util::Deadline&,
                                                          const std::function<bool()>&) override {
    return std::make_pair(static_cast<const wire::Welcome*>(&welcome_), -1);
  }
  Result<UniqueFd> ExportAllocationFd(uint32_t index) override {
    if (static_cast<int>(index) >= exported_) {
      return Status::Internal("chunk ", index, " cannot be exported");
    }
    return ChunkFd(static_cast<int>(index));
  }
  Result<transport::link::Pin> Acquire(const wire::UpdateRequest&, const util::Deadline&,
                                       const std::function<bool()>&) override {
    return Status::Unavailable("no versions");
  }
  Status Unpin(const transport::link::Pin&, wire::StepEnd*) override { return Status::Ok(); }
  const uint8_t* arena_base() const override { return nullptr; }

 private:
  wire::Welcome welcome_;
  int exported_;
};

struct Served {
  std::unique_ptr<transport::link::Server> server;
  transport::link::Endpoint endpoint;
};

Served Serve(ChunkedSource* source) {
  Served s;
  auto endpoint = transport::link::ParseEndpoint(testing::UniqueEndpoint("allocation-fd"));
  EXPECT_TRUE(endpoint.ok()) << endpoint.status();
  s.endpoint = *endpoint;
  transport::link::ServerOptions options;
  options.timeout = milliseconds(3000);
  auto server = transport::link::StartServer(s.endpoint, options, source);
  EXPECT_TRUE(server.ok()) << server.status();
  if (server.ok()) s.server = std::move(server).value();
  return s;
}

TEST(AllocationFds, EveryChunkFdArrivesInWelcomeOrder) {
  const LedgerSnapshot before = ReadLedger();
  {
    ChunkedSource source(ChunkedWelcome(3), 3);
    Served served = Serve(&source);
    ASSERT_NE(served.server, nullptr);
    std::unique_ptr<transport::link::Link> link = transport::link::NewUnixLink(served.endpoint);
    ASSERT_OK(link->Connect(util::Deadline(milliseconds(3000))).status());
    std::vector<UniqueFd> fds = link->TakeAllocationFds();
    ASSERT_EQ(fds.size(), 3u);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(ContentOf(fds[i]), "chunk " + std::to_string(i));
    EXPECT_TRUE(link->TakeAllocationFds().empty()) << "taken once";
    ASSERT_OK(link->Release());
    ASSERT_OK(served.server->Close());
  }
  LedgerSnapshot last;
  EXPECT_TRUE(testing::LedgerSettlesTo(before, &last)) << last.ToString();
}

// A chunk the publisher cannot export ends the session with its reason, not a subscriber left
// waiting for the frame.
TEST(AllocationFds, AChunkThePublisherCannotExportIsReportedToTheSubscriber) {
  ChunkedSource source(ChunkedWelcome(3), 2);
  Served served = Serve(&source);
  ASSERT_NE(served.server, nullptr);
  std::unique_ptr<transport::link::Link> link = transport::link::NewUnixLink(served.endpoint);
  EXPECT_STATUS_IS(kInternal, link->Connect(util::Deadline(milliseconds(3000))).status(),
                   "chunk 2 cannot be exported");
  ASSERT_OK(served.server->Close());
}

[[noreturn]] void RefuseUnderALowHardLimit() {
  rlimit now{};
  if (::getrlimit(RLIMIT_NOFILE, &now) != 0) std::_Exit(2);
  const rlim_t hard = std::min<rlim_t>(300, now.rlim_max);
  const rlimit low{hard, hard};
  if (::setrlimit(RLIMIT_NOFILE, &low) != 0) std::_Exit(2);
  const Status s = FdRoomFor(1000);
  const bool named = s.code() == StatusCode::kResourceExhausted &&
                     s.message().find("hard limit is " + std::to_string(hard)) != std::string::npos;
  std::_Exit(named ? 0 : 1);
}

// When the hard limit leaves no room, the subscriber says so before any chunk arrives (in a
// child process: a lowered hard limit cannot be raised again).
TEST(AllocationFds, AHardOpenFileLimitTooLowIsRefusedNamingIt) {
  EXPECT_EXIT(RefuseUnderALowHardLimit(), ::testing::ExitedWithCode(0), "");
}

// A raw publisher on the endpoint's socket: answers the Hello with `welcome`, then runs `send`.
void RawPublisher(const transport::link::Endpoint& endpoint, const wire::Welcome& welcome,
                  const std::function<void(Channel&)>& send, const std::function<void()>& connect) {
  UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", endpoint.socket_path.c_str());
  ::unlink(endpoint.socket_path.c_str());
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener.get(), 1), 0);
  std::thread publisher([&] {
    UniqueFd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    Channel ch(std::move(conn), "raw subscriber");
    const util::Deadline deadline(milliseconds(3000));
    if (!ch.Receive(deadline).ok()) return;  // the Hello
    if (!ch.Send(wire::FrameType::kWelcome, welcome, deadline).ok()) return;
    send(ch);
    (void)ch.Receive(util::Deadline(milliseconds(3000)));  // until the subscriber leaves
  });
  connect();
  publisher.join();
  ::unlink(endpoint.socket_path.c_str());
}

// Every chunk's fd is held until all are imported: a soft open-file limit too low for them is
// raised (as far as the hard limit allows) before they arrive. The raw publisher holds its frames
// back until the limit moved, so only the subscriber's raise can make that room.
TEST(AllocationFds, ASoftOpenFileLimitTooLowForTheChunksIsRaisedBeforeTheyArrive) {
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < 2048) GTEST_SKIP() << "hard limit";
  auto endpoint = transport::link::ParseEndpoint(testing::UniqueEndpoint("raw-fd-limit"));
  ASSERT_OK(endpoint.status());
  constexpr int kChunks = 600;
  constexpr rlim_t kLow = 256;  // fewer than the chunks
  Status connected;
  rlimit raised{};
  std::vector<UniqueFd> fds;
  const rlimit low{kLow, saved.rlim_max};
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  RawPublisher(
      *endpoint, ChunkedWelcome(kChunks),
      [&](Channel& ch) {
        for (int wait = 0; wait < 300; ++wait) {
          rlimit now{};
          if (::getrlimit(RLIMIT_NOFILE, &now) == 0 && now.rlim_cur > kLow) break;
          std::this_thread::sleep_for(milliseconds(10));
        }
        const util::Deadline deadline(milliseconds(5000));
        for (uint32_t i = 0; i < kChunks; ++i) {
          UniqueFd fd = ChunkFd(static_cast<int>(i));
          if (!ch.Send(wire::FrameType::kAllocationFd, wire::AllocationFd{i}, deadline, fd.get())
                   .ok()) {
            return;
          }
        }
      },
      [&] {
        std::unique_ptr<transport::link::Link> link = transport::link::NewUnixLink(*endpoint);
        connected = link->Connect(util::Deadline(milliseconds(10000))).status();
        ::getrlimit(RLIMIT_NOFILE, &raised);
        fds = link->TakeAllocationFds();
        (void)link->Release();
      });
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_OK(connected);
  ASSERT_EQ(fds.size(), static_cast<size_t>(kChunks));
  EXPECT_GT(raised.rlim_cur, static_cast<rlim_t>(kChunks));
  EXPECT_EQ(ContentOf(fds.back()), "chunk " + std::to_string(kChunks - 1));
}

TEST(AllocationFds, TheSubscriberRefusesFramesOutOfOrderOrWithoutTheirFd) {
  auto endpoint = transport::link::ParseEndpoint(testing::UniqueEndpoint("raw-allocation-fd"));
  ASSERT_OK(endpoint.status());
  const wire::Welcome welcome = ChunkedWelcome(2);
  struct Case {
    std::string name;
    std::function<void(Channel&)> send;
    std::string error;
  };
  const util::Deadline deadline(milliseconds(3000));
  const std::vector<Case> cases = {
      {"out of order",
       [&](Channel& ch) {
         UniqueFd fd = ChunkFd(1);
         (void)ch.Send(wire::FrameType::kAllocationFd, wire::AllocationFd{1}, deadline, fd.get());
       },
       "allocation fd frame 1 where chunk 0 of 2 was due"},
      {"no fd",
       [&](Channel& ch) {
         UniqueFd fd = ChunkFd(0);
         (void)ch.Send(wire::FrameType::kAllocationFd, wire::AllocationFd{0}, deadline, fd.get());
         (void)ch.Send(wire::FrameType::kAllocationFd, wire::AllocationFd{1}, deadline);
       },
       "allocation fd frame 1 of 2 carried no fd"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const LedgerSnapshot before = ReadLedger();
    RawPublisher(*endpoint, welcome, c.send, [&] {
      std::unique_ptr<transport::link::Link> link = transport::link::NewUnixLink(*endpoint);
      EXPECT_STATUS_IS(kProtocolError, link->Connect(deadline).status(), c.error);
      ASSERT_OK(link->Release());
    });
    LedgerSnapshot last;
    EXPECT_TRUE(testing::LedgerSettlesTo(before, &last)) << last.ToString();
  }
}

}  // namespace
}  // namespace weightsync
