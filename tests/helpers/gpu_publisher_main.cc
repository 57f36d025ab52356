// A publisher of CUDA tensors, driven line by line like ws_publisher (tests/helpers/
// publisher_main.cc): the synthetic model is filled on the host and uploaded to device memory
// before each publish.
//   ws_gpu_publisher ENDPOINT TENSORS ELEMENTS DEVICE [SLOTS [SHARD/SHARDS]]
// With SHARD/SHARDS (e.g. 1/2) it registers only the tensors i with i % SHARDS == SHARD, as one
// trainer rank of several would.
//   ws_gpu_publisher ENDPOINT fsdp RANK RANKS DEVICE [SCALE]
// FSDP rank RANK of RANKS of the layer model (testing/regions.h): every tensor a region (rows) of
// its global tensor, on DEVICE.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>

#include "cuda/device.h"
#include "cuda/vmm.h"
#include "testing/command_loop.h"
#include "testing/regions.h"
#include "testing/test_util.h"

namespace ws = weightsync;
using ws::testing::SetUpFailed;

// Publish, with another device current (when there is one): the publisher must make and use
// everything on its tensors' device and give the caller its own back.
ws::Status PublishFromAnotherDevice(ws::Publisher& publisher, int device, int64_t step) {
  const int callers_device =
      ws::cuda::DeviceCount() > 1 ? (device + 1) % ws::cuda::DeviceCount() : device;
  WS_RETURN_IF_ERROR(ws::cuda::SetDevice(callers_device));
  WS_RETURN_IF_ERROR(publisher.Publish(step).status());
  ws::Result<int> now = ws::cuda::CurrentDevice();
  if (!now.ok() || *now != callers_device) {
    return ws::Status::Internal("Publish() left cuda:", now.ok() ? *now : -1,
                                " current instead of the caller's cuda:", callers_device);
  }
  return ws::Status::Ok();
}

// Device memory of `device` for each of `host` (same shapes, dtypes and regions) and the views of
// it to register.
ws::Status OnDevice(const std::vector<ws::NamedTensor>& host, int device,
                    std::vector<ws::cuda::DeviceBuffer>* buffers,
                    std::vector<ws::NamedTensor>* views) {
  for (const ws::NamedTensor& t : host) {
    WS_ASSIGN_OR_RETURN(uint64_t bytes, t.view.NumBytes());
    WS_ASSIGN_OR_RETURN(ws::cuda::DeviceBuffer buffer,
                        ws::cuda::DeviceBuffer::Allocate(std::max<uint64_t>(bytes, 1)));
    ws::NamedTensor view = t;
    view.view.data = buffer.data();
    view.view.device = {ws::Device::Kind::kCUDA, device};
    views->push_back(view);
    buffers->push_back(std::move(buffer));
  }
  return ws::Status::Ok();
}

// One trainer rank of a sharded model on `device`: the host pattern uploaded before each publish.
int ServeFsdpRank(ws::PublisherOptions options, int rank, int ranks, int device, int scale) {
  static const std::vector<ws::testing::GlobalTensor> model = ws::testing::LayerModel(scale);
  ws::testing::TrainerRank trainer = ws::testing::FsdpRank(model, ranks, rank);
  std::vector<ws::NamedTensor> host;
  for (ws::testing::RegionTensor& t : trainer.tensors) host.push_back(t.View());
  std::vector<ws::cuda::DeviceBuffer> buffers;
  std::vector<ws::NamedTensor> on_device;
  if (ws::Status s = OnDevice(host, device, &buffers, &on_device); !s.ok()) return SetUpFailed(s);
  auto publisher = ws::Publisher::Create(options);
  if (!publisher.ok()) return SetUpFailed(publisher.status());
  if (ws::Status s = (*publisher)->Register(on_device); !s.ok()) return SetUpFailed(s);
  ws::testing::SayReady((*publisher)->endpoint());
  ws::testing::CommandLoop loop;
  loop.On("publish", [&](std::istream& args) {
    int64_t step = 0;
    if (!(args >> step)) return std::string("error publish needs a step");
    ws::Status s;
    for (size_t i = 0; i < trainer.tensors.size() && s.ok(); ++i) {
      ws::testing::RegionTensor& t = trainer.tensors[i];
      ws::RegionPart part = t.parts[0];
      part.at.clear();
      ws::testing::FillPart(*trainer.globals[i], step, part, t.shape, t.storage.data());
      s = ws::cuda::CopyToDevice(buffers[i].data(), t.storage.data(), t.nbytes());
    }
    if (s.ok()) s = PublishFromAnotherDevice(**publisher, device, step);
    return ws::testing::Answer(s, "ok " + std::to_string(step));
  });
  loop.OnQuit([&] { return (*publisher)->Close(); });
  return loop.Run(std::cin);
}

int main(int argc, char** argv) {
  if (argc > 5 && std::string(argv[2]) == "fsdp") {
    const int device = std::atoi(argv[5]);
    if (ws::Status s = ws::cuda::SetDevice(device); !s.ok()) return SetUpFailed(s);
    ws::PublisherOptions options;
    options.endpoint = argv[1];
    options.timeout = std::chrono::milliseconds(5000);
    return ServeFsdpRank(options, std::atoi(argv[3]), std::atoi(argv[4]), device,
                         argc > 6 ? std::atoi(argv[6]) : 1);
  }
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
  if (ws::Status s = OnDevice(host, device, &buffers, &on_device); !s.ok()) return SetUpFailed(s);
  auto publisher = ws::Publisher::Create(options);
  if (!publisher.ok()) return SetUpFailed(publisher.status());
  if (ws::Status s = (*publisher)->Register(on_device); !s.ok()) return SetUpFailed(s);
  ws::testing::SayReady((*publisher)->endpoint());
  ws::testing::CommandLoop loop;
  loop.On("publish", [&](std::istream& args) {
    int64_t step = 0;
    if (!(args >> step)) return std::string("error publish needs a step");
    model.Fill(step);
    ws::Status s;
    for (size_t i = 0; i < host.size() && s.ok(); ++i) {
      s = ws::cuda::CopyToDevice(buffers[i].data(), host[i].view.data, *host[i].view.NumBytes());
    }
    if (s.ok()) s = PublishFromAnotherDevice(**publisher, device, step);
    return ws::testing::Answer(s, "ok " + std::to_string(step));
  });
  loop.OnQuit([&] { return (*publisher)->Close(); });
  return loop.Run(std::cin);
}
