// A publisher process driven line by line over stdin/stdout, for multi-process tests.
//   ws_publisher ENDPOINT TENSORS ELEMENTS [SLOTS]
// Prints "ready ENDPOINT" (the bound endpoint: tcp://HOST:0 gets its port), then answers each
// command with one line (testing/command_loop.h; also arm and quit):
//   publish S   → "ok S" | "error <status>"      (fills the synthetic model for step S first)
// Fail points come from $WEIGHTSYNC_FAILPOINTS or `arm`.
#include <cstdio>
#include <iostream>
#include <string>

#include "testing/command_loop.h"
#include "testing/test_util.h"

namespace ws = weightsync;
using ws::testing::Answer;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s ENDPOINT TENSORS ELEMENTS [SLOTS]\n", argv[0]);
    return 2;
  }
  ws::PublisherOptions options;
  options.endpoint = argv[1];
  options.timeout = std::chrono::milliseconds(5000);
  if (argc > 4) options.slots = std::atoi(argv[4]);
  ws::testing::SyntheticModel model(std::atoi(argv[2]), std::atoll(argv[3]));
  auto publisher = ws::Publisher::Create(options);
  if (!publisher.ok()) return ws::testing::SetUpFailed(publisher.status());
  if (ws::Status s = (*publisher)->Register(model.Tensors()); !s.ok()) {
    return ws::testing::SetUpFailed(s);
  }
  ws::testing::SayReady((*publisher)->endpoint());
  ws::testing::CommandLoop loop;
  loop.On("publish", [&](std::istream& args) {
    int64_t step = 0;
    if (!(args >> step)) return std::string("error publish needs a step");
    model.Fill(step);
    return Answer((*publisher)->Publish(step).status(), "ok " + std::to_string(step));
  });
  loop.OnQuit([&] { return (*publisher)->Close(); });
  return loop.Run(std::cin);
}
