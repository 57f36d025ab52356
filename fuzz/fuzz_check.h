// Property checks for the fuzz targets. A violated property is a finding just like a sanitizer
// report: print what was violated and abort, so libFuzzer saves the input as a crash artifact.
#pragma once

#include <cstdio>
#include <cstdlib>

#define WS_FUZZ_CHECK(cond, ...)                                                                \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      std::fprintf(stderr, "%s:%d: fuzz property violated: %s\n  ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                        \
      std::fprintf(stderr, "\n");                                                               \
      std::abort();                                                                             \
    }                                                                                           \
  } while (0)
