// ArgPack (src/cuda/arg_pack.h): typed scalar kernel arguments in one stable block, rewritten in
// place. CPU only: these tests run in every build.
#include "cuda/arg_pack.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "cuda/kernel_table.h"
#include "cuda/launch_registry.h"
#include "cuda/prepared_launch.h"
#include "testing/count_new.inc"
#include "testing/test_util.h"

namespace weightsync::cuda {
namespace {

// One value of each of the 18 element types, in wire-code order, with distinctive bytes.
struct AllScalars {
  bool b = true;
  int8_t i8 = -5;
  int16_t i16 = -12345;
  int32_t i32 = -123456789;
  int64_t i64 = -1234567890123456789;
  uint8_t u8 = 0xAB;
  uint16_t u16 = 0xBEEF;
  uint32_t u32 = 0xDEADBEEF;
  uint64_t u64 = 0x0123456789ABCDEFull;
  Float16Bits f16{0x3C01};
  BFloat16Bits bf16{0xBF81};
  TFloat32Bits tf32{0x3F802000};
  float f32 = -3.5f;
  double f64 = 2.000000000000004;
  Float8E4M3FNBits e4m3{0x7E};
  Float8E5M2Bits e5m2{0xFB};
  Float8E8M0FNUBits e8m0{0x80};
  Float4E2M1FNBits e2m1{0x0D};
};

// Sets argument `index` (type T) and checks the bytes the kernel would read: the value, at an
// offset aligned to alignof(T), through kernel_params()[index], and read back by Get.
template <typename T>
void ExpectRoundTrip(ArgPack& pack, size_t index, T value) {
  SCOPED_TRACE(std::string(ArgType::Of<T>().name()));
  ASSERT_EQ(pack.type(index), ArgType::Of<T>());
  ASSERT_OK(pack.SetChecked(index, value));
  const void* at = pack.kernel_params()[index];
  EXPECT_EQ(reinterpret_cast<uintptr_t>(at) % alignof(T), 0u);
  EXPECT_EQ(pack.offset(index) % alignof(T), 0u);
  EXPECT_EQ(sizeof(T), pack.type(index).size());
  EXPECT_EQ(0, std::memcmp(at, &value, sizeof(T)));
  Result<T> back = pack.Get<T>(index);
  ASSERT_OK(back);
  EXPECT_EQ(0, std::memcmp(&*back, &value, sizeof(T)));
}

TEST(ArgPackTest, EveryScalarTypeRoundTripsAtItsNaturalAlignment) {
  // Each type after a bool, so every one of them needs padding to reach its alignment.
  const DTypeInfo* all = AllDTypes();
  std::vector<ArgType> signature;
  for (int i = 0; i < kDTypeCount; ++i) {
    signature.push_back(ArgType::Scalar(DType::kBool));
    signature.push_back(ArgType::Scalar(all[i].dtype));
  }
  Result<ArgPack> made = ArgPack::Create(signature, "test");
  ASSERT_OK(made);
  ArgPack& pack = *made;
  ASSERT_EQ(pack.size(), 2u * kDTypeCount);
  const AllScalars v;
  size_t i = 1;
  ExpectRoundTrip(pack, i, v.b), i += 2;
  ExpectRoundTrip(pack, i, v.i8), i += 2;
  ExpectRoundTrip(pack, i, v.i16), i += 2;
  ExpectRoundTrip(pack, i, v.i32), i += 2;
  ExpectRoundTrip(pack, i, v.i64), i += 2;
  ExpectRoundTrip(pack, i, v.u8), i += 2;
  ExpectRoundTrip(pack, i, v.u16), i += 2;
  ExpectRoundTrip(pack, i, v.u32), i += 2;
  ExpectRoundTrip(pack, i, v.u64), i += 2;
  ExpectRoundTrip(pack, i, v.f16), i += 2;
  ExpectRoundTrip(pack, i, v.bf16), i += 2;
  ExpectRoundTrip(pack, i, v.tf32), i += 2;
  ExpectRoundTrip(pack, i, v.f32), i += 2;
  ExpectRoundTrip(pack, i, v.f64), i += 2;
  ExpectRoundTrip(pack, i, v.e4m3), i += 2;
  ExpectRoundTrip(pack, i, v.e5m2), i += 2;
  ExpectRoundTrip(pack, i, v.e8m0), i += 2;
  ExpectRoundTrip(pack, i, v.e2m1), i += 2;
  EXPECT_EQ(i, 2u * kDTypeCount + 1);
  // The untouched bools between them are still zero: no write spilled over.
  for (size_t k = 0; k < pack.size(); k += 2) {
    EXPECT_EQ(*static_cast<const uint8_t*>(pack.value_ptr(k)), 0) << "argument " << k;
  }
  // Every type's size holds its element (a 4-bit float takes a byte).
  for (int k = 0; k < kDTypeCount; ++k) {
    EXPECT_GE(ArgType::Scalar(all[k].dtype).size() * 8, all[k].bits) << all[k].name;
  }
}

// The pack lays out a signature exactly as the C++ ABI lays out the same members in a struct,
// which is how a kernel's parameter block is laid out.
struct ProbeParams {
  void* out;
  bool b;
  int8_t i8;
  int16_t i16;
  int32_t i32;
  int64_t i64;
  uint8_t u8;
  uint16_t u16;
  uint32_t u32;
  uint64_t u64;
  Float16Bits f16;
  BFloat16Bits bf16;
  TFloat32Bits tf32;
  float f32;
  double f64;
  Float8E4M3FNBits e4m3;
  Float8E5M2Bits e5m2;
  Float8E8M0FNUBits e8m0;
  Float4E2M1FNBits e2m1;
};

TEST(ArgPackTest, LayoutMatchesTheParameterBlockOfTheArgProbeKernel) {
  Result<ArgPack> pack = ArgPack::Create(kArgProbeSignature, "arg_probe");
  ASSERT_OK(pack);
  const size_t expected[] = {
      offsetof(ProbeParams, out),  offsetof(ProbeParams, b),    offsetof(ProbeParams, i8),
      offsetof(ProbeParams, i16),  offsetof(ProbeParams, i32),  offsetof(ProbeParams, i64),
      offsetof(ProbeParams, u8),   offsetof(ProbeParams, u16),  offsetof(ProbeParams, u32),
      offsetof(ProbeParams, u64),  offsetof(ProbeParams, f16),  offsetof(ProbeParams, bf16),
      offsetof(ProbeParams, tf32), offsetof(ProbeParams, f32),  offsetof(ProbeParams, f64),
      offsetof(ProbeParams, e4m3), offsetof(ProbeParams, e5m2), offsetof(ProbeParams, e8m0),
      offsetof(ProbeParams, e2m1)};
  ASSERT_EQ(pack->size(), std::size(expected));
  for (size_t i = 0; i < pack->size(); ++i) EXPECT_EQ(pack->offset(i), expected[i]) << i;
  EXPECT_EQ(pack->value_bytes(), offsetof(ProbeParams, e2m1) + 1);
  // One block: the values are contiguous from argument 0.
  for (size_t i = 0; i < pack->size(); ++i) {
    EXPECT_EQ(static_cast<const std::byte*>(pack->value_ptr(i)) -
                  static_cast<const std::byte*>(pack->value_ptr(0)),
              static_cast<ptrdiff_t>(expected[i]));
  }
}

TEST(ArgPackTest, KernelParamsStayPutAcrossAMillionSetsWithoutAllocating) {
  Result<ArgPack> made = ArgPack::Create(kArgProbeSignature, "arg_probe");
  ASSERT_OK(made);
  ArgPack pack = std::move(*made);  // a move keeps the block (and the pointers into it)
  void** params = pack.kernel_params();
  std::vector<void*> entries(params, params + pack.size());
  using P = ArgProbeArgs;
  int xs[8] = {};

  const int64_t news_before = g_new_calls.load();
  for (uint32_t i = 0; i < 1'000'000; ++i) {
    pack.Set(P::kOut, &xs[i & 7]);
    pack.Set(P::Scalar(DType::kBool), (i & 1) != 0);
    pack.Set(P::Scalar(DType::kInt8), static_cast<int8_t>(i));
    pack.Set(P::Scalar(DType::kInt64), static_cast<int64_t>(i) * -3);
    pack.Set(P::Scalar(DType::kUInt32), i);
    pack.Set(P::Scalar(DType::kBFloat16), BFloat16Bits{static_cast<uint16_t>(i)});
    pack.Set(P::Scalar(DType::kFloat32), static_cast<float>(i));
    pack.Set(P::Scalar(DType::kFloat64), i * 0.5);
    pack.Set(P::Scalar(DType::kFloat8E4M3FN), Float8E4M3FNBits{static_cast<uint8_t>(i)});
    if (Status s = pack.SetChecked(P::Scalar(DType::kUInt64), uint64_t{i}); !s.ok()) {
      FAIL() << s;
    }
  }
  const int64_t news_after = g_new_calls.load();
  EXPECT_EQ(news_after - news_before, 0) << "heap allocations during 1,000,000 Set calls";

  EXPECT_EQ(pack.kernel_params(), params);
  for (size_t i = 0; i < pack.size(); ++i) EXPECT_EQ(pack.kernel_params()[i], entries[i]) << i;
  EXPECT_EQ(*pack.Get<uint32_t>(P::Scalar(DType::kUInt32)), 999'999u);
  EXPECT_EQ(*pack.Get<double>(P::Scalar(DType::kFloat64)), 999'999 * 0.5);
  EXPECT_EQ(*pack.Get<int*>(P::kOut), &xs[999'999 & 7]);
  EXPECT_EQ(pack.Get<BFloat16Bits>(P::Scalar(DType::kBFloat16))->bits,
            static_cast<uint16_t>(999'999));
}

TEST(ArgPackTest, TypeMismatchNamesIndexExpectedAndActual) {
  Result<ArgPack> pack = ArgPack::Create(kArgProbeSignature, "arg_probe");
  ASSERT_OK(pack);
  const size_t bf16 = ArgProbeArgs::Scalar(DType::kBFloat16);

  Status s = pack->SetChecked(bf16, 1.0f);
  ASSERT_STATUS_IS(kInvalidArgument, s);
  EXPECT_EQ(s.message(), "arg_probe argument 11: expected bfloat16, got float32");
  // A uint16 is not a bfloat16 either, though it has the same size.
  s = pack->SetChecked(bf16, uint16_t{0x3F80});
  ASSERT_STATUS_IS(kInvalidArgument, s);
  EXPECT_EQ(s.message(), "arg_probe argument 11: expected bfloat16, got uint16");
  s = pack->SetChecked(ArgProbeArgs::kOut, uint64_t{0});
  ASSERT_STATUS_IS(kInvalidArgument, s);
  EXPECT_EQ(s.message(), "arg_probe argument 0: expected pointer, got uint64");
  s = pack->SetChecked(ArgProbeArgs::Scalar(DType::kUInt64), static_cast<void*>(nullptr));
  EXPECT_EQ(s.message(), "arg_probe argument 9: expected uint64, got pointer");
  s = pack->SetChecked(19, 1.0);
  ASSERT_STATUS_IS(kInvalidArgument, s);
  EXPECT_EQ(s.message(), "arg_probe argument 19: out of range (the signature has 19 arguments)");
  s = pack->SetChecked(ArgProbeArgs::Scalar(DType::kFloat4E2M1FN), Float4E2M1FNBits{0x1F});
  ASSERT_STATUS_IS(kInvalidArgument, s, "does not fit in 4 bits");
  ASSERT_STATUS_IS(kInvalidArgument, pack->Get<float>(bf16));
  // Nothing was written by the rejected calls.
  EXPECT_EQ(pack->Get<BFloat16Bits>(bf16)->bits, 0);
  EXPECT_EQ(*pack->Get<uint64_t>(ArgProbeArgs::Scalar(DType::kUInt64)), 0u);
}

TEST(ArgPackTest, RejectsMoreParameterBytesThanALaunchTakes) {
  std::vector<ArgType> big(kMaxKernelParamBytes / 8 + 1, ArgType::Scalar(DType::kFloat64));
  Result<ArgPack> pack = ArgPack::Create(big, "big");
  ASSERT_STATUS_IS(kInvalidArgument, pack, "at most 4096");
  std::vector<ArgType> fits(kMaxKernelParamBytes / 8, ArgType::Scalar(DType::kFloat64));
  ASSERT_OK(ArgPack::Create(fits, "fits"));
}

TEST(ArgPackTest, EmptySignature) {
  Result<ArgPack> pack = ArgPack::Create({}, "none");
  ASSERT_OK(pack);
  EXPECT_EQ(pack->size(), 0u);
  EXPECT_EQ(pack->value_bytes(), 0u);
  ASSERT_STATUS_IS(kInvalidArgument, pack->SetChecked(0, 1));
}

// Kernel signatures are checked against parameter lists at compile time (kernels.cu does this
// for every kernel); the check itself, on host functions:
void CastLike(const uint16_t*, float*, uint64_t) {}
void CastWrongCount(const uint16_t*, float*, uint32_t) {}
void CastTooFew(const uint16_t*, float*) {}
struct Opaque2 {
  uint16_t raw;
};  // stands for __nv_bfloat16: same size and alignment as the signature's scalar
void ScalarByLayout(Opaque2) {}
static_assert(KernelMatchesSignature(&CastLike, kCastSignature));
static_assert(!KernelMatchesSignature(&CastWrongCount, kCastSignature));
static_assert(!KernelMatchesSignature(&CastTooFew, kCastSignature));
inline constexpr ArgType kOneBf16[] = {ArgType::Scalar(DType::kBFloat16)};
inline constexpr ArgType kOneF32[] = {ArgType::Scalar(DType::kFloat32)};
static_assert(KernelMatchesSignature(&ScalarByLayout, kOneBf16));
static_assert(!KernelMatchesSignature(&ScalarByLayout, kOneF32));

TEST(ArgPackTest, EveryKernelSignatureLaysOut) {
  for (const KernelInfo& k : kKernels) {
    Result<ArgPack> pack = ArgPack::Create(k.signature, k.name);
    ASSERT_OK(pack);
    EXPECT_EQ(pack->size(), k.signature.size()) << k.name;
    EXPECT_EQ(pack->label(), k.name);
  }
}

// ---- registry ----------------------------------------------------------------------------------

void FakeKernel(const uint16_t*, float*, uint64_t) {}

TEST(LaunchRegistryTest, CountsScalarTypesKernelsAndLivePreparedLaunches) {
  EXPECT_EQ(ReadyScalarTypeCount(), 18);
  EXPECT_EQ(ReadyKernelCount(), 18);  // the rows of kernel_table.h
  const int64_t before = LivePreparedLaunches();
  const void* fn = reinterpret_cast<const void*>(&FakeKernel);
  const KernelInfo& cast = Kernel(KernelId::kCastBF16ToF32);
  {
    Result<PreparedLaunch> a = PreparedLaunch::Create(cast, fn, {4, 1, 1}, {256, 1, 1}, 0, nullptr);
    ASSERT_OK(a);
    Result<PreparedLaunch> b = PreparedLaunch::Create(cast, fn, {1, 1, 1}, {32, 1, 1}, 0, nullptr);
    ASSERT_OK(b);
    EXPECT_EQ(LivePreparedLaunches(), before + 2);
    PreparedLaunch moved = std::move(*a);  // a move hands the count over
    EXPECT_EQ(LivePreparedLaunches(), before + 2);
    EXPECT_EQ(moved.name(), "cast_bf16_to_f32");
    EXPECT_EQ(moved.grid().x, 4u);
    ASSERT_OK(moved.args().SetChecked(CastArgs::kCount, uint64_t{7}));

    testing::LogCapture log;
    EXPECT_EQ(LogPreparedLaunchesReady(), before + 2);
    EXPECT_TRUE(log.Contains("I cuda: prepared launches ready: 18 scalar types, " +
                             std::to_string(before + 2) + " launches (" +
                             std::to_string(kKernelCount) + " kernels)"))
        << (log.Lines().empty() ? "" : log.Lines()[0]);
  }
  EXPECT_EQ(LivePreparedLaunches(), before);
}

TEST(LaunchRegistryTest, CreateRejectsEmptyLaunches) {
  const KernelInfo& copy = Kernel(KernelId::kCopy);
  ASSERT_STATUS_IS(kInvalidArgument,
                   PreparedLaunch::Create(copy, nullptr, {1, 1, 1}, {1, 1, 1}, 0, nullptr));
  const void* fn = reinterpret_cast<const void*>(&FakeKernel);
  Result<PreparedLaunch> empty =
      PreparedLaunch::Create(copy, fn, {0, 1, 1}, {256, 1, 1}, 0, nullptr);
  ASSERT_STATUS_IS(kInvalidArgument, empty, "copy: empty launch");
}

}  // namespace
}  // namespace weightsync::cuda
