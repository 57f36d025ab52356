// A subscriber process driven line by line over stdin/stdout, for multi-process and
// multi-namespace tests. Destinations mirror the synthetic model of ws_publisher.
//   ws_subscriber ENDPOINT TENSORS ELEMENTS [TIMEOUT_MS]
// Prints "ready", then answers each command with one line:
//   update S    → "ok S <ms>" | "error <code> <ms> <message>"
//   holds S     → "yes" | "no <why>"          (every tensor equals the model at step S)
//   valid       → "yes" | "no"                (weights_valid())
//   arm SPEC    → "ok"                        (fail points, WEIGHTSYNC_FAILPOINTS syntax)
//   quit
// The token comes from the environment (WEIGHTSYNC_TOKEN / WEIGHTSYNC_TOKEN_FILE).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "testing/test_util.h"
#include "util/fail_point.h"

namespace ws = weightsync;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s ENDPOINT TENSORS ELEMENTS [TIMEOUT_MS]\n", argv[0]);
    return 2;
  }
  ws::SubscriberOptions options;
  options.endpoint = argv[1];
  options.verify = true;
  options.timeout = std::chrono::milliseconds(argc > 4 ? std::atoi(argv[4]) : 5000);
  ws::testing::SyntheticModel model(std::atoi(argv[2]), std::atoll(argv[3]));
  auto like = model.Tensors();
  auto storage = ws::testing::SyntheticModel::PoisonedStorage(like);
  auto dst = ws::testing::SyntheticModel::Views(like, storage);
  auto sub = ws::Subscriber::Create(options);
  if (!sub.ok()) {
    std::printf("error %s\n", sub.status().ToString().c_str());
    return 1;
  }
  if (ws::Status s = (*sub)->Register(dst); !s.ok()) {
    std::printf("error %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  std::string cmd;
  while (std::cin >> cmd) {
    if (cmd == "update") {
      int64_t step;
      std::cin >> step;
      auto t0 = std::chrono::steady_clock::now();
      auto r = (*sub)->Update(step);
      long ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::steady_clock::now() - t0)
                    .count();
      if (r.ok()) {
        std::printf("ok %lld %ld\n", static_cast<long long>(r->step), ms);
      } else {
        std::printf("error %s %ld %s\n", std::string(ws::StatusCodeName(r.status().code())).c_str(),
                    ms, r.status().message().c_str());
      }
    } else if (cmd == "holds") {
      int64_t step;
      std::cin >> step;
      std::string why;
      bool holds = ws::testing::SyntheticModel::Holds(dst, step, &why);
      std::printf("%s%s\n", holds ? "yes" : "no ", holds ? "" : why.c_str());
    } else if (cmd == "valid") {
      std::printf("%s\n", (*sub)->weights_valid() ? "yes" : "no");
    } else if (cmd == "arm") {
      std::string spec;
      std::cin >> spec;
      size_t eq = spec.find('='), colon = spec.find(':'), star = spec.find('*');
      std::string name = spec.substr(0, eq);
      std::string action = spec.substr(eq + 1, std::min(colon, star) - eq - 1);
      int64_t arg = colon == std::string::npos ? 0 : std::atoll(spec.c_str() + colon + 1);
      int64_t count = star == std::string::npos ? -1 : std::atoll(spec.c_str() + star + 1);
      ws::util::FailAction a = action == "sleep"   ? ws::util::FailAction::kSleep
                               : action == "error" ? ws::util::FailAction::kError
                                                   : ws::util::FailAction::kFlip;
      ws::util::FailPoints::Arm(name, a, arg, count);
      std::printf("ok\n");
    } else if (cmd == "quit") {
      ws::Status s = (*sub)->Close();
      std::printf("%s\n", s.ok() ? "ok" : s.ToString().c_str());
      std::fflush(stdout);
      return s.ok() ? 0 : 1;
    } else {
      std::printf("error unknown command '%s'\n", cmd.c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}
