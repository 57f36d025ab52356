// Conversions in flight on the GPU (label gpu): a publisher process keeps the synthetic model's
// CUDA tensors on cuda:0; this process subscribes into CUDA destinations of other dtypes on
// cuda:1 (cuda:0 with one GPU for cuda-ipc) with SubscriberOptions.convert_dtypes: bf16 → fp8
// e4m3 with float32 and with e8m0 block scales, MXFP8 and NVFP4 (NamedTensor::quantization: values,
// scales in both layouts, global scales), and casts among f32/f16/bf16, over cuda-ipc (from
// the GPU arena, and from a GPU ring of 64 KiB buckets) and nccl, staged and in place. Every
// destination must equal the CPU reference of the published bytes, bit for bit, step after step,
// with the handle prepared once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/block_scaled_reference.h"
#include "cuda/device.h"
#include "cuda/kernels.h"
#include "cuda/nccl_link.h"
#include "cuda/transform_reference.h"
#include "cuda/vmm.h"
#include "gpu/gpu_test_util.h"
#include "testing/test_util.h"
#include "util/fail_point.h"

namespace weightsync {
namespace {

using testing::ChildProcess;
using testing::SyntheticModel;
namespace ref = cuda::reference;

// Tensors 0-23 convert by dtype (fp8 128x128 blocks, casts); 25, 32, 40 and 41 are block-scaled
// (TargetFor).
constexpr int kTensors = 42;
constexpr int64_t kElements = 70000;
constexpr char kToken[] = "convert test token, 32 bytes....";

struct Param {
  bool nccl;
  UpdateMode mode;
  bool on_publisher_gpu = true;      // SubscriberOptions::convert_on_publisher_gpu
  bool break_publisher_gpu = false;  // fail point: preparing there fails, the fallback runs
  // A GPU ring publisher (WS_TEST_RING): converted tensors land first (a bucket is gone once read)
  // and convert at commit, some of them cut across bucket edges.
  const char* ring = nullptr;
};

// What destination i becomes: its dtype, and for fp8 the scale tensor's dtype.
struct Target {
  DType dtype;
  DType scale = DType::kUInt8;  // kFloat32 or kFloat8E8M0FNU when quantized
  bool quantized = false;       // bf16 → fp8 with a scale tensor
  // MXFP8 or NVFP4 (docs/quantized.md): values, NAME_scale_inv and for NVFP4 NAME_scale_2.
  Quantization::Format format = Quantization::Format::kNone;
  Quantization::ScaleLayout layout = Quantization::ScaleLayout::kRowMajor;
};

Target BlockScaled(Quantization::Format f, Quantization::ScaleLayout layout) {
  const bool nvfp4 = f == Quantization::Format::kNvfp4;
  return {nvfp4 ? DType::kFloat4E2M1FN : DType::kFloat8E4M3FN,
          nvfp4 ? DType::kFloat8E4M3FN : DType::kFloat8E8M0FNU, false, f, layout};
}

cuda::BlockFormat BlockFormatOf(Quantization::Format f) {
  return f == Quantization::Format::kNvfp4 ? cuda::BlockFormat::kNvfp4 : cuda::BlockFormat::kMxfp8;
}
cuda::ScaleLayout ScaleLayoutOf(Quantization::ScaleLayout l) {
  return l == Quantization::ScaleLayout::kRowMajor ? cuda::ScaleLayout::kRowMajor
                                                   : cuda::ScaleLayout::kSwizzled128x4;
}

Target TargetFor(int i, DType published, size_t ndim) {
  using F = Quantization::Format;
  using L = Quantization::ScaleLayout;
  // Block-scaled, from bf16 and f32 2-D tensors of even (NVFP4) and odd rows: [2, 70052] f32,
  // [2, 70020] bf16, [2, 70025] bf16, [2, 70062] f32.
  if (i == 25) return BlockScaled(F::kNvfp4, L::kRowMajor);
  if (i == 32) return BlockScaled(F::kNvfp4, L::kSwizzled128x4);
  if (i == 40) return BlockScaled(F::kMxfp8, L::kRowMajor);
  if (i == 41) return BlockScaled(F::kMxfp8, L::kSwizzled128x4);
  if (published == DType::kBFloat16 && ndim == 2) {
    return {DType::kFloat8E4M3FN, i % 16 == 8 ? DType::kFloat32 : DType::kFloat8E8M0FNU, true};
  }
  if (published == DType::kBFloat16) return {DType::kFloat32};
  if (published == DType::kFloat32) return {i % 16 == 1 ? DType::kBFloat16 : DType::kFloat16};
  if (published == DType::kFloat16) return {DType::kFloat32};
  return {published};
}

// NaN in `d` at p (NaN payloads and signs are not part of the conversion contract; see
// tests/gpu/cast_test.cc).
bool IsNaN(DType d, const uint8_t* p) {
  uint32_t b = 0;
  std::memcpy(&b, p, Info(d).bits / 8);
  switch (d) {
    case DType::kFloat32:
      return (b & 0x7F800000u) == 0x7F800000u && (b & 0x007FFFFFu) != 0;
    case DType::kBFloat16:
      return (b & 0x7F80u) == 0x7F80u && (b & 0x7Fu) != 0;
    case DType::kFloat16:
      return (b & 0x7C00u) == 0x7C00u && (b & 0x3FFu) != 0;
    case DType::kFloat8E4M3FN:
      return (b & 0x7Fu) == 0x7Fu;
    case DType::kFloat8E8M0FNU:
      return b == 0xFFu;
    default:
      return false;
  }
}

// Bit-exact, except that a NaN may be any NaN.
bool SameUpToNaNPayload(DType d, const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return false;
  const size_t w = std::max<size_t>(Info(d).bits / 8, 1);
  for (size_t i = 0; i + w <= a.size(); i += w) {
    if (std::memcmp(&a[i], &b[i], w) != 0 && !(IsNaN(d, &a[i]) && IsNaN(d, &b[i]))) return false;
  }
  return true;
}

class GpuConvert : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    WS_SKIP_WITHOUT_GPU();
    const bool nccl = GetParam().nccl;
    if (nccl && cuda::DeviceCount() < 2) GTEST_SKIP() << "nccl needs 2 CUDA devices";
    if (nccl) {
      ::setenv("NCCL_NVLS_ENABLE", "0", 1);
      if (Status s = cuda::nccl::NcclAvailable(); !s.ok()) GTEST_SKIP() << "needs NCCL: " << s;
    }
    device_ = cuda::DeviceCount() > 1 ? 1 : 0;
    const std::string asked = nccl ? "tcp://127.0.0.1:0" : testing::UniqueEndpoint("gpuconvert");
    std::vector<std::string> env = {"NCCL_NVLS_ENABLE=0"};
    if (nccl) env.push_back(std::string("WEIGHTSYNC_TOKEN=") + kToken);
    if (GetParam().ring != nullptr) env.push_back(std::string("WS_TEST_RING=") + GetParam().ring);
    publisher_ = ChildProcess::Spawn({testing::HelperPath("gpu_publisher"), asked,
                                      std::to_string(kTensors), std::to_string(kElements), "0"},
                                     env);
    const std::string ready = publisher_.ReadLine(60000);
    ASSERT_EQ(ready.rfind("ready ", 0), 0u) << ready;
    endpoint_ = ready.substr(6);
    ASSERT_OK(cuda::SetDevice(device_));
    like_ = model_.Tensors();
    for (size_t i = 0; i < like_.size(); ++i) {
      const TensorView& v = like_[i].view;
      const Target t = TargetFor(static_cast<int>(i), v.dtype, v.shape.size());
      Add(like_[i].name, t.dtype, v.shape);
      if (t.format != Quantization::Format::kNone) {
        ASSERT_EQ(v.shape.size(), 2u) << like_[i].name;
        dst_.back().quantization = {t.format, t.layout};
        const cuda::ScaleShape scale = cuda::ScaleShapeFor(
            BlockFormatOf(t.format), ScaleLayoutOf(t.layout), v.shape[0], v.shape[1]);
        Add(like_[i].name + "_scale_inv", t.scale, {scale.rows, scale.cols});
        if (t.format == Quantization::Format::kNvfp4) {
          Add(like_[i].name + "_scale_2", DType::kFloat32, {});
        }
      }
      if (t.quantized) {
        const int64_t rows = v.shape[0], cols = v.shape[1];
        Add(like_[i].name + "_scale_inv", t.scale,
            {cuda::Fp8ScaleRows(rows), cuda::Fp8ScaleCols(cols)});
      }
    }
  }
  void TearDown() override { util::FailPoints::DisarmAll(); }
  void Add(const std::string& name, DType dtype, std::vector<int64_t> shape) {
    TensorView v{nullptr, dtype, std::move(shape), {Device::Kind::kCUDA, device_}};
    auto b = cuda::DeviceBuffer::Allocate(std::max<uint64_t>(*v.NumBytes(), 1));
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_OK(cuda::MemsetDevice(b->data(), 0xEE, b->size()));  // poison
    v.data = b->data();
    dst_.push_back({name, v});
    buffers_.push_back(std::move(b).value());
  }
  void Publish(int64_t step) {
    ASSERT_EQ(publisher_.Command("publish " + std::to_string(step)), "ok " + std::to_string(step));
  }
  // Every destination against the CPU reference of tensor i at `step`; "" when all match.
  std::string Mismatch(int64_t step) {
    size_t d = 0;
    for (size_t i = 0; i < like_.size(); ++i) {
      const TensorView& v = like_[i].view;
      std::vector<uint8_t> published(*v.NumBytes());
      SyntheticModel::Pattern(static_cast<int>(i), step, published.data(), published.size());
      const uint64_t n = *v.NumElements();
      std::vector<uint8_t> want(*dst_[d].view.NumBytes()), scales, global;
      const Target t = TargetFor(static_cast<int>(i), v.dtype, v.shape.size());
      Status s;
      if (t.format != Quantization::Format::kNone) {
        scales.resize(*dst_[d + 1].view.NumBytes());
        const int64_t rows = v.shape[0], cols = v.shape[1];
        if (t.format == Quantization::Format::kMxfp8) {
          s = ref::QuantizeMxfp8(v.dtype, published.data(), rows, cols, want.data(), scales.data(),
                                 ScaleLayoutOf(t.layout));
        } else {
          global.resize(4);
          float g = 0;
          s = ref::QuantizeNvfp4(v.dtype, published.data(), rows, cols, want.data(), scales.data(),
                                 &g, ScaleLayoutOf(t.layout));
          std::memcpy(global.data(), &g, 4);
        }
      } else if (t.quantized) {
        scales.resize(*dst_[d + 1].view.NumBytes());
        s = ref::QuantizeFp8(reinterpret_cast<const uint16_t*>(published.data()), v.shape[0],
                             v.shape[1], want.data(), scales.data(),
                             t.scale == DType::kFloat32 ? cuda::Fp8ScaleFormat::kFloat32
                                                        : cuda::Fp8ScaleFormat::kE8M0);
      } else if (t.dtype != v.dtype) {
        s = ref::Cast(v.dtype, t.dtype, published.data(), want.data(), n);
      } else {
        want = published;
      }
      if (!s.ok()) return s.ToString();
      for (const std::vector<uint8_t>* expect : {&want, &scales, &global}) {
        if (expect != &want && expect->empty()) break;
        auto got = cuda::testing::Download<uint8_t>(dst_[d].view.data, expect->size());
        if (!got.ok()) return got.status().ToString();
        if (!SameUpToNaNPayload(dst_[d].view.dtype, *got, *expect)) {
          // Where and how: the first differing byte, its input, and how many differ.
          const size_t w = std::max<size_t>(Info(dst_[d].view.dtype).bits / 8, 1);
          size_t first = got->size(), count = 0;
          for (size_t k = 0; k + w <= got->size(); k += w) {
            if (std::memcmp(&(*got)[k], &(*expect)[k], w) != 0 &&
                !(IsNaN(dst_[d].view.dtype, &(*got)[k]) &&
                  IsNaN(dst_[d].view.dtype, &(*expect)[k]))) {
              first = std::min(first, k);
              ++count;
            }
          }
          char detail[160];
          const size_t in_w = Info(v.dtype).bits / 8, elem = first / w;
          uint32_t in = 0;
          if ((elem + 1) * in_w <= published.size())
            std::memcpy(&in, &published[elem * in_w], in_w);
          std::snprintf(detail, sizeof(detail),
                        " at element %zu: got 0x%02x want 0x%02x (input bits 0x%x); %zu of %zu "
                        "elements differ",
                        elem, (*got)[first], (*expect)[first], in, count, got->size() / w);
          return "'" + dst_[d].name + "' (" + std::string(DTypeName(dst_[d].view.dtype)) +
                 ") differs from the reference at step " + std::to_string(step) + detail;
        }
        ++d;
      }
    }
    return "";
  }

