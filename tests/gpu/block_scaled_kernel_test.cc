// The MXFP8 and NVFP4 kernels (cuda/block_scaled_kernels.h) against the CPU references
// (cuda/block_scaled_reference.h), bit for bit: values, scales in both layouts (padding zeroed over
// poison) and NVFP4's global scale, for bf16 and f32 inputs, on awkward shapes (one element, rows
// and columns off every block size, odd NVFP4 rows, zero rows or columns, a 128-row band and
// more) and awkward values (NaN, ±inf, subnormals, all-equal blocks, huge and tiny amax, random bit
// patterns), through the vector path and the element-by-element one (misaligned pointers), all in
// one prepared group launched more than once. The one tolerated difference: a NaN MXFP8 value may
// be either NaN code (the sign of a NaN is not part of the contract).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/block_scaled_kernels.h"
#include "cuda/block_scaled_reference.h"
#include "cuda/transform_reference.h"
#include "gpu/gpu_test_util.h"

namespace weightsync::cuda {
namespace {

using testing::Download;
using testing::Upload;

enum class Fill { kNormal, kSpecial, kBits };

struct Case {
  int64_t rows, cols;
  DType from;
  BlockFormat format;
  ScaleLayout layout;
  Fill fill;
  bool misaligned = false;  // x one element and values one byte past an aligned address
};

std::string Describe(const Case& c) {
  return std::to_string(c.rows) + "x" + std::to_string(c.cols) + " " +
         std::string(DTypeName(c.from)) + (c.format == BlockFormat::kMxfp8 ? " mxfp8" : " nvfp4") +
         (c.layout == ScaleLayout::kRowMajor ? " row-major" : " swizzled") + " fill " +
         std::to_string(int(c.fill)) + (c.misaligned ? " misaligned" : "");
}

// Element values as float32: normal values whose magnitude changes by block (many binades), or
// the special ones, or (bits) raw bit patterns of the input dtype.
std::vector<float> Values(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = c.rows * c.cols;
  std::vector<float> v(n);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            1e-40f,  // float32 subnormal (bf16 keeps it: same exponent range)
                            -3e-39f,
                            0.0f,
                            -0.0f,
                            3.0e38f,
                            448.0f,
                            6.0f,
                            1e-30f};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = i / std::max<int64_t>(c.cols, 1), col = i % std::max<int64_t>(c.cols, 1);
    const int64_t block = col / 16;
    switch (c.fill) {
      case Fill::kNormal: {
        const int binade = int((r * 7 + block * 13) % 60) - 30;
        v[i] = (r + block) % 9 == 4 ? 0.375f : std::ldexp(normal(rng), binade);  // some all equal
        break;
      }
      case Fill::kSpecial:
        v[i] = rng() % 4 == 0 ? specials[rng() % std::size(specials)] : normal(rng) * 1e-3f;
        break;
      case Fill::kBits: {
        uint32_t bits = rng();
        if (c.from == DType::kBFloat16) bits &= 0xFFFF0000u;
        std::memcpy(&v[i], &bits, 4);
        break;
      }
    }
  }
  return v;
}

// The input bytes of `values` in the case's dtype.
std::vector<uint8_t> Encode(DType from, const std::vector<float>& values) {
  std::vector<uint8_t> out(values.size() * (from == DType::kFloat32 ? 4 : 2));
  for (size_t i = 0; i < values.size(); ++i) {
    if (from == DType::kFloat32) {
      std::memcpy(&out[4 * i], &values[i], 4);
    } else {
      uint32_t bits;
      std::memcpy(&bits, &values[i], 4);
      // bf16 by truncation (exact for the bit-pattern fill; the test needs bf16 inputs, not any
      // particular rounding of them), NaN kept NaN.
      const uint16_t b = uint16_t(bits >> 16) | (std::isnan(values[i]) ? 0x40 : 0);
      std::memcpy(&out[2 * i], &b, 2);
    }
  }
  return out;
}

struct Expected {
  std::vector<uint8_t> values, scales;
  float global = 1.0f;
};

Expected Reference(const Case& c, const std::vector<uint8_t>& x) {
  Expected e;
  e.values.resize(c.rows * ValueBytesPerRow(c.format, c.cols));
  e.scales.resize(ScaleShapeFor(c.format, c.layout, c.rows, c.cols).bytes());
  if (c.format == BlockFormat::kMxfp8) {
    EXPECT_OK(reference::QuantizeMxfp8(c.from, x.data(), c.rows, c.cols, e.values.data(),
                                       e.scales.data(), c.layout));
  } else {
    EXPECT_OK(reference::QuantizeNvfp4(c.from, x.data(), c.rows, c.cols, e.values.data(),
                                       e.scales.data(), &e.global, c.layout));
  }
  return e;
}

// Device buffers of one case: input, outputs (poisoned, so padding and skipped bytes show).
struct OnDevice {
  DeviceBuffer x, values, scales, global;
  size_t x_skip = 0, values_skip = 0;
};

class BlockScaledKernel : public ::testing::Test {
 protected:
  void SetUp() override { WS_SKIP_WITHOUT_GPU(); }

