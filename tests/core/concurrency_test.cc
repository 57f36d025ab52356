// What a Subscriber says about itself may be read from any thread while another updates (Python's
// binding reads committed_step/weights_valid on the caller's thread while its worker thread runs
// Update). Under TSan (CI) an unsynchronized read is a reported race; here the values read must
// also make sense: the committed step only moves forward.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "testing/local_pair.h"

namespace weightsync {
namespace {

TEST(SubscriberConcurrency, StateIsReadableFromAnyThreadDuringUpdates) {
  testing::LocalPair p;
  p.Start();
  auto sub = p.Connect(UpdateMode::kInPlace, /*verify=*/false);
  std::atomic<bool> done{false};
  int64_t reads = 0;
  bool went_back = false;
  std::thread reader([&] {
    int64_t last = -1;
    while (!done.load(std::memory_order_acquire)) {
      const int64_t step = sub->committed_step();
      (void)sub->weights_valid();
      (void)sub->committed_lineage();
      went_back = went_back || step < last;
      last = step;
      ++reads;
    }
  });
  constexpr int64_t kSteps = 100;
  for (int64_t step = 1; step <= kSteps; ++step) {
    p.Publish(step);
    Result<UpdateStats> stats = sub->Update();
    ASSERT_TRUE(stats.ok()) << stats.status();
  }
  done.store(true, std::memory_order_release);
  reader.join();
  EXPECT_FALSE(went_back) << "committed_step() went backwards";
  EXPECT_GT(reads, 0);
  EXPECT_EQ(sub->committed_step(), kSteps);
  EXPECT_EQ(sub->committed_lineage(), p.publisher->lineage());
}

}  // namespace
}  // namespace weightsync
