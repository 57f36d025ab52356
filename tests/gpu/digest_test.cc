// The GPU digest equals the CPU reference (GpuDigest) on random data of awkward sizes and
// alignments, chunk hash by chunk hash; it changes when one bit on the device changes; and one
// prepared digest serves another range after SetRange. A digest group gives every range the same
// digest as the reference, whatever the mix of sizes and alignments, with more jobs than blocks,
// and again on its next launch after the bytes changed.
#include <gtest/gtest.h>

#include <random>
#include <utility>
#include <vector>

#include "cuda/gpu_digest_reference.h"
#include "cuda/kernels.h"
#include "gpu/gpu_test_util.h"

namespace weightsync::cuda {
namespace {

using testing::Download;
using testing::Upload;

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = rng();
    for (size_t b = 0; b < 8 && i + b < n; ++b) v[i + b] = uint8_t(r >> (8 * b));
  }
  return v;
}

struct GpuDigestRun {
  uint64_t digest = 0;
  std::vector<uint64_t> chunks;
};

// Digests bytes [offset, offset + n) of `host` on the device.
Result<GpuDigestRun> DigestOnGpu(const std::vector<uint8_t>& host, uint64_t offset, uint64_t n) {
  WS_ASSIGN_OR_RETURN(DeviceBuffer data, Upload(host));
  const uint64_t chunks = GpuDigestChunkCount(n);
  WS_ASSIGN_OR_RETURN(DeviceBuffer hashes,
                      DeviceBuffer::Allocate(std::max<uint64_t>(chunks, 1) * 8));
  WS_ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Allocate(8));
  WS_ASSIGN_OR_RETURN(Stream stream, Stream::Create());
  WS_ASSIGN_OR_RETURN(
      PreparedDigest digest,
      PrepareDigest(data.as<uint8_t>() + offset, n, hashes.as<uint64_t>(),
                    std::max<uint64_t>(chunks, 1), out.as<uint64_t>(), stream.handle()));
  WS_RETURN_IF_ERROR(digest.Launch());
  WS_RETURN_IF_ERROR(stream.Synchronize());
  GpuDigestRun run;
  WS_ASSIGN_OR_RETURN(std::vector<uint64_t> d, Download<uint64_t>(out.data(), 1));
  run.digest = d[0];
  WS_ASSIGN_OR_RETURN(run.chunks, Download<uint64_t>(hashes.data(), chunks));
  return run;
}

TEST(GpuDigestTest, EqualsTheCpuReferenceOnAwkwardSizesAndAlignments) {
  WS_SKIP_WITHOUT_GPU();
  const uint64_t sizes[] = {0,
                            1,
                            7,
                            8,
                            9,
                            15,
                            16,
                            17,
                            4095,
                            65535,
                            65536,
                            65537,
                            65536 + 8,
                            3 * 65536 - 1,
                            1000003,
                            (1 << 20) + 3,
                            5 * 65536 + 4097};
  const std::vector<uint8_t> data = RandomBytes((1 << 21) + 64, 1);
  for (uint64_t offset : {0, 1, 3, 8, 16}) {  // 16-byte, 8-byte and byte-wise load paths
    for (uint64_t n : sizes) {
      SCOPED_TRACE("bytes " + std::to_string(n) + " at offset " + std::to_string(offset));
      Result<GpuDigestRun> run = DigestOnGpu(data, offset, n);
      ASSERT_OK(run);
      EXPECT_EQ(run->digest, GpuDigest(data.data() + offset, n));
      ASSERT_EQ(run->chunks.size(), GpuDigestChunkCount(n));
      for (uint64_t c = 0; c < run->chunks.size(); ++c) {
        const uint64_t len = std::min<uint64_t>(kGpuDigestChunkBytes, n - c * kGpuDigestChunkBytes);
        ASSERT_EQ(run->chunks[c],
                  GpuDigestChunkHash(data.data() + offset + c * kGpuDigestChunkBytes, len))
            << "chunk " << c;
      }
    }
  }
}

TEST(GpuDigestTest, LargeRange) {
  WS_SKIP_WITHOUT_GPU();
  const std::vector<uint8_t> data = RandomBytes((64ull << 20) + 13, 2);
  Result<GpuDigestRun> run = DigestOnGpu(data, 0, data.size());
  ASSERT_OK(run);
  EXPECT_EQ(run->digest, GpuDigest(data.data(), data.size()));
}

