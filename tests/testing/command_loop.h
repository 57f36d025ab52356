// The command loop of the helper programs (tests/helpers/*_main.cc) that multi-process tests drive
// through testing::ChildProcess: a helper sets itself up, says "ready ..." (or "error <status>"
// and exits 1), then answers one command a line, "VERB [ARGS...]", with one line. A helper
// registers a handler per verb; the loop reads, dispatches, answers and flushes. Every helper
// also understands
//   arm SPEC   → "ok" | "error <status>"    (fail points, $WEIGHTSYNC_FAILPOINTS syntax)
//   hits NAME  → "<count>"                  (how often fail point NAME fired)
//   quit       → "ok" | "<status>"          (the helper's Close(); exit code 0 if it succeeded)
// and answers an unknown verb with "error unknown command 'VERB'". End of input exits 0.
#pragma once

#include <cstdio>
#include <functional>
#include <istream>
#include <map>
#include <string>

#include "weightsync/options.h"
#include "weightsync/status.h"

namespace weightsync::testing {

class CommandLoop {
 public:
  // Reads the command's arguments from `args`; returns the answer line (no newline).
  using Handler = std::function<std::string(std::istream& args)>;

  CommandLoop();
  void On(const std::string& verb, Handler handler);
  // What "quit" closes; without one, "quit" just answers "ok".
  void OnQuit(std::function<Status()> close) { close_ = std::move(close); }
  // Answers commands from `in` until it ends or "quit"; returns the helper's exit code.
  int Run(std::istream& in, std::FILE* out = stdout);

 private:
  std::map<std::string, Handler> handlers_;
  std::function<Status()> close_;
};

// The answer of a command whose work returned `s`: `ok` when it succeeded, else "error <status>".
std::string Answer(const Status& s, const std::string& ok);
// Says "ready <what>" (what the driving test waits for), flushed.
void SayReady(const std::string& what);
// A set-up failure before "ready": says "error <status>" and returns the exit code 1.
int SetUpFailed(const Status& s);
// WS_TEST_RING=BUCKETS:BYTES, if set, into `options` (ring_buckets, ring_bucket_bytes): the
// publisher helpers' ring mode.
Status RingFromEnvironment(PublisherOptions* options);

}  // namespace weightsync::testing
