// Sharded trainers into sharded engines, end to end: publishers holding regions of global tensors
// (FSDP shards, expert ranges), subscribers whose destinations want regions (TP column and row
// slices, fused qkv with GQA and gate_up, expert ranges). Real publishers over real Unix sockets
// and shared memory, and over TCP loopback; every destination byte checked every step.
#include "testing/regions.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/transform_reference.h"
#include "testing/count_new.inc"
#include "testing/test_util.h"
#include "testing/transport_modes.h"
#include "util/fail_point.h"

namespace weightsync {
namespace {

using testing::AddDestination;
using testing::AddShard;
using testing::EngineRank;
using testing::GlobalTensor;
using testing::TrainerRank;

class Regions : public ::testing::TestWithParam<testing::TransportMode> {
 protected:
  // `ranks` publishers, rank r holding dim-0 shard r of every tensor (FSDP).
  void StartFsdp(int ranks) {
    trainers_.resize(ranks);
    for (int r = 0; r < ranks; ++r) {
      for (const GlobalTensor& g : model_) AddShard(&trainers_[r], g, 0, ranks, r);
      ASSERT_OK(trainers_[r].Start(Options()));
    }
  }
  PublisherOptions Options() {
    PublisherOptions o;
    o.endpoint = GetParam().tcp ? "tcp://127.0.0.1:0" : testing::UniqueEndpoint("regions");
    o.segment_bytes = 64;  // segments cut through the shards: partial segments everywhere
    o.timeout = std::chrono::milliseconds(5000);
    return o;
  }
  void PublishAll(int64_t step) {
    for (TrainerRank& t : trainers_) ASSERT_OK(t.Publish(step));
  }
  std::unique_ptr<Subscriber> Connect(EngineRank& engine, bool verify,
                                      MatchPolicy policy = MatchPolicy::kSubset) {
    SubscriberOptions o;
    for (TrainerRank& t : trainers_) o.endpoints.push_back(t.publisher->endpoint());
    o.mode = GetParam().mode;
    o.verify = verify;
    o.policy = policy;
    o.timeout = std::chrono::milliseconds(5000);
    return testing::NewSubscriber(o, engine.Views());
  }

