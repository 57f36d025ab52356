// The weights check (Subscriber::CheckWeights, UpdateOptions::check_weights): the destinations'
// own memory digested after the commit and compared with the publisher's digests of the committed
// version. A byte the engine (or anything else) changed afterwards is named with its tensor and
// range, the weights are marked invalid, and the next update rewrites them even at the committed
// step ("corrupt, then restore"). Real publishers over Unix sockets + shared memory and over TCP,
// staged and in place; several publishers; converted and region destinations counted unchecked.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "testing/regions.h"
#include "testing/test_util.h"
#include "testing/transport_modes.h"

namespace weightsync {
namespace {

using testing::SyntheticModel;

class WeightsCheckTest : public ::testing::TestWithParam<testing::TransportMode> {
 protected:
  void SetUp() override {
    PublisherOptions o;
    o.endpoint =
        GetParam().tcp ? std::string("tcp://127.0.0.1:0") : testing::UniqueEndpoint("check");
    o.segment_bytes = 4096;
    ASSERT_OK_AND_ASSIGN(publisher_, Publisher::Create(o));
    ASSERT_OK(publisher_->Register(tensors_));
    SubscriberOptions so;
    so.endpoint = publisher_->endpoint();
    so.mode = GetParam().mode;
    so.timeout = std::chrono::milliseconds(5000);
    sub_ = testing::NewSubscriber(so, dst_);
  }
  void Publish(int64_t step) {
    model_.Fill(step);
    ASSERT_OK(publisher_->Publish(step));
  }

