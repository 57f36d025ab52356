// Changing what a subscriber writes: after Sleep() an engine that freed and re-allocated its
// weights registers the new memory under the same names (or unregisters some), and the next update
// writes only the new memory — even when the step is the one it committed. Tied weights (one
// memory under two names) are copied once on publish and written once on update. Real publishers
// over real Unix sockets + shared memory, and over TCP loopback.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "testing/test_util.h"
#include "testing/transport_modes.h"

namespace weightsync {
namespace {

using testing::SyntheticModel;

class Registration : public ::testing::TestWithParam<testing::TransportMode> {
 protected:
  void StartPublisher(const std::vector<NamedTensor>& tensors) {
    PublisherOptions o;
    o.endpoint =
        GetParam().tcp ? std::string("tcp://127.0.0.1:0") : testing::UniqueEndpoint("registration");
    o.segment_bytes = 4096;
    ASSERT_OK_AND_ASSIGN(publisher_, Publisher::Create(o));
    ASSERT_OK(publisher_->Register(tensors));
  }
  std::unique_ptr<Subscriber> Connect(MatchPolicy policy = MatchPolicy::kStrict) {
    SubscriberOptions o;
    o.endpoint = publisher_->endpoint();
    o.mode = GetParam().mode;
    o.policy = policy;
    o.verify = true;
    o.timeout = std::chrono::milliseconds(5000);
    auto s = Subscriber::Create(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(s).value();
  }
  Result<PublishStats> Publish(int64_t step) {
    model_.Fill(step);
    return publisher_->Publish(step);
  }
  static bool AllBytesAre(const std::vector<std::vector<uint8_t>>& storage, uint8_t value) {
    for (const auto& t : storage) {
      for (uint8_t b : t) {
        if (b != value) return false;
      }
    }
    return true;
  }

  SyntheticModel model_{12, 3000};
  std::vector<NamedTensor> tensors_ = model_.Tensors();
  std::unique_ptr<Publisher> publisher_;
};

TEST_P(Registration, ReRegisteredMemoryAfterSleepIsWhatTheNextUpdateWritesAndTheOldIsNeverTouched) {
  StartPublisher(tensors_);
  auto old_storage = SyntheticModel::PoisonedStorage(tensors_);
  auto old_views = SyntheticModel::Views(tensors_, old_storage);
  auto sub = Connect();
  ASSERT_OK(sub->Register(old_views));
  ASSERT_OK(Publish(1));
  ASSERT_OK(sub->Update());

  // The engine sleeps, frees its weights (here: marks them) and re-allocates them elsewhere.
  ASSERT_OK(sub->Sleep());
  for (auto& t : old_storage) std::memset(t.data(), 0xAB, t.size());
  auto new_storage = SyntheticModel::PoisonedStorage(tensors_);
  auto new_views = SyntheticModel::Views(tensors_, new_storage);
  ASSERT_OK(sub->Register(new_views));

  // Same step as committed: still moved, into the new memory only.
  Result<UpdateStats> stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->step, 1);
  EXPECT_FALSE(stats->up_to_date) << "the new memory does not hold step 1 yet";
  std::string why;
  EXPECT_TRUE(SyntheticModel::Holds(new_views, 1, &why)) << why;
  EXPECT_TRUE(AllBytesAre(old_storage, 0xAB)) << "the old memory was written";
  ASSERT_OK(Publish(2));
  ASSERT_OK(sub->Update());
  EXPECT_TRUE(SyntheticModel::Holds(new_views, 2, &why)) << why;
  EXPECT_TRUE(AllBytesAre(old_storage, 0xAB)) << "the old memory was written";
}

TEST_P(Registration, ARegistrationRefusedForItsShapeIsCorrectedByRegisteringAgain) {
  StartPublisher(tensors_);
  auto storage = SyntheticModel::PoisonedStorage(tensors_);
  auto views = SyntheticModel::Views(tensors_, storage);
  const std::vector<int64_t> right = views[3].view.shape;
  views[3].view.shape.insert(views[3].view.shape.begin(), 1);  // [1, ...]: same bytes
  auto sub = Connect();
  ASSERT_OK(sub->Register(views));
  ASSERT_OK(Publish(1));
  Result<UpdateStats> stats = sub->Update();
  ASSERT_STATUS_IS(kInvalidArgument, stats, "shape mismatch");
  views[3].view.shape = right;
  ASSERT_OK(sub->Register({views[3]}));
  ASSERT_OK(sub->Update());
  std::string why;
  EXPECT_TRUE(SyntheticModel::Holds(views, 1, &why)) << why;
}

TEST_P(Registration, UnregisteredDestinationsAreNoLongerWritten) {
  StartPublisher(tensors_);
  auto storage = SyntheticModel::PoisonedStorage(tensors_);
  auto views = SyntheticModel::Views(tensors_, storage);
  auto sub = Connect(MatchPolicy::kSubset);
  ASSERT_OK(sub->Register(views));
  ASSERT_OK(Publish(1));
  ASSERT_OK(sub->Update());
  ASSERT_STATUS_IS(kFailedPrecondition, sub->Unregister({views[0].name}));  // still prepared
  ASSERT_OK(sub->Sleep());
  ASSERT_STATUS_IS(kNotFound, sub->Unregister({views[0].name, "no.such.tensor"}));
  ASSERT_OK(sub->Unregister({views[0].name}));
  std::memset(storage[0].data(), 0xAB, storage[0].size());
  ASSERT_OK(Publish(2));
  Result<UpdateStats> stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->tensors, tensors_.size() - 1);
  EXPECT_TRUE(AllBytesAre({storage[0]}, 0xAB));
  std::string why;
  EXPECT_TRUE(SyntheticModel::Holds({views.begin() + 1, views.end()}, 2, &why)) << why;
}

TEST_P(Registration, TiedWeightsAreCopiedOnceAndWrittenOnce) {
  // The trainer's state dict names one embedding twice ("embed" and "lm_head", same memory).
  std::vector<NamedTensor> trainer = tensors_;
  NamedTensor tied = trainer[5];
  tied.name = "lm_head.weight";
  trainer.push_back(tied);
  StartPublisher(trainer);
  Result<PublishStats> published = Publish(1);
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_EQ(published->bytes_copied, model_.total_bytes()) << "the tied tensor was copied twice";

  // A tied engine: its destinations share memory the same way.
  auto storage = SyntheticModel::PoisonedStorage(tensors_);
  auto views = SyntheticModel::Views(tensors_, storage);
  NamedTensor engine_tied = views[5];
  engine_tied.name = "lm_head.weight";
  views.push_back(engine_tied);
  auto sub = Connect();
  ASSERT_OK(sub->Register(views));
  Result<UpdateStats> stats = sub->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->bytes, model_.total_bytes()) << "the tied tensor was moved twice";
  std::string why;
  EXPECT_TRUE(SyntheticModel::Holds({views.begin(), views.end() - 1}, 1, &why)) << why;

