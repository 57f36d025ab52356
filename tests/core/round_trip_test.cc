// In-process publisher and subscriber (real Unix socket, real memfd): round trips, reuse of the
// transfer handle, step semantics, validation.
#include <gtest/gtest.h>

#include "testing/local_pair.h"
#include "testing/test_util.h"
#include "wire/handshake.h"

namespace weightsync {
namespace {

using testing::LocalPair;
using testing::SyntheticModel;

TEST(RoundTrip, PoisonedDestinationsReceiveEveryByte) {
  LocalPair p;
  p.Start();
  p.Publish(1);
  auto sub = p.Connect();
  auto stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->step, 1);
  EXPECT_TRUE(stats->handle_created);
  EXPECT_TRUE(stats->verified);
  EXPECT_EQ(stats->bytes, p.model.total_bytes());
  std::string why;
  EXPECT_TRUE(SyntheticModel::Holds(p.dst, 1, &why)) << why;
}

TEST(RoundTrip, HandleCreatedOnceOverManyUpdates) {
  LocalPair p;
  p.Start();
  auto sub = p.Connect(UpdateMode::kStaged, /*verify=*/false);
  for (int step = 1; step <= 1000; ++step) {
    p.Publish(step);
    auto stats = sub->Update();
    ASSERT_TRUE(stats.ok()) << stats.status();
    ASSERT_EQ(stats->step, step);
    ASSERT_EQ(stats->handle_created, step == 1);
    ASSERT_EQ(stats->prepare_count, 1u);
  }
  std::string why;
  EXPECT_TRUE(SyntheticModel::Holds(p.dst, 1000, &why)) << why;
}

// Until the peer is authenticated a channel takes only handshake-sized frames
// (wire::kMaxHandshakePayloadBytes, 4 KiB); afterwards the Welcome and StepEnd frames of a real
// model are larger than that, over shm and over tcp alike.
TEST(RoundTrip, FramesLargerThanTheHandshakeBoundFlowOnceThePeerIsAuthenticated) {
  constexpr int kTensors = 600;
  // At least 22 encoded bytes per Welcome tensor; at least one 8-byte digest per (non-empty)
  // tensor in the StepEnd.
  static_assert(kTensors * 22 > wire::kMaxHandshakePayloadBytes);
  static_assert(kTensors * 8 > wire::kMaxHandshakePayloadBytes);
  for (const std::string& endpoint : {std::string(""), std::string("tcp://127.0.0.1:0")}) {
    SCOPED_TRACE(endpoint.empty() ? "shm" : "tcp");
    LocalPair p{.model = SyntheticModel(kTensors, 256)};
    if (!endpoint.empty()) p.endpoint = endpoint;
    ASSERT_NO_FATAL_FAILURE(p.Start());
    for (int64_t step = 1; step <= 2; ++step) {
      ASSERT_NO_FATAL_FAILURE(p.Publish(step));
    }
    auto sub = p.Connect();
    auto stats = sub->Update();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_TRUE(stats->verified);
    std::string why;
    EXPECT_TRUE(SyntheticModel::Holds(p.dst, 2, &why)) << why;
  }
}

}  // namespace
}  // namespace weightsync
