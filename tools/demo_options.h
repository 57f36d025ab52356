// The demo's flags and the synthetic model they select, shared by the launcher and the two
// processes it starts (which receive the resolved values as flags).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model_presets.h"
#include "weightsync/manifest.h"
#include "weightsync/options.h"
#include "weightsync/status.h"

namespace weightsync::tools {

class CommandLine;  // command_line.h: keeps CLI11 out of the demo processes' sources

struct DemoOptions {
  std::string model = "qwen2.5-0.5b";
  std::string scale = "auto";
  int64_t steps = 20;
  std::string dtype = "bf16";
  std::string mode = "staged";
  bool verify = true;
  int64_t copy_threads = 0;
  int64_t slots = 2;
  int64_t timeout_ms = 60000;
  std::string progress = "auto";
  std::string endpoint;  // empty: local://weightsync-demo-<launcher pid>
  // Where each side's tensors live: cpu | cuda | cuda:N. The per-side flags override --device.
  std::string device = "cpu";
  std::string publisher_device;   // empty: --device
  std::string subscriber_device;  // empty: --device
  // Set by the launcher for the processes it starts.
  std::string role;
  int64_t notify_fd = -1;  // publisher → subscriber: PublishedMessage
  int64_t ack_fd = -1;     // subscriber → publisher: DoneMessage
};

void DeclareDemoFlags(CommandLine* flags, DemoOptions* options);

// Checks the values that do not need the model (steps, mode, progress, role, fds).
Status ValidateDemoOptions(const DemoOptions& options);

struct DemoModel {
  ArchConfig config;
  double scale = 1;
  DType dtype = DType::kBFloat16;
  std::vector<TensorSpec> tensors;
  uint64_t bytes = 0;
  uint64_t largest = 0;  // index of the largest tensor
};

// Builds the model for `options.scale`, which must be a number (the processes' case).
Result<DemoModel> BuildDemoModel(const DemoOptions& options);
// Resolves --scale auto against MemAvailable and checks that an explicit scale fits.
Result<DemoModel> ResolveDemoModel(const DemoOptions& options, std::string* note);

// Host bytes held at once across both processes: the trainer's tensors, the arena slots, the
// subscriber's destinations and (staged) its shadow buffer, less what lives on a GPU.
uint64_t DemoMemoryNeed(const DemoOptions& options, uint64_t model_bytes);

UpdateMode ParseMode(const std::string& mode);  // valid after ValidateDemoOptions

// The device text each side uses once the per-side flags have been applied.
std::string PublisherDeviceText(const DemoOptions& options);
std::string SubscriberDeviceText(const DemoOptions& options);

}  // namespace weightsync::tools