  static void Allocate(DeviceBuffer* b, size_t bytes) {
    Result<DeviceBuffer> r = DeviceBuffer::Allocate(bytes);
    EXPECT_OK(r.status());
    if (r.ok()) *b = std::move(r).value();
  }

  // Uploads every case's input (at `seed`), returns the tensors for a group.
  std::vector<BlockScaledTensor> Place(const std::vector<Case>& cases, uint32_t seed) {
    std::vector<BlockScaledTensor> tensors;
    inputs_.clear();
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      inputs_.push_back(Encode(c.from, Values(c, seed + uint32_t(i))));
      if (device_.size() <= i) device_.emplace_back();
      OnDevice& d = device_[i];
      const size_t elem = c.from == DType::kFloat32 ? 4 : 2;
      d.x_skip = c.misaligned ? elem : 0;
      d.values_skip = c.misaligned ? 1 : 0;
      if (d.x.data() == nullptr) {
        const size_t value_bytes = c.rows * ValueBytesPerRow(c.format, c.cols);
        const size_t scale_bytes = ScaleShapeFor(c.format, c.layout, c.rows, c.cols).bytes();
        Allocate(&d.x, inputs_[i].size() + d.x_skip + 1);
        Allocate(&d.values, value_bytes + d.values_skip + 1);
        Allocate(&d.scales, scale_bytes + 1);
        Allocate(&d.global, 4);
      }
      EXPECT_OK(CopyToDevice(d.x.as<uint8_t>() + d.x_skip, inputs_[i].data(), inputs_[i].size()));
      EXPECT_OK(MemsetDevice(d.values.data(), 0xEE, d.values.size()));
      EXPECT_OK(MemsetDevice(d.scales.data(), 0xEE, d.scales.size()));
      EXPECT_OK(MemsetDevice(d.global.data(), 0xEE, 4));
      tensors.push_back({c.from, d.x.as<uint8_t>() + d.x_skip,
                         d.values.as<uint8_t>() + d.values_skip, d.scales.data(), d.global.data(),
                         c.rows, c.cols, c.format, c.layout});
    }
    return tensors;
  }

  // Every case's outputs against the reference of its current input.
  void Check(const std::vector<Case>& cases) {
    ASSERT_OK(DeviceSynchronize());
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      SCOPED_TRACE(Describe(c));
      const Expected want = Reference(c, inputs_[i]);
      const OnDevice& d = device_[i];
      ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> values,
                           Download<uint8_t>(d.values.data(), d.values.size()));
      ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> scales,
                           Download<uint8_t>(d.scales.data(), d.scales.size()));
      ASSERT_OK_AND_ASSIGN(std::vector<float> global, Download<float>(d.global.data(), 1));
      // Nothing written outside the tensors.
      if (d.values_skip) {
        EXPECT_EQ(values.front(), 0xEE) << "wrote before the values";
      }
      EXPECT_EQ(values.back(), 0xEE) << "wrote past the values";
      EXPECT_EQ(scales.back(), 0xEE) << "wrote past the scales";
      scales.pop_back();
      EXPECT_EQ(scales, want.scales) << "scales differ";
      size_t bad = 0, first = want.values.size();
      for (size_t k = 0; k < want.values.size(); ++k) {
        const uint8_t got = values[d.values_skip + k], expect = want.values[k];
        const bool both_nan =
            c.format == BlockFormat::kMxfp8 && (got & 0x7F) == 0x7F && (expect & 0x7F) == 0x7F;
        if (got != expect && !both_nan) {
          ++bad;
          first = std::min(first, k);
        }
      }
      EXPECT_EQ(bad, 0u) << "values differ from byte " << first << ": got "
                         << (bad ? int(values[d.values_skip + first]) : 0) << " want "
                         << (bad ? int(want.values[first]) : 0);
      if (c.format == BlockFormat::kNvfp4) {
        EXPECT_EQ(std::memcmp(&global[0], &want.global, 4), 0)
            << "global scale " << global[0] << ", want " << want.global;
      } else {
        uint32_t untouched;
        std::memcpy(&untouched, &global[0], 4);
        EXPECT_EQ(untouched, 0xEEEEEEEEu) << "MXFP8 has no global scale to write";
      }
    }
  }

  std::vector<std::vector<uint8_t>> inputs_;
  std::vector<OnDevice> device_;
};

std::vector<Case> AwkwardCases() {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1},    {3, 40},  {130, 96}, {200, 64},
                                                {257, 33}, {5, 7},   {0, 64},   {64, 0},
                                                {2, 1000}, {129, 8}, {17, 15},  {256, 128}};
  std::vector<Case> cases;
  int k = 0;
  for (auto [rows, cols] : shapes) {
    for (BlockFormat format : {BlockFormat::kMxfp8, BlockFormat::kNvfp4}) {
      for (ScaleLayout layout : {ScaleLayout::kRowMajor, ScaleLayout::kSwizzled128x4}) {
        ++k;
        const DType from = k % 2 ? DType::kBFloat16 : DType::kFloat32;
        const Fill fill = Fill(k % 3);
        cases.push_back({rows, cols, from, format, layout, fill, k % 4 == 3});
      }
    }
  }
  return cases;
}

