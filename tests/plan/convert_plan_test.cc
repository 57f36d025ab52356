// Tests for planned conversions (SubscriberOptions::convert_dtypes): which dtype pairs become a
// cast or an fp8 quantization, the fp8 scale destination's checks, the in-place landing layout,
// and that with conversion off (the default) every dtype difference is still a listed mismatch;
// then destinations that name a block-scaled format (MXFP8, NVFP4): what each takes and writes,
// and one clear listed problem for each way a registration can be wrong.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "plan/plan.h"
#include "testing/test_util.h"

namespace weightsync::plan {
namespace {

TensorSpec Spec(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  TensorSpec s;
  s.name = name;
  s.dtype = dtype;
  s.shape = std::move(shape);
  uint64_t n = 1;
  for (int64_t d : s.shape) n *= static_cast<uint64_t>(d);
  s.nbytes = *ByteSize(dtype, n);
  return s;
}

wire::Welcome Publishes(const std::vector<TensorSpec>& specs) {
  wire::Welcome w;
  w.segment_bytes = 1000;
  uint64_t at = 0;
  for (const TensorSpec& s : specs) {
    w.tensors.push_back({s, wire::Region::kSlot, at});
    at += s.nbytes;
  }
  w.slots_offset = 0;
  w.slot_bytes = at;
  w.slot_count = 2;
  w.arena_bytes = 2 * at;
  return w;
}

std::vector<Destination> Registers(const std::vector<TensorSpec>& specs) {
  std::vector<Destination> out;
  for (const TensorSpec& s : specs) out.push_back({s, nullptr, Device{}});
  return out;
}

const ConvertOptions kOn{true, "_scale_inv"};

TEST(ConvertPlan, OffByDefaultAConvertiblePairIsAMismatchThatSaysHowToEnableIt) {
  auto w = Publishes({Spec("w", DType::kBFloat16, {4, 8})});
  auto p =
      BuildPlan(w, Registers({Spec("w", DType::kFloat32, {4, 8})}), MatchPolicy::kStrict, 1 << 20);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("dtype mismatch: publisher bfloat16, subscriber float32 "
                                      "(convertible in flight: enable "
                                      "SubscriberOptions.convert_dtypes)"),
            std::string::npos)
      << p.status();
}

TEST(ConvertPlan, CastsAmongTheThreeFloatTypesArePlannedWithTheirElementCount) {
  auto w = Publishes({Spec("a", DType::kBFloat16, {3, 5}), Spec("b", DType::kFloat32, {7}),
                      Spec("c", DType::kFloat16, {2, 2}), Spec("same", DType::kUInt8, {9})});
  auto p =
      BuildPlan(w,
                Registers({Spec("a", DType::kFloat32, {3, 5}), Spec("b", DType::kBFloat16, {7}),
                           Spec("c", DType::kFloat32, {2, 2}), Spec("same", DType::kUInt8, {9})}),
                MatchPolicy::kStrict, 1 << 20, kOn);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->tensors.size(), 4u);
  EXPECT_EQ(p->tensors[0].transform, Transform::kCast);
  EXPECT_EQ(p->tensors[0].elements, 15u);
  EXPECT_EQ(p->tensors[0].nbytes, 30u) << "the published bytes move";
  EXPECT_EQ(p->tensors[1].transform, Transform::kCast);
  EXPECT_EQ(p->tensors[2].transform, Transform::kCast);
  EXPECT_EQ(p->tensors[3].transform, Transform::kCopy);
  EXPECT_EQ(p->converted, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(p->total_bytes, 30u + 28u + 8u + 9u);
}

TEST(ConvertPlan, UnsupportedPairsStayMismatchesEvenWhenEnabled) {
  auto w = Publishes({Spec("i", DType::kInt32, {4}), Spec("f8", DType::kFloat32, {4, 4})});
  auto p = BuildPlan(
      w, Registers({Spec("i", DType::kFloat32, {4}), Spec("f8", DType::kFloat8E4M3FN, {4, 4})}),
      MatchPolicy::kStrict, 1 << 20, kOn);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("2 mismatches"), std::string::npos) << p.status();
  EXPECT_NE(p.status().message().find("'i': dtype mismatch: publisher int32, subscriber float32"),
            std::string::npos)
      << p.status();
}