  // An untied engine (separate memory for both names) still gets both, bit-exact.
  auto untied_storage = SyntheticModel::PoisonedStorage(trainer);
  auto untied_views = SyntheticModel::Views(trainer, untied_storage);
  auto untied = Connect();
  ASSERT_OK(untied->Register(untied_views));
  ASSERT_OK(Publish(2));
  stats = untied->Update();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->bytes, model_.total_bytes() + tied.view.NumBytes().value());
  EXPECT_EQ(
      std::memcmp(untied_storage[5].data(), untied_storage.back().data(), untied_storage[5].size()),
      0);
  EXPECT_TRUE(SyntheticModel::Holds({untied_views.begin(), untied_views.end() - 1}, 2, &why))
      << why;
}

// An engine that mirrors the published manifest (allocating a buffer per name) learns from it which
// names are one tensor, gives an alias its original's memory, and so receives the bytes once.
TEST_P(Registration, ThePublishedManifestNamesTiedWeightsSoAMirroringEngineReceivesThemOnce) {
  std::vector<NamedTensor> trainer = tensors_;
  NamedTensor tied = trainer[5];
  tied.name = "lm_head.weight";
  trainer.push_back(tied);
  StartPublisher(trainer);
  ASSERT_OK(Publish(1));
  auto sub = Connect();
  ASSERT_OK_AND_ASSIGN(Manifest published, sub->PublishedManifest());
  ASSERT_EQ(published.size(), trainer.size());
  for (const TensorSpec& spec : published.tensors()) {
    EXPECT_EQ(spec.alias_of, spec.name == "lm_head.weight" ? trainer[5].name : "") << spec.name;
  }
  // The allocate loop: one buffer per original, an alias registered over its original's buffer.
  std::vector<std::vector<uint8_t>> storage;
  std::vector<NamedTensor> views;
  for (const TensorSpec& spec : published.tensors()) {
    if (!spec.alias_of.empty()) {
      const int64_t original = published.Find(spec.alias_of);
      ASSERT_GE(original, 0);
      views.push_back({spec.name, views[original].view});
      continue;
    }
    storage.emplace_back(spec.nbytes, 0xFF);
    views.push_back({spec.name, TensorView{storage.back().data(), spec.dtype, spec.shape}});
  }
  ASSERT_OK(sub->Register(views));
  ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub->Update());
  EXPECT_EQ(stats.bytes, model_.total_bytes()) << "the tied tensor was moved twice";
  std::string why;
  EXPECT_TRUE(SyntheticModel::Holds({views.begin(), views.end() - 1}, 1, &why)) << why;
}

TEST_P(Registration, OverlappingDestinationsAreRefusedAtRegister) {
  StartPublisher(tensors_);
  auto storage = SyntheticModel::PoisonedStorage(tensors_);
  auto views = SyntheticModel::Views(tensors_, storage);
  views[4].view.data = static_cast<uint8_t*>(views[3].view.data) + 8;  // inside tensor 3
  auto sub = Connect();
  Status s = sub->Register(views);
  ASSERT_STATUS_IS(kInvalidArgument, s,
                   "'" + views[4].name + "' overlaps tensor '" + views[3].name + "'");
}

INSTANTIATE_TEST_SUITE_P(Transports, Registration, testing::AllTransportModes(),
                         testing::TransportModeName);

}  // namespace
}  // namespace weightsync
