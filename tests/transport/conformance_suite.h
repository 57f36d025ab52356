// The transport conformance suite: what every data path of the path table
// (src/transport/path_table.h) must do, asserted the same way for each. A row is a path and an
// update mode (staged, in place); it picks the path the way a user does — the publisher's tensors
// (host or CUDA: its store), the destinations (host memory or a CUDA device) and the endpoint
// (local:// or an authenticated tcp://) — with the publisher in a child process
// (testing/publisher_process.h) and the subscriber in this one. Every row:
//  - delivers every byte into poisoned destinations, bit-exact, step after step, on one handle
//    prepared once, whose transport_name() (read from the prepare log line) is the row's path;
//  - catches a flipped bit in what it received (fail point subscriber.flip_received), naming the
//    step and the tensor, commits nothing (staged) or marks the weights invalid (in place), and
//    the next update delivers (RELIABILITY.md N1, N2, N4);
//  - reports a publisher killed in the middle of a step as a typed error within the deadline, with
//    N1 as above and the ledger back at its baseline (N3), and the next update, against a new
//    publisher on the same endpoint, prepares the same path again and delivers (N4);
//  - prepares again after every sleep, and each sleep returns the ledger (and, for CUDA
//    destinations, the device's memory) to where it was.
// Path-specific behaviour (pinning, conversions, communicators, ...) is tested next to the path.
//
// One suite, two instantiations: the host rows run everywhere (tests/transport/
// conformance_test.cc); the GPU rows carry the gpu label and skip without the devices (and, for
// nccl, the library) they need (tests/gpu/conformance_test.cc). Include this header from one
// source file per test binary.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <chrono>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "cuda/nccl_link.h"
#include "cuda/vmm.h"
#include "gpu/gpu_test_util.h"
#include "testing/publisher_process.h"
#include "testing/test_util.h"
#include "util/fail_point.h"

namespace weightsync::conformance {

using testing::SyntheticModel;
using util::FailAction;
using util::FailPoints;
using Clock = std::chrono::steady_clock;

struct PathRow {
  const char* path;        // the path table's name: the handle's transport_name()
  bool gpu_store;          // the publisher registers CUDA tensors (cuda:0): a GPU store
  bool cuda_destinations;  // the destinations are CUDA tensors (cuda:1 when there is one)
  bool tcp;                // tcp://127.0.0.1, authenticated; else local://
  UpdateMode mode;
  // A zero-copy GPU publisher (PublisherOptions::zero_copy) of tensors in cudaMalloc memory ("1")
  // or in cuMem chunks as PyTorch's expandable segments ("vmm"): WS_TEST_ZERO_COPY's value.
  const char* zero_copy = nullptr;
  // A ring publisher (PublisherOptions::ring_buckets): "BUCKETS:BYTES", WS_TEST_RING's value.
  const char* ring = nullptr;

