// In-process publisher and subscriber (real Unix socket, real memfd): round trips, reuse of the
// transfer handle, step semantics, validation.
#include <gtest/gtest.h>

#include "testing/test_util.h"
#include "testing/local_pair.h"

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

}  // namespace
}  // namespace weightsync
