// A refused thread (address-space or thread limit) is a Status, never an exception escaping the
// library; the copy pool degrades to fewer threads and still does all the work.
#include "util/thread.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>

#include "testing/test_util.h"
#include "util/address_space.h"
#include "util/worker_pool.h"

namespace weightsync::util {
namespace {

// Runs body in a child whose address space is capped just above what it uses now, so the next
// thread stack (8 MiB) cannot be mapped. Returns the child's exit code.
template <typename Body>
int RunUnderTightAddressSpaceLimit(Body body) {
  pid_t pid = ::fork();
  if (pid == 0) {
    const unsigned long long cap = AddressSpaceInUse() + (2ull << 20);
    rlimit limit{cap, cap};
    if (::setrlimit(RLIMIT_AS, &limit) != 0) ::_exit(90);
    ::_exit(body());
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(StartThread, RefusedThreadIsResourceExhaustedNamingTheThread) {
  if (weightsync::testing::kUnderSanitizer)
    GTEST_SKIP() << "sanitizer runtimes abort on a refused mmap by design";
  int code = RunUnderTightAddressSpaceLimit([] {
    std::thread t;
    Status s = StartThread(&t, "probe", [] {});
    if (s.ok()) {
      t.join();
      return 1;  // the limit did not bite: the test proves nothing
    }
    if (s.code() != StatusCode::kResourceExhausted) return 2;
    if (s.message().find("probe") == std::string::npos) return 3;
    return 0;
  });
  EXPECT_EQ(code, 0) << "1: thread started despite the limit, 2: wrong code, 3: message does not "
                        "name the thread, 90: setrlimit failed";
}

TEST(StartThread, StartedThreadRuns) {
  std::thread t;
  std::atomic<int> ran{0};
  ASSERT_TRUE(StartThread(&t, "probe", [&] { ran = 1; }).ok());
  t.join();
  EXPECT_EQ(ran.load(), 1);
}

TEST(WorkerPool, RefusedWorkersDegradeToTheCallingThreadAndStillRunEveryIndex) {
  if (weightsync::testing::kUnderSanitizer)
    GTEST_SKIP() << "sanitizer runtimes abort on a refused mmap by design";
  int code = RunUnderTightAddressSpaceLimit([] {
    WorkerPool pool(4);
    if (pool.size() != 1) return 1;
    static std::atomic<int> sum{0};
    pool.Run(
        100, [](void*, uint32_t i) { sum += static_cast<int>(i); }, nullptr);
    return sum.load() == 4950 ? 0 : 2;
  });
  EXPECT_EQ(code, 0) << "1: pool started workers despite the limit, 2: not every index ran";
}

}  // namespace
// Each task knows which of the pool's threads runs it (per-thread scratch sized up front, e.g. the
// host store's delta encoders): a slot below size(), the caller's 0, and a caller that is itself a
// worker of another pool gets its own slot back afterwards.
TEST(WorkerPool, EachTaskSeesTheSlotOfTheThreadRunningIt) {
  WorkerPool outer(2), inner(3);
  struct Seen {
    WorkerPool* inner;
    std::atomic<uint32_t> bad{0};
    std::atomic<uint32_t> restored_wrong{0};
  } seen{&inner};
  outer.Run(
      64,
      [](void* context, uint32_t index) {
        auto* s = static_cast<Seen*>(context);
        const uint32_t mine = WorkerPool::Slot();
        if (mine >= 2) s->bad.fetch_add(1);
        // One nested job only: a pool has one caller at a time (worker_pool.h), and outer tasks
        // run on two threads at once.
        if (index != 0) return;
        s->inner->Run(
            8,
            [](void* c, uint32_t) {
              if (WorkerPool::Slot() >= 3) static_cast<Seen*>(c)->bad.fetch_add(1);
            },
            s);
        if (WorkerPool::Slot() != mine) s->restored_wrong.fetch_add(1);
      },
      &seen);
  EXPECT_EQ(seen.bad.load(), 0u);
  EXPECT_EQ(seen.restored_wrong.load(), 0u);
  EXPECT_EQ(WorkerPool::Slot(), 0u);
}

}  // namespace weightsync::util
