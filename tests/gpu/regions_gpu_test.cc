// Regions into one GPU (label gpu): four FSDP trainer ranks — processes holding rows of every
// tensor of the layer model on cuda:0 (cuda-ipc; or zero-copy, publishing those rows where they
// are), or host publishers (host-to-gpu) — feed two TP engine ranks (subscribers in this process,
// destinations on cuda:0: fused qkv and gate_up, row-parallel o/down, experts EP-2); each receives
// exactly its shard, bit-exact, staged and in place; verified (segments read in part are received
// whole and their pieces copied or cast out at commit), with a flipped bit caught and nothing
// committed; and cast (convert_dtypes) into destinations of other dtypes, as the reference cast
// converts each element.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/transform_reference.h"
#include "gpu/gpu_test_util.h"
#include "testing/publisher_process.h"
#include "testing/regions.h"
#include "testing/test_util.h"
#include "util/fail_point.h"

namespace weightsync {
namespace {

// Where the four FSDP trainer ranks keep their shards: GPU publisher processes (cuda-ipc), or host
// publishers in this process (host-to-gpu) with 96-byte digest segments, so verified plans read
// segments in part everywhere.
struct Layout {
  UpdateMode mode;
  bool host_publishers;
  bool zero_copy =
      false;  // GPU publishers publishing their own shards (PublisherOptions::zero_copy)
  const char* path() const {
    return host_publishers ? "host-to-gpu" : zero_copy ? "cuda-ipc-zero-copy" : "cuda-ipc";
  }
};

class RegionsGpu : public ::testing::TestWithParam<Layout> {
 protected:
  void SetUp() override {
    WS_SKIP_WITHOUT_GPU();
    trainers_.reserve(4);  // their publishers read the storage they hold
    for (int r = 0; r < 4; ++r) {
      if (GetParam().host_publishers) {
        trainers_.push_back(testing::FsdpRank(model_, 4, r));
        PublisherOptions o;
        o.endpoint = testing::UniqueEndpoint("regions-host");
        o.segment_bytes = 96;  // cuts rows of 256 and 320 bytes: partly read segments
        o.timeout = std::chrono::milliseconds(5000);
        ASSERT_OK(trainers_[r].Start(o));
        endpoints_.push_back(trainers_[r].publisher->endpoint());
        continue;
      }
      std::vector<std::string> env;
      if (GetParam().zero_copy) env.push_back("WS_TEST_ZERO_COPY=1");
      ranks_.emplace_back("gpu_publisher",
                          std::vector<std::string>{"fsdp", std::to_string(r), "4", "0", "16"}, env);
      ASSERT_NO_FATAL_FAILURE(ranks_[r].Start(testing::UniqueEndpoint("regions-gpu")));
      endpoints_.push_back(ranks_[r].endpoint());
    }
  }
  void PublishAll(int64_t step) {
    for (auto& rank : ranks_) ASSERT_NO_FATAL_FAILURE(rank.Publish(step));
    for (auto& trainer : trainers_) ASSERT_OK(trainer.Publish(step));
  }
  void TearDown() override { util::FailPoints::DisarmAll(); }
  // Engine rank `t`'s destinations on cuda:0 and a subscriber of every trainer rank into them.
  std::unique_ptr<Subscriber> Connect(testing::EngineRank& engine, bool verify) {
    return Connect(engine.Views(), verify, /*convert=*/false);
  }
  // The same for `views` (their dtypes may differ from the published ones: `convert`).
  std::unique_ptr<Subscriber> Connect(std::vector<NamedTensor> views, bool verify, bool convert) {
    for (NamedTensor& v : views) {
      auto buffer = cuda::DeviceBuffer::Allocate(std::max<uint64_t>(*v.view.NumBytes(), 1));
      EXPECT_OK(buffer);
      EXPECT_OK(cuda::MemsetDevice(buffer->data(), 0xEE, *v.view.NumBytes()));
      v.view.data = buffer->data();
      v.view.device = {Device::Kind::kCUDA, 0};
      device_.push_back(std::move(buffer).value());
    }
    SubscriberOptions o;
    o.endpoints = endpoints_;
    o.mode = GetParam().mode;
    o.verify = verify;
    o.convert_dtypes = convert;
    o.policy = MatchPolicy::kSubset;
    o.timeout = std::chrono::milliseconds(20000);
    return testing::NewSubscriber(o, views);
  }
  // Copies the device destinations of `engine` (the last ones Connect made) back to its storage.
  void Download(testing::EngineRank& engine, size_t first) {
    for (size_t i = 0; i < engine.tensors.size(); ++i) {
      ASSERT_OK(cuda::CopyToHost(engine.tensors[i].storage.data(), device_[first + i].data(),
                                 engine.tensors[i].nbytes()));
    }
  }