  bool staged() const { return mode == UpdateMode::kStaged; }
  bool nccl() const { return tcp && gpu_store; }
  int gpus() const { return nccl() ? 2 : gpu_store || cuda_destinations ? 1 : 0; }
};

inline std::vector<PathRow> InBothModes(std::vector<PathRow> paths) {
  std::vector<PathRow> rows;
  for (PathRow row : paths) {
    for (UpdateMode mode : {UpdateMode::kStaged, UpdateMode::kInPlace}) {
      row.mode = mode;
      rows.push_back(row);
    }
  }
  return rows;
}

inline std::vector<PathRow> HostRows() {
  return InBothModes({{"shm", false, false, false, {}},
                      {"shm-ring", false, false, false, {}, nullptr, "2:65536"},
                      {"tcp", false, false, true, {}},
                      // A ring publisher over tcp: the session sends from its tensors.
                      {"tcp", false, false, true, {}, nullptr, "2:65536"}});
}

inline std::vector<PathRow> GpuRows() {
  return InBothModes({{"host-to-gpu", false, true, false, {}},
                      {"gpu-to-host", true, false, false, {}},
                      {"cuda-ipc", true, true, false, {}},
                      {"cuda-ipc-zero-copy", true, true, false, {}, "1"},
                      {"cuda-ipc-zero-copy", true, true, false, {}, "vmm"},
                      // 128 KiB buckets: the 2 MB model is 16 buckets through a ring of 2.
                      {"cuda-ipc-ring", true, true, false, {}, nullptr, "2:131072"},
                      {"host-to-gpu-ring", false, true, false, {}, nullptr, "2:131072"},
                      // A host store over tcp into the GPU, through the pinned host mirror.
                      {"tcp-to-gpu", false, true, true, {}},
                      {"tcp-to-gpu", false, true, true, {}, nullptr, "2:131072"},
                      {"gpu-to-host-ring", true, false, false, {}, nullptr, "2:131072"},
                      {"nccl", true, true, true, {}},
                      // From the publisher's own tensors, nothing exported or staged.
                      {"nccl-zero-copy", true, true, true, {}, "1"},
                      {"nccl-zero-copy", true, true, true, {}, "vmm"},
                      {"nccl-ring", true, true, true, {}, nullptr, "2:131072"}});
}

inline void PrintTo(const PathRow& row, std::ostream* os) {
  *os << row.path << (row.staged() ? ", staged" : ", in place")
      << (row.ring != nullptr && std::string(row.path).find("ring") == std::string::npos
              ? ", ring publisher"
              : "")
      << (row.zero_copy != nullptr && std::string(row.zero_copy) == "vmm" ? ", cuMem" : "");
}

// "host_to_gpu_in_place"
inline std::string RowName(const ::testing::TestParamInfo<PathRow>& info) {
  std::string name = std::string(info.param.path) + (info.param.staged() ? "_staged" : "_in_place");
  if (info.param.zero_copy != nullptr && std::string(info.param.zero_copy) == "vmm")
    name += "_cumem";
  if (info.param.ring != nullptr && name.find("ring") == std::string::npos)
    name += "_ring_publisher";
  for (char& c : name) c = c == '-' ? '_' : c;
  return name;
}

// The path of every handle prepared while `log` listened, in order, from the handle's log line
// "prepared <transport_name> handle for <peer>: ..." (src/transport/transport.cc).
inline std::vector<std::string> PreparedPaths(const testing::LogCapture& log) {
  const std::string mark = "subscriber: prepared ", end_mark = " handle for ";
  std::vector<std::string> paths;
  for (const std::string& line : log.Lines()) {
    const size_t at = line.find(mark);
    const size_t end = at == std::string::npos ? at : line.find(end_mark, at + mark.size());
    if (end != std::string::npos) {
      paths.push_back(line.substr(at + mark.size(), end - at - mark.size()));
    }
  }
  return paths;
}

constexpr int kTensors = 24;          // every dtype of the synthetic model in each of its shapes
constexpr int64_t kElements = 20000;  // about 2 MB a step
// About 40 MB a step: more than socket buffers hold, so a publisher killed mid-step has not
// handed the whole step to the kernel (tcp) or to NCCL's buffers.
constexpr int64_t kLargeElements = 600000;
constexpr char kToken[] = "conformance token, 32 bytes long";
constexpr auto kTimeout = std::chrono::milliseconds(testing::kUnderSanitizer ? 10000 : 5000);
// Past the deadline: an aborted communicator (nccl) or a slow sanitizer build.
constexpr auto kSlack = std::chrono::milliseconds(3000);

class Conformance : public ::testing::TestWithParam<PathRow> {
 protected:
  // Before NCCL reads its environment (the first communicator): never NVLink multicast.
  static void SetUpTestSuite() { ::setenv("NCCL_NVLS_ENABLE", "0", 1); }

  void SetUp() override {
    const PathRow& row = GetParam();
    if (row.gpus() > 0) WS_SKIP_WITHOUT_GPU();
    if (cuda::DeviceCount() < row.gpus()) {
      GTEST_SKIP() << row.path << " needs " << row.gpus() << " CUDA devices, found "
                   << cuda::DeviceCount();
    }
    if (row.nccl()) {
      if (Status s = cuda::nccl::NcclAvailable(); !s.ok()) GTEST_SKIP() << "needs NCCL: " << s;
    }
    FailPoints::DisarmAll();
  }
  void TearDown() override { FailPoints::DisarmAll(); }

