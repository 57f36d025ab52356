// Every environment knob, declared once: name, type, default and meaning. Code reads a knob only
// through these getters (never getenv), `weightsync info` lists them with their current values,
// and docs/env_vars.md mirrors this table (a test checks it names every knob).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "weightsync/status.h"

namespace weightsync::util {

enum class Knob {
  kLogLevel,     // WEIGHTSYNC_LOG_LEVEL
  kSocketDir,    // WEIGHTSYNC_SOCKET_DIR
  kTokenFile,    // WEIGHTSYNC_TOKEN_FILE
  kToken,        // WEIGHTSYNC_TOKEN
  kNcclLibrary,  // WEIGHTSYNC_NCCL_LIBRARY
  kFailPoints,   // WEIGHTSYNC_FAILPOINTS
  kCount,        // not a knob: how many there are
};

struct KnobInfo {
  Knob knob;
  std::string_view name;           // the environment variable
  std::string_view type;           // "enum: debug|info|warn|error", "path", "string", ...
  std::string_view default_value;  // as shown to users ("" = unset)
  std::string_view meaning;
  bool secret;  // never printed (its value is a credential)
};

std::span<const KnobInfo> AllKnobs();
const KnobInfo& Describe(Knob knob);

// The variable's value; nullopt when unset or empty (both mean "use the default").
std::optional<std::string> KnobValue(Knob knob);

// Log level knob, typed: unset → "info"; set but not one of the four → InvalidArgument naming the
// variable and the value.
enum class KnobLogLevel { kDebug, kInfo, kWarn, kError };
Result<KnobLogLevel> LogLevelKnob();

}  // namespace weightsync::util
