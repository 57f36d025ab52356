// Sanitizer canary (deliberately broken, NOT a weightsync test): a data race on a plain int.
// scripts/ci_sanitizers.sh REQUIRES that the thread build fails on it with "ThreadSanitizer: data
// race" and a non-zero exit status (TSan's exitcode), which proves the TSan job can fail.
#include <cstdio>
#include <thread>

int g_counter = 0;

int main() {
  std::thread a([] {
    for (int i = 0; i < 1000; ++i) ++g_counter;
  });
  std::thread b([] {
    for (int i = 0; i < 1000; ++i) ++g_counter;
  });
  a.join();
  b.join();
  std::printf("counter = %d\n", g_counter);
  return 0;
}