  int device_ = 0;
  SyntheticModel model_{kTensors, kElements};
  ChildProcess publisher_;
  std::string endpoint_;
  std::vector<NamedTensor> like_, dst_;
  std::vector<cuda::DeviceBuffer> buffers_;
};

TEST_P(GpuConvert, EveryDestinationEqualsTheCpuReferenceStepAfterStep) {
  SubscriberOptions o;
  o.endpoint = endpoint_;
  if (GetParam().nccl) o.token = kToken;
  o.mode = GetParam().mode;
  o.verify = true;
  o.convert_dtypes = true;
  o.convert_on_publisher_gpu = GetParam().on_publisher_gpu;
  o.timeout = std::chrono::milliseconds(10000);
  testing::LogCapture log;  // the prepare line says where the conversions ran
  if (GetParam().break_publisher_gpu) {
    util::FailPoints::Arm("cuda_ipc.publisher_gpu", util::FailAction::kError);
  }
  auto sub = Subscriber::Create(o);
  ASSERT_TRUE(sub.ok()) << sub.status();
  ASSERT_OK((*sub)->Register(dst_));
  // The caller's current device is its own business: an update that visits the publisher's GPU
  // (or any other) leaves it as it found it.
  const int callers_device = cuda::DeviceCount() > 1 ? 0 : device_;
  UpdateStats last;
  for (int64_t step = 1; step <= 3; ++step) {
    Publish(step);
    ASSERT_OK(cuda::SetDevice(callers_device));
    auto r = (*sub)->Update();
    EXPECT_EQ(*cuda::CurrentDevice(), callers_device) << "step " << step;
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->verified);
    EXPECT_EQ(r->prepare_count, 1u);
    EXPECT_EQ(Mismatch(step), "");
    EXPECT_GE(r->converted_tensors, 4u) << "at least the block-scaled ones";
    last = *r;
  }
  if (!GetParam().nccl) {
    // cuda-ipc: in place with the option on and a second GPU that reaches this one, the
    // publisher's GPU (cuda:0) converts; otherwise (and from a ring, whose tensors land first) the
    // destinations' GPU does.
    const bool tried = GetParam().mode == UpdateMode::kInPlace && GetParam().on_publisher_gpu &&
                       GetParam().ring == nullptr && device_ != 0 &&
                       cuda::EnablePeerAccess(0, device_).ok();
    const bool at_source = tried && !GetParam().break_publisher_gpu;
    if (tried && GetParam().break_publisher_gpu) {
      EXPECT_EQ(util::FailPoints::Hits("cuda_ipc.publisher_gpu"), 1);
      EXPECT_TRUE(log.Contains("not the publisher's: internal: injected failure"))
          << "the fallback is not logged with its cause";
    }
    ASSERT_OK(cuda::SetDevice(device_));
    const std::string where = at_source ? "conversions on cuda:0 (the publisher's GPU"
                                        : "conversions on cuda:" + std::to_string(device_);
    EXPECT_TRUE(log.Contains(where)) << "no log line with: " << where;
    // UpdateStats says the same.
    EXPECT_EQ(last.converted_on,
              at_source ? ConvertedOn::kPublisherGpu : ConvertedOn::kDestinationGpu);
    EXPECT_EQ(last.converted_device, at_source ? 0 : device_);
  }
}

