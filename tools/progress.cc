#include "progress.h"

#include <unistd.h>

#include <cstring>

#include "harness/alloc_counter.h"

namespace weightsync::tools {
namespace {

constexpr auto kShowAfter = std::chrono::milliseconds(200);
constexpr auto kTick = std::chrono::milliseconds(100);
constexpr int kWidth = 30;

// Appends text or a non-negative integer to a fixed buffer (no printf: it may allocate).
struct Line {
  char buf[160];
  size_t n = 0;
  void Add(const char* s) {
    for (; *s && n < sizeof(buf) - 1; ++s) buf[n++] = *s;
  }
  void Add(char c) {
    if (n < sizeof(buf) - 1) buf[n++] = c;
  }
  void Num(uint64_t v) {
    char tmp[24];
    int k = 0;
    do {
      tmp[k++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v && k < 24);
    while (k) Add(tmp[--k]);
  }
  // Tenths: 12.3
  void Tenths(uint64_t tenths) {
    Num(tenths / 10);
    Add('.');
    Add(static_cast<char>('0' + tenths % 10));
  }
};

void WriteAll(const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(STDERR_FILENO, data, n);
    if (w <= 0) return;  // a closed stderr only loses the bar
    data += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

ProgressBar::ProgressBar(bool enabled) : enabled_(enabled) {
  if (enabled_) thread_ = std::thread([this] { Loop(); });
}

ProgressBar::~ProgressBar() {
  if (!enabled_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ProgressBar::Begin(int64_t step, uint64_t bytes, double expected_seconds) {
  if (!enabled_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_ = true;
    step_ = step;
    bytes_ = bytes;
    expected_ = expected_seconds;
    start_ = std::chrono::steady_clock::now();
  }
  cv_.notify_all();
}

void ProgressBar::End() {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  active_ = false;
  if (drawn_) {
    Line l;
    l.Add('\r');
    for (int i = 0; i < 100; ++i) l.Add(' ');
    l.Add('\r');
    WriteAll(l.buf, l.n);
    drawn_ = false;
  }
}

void ProgressBar::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (!active_) {
      cv_.wait(lock, [&] { return stop_ || active_; });
      continue;
    }
    cv_.wait_for(lock, kTick);
    if (stop_ || !active_) continue;
    auto elapsed = std::chrono::steady_clock::now() - start_;
    if (elapsed >= kShowAfter) Draw(elapsed);
    thread_allocations_.store(bench::ThreadAllocations().allocations);
  }
}

void ProgressBar::Draw(std::chrono::steady_clock::duration elapsed) {
  const uint64_t ms =
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count());
  Line l;
  l.Add("\r  step ");
  l.Num(static_cast<uint64_t>(step_));
  l.Add(" [");
  if (expected_ > 0) {
    // Fraction of the expected time, capped below 100% until the update really ends.
    uint64_t expected_ms = static_cast<uint64_t>(expected_ * 1000) + 1;
    uint64_t permille = ms * 1000 / expected_ms;
    if (permille > 990) permille = 990;
    int filled = static_cast<int>(permille * kWidth / 1000);
    for (int i = 0; i < kWidth; ++i) l.Add(i < filled ? '#' : '.');
    l.Add("] ~");
    l.Num(permille / 10);
    l.Add("% of expected ");
    l.Tenths(expected_ms / 100);
    l.Add(" s, ");
  } else {
    int marker = static_cast<int>((ms / 100) % (2 * kWidth - 2));
    if (marker >= kWidth) marker = 2 * kWidth - 2 - marker;
    for (int i = 0; i < kWidth; ++i) l.Add(i == marker ? '#' : '.');
    l.Add("] preparing + first copy, ");
  }
  l.Tenths(ms / 100);
  l.Add(" s elapsed, ");
  l.Num(bytes_ >> 20);
  l.Add(" MiB   ");
  WriteAll(l.buf, l.n);
  drawn_ = true;
}

}  // namespace weightsync::tools
