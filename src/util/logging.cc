#include "util/logging.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "util/knobs.h"

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
  Result<KnobLogLevel> level = LogLevelKnob();
  if (!level.ok()) {
    // Logging cannot fail its caller: say so once and use the default.
    std::fprintf(stderr, "weightsync: %s; using info\n", level.status().message().c_str());
    return LogLevel::INFO;
  }
  switch (*level) {
    case KnobLogLevel::kDebug:
      return LogLevel::DEBUG;
    case KnobLogLevel::kInfo:
      return LogLevel::INFO;
    case KnobLogLevel::kWarn:
      return LogLevel::WARN;
    case KnobLogLevel::kError:
      return LogLevel::ERROR;
  }
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
