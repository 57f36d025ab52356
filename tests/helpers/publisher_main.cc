// A publisher process driven line by line over stdin/stdout, for multi-process tests.
//   ws_publisher ENDPOINT TENSORS ELEMENTS [SLOTS]   the synthetic model (testing/test_util.h)
//   ws_publisher ENDPOINT fsdp RANK RANKS [SCALE]    FSDP rank RANK of RANKS of the layer model
//                                                    (testing/regions.h), 4 KiB segments
// Prints "ready ENDPOINT" (the bound endpoint: tcp://HOST:0 gets its port), then answers each
// command with one line (testing/command_loop.h; also arm and quit):
//   publish S   → "ok S" | "error <status>"      (fills the synthetic model for step S first)
//   members     → "<count>"                       (subscribers it serves: Members())
// Fail points come from $WEIGHTSYNC_FAILPOINTS or `arm`. WS_TEST_RING=BUCKETS:BYTES makes it a ring
// publisher (PublisherOptions::ring_buckets, ring_bucket_bytes), which fences each write of the
// model with BeginWrite().
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "testing/command_loop.h"
#include "testing/regions.h"
#include "testing/test_util.h"

namespace ws = weightsync;
using ws::testing::Answer;

// One trainer rank of a sharded model: each tensor a region of its global tensor.
int ServeFsdpRank(ws::PublisherOptions options, int rank, int ranks, int scale) {
  static const std::vector<ws::testing::GlobalTensor> model = ws::testing::LayerModel(scale);
  ws::testing::TrainerRank trainer = ws::testing::FsdpRank(model, ranks, rank);
  options.segment_bytes = 4096;
  if (ws::Status s = trainer.Start(options); !s.ok()) return ws::testing::SetUpFailed(s);
  ws::testing::SayReady(trainer.publisher->endpoint());
  ws::testing::CommandLoop loop;
  loop.On("publish", [&](std::istream& args) {
    int64_t step = 0;
    if (!(args >> step)) return std::string("error publish needs a step");
    return Answer(trainer.Publish(step), "ok " + std::to_string(step));
  });
  loop.OnQuit([&] { return trainer.publisher->Close(); });
  return loop.Run(std::cin);
}

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s ENDPOINT TENSORS ELEMENTS [SLOTS]\n", argv[0]);
    return 2;
  }
  ws::PublisherOptions options;
  options.endpoint = argv[1];
  options.timeout = std::chrono::milliseconds(5000);
  if (std::string(argv[2]) == "fsdp") {
    return ServeFsdpRank(options, std::atoi(argv[3]), std::atoi(argv[4]),
                         argc > 5 ? std::atoi(argv[5]) : 1);
  }
  if (argc > 4) options.slots = std::atoi(argv[4]);
  if (ws::Status s = ws::testing::RingFromEnvironment(&options); !s.ok()) {
    return ws::testing::SetUpFailed(s);
  }
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
    if (options.ring_buckets > 0) {
      if (ws::Status s = (*publisher)->BeginWrite(); !s.ok()) return Answer(s, "");
    }
    model.Fill(step);
    return Answer((*publisher)->Publish(step).status(), "ok " + std::to_string(step));
  });
  loop.On("members", [&](std::istream&) { return std::to_string((*publisher)->Members().size()); });
  loop.OnQuit([&] { return (*publisher)->Close(); });
  return loop.Run(std::cin);
}