  std::vector<GlobalTensor> model_ = testing::LayerModel();
  std::vector<TrainerRank> trainers_;
};

TEST_P(Regions, FsdpFourIntoTensorParallelTwoMovesExactlyEachShard) {
  StartFsdp(4);
  std::vector<EngineRank> engines = {testing::TensorParallelRank(model_, 0),
                                     testing::TensorParallelRank(model_, 1)};
  std::vector<std::unique_ptr<Subscriber>> subs;
  for (EngineRank& e : engines) subs.push_back(Connect(e, /*verify=*/false));
  for (int64_t step = 1; step <= 4; ++step) {
    PublishAll(step);
    for (size_t i = 0; i < subs.size(); ++i) {
      SCOPED_TRACE("engine rank " + std::to_string(i) + ", step " + std::to_string(step));
      ASSERT_OK_AND_ASSIGN(UpdateStats stats, subs[i]->Update());
      EXPECT_EQ(stats.step, step);
      EXPECT_EQ(stats.bytes, engines[i].nbytes()) << "every byte moved exactly once";
      EXPECT_EQ(stats.tensors, engines[i].tensors.size());
      EXPECT_EQ(stats.prepare_count, 1u);
      std::string why;
      ASSERT_TRUE(engines[i].Holds(step, &why)) << why;
    }
  }
}

TEST_P(Regions, VerifiedUpdatesReadWholeDigestSegmentsAndCatchCorruption) {
  StartFsdp(4);
  EngineRank engine = testing::TensorParallelRank(model_, 1);
  auto sub = Connect(engine, /*verify=*/true);
  for (int64_t step = 1; step <= 3; ++step) {
    PublishAll(step);
    ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub->Update());
    EXPECT_TRUE(stats.verified);
    // Row slices read every segment they touch in part: those move whole.
    EXPECT_GT(stats.bytes, engine.nbytes());
    std::string why;
    ASSERT_TRUE(engine.Holds(step, &why)) << why;
  }
  // One flipped bit in what landed: refused, and staged keeps step 3 whole.
  util::FailPoints::Arm("subscriber.flip_received", util::FailAction::kFlip, 0, 1);
  PublishAll(4);
  auto bad = sub->Update();
  EXPECT_EQ(util::FailPoints::Hits("subscriber.flip_received"), 1) << "bit flip never injected";
  util::FailPoints::DisarmAll();
  ASSERT_STATUS_IS(kCorruption, bad, "do not match the publisher's digest", "nothing committed");
  std::string why;
  if (GetParam().mode == UpdateMode::kStaged) {
    EXPECT_TRUE(engine.Holds(3, &why)) << why;
    EXPECT_TRUE(sub->weights_valid());
  } else {
    EXPECT_FALSE(sub->weights_valid());
  }
  EXPECT_EQ(sub->committed_step(), 3);
  PublishAll(5);
  ASSERT_OK(sub->Update());
  ASSERT_TRUE(engine.Holds(5, &why)) << why;
  EXPECT_TRUE(sub->weights_valid());
}

// A verified update receives a digest segment its destination wants only part of whole, and checks
// all of it. Here every segment read is read in part (rows of 48 bytes, of which the destination
// wants 24; segments of 64 bytes) and the publisher corrupts every segment after hashing it, so
// the refusal does not depend on where a flipped bit lands.
TEST_P(Regions, ASegmentReadInPartIsVerifiedWholeAndItsCorruptionRefused) {
  const std::vector<GlobalTensor> model = {{"w", DType::kBFloat16, {8, 24}}};
  trainers_.resize(1);
  AddShard(&trainers_[0], model[0], 0, 1, 0);
  ASSERT_OK(trainers_[0].Start(Options()));
  EngineRank engine;
  AddDestination(&engine, model, "w_cols", {Shard("w", {8, 24}, 1, 2, 0)});
  auto sub = Connect(engine, /*verify=*/true);
  PublishAll(1);
  ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub->Update());
  EXPECT_TRUE(stats.verified);
  EXPECT_EQ(stats.bytes, 8u * 48) << "each of the 6 segments is read whole, for 24 of its bytes";
  std::string why;
  ASSERT_TRUE(engine.Holds(1, &why)) << why;
  util::FailPoints::Arm("publisher.corrupt_after_digest", util::FailAction::kFlip);
  PublishAll(2);
  EXPECT_EQ(util::FailPoints::Hits("publisher.corrupt_after_digest"), 6) << "every segment";
  util::FailPoints::DisarmAll();
  ASSERT_STATUS_IS(kCorruption, sub->Update(), "do not match the publisher's digest",
                   "6 corrupt segment(s)", "nothing committed");
  EXPECT_EQ(sub->committed_step(), 1);
  if (GetParam().mode == UpdateMode::kStaged) {
    EXPECT_TRUE(engine.Holds(1, &why)) << why;
  } else {
    EXPECT_FALSE(sub->weights_valid());
  }
  PublishAll(3);
  ASSERT_OK(sub->Update());
  EXPECT_TRUE(engine.Holds(3, &why)) << why;
}

TEST_P(Regions, AskingToVerifyPreparesAVerifiablePlanOnce) {
  StartFsdp(2);
  EngineRank engine = testing::TensorParallelRank(model_, 0);
  auto sub = Connect(engine, /*verify=*/false);
  PublishAll(1);
  ASSERT_OK_AND_ASSIGN(UpdateStats plain, sub->Update());
  EXPECT_EQ(plain.bytes, engine.nbytes());
  PublishAll(2);
  UpdateOptions verify;
  verify.verify = true;
  ASSERT_OK_AND_ASSIGN(UpdateStats checked, sub->Update(verify));
  EXPECT_TRUE(checked.verified);
  EXPECT_TRUE(checked.handle_created);
  EXPECT_EQ(checked.prepare_count, 2u);
  PublishAll(3);
  ASSERT_OK_AND_ASSIGN(UpdateStats again, sub->Update(verify));
  EXPECT_FALSE(again.handle_created);  // the verifiable plan is reused
  std::string why;
  ASSERT_TRUE(engine.Holds(3, &why)) << why;
}

