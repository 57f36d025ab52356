// A zero-copy publisher's Welcome for local subscribers carries CUDA IPC handles (and cuMem chunk
// fds follow it), bearer secrets of its host: the tcp server never sends one. A zero-copy
// publisher on a tcp endpoint exports nothing (its Welcome lists no allocation, NCCL reads its
// tensors); this is the server's own guard, driven here by a version source whose layout is the
// local one, against a real subscriber over loopback tcp.
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

wire::Welcome ZeroCopyLayout() {
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
  return w;
}

// Serves `layout` over loopback tcp to a subscriber of one host tensor: its first Update.
Status FirstUpdateOf(const wire::Welcome& layout, std::vector<float>* dst) {
  FixedLayout source(layout);
  auto endpoint = transport::link::ParseEndpoint("tcp://127.0.0.1:0");
  if (!endpoint.ok()) return endpoint.status();
  transport::link::ServerOptions options;
  options.timeout = std::chrono::milliseconds(3000);
  auto server = transport::link::StartServer(*endpoint, options, &source);
  if (!server.ok()) return server.status();
  SubscriberOptions o;
  o.endpoint = (*server)->bound().ToString();
  o.timeout = std::chrono::milliseconds(3000);
  auto sub = testing::NewSubscriber(o, {{"w", {dst->data(), DType::kFloat32, {4}}}});
  Status s = sub->Update().status();
  EXPECT_OK((*server)->Close());
  return s;
}

TEST(TcpServer, NeverSendsAZeroCopyLayoutAndTheSubscriberIsToldWhy) {
  std::vector<float> dst(4, -1.0f);
  // Without the guard the Welcome arrives and the subscriber finds no data path for it instead.
  EXPECT_STATUS_IS(kFailedPrecondition, FirstUpdateOf(ZeroCopyLayout(), &dst),
                   "a zero-copy publisher that exported its CUDA allocations",
                   "never sends them over tcp", "1 allocation(s)");
  EXPECT_EQ(dst, std::vector<float>(4, -1.0f));
}

// The form a zero-copy publisher on a tcp endpoint makes (nothing exported) is served: this
// subscriber gets the Welcome and is told that no path moves GPU tensors into its host memory.
TEST(TcpServer, ServesTheZeroCopyLayoutThatListsNoAllocation) {
  wire::Welcome w = ZeroCopyLayout();
  w.allocations.clear();
  w.device = 0;
  w.digest_kind = wire::DigestKind::kGpu64;
  std::vector<float> dst(4, -1.0f);
  EXPECT_STATUS_IS(kNotSupported, FirstUpdateOf(w, &dst), "its own GPU tensors (zero-copy, cuda:0)",
                   "over tcp into host memory");
  EXPECT_EQ(dst, std::vector<float>(4, -1.0f));
}

}  // namespace
}  // namespace weightsync
