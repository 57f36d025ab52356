// A publisher of CUDA tensors, driven line by line like ws_publisher (tests/helpers/
// publisher_main.cc): the synthetic model is filled on the host and uploaded to device memory
// before each publish. Besides the command loop's verbs: "publish S" → "ok S"; "members" → how
// many subscribers it serves (Publisher::Members()).
//   ws_gpu_publisher ENDPOINT TENSORS ELEMENTS DEVICE [SLOTS [SHARD/SHARDS]]
// With SHARD/SHARDS (e.g. 1/2) it registers only the tensors i with i % SHARDS == SHARD, as one
// trainer rank of several would.
//   ws_gpu_publisher ENDPOINT fsdp RANK RANKS DEVICE [SCALE]
// FSDP rank RANK of RANKS of the layer model (testing/regions.h): every tensor a region (rows) of
// its global tensor, on DEVICE.
// With WS_TEST_ZERO_COPY=1 in the environment the publisher is zero-copy
// (PublisherOptions::zero_copy): its tensors are packed several to a cudaMalloc allocation (two
// allocations, as PyTorch's caching allocator carves its segments), and each publish begins with
// BeginWrite(), as a trainer's optimizer step must. WS_TEST_ZERO_COPY=vmm packs them into cuMem
// memory instead, as PyTorch's expandable segments do: two reserved ranges of 2 MiB chunks mapped
// back to back, the first tensor of each straddling a chunk boundary. WS_TEST_TIMEOUT_MS overrides
// the publisher's timeout (5000 ms): how long a BeginWrite waits for readers before revoking their
// reads. WS_TEST_RING=BUCKETS:BYTES makes it a ring publisher (PublisherOptions::ring_buckets),
// each publish fenced by BeginWrite() as for zero-copy.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

std::chrono::milliseconds Timeout() {
  const char* v = std::getenv("WS_TEST_TIMEOUT_MS");
  return std::chrono::milliseconds(v != nullptr ? std::atoi(v) : 5000);
}

std::string ZeroCopyMode() {
  const char* v = std::getenv("WS_TEST_ZERO_COPY");
  return v != nullptr ? v : "";
}
bool ZeroCopy() { return ZeroCopyMode() == "1" || ZeroCopyMode() == "vmm"; }

// The caller's memory the tensors live in: cudaMalloc buffers, or (vmm) cuMem chunks.
struct DeviceMemory {
  std::vector<ws::cuda::DeviceBuffer> buffers;
  std::vector<ws::cuda::ChunkedAllocation> chunked;
};

// Device memory of `device` for each of `host` (same shapes, dtypes and regions) and the views of
// it to register: one allocation per tensor, or (zero-copy) the tensors packed at 256-byte
// boundaries into two allocations.
ws::Status OnDevice(const std::vector<ws::NamedTensor>& host, int device, DeviceMemory* memory,
                    std::vector<ws::NamedTensor>* views, std::vector<uint8_t*>* data) {
  const bool packed = ZeroCopy();
  const bool vmm = ZeroCopyMode() == "vmm";
  std::vector<ws::cuda::DeviceBuffer>* buffers = &memory->buffers;
  const size_t half = (host.size() + 1) / 2;
  std::vector<uint64_t> offsets;
  // vmm: each range starts 256 bytes before its first chunk boundary (2 MiB, the granularity).
  constexpr uint64_t kChunk = 2ull << 20;
  const uint64_t start = vmm ? kChunk - 256 : 0;
  uint64_t used[2] = {start, start};
  for (size_t i = 0; i < host.size(); ++i) {
    WS_ASSIGN_OR_RETURN(uint64_t bytes, host[i].view.NumBytes());
    uint64_t& at = used[i < half ? 0 : 1];
    offsets.push_back(at);
    at += (bytes + 255) / 256 * 256;
  }
  std::vector<uint8_t*> bases;
  if (vmm) {
    for (uint64_t bytes : used) {
      WS_ASSIGN_OR_RETURN(ws::cuda::ChunkedAllocation chunked,
                          ws::cuda::ChunkedAllocation::Create(device, bytes));
      if (chunked.chunk_bytes() != kChunk) {
        return ws::Status::FailedPrecondition("cuMem granularity ", chunked.chunk_bytes(),
                                              ", the test expects ", kChunk);
      }
      bases.push_back(chunked.data());
      memory->chunked.push_back(std::move(chunked));
    }
  } else if (packed) {
    for (uint64_t bytes : used) {
      WS_ASSIGN_OR_RETURN(ws::cuda::DeviceBuffer buffer,
                          ws::cuda::DeviceBuffer::Allocate(std::max<uint64_t>(bytes, 1)));
      bases.push_back(buffer.as<uint8_t>());
      buffers->push_back(std::move(buffer));
    }
  }
  for (size_t i = 0; i < host.size(); ++i) {
    const ws::NamedTensor& t = host[i];
    WS_ASSIGN_OR_RETURN(uint64_t bytes, t.view.NumBytes());
    uint8_t* where = nullptr;
    if (packed) {
      where = bases[i < half ? 0 : 1] + offsets[i];
    } else {
      WS_ASSIGN_OR_RETURN(ws::cuda::DeviceBuffer buffer,
                          ws::cuda::DeviceBuffer::Allocate(std::max<uint64_t>(bytes, 1)));
      where = buffer.as<uint8_t>();
      buffers->push_back(std::move(buffer));
    }
    ws::NamedTensor view = t;
    view.view.data = where;
    view.view.device = {ws::Device::Kind::kCUDA, device};
    views->push_back(view);
    data->push_back(where);
  }
  return ws::Status::Ok();
}

