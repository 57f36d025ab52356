// Shared test helpers: status assertions (testing/status_matchers.h), log capture, a deterministic
// synthetic model, poison fill, unique endpoints and child processes.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "testing/status_matchers.h"
#include "util/logging.h"
#include "weightsync/weightsync.h"

namespace weightsync::testing {

// Which sanitizer this build runs under (GCC defines __SANITIZE_*__, clang has __has_feature).
#if defined(__has_feature)
#define WS_TEST_HAS_FEATURE(x) __has_feature(x)
#else
#define WS_TEST_HAS_FEATURE(x) 0
#endif
// kUnderThreadSanitizer: TSan sees the publisher's own socket send of memory the trainer
// writes (a revoked read, by design) as a race, and its slow path on every such write takes
// minutes.
#if defined(__SANITIZE_THREAD__) || WS_TEST_HAS_FEATURE(thread_sanitizer)
inline constexpr bool kUnderThreadSanitizer = true;
#else
inline constexpr bool kUnderThreadSanitizer = false;
#endif
#if defined(__SANITIZE_ADDRESS__) || WS_TEST_HAS_FEATURE(address_sanitizer)
inline constexpr bool kUnderAddressSanitizer = true;
#else
inline constexpr bool kUnderAddressSanitizer = false;
#endif

// Sanitizer builds run 5–15× slower (and abort on a refused mmap by design): deadlines that a
// test must meet scale with it, and tests of address-space limits skip.
inline constexpr bool kUnderSanitizer = kUnderThreadSanitizer || kUnderAddressSanitizer;

// A unique endpoint name per test (pid + counter), in a per-test-run socket dir.
std::string UniqueEndpoint(const std::string& stem);

// Captures log lines while alive.
class LogCapture {
 public:
  LogCapture();
  ~LogCapture();
  std::vector<std::string> Lines() const;  // "W component: text"
  bool Contains(const std::string& needle) const;

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

// A synthetic model: `count` tensors of assorted dtypes and shapes whose bytes are a function of
// (tensor index, step) only, so two processes agree on every byte without talking.
class SyntheticModel {
 public:
  // `elements_per_tensor` scales the tensors; dtypes cycle through a fixed list.
  SyntheticModel(int count, int64_t elements_per_tensor);
  // Fills the model's own storage for `step`.
  void Fill(int64_t step);
  // The bytes tensor i holds at `step` (pure function).
  static void Pattern(int tensor, int64_t step, uint8_t* out, uint64_t bytes);
  std::vector<NamedTensor> Tensors();
  // Fresh destination storage of the same manifest, poison-filled (0xFF).
  static std::vector<std::vector<uint8_t>> PoisonedStorage(const std::vector<NamedTensor>& like);
  static std::vector<NamedTensor> Views(const std::vector<NamedTensor>& like,
                                        std::vector<std::vector<uint8_t>>& storage);
  // True if every tensor in `views` holds Pattern(i, step).
  static bool Holds(const std::vector<NamedTensor>& views, int64_t step, std::string* why);
  uint64_t total_bytes() const;

 private:
  std::vector<TensorSpec> specs_;
  std::vector<std::vector<uint8_t>> storage_;
};

// A subscriber created with `options`, `destinations` registered. A failure of either fails the
// test (and a failed Create() throws from here, which gtest reports).
std::unique_ptr<Subscriber> NewSubscriber(const SubscriberOptions& options,
                                          const std::vector<NamedTensor>& destinations);

// Waits (bounded) until the ledger's live counts equal `expected`: a publisher notices a departed
// subscriber on its own thread, so its side of the cleanup lands a few ms later.
bool LedgerSettlesTo(const LedgerSnapshot& expected, LedgerSnapshot* last, int timeout_ms = 3000);

// Polls `holds` every 5 ms until it is true (true) or `timeout_ms` passed (false): for what
// another thread or process does on its own (a publisher's session reading a report).
bool Eventually(const std::function<bool()>& holds, int timeout_ms = 5000);

// A digest per tensor, to compare "unchanged bit for bit".
std::vector<uint64_t> Digests(const std::vector<NamedTensor>& views);

// A child process running tests' helper binaries, talking line by line over pipes.
class ChildProcess {
 public:
  // argv[0] is a path; env entries "K=V" are added to the environment.
  static ChildProcess Spawn(const std::vector<std::string>& argv,
                            const std::vector<std::string>& env = {});
  ChildProcess() = default;
  ChildProcess(ChildProcess&& o) noexcept;
  ChildProcess& operator=(ChildProcess&& o) noexcept;
  ~ChildProcess();
  // Sends a line and reads one reply line (timeout in ms); "" on timeout/EOF.
  std::string Command(const std::string& line, int timeout_ms = 20000);
  std::string ReadLine(int timeout_ms = 20000);
  void Signal(int sig);
  // SIGSTOP and wait until the kernel reports the child stopped.
  bool Stop();
  int Wait();  // exit status as from waitpid
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
  std::string buffer_;
};

// Path of a helper binary built next to the test executables.
std::string HelperPath(const std::string& name);

}  // namespace weightsync::testing
