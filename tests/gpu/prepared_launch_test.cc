// Prepared launches on a device: the kernel reads every one of the 18 scalar types exactly as the
// ArgPack wrote it; a value rewritten in place changes the next launch's result; and a million
// launches allocate nothing on the host heap and keep RSS flat.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "cuda/kernels.h"
#include "cuda/launch_registry.h"
#include "gpu/gpu_test_util.h"
#include "testing/count_new.inc"

namespace weightsync::cuda {
namespace {

using testing::Download;

int64_t RssBytes() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return int64_t(resident) * ::sysconf(_SC_PAGESIZE);
}

template <typename T>
uint64_t Widened(T v) {
  uint64_t w = 0;
  std::memcpy(&w, &v, sizeof(T));
  return w;
}

// Sets all 18 scalars of an arg-probe launch from `seed` and returns what out[0..17] must become.
std::vector<uint64_t> SetAll(ArgPack& a, uint32_t seed) {
  using P = ArgProbeArgs;
  const bool b = seed & 1;
  const auto i8 = int8_t(-int(seed % 100));
  const auto i16 = int16_t(-12345 + int(seed));
  const auto i32 = int32_t(-123456789 - int(seed));
  const auto i64 = int64_t(-1234567890123456789ll + seed);
  const auto u8 = uint8_t(0xA0 + seed % 16);
  const auto u16 = uint16_t(0xBEE0 + seed % 16);
  const uint32_t u32 = 0xDEAD0000u + seed;
  const uint64_t u64 = 0x0123456789AB0000ull + seed;
  const Float16Bits f16{uint16_t(0x3C00 + seed % 64)};
  const BFloat16Bits bf16{uint16_t(0xBF80 + seed % 64)};
  const TFloat32Bits tf32{0x3F802000u + (seed << 13)};
  const float f32 = -3.5f - float(seed);
  const double f64 = 2.000000000000004 + seed;
  const Float8E4M3FNBits e4m3{uint8_t(0x30 + seed % 16)};
  const Float8E5M2Bits e5m2{uint8_t(0xF0 + seed % 11)};
  const Float8E8M0FNUBits e8m0{uint8_t(0x70 + seed % 16)};
  const Float4E2M1FNBits e2m1{uint8_t(seed % 16)};
  EXPECT_OK(a.SetChecked(P::Scalar(DType::kBool), b));
  EXPECT_OK(a.SetChecked(P::Scalar(DType::kInt8), i8));
  EXPECT_OK(a.SetChecked(P::Scalar(DType::kInt16), i16));
  EXPECT_OK(a.SetChecked(P::Scalar(DType::kInt32), i32));
  EXPECT_OK(a.SetChecked(P::Scalar(DType::kInt64), i64));
  EXPECT_OK(a.SetChecked(P::Scalar(DType::kUInt8), u8));
  EXPECT_OK(a.SetChecked(P::Scalar(DType::kUInt16), u16));
  EXPECT_OK(a.SetChecked(P::Scalar(DType::kUInt32), u32));
  EXPECT_OK(a.SetChecked(P::Scalar(DType::kUInt64), u64));
  EXPECT_OK(a.SetChecked(P::Scalar(DType::kFloat16), f16));
  EXPECT_OK(a.SetChecked(P::Scalar(DType::kBFloat16), bf16));
  EXPECT_OK(a.SetChecked(P::Scalar(DType::kTFloat32), tf32));
  EXPECT_OK(a.SetChecked(P::Scalar(DType::kFloat32), f32));
  EXPECT_OK(a.SetChecked(P::Scalar(DType::kFloat64), f64));
  EXPECT_OK(a.SetChecked(P::Scalar(DType::kFloat8E4M3FN), e4m3));
  EXPECT_OK(a.SetChecked(P::Scalar(DType::kFloat8E5M2), e5m2));
  EXPECT_OK(a.SetChecked(P::Scalar(DType::kFloat8E8M0FNU), e8m0));
  EXPECT_OK(a.SetChecked(P::Scalar(DType::kFloat4E2M1FN), e2m1));
  return {Widened(b),   Widened(i8),  Widened(i16),  Widened(i32),  Widened(i64),  Widened(u8),
          Widened(u16), Widened(u32), Widened(u64),  Widened(f16),  Widened(bf16), Widened(tf32),
          Widened(f32), Widened(f64), Widened(e4m3), Widened(e5m2), Widened(e8m0), Widened(e2m1)};
}

TEST(GpuPreparedLaunchTest, KernelReadsEveryScalarTypeAsPacked) {
  WS_SKIP_WITHOUT_GPU();
  Result<DeviceBuffer> out = DeviceBuffer::Allocate(kArgProbeWords * 8);
  ASSERT_OK(out);
  ASSERT_OK(MemsetDevice(out->data(), 0, kArgProbeWords * 8));
  Result<PreparedLaunch> probe = PrepareArgProbe(out->as<uint64_t>(), nullptr);
  ASSERT_OK(probe);
  for (uint32_t seed : {0u, 1u, 7u, 12345u}) {
    const std::vector<uint64_t> want = SetAll(probe->args(), seed);
    ASSERT_OK(probe->Launch());
    Result<std::vector<uint64_t>> got = Download<uint64_t>(out->data(), kArgProbeWords);
    ASSERT_OK(got);
    for (int k = 0; k < kDTypeCount; ++k) {
      EXPECT_EQ((*got)[k], want[k]) << DTypeName(AllDTypes()[k].dtype) << " seed " << seed;
    }
  }
}

TEST(GpuPreparedLaunchTest, ValueRewrittenInPlaceChangesTheNextLaunch) {
  WS_SKIP_WITHOUT_GPU();
  Result<DeviceBuffer> a_out = DeviceBuffer::Allocate(kArgProbeWords * 8);
  Result<DeviceBuffer> b_out = DeviceBuffer::Allocate(kArgProbeWords * 8);
  ASSERT_OK(a_out);
  ASSERT_OK(b_out);
  ASSERT_OK(MemsetDevice(a_out->data(), 0, kArgProbeWords * 8));
  ASSERT_OK(MemsetDevice(b_out->data(), 0, kArgProbeWords * 8));
  Result<PreparedLaunch> probe = PrepareArgProbe(a_out->as<uint64_t>(), nullptr);
  ASSERT_OK(probe);
  const size_t u32 = ArgProbeArgs::Scalar(DType::kUInt32);
  const size_t f32 = ArgProbeArgs::Scalar(DType::kFloat32);

  probe->args().Set(u32, uint32_t{111});
  probe->args().Set(f32, 1.5f);
  ASSERT_OK(probe->Launch());
  probe->args().Set(u32, uint32_t{222});  // right after the launch: the launch took a's values
  probe->args().Set(f32, -2.25f);
  ASSERT_OK(DeviceSynchronize());
  Result<std::vector<uint64_t>> got = Download<uint64_t>(a_out->data(), kArgProbeWords);
  ASSERT_OK(got);
  EXPECT_EQ((*got)[7], 111u);
  EXPECT_EQ((*got)[12], Widened(1.5f));

  ASSERT_OK(probe->Launch());
  got = Download<uint64_t>(a_out->data(), kArgProbeWords);
  ASSERT_OK(got);
  EXPECT_EQ((*got)[7], 222u);
  EXPECT_EQ((*got)[12], Widened(-2.25f));
  EXPECT_EQ((*got)[18], 2u) << "launches counted by the kernel";

  // A pointer rewritten in place sends the next launch's output elsewhere.
  probe->args().Set(ArgProbeArgs::kOut, b_out->as<uint64_t>());
  probe->args().Set(u32, uint32_t{333});
  ASSERT_OK(probe->Launch());
  got = Download<uint64_t>(b_out->data(), kArgProbeWords);
  ASSERT_OK(got);
  EXPECT_EQ((*got)[7], 333u);
  EXPECT_EQ((*got)[18], 1u);
}

TEST(GpuPreparedLaunchTest, AMillionLaunchesAllocateNothingAndKeepRssFlat) {
  WS_SKIP_WITHOUT_GPU();
  Result<DeviceBuffer> out = DeviceBuffer::Allocate(kArgProbeWords * 8);
  ASSERT_OK(out);
  ASSERT_OK(MemsetDevice(out->data(), 0, kArgProbeWords * 8));
  Result<Stream> stream = Stream::Create();
  ASSERT_OK(stream);
  Result<PreparedLaunch> probe = PrepareArgProbe(out->as<uint64_t>(), stream->handle());
  ASSERT_OK(probe);
  ArgPack& args = probe->args();
  const size_t u64 = ArgProbeArgs::Scalar(DType::kUInt64);
  const size_t bf16 = ArgProbeArgs::Scalar(DType::kBFloat16);

  // Warm up: the runtime loads the module and sizes its launch queue on the first launches.
  constexpr int kWarmup = 20'000;
  for (int i = 0; i < kWarmup; ++i) ASSERT_OK(probe->Launch());
  ASSERT_OK(stream->Synchronize());
  ::weightsync::testing::LogCapture log;
  EXPECT_GE(LogPreparedLaunchesReady(), 1);
  EXPECT_TRUE(log.Contains("prepared launches ready: 18 scalar types"));

  constexpr uint64_t kLaunches = 1'000'000;
  const int64_t rss_before = RssBytes();
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t news_before = g_new_calls.load();
  uint64_t failed = 0;
  for (uint64_t i = 0; i < kLaunches; ++i) {
    args.Set(u64, i);
    args.Set(bf16, BFloat16Bits{uint16_t(i)});
    if (!probe->Launch().ok()) ++failed;
  }
  const int64_t news_after = g_new_calls.load();
  ASSERT_OK(stream->Synchronize());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t rss_after = RssBytes();
  std::printf(
      "  %llu launches in %.3f s (%.2f us each), operator new calls %lld, RSS %lld -> %lld "
      "bytes\n",
      static_cast<unsigned long long>(kLaunches), seconds, seconds * 1e6 / kLaunches,
      static_cast<long long>(news_after - news_before), static_cast<long long>(rss_before),
      static_cast<long long>(rss_after));
  EXPECT_EQ(failed, 0u);
  EXPECT_EQ(news_after - news_before, 0) << "host heap allocations in 1,000,000 launches";
  EXPECT_LT(rss_after - rss_before, 2 << 20)
      << "RSS grew from " << rss_before << " to " << rss_after << " bytes";

  Result<std::vector<uint64_t>> got = Download<uint64_t>(out->data(), kArgProbeWords);
  ASSERT_OK(got);
  EXPECT_EQ((*got)[8], kLaunches - 1) << "the last launch saw the last value set";
  EXPECT_EQ((*got)[10], uint16_t(kLaunches - 1));
  EXPECT_EQ((*got)[18], kLaunches + kWarmup) << "every launch ran";
}

}  // namespace
}  // namespace weightsync::cuda
