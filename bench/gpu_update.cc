// weightsync cuda-ipc on a 7B-like model (Qwen2.5-7B shapes, bf16), publisher on cuda:0 in a child
// process, subscriber on cuda:1 in this one. Prints one JSON object per figure, one line each
// (nlohmann-json); bench/gpu_update.py runs it next to the torch baselines and prints the table.
//
//   ws_gpu_update [--model qwen2.5-7b] [--scale 1] [--steps 20] [--mode in_place|staged]
//                 [--verify 0|1] [--src 0] [--dst 1] [--nccl 0|1] [--fp8 0|1]
//                 [--only
//                 peer,model,zerocopy,ring,fp8,mxfp8,nvfp4,fp8dst,tiny,nccl,ncclzerocopy,ncclring,many,h2d,d2h,h2dring,d2hring]
//                 [--h2d-scale 0.25]   (model scale of the host ↔ GPU rows)
//                 [--ring-buckets 2 --ring-bytes 1073741824]   (the ring row's ring)
// Figures: first update (prepare), steady-state update (median, min), GB/s; the same for a model
// of the same 339 tensors shrunk to a few bytes each (host overhead per step); heap allocations
// per steady update; and the peer-copy limit: one 2 GiB copy-engine transfer src → dst, timed the
// same way (host wall time around a copy and its event wait); with --fp8 1 (default) the same
// model received as fp8 weights + float32 block scales, converted on the subscriber's GPU.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cuda/block_scaled_format.h"
#include "cuda/device.h"
#include "cuda/kernels.h"
#include "cuda/vmm.h"
#include "model_presets.h"
#include "spawn_self.h"
#include "weightsync/weightsync.h"

#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
namespace {
std::atomic<int64_t> g_allocations{0};
}
void* operator new(size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace ws = weightsync;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string model = "qwen2.5-7b";
  double scale = 1.0;
  int steps = 20;
  bool staged = false;
  bool verify = false;
  int src = 0, dst = 1;
  std::string role = "main";
  bool nccl = true;                // also measure the nccl transport
  bool fp8 = true;                 // also measure bf16 → fp8 conversion in flight (cuda-ipc)
  bool host = false;               // publisher role: host tensors (a shared-memory arena)
  bool host_destinations = false;  // the subscriber receives into host memory
  bool zero_copy = false;          // the publisher is zero-copy (PublisherOptions::zero_copy)
  // Where a zero-copy publisher's tensors live: "per-tensor" (one cudaMalloc each), "packed" (one
  // cudaMalloc, 256-byte aligned, as a caching-allocator segment) or "cumem" (20 MiB cuMem chunks
  // back to back, as PyTorch's expandable segments).
  std::string memory = "per-tensor";
  int ring_buckets = 0;            // > 0: a ring publisher (PublisherOptions::ring_buckets)
  uint64_t ring_bucket_bytes = 0;  // its buckets (0: its default, from free GPU memory)
  int64_t many = 0;  // > 0: instead of the model, `many` bf16 tensors of 64 KiB (MoE experts)
  double h2d_scale = 0.25;  // the host → GPU rows use a smaller model (host publish is CPU copies)
  std::string only;         // empty: every row the flags above allow; else a comma-separated subset
  std::string endpoint;

  bool Row(const std::string& row) const {
    return only.empty() || ("," + only + ",").find("," + row + ",") != std::string::npos;
  }
};