TEST(ConvertPlan, Fp8QuantizationFindsItsScaleDestination) {
  auto w = Publishes({Spec("layer.weight", DType::kBFloat16, {2, 300, 130})});
  auto p = BuildPlan(w,
                     Registers({Spec("layer.weight", DType::kFloat8E4M3FN, {2, 300, 130}),
                                Spec("layer.weight_scale_inv", DType::kFloat32, {5, 2})}),
                     MatchPolicy::kStrict, 1 << 20, kOn);
  ASSERT_TRUE(p.ok()) << p.status();
  const PlannedTensor& t = p->tensors[0];
  EXPECT_EQ(t.transform, Transform::kQuantizeFp8);
  EXPECT_EQ(t.rows, 600);  // leading dimensions flattened
  EXPECT_EQ(t.cols, 130);
  EXPECT_EQ(t.scale_destination, 1u);
  EXPECT_FALSE(t.e8m0_scales);
}

TEST(ConvertPlan, Fp8ScalesOfAnEmptyLastDimensionFollowTheRowRule) {
  // rows = the product of every dimension but the last, whatever the last is: a [256, 0] tensor
  // has 256 rows of no columns, so its scales are [ceil(256/128), 0] = [2, 0].
  auto w = Publishes({Spec("w", DType::kBFloat16, {256, 0})});
  auto p = BuildPlan(w,
                     Registers({Spec("w", DType::kFloat8E4M3FN, {256, 0}),
                                Spec("w_scale_inv", DType::kFloat32, {2, 0})}),
                     MatchPolicy::kStrict, 1 << 20, kOn);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tensors[0].rows, 256);
  EXPECT_EQ(p->tensors[0].cols, 0);
  p = BuildPlan(w,
                Registers({Spec("w", DType::kFloat8E4M3FN, {256, 0}),
                           Spec("w_scale_inv", DType::kFloat32, {0, 0})}),
                MatchPolicy::kStrict, 1 << 20, kOn);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("has shape [0, 0]; 128x128 blocks of [256, 0] need [2, 0]"),
            std::string::npos)
      << p.status();
}

TEST(ConvertPlan, E8M0ScalesAreRecognised) {
  auto w = Publishes({Spec("w", DType::kBFloat16, {128, 256})});
  auto p = BuildPlan(w,
                     Registers({Spec("w", DType::kFloat8E4M3FN, {128, 256}),
                                Spec("w.s", DType::kFloat8E8M0FNU, {1, 2})}),
                     MatchPolicy::kStrict, 1 << 20, ConvertOptions{true, ".s"});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->tensors[0].e8m0_scales);
}

