#include "testing/command_loop.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "util/fail_point.h"

namespace weightsync::testing {

CommandLoop::CommandLoop() {
  On("arm", [](std::istream& args) {
    std::string spec;
    args >> spec;
    return Answer(util::FailPoints::ArmSpec(spec), "ok");
  });
  On("hits", [](std::istream& args) {
    std::string name;
    args >> name;
    return std::to_string(util::FailPoints::Hits(name));
  });
}

void CommandLoop::On(const std::string& verb, Handler handler) {
  handlers_[verb] = std::move(handler);
}

int CommandLoop::Run(std::istream& in, std::FILE* out) {
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream args(line);
    std::string verb;
    if (!(args >> verb)) continue;  // a blank line
    if (verb == "quit") {
      const Status s = close_ ? close_() : Status::Ok();
      std::fprintf(out, "%s\n", s.ok() ? "ok" : s.ToString().c_str());
      std::fflush(out);
      return s.ok() ? 0 : 1;
    }
    auto it = handlers_.find(verb);
    const std::string answer =
        it != handlers_.end() ? it->second(args) : "error unknown command '" + verb + "'";
    std::fprintf(out, "%s\n", answer.c_str());
    std::fflush(out);
  }
  return 0;
}

std::string Answer(const Status& s, const std::string& ok) {
  return s.ok() ? ok : "error " + s.ToString();
}

void SayReady(const std::string& what) {
  std::printf("ready%s%s\n", what.empty() ? "" : " ", what.c_str());
  std::fflush(stdout);
}

int SetUpFailed(const Status& s) {
  std::printf("error %s\n", s.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

Status RingFromEnvironment(PublisherOptions* options) {
  const char* ring = std::getenv("WS_TEST_RING");
  if (ring == nullptr) return Status::Ok();
  unsigned long long bytes = 0;
  if (std::sscanf(ring, "%d:%llu", &options->ring_buckets, &bytes) != 2) {
    return Status::InvalidArgument("WS_TEST_RING='", ring, "': expected BUCKETS:BYTES");
  }
  options->ring_bucket_bytes = bytes;
  return Status::Ok();
}

}  // namespace weightsync::testing