TEST_P(Regions, StackedExpertsEpFourIntoEpTwo) {
  model_ = {{"experts.w1", DType::kBFloat16, {16, 8, 6}},
            {"experts.w2", DType::kFloat32, {16, 6, 8}}};
  StartFsdp(4);  // EP-4: rank r holds experts [4r, 4r + 4)
  for (int t = 0; t < 2; ++t) {
    EngineRank engine;
    for (const GlobalTensor& g : model_) {
      AddDestination(&engine, model_, g.name, {Shard(g.name, g.shape, 0, 2, t)});
    }
    auto sub = Connect(engine, /*verify=*/t == 1);
    PublishAll(t + 1);
    ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub->Update());
    // Engine rank t's experts live on trainer ranks 2t and 2t + 1 only.
    EXPECT_EQ(stats.bytes, engine.nbytes());
    std::string why;
    ASSERT_TRUE(engine.Holds(t + 1, &why)) << why;
  }
}

TEST_P(Regions, UncoveredAndDoublyWrittenRangesAreListedInOneErrorAndNothingMoves) {
  StartFsdp(4);
  trainers_.pop_back();  // rank 3's rows of every tensor are held by nobody
  EngineRank engine;
  // Rows [8, 16) of q come from the missing rank 3 in part; k is written twice.
  AddDestination(&engine, model_, "q_tail", {Shard("q", {16, 12}, 0, 2, 1)});
  RegionPart k0 = Whole("k", {4, 12});
  RegionPart k1 = k0;
  k1.offset = {0, 0};
  k1.extent = {2, 12};
  k1.at = {1, 0};
  AddDestination(&engine, model_, "k_twice", {k0});
  engine.tensors.back().parts.push_back(k1);
  engine.globals.back().push_back(testing::Find(model_, "k"));
  auto sub = Connect(engine, false);
  PublishAll(1);
  auto r = sub->Update();
  ASSERT_STATUS_IS(kInvalidArgument, r,
                   "'q' [12:16, 0:12] (for destination 'q_tail'): held by no publisher",
                   "destination 'k_twice': pieces of 'k' and 'k' both write [1:3, 0:12]");
  std::string why;
  EXPECT_TRUE(engine.Untouched(&why)) << why;
}

// A sharded trainer looks like the model it holds together: its global tensors, each once.
TEST_P(Regions, PublishedManifestListsTheGlobalTensorsOfShardedPublishers) {
  model_ = {{"w", DType::kBFloat16, {5, 12}}, {"norm", DType::kFloat32, {3}}};
  StartFsdp(2);  // rows [0, 2) and [2, 5) of w: uneven shards
  PublishAll(1);
  SubscriberOptions o;
  for (TrainerRank& t : trainers_) o.endpoints.push_back(t.publisher->endpoint());
  ASSERT_OK_AND_ASSIGN(auto sub, Subscriber::Create(o));
  ASSERT_OK_AND_ASSIGN(Manifest m, sub->PublishedManifest());
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m.tensors()[0].name, "w");
  EXPECT_EQ(m.tensors()[0].shape, (std::vector<int64_t>{5, 12}));
  EXPECT_EQ(m.tensors()[0].nbytes, 120u);
  EXPECT_EQ(m.tensors()[1].shape, (std::vector<int64_t>{3}));
}

// Tied destinations (one tensor under two names) are written once, through the first name.
TEST_P(Regions, TiedDestinationsAreWrittenOnceThroughTheirOriginal) {
  StartFsdp(2);
  EngineRank engine;
  AddDestination(&engine, model_, "norm", {Whole("norm", {12})});
  SubscriberOptions o;
  for (TrainerRank& t : trainers_) o.endpoints.push_back(t.publisher->endpoint());
  o.mode = GetParam().mode;
  o.policy = MatchPolicy::kSubset;
  std::vector<NamedTensor> views = engine.Views();
  views.push_back({"norm_tied", views[0].view, views[0].regions});  // same memory and regions
  auto sub = testing::NewSubscriber(o, views);
  PublishAll(1);
  ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub->Update());
  EXPECT_EQ(stats.bytes, engine.nbytes());
  EXPECT_EQ(stats.tensors, 1u);
  std::string why;
  EXPECT_TRUE(engine.Holds(1, &why)) << why;
}