TEST(GpuDigestTest, OneFlippedBitOnTheDeviceChangesTheDigestAndSetRangeRetargets) {
  WS_SKIP_WITHOUT_GPU();
  std::vector<uint8_t> data = RandomBytes(3 * 65536 + 5, 3);
  Result<DeviceBuffer> d_data = Upload(data);
  ASSERT_OK(d_data);
  Result<DeviceBuffer> hashes = DeviceBuffer::Allocate(4 * 8);
  ASSERT_OK(hashes);
  Result<DeviceBuffer> out = DeviceBuffer::Allocate(8);
  ASSERT_OK(out);
  Result<PreparedDigest> digest = PrepareDigest(d_data->data(), data.size(), hashes->as<uint64_t>(),
                                                4, out->as<uint64_t>(), nullptr);
  ASSERT_OK(digest);
  auto run = [&]() -> uint64_t {
    EXPECT_OK(digest->Launch());
    EXPECT_OK(DeviceSynchronize());
    Result<std::vector<uint64_t>> d = Download<uint64_t>(out->data(), 1);
    EXPECT_OK(d);
    return d.ok() ? (*d)[0] : 0;
  };
  const uint64_t base = run();
  EXPECT_EQ(base, GpuDigest(data.data(), data.size()));
  for (uint64_t at : {uint64_t{0}, uint64_t{65535}, uint64_t{65536}, uint64_t{2 * 65536 + 7},
                      uint64_t{data.size() - 1}}) {
    for (int bit : {0, 7}) {
      uint8_t flipped = data[at] ^ uint8_t(1u << bit);
      ASSERT_OK(CopyToDevice(d_data->as<uint8_t>() + at, &flipped, 1));
      EXPECT_NE(run(), base) << "byte " << at << " bit " << bit;
      ASSERT_OK(CopyToDevice(d_data->as<uint8_t>() + at, &data[at], 1));
    }
  }
  EXPECT_EQ(run(), base);

  // Another range, same prepared launches.
  ASSERT_OK(digest->SetRange(d_data->as<uint8_t>() + 5, 2 * 65536 + 1));
  EXPECT_EQ(run(), GpuDigest(data.data() + 5, 2 * 65536 + 1));
  ASSERT_STATUS_IS(kInvalidArgument, digest->SetRange(d_data->data(), 4 * 65536 + 1));
}

// Every awkward size at every load path's alignment in one group, plus ranges that share bytes
// (digests only read), and a group of 20,000 ranges (more jobs than resident blocks).
TEST(GpuDigestGroupTest, EveryRangeGetsTheReferenceDigestAndALaunchAfterAChangeSeesIt) {
  WS_SKIP_WITHOUT_GPU();
  std::vector<uint8_t> data = RandomBytes((1 << 21) + 64, 4);
  Result<DeviceBuffer> d_data = Upload(data);
  ASSERT_OK(d_data);
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // (offset, bytes)
  for (uint64_t offset : {0, 1, 3, 8, 16}) {
    for (uint64_t n : {0, 1, 7, 8, 9, 17, 4095, 65535, 65536, 65537, 3 * 65536 - 1, 1000003}) {
      spans.push_back({offset, n});
    }
  }
  std::mt19937_64 rng(5);
  for (int i = 0; i < 20000; ++i) {
    const uint64_t n = rng() % 3000;
    spans.push_back({rng() % (data.size() - n), n});
  }
  Result<DeviceBuffer> out = DeviceBuffer::Allocate(spans.size() * 8);
  ASSERT_OK(out);
  std::vector<DigestRange> ranges;
  for (size_t i = 0; i < spans.size(); ++i) {
    ranges.push_back(
        {d_data->as<uint8_t>() + spans[i].first, spans[i].second, out->as<uint64_t>() + i});
  }
  Result<PreparedDigestGroup> group = PrepareDigestGroup(ranges, nullptr);
  ASSERT_OK(group);
  EXPECT_EQ(group->ranges(), spans.size());
  auto check = [&](const char* when) {
    ASSERT_OK(group->Launch());
    ASSERT_OK(DeviceSynchronize());
    Result<std::vector<uint64_t>> got = Download<uint64_t>(out->data(), spans.size());
    ASSERT_OK(got);
    size_t bad = 0;
    for (size_t i = 0; i < spans.size(); ++i) {
      if ((*got)[i] != GpuDigest(data.data() + spans[i].first, spans[i].second)) {
        if (bad++ < 5) {
          ADD_FAILURE() << when << ": range " << i << " (" << spans[i].second << " bytes at "
                        << spans[i].first << ")";
        }
      }
    }
    EXPECT_EQ(bad, 0u) << when;
  };
  check("first launch");
  data[65536 + 3] ^= 0x10;  // in several ranges
  ASSERT_OK(CopyToDevice(d_data->as<uint8_t>() + 65536 + 3, &data[65536 + 3], 1));
  check("after one byte changed");
}

TEST(GpuDigestGroupTest, AnEmptyGroupLaunchesNothingAndHostMemoryIsRefusedNamingTheRange) {
  WS_SKIP_WITHOUT_GPU();
  Result<PreparedDigestGroup> empty = PrepareDigestGroup({}, nullptr);
  ASSERT_OK(empty);
  EXPECT_TRUE(empty->empty());
  EXPECT_OK(empty->Launch());
  std::vector<uint8_t> host(64);
  Result<DeviceBuffer> out = DeviceBuffer::Allocate(16);
  ASSERT_OK(out);
  Result<DeviceBuffer> dev = DeviceBuffer::Allocate(64);
  ASSERT_OK(dev);
  const std::vector<DigestRange> ranges = {{dev->data(), 64, out->as<uint64_t>()},
                                           {host.data(), 64, out->as<uint64_t>() + 1}};
  EXPECT_STATUS_IS(kInvalidArgument, PrepareDigestGroup(ranges, nullptr), "digest_group",
                   "range 1");
}

}  // namespace
}  // namespace weightsync::cuda
