#include "harness/byte_units.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace weightsync::bench {

Result<uint64_t> ParseBytes(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(text.c_str(), &end);
  if (text.empty() || end == text.c_str() || errno != 0 || !(x >= 0)) {
    return Status::InvalidArgument("'", text, "': expected a byte count such as 4096, 64MiB, 1G");
  }
  std::string suffix(end);
  double unit = 1;
  if (suffix.empty() || suffix == "B") {
    unit = 1;
  } else if (suffix == "K" || suffix == "KiB" || suffix == "KB") {
    unit = 1024.0;
  } else if (suffix == "M" || suffix == "MiB" || suffix == "MB") {
    unit = 1024.0 * 1024;
  } else if (suffix == "G" || suffix == "GiB" || suffix == "GB") {
    unit = 1024.0 * 1024 * 1024;
  } else {
    return Status::InvalidArgument("'", text, "': unknown unit '", suffix,
                                   "' (use K, M or G, powers of 1024)");
  }
  double bytes = x * unit;
  if (bytes > 1e15) return Status::InvalidArgument("'", text, "': too large");
  return static_cast<uint64_t>(std::llround(bytes));
}

std::string FormatBytes(uint64_t bytes) {
  char buf[32];
  if (bytes >= (1ull << 30)) {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / double(1ull << 30));
  } else if (bytes >= (1ull << 20)) {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", bytes / double(1ull << 20));
  } else if (bytes >= 1024) {
    std::snprintf(buf, sizeof(buf), "%.1f KiB", bytes / 1024.0);
  } else {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  }
  return buf;
}

}  // namespace weightsync::bench
