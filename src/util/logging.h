// Minimal leveled logging: WS_LOG(WARN, "shm") << "cleanup: " << status;
// Lines go to stderr ("weightsync W shm: ...") at or above $WEIGHTSYNC_LOG_LEVEL (default INFO),
// and to an optional sink that tests install to assert what was logged.
#pragma once

#include <functional>
#include <sstream>
#include <string>
#include <string_view>

namespace weightsync::util {

enum class LogLevel { DEBUG = 0, INFO = 1, WARN = 2, ERROR = 3 };

using LogSink = std::function<void(LogLevel, std::string_view component, std::string_view line)>;
// Installs (or with nullptr removes) a process-wide sink; returns the previous one.
LogSink SetLogSink(LogSink sink);
bool LogEnabled(LogLevel level);
void EmitLog(LogLevel level, std::string_view component, const std::string& line);

class LogLine {
 public:
  LogLine(LogLevel level, std::string_view component) : level_(level), component_(component) {}
  ~LogLine() { EmitLog(level_, component_, stream_.str()); }
  template <typename T>
  LogLine& operator<<(const T& v) {
    stream_ << v;
    return *this;
  }

 private:
  LogLevel level_;
  std::string_view component_;
  std::ostringstream stream_;
};

struct LogVoidify {
  void operator&(const LogLine&) {}
};

}  // namespace weightsync::util

// `&` binds looser than `<<`, so the whole streamed line is built before Voidify swallows it.
#define WS_LOG(level, component)                                       \
  !::weightsync::util::LogEnabled(::weightsync::util::LogLevel::level) \
      ? (void)0                                                        \
      : ::weightsync::util::LogVoidify() &                             \
            ::weightsync::util::LogLine(::weightsync::util::LogLevel::level, component)