  // Poisoned destinations for a `tensors` × `elements` synthetic model and its publisher, running;
  // then the ledger's baseline. Call through ASSERT_NO_FATAL_FAILURE.
  void Start(int tensors, int64_t elements) {
    const PathRow& row = GetParam();
    model_ = std::make_unique<SyntheticModel>(tensors, elements);
    like_ = model_->Tensors();
    if (row.cuda_destinations) {
      device_ = cuda::DeviceCount() > 1 ? 1 : 0;
      ASSERT_OK(cuda::SetDevice(device_));
      ASSERT_OK_AND_ASSIGN(dst_, cuda::testing::PoisonedDestinations(like_, device_, &buffers_));
    } else {
      storage_ = SyntheticModel::PoisonedStorage(like_);
      dst_ = SyntheticModel::Views(like_, storage_);
    }
    std::vector<std::string> args = {std::to_string(tensors), std::to_string(elements)};
    if (row.gpu_store) args.push_back("0");  // the publisher's device
    std::vector<std::string> env = {"NCCL_NVLS_ENABLE=0"};
    if (row.tcp) env.push_back(std::string("WEIGHTSYNC_TOKEN=") + kToken);
    if (row.zero_copy != nullptr) env.push_back(std::string("WS_TEST_ZERO_COPY=") + row.zero_copy);
    if (row.ring != nullptr) env.push_back(std::string("WS_TEST_RING=") + row.ring);
    publisher_ = std::make_unique<testing::PublisherProcess>(
        row.gpu_store ? "gpu_publisher" : "publisher", std::move(args), std::move(env));
    ASSERT_NO_FATAL_FAILURE(publisher_->Start(row.tcp ? std::string("tcp://127.0.0.1:0")
                                                      : testing::UniqueEndpoint("conformance")));
    baseline_ = ReadLedger();
  }

  void Publish(int64_t step) { ASSERT_NO_FATAL_FAILURE(publisher_->Publish(step)); }

  std::unique_ptr<Subscriber> Connect() {
    SubscriberOptions o;
    o.endpoint = publisher_->endpoint();
    if (GetParam().tcp) o.token = kToken;
    o.mode = GetParam().mode;
    o.verify = true;
    o.timeout = kTimeout;
    return testing::NewSubscriber(o, dst_);
  }

  // "" when every destination holds the model at `step`, else what differs.
  std::string Holds(int64_t step) {
    std::string why;
    const bool holds = GetParam().cuda_destinations
                           ? cuda::testing::DestinationsHold(dst_, like_, step, &why)
                           : SyntheticModel::Holds(dst_, step, &why);
    return holds ? "" : why;
  }

  // RELIABILITY.md N1 after a failed update to step 2 (`failed`): staged, step 1 is still
  // committed, valid and intact; in place, the weights are marked invalid and the error says so.
  void ExpectStepOneKept(Subscriber& sub, const Status& failed) {
    EXPECT_EQ(sub.committed_step(), 1);
    if (GetParam().staged()) {
      EXPECT_TRUE(sub.weights_valid());
      EXPECT_EQ(Holds(1), "") << "a staged update that failed changed the weights: " << failed;
    } else {
      EXPECT_FALSE(sub.weights_valid());
      EXPECT_TRUE(testing::IsError(failed, failed.code(), {"marked invalid"}));
    }
  }

  void ExpectLedgerAtBaseline(const std::string& when) {
    LedgerSnapshot now;
    EXPECT_TRUE(testing::LedgerSettlesTo(baseline_, &now))
        << when << ": ledger " << now.ToString() << " vs baseline " << baseline_.ToString();
  }

  int device_ = 0;  // of the CUDA destinations
  std::unique_ptr<SyntheticModel> model_;
  std::vector<NamedTensor> like_, dst_;
  std::vector<std::vector<uint8_t>> storage_;  // host destinations
  std::vector<cuda::DeviceBuffer> buffers_;    // CUDA destinations
  std::unique_ptr<testing::PublisherProcess> publisher_;
  LedgerSnapshot baseline_;
};

TEST_P(Conformance, PoisonedDestinationsReceiveEveryByteOnOnePreparedHandle) {
  ASSERT_NO_FATAL_FAILURE(Start(kTensors, kElements));
  testing::LogCapture log;
  auto sub = Connect();
  for (int64_t step = 1; step <= 5; ++step) {
    Publish(step);
    ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub->Update());
    EXPECT_EQ(stats.step, step);
    EXPECT_TRUE(stats.verified);
    EXPECT_EQ(stats.bytes, model_->total_bytes());
    EXPECT_EQ(stats.handle_created, step == 1) << "step " << step;
    EXPECT_EQ(stats.prepare_count, 1u) << "step " << step;
    EXPECT_EQ(stats.path, GetParam().path) << "step " << step;  // what the caller is told
    ASSERT_EQ(Holds(step), "") << "step " << step;
  }
  EXPECT_EQ(PreparedPaths(log), std::vector<std::string>{GetParam().path});
}