// A zero-copy or ring trainer may change its tensors only once no subscriber reads them.
ws::Status BeforeWriting(ws::Publisher& publisher) {
  return ZeroCopy() || std::getenv("WS_TEST_RING") != nullptr ? publisher.BeginWrite()
                                                              : ws::Status::Ok();
}

// One trainer rank of a sharded model on `device`: the host pattern uploaded before each publish.
int ServeFsdpRank(ws::PublisherOptions options, int rank, int ranks, int device, int scale) {
  static const std::vector<ws::testing::GlobalTensor> model = ws::testing::LayerModel(scale);
  ws::testing::TrainerRank trainer = ws::testing::FsdpRank(model, ranks, rank);
  std::vector<ws::NamedTensor> host;
  for (ws::testing::RegionTensor& t : trainer.tensors) host.push_back(t.View());
  DeviceMemory memory;
  std::vector<ws::NamedTensor> on_device;
  std::vector<uint8_t*> data;
  if (ws::Status s = OnDevice(host, device, &memory, &on_device, &data); !s.ok()) {
    return SetUpFailed(s);
  }
  auto publisher = ws::Publisher::Create(options);
  if (!publisher.ok()) return SetUpFailed(publisher.status());
  if (ws::Status s = (*publisher)->Register(on_device); !s.ok()) return SetUpFailed(s);
  ws::testing::SayReady((*publisher)->endpoint());
  ws::testing::CommandLoop loop;
  loop.On("publish", [&](std::istream& args) {
    int64_t step = 0;
    if (!(args >> step)) return std::string("error publish needs a step");
    ws::Status s = BeforeWriting(**publisher);
    for (size_t i = 0; i < trainer.tensors.size() && s.ok(); ++i) {
      ws::testing::RegionTensor& t = trainer.tensors[i];
      ws::RegionPart part = t.parts[0];
      part.at.clear();
      ws::testing::FillPart(*trainer.globals[i], step, part, t.shape, t.storage.data());
      s = ws::cuda::CopyToDevice(data[i], t.storage.data(), t.nbytes());
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
    options.timeout = Timeout();
    options.zero_copy = ZeroCopy();
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
  options.timeout = Timeout();
  options.zero_copy = ZeroCopy();
  if (ws::Status s = ws::testing::RingFromEnvironment(&options); !s.ok()) return SetUpFailed(s);
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
  DeviceMemory memory;
  std::vector<ws::NamedTensor> on_device;
  std::vector<uint8_t*> data;
  if (ws::Status s = OnDevice(host, device, &memory, &on_device, &data); !s.ok()) {
    return SetUpFailed(s);
  }
  auto publisher = ws::Publisher::Create(options);
  if (!publisher.ok()) return SetUpFailed(publisher.status());
  if (ws::Status s = (*publisher)->Register(on_device); !s.ok()) return SetUpFailed(s);
  ws::testing::SayReady((*publisher)->endpoint());
  ws::testing::CommandLoop loop;
  loop.On("publish", [&](std::istream& args) {
    int64_t step = 0;
    if (!(args >> step)) return std::string("error publish needs a step");
    ws::Status s = BeforeWriting(**publisher);
    if (s.ok()) model.Fill(step);
    for (size_t i = 0; i < host.size() && s.ok(); ++i) {
      s = ws::cuda::CopyToDevice(data[i], host[i].view.data, *host[i].view.NumBytes());
    }
    if (s.ok()) s = PublishFromAnotherDevice(**publisher, device, step);
    return ws::testing::Answer(s, "ok " + std::to_string(step));
  });
  loop.On("members", [&](std::istream&) { return std::to_string((*publisher)->Members().size()); });
  loop.OnQuit([&] { return (*publisher)->Close(); });
  return loop.Run(std::cin);
}