// The quantization kernel alone on the same bytes (random bit patterns: infinities, NaNs,
// subnormals), so a transport problem and a kernel/reference disagreement tell themselves apart.
TEST(GpuConvertKernel, QuantizationOfRandomBitPatternsMatchesTheReference) {
  WS_SKIP_WITHOUT_GPU();
  const int64_t rows = 2, cols = 70005;
  std::vector<uint8_t> x(rows * cols * 2);
  SyntheticModel::Pattern(8, 1, x.data(), x.size());
  for (cuda::Fp8ScaleFormat format :
       {cuda::Fp8ScaleFormat::kFloat32, cuda::Fp8ScaleFormat::kE8M0}) {
    const size_t scale_bytes = (format == cuda::Fp8ScaleFormat::kE8M0 ? 1 : 4) * 547;
    auto d_x = cuda::testing::Upload(x);
    auto d_q = cuda::DeviceBuffer::Allocate(rows * cols);
    auto d_s = cuda::DeviceBuffer::Allocate(scale_bytes);
    ASSERT_OK(d_x);
    ASSERT_OK(d_q);
    ASSERT_OK(d_s);
    auto launch = cuda::PrepareQuantizeFp8(d_x->data(), d_q->data(), d_s->data(), rows, cols,
                                           format, nullptr);
    ASSERT_OK(launch);
    ASSERT_OK(launch->Launch());
    ASSERT_OK(cuda::DeviceSynchronize());
    std::vector<uint8_t> want_q(rows * cols), want_s(scale_bytes);
    ASSERT_OK(ref::QuantizeFp8(reinterpret_cast<const uint16_t*>(x.data()), rows, cols,
                               want_q.data(), want_s.data(), format));
    auto got_q = cuda::testing::Download<uint8_t>(d_q->data(), want_q.size());
    auto got_s = cuda::testing::Download<uint8_t>(d_s->data(), want_s.size());
    ASSERT_OK(got_q);
    ASSERT_OK(got_s);
    EXPECT_TRUE(SameUpToNaNPayload(
        format == cuda::Fp8ScaleFormat::kE8M0 ? DType::kFloat8E8M0FNU : DType::kFloat32, *got_s,
        want_s))
        << "scales";
    size_t bad = 0, first = want_q.size();
    for (size_t i = 0; i < want_q.size(); ++i) {
      if ((*got_q)[i] != want_q[i] &&
          !(IsNaN(DType::kFloat8E4M3FN, &(*got_q)[i]) && IsNaN(DType::kFloat8E4M3FN, &want_q[i]))) {
        if (bad++ == 0) first = i;
      }
    }
    uint16_t in = 0;
    if (first < want_q.size()) std::memcpy(&in, &x[first * 2], 2);
    EXPECT_EQ(bad, 0u) << "first at " << first << ": got "
                       << int(first < want_q.size() ? (*got_q)[first] : 0) << " want "
                       << int(first < want_q.size() ? want_q[first] : 0) << " input bf16 0x"
                       << std::hex << in;
  }
}

