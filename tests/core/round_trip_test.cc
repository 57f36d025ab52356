// In-process publisher and subscriber (real Unix socket, real memfd): round trips, reuse of the
// transfer handle, step semantics, validation.
#include <gtest/gtest.h>

#include "testing/test_util.h"
#include "util/fail_point.h"

namespace weightsync {
namespace {

using testing::SyntheticModel;

struct Pair {
  SyntheticModel model{12, 3000};
  std::string endpoint = testing::UniqueEndpoint("rt");
  std::unique_ptr<Publisher> publisher;
  std::vector<NamedTensor> tensors = model.Tensors();
  std::vector<std::vector<uint8_t>> storage = SyntheticModel::PoisonedStorage(tensors);
  std::vector<NamedTensor> dst = SyntheticModel::Views(tensors, storage);

  std::unique_ptr<Subscriber> Connect(UpdateMode mode = UpdateMode::kStaged, bool verify = true) {
    SubscriberOptions o;
    o.endpoint = endpoint;
    o.mode = mode;
    o.verify = verify;
    o.timeout = std::chrono::milliseconds(5000);
    auto s = Subscriber::Create(o);
    EXPECT_TRUE(s.ok()) << s.status();
    EXPECT_OK((*s)->Register(dst));
    return std::move(s).value();
  }
  void Start(int slots = 2) {
    PublisherOptions o;
    o.endpoint = endpoint;
    o.slots = slots;
    o.segment_bytes = 4096;  // many segments even for a small model
    auto p = Publisher::Create(o);
    ASSERT_TRUE(p.ok()) << p.status();
    publisher = std::move(p).value();
    ASSERT_OK(publisher->Register(tensors));
  }
  void Publish(int64_t step) {
    model.Fill(step);
    auto r = publisher->Publish(step);
    ASSERT_TRUE(r.ok()) << r.status();
  }
};

TEST(RoundTrip, PoisonedDestinationsReceiveEveryByte) {
  Pair p;
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
  Pair p;
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
