// A publisher process driven line by line over stdin/stdout, for multi-process tests.
//   ws_publisher ENDPOINT TENSORS ELEMENTS [SLOTS]
// Prints "ready ENDPOINT" (the bound endpoint: tcp://HOST:0 gets its port), then answers each command with one line:
//   publish S   → "ok S" | "error <status>"      (fills the synthetic model for step S first)
//   quit        → exits 0 after Close()
// Fail points come from $WEIGHTSYNC_FAILPOINTS.
#include <cstdio>
#include <iostream>
#include <string>

#include "testing/test_util.h"

namespace ws = weightsync;
using ws::Publisher; using ws::PublisherOptions; using ws::Status;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s ENDPOINT TENSORS ELEMENTS [SLOTS]\n", argv[0]);
    return 2;
  }
  PublisherOptions options;
  options.endpoint = argv[1];
  options.timeout = std::chrono::milliseconds(5000);
  if (argc > 4) options.slots = std::atoi(argv[4]);
  ws::testing::SyntheticModel model(std::atoi(argv[2]), std::atoll(argv[3]));
  auto publisher = Publisher::Create(options);
  if (!publisher.ok()) {
    std::printf("error %s\n", publisher.status().ToString().c_str());
    return 1;
  }
  if (Status s = (*publisher)->Register(model.Tensors()); !s.ok()) {
    std::printf("error %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("ready %s\n", (*publisher)->endpoint().c_str());
  std::fflush(stdout);
  std::string cmd;
  while (std::cin >> cmd) {
    if (cmd == "publish") {
      int64_t step;
      std::cin >> step;
      model.Fill(step);
      auto r = (*publisher)->Publish(step);
      if (r.ok()) std::printf("ok %lld\n", static_cast<long long>(step));
      else std::printf("error %s\n", r.status().ToString().c_str());
    } else if (cmd == "quit") {
      Status s = (*publisher)->Close();
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
