// Sanitizer canary (deliberately broken, NOT a weightsync test): a leak. scripts/ci_sanitizers.sh
// REQUIRES that the address,undefined build reports "LeakSanitizer: detected memory leaks", which
// proves leak checking is on for the test suite too (same ASAN_OPTIONS).
#include <cstdio>
#include <cstdlib>

void* volatile g_sink;

int main() {
  g_sink = std::malloc(4096);
  g_sink = nullptr;  // the only pointer to the block is gone
  std::printf("leaked 4096 bytes\n");
  return 0;
}
