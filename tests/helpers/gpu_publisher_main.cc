// A publisher of CUDA tensors, driven line by line like ws_publisher (tests/helpers/
// publisher_main.cc): the synthetic model is filled on the host and uploaded to device memory
// before each publish.
//   ws_gpu_publisher ENDPOINT TENSORS ELEMENTS DEVICE [SLOTS [SHARD/SHARDS]]
// With SHARD/SHARDS (e.g. 1/2) it registers only the tensors i with i % SHARDS == SHARD, as one
// trainer rank of several would.
#include <cstdio>
#include <iostream>
#include <string>

#include "cuda/device.h"
#include "cuda/vmm.h"
#include "testing/command_loop.h"
#include "testing/test_util.h"

namespace ws = weightsync;
using ws::testing::SetUpFailed;

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s ENDPOINT TENSORS ELEMENTS DEVICE [SLOTS [SHARD/SHARDS]]\n",
                 argv[0]);
    return 2;
  }
  const int device = std::atoi(argv[4]);
  if (ws::Status s = ws::cuda::SetDevice(device); !s.ok()) return SetUpFailed(s);
  ws::PublisherOptions options;
  options.endpoint = argv[1];
  options.timeout = std::chrono::milliseconds(5000);
  if (argc > 5) options.slots = std::atoi(argv[5]);
  int shard = 0, shards = 1;
  if (argc > 6 && std::sscanf(argv[6], "%d/%d", &shard, &shards) != 2) shards = 1;
  ws::testing::SyntheticModel model(std::atoi(argv[2]), std::atoll(argv[3]));
  std::vector<ws::NamedTensor> host;
  {
    std::vector<ws::NamedTensor> all = model.Tensors();
    for (size_t i = 0; i < all.size(); ++i) {
      if (static_cast<int>(i) % shards == shard) host.push_back(all[i]);
    }
  }
  std::vector<ws::cuda::DeviceBuffer> buffers;
  std::vector<ws::NamedTensor> on_device;
  for (const auto& t : host) {
    auto buffer = ws::cuda::DeviceBuffer::Allocate(std::max<uint64_t>(*t.view.NumBytes(), 1));
    if (!buffer.ok()) return SetUpFailed(buffer.status());
    ws::TensorView v = t.view;
    v.data = buffer->data();
    v.device = {ws::Device::Kind::kCUDA, device};
    on_device.push_back({t.name, v});
    buffers.push_back(std::move(buffer).value());
  }
  auto publisher = ws::Publisher::Create(options);
  if (!publisher.ok()) return SetUpFailed(publisher.status());
  if (ws::Status s = (*publisher)->Register(on_device); !s.ok()) return SetUpFailed(s);
  ws::testing::SayReady((*publisher)->endpoint());
  // Publish runs with another device current (when there is one): the publisher must make and use
  // everything on its tensors' device and give the caller its own back.
  const int callers_device =
      ws::cuda::DeviceCount() > 1 ? (device + 1) % ws::cuda::DeviceCount() : device;
  ws::testing::CommandLoop loop;
  loop.On("publish", [&](std::istream& args) {
    int64_t step = 0;
    if (!(args >> step)) return std::string("error publish needs a step");
    model.Fill(step);
    ws::Status s;
    for (size_t i = 0; i < host.size() && s.ok(); ++i) {
      s = ws::cuda::CopyToDevice(buffers[i].data(), host[i].view.data, *host[i].view.NumBytes());
    }
    if (s.ok()) s = ws::cuda::SetDevice(callers_device);
    if (s.ok()) s = (*publisher)->Publish(step).status();
    if (s.ok()) {
      ws::Result<int> now = ws::cuda::CurrentDevice();
      if (!now.ok() || *now != callers_device) {
        s = ws::Status::Internal("Publish() left cuda:", now.ok() ? *now : -1,
                                 " current instead of the caller's cuda:", callers_device);
      }
    }
    return ws::testing::Answer(s, "ok " + std::to_string(step));
  });
  loop.OnQuit([&] { return (*publisher)->Close(); });
  return loop.Run(std::cin);
}
