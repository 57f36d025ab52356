// Linked into the suites that start no thread (tests/plan, tests/wire: pure functions over
// bytes and layouts), which the TSan build leaves out (WS_BUILD_THREADLESS_TESTS=OFF,
// scripts/ci_sanitizers.sh): TSan reports only what runs on two threads, so building them there
// would cost compile time and prove nothing. This definition takes the place of the C library's
// pthread_create for the whole executable (libstdc++'s std::thread calls it), so a test added to
// those folders that starts a thread fails at once, saying why, instead of silently escaping
// TSan. Deliberately no includes beyond these: <pthread.h> would declare the real prototype.
#include <unistd.h>

#include <cstdlib>

extern "C" int pthread_create(void* /*thread*/, const void* /*attr*/, void* (*)(void*),
                              void* /*arg*/) {
  static const char kWhy[] =
      "this test suite is declared threadless (tests/CMakeLists.txt, WS_THREADLESS_SUITES): the "
      "TSan build leaves it out, so it must not start a thread; move the test to a suite that "
      "TSan runs\n";
  [[maybe_unused]] ssize_t n = ::write(2, kWhy, sizeof kWhy - 1);
  std::_Exit(86);
}
