// A subscriber process driven line by line over stdin/stdout, for multi-process and
// multi-namespace tests. Destinations mirror the synthetic model of ws_publisher.
//   ws_subscriber ENDPOINT TENSORS ELEMENTS [TIMEOUT_MS]
// Prints "ready", then answers each command with one line (testing/command_loop.h; also arm SPEC
// and quit):
//   update S    → "ok S <ms>" | "error <code> <ms> <message>"
//   holds S     → "yes" | "no <why>"          (every tensor equals the model at step S)
//   valid       → "yes" | "no"                (weights_valid())
// The token comes from the environment (WEIGHTSYNC_TOKEN / WEIGHTSYNC_TOKEN_FILE).
// WS_TEST_SERVE=ENDPOINT makes it a relay (SubscriberOptions::serve_endpoint): it prints
// "ready SERVE_ENDPOINT" (tcp://HOST:0 with the port bound) instead.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "testing/command_loop.h"
#include "testing/test_util.h"

namespace ws = weightsync;
using ws::testing::SyntheticModel;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s ENDPOINT TENSORS ELEMENTS [TIMEOUT_MS]\n", argv[0]);
    return 2;
  }
  ws::SubscriberOptions options;
  options.endpoint = argv[1];
  options.verify = true;
  options.timeout = std::chrono::milliseconds(argc > 4 ? std::atoi(argv[4]) : 5000);
  if (const char* serve = std::getenv("WS_TEST_SERVE"); serve != nullptr) {
    options.serve_endpoint = serve;
  }
  SyntheticModel model(std::atoi(argv[2]), std::atoll(argv[3]));
  auto like = model.Tensors();
  auto storage = SyntheticModel::PoisonedStorage(like);
  auto dst = SyntheticModel::Views(like, storage);
  auto sub = ws::Subscriber::Create(options);
  if (!sub.ok()) return ws::testing::SetUpFailed(sub.status());
  if (ws::Status s = (*sub)->Register(dst); !s.ok()) return ws::testing::SetUpFailed(s);
  ws::testing::SayReady((*sub)->serve_endpoint());
  ws::testing::CommandLoop loop;
  loop.On("update", [&](std::istream& args) {
    int64_t step = 0;
    if (!(args >> step)) return std::string("error update needs a step");
    auto t0 = std::chrono::steady_clock::now();
    auto r = (*sub)->Update(step);
    const std::string ms = std::to_string(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count());
    if (r.ok()) return "ok " + std::to_string(r->step) + " " + ms;
    return "error " + std::string(ws::StatusCodeName(r.status().code())) + " " + ms + " " +
           r.status().message();
  });
  loop.On("holds", [&](std::istream& args) {
    int64_t step = 0;
    args >> step;
    std::string why;
    return SyntheticModel::Holds(dst, step, &why) ? std::string("yes") : "no " + why;
  });
  loop.On("valid",
          [&](std::istream&) { return std::string((*sub)->weights_valid() ? "yes" : "no"); });
  loop.OnQuit([&] { return (*sub)->Close(); });
  return loop.Run(std::cin);
}
