// Publisher semantics that need no subscriber process: a first Publish that fails late in its
// setup and is retried builds its work once (each byte copied once per step, the arena sealed
// once).
#include <gtest/gtest.h>

#include "testing/local_pair.h"
#include "util/fail_point.h"

namespace weightsync {
namespace {

using testing::LocalPair;
using testing::SyntheticModel;
using util::FailAction;
using util::FailPoints;

TEST(PublisherRetry, AFirstPublishThatFailedLateIsRetriedAndCopiesEachByteOnce) {
  FailPoints::DisarmAll();
  LocalPair p;
  p.Start();
  FailPoints::Arm("publisher.freeze", FailAction::kError, 0, 1);
  p.model.Fill(1);
  Result<PublishStats> first = p.publisher->Publish(1);
  ASSERT_EQ(FailPoints::Hits("publisher.freeze"), 1) << "fault never injected";
  ASSERT_STATUS_IS(kInternal, first);
  EXPECT_EQ(p.publisher->latest_step(), -1);

  // The retry seals the arena it sealed already and plans its copies afresh.
  for (int64_t step : {1, 2}) {
    p.model.Fill(step);
    Result<PublishStats> stats = p.publisher->Publish(step);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->bytes_copied, p.model.total_bytes()) << "step " << step;
  }
  auto sub = p.Connect();
  Result<UpdateStats> got = sub->Update();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->step, 2);
  std::string why;
  EXPECT_TRUE(SyntheticModel::Holds(p.dst, 2, &why)) << why;
  FailPoints::DisarmAll();
}

}  // namespace
}  // namespace weightsync
