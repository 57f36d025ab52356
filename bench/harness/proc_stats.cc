#include "harness/proc_stats.h"

#include <fcntl.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "harness/byte_units.h"

namespace weightsync::bench {

uint64_t ResidentBytes() {
  int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[128];
  ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  // "size resident shared text lib data dt", in pages.
  char* p = buf;
  std::strtoull(p, &p, 10);
  uint64_t resident = std::strtoull(p, nullptr, 10);
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

namespace {
// The value of "Key: value" in a /proc file, or "".
std::string ProcField(const char* path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0 && line.size() > key.size() &&
        (line[key.size()] == ':' || line[key.size()] == '\t' || line[key.size()] == ' ')) {
      size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      size_t start = line.find_first_not_of(" \t", colon + 1);
      return start == std::string::npos ? "" : line.substr(start);
    }
  }
  return "";
}
}  // namespace

uint64_t MemAvailableBytes() {
  std::string v = ProcField("/proc/meminfo", "MemAvailable");  // "22871232 kB"
  return v.empty() ? 0 : std::strtoull(v.c_str(), nullptr, 10) * 1024;
}

double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double load = -1;
  if (!(in >> load)) return -1;
  return load;
}

std::string MachineDescription() {
  std::ostringstream os;
  std::string cpu = ProcField("/proc/cpuinfo", "model name");
  os << (cpu.empty() ? "unknown CPU" : cpu) << ", " << std::thread::hardware_concurrency()
     << " cores";
  std::string total = ProcField("/proc/meminfo", "MemTotal");
  if (!total.empty()) {
    os << ", " << FormatBytes(std::strtoull(total.c_str(), nullptr, 10) * 1024) << " RAM";
  }
  utsname u{};
  if (::uname(&u) == 0) os << ", " << u.sysname << " " << u.release;
#if defined(__OPTIMIZE__)
  os << ", optimized build";
#else
  os << ", UNOPTIMIZED build (numbers are not representative)";
#endif
  return os.str();
}

}  // namespace weightsync::bench