TEST_P(Conformance, FlippedBitIsCaughtNamingTheTensorAndNothingIsCommitted) {
  ASSERT_NO_FATAL_FAILURE(Start(kTensors, kElements));
  auto sub = Connect();
  Publish(1);
  ASSERT_OK(sub->Update());
  Publish(2);
  FailPoints::Arm("subscriber.flip_received", FailAction::kFlip, 0, 1);
  auto stats = sub->Update();
  ASSERT_EQ(FailPoints::Hits("subscriber.flip_received"), 1) << "bit flip never injected";
  ASSERT_STATUS_IS(kCorruption, stats, "step 2", "tensor 'layers.", "nothing committed");
  ExpectStepOneKept(*sub, stats.status());
  // The failure destroyed the handle; the next update prepares one and delivers.
  ASSERT_OK_AND_ASSIGN(UpdateStats again, sub->Update());
  EXPECT_EQ(again.step, 2);
  EXPECT_TRUE(again.handle_created);
  EXPECT_TRUE(sub->weights_valid());
  EXPECT_EQ(Holds(2), "");
}

TEST_P(Conformance, PublisherKilledMidStepIsATypedErrorAndTheNextUpdateRecovers) {
  ASSERT_NO_FATAL_FAILURE(Start(kTensors, kLargeElements));
  testing::LogCapture log;
  Publish(1);
  auto sub = Connect();
  ASSERT_OK(sub->Update());
  Publish(2);
  // The subscriber holds just before it moves step 2 — the publisher has pinned it and, over tcp
  // or nccl, begun to send it — and the publisher is killed meanwhile.
  FailPoints::Arm("subscriber.before_copy", FailAction::kSleep, 1000, 1);
  std::thread killer([&] {
    if (!testing::WaitForFailPointHits("subscriber.before_copy")) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    publisher_->process().Signal(SIGKILL);
  });
  const auto t0 = Clock::now();
  auto stats = sub->Update();
  const auto elapsed = Clock::now() - t0;
  killer.join();
  ASSERT_EQ(FailPoints::Hits("subscriber.before_copy"), 1) << "the update was never paused";
  const int status = publisher_->process().Wait();
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "publisher not killed";
  // The connection closes under the copy: PeerLost. A collective may reach its deadline first.
  ASSERT_FALSE(stats.ok()) << "an update whose publisher died mid-step reported success";
  const StatusCode code = GetParam().nccl() && stats.status().code() == StatusCode::kTimeout
                              ? StatusCode::kTimeout
                              : StatusCode::kPeerLost;
  EXPECT_TRUE(testing::IsError(stats.status(), code, {"step 2"}));
  EXPECT_LT(elapsed, kTimeout + kSlack) << stats.status();
  ExpectStepOneKept(*sub, stats.status());
  ExpectLedgerAtBaseline("after the failed update");

  // A new publisher on the same endpoint: the next update prepares the same path and delivers.
  ASSERT_NO_FATAL_FAILURE(publisher_->Start(publisher_->endpoint()));
  Publish(3);
  ASSERT_OK_AND_ASSIGN(UpdateStats again, sub->Update());
  EXPECT_EQ(again.step, 3);
  EXPECT_TRUE(again.handle_created);
  EXPECT_EQ(again.prepare_count, 2u);
  EXPECT_TRUE(sub->weights_valid());
  EXPECT_EQ(Holds(3), "");
  const std::string path = GetParam().path;
  EXPECT_EQ(PreparedPaths(log), (std::vector<std::string>{path, path}));
}

TEST_P(Conformance, EverySleepReturnsTheLedgerToBaselineAndTheNextUpdatePreparesAgain) {
  ASSERT_NO_FATAL_FAILURE(Start(kTensors, kElements));
  constexpr int64_t kCycles = 10;
  auto sub = Connect();
  size_t free_after_first = 0, free_after_last = 0, total = 0;
  for (int64_t cycle = 1; cycle <= kCycles; ++cycle) {
    Publish(cycle);
    ASSERT_OK_AND_ASSIGN(UpdateStats stats, sub->Update());
    EXPECT_TRUE(stats.handle_created);
    EXPECT_EQ(stats.prepare_count, static_cast<uint64_t>(cycle));
    EXPECT_EQ(Holds(cycle), "") << "cycle " << cycle;
    EXPECT_GT(ReadLedger().handles, baseline_.handles) << "no prepared handle while awake";
    ASSERT_OK(sub->Sleep());
    ExpectLedgerAtBaseline("after sleep " + std::to_string(cycle));
    // After the first cycle: whatever CUDA sets up once per process (modules, pools) exists.
    if (GetParam().cuda_destinations && (cycle == 1 || cycle == kCycles)) {
      ASSERT_OK(cuda::MemInfo(cycle == 1 ? &free_after_first : &free_after_last, &total));
    }
  }
  EXPECT_EQ(free_after_first, free_after_last) << "device memory not returned by Sleep()";
}

}  // namespace weightsync::conformance