TEST(ConvertPlan, EveryScaleProblemIsListed) {
  auto w =
      Publishes({Spec("none", DType::kBFloat16, {4, 4}), Spec("shape", DType::kBFloat16, {300, 4}),
                 Spec("dtype", DType::kBFloat16, {4, 4}), Spec("clash", DType::kBFloat16, {4, 4}),
                 Spec("clash_scale_inv", DType::kFloat32, {1, 1})});
  auto p = BuildPlan(w,
                     Registers({Spec("none", DType::kFloat8E4M3FN, {4, 4}),
                                Spec("shape", DType::kFloat8E4M3FN, {300, 4}),
                                Spec("shape_scale_inv", DType::kFloat32, {2, 1}),
                                Spec("dtype", DType::kFloat8E4M3FN, {4, 4}),
                                Spec("dtype_scale_inv", DType::kFloat16, {1, 1}),
                                Spec("clash", DType::kFloat8E4M3FN, {4, 4}),
                                Spec("clash_scale_inv", DType::kFloat32, {1, 1})}),
                     MatchPolicy::kStrict, 1 << 20, kOn);
  ASSERT_FALSE(p.ok());
  const std::string m = p.status().message();
  EXPECT_NE(m.find("'none': bfloat16 → float8_e4m3fn needs a scale destination 'none_scale_inv' "
                   "(float32 or float8_e8m0fnu, shape [1, 1]); none is registered"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("'shape': scale destination 'shape_scale_inv' has shape [2, 1]; 128x128 "
                   "blocks of [300, 4] need [3, 1]"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("'dtype': scale destination 'dtype_scale_inv' is float16"), std::string::npos)
      << m;
  EXPECT_NE(m.find("'clash_scale_inv': published, but it is also where the scales of 'clash' go"),
            std::string::npos)
      << m;
}

TEST(ConvertPlan, InPlaceLandingHoldsOnlyConvertedTensorsAndSegmentsKnowIt) {
  auto w = Publishes({Spec("copy", DType::kFloat32, {1000}), Spec("cast", DType::kBFloat16, {700}),
                      Spec("copy2", DType::kUInt8, {10}), Spec("cast2", DType::kFloat16, {3})});
  auto p = BuildPlan(
      w,
      Registers({Spec("copy", DType::kFloat32, {1000}), Spec("cast", DType::kFloat32, {700}),
                 Spec("copy2", DType::kUInt8, {10}), Spec("cast2", DType::kBFloat16, {3})}),
      MatchPolicy::kStrict, 1 << 20, kOn);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tensors[1].landing_offset, 0u);
  EXPECT_EQ(p->tensors[3].landing_offset, 1408u);  // 1400 rounded up to 64
  EXPECT_EQ(p->landing_bytes, 1408u + 6u);
  EXPECT_LT(p->landing_bytes, p->shadow_bytes);
  for (const Segment& s : p->segments) {
    const PlannedTensor& t = p->tensors[s.destination];  // destinations in publisher order here
    EXPECT_EQ(s.converted, t.transform != Transform::kCopy);
    if (s.converted) {
      EXPECT_EQ(s.landing_offset, t.landing_offset + s.dst_offset);
    }
  }
}

// ---- block-scaled destinations (plan/block_scaled_plan.h): MXFP8, NVFP4 ----------------------

using F = Quantization::Format;
using L = Quantization::ScaleLayout;

Destination Dst(TensorSpec spec, Quantization q = {}) {
  Destination d{std::move(spec), nullptr, Device{}};
  d.quantization = std::move(q);
  return d;
}

Result<Plan> Build(const std::vector<TensorSpec>& published, const std::vector<Destination>& dsts,
                   const ConvertOptions& convert = kOn) {
  return BuildPlan(Publishes(published), dsts, MatchPolicy::kStrict, 1 << 20, convert);
}

TEST(BlockScaledPlan, Mxfp8AndNvfp4ArePlannedWithTheirScaleTensors) {
  auto p =
      Build({Spec("a", DType::kBFloat16, {260, 64}), Spec("b", DType::kFloat32, {20, 48})},
            {Dst(Spec("a", DType::kFloat8E4M3FN, {260, 64}), {F::kMxfp8, L::kSwizzled128x4}),
             Dst(Spec("a_scale_inv", DType::kFloat8E8M0FNU, {384, 4})),
             Dst(Spec("b", DType::kFloat4E2M1FN, {20, 48}), {F::kNvfp4, L::kRowMajor, "bs", "bg"}),
             Dst(Spec("bs", DType::kUInt8, {20, 3})), Dst(Spec("bg", DType::kFloat32, {}))});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->tensors.size(), 2u);
  const PlannedTensor& a = p->tensors[0];
  EXPECT_EQ(a.transform, Transform::kQuantizeMxfp8);
  EXPECT_EQ(a.rows, 260);
  EXPECT_EQ(a.cols, 64);
  EXPECT_EQ(a.scale_destination, 1u);
  EXPECT_EQ(a.scale_layout, L::kSwizzled128x4);
  const PlannedTensor& b = p->tensors[1];
  EXPECT_EQ(b.transform, Transform::kQuantizeNvfp4);
  EXPECT_EQ(b.scale_destination, 3u);
  EXPECT_EQ(b.global_scale_destination, 4u);
  EXPECT_EQ(p->converted, (std::vector<uint32_t>{0, 1}));
}