TEST_P(Regions, StrictPolicyNamesPublishedTensorsNobodyWants) {
  StartFsdp(2);
  EngineRank engine;
  AddDestination(&engine, model_, "q", {Whole("q", {16, 12})});
  auto sub = Connect(engine, false, MatchPolicy::kStrict);
  PublishAll(1);
  auto r = sub->Update();
  ASSERT_STATUS_IS(kInvalidArgument, r, "strict policy",
                   "tensor 'experts': published but wanted by no destination");
  std::string why;
  EXPECT_TRUE(engine.Untouched(&why)) << why;
}

TEST_P(Regions, SteadyStateUpdatesAllocateNothing) {
  StartFsdp(4);
  EngineRank engine = testing::TensorParallelRank(model_, 1);
  auto sub = Connect(engine, /*verify=*/true);
  PublishAll(1);
  ASSERT_OK(sub->Update());
  int64_t worst = 0;
  for (int64_t step = 2; step <= 10; ++step) {
    PublishAll(step);
    const int64_t before = g_new_calls.load();
    auto r = sub->Update();
    worst = std::max(worst, g_new_calls.load() - before);
    ASSERT_OK(r);
  }
  EXPECT_EQ(worst, 0) << "operator new calls in one steady-state region update";
  std::string why;
  ASSERT_TRUE(engine.Holds(10, &why)) << why;
}

// Casts on regions (convert_dtypes): float32 FSDP shards into a bfloat16 row slice and a float16
// column slice, each element converted as the whole-tensor cast would convert it.
TEST_P(Regions, CastsConvertEveryRegionAsTheWholeTensorCastWould) {
  model_ = {{"w", DType::kFloat32, {16, 12}}};
  StartFsdp(2);
  const testing::GlobalTensor& w = model_[0];
  struct Want {
    std::string name;
    DType dtype;
    RegionPart part;
  };
  const std::vector<Want> wants = {{"w_bf16", DType::kBFloat16, Shard("w", w.shape, 1, 2, 1)},
                                   {"w_f16", DType::kFloat16, Shard("w", w.shape, 0, 2, 0)}};
  std::vector<std::vector<uint8_t>> storage;
  std::vector<NamedTensor> views;
  for (const Want& want : wants) {
    storage.emplace_back(want.part.extent[0] * want.part.extent[1] * 2, 0xEE);
    views.push_back(
        {want.name, {storage.back().data(), want.dtype, want.part.extent}, {want.part}});
  }
  for (bool verify : {false, true}) {
    SCOPED_TRACE(verify ? "verify" : "no verify");
    SubscriberOptions o;
    for (TrainerRank& t : trainers_) o.endpoints.push_back(t.publisher->endpoint());
    o.mode = GetParam().mode;
    o.verify = verify;
    o.convert_dtypes = true;
    o.policy = MatchPolicy::kSubset;
    auto sub = testing::NewSubscriber(o, views);
    for (int64_t step = 1; step <= 2; ++step) {
      PublishAll(10 * verify + step);
      ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub->Update());
      if (!verify) {
        EXPECT_EQ(stats.bytes, (16 * 6 + 8 * 12) * 4u) << "the float32 bytes wanted, once";
      }
      for (size_t i = 0; i < wants.size(); ++i) {
        RegionPart part = wants[i].part;
        std::vector<uint8_t> f32(part.extent[0] * part.extent[1] * 4);
        testing::FillPart(w, 10 * verify + step, part, part.extent, f32.data());
        std::vector<uint8_t> expected(storage[i].size());
        ASSERT_OK(cuda::reference::Cast(DType::kFloat32, wants[i].dtype, f32.data(),
                                        expected.data(), f32.size() / 4));
        EXPECT_EQ(storage[i], expected) << wants[i].name;
      }
    }
  }
  // Without convert_dtypes the dtype difference is named, and nothing moves.
  SubscriberOptions plain;
  for (TrainerRank& t : trainers_) plain.endpoints.push_back(t.publisher->endpoint());
  plain.policy = MatchPolicy::kSubset;
  auto refused = testing::NewSubscriber(plain, views);
  EXPECT_STATUS_IS(kInvalidArgument, refused->Update(), "destination 'w_bf16' wants bfloat16",
                   "enable SubscriberOptions.convert_dtypes");
}