  std::vector<testing::GlobalTensor> model_ = testing::LayerModel(16);
  std::vector<testing::PublisherProcess> ranks_;
  std::vector<testing::TrainerRank> trainers_;
  std::vector<std::string> endpoints_;
  std::vector<cuda::DeviceBuffer> device_;
};

TEST_P(RegionsGpu, FsdpFourIntoTensorParallelTwoOverCudaIpcMovesExactlyEachShard) {
  std::vector<testing::EngineRank> engines = {testing::TensorParallelRank(model_, 0),
                                              testing::TensorParallelRank(model_, 1)};
  std::vector<std::unique_ptr<Subscriber>> subs;
  std::vector<size_t> first;
  for (auto& e : engines) {
    first.push_back(device_.size());
    subs.push_back(Connect(e, /*verify=*/false));
  }
  for (int64_t step = 1; step <= 3; ++step) {
    PublishAll(step);
    for (size_t i = 0; i < subs.size(); ++i) {
      SCOPED_TRACE("engine rank " + std::to_string(i) + ", step " + std::to_string(step));
      ASSERT_OK_AND_ASSIGN(UpdateStats stats, subs[i]->Update());
      EXPECT_EQ(stats.path, GetParam().path());
      EXPECT_EQ(stats.bytes, engines[i].nbytes());
      ASSERT_NO_FATAL_FAILURE(Download(engines[i], first[i]));
      std::string why;
      ASSERT_TRUE(engines[i].Holds(step, &why)) << why;
    }
  }
}

// With verify, the row-parallel slices (o, down) read every publisher segment in part: each is
// received whole, checked against the publisher's GPU digest, and its rows copied out at commit.
TEST_P(RegionsGpu, VerifiedRegionsArriveBitExactAndAFlippedBitCommitsNothing) {
  testing::EngineRank engine = testing::TensorParallelRank(model_, 1);
  auto sub = Connect(engine, /*verify=*/true);
  std::string why;
  for (int64_t step = 1; step <= 2; ++step) {
    PublishAll(step);
    ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub->Update());
    EXPECT_EQ(stats.path, GetParam().path());
    EXPECT_GT(stats.bytes, engine.nbytes()) << "partly read segments move whole when verified";
    ASSERT_NO_FATAL_FAILURE(Download(engine, 0));
    ASSERT_TRUE(engine.Holds(step, &why)) << why;
  }
  PublishAll(3);
  util::FailPoints::Arm("subscriber.flip_received", util::FailAction::kFlip, 0, 1);
  auto flipped = sub->Update();
  ASSERT_EQ(util::FailPoints::Hits("subscriber.flip_received"), 1) << "bit flip never injected";
  EXPECT_STATUS_IS(kCorruption, flipped, "step 3", "nothing committed");
  if (GetParam().mode == UpdateMode::kStaged) {
    ASSERT_NO_FATAL_FAILURE(Download(engine, 0));
    EXPECT_TRUE(engine.Holds(2, &why)) << "staged: step 2 intact; " << why;
  } else {
    EXPECT_FALSE(sub->weights_valid());
  }
  ASSERT_OK_AND_ASSIGN(UpdateStats again, sub->Update());
  EXPECT_EQ(again.step, 3);
  ASSERT_NO_FATAL_FAILURE(Download(engine, 0));
  EXPECT_TRUE(engine.Holds(3, &why)) << why;
}

// Casts on regions: fused column slices to float32, row slices and experts to float16 (rounding),
// the rest as published; each converted element as the reference cast converts it, verified or
// not (verified, the row slices' pieces are cast out of whole received segments).
TEST_P(RegionsGpu, CastRegionsArriveAsTheReferenceCastConvertsThem) {
  testing::EngineRank engine = testing::TensorParallelRank(model_, 1);
  const std::map<std::string, DType> cast_to = {{"qkv_proj", DType::kFloat32},
                                                {"o_proj", DType::kFloat16},
                                                {"down_proj", DType::kFloat32},
                                                {"experts", DType::kFloat16}};
  for (bool verify : {false, true}) {
    SCOPED_TRACE(verify ? "verify" : "no verify");
    std::vector<NamedTensor> views = engine.Views();
    for (NamedTensor& v : views) {
      if (cast_to.count(v.name)) v.view.dtype = cast_to.at(v.name);
    }
    const size_t first = device_.size();
    auto sub = Connect(views, verify, /*convert=*/true);
    for (int64_t step = 1; step <= 2; ++step) {
      const int64_t published = 10 * verify + step;
      PublishAll(published);
      ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub->Update());
      EXPECT_EQ(stats.path, GetParam().path());
      if (!verify) {
        EXPECT_EQ(stats.bytes, engine.nbytes()) << "the published bytes wanted, once";
      }
      for (size_t i = 0; i < engine.tensors.size(); ++i) {
        const testing::RegionTensor& t = engine.tensors[i];
        std::vector<uint8_t> as_published(t.nbytes(), 0xEE);
        for (size_t p = 0; p < t.parts.size(); ++p) {
          testing::FillPart(*engine.globals[i][p], published, t.parts[p], t.shape,
                            as_published.data());
        }
        const DType to = views[i].view.dtype;
        std::vector<uint8_t> expected = as_published;
        if (to != t.dtype) {
          expected.assign(*views[i].view.NumBytes(), 0);
          ASSERT_OK(cuda::reference::Cast(t.dtype, to, as_published.data(), expected.data(),
                                          t.nbytes() / (Info(t.dtype).bits / 8)));
        }
        std::vector<uint8_t> got(expected.size());
        ASSERT_OK(cuda::CopyToHost(got.data(), device_[first + i].data(), got.size()));
        EXPECT_EQ(got, expected) << t.name << " as " << DTypeName(to) << ", step " << published;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, RegionsGpu,
                         ::testing::Values(Layout{UpdateMode::kStaged, false},
                                           Layout{UpdateMode::kInPlace, false},
                                           Layout{UpdateMode::kStaged, true},
                                           Layout{UpdateMode::kInPlace, true},
                                           Layout{UpdateMode::kStaged, false, true},
                                           Layout{UpdateMode::kInPlace, false, true}),
                         [](const auto& info) {
                           const Layout& l = info.param;
                           return std::string(l.host_publishers ? "host_"
                                              : l.zero_copy     ? "zero_copy_"
                                                                : "gpu_") +
                                  (l.mode == UpdateMode::kStaged ? "staged" : "in_place");
                         });

}  // namespace
}  // namespace weightsync
