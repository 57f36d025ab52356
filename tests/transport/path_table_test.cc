// The path table's choice where it depends on the Welcome's form, without a GPU: a zero-copy or
// ring GPU publisher over tcp goes to its nccl row; the zero-copy layout made for tcp (no
// allocation exported) is refused on a local socket, where there would be nothing to open.
#include "transport/path_table.h"

#include <gtest/gtest.h>

#include "testing/test_util.h"

namespace weightsync {
namespace {

using transport::ChoosePath;

// One 4 KiB float32 tensor of a publisher whose store is `kind` on cuda:0.
wire::Welcome GpuWelcome(wire::ArenaKind kind) {
  wire::Welcome w;
  w.session_id = 1;
  w.lineage = "path-table-test";
  w.segment_bytes = 1024;
  w.arena_kind = kind;
  w.device = 0;
  w.digest_kind = wire::DigestKind::kGpu64;
  wire::TensorPlacement t;
  t.spec = {"w", DType::kFloat32, {1024}, 4096};
  if (kind == wire::ArenaKind::kCudaIpc) {  // the tcp form: no allocation listed
    t.region = wire::Region::kDirect;
    w.slot_count = 2;
    w.direct_bytes = w.arena_bytes = 4096;
  } else {  // a ring of two 4 KiB buckets, one a version
    t.region = wire::Region::kSlot;
    w.slot_count = 2;
    w.slot_bytes = 4096;
    w.version_buckets = 1;
    w.arena_bytes = 8192;
  }
  w.tensors = {t};
  return w;
}

std::vector<plan::Destination> On(Device device) {
  return {{{"w", DType::kFloat32, {1024}, 4096}, nullptr, device}};
}

const Device kCuda0{Device::Kind::kCUDA, 0};

std::unique_ptr<transport::link::Link> LinkTo(const std::string& endpoint) {
  auto parsed = transport::link::ParseEndpoint(endpoint);
  EXPECT_OK(parsed);
  return transport::link::NewLink(*parsed, SubscriberOptions{});
}

TEST(PathTable, ZeroCopyAndRingGpuPublishersOverTcpGoToTheirNcclRows) {
  auto tcp = LinkTo("tcp://127.0.0.1:1");
  const wire::Welcome zero = GpuWelcome(wire::ArenaKind::kCudaIpc);
  ASSERT_OK(plan::ValidateLayout(zero));
  ASSERT_OK_AND_ASSIGN(const transport::PathEntry* entry, ChoosePath(*tcp, zero, On(kCuda0)));
  EXPECT_EQ(entry->name, "nccl-zero-copy");
  const wire::Welcome ring = GpuWelcome(wire::ArenaKind::kCudaRing);
  ASSERT_OK(plan::ValidateLayout(ring));
  ASSERT_OK_AND_ASSIGN(entry, ChoosePath(*tcp, ring, On(kCuda0)));
  EXPECT_EQ(entry->name, "nccl-ring");
  // Into host memory no path moves a GPU publisher's tensors over tcp.
  EXPECT_STATUS_IS(kNotSupported, ChoosePath(*tcp, zero, On(Device{})),
                   "its own GPU tensors (zero-copy, cuda:0)", "over tcp into host memory",
                   "destination 'w' is on cpu");
}

// A host store over tcp: into host memory the tcp row, into CUDA tensors tcp-to-gpu (through a
// pinned host mirror), and into both at once no path.
TEST(PathTable, AHostStoreOverTcpGoesToTcpOrTcpToGpuByItsDestinations) {
  auto tcp = LinkTo("tcp://127.0.0.1:1");
  wire::Welcome host;
  host.arena_kind = wire::ArenaKind::kHostMemfd;
  ASSERT_OK_AND_ASSIGN(const transport::PathEntry* entry, ChoosePath(*tcp, host, On(Device{})));
  EXPECT_EQ(entry->name, "tcp");
  ASSERT_OK_AND_ASSIGN(entry, ChoosePath(*tcp, host, On(kCuda0)));
  EXPECT_EQ(entry->name, "tcp-to-gpu");
  host.arena_kind = wire::ArenaKind::kHostRing;
  ASSERT_OK_AND_ASSIGN(entry, ChoosePath(*tcp, host, On(kCuda0)));
  EXPECT_EQ(entry->name, "tcp-to-gpu");
  std::vector<plan::Destination> mixed = On(kCuda0);
  mixed.push_back({{"b", DType::kFloat32, {4}, 16}, nullptr, Device{}});
  EXPECT_STATUS_IS(kNotSupported, ChoosePath(*tcp, host, mixed), "over tcp into host and CUDA",
                   "'b' is on cpu");
}

TEST(PathTable, ALocalSubscriberRefusesAZeroCopyLayoutWithoutAllocations) {
  auto local = LinkTo("local://path-table-test");
  wire::Welcome zero = GpuWelcome(wire::ArenaKind::kCudaIpc);
  EXPECT_STATUS_IS(kProtocolError, ChoosePath(*local, zero, On(kCuda0)),
                   "zero-copy welcome on a local socket names none of the publisher's CUDA "
                   "allocations");
  zero.allocations = {{0, 4096, {}}};  // as a local publisher exports it
  ASSERT_OK(plan::ValidateLayout(zero));
  ASSERT_OK_AND_ASSIGN(const transport::PathEntry* entry, ChoosePath(*local, zero, On(kCuda0)));
  EXPECT_EQ(entry->name, "cuda-ipc-zero-copy");
}

}  // namespace
}  // namespace weightsync