TEST(BlockScaledPlan, EveryWrongRegistrationIsAListedProblem) {
  auto p = Build(
      {Spec("off", DType::kBFloat16, {4, 32}), Spec("f16", DType::kFloat16, {4, 32}),
       Spec("odd", DType::kBFloat16, {4, 33}), Spec("noscale", DType::kBFloat16, {4, 32}),
       Spec("shape", DType::kBFloat16, {130, 64}), Spec("noglobal", DType::kBFloat16, {4, 32}),
       Spec("badglobal", DType::kBFloat16, {4, 32})},
      {Dst(Spec("off", DType::kFloat8E4M3FN, {4, 32}), {F::kNvfp4}),
       Dst(Spec("f16", DType::kFloat8E4M3FN, {4, 32}), {F::kMxfp8}),
       Dst(Spec("odd", DType::kFloat4E2M1FN, {4, 33}), {F::kNvfp4}),
       Dst(Spec("noscale", DType::kFloat8E4M3FN, {4, 32}), {F::kMxfp8}),
       // Row-major [130, 2] registered where the swizzled layout needs [256, 4].
       Dst(Spec("shape", DType::kFloat8E4M3FN, {130, 64}), {F::kMxfp8, L::kSwizzled128x4}),
       Dst(Spec("shape_scale_inv", DType::kFloat8E8M0FNU, {130, 2})),
       Dst(Spec("noglobal", DType::kFloat4E2M1FN, {4, 32}), {F::kNvfp4}),
       Dst(Spec("noglobal_scale_inv", DType::kFloat8E4M3FN, {4, 2})),
       Dst(Spec("badglobal", DType::kFloat4E2M1FN, {4, 32}), {F::kNvfp4}),
       Dst(Spec("badglobal_scale_inv", DType::kFloat8E4M3FN, {4, 2})),
       Dst(Spec("badglobal_scale_2", DType::kFloat16, {1}))});
  ASSERT_STATUS_IS(kInvalidArgument, p, "7 mismatches");
  const std::string m = p.status().message();
  for (const char* want :
       {"'off': NVFP4 quantizes bfloat16 or float32 into float4_e2m1fn; the publisher has "
        "bfloat16, the destination float8_e4m3fn",
        "'f16': MXFP8 quantizes bfloat16 or float32 into float8_e4m3fn; the publisher has "
        "float16",
        "'odd': NVFP4 packs two elements of a row per byte; rows of 33 elements (odd)",
        "'noscale': MXFP8 needs a destination 'noscale_scale_inv' (its scales: float8_e8m0fnu "
        "or uint8, [4, 1] (row-major)); none is registered",
        "'shape': MXFP8 scale destination 'shape_scale_inv' is float8_e8m0fnu [130, 2]; [130, "
        "64] needs float8_e8m0fnu or uint8, [256, 4] (swizzled 128x4)",
        "'noglobal': NVFP4 needs a destination 'noglobal_scale_2' (its global scale",
        "'badglobal': NVFP4 global scale destination 'badglobal_scale_2' is float16 [1]; one "
        "float32 expected"}) {
    EXPECT_NE(m.find(want), std::string::npos) << want << "\n" << m;
  }
}

TEST(BlockScaledPlan, WithoutConvertDtypesANamedFormatSaysHowToEnableIt) {
  auto p = Build({Spec("a", DType::kBFloat16, {4, 32})},
                 {Dst(Spec("a", DType::kFloat8E4M3FN, {4, 32}), {F::kMxfp8}),
                  Dst(Spec("a_scale_inv", DType::kFloat8E8M0FNU, {4, 1}))},
                 ConvertOptions{});
  ASSERT_STATUS_IS(kInvalidArgument, p,
                   "'a': MXFP8 quantization needs SubscriberOptions.convert_dtypes");
}

