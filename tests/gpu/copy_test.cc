// The copy kernel moves exactly the bytes asked for, for every mix of alignments (16-byte vector
// path when source and destination share their alignment modulo 16, bytes otherwise); a prepared
// CopyBatch whose rows became strided (2-D) copies lands every row and nothing between them.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "cuda/copy_batch.h"
#include "cuda/kernels.h"
#include "cuda/vmm.h"
#include "gpu/gpu_test_util.h"
#include "util/deadline.h"

namespace weightsync::cuda {
namespace {

using testing::Download;
using testing::Upload;

std::vector<uint8_t> RandomBytes(size_t n, unsigned seed) {
  std::vector<uint8_t> bytes(n);
  std::mt19937 rng(seed);
  for (auto& b : bytes) b = uint8_t(rng());
  return bytes;
}

// Runs `group` on `queue` and checks the `want.size()` device bytes at `dst` against `want`.
void ExpectGroupLands(PreparedCopyGroup& group, CopyQueue& queue, const void* dst,
                      const std::vector<uint8_t>& want) {
  ASSERT_OK(group.Launch());
  ASSERT_OK(queue.Wait(util::Deadline(std::chrono::seconds(30))));
  Result<std::vector<uint8_t>> out = Download<uint8_t>(dst, want.size());
  ASSERT_OK(out);
  for (uint64_t i = 0; i < want.size(); ++i) ASSERT_EQ((*out)[i], want[i]) << "byte " << i;
}

TEST(GpuCopyTest, ExactBytesAtEveryAlignment) {
  WS_SKIP_WITHOUT_GPU();
  constexpr uint64_t kMax = (1 << 20) + 64;
  const std::vector<uint8_t> src = RandomBytes(kMax, 1);
  Result<DeviceBuffer> d_src = Upload(src);
  ASSERT_OK(d_src);
  Result<DeviceBuffer> d_dst = DeviceBuffer::Allocate(kMax);
  ASSERT_OK(d_dst);
  for (uint64_t bytes : {0ull, 1ull, 15ull, 16ull, 17ull, 4095ull, 65536ull + 3, 1ull << 20}) {
    for (uint64_t so : {0, 1, 8}) {
      for (uint64_t dof : {0, 1, 8, 17}) {
        SCOPED_TRACE(std::to_string(bytes) + " bytes, offsets " + std::to_string(so) + "/" +
                     std::to_string(dof));
        ASSERT_OK(MemsetDevice(d_dst->data(), 0xEE, kMax));
        Result<PreparedLaunch> copy =
            PrepareCopy(d_src->as<uint8_t>() + so, d_dst->as<uint8_t>() + dof, bytes, nullptr);
        ASSERT_OK(copy);
        ASSERT_OK(copy->Launch());
        Result<std::vector<uint8_t>> out = Download<uint8_t>(d_dst->data(), kMax);
        ASSERT_OK(out);
        for (uint64_t i = 0; i < kMax; ++i) {
          const uint8_t want = (i >= dof && i < dof + bytes) ? src[so + i - dof] : 0xEE;
          ASSERT_EQ((*out)[i], want) << "byte " << i;
        }
      }
    }
  }
}

TEST(GpuCopyTest, RejectsHostMemoryTheDeviceCannotReach) {
  WS_SKIP_WITHOUT_GPU();
  std::vector<uint8_t> host(64);
  Result<DeviceBuffer> d = DeviceBuffer::Allocate(64);
  ASSERT_OK(d);
  Result<PreparedLaunch> copy = PrepareCopy(host.data(), d->data(), 64, nullptr);
  ASSERT_STATUS_IS(kInvalidArgument, copy, "host memory the device cannot reach");
}

// Rows of a row-parallel cut (every other half row of the source into a destination whose rows
// have a gap), plus singles of other sizes: both submissions of one batch, checked byte for byte,
// gaps included, device to device and device to pinned host memory.
TEST(GpuCopyTest, AStridedBatchLandsEveryRowAndNothingBetween) {
  WS_SKIP_WITHOUT_GPU();
  constexpr size_t kRows = 300, kSrcPitch = 4096, kWidth = 2048 - 8, kDstPitch = 2048 + 24;
  constexpr size_t kDstBytes = kRows * kDstPitch + 4096;
  const std::vector<uint8_t> src = RandomBytes(kRows * kSrcPitch, 3);
  Result<DeviceBuffer> d_src = Upload(src);
  ASSERT_OK(d_src);
  Result<DeviceBuffer> d_dst = DeviceBuffer::Allocate(kDstBytes);
  ASSERT_OK(d_dst);
  std::vector<uint8_t> pinned_storage(kDstBytes);
  Result<HostRegistration> pinned =
      HostRegistration::Register(pinned_storage.data(), kDstBytes, /*read_only=*/false);
  ASSERT_OK(pinned);
  Result<CopyQueue> queue = CopyQueue::Create(0);
  ASSERT_OK(queue);
  for (bool to_host : {false, true}) {
    SCOPED_TRACE(to_host ? "device to pinned host" : "device to device");
    uint8_t* dst = to_host ? pinned_storage.data() : d_dst->as<uint8_t>();
    std::vector<uint8_t> want(kDstBytes, 0xEE);
    if (to_host) {
      std::fill(pinned_storage.begin(), pinned_storage.end(), 0xEE);
    } else {
      ASSERT_OK(MemsetDevice(dst, 0xEE, kDstBytes));
    }
    CopyBatch batch;
    for (size_t r = 0; r < kRows; ++r) {
      const size_t from = r * kSrcPitch + 8, to = r * kDstPitch;
      batch.Add(dst + to, d_src->as<uint8_t>() + from, kWidth, /*span=*/0);
      std::copy_n(src.begin() + from, kWidth, want.begin() + to);
    }
    // Two singles after the rows, one of a size no row has.
    const size_t tail = kRows * kDstPitch;
    batch.Add(dst + tail, d_src->as<uint8_t>() + 1, 100, 0);
    std::copy_n(src.begin() + 1, 100, want.begin() + tail);
    batch.Add(dst + tail + 200, d_src->as<uint8_t>() + 5000, 3, 0);
    std::copy_n(src.begin() + 5000, 3, want.begin() + tail + 200);
    ASSERT_EQ(batch.strided().size(), 1u);
    ASSERT_EQ(batch.strided()[0].height, kRows);
    ASSERT_EQ(batch.sizes().size(), 2u);
    ASSERT_OK(queue->EnqueueBatch(batch));
    ASSERT_OK(queue->Wait(util::Deadline(std::chrono::seconds(30))));
    std::vector<uint8_t> got = pinned_storage;
    if (!to_host) {
      Result<std::vector<uint8_t>> out = Download<uint8_t>(dst, kDstBytes);
      ASSERT_OK(out);
      got = std::move(*out);
    }
    for (size_t i = 0; i < kDstBytes; ++i) ASSERT_EQ(got[i], want[i]) << "byte " << i;
  }
  ASSERT_OK(queue->Close());
  ASSERT_OK(pinned->Close());
}

// A batch of kLaneMinBytes or more goes out on the copy lanes: it starts only after what was
// enqueued before it (the fork) and what is enqueued after it starts only once all of it landed
// (the join). The batch: one fast device-to-device copy, which CutIntoLanes gives the queue's
// own stream, then three slow copies from pinned host memory, one per side lane. Each round, on
// the queue's stream: a slow dummy upload, then the host sources are written (a download of this
// round's pattern) and the device source too, then the batch, then a copy of the whole destination
// into a check buffer. Without the fork the side lanes read the host sources before they are
// written; without the join the check copy runs right after the fast copy, long before the slow
// ones land. Either leaves bytes of another value in the check buffer. The batch's copy group
// (small copies, launched by EnqueueBatch with the batch) lands in the destination's tail.
TEST(GpuCopyTest, ABatchOnCopyLanesOrdersAfterWhatCameBeforeAndBeforeWhatComesAfter) {
  WS_SKIP_WITHOUT_GPU();
  constexpr size_t kFast = size_t{512} << 20, kSlow = size_t{128} << 20, kSlowPieces = 3;
  constexpr size_t kSmall = 4096, kSmallCopies = 3;
  constexpr size_t kHost = kSlow * kSlowPieces, kBytes = kFast + kHost + kSmall * kSmallCopies;
  static_assert(kBytes >= CopyQueue::kLaneMinBytes);
  std::vector<uint8_t> host(kHost, 0);
  Result<HostRegistration> pinned = HostRegistration::Register(host.data(), kHost, false);
  ASSERT_OK(pinned);
  Result<DeviceBuffer> pattern = DeviceBuffer::Allocate(kFast);
  Result<DeviceBuffer> src = DeviceBuffer::Allocate(kFast);
  Result<DeviceBuffer> scratch = DeviceBuffer::Allocate(kHost);
  Result<DeviceBuffer> dst = DeviceBuffer::Allocate(kBytes);
  Result<DeviceBuffer> check = DeviceBuffer::Allocate(kBytes);
  for (auto* b : {&pattern, &src, &scratch, &dst, &check}) ASSERT_OK(*b);
  Result<CopyQueue> queue = CopyQueue::Create(0);
  ASSERT_OK(queue);
  CopyBatch batch;
  batch.Add(dst->data(), src->data(), kFast, 0);
  for (size_t i = 0; i < kSlowPieces; ++i) {  // in reverse order: singles, never a strided copy
    batch.Add(dst->as<uint8_t>() + kFast + (kSlowPieces - 1 - i) * kSlow, host.data() + i * kSlow,
              kSlow, 1 + i);
  }
  ASSERT_EQ(batch.sizes().size(), 1 + kSlowPieces);
  const LaneCuts cuts = CutIntoLanes(batch.sizes(), CopyQueue::kCopyLanes);
  ASSERT_EQ(cuts.count, 1 + kSlowPieces);  // the fast copy alone on the queue's stream
  std::vector<SingleCopy> small_copies;
  for (size_t i = 0; i < kSmallCopies; ++i) {
    small_copies.push_back(
        {dst->as<uint8_t>() + kFast + kHost + i * kSmall, src->as<uint8_t>() + i, kSmall});
  }
  Result<PreparedCopyGroup> group = PrepareCopyGroup(small_copies, queue->stream());
  ASSERT_OK(group);
  for (uint8_t round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const uint8_t value = uint8_t(0xA0 + round);
    ASSERT_OK(MemsetDevice(pattern->data(), value, kFast));
    ASSERT_OK(MemsetDevice(dst->data(), 0x00, kBytes));
    ASSERT_OK(DeviceSynchronize());  // the memsets ran on the legacy stream
    ASSERT_OK(queue->Enqueue(scratch->data(), host.data(), kHost));  // the slow dummy
    ASSERT_OK(queue->Enqueue(host.data(), pattern->data(), kHost));
    ASSERT_OK(queue->Enqueue(src->data(), pattern->data(), kFast));
    ASSERT_OK(queue->EnqueueBatch(batch, &*group));
    ASSERT_OK(queue->Enqueue(check->data(), dst->data(), kBytes));
    ASSERT_OK(queue->Wait(util::Deadline(std::chrono::seconds(30))));
    EXPECT_EQ(queue->side_lanes(), CopyQueue::kCopyLanes - 1);
    Result<std::vector<uint8_t>> out = Download<uint8_t>(check->data(), kBytes);
    ASSERT_OK(out);
    const auto wrong =
        std::find_if(out->begin(), out->end(), [&](uint8_t b) { return b != value; });
    ASSERT_EQ(wrong, out->end()) << "byte " << (wrong - out->begin()) << " is " << int(*wrong)
                                 << ", want " << int(value);
  }
  ASSERT_OK(queue->Close());
  ASSERT_OK(pinned->Close());
  // Below kLaneMinBytes a batch stays on the queue's stream: no side stream is made.
  Result<CopyQueue> small = CopyQueue::Create(0);
  ASSERT_OK(small);
  CopyBatch few;
  few.Add(dst->data(), src->data(), 1 << 20, 0);
  few.Add(dst->as<uint8_t>() + (2 << 20), src->data(), 1 << 20, 1);
  ASSERT_OK(small->EnqueueBatch(few));
  ASSERT_OK(small->Wait(util::Deadline(std::chrono::seconds(30))));
  EXPECT_EQ(small->side_lanes(), 0u);
  ASSERT_OK(small->Close());
}

// One launch for many copies: odd sizes and alignments, a zero-byte copy, and copies above the
// chunk size (split into jobs that different blocks copy) land exactly; the gaps stay untouched.
TEST(GpuCopyTest, ACopyGroupMovesEveryCopyExactlyInOneLaunch) {
  WS_SKIP_WITHOUT_GPU();
  constexpr uint64_t kBytes = 8 << 20;
  const std::vector<uint8_t> src = RandomBytes(kBytes, 5);
  Result<DeviceBuffer> d_src = Upload(src);
  ASSERT_OK(d_src);
  Result<DeviceBuffer> d_dst = DeviceBuffer::Allocate(kBytes);
  ASSERT_OK(d_dst);
  ASSERT_OK(MemsetDevice(d_dst->data(), 0xEE, kBytes));
  std::vector<uint8_t> want(kBytes, 0xEE);
  std::vector<SingleCopy> copies;
  uint64_t at_src = 3, at_dst = 0, moved = 0;
  const std::initializer_list<uint64_t> sizes = {
      1, 128, 0, 4095, 16, kCopyGroupChunkBytes + 17, 2 * kCopyGroupChunkBytes, 77, 339};
  for (uint64_t bytes : sizes) {
    copies.push_back({d_dst->as<uint8_t>() + at_dst, d_src->as<uint8_t>() + at_src, bytes});
    std::copy_n(src.begin() + at_src, bytes, want.begin() + at_dst);
    moved += bytes;
    at_src += bytes + 5;
    at_dst += bytes + 9 + (bytes % 3);  // gaps between destinations, alignments varying
  }
  Result<CopyQueue> queue = CopyQueue::Create(0);
  ASSERT_OK(queue);
  Result<PreparedCopyGroup> group = PrepareCopyGroup(copies, queue->stream());
  ASSERT_OK(group);
  EXPECT_EQ(group->bytes(), moved);
  // 6 small copies, the 1 MiB + 17 one in two jobs, the 2 MiB one in two; the empty one dropped.
  EXPECT_EQ(group->jobs(), 10u);
  ASSERT_NO_FATAL_FAILURE(ExpectGroupLands(*group, *queue, d_dst->data(), want));
  ASSERT_OK(queue->Close());
}

TEST(GpuCopyTest, ACopyGroupNamesTheCopyWhoseMemoryTheDeviceCannotReach) {
  WS_SKIP_WITHOUT_GPU();
  Result<DeviceBuffer> d = DeviceBuffer::Allocate(256);
  ASSERT_OK(d);
  std::vector<uint8_t> host(64);
  const std::vector<SingleCopy> copies = {{d->as<uint8_t>() + 128, d->as<uint8_t>(), 64},
                                          {d->as<uint8_t>(), host.data(), 64}};
  Result<PreparedCopyGroup> group = PrepareCopyGroup(copies, nullptr);
  ASSERT_STATUS_IS(kInvalidArgument, group, "copy 1: copy_group: source pointer");
}

// More jobs than blocks: every block goes round its share several times.
TEST(GpuCopyTest, ACopyGroupWithMoreJobsThanBlocksMovesThemAll) {
  WS_SKIP_WITHOUT_GPU();
  constexpr uint64_t kCopies = 20000, kEach = 24;
  const std::vector<uint8_t> src = RandomBytes(kCopies * kEach, 9);
  Result<DeviceBuffer> d_src = Upload(src);
  ASSERT_OK(d_src);
  Result<DeviceBuffer> d_dst = DeviceBuffer::Allocate(kCopies * 2 * kEach);
  ASSERT_OK(d_dst);
  ASSERT_OK(MemsetDevice(d_dst->data(), 0xEE, kCopies * 2 * kEach));
  std::vector<SingleCopy> copies;
  std::vector<uint8_t> want(kCopies * 2 * kEach, 0xEE);
  for (uint64_t i = 0; i < kCopies; ++i) {  // copy i lands at slot (i * 7919) % kCopies, spread
    const uint64_t to = ((i * 7919) % kCopies) * 2 * kEach;
    copies.push_back({d_dst->as<uint8_t>() + to, d_src->as<uint8_t>() + i * kEach, kEach});
    std::copy_n(src.begin() + i * kEach, kEach, want.begin() + to);
  }
  Result<CopyQueue> queue = CopyQueue::Create(0);
  ASSERT_OK(queue);
  Result<PreparedCopyGroup> group = PrepareCopyGroup(copies, queue->stream());
  ASSERT_OK(group);
  ASSERT_EQ(group->jobs(), kCopies);
  ASSERT_NO_FATAL_FAILURE(ExpectGroupLands(*group, *queue, d_dst->data(), want));
  ASSERT_OK(queue->Close());
}

}  // namespace
}  // namespace weightsync::cuda
