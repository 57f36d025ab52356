// Named fault-injection points for tests. Disarmed points cost one relaxed atomic load.
//
// Arm from a test with FailPoints::Arm("shm.unmap", FailAction::kError), or in a child process
// through $WEIGHTSYNC_FAILPOINTS="name=action[:arg][*count];..." with action one of
// error | sleep:<ms> | flip | abort. A point fires `count` times (default: unlimited); Hits()
// says how often it fired, so a test can assert that its fault happened.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "weightsync/status.h"

namespace weightsync::util {

enum class FailAction { kNone, kError, kSleep, kFlip, kAbort };

struct FailHit {
  FailAction action = FailAction::kNone;
  int64_t arg = 0;
  explicit operator bool() const { return action != FailAction::kNone; }
};

class FailPoints {
 public:
  static void Arm(std::string_view name, FailAction action, int64_t arg = 0, int64_t count = -1);
  static void Disarm(std::string_view name);
  static void DisarmAll();
  static int64_t Hits(std::string_view name);
  // Parses $WEIGHTSYNC_FAILPOINTS (once; later calls are no-ops).
  static Status LoadFromEnv();
  // Arms the points of `spec`, in $WEIGHTSYNC_FAILPOINTS syntax (a helper process told at run
  // time). InvalidArgument names the item it cannot read; the items before it stay armed.
  static Status ArmSpec(std::string_view spec);
  // Hot-path check. Sleep actions are performed here and reported as kSleep.
  static FailHit Check(std::string_view name);
};

}  // namespace weightsync::util

// Returns an injected error from the enclosing function when the point fires with kError.
#define WS_FAIL_POINT_RETURN(name)                                                          \
  do {                                                                                      \
    if (::weightsync::util::FailPoints::Check(name).action ==                               \
        ::weightsync::util::FailAction::kError) {                                           \
      return ::weightsync::Status::Internal("injected failure at fail point '", name, "'"); \
    }                                                                                       \
  } while (0)

// Like WS_FAIL_POINT_RETURN, but routes the injected error through `handler` (a callable taking
// a Status and returning the Status to return), so the caller's failure path runs as for a real
// error. Sleep actions just sleep.
#define WS_FAIL_POINT_RETURN_VIA(handler, name)                                           \
  do {                                                                                    \
    if (::weightsync::util::FailPoints::Check(name).action ==                             \
        ::weightsync::util::FailAction::kError) {                                         \
      return handler(                                                                     \
          ::weightsync::Status::Internal("injected failure at fail point '", name, "'")); \
    }                                                                                     \
  } while (0)
