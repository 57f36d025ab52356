// A small model of MXFP8 and NVFP4 destinations (docs/quantized.md) shared by the suites that
// check block-scaled conversions in flight: what the publisher holds (Source: bf16 and f32, partial
// blocks, rows that are not multiples of 128), the host destinations with their scale tensors in
// both layouts and NVFP4's global scales (Destinations), and what they must hold after a step
// (Expected: the CPU references of Source).
#pragma once

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cuda/block_scaled_reference.h"
#include "cuda/transform_reference.h"
#include "testing/status_matchers.h"
#include "weightsync/tensor_view.h"

namespace weightsync::testing::block_scaled {

namespace ref = cuda::reference;
using Layout = Quantization::ScaleLayout;

// Published: two MXFP8 tensors and two NVFP4 ones, bf16 and f32, with partial blocks and rows
// that are not multiples of 128 (swizzled padding).
struct Source {
  std::vector<uint16_t> w1 = std::vector<uint16_t>(130 * 96);  // bf16 → MXFP8, swizzled
  std::vector<float> w2 = std::vector<float>(3 * 40);          // f32 → MXFP8, row-major
  std::vector<uint16_t> w3 = std::vector<uint16_t>(20 * 48);   // bf16 → NVFP4, row-major
  std::vector<float> w4 = std::vector<float>(200 * 64);        // f32 → NVFP4, swizzled

  void Fill(int64_t step) {
    std::mt19937 rng(static_cast<uint32_t>(step));
    std::normal_distribution<float> n(0.f, 0.02f);
    for (auto* v : {&w1, &w3}) {
      for (auto& x : *v) x = ref::FloatToBFloat16(n(rng));
    }
    for (auto* v : {&w2, &w4}) {
      for (auto& x : *v) x = n(rng);
    }
    w1[7] = ref::FloatToBFloat16(3.0f);  // one block set by an outlier
    w4[100] = -5.0f;                     // and the NVFP4 tensor's amax
  }
  std::vector<NamedTensor> Tensors() {
    return {{"w1", {w1.data(), DType::kBFloat16, {130, 96}}},
            {"w2", {w2.data(), DType::kFloat32, {3, 40}}},
            {"w3", {w3.data(), DType::kBFloat16, {20, 48}}},
            {"w4", {w4.data(), DType::kFloat32, {200, 64}}}};
  }
};

struct Destinations {
  std::vector<uint8_t> w1 = std::vector<uint8_t>(130 * 96, 0xEE);
  std::vector<uint8_t> w1_scales = std::vector<uint8_t>(256 * 4, 0xEE);  // 3 blocks → 4, 130 → 256
  std::vector<uint8_t> w2 = std::vector<uint8_t>(3 * 40, 0xEE);
  std::vector<uint8_t> w2_scales = std::vector<uint8_t>(3 * 2, 0xEE);
  std::vector<uint8_t> w3 = std::vector<uint8_t>(20 * 24, 0xEE);
  std::vector<uint8_t> w3_scales = std::vector<uint8_t>(20 * 3, 0xEE);
  float w3_global = -1;
  std::vector<uint8_t> w4 = std::vector<uint8_t>(200 * 32, 0xEE);
  std::vector<uint8_t> w4_scales = std::vector<uint8_t>(256 * 4, 0xEE);
  float w4_global = -1;

  static Quantization Q(Quantization::Format f, Layout layout, std::string scales = "",
                        std::string global = "") {
    return {f, layout, std::move(scales), std::move(global)};
  }
  std::vector<NamedTensor> Tensors() {
    using F = Quantization::Format;
    return {
        {"w1",
         {w1.data(), DType::kFloat8E4M3FN, {130, 96}},
         {},
         Q(F::kMxfp8, Layout::kSwizzled128x4, "w1.weight_scale")},
        {"w1.weight_scale", {w1_scales.data(), DType::kFloat8E8M0FNU, {256, 4}}},
        {"w2", {w2.data(), DType::kFloat8E4M3FN, {3, 40}}, {}, Q(F::kMxfp8, Layout::kRowMajor)},
        {"w2_scale_inv", {w2_scales.data(), DType::kUInt8, {3, 2}}},
        {"w3", {w3.data(), DType::kFloat4E2M1FN, {20, 48}}, {}, Q(F::kNvfp4, Layout::kRowMajor)},
        {"w3_scale_inv", {w3_scales.data(), DType::kFloat8E4M3FN, {20, 3}}},
        {"w3_scale_2", {&w3_global, DType::kFloat32, {}}},
        {"w4",
         {w4.data(), DType::kFloat4E2M1FN, {200, 64}},
         {},
         Q(F::kNvfp4, Layout::kSwizzled128x4, "w4.scales", "w4.global")},
        {"w4.scales", {w4_scales.data(), DType::kUInt8, {1024}}},
        {"w4.global", {&w4_global, DType::kFloat32, {1}}}};
  }
};

inline Destinations Expected(Source& s) {
  Destinations x;
  EXPECT_OK(ref::QuantizeMxfp8(DType::kBFloat16, s.w1.data(), 130, 96, x.w1.data(),
                               x.w1_scales.data(), cuda::ScaleLayout::kSwizzled128x4));
  EXPECT_OK(ref::QuantizeMxfp8(DType::kFloat32, s.w2.data(), 3, 40, x.w2.data(), x.w2_scales.data(),
                               cuda::ScaleLayout::kRowMajor));
  EXPECT_OK(ref::QuantizeNvfp4(DType::kBFloat16, s.w3.data(), 20, 48, x.w3.data(),
                               x.w3_scales.data(), &x.w3_global, cuda::ScaleLayout::kRowMajor));
  EXPECT_OK(ref::QuantizeNvfp4(DType::kFloat32, s.w4.data(), 200, 64, x.w4.data(),
                               x.w4_scales.data(), &x.w4_global,
                               cuda::ScaleLayout::kSwizzled128x4));
  return x;
}

inline void ExpectSame(const Destinations& got, const Destinations& want, int64_t step) {
  EXPECT_EQ(got.w1, want.w1) << "step " << step;
  EXPECT_EQ(got.w1_scales, want.w1_scales) << "step " << step;
  EXPECT_EQ(got.w2, want.w2) << "step " << step;
  EXPECT_EQ(got.w2_scales, want.w2_scales) << "step " << step;
  EXPECT_EQ(got.w3, want.w3) << "step " << step;
  EXPECT_EQ(got.w3_scales, want.w3_scales) << "step " << step;
  EXPECT_EQ(got.w3_global, want.w3_global) << "step " << step;
  EXPECT_EQ(got.w4, want.w4) << "step " << step;
  EXPECT_EQ(got.w4_scales, want.w4_scales) << "step " << step;
  EXPECT_EQ(got.w4_global, want.w4_global) << "step " << step;
}

}  // namespace weightsync::testing::block_scaled
