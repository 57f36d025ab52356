// Conversions in flight into host destinations (SubscriberOptions::convert_dtypes), over shm and
// tcp, staged and in place: every converted destination must equal the CPU reference transform of
// the published bytes, bit for bit, step after step; verification covers the published bytes; a
// corrupted step converts nothing (staged).

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/transform_reference.h"
#include "testing/convert_fixture.h"
#include "testing/test_util.h"

namespace weightsync {
namespace {

namespace ref = cuda::reference;

// Publisher-side tensors: bf16 matrices (fp8 with partial edge blocks, casts), f32, f16, bytes.
struct Source {
  std::vector<uint16_t> a = std::vector<uint16_t>(256 * 384);  // bf16 → fp8, float32 scales
  std::vector<uint16_t> b = std::vector<uint16_t>(200 * 130);  // bf16 → fp8, e8m0 scales
  std::vector<uint16_t> c = std::vector<uint16_t>(1000);       // bf16 → float32
  std::vector<float> d = std::vector<float>(64 * 64);          // float32 → bfloat16
  std::vector<uint16_t> e = std::vector<uint16_t>(10);         // float16 → float32
  std::vector<uint8_t> f = std::vector<uint8_t>(100);          // copied as is

  void Fill(int64_t step) {
    std::mt19937 rng(static_cast<uint32_t>(step));
    std::normal_distribution<float> n(0.f, 3.f);
    for (auto* v : {&a, &b, &c}) {
      for (auto& x : *v) x = ref::FloatToBFloat16(n(rng));
    }
    a[5] = ref::FloatToBFloat16(1000.f);  // a block whose scale is set by one outlier
    for (auto& x : d) x = n(rng) * 1e3f;
    for (auto& x : e) x = ref::FloatToFloat16(n(rng));
    for (auto& x : f) x = static_cast<uint8_t>(rng());
  }
  std::vector<NamedTensor> Tensors() {
    return {{"a", {a.data(), DType::kBFloat16, {256, 384}}},
            {"b", {b.data(), DType::kBFloat16, {2, 100, 130}}},
            {"c", {c.data(), DType::kBFloat16, {1000}}},
            {"d", {d.data(), DType::kFloat32, {64, 64}}},
            {"e", {e.data(), DType::kFloat16, {10}}},
            {"f", {f.data(), DType::kUInt8, {100}}}};
  }
};

// Subscriber-side destinations, poison-filled.
struct Destinations {
  std::vector<uint8_t> a = std::vector<uint8_t>(256 * 384, 0xEE);
  std::vector<float> a_scale = std::vector<float>(2 * 3, -1.f);
  std::vector<uint8_t> b = std::vector<uint8_t>(200 * 130, 0xEE);
  std::vector<uint8_t> b_scale = std::vector<uint8_t>(2 * 2, 0xEE);
  std::vector<float> c = std::vector<float>(1000, -1.f);
  std::vector<uint16_t> d = std::vector<uint16_t>(64 * 64, 0xEEEE);
  std::vector<float> e = std::vector<float>(10, -1.f);
  std::vector<uint8_t> f = std::vector<uint8_t>(100, 0xEE);

  std::vector<NamedTensor> Tensors() {
    return {{"a", {a.data(), DType::kFloat8E4M3FN, {256, 384}}},
            {"a_scale_inv", {a_scale.data(), DType::kFloat32, {2, 3}}},
            {"b", {b.data(), DType::kFloat8E4M3FN, {2, 100, 130}}},
            {"b_scale_inv", {b_scale.data(), DType::kFloat8E8M0FNU, {2, 2}}},
            {"c", {c.data(), DType::kFloat32, {1000}}},
            {"d", {d.data(), DType::kBFloat16, {64, 64}}},
            {"e", {e.data(), DType::kFloat32, {10}}},
            {"f", {f.data(), DType::kUInt8, {100}}}};
  }
  std::vector<uint64_t> Digests() { return testing::Digests(Tensors()); }
};

// What the destinations must hold after converting `src`, from the CPU references.
Destinations Expected(Source& src) {
  Destinations x;
  EXPECT_OK(ref::QuantizeFp8(src.a.data(), 256, 384, x.a.data(), x.a_scale.data(),
                             cuda::Fp8ScaleFormat::kFloat32));
  EXPECT_OK(ref::QuantizeFp8(src.b.data(), 200, 130, x.b.data(), x.b_scale.data(),
                             cuda::Fp8ScaleFormat::kE8M0));
  EXPECT_OK(ref::Cast(DType::kBFloat16, DType::kFloat32, src.c.data(), x.c.data(), 1000));
  EXPECT_OK(ref::Cast(DType::kFloat32, DType::kBFloat16, src.d.data(), x.d.data(), 64 * 64));
  EXPECT_OK(ref::Cast(DType::kFloat16, DType::kFloat32, src.e.data(), x.e.data(), 10));
  x.f = src.f;
  return x;
}

using ConvertRoundTrip = testing::ConvertFixture<Source, Destinations>;

TEST_P(ConvertRoundTrip, EveryConvertedTensorEqualsTheReferenceStepAfterStep) {
  auto sub = Connect(true);
  for (int64_t step = 1; step <= 4; ++step) {
    Publish(step);
    auto r = sub->Update();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->verified);
    EXPECT_EQ(r->tensors, 6u);
    EXPECT_EQ(r->prepare_count, 1u);
    Destinations want = Expected(src_);
    EXPECT_EQ(dst_.Digests(), want.Digests()) << "step " << step;
    EXPECT_EQ(dst_.a_scale, want.a_scale);
    EXPECT_EQ(dst_.b_scale, want.b_scale);
  }
}

TEST_P(ConvertRoundTrip, WithoutConvertDtypesTheDifferencesAreListedMismatches) {
  auto sub = Connect(false);
  Publish(1);
  auto r = sub->Update();
  ASSERT_STATUS_IS(kInvalidArgument, r, "7 mismatches");
}

TEST_P(ConvertRoundTrip, ACorruptStepConvertsNothingWhenStaged) {
  auto sub = Connect(true);
  Source step1;
  step1.Fill(1);
  ExpectACorruptStepConvertsNothing(sub, [&] {
    EXPECT_EQ(dst_.Digests(), Expected(step1).Digests())
        << "staged: a corrupt step must not reach the destinations";
  });
  EXPECT_EQ(dst_.Digests(), Expected(src_).Digests());
}

INSTANTIATE_TEST_SUITE_P(Transports, ConvertRoundTrip, testing::AllTransportModes(),
                         testing::TransportModeName);

}  // namespace
}  // namespace weightsync