TEST(BlockScaledPlan, ScaleTensorsOfTheWrongSizeTypeOrMemoryAreRefused) {
  std::vector<Destination> dsts = {
      // The right last dimension, too few rows for the swizzled layout ([256, 4] needed).
      Dst(Spec("rows", DType::kFloat8E4M3FN, {130, 64}), {F::kMxfp8, L::kSwizzled128x4}),
      Dst(Spec("rows_scale_inv", DType::kFloat8E8M0FNU, {2, 4})),
      // The right bytes ([512, 2] and [256, 4] are both 1024), the wrong last dimension.
      Dst(Spec("cols", DType::kFloat8E4M3FN, {130, 64}), {F::kMxfp8, L::kSwizzled128x4}),
      Dst(Spec("cols_scale_inv", DType::kFloat8E8M0FNU, {512, 2})),
      Dst(Spec("dtype", DType::kFloat8E4M3FN, {4, 32}), {F::kMxfp8}),
      Dst(Spec("dtype_scale_inv", DType::kFloat32, {4, 1})),
      Dst(Spec("empty", DType::kFloat4E2M1FN, {4, 32}), {F::kNvfp4}),
      Dst(Spec("empty_scale_inv", DType::kFloat8E4M3FN, {4, 2})),
      Dst(Spec("empty_scale_2", DType::kFloat32, {0})),
      Dst(Spec("moe", DType::kFloat8E4M3FN, {2, 128, 64}), {F::kMxfp8, L::kSwizzled128x4}),
      Dst(Spec("moe_scale_inv", DType::kFloat8E8M0FNU, {256, 4})),
      // Two tensors whose scale tensors are one memory (the second aliases the first).
      Dst(Spec("x", DType::kFloat8E4M3FN, {4, 32}), {F::kMxfp8}),
      Dst(Spec("x_scale_inv", DType::kFloat8E8M0FNU, {4, 1})),
      Dst(Spec("y", DType::kFloat8E4M3FN, {4, 32}), {F::kMxfp8}),
      Dst(Spec("y_scale_inv", DType::kFloat8E8M0FNU, {4, 1}))};
  dsts.back().alias_of = static_cast<uint32_t>(dsts.size() - 3);
  // A published tensor registered at the memory of another tensor's scales.
  dsts.push_back(Dst(Spec("q", DType::kFloat8E4M3FN, {4, 32}), {F::kMxfp8}));
  dsts.push_back(Dst(Spec("q_scale_inv", DType::kFloat8E8M0FNU, {4, 1})));
  dsts.push_back(Dst(Spec("pub", DType::kFloat8E8M0FNU, {4, 1})));
  dsts.back().alias_of = static_cast<uint32_t>(dsts.size() - 2);
  auto p =
      Build({Spec("rows", DType::kBFloat16, {130, 64}), Spec("cols", DType::kBFloat16, {130, 64}),
             Spec("dtype", DType::kBFloat16, {4, 32}), Spec("empty", DType::kBFloat16, {4, 32}),
             Spec("moe", DType::kBFloat16, {2, 128, 64}), Spec("x", DType::kBFloat16, {4, 32}),
             Spec("y", DType::kBFloat16, {4, 32}), Spec("q", DType::kBFloat16, {4, 32}),
             Spec("pub", DType::kFloat8E8M0FNU, {4, 1})},
            dsts);
  ASSERT_STATUS_IS(kInvalidArgument, p, "7 mismatches");
  const std::string m = p.status().message();
  for (const char* want :
       {"'rows': MXFP8 scale destination 'rows_scale_inv' is float8_e8m0fnu [2, 4]",
        "'cols': MXFP8 scale destination 'cols_scale_inv' is float8_e8m0fnu [512, 2]",
        "'dtype': MXFP8 scale destination 'dtype_scale_inv' is float32 [4, 1]",
        "'empty': NVFP4 global scale destination 'empty_scale_2' is float32 [0]",
        "'moe': MXFP8 with swizzled scales of a tensor of 3 dimensions is not supported yet",
        "'x_scale_inv': receives the scales of two tensors",
        "'q_scale_inv': published, but it is also where the scales of 'q' go"}) {
    EXPECT_NE(m.find(want), std::string::npos) << want << "\n" << m;
  }
}

}  // namespace
}  // namespace weightsync::plan
