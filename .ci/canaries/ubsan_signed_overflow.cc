// Sanitizer canary (deliberately broken, NOT a weightsync test): signed integer overflow.
// scripts/ci_sanitizers.sh REQUIRES that the address,undefined build fails on it with "runtime
// error: signed integer overflow" and a non-zero exit status, which proves UBSan is on AND built
// with -fno-sanitize-recover (otherwise it prints and carries on, and tests would still pass).
#include <climits>
#include <cstdio>

int main() {
  volatile int big = INT_MAX;
  int sum = big + 1;
  std::printf("INT_MAX + 1 = %d\n", sum);
  return 0;
}
