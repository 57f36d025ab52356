#include "util/logging.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace weightsync::util {
namespace {

std::mutex& SinkMutex() {
  static std::mutex mu;
  return mu;
}
LogSink& Sink() {
  static LogSink sink;
  return sink;
}
bool& HasSink() {
  static bool has = false;
  return has;
}

LogLevel ThresholdFromEnv() {
  const char* v = std::getenv("WEIGHTSYNC_LOG_LEVEL");
  if (v == nullptr) return LogLevel::INFO;
  if (!strcasecmp(v, "debug")) return LogLevel::DEBUG;
  if (!strcasecmp(v, "info")) return LogLevel::INFO;
  if (!strcasecmp(v, "warn") || !strcasecmp(v, "warning")) return LogLevel::WARN;
  if (!strcasecmp(v, "error")) return LogLevel::ERROR;
  std::fprintf(stderr, "weightsync: WEIGHTSYNC_LOG_LEVEL='%s' is not debug|info|warn|error; "
                       "using info\n", v);
  return LogLevel::INFO;
}

LogLevel Threshold() {
  static const LogLevel level = ThresholdFromEnv();
  return level;
}

constexpr char kLetters[] = {'D', 'I', 'W', 'E'};

}  // namespace

LogSink SetLogSink(LogSink sink) {
  std::lock_guard<std::mutex> lock(SinkMutex());
  LogSink old = std::move(Sink());
  Sink() = std::move(sink);
  HasSink() = static_cast<bool>(Sink());
  return old;
}

bool LogEnabled(LogLevel level) {
  if (level >= Threshold()) return true;
  std::lock_guard<std::mutex> lock(SinkMutex());
  return HasSink();
}

void EmitLog(LogLevel level, std::string_view component, const std::string& line) {
  {
    std::lock_guard<std::mutex> lock(SinkMutex());
    if (Sink()) Sink()(level, component, line);
  }
  if (level >= Threshold()) {
    std::fprintf(stderr, "weightsync %c %.*s: %s\n", kLetters[static_cast<int>(level)],
                 static_cast<int>(component.size()), component.data(), line.c_str());
  }
}

}  // namespace weightsync::util
