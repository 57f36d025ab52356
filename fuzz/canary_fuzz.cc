// Deliberately broken fuzz target (NOT a test of weightsync): a heap-buffer-overflow behind a
// 4-byte comparison that libFuzzer finds within seconds. scripts/fuzz.sh --canary runs it and
// requires the run to fail with an AddressSanitizer report, proving that the fuzz build is
// instrumented and that the script turns a crash into a failure.
#include <cstddef>
#include <cstdint>
#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size >= 4 && std::memcmp(data, "WSYN", 4) == 0) {
    volatile uint8_t* buf = new uint8_t[size];
    buf[size] = 1;  // one past the end
    delete[] buf;
  }
  return 0;
}
