// GPU casts between bfloat16, float16 and float32 against the CPU reference, bit for bit: every
// 16-bit pattern, float32 ties, unaligned pointers, and counts rewritten in place.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/kernels.h"
#include "cuda/transform_reference.h"
#include "gpu/gpu_test_util.h"

namespace weightsync::cuda {
namespace {

using testing::Download;
using testing::Upload;

bool IsNaN(DType d, const uint8_t* p) {
  if (d == DType::kFloat32) {
    float f;
    std::memcpy(&f, p, 4);
    return std::isnan(f);
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return d == DType::kFloat16 ? (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0
                              : (h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0;
}

uint64_t Width(DType d) { return Info(d).bits / 8; }

// Compares GPU and reference outputs element by element: bit-exact, except that a NaN must be a
// NaN on both sides (payloads are not part of the contract). Returns the count of NaN payload
// differences, reported as information.
int64_t ExpectSame(DType to, const std::vector<uint8_t>& gpu, const std::vector<uint8_t>& ref,
                   const std::vector<uint8_t>& src, DType from) {
  const uint64_t w = Width(to), n = gpu.size() / w;
  int64_t nan_payload = 0, mismatches = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const uint8_t* g = gpu.data() + i * w;
    const uint8_t* r = ref.data() + i * w;
    if (std::memcmp(g, r, w) == 0) continue;
    if (IsNaN(to, g) && IsNaN(to, r)) {
      ++nan_payload;
      continue;
    }
    if (++mismatches <= 5) {
      uint64_t in = 0, got = 0, want = 0;
      std::memcpy(&in, src.data() + i * Width(from), Width(from));
      std::memcpy(&got, g, w);
      std::memcpy(&want, r, w);
      ADD_FAILURE() << DTypeName(from) << " -> " << DTypeName(to) << " element " << i
                    << ": input 0x" << std::hex << in << ", gpu 0x" << got << ", reference 0x"
                    << want;
    }
  }
  EXPECT_EQ(mismatches, 0) << DTypeName(from) << " -> " << DTypeName(to);
  return nan_payload;
}

// Runs one cast on the GPU and the CPU; `offset` elements into both buffers (misaligning them).
void CheckCast(DType from, DType to, const std::vector<uint8_t>& src, uint64_t offset = 0) {
  SCOPED_TRACE(std::string(DTypeName(from)) + " -> " + std::string(DTypeName(to)));
  const uint64_t count = src.size() / Width(from) - offset;
  Result<DeviceBuffer> d_src = Upload(src);
  ASSERT_OK(d_src);
  Result<DeviceBuffer> d_dst = DeviceBuffer::Allocate((count + offset) * Width(to));
  ASSERT_OK(d_dst);
  Result<Stream> stream = Stream::Create();
  ASSERT_OK(stream);
  Result<PreparedLaunch> cast =
      PrepareCast(from, to, d_src->as<uint8_t>() + offset * Width(from),
                  d_dst->as<uint8_t>() + offset * Width(to), count, stream->handle());
  ASSERT_OK(cast);
  ASSERT_OK(cast->Launch());
  ASSERT_OK(stream->Synchronize());
  Result<std::vector<uint8_t>> gpu =
      Download<uint8_t>(d_dst->as<uint8_t>() + offset * Width(to), count * Width(to));
  ASSERT_OK(gpu);
  std::vector<uint8_t> ref(count * Width(to));
  ASSERT_OK(reference::Cast(from, to, src.data() + offset * Width(from), ref.data(), count));
  const std::vector<uint8_t> in(src.begin() + offset * Width(from), src.end());
  const int64_t nan_payload = ExpectSame(to, *gpu, ref, in, from);
  if (nan_payload != 0) {  // information, not a failure: NaN payloads are not specified
    std::printf("  %s -> %s: %lld NaN outputs differ from the reference only in payload\n",
                std::string(DTypeName(from)).c_str(), std::string(DTypeName(to)).c_str(),
                static_cast<long long>(nan_payload));
  }
}

std::vector<uint8_t> All16BitPatterns() {
  std::vector<uint8_t> v(65536 * 2);
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    std::memcpy(&v[i * 2], &h, 2);
  }
  return v;
}

// Every float32 whose high half is any of the 65536 patterns, with low halves that sit on, just
// below and just above the rounding points of bfloat16 (bit 16) and float16 (bit 13); then random.
std::vector<uint8_t> Float32Cases() {
  const uint16_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x2000, 0x2FFF,
                           0x3000, 0x3001, 0x7FFF, 0x8000, 0x8001, 0xFFFF};
  std::vector<uint32_t> f;
  for (uint32_t hi = 0; hi < 65536; ++hi) {
    for (uint16_t lo : lows) f.push_back(hi << 16 | lo);
  }
  std::mt19937 rng(1);
  for (int i = 0; i < 1'000'000; ++i) f.push_back(rng());
  std::vector<uint8_t> v(f.size() * 4);
  std::memcpy(v.data(), f.data(), v.size());
  return v;
}

TEST(GpuCastTest, Every16BitPatternBitExact) {
  WS_SKIP_WITHOUT_GPU();
  const std::vector<uint8_t> all = All16BitPatterns();
  CheckCast(DType::kBFloat16, DType::kFloat32, all);
  CheckCast(DType::kBFloat16, DType::kFloat16, all);
  CheckCast(DType::kFloat16, DType::kFloat32, all);
  CheckCast(DType::kFloat16, DType::kBFloat16, all);
}

TEST(GpuCastTest, Float32NarrowingBitExactAtEveryRoundingPoint) {
  WS_SKIP_WITHOUT_GPU();
  const std::vector<uint8_t> f32 = Float32Cases();
  CheckCast(DType::kFloat32, DType::kBFloat16, f32);
  CheckCast(DType::kFloat32, DType::kFloat16, f32);
}

TEST(GpuCastTest, UnalignedPointersAndOddCounts) {
  WS_SKIP_WITHOUT_GPU();
  std::vector<uint8_t> all = All16BitPatterns();
  all.resize(all.size() - 2 * 3);  // 65533 elements: not a multiple of 8
  for (uint64_t offset : {1, 3, 8}) {
    CheckCast(DType::kBFloat16, DType::kFloat32, all, offset);
    CheckCast(DType::kFloat16, DType::kBFloat16, all, offset);
  }
  std::vector<uint8_t> f32 = Float32Cases();
  f32.resize(4 * 100'003);
  CheckCast(DType::kFloat32, DType::kFloat16, f32, 1);
  CheckCast(DType::kFloat32, DType::kBFloat16, f32, 5);
}

TEST(GpuCastTest, ArgumentsRewrittenInPlace) {
  WS_SKIP_WITHOUT_GPU();
  // One prepared launch converts two halves of a buffer: the second launch only rewrites the
  // source, destination and count in its pack.
  const std::vector<uint8_t> all = All16BitPatterns();
  Result<DeviceBuffer> d_src = Upload(all);
  ASSERT_OK(d_src);
  Result<DeviceBuffer> d_dst = DeviceBuffer::Allocate(65536 * 4);
  ASSERT_OK(d_dst);
  Result<PreparedLaunch> cast =
      PrepareCast(DType::kBFloat16, DType::kFloat32, d_src->data(), d_dst->data(), 40000, nullptr);
  ASSERT_OK(cast);
  ASSERT_OK(cast->Launch());
  ArgPack& args = cast->args();
  ASSERT_OK(
      args.SetChecked(CastArgs::kSrc, static_cast<const void*>(d_src->as<uint16_t>() + 40000)));
  ASSERT_OK(args.SetChecked(CastArgs::kDst, static_cast<void*>(d_dst->as<float>() + 40000)));
  ASSERT_OK(args.SetChecked(CastArgs::kCount, uint64_t{65536 - 40000}));
  ASSERT_OK(cast->Launch());
  ASSERT_OK(DeviceSynchronize());
  Result<std::vector<uint32_t>> out = Download<uint32_t>(d_dst->data(), 65536);
  ASSERT_OK(out);
  for (uint32_t i = 0; i < 65536; ++i) ASSERT_EQ((*out)[i], i << 16) << i;
}

}  // namespace
}  // namespace weightsync::cuda
