// A subscriber process driven line by line over stdin/stdout, for multi-process and
// multi-namespace tests. Destinations mirror the synthetic model of ws_publisher.
//   ws_subscriber ENDPOINT TENSORS ELEMENTS [TIMEOUT_MS]
// Prints "ready", then answers each command with one line (testing/command_loop.h; also arm SPEC
// and quit):
//   update S    → "ok S <ms>" | "error <code> <ms> <message>"
//   holds S     → "yes" | "no <why>"          (every tensor equals the model at step S)
//   valid       → "yes" | "no"                (weights_valid())
//   served      → "<count>"                   (a relay's children: ServedMembers())
//   sleep       → "ok" | "error <status>"     (Sleep())
// The token comes from the environment (WEIGHTSYNC_TOKEN / WEIGHTSYNC_TOKEN_FILE).
// WS_TEST_SERVE=ENDPOINT makes it a relay (SubscriberOptions::serve_endpoint): it prints
// "ready SERVE_ENDPOINT" (tcp://HOST:0 with the port bound) instead. WS_TEST_DEVICE=N puts the
// destinations on CUDA device N (an engine on a GPU); WS_TEST_MODE=in_place updates in place.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "gpu/gpu_test_util.h"
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
  if (const char* mode = std::getenv("WS_TEST_MODE"); mode != nullptr) {
    options.mode =
        std::string(mode) == "in_place" ? ws::UpdateMode::kInPlace : ws::UpdateMode::kStaged;
  }
  const char* device = std::getenv("WS_TEST_DEVICE");
  SyntheticModel model(std::atoi(argv[2]), std::atoll(argv[3]));
  auto like = model.Tensors();
  std::vector<std::vector<uint8_t>> storage;
  std::vector<ws::cuda::DeviceBuffer> on_device;
  std::vector<ws::NamedTensor> dst;
  if (device != nullptr) {
    if (ws::Status s = ws::cuda::SetDevice(std::atoi(device)); !s.ok()) {
      return ws::testing::SetUpFailed(s);
    }
    auto poisoned = ws::cuda::testing::PoisonedDestinations(like, std::atoi(device), &on_device);
    if (!poisoned.ok()) return ws::testing::SetUpFailed(poisoned.status());
    dst = std::move(poisoned).value();
  } else {
    storage = SyntheticModel::PoisonedStorage(like);
    dst = SyntheticModel::Views(like, storage);
  }
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
    const bool holds = device != nullptr
                           ? ws::cuda::testing::DestinationsHold(dst, like, step, &why)
                           : SyntheticModel::Holds(dst, step, &why);
    return holds ? std::string("yes") : "no " + why;
  });
  loop.On("valid",
          [&](std::istream&) { return std::string((*sub)->weights_valid() ? "yes" : "no"); });
  loop.On("served", [&](std::istream&) { return std::to_string((*sub)->ServedMembers().size()); });
  loop.On("sleep", [&](std::istream&) { return ws::testing::Answer((*sub)->Sleep(), "ok"); });
  loop.OnQuit([&] { return (*sub)->Close(); });
  return loop.Run(std::cin);
}
