#include "util/knobs.h"

#include <strings.h>

#include <cstdlib>

namespace weightsync::util {
namespace {

constexpr KnobInfo kKnobs[] = {
    {Knob::kLogLevel, "WEIGHTSYNC_LOG_LEVEL", "enum: debug|info|warn|error", "info",
     "lines below this level are not printed to stderr", false},
    {Knob::kSocketDir, "WEIGHTSYNC_SOCKET_DIR", "path", "/tmp/weightsync-UID",
     "directory of the Unix sockets behind local://NAME endpoints (0700, owned by this user)",
     false},
    {Knob::kTokenFile, "WEIGHTSYNC_TOKEN_FILE", "path", "",
     "TCP token file (mode 0600 or stricter), used when the options name no token", false},
    {Knob::kToken, "WEIGHTSYNC_TOKEN", "string (>= 16 bytes)", "",
     "the TCP token itself, used when neither the options nor WEIGHTSYNC_TOKEN_FILE give one",
     true},
    {Knob::kNcclLibrary, "WEIGHTSYNC_NCCL_LIBRARY", "path or soname", "libnccl.so.2",
     "the NCCL library the nccl transport loads at run time (NCCL >= 2.18)", false},
    {Knob::kFailPoints, "WEIGHTSYNC_FAILPOINTS", "name=action[:arg][*count];...", "",
     "test-only fault injection, read at the first Publisher/Subscriber::Create", false},
};

}  // namespace

std::span<const KnobInfo> AllKnobs() { return kKnobs; }

const KnobInfo& Describe(Knob knob) {
  for (const KnobInfo& k : kKnobs) {
    if (k.knob == knob) return k;
  }
  return kKnobs[0];  // unreachable: every enumerator has a row (checked by knobs_test)
}

std::optional<std::string> KnobValue(Knob knob) {
  const std::string name(Describe(knob).name);
  const char* v = std::getenv(name.c_str());
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

Result<KnobLogLevel> LogLevelKnob() {
  std::optional<std::string> v = KnobValue(Knob::kLogLevel);
  if (!v) return KnobLogLevel::kInfo;
  if (!strcasecmp(v->c_str(), "debug")) return KnobLogLevel::kDebug;
  if (!strcasecmp(v->c_str(), "info")) return KnobLogLevel::kInfo;
  if (!strcasecmp(v->c_str(), "warn") || !strcasecmp(v->c_str(), "warning")) {
    return KnobLogLevel::kWarn;
  }
  if (!strcasecmp(v->c_str(), "error")) return KnobLogLevel::kError;
  return Status::InvalidArgument("WEIGHTSYNC_LOG_LEVEL='", *v,
                                 "' is not one of debug, info, warn, error");
}

}  // namespace weightsync::util
