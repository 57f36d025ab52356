// Sanitizer canary (deliberately broken, NOT a weightsync test): a heap-buffer-overflow.
// scripts/ci_sanitizers.sh builds it in the address,undefined build and REQUIRES that it fails
// with "AddressSanitizer: heap-buffer-overflow"; if it ever passes, the ASan job proves nothing.
#include <cstddef>
#include <cstdio>

namespace {
int* Allocate(std::size_t n) { return new int[n](); }
}  // namespace

int main() {
  // The allocator and the index go through volatiles so the compiler can neither prove nor remove
  // the bug, and UBSan's object-size check (which would report it first) cannot see the size.
  int* (*volatile allocate)(std::size_t) = &Allocate;
  volatile int past_end = 4;
  int* buf = allocate(4);
  std::printf("buf[4] = %d\n", buf[past_end]);
  delete[] buf;
  return 0;
}
