// The extra memory each side holds, as the stats report it (issue 16): a host publisher's
// PublishStats::store_bytes is every slot of its arena in whole pages (not the Allocate()d
// tensors), or its ring's buckets; a subscriber's UpdateStats::staging_bytes is its shadow when
// staged, only the landing buffer of converted tensors in place, exactly what it adds to the
// ledger's staging_bytes, reported without allocating and gone after Sleep(). Real Unix sockets,
// real memfds, over shm and tcp.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "testing/test_util.h"

// Counts host heap allocations (g_new_calls) to show a steady update makes none.
#include "testing/count_new.inc"

namespace weightsync {
namespace {

using std::chrono::milliseconds;
using testing::SyntheticModel;

constexpr uint64_t kPage = 4096;

uint64_t WholePages(uint64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

std::unique_ptr<Publisher> NewPublisher(PublisherOptions o) {
  if (o.endpoint.empty()) o.endpoint = testing::UniqueEndpoint("memstats");
  o.timeout = milliseconds(5000);
  auto p = Publisher::Create(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? std::move(*p) : nullptr;
}

// 4000 + 100 bytes: one slot of 4032 (the second tensor 64-byte aligned) + 100 = 4132 bytes,
// two pages.
TEST(PublishStatsStoreBytes, AHostArenaHoldsEverySlotInWholePages) {
  std::vector<float> w(1000, 1.f);
  std::vector<uint8_t> b(100, 2);
  auto pub = NewPublisher({.slots = 3});
  ASSERT_NE(pub, nullptr);
  ASSERT_OK(pub->Register(
      {{"w", {w.data(), DType::kFloat32, {1000}}}, {"b", {b.data(), DType::kUInt8, {100}}}}));
  for (int64_t step : {1, 2}) {
    ASSERT_OK_AND_ASSIGN(PublishStats stats, pub->Publish(step));
    EXPECT_EQ(stats.store_bytes, 3 * WholePages(4032 + 100)) << "step " << step;
    EXPECT_EQ(stats.store_bytes, 3 * 2 * kPage);
    EXPECT_EQ(stats.store_device, -1);
    EXPECT_EQ(stats.bytes_copied, 4100u);
  }
}

// Allocate()d tensors live in the arena's direct region: they are the trainer's tensors, not
// extra memory. Only the slots of the registered tensor count.
TEST(PublishStatsStoreBytes, AllocatedTensorsAreNotCounted) {
  std::vector<uint8_t> b(100, 2);
  auto pub = NewPublisher({.slots = 2});
  ASSERT_NE(pub, nullptr);
  ASSERT_OK_AND_ASSIGN(TensorView w, pub->Allocate("w", DType::kFloat32, {3000}));  // 3 pages
  (void)w;
  ASSERT_OK(pub->Register({{"b", {b.data(), DType::kUInt8, {100}}}}));
  ASSERT_OK_AND_ASSIGN(PublishStats stats, pub->Publish(1));
  EXPECT_EQ(stats.store_bytes, 2 * kPage) << "the direct region was counted";
  EXPECT_EQ(stats.store_device, -1);
}

// A ring of K buckets holds K × the bucket (in whole pages), however large the model.
TEST(PublishStatsStoreBytes, AHostRingHoldsItsBucketsOnly) {
  for (uint64_t asked : {uint64_t{64} << 10, (uint64_t{64} << 10) + 1}) {
    SyntheticModel model(10, 20000);
    std::vector<NamedTensor> tensors = model.Tensors();
    auto pub = NewPublisher({.ring_buckets = 3, .ring_bucket_bytes = asked});
    ASSERT_NE(pub, nullptr);
    ASSERT_OK(pub->Register(tensors));
    ASSERT_GT(model.total_bytes(), 3 * WholePages(asked)) << "the model must outgrow the ring";
    model.Fill(1);
    ASSERT_OK_AND_ASSIGN(PublishStats stats, pub->Publish(1));
    EXPECT_EQ(stats.store_bytes, 3 * WholePages(asked)) << "bucket of " << asked << " bytes";
    EXPECT_EQ(stats.store_device, -1);
    EXPECT_EQ(stats.bytes_copied, 0u);
  }
}

// Over tcp the session sends a ring publisher's version from its tensors: no bucket is
// allocated, and the bytes still arrive whole.
TEST(PublishStatsStoreBytes, AHostRingOverTcpHoldsNoBuckets) {
  SyntheticModel model(10, 20000);
  std::vector<NamedTensor> tensors = model.Tensors();
  auto pub = NewPublisher(
      {.endpoint = "tcp://127.0.0.1:0", .ring_buckets = 2, .ring_bucket_bytes = 64 << 10});
  ASSERT_NE(pub, nullptr);
  ASSERT_OK(pub->Register(tensors));
  std::vector<std::vector<uint8_t>> storage = SyntheticModel::PoisonedStorage(tensors);
  std::vector<NamedTensor> dst = SyntheticModel::Views(tensors, storage);
  SubscriberOptions so;
  so.endpoint = pub->endpoint();
  so.verify = true;
  so.timeout = milliseconds(testing::kUnderSanitizer ? 20000 : 8000);
  auto sub = testing::NewSubscriber(so, dst);
  ASSERT_NE(sub, nullptr);
  for (int64_t step : {1, 2}) {
    ASSERT_OK(pub->BeginWrite());
    model.Fill(step);
    ASSERT_OK_AND_ASSIGN(PublishStats stats, pub->Publish(step));
    EXPECT_EQ(stats.store_bytes, 0u) << "step " << step << ": buckets nobody reads";
    EXPECT_EQ(stats.bytes_copied, 0u);
    ASSERT_OK_AND_ASSIGN(UpdateStats got, sub->Update());
    EXPECT_EQ(got.path, "tcp");
    std::string why;
    EXPECT_TRUE(SyntheticModel::Holds(dst, step, &why)) << "step " << step << ": " << why;
  }
}

enum class Store { kArena, kRing };
struct Param {
  UpdateMode mode;
  Store store;
  const char* transport;  // "local" or "tcp"
};

class StagingBytes : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    const Param p = GetParam();
    PublisherOptions o;
    o.endpoint = std::string(p.transport) == "tcp" ? "tcp://127.0.0.1:0"
                                                   : testing::UniqueEndpoint("staging");
    o.segment_bytes = 4096;
    if (p.store == Store::kRing) {
      o.ring_buckets = 2;
      o.ring_bucket_bytes = 64 << 10;
    }
    pub_ = NewPublisher(o);
    ASSERT_NE(pub_, nullptr);
    ASSERT_OK(pub_->Register(tensors_));
  }
  std::unique_ptr<Subscriber> Connect() {
    SubscriberOptions o;
    o.endpoint = pub_->endpoint();
    o.mode = GetParam().mode;
    o.verify = true;
    o.timeout = milliseconds(testing::kUnderSanitizer ? 20000 : 8000);
    return testing::NewSubscriber(o, dst_);
  }
  Status Publish(int64_t step) {
    WS_RETURN_IF_ERROR(pub_->BeginWrite());
    model_.Fill(step);
    return pub_->Publish(step).status();
  }
  bool staged() const { return GetParam().mode == UpdateMode::kStaged; }

  SyntheticModel model_{10, 20000};
  std::vector<NamedTensor> tensors_ = model_.Tensors();
  std::vector<std::vector<uint8_t>> storage_ = SyntheticModel::PoisonedStorage(tensors_);
  std::vector<NamedTensor> dst_ = SyntheticModel::Views(tensors_, storage_);
  std::unique_ptr<Publisher> pub_;
};

TEST_P(StagingBytes, AreTheShadowStagedNoneInPlaceAndWhatTheLedgerCounts) {
  const int64_t baseline = ReadLedger().staging_bytes;
  auto sub = Connect();
  ASSERT_OK(Publish(1));
  ASSERT_OK_AND_ASSIGN(UpdateStats first, sub->Update());
  ASSERT_TRUE(first.handle_created);
  const uint64_t total = model_.total_bytes();
  if (staged()) {
    // Every tensor, 64-byte aligned.
    EXPECT_GE(first.staging_bytes, total);
    EXPECT_LT(first.staging_bytes, total + 64 * tensors_.size());
  } else {
    EXPECT_EQ(first.staging_bytes, 0u) << "in place, nothing converted: no landing buffer";
  }
  EXPECT_EQ(static_cast<int64_t>(first.staging_bytes), ReadLedger().staging_bytes - baseline)
      << "not this subscriber's share of the ledger";

  // A steady update reports the same, reused handle's staging.
  ASSERT_OK(Publish(2));
  ASSERT_OK_AND_ASSIGN(UpdateStats steady, sub->Update());
  EXPECT_FALSE(steady.handle_created);
  EXPECT_EQ(steady.staging_bytes, first.staging_bytes);
  ASSERT_OK_AND_ASSIGN(UpdateStats again, sub->Update());
  EXPECT_TRUE(again.up_to_date);
  EXPECT_EQ(again.staging_bytes, first.staging_bytes) << "an up-to-date update holds it too";

  // Sleep gives it back; the next update prepares and reports it again.
  ASSERT_OK(sub->Sleep());
  EXPECT_EQ(ReadLedger().staging_bytes, baseline);
  ASSERT_OK(Publish(3));
  ASSERT_OK_AND_ASSIGN(UpdateStats woken, sub->Update());
  EXPECT_TRUE(woken.handle_created);
  EXPECT_EQ(woken.staging_bytes, first.staging_bytes);
  std::string why;
  EXPECT_TRUE(SyntheticModel::Holds(dst_, 3, &why)) << why;
}

// Filling the stat costs no allocation: a steady step allocates nothing (in this process: the
// subscriber's and the publisher's side, a ring's bucket fills included), in the publish (the
// write fence, the copy or the ring's hashes) nor in the update.
TEST_P(StagingBytes, ASteadyUpdateReportsItWithoutAllocating) {
  auto sub = Connect();
  const int64_t at_start = g_new_calls.load();
  ASSERT_OK(Publish(1));
  ASSERT_OK(sub->Update());
  EXPECT_GT(g_new_calls.load(), at_start) << "operator new is not counted: the zeros prove nothing";
  ASSERT_OK(Publish(2));
  ASSERT_OK(sub->Update());  // warm: every lazily sized scratch is sized
  const int64_t before = g_new_calls.load();
  ASSERT_OK(Publish(3));
  const int64_t in_publish = g_new_calls.load() - before;
  Result<UpdateStats> stats = sub->Update();
  const int64_t allocations = g_new_calls.load() - before - in_publish;
  ASSERT_OK(stats.status());
  EXPECT_EQ(in_publish, 0) << "in Publish";
  EXPECT_EQ(allocations, 0) << "in Update";
  EXPECT_EQ(stats->staging_bytes > 0, staged());
}

std::string Name(const ::testing::TestParamInfo<Param>& info) {
  return std::string(info.param.mode == UpdateMode::kStaged ? "staged" : "in_place") +
         (info.param.store == Store::kRing ? "_ring" : "_arena") + "_" + info.param.transport;
}

INSTANTIATE_TEST_SUITE_P(Modes, StagingBytes,
                         ::testing::Values(Param{UpdateMode::kStaged, Store::kArena, "local"},
                                           Param{UpdateMode::kInPlace, Store::kArena, "local"},
                                           Param{UpdateMode::kStaged, Store::kRing, "local"},
                                           Param{UpdateMode::kInPlace, Store::kRing, "local"},
                                           Param{UpdateMode::kStaged, Store::kArena, "tcp"},
                                           Param{UpdateMode::kInPlace, Store::kArena, "tcp"}),
                         Name);

// In place, a tensor converted at commit lands whole first: its published bytes (float32 here)
// are the staging, the copied tensor needs none.
TEST(StagingBytesConverted, InPlaceTheLandingBufferOfConvertedTensorsOnly) {
  std::vector<float> w(1024, 1.5f);
  std::vector<uint8_t> x(4096, 7);
  auto pub = NewPublisher({});
  ASSERT_NE(pub, nullptr);
  ASSERT_OK(pub->Register(
      {{"w", {w.data(), DType::kFloat32, {1024}}}, {"x", {x.data(), DType::kUInt8, {4096}}}}));
  ASSERT_OK(pub->Publish(1));
  std::vector<uint16_t> w_dst(1024, 0xFFFF);
  std::vector<uint8_t> x_dst(4096, 0xFF);
  const std::vector<NamedTensor> dst = {{"w", {w_dst.data(), DType::kBFloat16, {1024}}},
                                        {"x", {x_dst.data(), DType::kUInt8, {4096}}}};
  for (UpdateMode mode : {UpdateMode::kInPlace, UpdateMode::kStaged}) {
    SubscriberOptions o;
    o.endpoint = pub->endpoint();
    o.mode = mode;
    o.convert_dtypes = true;
    o.timeout = milliseconds(8000);
    const int64_t baseline = ReadLedger().staging_bytes;
    auto sub = testing::NewSubscriber(o, dst);
    ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub->Update());
    if (mode == UpdateMode::kInPlace) {
      EXPECT_EQ(stats.staging_bytes, 1024u * 4) << "in place: the landing of 'w' only";
    } else {
      EXPECT_EQ(stats.staging_bytes, 4096u + 4096u) << "staged: both tensors' published bytes";
    }
    EXPECT_EQ(static_cast<int64_t>(stats.staging_bytes), ReadLedger().staging_bytes - baseline);
    EXPECT_EQ(w_dst[0], 0x3FC0) << "1.5 in bfloat16";
    ASSERT_OK(sub->Close());
    EXPECT_EQ(ReadLedger().staging_bytes, baseline);
  }
}

}  // namespace
}  // namespace weightsync
