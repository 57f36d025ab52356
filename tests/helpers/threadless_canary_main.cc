// The threadless guard's canary (ctest ThreadlessGuard.AThreadInAThreadlessSuiteIsRefused):
// linked with tests/testing/threadless/guard.cc like the threadless suites, it starts a thread,
// which must end the process with the guard's message (exit 86) before the thread runs.
#include <cstdio>
#include <thread>

int main() {
  std::thread t([] { std::puts("the thread ran: the threadless guard did not stop it"); });
  t.join();
  return 0;
}