// Random layouts: 1–4 publishers holding random shards (any dim, replicated on some), 1–3
// subscribers wanting random regions, whole or fused from several: every destination byte
// exactly once, bit-exact, with and without verification.
TEST_P(Regions, RandomLayoutsArriveBitExact) {
  std::mt19937 rng(20261201);
  const int layouts = testing::kUnderSanitizer ? 4 : 12;
  for (int layout = 0; layout < layouts; ++layout) {
    SCOPED_TRACE("layout " + std::to_string(layout));
    const DType dtypes[] = {DType::kBFloat16, DType::kFloat32, DType::kUInt8, DType::kFloat64};
    model_.clear();
    const int tensors = 1 + rng() % 4;
    for (int i = 0; i < tensors; ++i) {
      GlobalTensor g{"t" + std::to_string(i), dtypes[rng() % 4], {}};
      const int dims = 1 + rng() % 3;
      for (int d = 0; d < dims; ++d) g.shape.push_back(1 + rng() % 9);
      model_.push_back(g);
    }
    const int publishers = 1 + rng() % 4;
    trainers_.clear();
    trainers_.resize(publishers);
    for (const GlobalTensor& g : model_) {
      // Split along a random dim among the publishers; sometimes every one holds it whole too.
      const int dim = rng() % g.shape.size();
      for (int r = 0; r < publishers; ++r) AddShard(&trainers_[r], g, dim, publishers, r);
    }
    for (TrainerRank& t : trainers_) ASSERT_OK(t.Start(Options()));
    const int subscribers = 1 + rng() % 3;
    for (int s = 0; s < subscribers; ++s) {
      EngineRank engine;
      for (const GlobalTensor& g : model_) {
        // A random slab along a random dim, fused (concatenated along that dim) from 1–3 parts.
        const int dim = rng() % g.shape.size();
        const int pieces = 1 + rng() % 3;
        std::vector<RegionPart> parts;
        for (int p = 0; p < pieces; ++p) {
          parts.push_back(Shard(g.name, g.shape, dim, pieces + 1, rng() % (pieces + 1)));
        }
        AddDestination(&engine, model_, g.name + ".s" + std::to_string(s), Fuse(dim, parts));
      }
      const bool verify = rng() % 2 == 0;
      auto sub = Connect(engine, verify);
      for (int64_t step = 1; step <= 2; ++step) {
        PublishAll(10 * layout + step + s * 2);
        ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub->Update());
        if (!verify) {
          EXPECT_EQ(stats.bytes, engine.nbytes());
        }
        std::string why;
        ASSERT_TRUE(engine.Holds(10 * layout + step + s * 2, &why)) << why;
      }
    }
    trainers_.clear();
  }
}

// Registration checks what it can alone: a publisher's tensor holds one region whose extent is
// its own shape; a destination's parts fit their global tensors and the destination. A refused
// registration leaves nothing behind.
TEST(RegionRegistration, APublisherTensorHoldsOneRegionOfItsOwnShape) {
  PublisherOptions o;
  o.endpoint = testing::UniqueEndpoint("regions-reg");
  ASSERT_OK_AND_ASSIGN(auto pub, Publisher::Create(o));
  std::vector<uint16_t> shard(4 * 6);
  TensorView view{shard.data(), DType::kBFloat16, {4, 6}};
  const RegionPart rows = Shard("w", {8, 6}, 0, 2, 1);
  EXPECT_STATUS_IS(kInvalidArgument, pub->Register({{"w", view, {rows, rows}}}),
                   "tensor 'w': 2 region parts; a published tensor holds one region");
  EXPECT_STATUS_IS(kInvalidArgument, pub->Register({{"w", view, {Shard("w", {8, 6}, 1, 2, 1)}}}),
                   "tensor 'w': holds 'w' [0:8, 3:6] of [8, 6] but its shape is [4, 6]");
  RegionPart outside = rows;
  outside.offset = {6, 0};
  EXPECT_STATUS_IS(kInvalidArgument, pub->Register({{"w", view, {outside}}}),
                   "tensor 'w' region part 0",
                   "dim 0 does not fit: offset 6 + extent 4 within "
                   "global 8");
  RegionPart flat = rows;
  flat.global_shape = {48};
  EXPECT_STATUS_IS(kInvalidArgument, pub->Register({{"w", view, {flat}}}), "need 2 dims each");
  EXPECT_EQ(pub->manifest().size(), 0u) << "a refused registration leaves nothing";
  ASSERT_OK(pub->Register({{"w", view, {rows}}}));
  EXPECT_EQ(pub->manifest().size(), 1u);
}