TEST_F(BlockScaledKernel, EveryShapeFormatLayoutAndInputEqualsTheReference) {
  const std::vector<Case> cases = AwkwardCases();
  std::vector<BlockScaledTensor> tensors = Place(cases, 1);
  ASSERT_OK_AND_ASSIGN(PreparedBlockScaledGroup group,
                       PrepareQuantizeBlockScaledGroup(tensors, nullptr));
  EXPECT_EQ(group.tensors(), cases.size());
  ASSERT_OK(group.Launch());
  Check(cases);
}

// Each fill, dtype, format and layout on the same aligned and misaligned shapes, so the vector
// path (aligned, cols % 8 == 0) and the element path both see every kind of input.
TEST_F(BlockScaledKernel, VectorAndElementPathsAgreeOnEveryKindOfInput) {
  std::vector<Case> cases;
  for (Fill fill : {Fill::kNormal, Fill::kSpecial, Fill::kBits}) {
    for (DType from : {DType::kBFloat16, DType::kFloat32}) {
      for (BlockFormat format : {BlockFormat::kMxfp8, BlockFormat::kNvfp4}) {
        for (bool misaligned : {false, true}) {
          const ScaleLayout layout =
              misaligned ? ScaleLayout::kRowMajor : ScaleLayout::kSwizzled128x4;
          cases.push_back({136, 256, from, format, layout, fill, misaligned});
        }
      }
    }
  }
  std::vector<BlockScaledTensor> tensors = Place(cases, 7);
  ASSERT_OK_AND_ASSIGN(PreparedBlockScaledGroup group,
                       PrepareQuantizeBlockScaledGroup(tensors, nullptr));
  ASSERT_OK(group.Launch());
  Check(cases);
}

// A prepared group is launched step after step over new inputs: the NVFP4 amax is recomputed
// from zero each time (a step whose values shrink must not keep the last step's global scale).
TEST_F(BlockScaledKernel, APreparedGroupLaunchedAgainFollowsItsNewInputs) {
  std::vector<Case> cases = {
      {64, 256, DType::kBFloat16, BlockFormat::kNvfp4, ScaleLayout::kRowMajor, Fill::kNormal},
      {40, 96, DType::kFloat32, BlockFormat::kMxfp8, ScaleLayout::kSwizzled128x4, Fill::kNormal}};
  std::vector<BlockScaledTensor> tensors = Place(cases, 11);
  ASSERT_OK_AND_ASSIGN(PreparedBlockScaledGroup group,
                       PrepareQuantizeBlockScaledGroup(tensors, nullptr));
  ASSERT_OK(group.Launch());
  Check(cases);
  for (uint32_t step = 0; step < 3; ++step) {
    // Same buffers, new values: scaled down 2^-(step+3) for the NVFP4 tensor.
    ASSERT_EQ(Place(cases, 100 + step).size(), cases.size());
    std::vector<float> v(inputs_[0].size() / 2);
    for (size_t i = 0; i < v.size(); ++i) {
      uint32_t bits = uint32_t(inputs_[0][2 * i] | (inputs_[0][2 * i + 1] << 8)) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      v[i] = std::ldexp(f, -int(step) - 3);
    }
    inputs_[0] = Encode(DType::kBFloat16, v);
    ASSERT_OK(CopyToDevice(device_[0].x.data(), inputs_[0].data(), inputs_[0].size()));
    ASSERT_OK(group.Launch());
    Check(cases);
  }
}

TEST_F(BlockScaledKernel, BadTensorsAreRefusedByIndex) {
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d, DeviceBuffer::Allocate(4096));
  std::vector<BlockScaledTensor> tensors(
      2, BlockScaledTensor{DType::kBFloat16, d.data(), d.data(), d.data(), d.data(), 4, 32,
                           BlockFormat::kNvfp4, ScaleLayout::kRowMajor});
  tensors[1].from = DType::kFloat16;
  auto r = PrepareQuantizeBlockScaledGroup(tensors, nullptr);
  ASSERT_STATUS_IS(kInvalidArgument, r.status(), "tensor 1 is float16");
  tensors[1].from = DType::kFloat32;
  std::vector<uint8_t> host(4096);
  tensors[1].scales = host.data();  // pageable host memory: the device cannot reach it
  r = PrepareQuantizeBlockScaledGroup(tensors, nullptr);
  ASSERT_STATUS_IS(kInvalidArgument, r.status(), "tensor 1 scales");
  tensors[1].scales = d.data();
  tensors[1].global_scale = nullptr;
  r = PrepareQuantizeBlockScaledGroup(tensors, nullptr);
  ASSERT_STATUS_IS(kInvalidArgument, r.status(), "tensor 1 global scale is null");
  tensors[1].rows = -1;
  r = PrepareQuantizeBlockScaledGroup(tensors, nullptr);
  ASSERT_STATUS_IS(kInvalidArgument, r.status(), "negative shape");
}

}  // namespace
}  // namespace weightsync::cuda
