// A zero-copy publisher's Welcome carries CUDA IPC handles, bearer secrets of its host: the tcp
// server never sends one. Publisher::Create refuses zero_copy over tcp (tests/core/
// publisher_test.cc); this is the server's own guard, driven here by a version source whose layout
// is a zero-copy one, against a real subscriber over loopback tcp.
#include <gtest/gtest.h>

#include <memory>

#include "testing/test_util.h"
#include "transport/link/server.h"
#include "weightsync/weightsync.h"

namespace weightsync {
namespace {

// Serves one fixed layout; never a version.
class FixedLayout final : public transport::link::VersionSource {
 public:
  explicit FixedLayout(wire::Welcome welcome) : welcome_(std::move(welcome)) {}
  Result<std::pair<const wire::Welcome*, int>> WaitLayout(const util::Deadline&,
                                                          const std::function<bool()>&) override {
    return std::make_pair(static_cast<const wire::Welcome*>(&welcome_), -1);
  }
  Result<util::UniqueFd> ExportAllocationFd(uint32_t) override {
    return Status::Unavailable("no chunks");
  }
  Result<transport::link::Pin> Acquire(const wire::UpdateRequest&, const util::Deadline&,
                                       const std::function<bool()>&) override {
    return Status::Unavailable("no versions");
  }
  Status Unpin(const transport::link::Pin&, wire::StepEnd*) override { return Status::Ok(); }
  const uint8_t* arena_base() const override { return nullptr; }

 private:
  wire::Welcome welcome_;
};

TEST(TcpServer, NeverSendsAZeroCopyLayoutAndTheSubscriberIsToldWhy) {
  wire::Welcome w;
  w.session_id = 1;
  w.lineage = "zero-copy-test";
  w.segment_bytes = 64;
  w.arena_kind = wire::ArenaKind::kCudaIpc;
  w.slot_count = 1;
  w.direct_bytes = w.arena_bytes = 4096;
  w.allocations = {{0, 4096, {}}};
  w.allocations[0].ipc_handle.fill(0xAB);
  wire::TensorPlacement t;
  t.spec = {"w", DType::kFloat32, {4}, 16};
  t.region = wire::Region::kDirect;
  w.tensors = {t};
  FixedLayout source(w);
  ASSERT_OK_AND_ASSIGN(auto endpoint, transport::link::ParseEndpoint("tcp://127.0.0.1:0"));
  transport::link::ServerOptions options;
  options.timeout = std::chrono::milliseconds(3000);
  ASSERT_OK_AND_ASSIGN(auto server, transport::link::StartServer(endpoint, options, &source));

  std::vector<float> dst(4, -1.0f);
  SubscriberOptions o;
  o.endpoint = server->bound().ToString();
  o.timeout = std::chrono::milliseconds(3000);
  auto sub = testing::NewSubscriber(o, {{"w", {dst.data(), DType::kFloat32, {4}}}});
  // Without the guard the Welcome arrives and the subscriber finds no data path for it instead.
  EXPECT_STATUS_IS(kFailedPrecondition, sub->Update(),
                   "a zero-copy publisher serves subscribers on its own host only");
  EXPECT_EQ(dst, std::vector<float>(4, -1.0f));
  ASSERT_OK(server->Close());
}

}  // namespace
}  // namespace weightsync