TEST(RegionRegistration, ADestinationsPartsFitTheirGlobalTensorsAndTheDestination) {
  SubscriberOptions o;
  o.endpoint = testing::UniqueEndpoint("regions-reg");
  ASSERT_OK_AND_ASSIGN(auto sub, Subscriber::Create(o));
  std::vector<uint16_t> qkv(12 * 12);
  TensorView view{qkv.data(), DType::kBFloat16, {12, 12}};
  std::vector<RegionPart> parts = Fuse(
      0,
      {Shard("q", {16, 12}, 0, 2, 0), Shard("k", {4, 12}, 0, 2, 0), Shard("v", {4, 12}, 0, 2, 0)});
  RegionPart past = parts[2];
  past.at = {11, 0};  // rows [11, 13) of a 12-row destination
  EXPECT_STATUS_IS(kInvalidArgument, sub->Register({{"qkv", view, {parts[0], parts[1], past}}}),
                   "tensor 'qkv' region part 2 ('v' [0:2, 0:12] of [4, 12])",
                   "at 11 + extent within the tensor's 12");
  RegionPart open = parts[1];
  open.extent.clear();
  EXPECT_STATUS_IS(kInvalidArgument, sub->Register({{"qkv", view, {parts[0], open}}}),
                   "no extent: only a single part may leave it out");
  ASSERT_OK(sub->Register({{"qkv", view, parts}}));
  // Tied destinations (same memory, dtype and shape) must want the same regions.
  EXPECT_STATUS_IS(kInvalidArgument,
                   sub->Register({{"qkv_again", view, {Whole("qkv_global", {12, 12})}}}),
                   "overlaps tensor 'qkv'");
  ASSERT_OK(sub->Register({{"qkv_tied", view, parts}}));
}

TEST(RegionRegistration, ADestinationItsPartsDoNotFillIsNamedAtTheUpdate) {
  PublisherOptions po;
  po.endpoint = testing::UniqueEndpoint("regions-fill");
  ASSERT_OK_AND_ASSIGN(auto pub, Publisher::Create(po));
  std::vector<uint16_t> w(8 * 6, 1);
  ASSERT_OK(pub->Register({{"w", {w.data(), DType::kBFloat16, {8, 6}}}}));
  ASSERT_OK(pub->Publish(1));
  SubscriberOptions so;
  so.endpoint = po.endpoint;
  so.policy = MatchPolicy::kSubset;
  ASSERT_OK_AND_ASSIGN(auto sub, Subscriber::Create(so));
  std::vector<uint16_t> half(8 * 6, 0xEEEE);
  ASSERT_OK(sub->Register(
      {{"w_part", {half.data(), DType::kBFloat16, {8, 6}}, {Shard("w", {8, 6}, 0, 2, 0)}}}));
  EXPECT_STATUS_IS(kInvalidArgument, sub->Update(),
                   "destination 'w_part' [8, 6]: its pieces write 24 of 48 elements");
  for (uint16_t v : half) ASSERT_EQ(v, 0xEEEE);
}

INSTANTIATE_TEST_SUITE_P(Modes, Regions, testing::AllTransportModes(), testing::TransportModeName);

}  // namespace
}  // namespace weightsync
