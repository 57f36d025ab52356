// MXFP8 and NVFP4 in flight into host destinations (NamedTensor::quantization, docs/quantized.md),
// over shm and tcp, staged and in place: values, scales in both layouts and NVFP4's global scale
// equal the CPU reference of the published bytes, bit for bit, step after step; a corrupted step
// converts nothing (staged); a destination filled by regions is refused at registration.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "testing/block_scaled_model.h"
#include "testing/convert_fixture.h"
#include "testing/test_util.h"
#include "weightsync/region.h"

namespace weightsync {
namespace {

using testing::block_scaled::Destinations;
using testing::block_scaled::Expected;
using testing::block_scaled::ExpectSame;
using testing::block_scaled::Source;

using BlockScaledRoundTrip = testing::ConvertFixture<Source, Destinations>;

TEST_P(BlockScaledRoundTrip, ValuesAndScalesEqualTheReferenceStepAfterStep) {
  auto sub = Connect();
  for (int64_t step = 1; step <= 4; ++step) {
    Publish(step);
    auto r = sub->Update();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->verified);
    EXPECT_EQ(r->tensors, 4u);
    ExpectSame(dst_, Expected(src_), step);
    // What it converted (the four tensors, in the bytes they were published in) and where.
    EXPECT_EQ(r->converted_tensors, 4u);
    EXPECT_EQ(r->converted_bytes, (130 * 96 + 20 * 48) * 2 + (3 * 40 + 200 * 64) * 4);
    EXPECT_EQ(r->converted_on, ConvertedOn::kHost);
    EXPECT_EQ(r->converted_device, -1);
  }
  EXPECT_NE(dst_.w3_global, 1.0f) << "a real global scale, not the fallback";
  auto again = sub->Update();  // up to date: nothing moved, nothing converted
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->up_to_date);
  EXPECT_EQ(again->converted_tensors, 0u);
  EXPECT_EQ(again->converted_on, ConvertedOn::kNone);
}

TEST_P(BlockScaledRoundTrip, ACorruptStepConvertsNothingWhenStaged) {
  auto sub = Connect();
  Source step1;
  step1.Fill(1);
  ExpectACorruptStepConvertsNothing(sub, [&] { ExpectSame(dst_, Expected(step1), 1); });
  ExpectSame(dst_, Expected(src_), 2);
}

INSTANTIATE_TEST_SUITE_P(Transports, BlockScaledRoundTrip, testing::AllTransportModes(),
                         testing::TransportModeName);

TEST(BlockScaledRegistration, ADestinationFilledByRegionsIsRefusedByName) {
  SubscriberOptions o;
  o.endpoint = testing::UniqueEndpoint("blockscaled-regions");
  o.convert_dtypes = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Subscriber> sub, Subscriber::Create(o));
  std::vector<uint8_t> half(64 * 32);
  Status s = sub->Register({{"w",
                             {half.data(), DType::kFloat8E4M3FN, {64, 32}},
                             {Shard("w", {128, 32}, 0, 2, 0)},
                             {Quantization::Format::kMxfp8}}});
  ASSERT_STATUS_IS(kInvalidArgument, s, "'w': block-scaled quantization");
}

}  // namespace
}  // namespace weightsync