  SyntheticModel model_{12, 3000};
  std::vector<NamedTensor> tensors_ = model_.Tensors();
  std::vector<std::vector<uint8_t>> storage_ = SyntheticModel::PoisonedStorage(tensors_);
  std::vector<NamedTensor> dst_ = SyntheticModel::Views(tensors_, storage_);
  std::unique_ptr<Publisher> publisher_;
  std::unique_ptr<Subscriber> sub_;
};

TEST_P(WeightsCheckTest, TheCommittedWeightsMatchAndEveryByteIsCounted) {
  ASSERT_STATUS_IS(kFailedPrecondition, sub_->CheckWeights(), "there is none");  // nothing yet
  Publish(1);
  ASSERT_OK(sub_->Update());
  ASSERT_OK_AND_ASSIGN(WeightsCheck check, sub_->CheckWeights());
  EXPECT_EQ(check.step, 1);
  EXPECT_EQ(check.tensors, tensors_.size());
  EXPECT_EQ(check.bytes, model_.total_bytes());
  EXPECT_EQ(check.unchecked_tensors, 0u);
  EXPECT_TRUE(sub_->weights_valid());
}

// Corrupt, then restore: a byte changed after the commit is found and named; the next update
// rewrites every destination although the step is the committed one.
TEST_P(WeightsCheckTest, AChangedByteIsNamedAndTheNextUpdateRestoresIt) {
  Publish(1);
  ASSERT_OK(sub_->Update());
  storage_[1][5000] ^= 0x40;  // the engine's memory, behind the subscriber's back
  storage_[7][0] ^= 0x01;
  Result<WeightsCheck> bad = sub_->CheckWeights();
  ASSERT_STATUS_IS(kCorruption, bad,
                   "step 1: the weights in memory differ from the committed version in 2 of 12 "
                   "tensors",
                   "tensor 'layers.1.weight' bytes [4096, 8192)",
                   "tensor 'layers.7.weight' bytes [0, 4096)", "marked invalid");
  EXPECT_FALSE(sub_->weights_valid());
  EXPECT_EQ(sub_->committed_step(), 1);
  // The latest step is still 1: without the mark the update would say "up to date".
  ASSERT_OK_AND_ASSIGN(UpdateStats restored, sub_->Update());
  EXPECT_FALSE(restored.up_to_date);
  EXPECT_EQ(restored.bytes, model_.total_bytes());
  EXPECT_TRUE(sub_->weights_valid());
  std::string why;
  EXPECT_TRUE(SyntheticModel::Holds(dst_, 1, &why)) << why;
  ASSERT_OK(sub_->CheckWeights());
  ASSERT_OK_AND_ASSIGN(UpdateStats again, sub_->Update());
  EXPECT_TRUE(again.up_to_date);  // restored: nothing more to move
}

TEST_P(WeightsCheckTest, AnUpdateThatChecksReportsItAndRefusesAChangedCommittedVersion) {
  Publish(1);
  UpdateOptions checked;
  checked.check_weights = true;
  ASSERT_OK_AND_ASSIGN(UpdateStats first, sub_->Update(checked));
  EXPECT_TRUE(first.weights_checked);
  ASSERT_OK_AND_ASSIGN(UpdateStats plain, sub_->Update());
  EXPECT_FALSE(plain.weights_checked);
  storage_[0][17] ^= 0xFF;
  // Up to date, but the memory no longer holds the committed version.
  ASSERT_STATUS_IS(kCorruption, sub_->Update(checked), "weights check",
                   "tensor 'layers.0.weight' bytes [0, 4096)");
  EXPECT_FALSE(sub_->weights_valid());
  Publish(2);
  ASSERT_OK_AND_ASSIGN(UpdateStats next, sub_->Update(checked));
  EXPECT_TRUE(next.weights_checked);
  EXPECT_TRUE(sub_->weights_valid());
}

TEST_P(WeightsCheckTest, NeedsThePreparedHandle) {
  Publish(1);
  ASSERT_OK(sub_->Update());
  ASSERT_OK(sub_->Sleep());
  ASSERT_STATUS_IS(kFailedPrecondition, sub_->CheckWeights(), "prepared transfer handle");
  // Prepared again for the same version (up to date), the committed digests still apply.
  ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub_->Update());
  EXPECT_TRUE(stats.up_to_date);
  ASSERT_OK(sub_->CheckWeights());
  ASSERT_OK(sub_->Close());
  ASSERT_STATUS_IS(kFailedPrecondition, sub_->CheckWeights(), "closed");
}

INSTANTIATE_TEST_SUITE_P(Modes, WeightsCheckTest, testing::AllTransportModes(),
                         testing::TransportModeName);

// Tied destinations (one memory under two names) are the original's bytes: checked once.
TEST(WeightsCheck, TiedDestinationsAreCheckedThroughTheirOriginal) {
  SyntheticModel model(4, 1000);
  std::vector<NamedTensor> tensors = model.Tensors();
  NamedTensor tied = tensors[1];
  tied.name = "layers.1.tied";
  tensors.push_back(tied);
  PublisherOptions o;
  o.endpoint = testing::UniqueEndpoint("check-tied");
  ASSERT_OK_AND_ASSIGN(auto pub, Publisher::Create(o));
  ASSERT_OK(pub->Register(tensors));
  model.Fill(1);
  ASSERT_OK(pub->Publish(1));
  auto storage = SyntheticModel::PoisonedStorage(model.Tensors());
  std::vector<NamedTensor> dst = SyntheticModel::Views(model.Tensors(), storage);
  NamedTensor dst_tied = dst[1];
  dst_tied.name = "layers.1.tied";
  dst.push_back(dst_tied);
  SubscriberOptions so;
  so.endpoint = o.endpoint;
  auto sub = testing::NewSubscriber(so, dst);
  ASSERT_OK(sub->Update());
  ASSERT_OK_AND_ASSIGN(WeightsCheck check, sub->CheckWeights());
  EXPECT_EQ(check.tensors, 4u);
  EXPECT_EQ(check.bytes, model.total_bytes());
}

// Several publishers, each delivering a share: every share's destinations checked, every
// differing one named whoever delivered it.
TEST(WeightsCheck, EveryPublishersShareIsCheckedAndEachDifferenceNamed) {
  SyntheticModel model(6, 2000);
  std::vector<NamedTensor> tensors = model.Tensors();
  std::vector<std::unique_ptr<Publisher>> pubs;
  SubscriberOptions so;
  for (int half = 0; half < 2; ++half) {
    PublisherOptions o;
    o.endpoint = testing::UniqueEndpoint("check-share");
    ASSERT_OK_AND_ASSIGN(auto pub, Publisher::Create(o));
    ASSERT_OK(pub->Register({tensors.begin() + 3 * half, tensors.begin() + 3 * half + 3}));
    so.endpoints.push_back(o.endpoint);
    pubs.push_back(std::move(pub));
  }
  model.Fill(1);
  for (auto& pub : pubs) ASSERT_OK(pub->Publish(1));
  auto storage = SyntheticModel::PoisonedStorage(tensors);
  std::vector<NamedTensor> dst = SyntheticModel::Views(tensors, storage);
  auto sub = testing::NewSubscriber(so, dst);
  ASSERT_OK(sub->Update());
  ASSERT_OK_AND_ASSIGN(WeightsCheck check, sub->CheckWeights());
  EXPECT_EQ(check.tensors, 6u);
  EXPECT_EQ(check.bytes, model.total_bytes());
  storage[1][0] ^= 1;
  storage[4][0] ^= 1;
  ASSERT_STATUS_IS(kCorruption, sub->CheckWeights(), "in 2 of 6 tensors",
                   "tensor 'layers.1.weight'", "tensor 'layers.4.weight'");
}

// Bytes no digest describes as they lie — converted in flight — are counted, not compared.
TEST(WeightsCheck, ConvertedDestinationsAreCountedUnchecked) {
  std::vector<float> w(4096, 1.5f), b(64, 2.0f);
  PublisherOptions o;
  o.endpoint = testing::UniqueEndpoint("check-cast");
  ASSERT_OK_AND_ASSIGN(auto pub, Publisher::Create(o));
  ASSERT_OK(pub->Register(
      {{"w", {w.data(), DType::kFloat32, {4096}}}, {"b", {b.data(), DType::kFloat32, {64}}}}));
  ASSERT_OK(pub->Publish(1));
  std::vector<uint16_t> w16(4096);
  std::vector<float> b32(64);
  SubscriberOptions so;
  so.endpoint = o.endpoint;
  so.convert_dtypes = true;
  auto sub = testing::NewSubscriber(so, {{"w", {w16.data(), DType::kBFloat16, {4096}}},
                                         {"b", {b32.data(), DType::kFloat32, {64}}}});
  ASSERT_OK(sub->Update());
  ASSERT_OK_AND_ASSIGN(WeightsCheck check, sub->CheckWeights());
  EXPECT_EQ(check.tensors, 1u);
  EXPECT_EQ(check.unchecked_tensors, 1u);
  EXPECT_EQ(check.bytes, 64u * 4);
}

// Regions: with verification the plan reads whole digest segments, and the pieces of a segment a
// destination wants only part of are extracted at commit: checkable only where a destination
// piece is a whole segment.
TEST(WeightsCheck, RegionDestinationsFilledFromWholeSegmentsAreChecked) {
  const std::vector<testing::GlobalTensor> model = {{"a", DType::kBFloat16, {8, 32}},
                                                    {"b", DType::kBFloat16, {8, 24}}};
  testing::TrainerRank trainer;
  for (const auto& g : model) testing::AddShard(&trainer, g, 0, 1, 0);
  PublisherOptions o;
  o.endpoint = testing::UniqueEndpoint("check-regions");
  o.segment_bytes = 64;
  ASSERT_OK(trainer.Start(o));
  ASSERT_OK(trainer.Publish(1));
  testing::EngineRank engine;
  // a: rows of 64 bytes, dim-0 half: whole segments. b: rows of 48 bytes, a column half: every
  // segment read in part.
  testing::AddDestination(&engine, model, "a_rows", {Shard("a", {8, 32}, 0, 2, 1)});
  testing::AddDestination(&engine, model, "b_cols", {Shard("b", {8, 24}, 1, 2, 0)});
  SubscriberOptions so;
  so.endpoint = o.endpoint;
  so.policy = MatchPolicy::kSubset;
  so.verify = true;
  auto sub = testing::NewSubscriber(so, engine.Views());
  ASSERT_OK(sub->Update());
  ASSERT_OK_AND_ASSIGN(WeightsCheck check, sub->CheckWeights());
  EXPECT_EQ(check.tensors, 1u);
  EXPECT_EQ(check.unchecked_tensors, 1u);
  EXPECT_EQ(check.bytes, 4u * 64);
  engine.tensors[0].storage[10] ^= 1;
  ASSERT_STATUS_IS(kCorruption, sub->CheckWeights(), "tensor 'a_rows' bytes [0, 64)");
}

}  // namespace
}  // namespace weightsync