// Several tensors in one grouped launch (the form the transports prepare): shapes with full and
// partial blocks, an odd column count (byte path), aligned rows (16-byte path), a misaligned
// input, both scale formats, an empty tensor, and enough blocks that every block of the grid
// loops over several of them; every tensor equals the CPU reference, and the bytes around each
// output stay untouched.
TEST(GpuConvertKernel, GroupedQuantizationEqualsTheReferenceTensorByTensor) {
  WS_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t rows, cols;
    cuda::Fp8ScaleFormat format;
    uint64_t misalign;  // bytes added to the input pointer
  };
  const std::vector<Case> cases = {{2, 70005, cuda::Fp8ScaleFormat::kFloat32, 0},
                                   {300, 260, cuda::Fp8ScaleFormat::kE8M0, 0},
                                   {128, 128, cuda::Fp8ScaleFormat::kFloat32, 0},
                                   {1, 5, cuda::Fp8ScaleFormat::kE8M0, 0},
                                   {257, 1024, cuda::Fp8ScaleFormat::kFloat32, 2},
                                   {0, 64, cuda::Fp8ScaleFormat::kFloat32, 0},
                                   {129, 384, cuda::Fp8ScaleFormat::kE8M0, 0},
                                   {8192, 2048, cuda::Fp8ScaleFormat::kFloat32, 0},
                                   {4096, 4096, cuda::Fp8ScaleFormat::kE8M0, 0}};
  constexpr uint64_t kGuard = 64;
  std::vector<std::vector<uint8_t>> inputs;
  std::vector<cuda::DeviceBuffer> d_x, d_q, d_s;
  std::vector<cuda::Fp8GroupTensor> tensors;
  uint64_t blocks = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const uint64_t n = uint64_t(c.rows * c.cols);
    blocks += uint64_t(cuda::Fp8ScaleRows(c.rows) * cuda::Fp8ScaleCols(c.cols));
    const uint64_t scale_bytes = uint64_t(cuda::Fp8ScaleRows(c.rows) * cuda::Fp8ScaleCols(c.cols)) *
                                 (c.format == cuda::Fp8ScaleFormat::kE8M0 ? 1 : 4);
    std::vector<uint8_t> x(c.misalign + n * 2 + 2);  // never empty
    SyntheticModel::Pattern(int(20 + i), 1, x.data(), x.size());
    auto dx = cuda::testing::Upload(x);
    auto dq = cuda::testing::Upload(std::vector<uint8_t>(n + 2 * kGuard, 0xA5));
    auto ds = cuda::testing::Upload(std::vector<uint8_t>(scale_bytes + 2 * kGuard, 0xA5));
    ASSERT_OK(dx);
    ASSERT_OK(dq);
    ASSERT_OK(ds);
    tensors.push_back({dx->as<uint8_t>() + c.misalign, dq->as<uint8_t>() + kGuard,
                       ds->as<uint8_t>() + kGuard, c.rows, c.cols, c.format});
    inputs.push_back(std::move(x));
    d_x.push_back(std::move(dx).value());
    d_q.push_back(std::move(dq).value());
    d_s.push_back(std::move(ds).value());
  }
  auto group = cuda::PrepareQuantizeFp8Group(tensors, nullptr);
  ASSERT_OK(group);
  EXPECT_EQ(group->tensors(), cases.size() - 1);  // the empty one is left out
  EXPECT_EQ(group->tiles(), blocks);
  EXPECT_GT(group->tiles(), 2 * uint64_t(group->launch().grid().x))
      << "every block should loop over several 128x128 blocks";
  for (int launch = 0; launch < 2; ++launch) {  // a second launch rewrites the same bytes
    ASSERT_OK(group->Launch());
    ASSERT_OK(cuda::DeviceSynchronize());
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const uint64_t n = uint64_t(c.rows * c.cols);
    const uint64_t scale_bytes = uint64_t(cuda::Fp8ScaleRows(c.rows) * cuda::Fp8ScaleCols(c.cols)) *
                                 (c.format == cuda::Fp8ScaleFormat::kE8M0 ? 1 : 4);
    std::vector<uint8_t> want_q(n), want_s(scale_bytes);
    ASSERT_OK(ref::QuantizeFp8(reinterpret_cast<const uint16_t*>(inputs[i].data() + c.misalign),
                               c.rows, c.cols, want_q.data(), want_s.data(), c.format));
    auto got_q = cuda::testing::Download<uint8_t>(d_q[i].data(), n + 2 * kGuard);
    auto got_s = cuda::testing::Download<uint8_t>(d_s[i].data(), scale_bytes + 2 * kGuard);
    ASSERT_OK(got_q);
    ASSERT_OK(got_s);
    const std::vector<uint8_t> q(got_q->begin() + kGuard, got_q->end() - kGuard);
    const std::vector<uint8_t> sc(got_s->begin() + kGuard, got_s->end() - kGuard);
    EXPECT_TRUE(SameUpToNaNPayload(DType::kFloat8E4M3FN, q, want_q)) << "tensor " << i;
    EXPECT_TRUE(SameUpToNaNPayload(
        c.format == cuda::Fp8ScaleFormat::kE8M0 ? DType::kFloat8E8M0FNU : DType::kFloat32, sc,
        want_s))
        << "scales of tensor " << i;
    for (uint64_t g = 0; g < kGuard; ++g) {
      ASSERT_EQ((*got_q)[g], 0xA5) << "tensor " << i << " wrote before its output";
      ASSERT_EQ((*got_q)[kGuard + n + g], 0xA5) << "tensor " << i << " wrote past its output";
      ASSERT_EQ((*got_s)[kGuard + scale_bytes + g], 0xA5) << "tensor " << i << " scales overrun";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Transports, GpuConvert,
    ::testing::Values(Param{false, UpdateMode::kStaged}, Param{false, UpdateMode::kInPlace},
                      Param{false, UpdateMode::kInPlace, /*on_publisher_gpu=*/false},
                      Param{false, UpdateMode::kInPlace, true, /*break_publisher_gpu=*/true},
                      Param{true, UpdateMode::kStaged}, Param{true, UpdateMode::kInPlace},
                      Param{false, UpdateMode::kStaged, true, false, "2:65536"},
                      Param{false, UpdateMode::kInPlace, true, false, "2:65536"}),
    [](const auto& info) {
      return std::string(info.param.nccl ? "nccl" : "cuda_ipc") +
             (info.param.mode == UpdateMode::kStaged ? "_staged" : "_in_place") +
             (info.param.on_publisher_gpu ? "" : "_on_destination_gpu") +
             (info.param.break_publisher_gpu ? "_after_publisher_gpu_failed" : "") +
             (info.param.ring != nullptr ? "_from_a_gpu_ring" : "");
    });

}  // namespace
}  // namespace weightsync