void Die(const std::string& what, const ws::Status& s) {
  std::fprintf(stderr, "gpu_update: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

// The model's tensors; scale 0 keeps every name but shrinks each tensor to 64 elements.
std::vector<ws::TensorSpec> Specs(const Args& a, double scale) {
  if (a.many > 0) {
    std::vector<ws::TensorSpec> out;
    for (int64_t i = 0; i < a.many; ++i) {
      out.push_back({"experts." + std::to_string(i), ws::DType::kBFloat16, {32768}, 65536});
    }
    return out;
  }
  auto preset = ws::tools::FindPreset(a.model);
  if (!preset.ok()) Die("model", preset.status());
  auto scaled = ws::tools::ScaleConfig(*preset, scale > 0 ? scale : 1.0);
  if (!scaled.ok()) Die("scale", scaled.status());
  auto specs = ws::tools::BuildTensors(*scaled, ws::DType::kBFloat16);
  if (!specs.ok()) Die("tensors", specs.status());
  if (scale == 0) {
    for (auto& s : *specs) {
      s.shape = {64};
      s.nbytes = 128;
    }
  }
  return *specs;
}

// The cudaMalloc size for a tensor of `bytes`: from 1 MiB up, rounded to whole 2 MiB pages, as
// PyTorch's caching allocator sizes its segments for large blocks (small ones it packs into
// shared 2 MiB segments; here they keep their own exact allocation, whose pages hold too few bytes
// to matter). A zero-copy subscriber reads an allocation that ends in a partial page at about
// 0.8x (the driver maps it with small pages where it is opened by IPC; bench/copy_kernel_probe
// --src ipc), which is not the memory a PyTorch trainer publishes.
uint64_t AllocationBytes(uint64_t bytes) {
  constexpr uint64_t kPage = 2ull << 20;
  if (bytes < (1ull << 20)) return std::max<uint64_t>(bytes, 1);
  return (bytes + kPage - 1) / kPage * kPage;
}

// Device tensors for `specs` on `device`, one cudaMalloc each (AllocationBytes), filled with
// `fill`.
std::vector<ws::NamedTensor> Allocate(const std::vector<ws::TensorSpec>& specs, int device,
                                      uint8_t fill, std::vector<ws::cuda::DeviceBuffer>* keep) {
  if (auto s = ws::cuda::SetDevice(device); !s.ok()) Die("set device", s);
  std::vector<ws::NamedTensor> out;
  for (const auto& spec : specs) {
    auto b = ws::cuda::DeviceBuffer::Allocate(AllocationBytes(spec.nbytes));
    if (!b.ok()) Die("allocate " + spec.name, b.status());
    if (auto s = ws::cuda::MemsetDevice(b->data(), fill, b->size()); !s.ok()) Die("memset", s);
    out.push_back(
        {spec.name,
         ws::TensorView{b->data(), spec.dtype, spec.shape, {ws::Device::Kind::kCUDA, device}}});
    keep->push_back(std::move(b).value());
  }
  return out;
}

// The tensors for `specs` on `device` packed at 256-byte boundaries into one cudaMalloc of whole
// 2 MiB pages ("packed") or into 20 MiB cuMem chunks ("cumem"), filled with `fill`.
std::vector<ws::NamedTensor> AllocatePacked(const std::vector<ws::TensorSpec>& specs, int device,
                                            const std::string& memory, uint8_t fill,
                                            std::vector<ws::cuda::DeviceBuffer>* keep,
                                            std::vector<ws::cuda::ChunkedAllocation>* chunked) {
  if (auto s = ws::cuda::SetDevice(device); !s.ok()) Die("set device", s);
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  for (const auto& spec : specs) {
    offsets.push_back(total);
    total += (spec.nbytes + 255) / 256 * 256;
  }
  uint8_t* base = nullptr;
  if (memory == "cumem") {
    auto c = ws::cuda::ChunkedAllocation::Create(device, total, true, 20ull << 20);
    if (!c.ok()) Die("cuMem chunks", c.status());
    base = c->data();
    chunked->push_back(std::move(c).value());
  } else {
    auto b = ws::cuda::DeviceBuffer::Allocate(AllocationBytes(total));
    if (!b.ok()) Die("allocate", b.status());
    base = b->as<uint8_t>();
    keep->push_back(std::move(b).value());
  }
  if (auto s = ws::cuda::MemsetDevice(base, fill, total); !s.ok()) Die("memset", s);
  std::vector<ws::NamedTensor> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    out.push_back({specs[i].name, ws::TensorView{base + offsets[i],
                                                 specs[i].dtype,
                                                 specs[i].shape,
                                                 {ws::Device::Kind::kCUDA, device}}});
  }
  return out;
}

int RunPublisher(const Args& a) {
  std::vector<ws::cuda::DeviceBuffer> keep;
  std::vector<ws::cuda::ChunkedAllocation> chunked;
  std::vector<std::vector<uint8_t>> host;
  std::vector<ws::NamedTensor> tensors;
  if (a.zero_copy && a.memory != "per-tensor") {
    tensors = AllocatePacked(Specs(a, a.scale), a.src, a.memory, 0x3C, &keep, &chunked);
  } else if (a.host) {
    for (const auto& spec : Specs(a, a.scale)) {
      host.emplace_back(std::max<uint64_t>(spec.nbytes, 1), 0x3C);
      tensors.push_back({spec.name, ws::TensorView{host.back().data(), spec.dtype, spec.shape}});
    }
  } else {
    tensors = Allocate(Specs(a, a.scale), a.src, 0x3C, &keep);
  }
  ws::PublisherOptions o;
  o.endpoint = a.endpoint;
  o.timeout = std::chrono::milliseconds(60000);
  o.zero_copy = a.zero_copy;
  o.ring_buckets = a.ring_buckets;
  o.ring_bucket_bytes = a.ring_bucket_bytes;
  auto pub = ws::Publisher::Create(o);
  if (!pub.ok()) Die("publisher", pub.status());
  if (auto s = (*pub)->Register(tensors); !s.ok()) Die("register", s);
  std::printf("ready %s\n", (*pub)->endpoint().c_str());
  std::fflush(stdout);
  std::string cmd;
  int64_t step;
  while (std::cin >> cmd >> step) {
    // A zero-copy or ring trainer fences its next write (here: none; the tensors keep their
    // bytes) on the readers of the last step; the wait is part of what publishing costs it.
    const auto t0 = Clock::now();
    if (a.zero_copy || a.ring_buckets > 0) {
      if (auto s = (*pub)->BeginWrite(); !s.ok()) Die("begin_write", s);
    }
    auto r = (*pub)->Publish(step);
    if (!r.ok()) Die("publish", r.status());
    std::printf("ok %lld %.6f\n", static_cast<long long>(step),
                std::chrono::duration<double>(Clock::now() - t0).count());
    std::fflush(stdout);
  }
  return 0;
}

struct Child {
  pid_t pid = -1;
  FILE* in = nullptr;
  FILE* out = nullptr;
  std::string endpoint;  // as bound (tcp://127.0.0.1:0 gets its port)
};

Child Spawn(const Args& a, double scale, const std::string& endpoint) {
  const ws::bench::SelfChild self =
      ws::bench::SpawnSelf({"--role",         "publisher",
                            "--endpoint",     endpoint,
                            "--model",        a.model,
                            "--scale",        std::to_string(scale),
                            "--src",          std::to_string(a.src),
                            "--host",         a.host ? "1" : "0",
                            "--zero-copy",    a.zero_copy ? "1" : "0",
                            "--memory",       a.memory,
                            "--many",         std::to_string(a.many),
                            "--ring-buckets", std::to_string(a.ring_buckets),
                            "--ring-bytes",   std::to_string(a.ring_bucket_bytes)});
  Child c;
  c.pid = self.pid;
  c.in = self.in;
  c.out = self.out;
  char line[256];
  if (!fgets(line, sizeof(line), c.out) || std::strncmp(line, "ready ", 6) != 0) {
    std::fprintf(stderr, "gpu_update: publisher did not start\n");
    std::exit(1);
  }
  c.endpoint = std::string(line + 6);
  while (!c.endpoint.empty() && (c.endpoint.back() == '\n' || c.endpoint.back() == '\r')) {
    c.endpoint.pop_back();
  }
  return c;
}

double Publish(Child& c, int64_t step) {
  std::fprintf(c.in, "publish %lld\n", static_cast<long long>(step));
  std::fflush(c.in);
  char line[256];
  if (!fgets(line, sizeof(line), c.out)) std::exit(1);
  long long s;
  double seconds = 0;
  std::sscanf(line, "ok %lld %lf", &s, &seconds);
  return seconds;
}

// One figure: a JSON object on one line of stdout, its keys in the order given.
void PrintFigure(const nlohmann::ordered_json& figure) {
  std::printf("%s\n", figure.dump().c_str());
  std::fflush(stdout);
}

// `v` rounded to `decimals` places, as the figures have always been printed (%.6f, %.3f).
double Decimals(double v, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(v * scale) / scale;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The subscriber's tensors when it converts bf16 weights to fp8 in flight: every 2-D bf16
// tensor (the linear weights) becomes float8_e4m3fn plus NAME_scale_inv (float32 block scales);
// the rest (norms, biases) stays bf16.
std::vector<ws::TensorSpec> Fp8Specs(const std::vector<ws::TensorSpec>& published) {
  std::vector<ws::TensorSpec> out;
  for (const auto& s : published) {
    if (s.dtype != ws::DType::kBFloat16 || s.shape.size() != 2) {
      out.push_back(s);
      continue;
    }
    out.push_back({s.name, ws::DType::kFloat8E4M3FN, s.shape, s.nbytes / 2});
    const int64_t r = ws::cuda::Fp8ScaleRows(s.shape[0]), c = ws::cuda::Fp8ScaleCols(s.shape[1]);
    out.push_back({s.name + "_scale_inv", ws::DType::kFloat32, {r, c}, uint64_t(r * c) * 4});
  }
  return out;
}

// The subscriber's tensors for MXFP8 or NVFP4 weights (docs/quantized.md): every 2-D bf16 tensor
// becomes e4m3 values (MXFP8) or e2m1 values two per byte (NVFP4), NAME_scale_inv (one e8m0 per 32
// elements / one e4m3 per 16, row-major) and for NVFP4 NAME_scale_2 (float32); the rest stays
// bf16. *quantized gets the value tensors' names.
std::vector<ws::TensorSpec> BlockScaledSpecs(const std::vector<ws::TensorSpec>& published,
                                             ws::cuda::BlockFormat format,
                                             std::vector<std::string>* quantized) {
  const bool nvfp4 = format == ws::cuda::BlockFormat::kNvfp4;
  std::vector<ws::TensorSpec> out;
  for (const auto& s : published) {
    if (s.dtype != ws::DType::kBFloat16 || s.shape.size() != 2 || (nvfp4 && s.shape[1] % 2)) {
      out.push_back(s);
      continue;
    }
    const int64_t rows = s.shape[0], cols = s.shape[1];
    out.push_back({s.name, nvfp4 ? ws::DType::kFloat4E2M1FN : ws::DType::kFloat8E4M3FN, s.shape,
                   uint64_t(rows * ws::cuda::ValueBytesPerRow(format, cols))});
    const int64_t blocks = ws::cuda::BlocksPerRow(format, cols);
    out.push_back({s.name + "_scale_inv",
                   nvfp4 ? ws::DType::kFloat8E4M3FN : ws::DType::kFloat8E8M0FNU,
                   {rows, blocks},
                   uint64_t(rows * blocks)});
    if (nvfp4) out.push_back({s.name + "_scale_2", ws::DType::kFloat32, {}, 4});
    quantized->push_back(s.name);
  }
  return out;
}

// Bytes in use on `device` (all processes: cudaMemGetInfo), or 0 where it cannot say.
int64_t UsedGpuBytes(int device) {
  ws::cuda::ScopedDevice restore;
  size_t free_bytes = 0, total = 0;
  if (!ws::cuda::SetDevice(device).ok() || !ws::cuda::MemInfo(&free_bytes, &total).ok()) return 0;
  return static_cast<int64_t>(total - free_bytes);
}

// Updates `steps` times; prints the figures under `label`. `tcp`: the publisher listens on
// tcp://127.0.0.1 and the bytes move over NCCL; otherwise local:// and cuda-ipc. `fp8`: the
// destinations are fp8 (Fp8Specs) and the subscriber converts in flight, on the publisher's GPU
// unless `fp8_on_destination_gpu`.
enum class Convert { kNone, kFp8, kMxfp8, kNvfp4 };

void Measure(const Args& a, double scale, const std::string& label, bool tcp,
             Convert convert = Convert::kNone, bool fp8_on_destination_gpu = false) {
  const bool fp8 = convert != Convert::kNone;  // any conversion in flight
  const std::string asked = tcp ? std::string("tcp://127.0.0.1:0")
                                : "local://ws-gpu-bench-" + std::to_string(getpid()) + "-" + label;
  Child child = Spawn(a, scale, asked);
  const std::string endpoint = child.endpoint;
  std::vector<ws::cuda::DeviceBuffer> keep;
  auto specs = Specs(a, scale);
  std::vector<std::vector<uint8_t>> host_keep;
  std::vector<ws::NamedTensor> dst;
  if (a.host_destinations) {
    for (const auto& spec : specs) {
      host_keep.emplace_back(std::max<uint64_t>(spec.nbytes, 1), 0xFF);
      dst.push_back({spec.name, ws::TensorView{host_keep.back().data(), spec.dtype, spec.shape}});
    }
  } else {
    std::vector<std::string> quantized;
    const auto format =
        convert == Convert::kNvfp4 ? ws::cuda::BlockFormat::kNvfp4 : ws::cuda::BlockFormat::kMxfp8;
    const bool block_scaled = convert == Convert::kMxfp8 || convert == Convert::kNvfp4;
    dst = Allocate(block_scaled ? BlockScaledSpecs(specs, format, &quantized)
                   : fp8        ? Fp8Specs(specs)
                                : specs,
                   a.dst, 0xFF, &keep);
    for (auto& t : dst) {
      if (std::find(quantized.begin(), quantized.end(), t.name) == quantized.end()) continue;
      t.quantization.format = convert == Convert::kNvfp4 ? ws::Quantization::Format::kNvfp4
                                                         : ws::Quantization::Format::kMxfp8;
    }
  }
  ws::SubscriberOptions o;
  o.convert_dtypes = fp8;
  o.convert_on_publisher_gpu = !fp8_on_destination_gpu;
  o.endpoint = endpoint;
  o.mode = a.staged ? ws::UpdateMode::kStaged : ws::UpdateMode::kInPlace;
  o.verify = a.verify;
  o.timeout = std::chrono::milliseconds(120000);
  auto sub = ws::Subscriber::Create(o);
  if (!sub.ok()) Die("subscriber", sub.status());
  if (auto s = (*sub)->Register(dst); !s.ok()) Die("register", s);
  // GPU memory each side adds: the publisher's across its first publish (its store is made then),
  // the subscriber's across its first update (staging, digests); both on one GPU when there is one.
  const int64_t before_publish = UsedGpuBytes(a.src);
  int64_t publisher_extra = 0, subscriber_extra = 0;
  std::vector<double> steady, copy, publish, wait, commit;
  double first = 0, first_prepare = 0;
  int64_t allocations = 0;
  uint64_t bytes = 0;
  for (int step = 1; step <= a.steps; ++step) {
    double pub_s = Publish(child, step);
    if (step == 1) publisher_extra = UsedGpuBytes(a.src) - before_publish;
    const int64_t before_update = step == 1 ? UsedGpuBytes(a.dst) : 0;
    int64_t before = g_allocations.load();
    auto t0 = Clock::now();
    auto stats = (*sub)->Update(step);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    int64_t after = g_allocations.load();
    if (!stats.ok()) Die("update", stats.status());
    bytes = stats->bytes;
    if (step == 1) {
      first = s;
      first_prepare = stats->prepare_seconds;
      subscriber_extra = UsedGpuBytes(a.dst) - before_update;
    } else {
      steady.push_back(s);
      copy.push_back(stats->copy_seconds);
      wait.push_back(stats->wait_seconds);
      commit.push_back(stats->commit_seconds);
      publish.push_back(pub_s);
      if (step > 2) allocations += after - before;
    }
  }
  double med = Median(steady);
  const bool ring = a.ring_buckets > 0;
  const char* what = tcp           ? (a.zero_copy ? "weightsync_nccl_zero_copy"
                                      : ring      ? "weightsync_nccl_ring"
                                                  : "weightsync_nccl")
                     : a.zero_copy ? "weightsync_cuda_ipc_zero_copy"
                     : a.host      ? (ring ? "weightsync_shm_ring_to_gpu" : "weightsync_shm_to_gpu")
                     : a.host_destinations ? (ring ? "weightsync_cuda_ipc_ring_to_host"
                                                   : "weightsync_cuda_ipc_to_host")
                     : ring                ? "weightsync_cuda_ipc_ring"
                                           : "weightsync_cuda_ipc";
  PrintFigure({{"what", what},
               {"label", label},
               {"mode", a.staged ? "staged" : "in_place"},
               {"verify", a.verify},
               {"tensors", specs.size()},
               {"bytes", bytes},
               {"first_update_s", Decimals(first, 6)},
               {"first_prepare_s", Decimals(first_prepare, 6)},
               {"steady_median_s", Decimals(med, 6)},
               {"steady_min_s", Decimals(*std::min_element(steady.begin(), steady.end()), 6)},
               {"steady_GBps", Decimals(bytes / med / 1e9, 3)},
               {"copy_median_s", Decimals(Median(copy), 6)},
               {"wait_median_s", Decimals(Median(wait), 6)},
               {"commit_median_s", Decimals(Median(commit), 6)},
               {"publish_median_s", Decimals(Median(publish), 6)},
               {"publisher_extra_gpu_bytes", publisher_extra},
               {"subscriber_extra_gpu_bytes", subscriber_extra},
               {"heap_allocs_per_step",
                Decimals(a.steps > 2 ? double(allocations) / (a.steps - 2) : 0.0, 3)}});
  std::fflush(stdout);
  fclose(child.in);
  int status;
  waitpid(child.pid, &status, 0);
  fclose(child.out);
}

// Times one `n`-byte copy-engine transfer on `device` (12 runs, the first 2 discarded: host wall
// time around the copy and its event wait) and prints its median as the JSON figure `what`.
void PrintCopyLimit(const char* what, int device, void* dst, const void* src, uint64_t n) {
  auto q = ws::cuda::CopyQueue::Create(device);
  if (!q.ok()) Die("queue", q.status());
  ws::util::Deadline forever(std::chrono::milliseconds(60000));
  std::vector<double> times;
  for (int i = 0; i < 12; ++i) {
    auto t0 = Clock::now();
    (void)q->Enqueue(dst, src, n);
    if (auto s = q->Wait(forever); !s.ok()) Die("copy", s);
    if (i >= 2) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  double med = Median(times);
  PrintFigure({{"what", what},
               {"bytes", n},
               {"median_s", Decimals(med, 6)},
               {"GBps", Decimals(n / med / 1e9, 3)}});
}

// The PCIe limit the host ↔ GPU rows are held to: one 2 GiB transfer between pinned host memory
// and the GPU whose copy engines weightsync uses (`to_device`: host → --dst, else --src → host).
void PinnedHostCopyLimit(const Args& a, bool to_device) {
  const uint64_t n = 2ull << 30;
  std::vector<uint8_t> host(n, 0x3C);
  const int device = to_device ? a.dst : a.src;
  if (auto s = ws::cuda::SetDevice(device); !s.ok()) Die("device", s);
  auto pin = ws::cuda::HostRegistration::Register(host.data(), n, false);
  if (!pin.ok()) Die("pin", pin.status());
  auto dev = ws::cuda::DeviceBuffer::Allocate(n);
  if (!dev.ok()) Die("allocate", dev.status());
  if (to_device) {
    PrintCopyLimit("pinned_h2d_limit", device, dev->data(), host.data(), n);
  } else {
    PrintCopyLimit("pinned_d2h_limit", device, host.data(), dev->data(), n);
  }
}

// The NVLink limit: one 2 GiB transfer --src → --dst.
void PeerCopyLimit(const Args& a) {
  const uint64_t n = 2ull << 30;
  if (auto s = ws::cuda::SetDevice(a.src); !s.ok()) Die("device", s);
  auto src = ws::cuda::DeviceBuffer::Allocate(n);
  if (auto s = ws::cuda::SetDevice(a.dst); !s.ok()) Die("device", s);
  auto dst = ws::cuda::DeviceBuffer::Allocate(n);
  if (!src.ok() || !dst.ok()) Die("allocate", src.ok() ? dst.status() : src.status());
  // As torch does for its peer copies: direct peer access, then the copy engine.
  if (a.src != a.dst) {
    if (auto s = ws::cuda::EnablePeerAccess(a.dst, a.src); !s.ok()) Die("peer", s);
  }
  PrintCopyLimit("peer_copy_limit", a.dst, dst->data(), src->data(), n);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--model")
      a.model = v;
    else if (k == "--scale")
      a.scale = std::atof(v.c_str());
    else if (k == "--steps")
      a.steps = std::atoi(v.c_str());
    else if (k == "--mode")
      a.staged = v == "staged";
    else if (k == "--verify")
      a.verify = v == "1";
    else if (k == "--src")
      a.src = std::atoi(v.c_str());
    else if (k == "--dst")
      a.dst = std::atoi(v.c_str());
    else if (k == "--role")
      a.role = v;
    else if (k == "--endpoint")
      a.endpoint = v;
    else if (k == "--nccl")
      a.nccl = v == "1";
    else if (k == "--fp8")
      a.fp8 = v == "1";
    else if (k == "--only")
      a.only = v;
    else if (k == "--host")
      a.host = v == "1";
    else if (k == "--many")
      a.many = std::atoll(v.c_str());
    else if (k == "--zero-copy")
      a.zero_copy = v == "1";
    else if (k == "--memory")
      a.memory = v;
    else if (k == "--ring-buckets")
      a.ring_buckets = std::atoi(v.c_str());
    else if (k == "--ring-bytes")
      a.ring_bucket_bytes = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--h2d-scale")
      a.h2d_scale = std::atof(v.c_str());
    else {
      std::fprintf(stderr, "gpu_update: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (a.role == "publisher") return RunPublisher(a);
  // Only the ring row's publisher has a ring (--ring-buckets / --ring-bytes shape it).
  const int ring_buckets = a.ring_buckets;
  const uint64_t ring_bytes = a.ring_bucket_bytes;
  a.ring_buckets = 0;
  a.ring_bucket_bytes = 0;
  if (auto s = ws::cuda::CudaAvailable(); !s.ok()) Die("CUDA", s);
  if (ws::cuda::DeviceCount() < 2) {
    // One GPU: every row runs on it, except nccl, which cannot put two ranks on one device.
    a.dst = a.src;
    if (a.nccl && a.Row("nccl")) {
      std::fprintf(stderr, "gpu_update: nccl row skipped: it needs 2 CUDA devices, found 1\n");
    }
    a.nccl = false;
  }
  if (a.Row("peer")) PeerCopyLimit(a);
  if (a.Row("model")) Measure(a, a.scale, "model", /*tcp=*/false);
  if (a.Row("zerocopy")) {
    // The same model from a zero-copy publisher: no GPU arena, nothing copied on publish; its
    // tensors one cudaMalloc each, then packed into one (a caching-allocator segment), then in
    // 20 MiB cuMem chunks (expandable segments).
    Args zero = a;
    zero.zero_copy = true;
    Measure(zero, a.scale, "model", /*tcp=*/false);
    for (const char* memory : {"packed", "cumem"}) {
      zero.memory = memory;
      Measure(zero, a.scale, std::string("model_") + memory, /*tcp=*/false);
    }
  }
  if (a.Row("ring")) {
    // The same model through a ring of two 1 GiB buckets on the trainer's GPU: Publish only
    // hashes; each update streams the model through the ring (fill bucket b + 1 while copying b).
    // --ring-buckets / --ring-bytes try other rings (labelled by their shape).
    Args ring = a;
    ring.ring_buckets = ring_buckets > 0 ? ring_buckets : 2;
    ring.ring_bucket_bytes = ring_bytes > 0 ? ring_bytes : 1ull << 30;
    Measure(ring, a.scale,
            "model_ring_" + std::to_string(ring.ring_buckets) + "x" +
                std::to_string(ring.ring_bucket_bytes >> 20) + "MiB",
            /*tcp=*/false);
  }
  if (a.fp8 && a.Row("fp8")) Measure(a, a.scale, "model_fp8", /*tcp=*/false, Convert::kFp8);
  if (a.fp8 && a.Row("mxfp8")) Measure(a, a.scale, "model_mxfp8", /*tcp=*/false, Convert::kMxfp8);
  if (a.fp8 && a.Row("nvfp4")) Measure(a, a.scale, "model_nvfp4", /*tcp=*/false, Convert::kNvfp4);
  if (a.fp8 && a.Row("fp8dst")) {
    Measure(a, a.scale, "model_fp8_on_destination_gpu", /*tcp=*/false, Convert::kFp8,
            /*fp8_on_destination_gpu=*/true);
  }
  // Same tensors, 128 bytes each: host overhead of a step.
  if (a.Row("tiny")) Measure(a, 0, "tiny", /*tcp=*/false);
  if (a.nccl && a.Row("nccl")) Measure(a, a.scale, "model", /*tcp=*/true);
  if (a.nccl && a.Row("ncclzerocopy")) {
    // Over tcp a zero-copy publisher exports nothing: NCCL broadcasts its tensors themselves.
    Args zero = a;
    zero.zero_copy = true;
    Measure(zero, a.scale, "model", /*tcp=*/true);
  }
  if (a.nccl && a.Row("ncclring")) {
    // A ring publisher over tcp allocates no bucket: NCCL broadcasts from its tensors.
    Args ring = a;
    ring.ring_buckets = ring_buckets > 0 ? ring_buckets : 2;
    ring.ring_bucket_bytes = ring_bytes > 0 ? ring_bytes : 1ull << 30;
    Measure(ring, a.scale, "model_ring", /*tcp=*/true);
  }
  if (a.Row("many")) {
    // MoE-like: 100,000 expert tensors of 64 KiB (6.6 GB), the per-tensor cost of a step.
    Args many = a;
    many.many = 100000;
    Measure(many, a.scale, "many_100k", /*tcp=*/false);
  }
  if (a.Row("h2d")) {
    // A publisher of host tensors (shared memory) into the destination GPU: the copy engines read
    // the pinned arena.
    PinnedHostCopyLimit(a, /*to_device=*/true);
    Args host = a;
    host.host = true;
    Measure(host, a.h2d_scale, "model_from_host", /*tcp=*/false);
  }
  // The host <-> GPU rows through a ring of two 256 MiB buckets (host memory for a host
  // publisher, the trainer's GPU for a GPU one) instead of slots x the model; --ring-buckets /
  // --ring-bytes try others.
  auto ring_of = [&](Args r) {
    r.ring_buckets = ring_buckets > 0 ? ring_buckets : 2;
    r.ring_bucket_bytes = ring_bytes > 0 ? ring_bytes : 256ull << 20;
    return r;
  };
  auto ring_label = [](const Args& r) {
    return "_ring_" + std::to_string(r.ring_buckets) + "x" +
           std::to_string(r.ring_bucket_bytes >> 20) + "MiB";
  };
  if (a.Row("h2dring")) {
    Args host = ring_of(a);
    host.host = true;
    Measure(host, a.h2d_scale, "model_from_host" + ring_label(host), /*tcp=*/false);
  }
  if (a.Row("d2hring")) {
    Args host = ring_of(a);
    host.host_destinations = true;
    Measure(host, a.h2d_scale, "model_to_host" + ring_label(host), /*tcp=*/false);
  }
  if (a.Row("d2h")) {
    // A publisher of CUDA tensors (GPU arena on --src) into host destinations: the copy engines of
    // the arena's GPU write the pinned destinations.
    PinnedHostCopyLimit(a, /*to_device=*/false);
    Args host = a;
    host.host_destinations = true;
    Measure(host, a.h2d_scale, "model_to_host", /*tcp=*/false);
  }
  return 0;
}
