// Conversions in flight on the GPU (label gpu): a publisher process keeps the synthetic model's
// CUDA tensors on cuda:0; this process subscribes into CUDA destinations of other dtypes on
// cuda:1 (cuda:0 with one GPU for cuda-ipc) with SubscriberOptions.convert_dtypes: bf16 → fp8
// e4m3 with float32 and with e8m0 block scales, and casts among f32/f16/bf16, over cuda-ipc and
// nccl, staged and in place. Every destination must equal the CPU reference of the published
// bytes, bit for bit, step after step, with the handle prepared once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/kernels.h"
#include "cuda/transform_reference.h"
#include "gpu/gpu_test_util.h"
#include "testing/test_util.h"
#include "transport/cuda_ipc/vmm.h"
#include "transport/nccl/nccl_link.h"
#include "util/logging.h"

namespace weightsync {
namespace {

using testing::ChildProcess;
using testing::SyntheticModel;
namespace ref = gpu::reference;

constexpr int kTensors = 24;
constexpr int64_t kElements = 70000;
constexpr char kToken[] = "convert test token, 32 bytes....";

struct Param {
  bool nccl;
  UpdateMode mode;
  bool on_publisher_gpu = true;  // SubscriberOptions::convert_on_publisher_gpu
};

// What destination i becomes: its dtype, and for fp8 the scale tensor's dtype.
struct Target {
  DType dtype;
  DType scale = DType::kUInt8;  // kFloat32 or kFloat8E8M0FNU when quantized
  bool quantized = false;       // bf16 → fp8 with a scale tensor
};

Target TargetFor(int i, DType published, size_t ndim) {
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
    if (nccl && gpu::DeviceCount() < 2) GTEST_SKIP() << "nccl needs 2 CUDA devices";
    if (nccl) {
      ::setenv("NCCL_NVLS_ENABLE", "0", 1);
      if (Status s = transport::nccl::NcclAvailable(); !s.ok()) GTEST_SKIP() << "needs NCCL: " << s;
    }
    device_ = gpu::DeviceCount() > 1 ? 1 : 0;
    const std::string asked = nccl ? "tcp://127.0.0.1:0" : testing::UniqueEndpoint("gpuconvert");
    std::vector<std::string> env = {"NCCL_NVLS_ENABLE=0"};
    if (nccl) env.push_back(std::string("WEIGHTSYNC_TOKEN=") + kToken);
    publisher_ = ChildProcess::Spawn({testing::HelperPath("gpu_publisher"), asked,
                                      std::to_string(kTensors), std::to_string(kElements), "0"},
                                     env);
    const std::string ready = publisher_.ReadLine(60000);
    ASSERT_EQ(ready.rfind("ready ", 0), 0u) << ready;
    endpoint_ = ready.substr(6);
    ASSERT_OK(transport::cuda_ipc::SetDevice(device_));
    like_ = model_.Tensors();
    for (size_t i = 0; i < like_.size(); ++i) {
      const TensorView& v = like_[i].view;
      const Target t = TargetFor(static_cast<int>(i), v.dtype, v.shape.size());
      Add(like_[i].name, t.dtype, v.shape);
      if (t.quantized) {
        const int64_t rows = v.shape[0], cols = v.shape[1];
        Add(like_[i].name + "_scale_inv", t.scale,
            {gpu::Fp8ScaleRows(rows), gpu::Fp8ScaleCols(cols)});
      }
    }
  }
  void Add(const std::string& name, DType dtype, std::vector<int64_t> shape) {
    TensorView v{nullptr, dtype, std::move(shape), {Device::Kind::kCUDA, device_}};
    auto b = gpu::DeviceBuffer::Allocate(std::max<uint64_t>(*v.NumBytes(), 1));
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_OK(gpu::MemsetDevice(b->data(), 0xEE, b->size()));  // poison
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
      std::vector<uint8_t> want(*dst_[d].view.NumBytes()), scales;
      const Target t = TargetFor(static_cast<int>(i), v.dtype, v.shape.size());
      Status s;
      if (t.quantized) {
        scales.resize(*dst_[d + 1].view.NumBytes());
        s = ref::QuantizeFp8(reinterpret_cast<const uint16_t*>(published.data()), v.shape[0],
                             v.shape[1], want.data(), scales.data(),
                             t.scale == DType::kFloat32 ? gpu::Fp8ScaleFormat::kFloat32
                                                        : gpu::Fp8ScaleFormat::kE8M0);
      } else if (t.dtype != v.dtype) {
        s = ref::Cast(v.dtype, t.dtype, published.data(), want.data(), n);
      } else {
        want = published;
      }
      if (!s.ok()) return s.ToString();
      for (const std::vector<uint8_t>* expect : {&want, &scales}) {
        if (expect == &scales && scales.empty()) break;
        auto got = gpu::testing::Download<uint8_t>(dst_[d].view.data, expect->size());
        if (!got.ok()) return got.status().ToString();
        if (!SameUpToNaNPayload(dst_[d].view.dtype, *got, *expect)) {
          // Where and how: the first differing byte, its input, and how many differ.
          const size_t w = std::max<size_t>(Info(dst_[d].view.dtype).bits / 8, 1);
          size_t first = got->size(), count = 0;
          for (size_t k = 0; k + w <= got->size(); k += w) {
            if (std::memcmp(&(*got)[k], &(*expect)[k], w) != 0 &&
                !(IsNaN(dst_[d].view.dtype, &(*got)[k]) && IsNaN(dst_[d].view.dtype, &(*expect)[k]))) {
              first = std::min(first, k);
              ++count;
            }
          }
          char detail[160];
          const size_t in_w = Info(v.dtype).bits / 8, elem = first / w;
          uint32_t in = 0;
          if ((elem + 1) * in_w <= published.size()) std::memcpy(&in, &published[elem * in_w], in_w);
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
  std::vector<gpu::DeviceBuffer> buffers_;
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
  // The prepare line says where the conversions ran.
  std::string prepared;
  util::LogSink previous = util::SetLogSink(
      [&](util::LogLevel, std::string_view, std::string_view line) {
        if (line.find("conversions on cuda:") != std::string_view::npos) prepared = line;
      });
  auto sub = Subscriber::Create(o);
  ASSERT_TRUE(sub.ok()) << sub.status();
  ASSERT_OK((*sub)->Register(dst_));
  for (int64_t step = 1; step <= 3; ++step) {
    Publish(step);
    auto r = (*sub)->Update();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->verified);
    EXPECT_EQ(r->prepare_count, 1u);
    EXPECT_EQ(Mismatch(step), "");
  }
  util::SetLogSink(previous);
  if (!GetParam().nccl) {
    // cuda-ipc: in place with two GPUs and the option on, the publisher's GPU (cuda:0) converts;
    // otherwise the destinations' GPU does.
    const bool at_source = GetParam().mode == UpdateMode::kInPlace && GetParam().on_publisher_gpu &&
                           gpu::DeviceCount() > 1;
    EXPECT_NE(prepared.find(at_source ? "conversions on cuda:0 (the publisher's GPU"
                                      : "conversions on cuda:" + std::to_string(device_)),
              std::string::npos)
        << prepared;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Transports, GpuConvert,
    ::testing::Values(Param{false, UpdateMode::kStaged}, Param{false, UpdateMode::kInPlace},
                      Param{false, UpdateMode::kInPlace, /*on_publisher_gpu=*/false},
                      Param{true, UpdateMode::kStaged}, Param{true, UpdateMode::kInPlace}),
    [](const auto& info) {
      return std::string(info.param.nccl ? "nccl" : "cuda_ipc") +
             (info.param.mode == UpdateMode::kStaged ? "_staged" : "_in_place") +
             (info.param.on_publisher_gpu ? "" : "_on_destination_gpu");
    });

}  // namespace
}  // namespace weightsync
