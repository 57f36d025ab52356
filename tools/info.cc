// `weightsync info`: what this build and this machine can do, the data path table (which path
// moves the bytes of which link, store and destinations), and every environment knob with its
// type, default and current value (STYLE §6: knobs declared once, listed here). Secrets are
// shown as set or unset, never printed.
#include <cstdio>
#include <cstring>
#include <string>

#include "commands.h"
#include "cuda/device.h"
#include "cuda/launch_registry.h"
#include "cuda/nccl_api.h"
#include "cuda/nccl_link.h"
#include "delta/segment_delta.h"
#include "transport/path_table.h"
#include "transport/store/store_table.h"
#include "util/knobs.h"
#include "weightsync/dtype.h"
#include "wire/frame.h"

namespace weightsync::tools {

int RunInfo(int argc, char** argv) {
  if (argc > 0 && (!std::strcmp(argv[0], "--help") || !std::strcmp(argv[0], "-h"))) {
    std::printf(
        "usage: weightsync info\n\nPrints the protocol version, the transports this "
        "build and machine can use, and every WEIGHTSYNC_* environment knob.\n");
    return 0;
  }
  if (argc > 0) {
    std::fprintf(stderr, "weightsync info: takes no flags, got '%s'\n", argv[0]);
    return 2;
  }
  std::printf("weightsync: wire protocol %u, %d element types\n",
              static_cast<unsigned>(wire::kProtocolVersion), kDTypeCount);
  std::printf("transports:\n  shm       local://NAME   available\n");
  std::printf("  tcp       tcp://HOST:PORT available\n");
  Status cuda_status = cuda::CudaAvailable();
  if (cuda_status.ok()) {
    std::printf(
        "  cuda-ipc  local://NAME   available: %d CUDA device(s); %d scalar types and %d "
        "kernels ready for prepared launches\n",
        cuda::DeviceCount(), cuda::ReadyScalarTypeCount(), cuda::ReadyKernelCount());
  } else {
    std::printf("  cuda-ipc  local://NAME   unavailable: %s\n", cuda_status.message().c_str());
  }
  Status nccl = cuda::nccl::NcclAvailable();
  if (nccl.ok() && cuda_status.ok()) {
    std::printf("  nccl      tcp://HOST:PORT available: NCCL %s\n",
                cuda::nccl::NcclVersionString(cuda::nccl::NcclVersionCode()).c_str());
  } else {
    std::printf("  nccl      tcp://HOST:PORT unavailable: %s\n",
                (nccl.ok() ? cuda_status : nccl).message().c_str());
  }
  std::printf("data paths (first that serves a link, store and destinations wins):\n");
  for (const transport::PathEntry& path : transport::PathTable()) {
    std::printf("  %-12s %s\n", std::string(path.name).c_str(), std::string(path.moves).c_str());
  }
  std::printf("stores (a publisher's first Publish takes the first that holds its tensors):\n");
  for (const transport::store::StoreEntry& store : transport::store::StoreTable()) {
    std::printf("  %-12s %s\n", std::string(store.name).c_str(), std::string(store.holds).c_str());
  }
  // Where a step can travel as deltas, and what decides it (docs/deltas.md).
  std::printf(
      "deltas (docs/deltas.md): over tcp, from the host-arena store (registered host tensors), "
      "to host destinations and (tcp-to-gpu) CUDA ones; encoded after Publish returns; "
      "delta='auto' sends a segment as its delta when that is at most 1/%u of it. Not yet: shm, "
      "cuda-ipc, nccl, rings, regions, conversions into host memory\n",
      static_cast<unsigned>(delta::kAutoRoomDivisor));
  // What a subscriber can convert into (docs/quantized.md).
  std::printf(
      "conversions (convert_dtypes): casts among float32/float16/bfloat16; bfloat16 -> "
      "float8_e4m3fn with one float32 or e8m0 scale per 128x128 block; bfloat16/float32 -> MXFP8 "
      "(e8m0 per 32) and NVFP4 (e4m3 per 16 + float32 global), scales row-major or swizzled "
      "128x4, into host memory (docs/quantized.md)\n");
  std::printf("environment knobs (docs/env_vars.md):\n");
  for (const util::KnobInfo& k : util::AllKnobs()) {
    std::optional<std::string> v = util::KnobValue(k.knob);
    std::string shown = !v ? "unset" : k.secret ? "set (hidden)" : "'" + *v + "'";
    std::printf("  %-24s %s\n      type %s, default %s; now %s\n", std::string(k.name).c_str(),
                std::string(k.meaning).c_str(), std::string(k.type).c_str(),
                k.default_value.empty() ? "unset" : std::string(k.default_value).c_str(),
                shown.c_str());
  }
  Result<util::KnobLogLevel> level = util::LogLevelKnob();
  if (!level.ok()) {
    std::printf("problem: %s\n", level.status().message().c_str());
    return 1;
  }
  return 0;
}

}  // namespace weightsync::tools
