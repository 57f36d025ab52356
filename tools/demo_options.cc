#include "demo_options.h"

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "command_line.h"
#include "demo_tensors.h"
#include "harness/byte_units.h"
#include "harness/proc_stats.h"
#include "harness/tensor_storage.h"

namespace weightsync::tools {

void DeclareDemoFlags(CommandLine* f, DemoOptions* o) {
  f->String("model", &o->model, "architecture preset: " + PresetNames());
  f->String("scale", &o->scale,
            "parameter-count factor: layers × F (shapes unchanged); below one layer the\n"
            "widths shrink too. 'auto': 1, or less if the model would not fit in memory");
  f->Int("steps", &o->steps, "steps to publish and update");
  f->String("dtype", &o->dtype, "dtype of every tensor (bf16, fp16, fp32, fp8_e4m3fn, ...)");
  f->String("mode", &o->mode, "subscriber update mode: staged | in_place");
  f->Bool("verify", &o->verify, "verify each update against the publisher's xxHash3 digests");
  f->Int("copy-threads", &o->copy_threads, "copy threads on each side; 0: library default");
  f->Int("slots", &o->slots, "versions the publisher's arena holds at once");
  f->Int("timeout-ms", &o->timeout_ms, "deadline of each update and of each wait between steps");
  f->String("progress", &o->progress,
            "progress bar on stderr: auto (if a terminal) | always | never");
  f->String("endpoint", &o->endpoint, "endpoint to serve (default local://weightsync-demo-<pid>)");
  f->String("device", &o->device,
            "where both sides' tensors live: cpu | cuda | cuda:N (the path table picks the\n"
            "data path: shm, host-to-gpu, gpu-to-host or cuda-ipc)");
  f->String("publisher-device", &o->publisher_device, "the trainer's tensors (default --device)");
  f->String("subscriber-device", &o->subscriber_device,
            "the engine's destinations (default --device)");
  // Hidden (CLI11's empty group): what the launcher passes to the processes it starts.
  f->String("role", &o->role, "internal: publisher | subscriber")->group("");
  f->Int("notify-fd", &o->notify_fd, "internal")->group("");
  f->Int("ack-fd", &o->ack_fd, "internal")->group("");
}

Status ValidateDemoOptions(const DemoOptions& o) {
  if (o.steps < 1 || o.steps > 1000000) {
    return Status::InvalidArgument("--steps=", o.steps, ": must be 1..1000000");
  }
  if (o.mode != "staged" && o.mode != "in_place") {
    return Status::InvalidArgument("--mode=", o.mode, ": expected staged or in_place");
  }
  if (o.progress != "auto" && o.progress != "always" && o.progress != "never") {
    return Status::InvalidArgument("--progress=", o.progress, ": expected auto, always or never");
  }
  if (o.timeout_ms < 1) return Status::InvalidArgument("--timeout-ms must be ≥ 1");
  if (o.copy_threads < 0) return Status::InvalidArgument("--copy-threads must be ≥ 0");
  for (const auto& [flag, text] : {std::pair<const char*, std::string>{"device", o.device},
                                   {"publisher-device", PublisherDeviceText(o)},
                                   {"subscriber-device", SubscriberDeviceText(o)}}) {
    WS_RETURN_IF_ERROR(ParseDemoDevice(flag, text).status());
  }
  if (!o.role.empty() && o.role != "publisher" && o.role != "subscriber") {
    return Status::InvalidArgument("--role=", o.role, ": expected publisher or subscriber");
  }
  if (!o.role.empty() && (o.notify_fd < 0 || o.ack_fd < 0)) {
    return Status::InvalidArgument("--role=", o.role, " needs --notify-fd and --ack-fd");
  }
  return Status::Ok();
}

UpdateMode ParseMode(const std::string& mode) {
  return mode == "in_place" ? UpdateMode::kInPlace : UpdateMode::kStaged;
}

std::string PublisherDeviceText(const DemoOptions& o) {
  return o.publisher_device.empty() ? o.device : o.publisher_device;
}

std::string SubscriberDeviceText(const DemoOptions& o) {
  return o.subscriber_device.empty() ? o.device : o.subscriber_device;
}

uint64_t DemoMemoryNeed(const DemoOptions& o, uint64_t bytes) {
  // Each side keeps one host copy (its tensors, or the host side of CUDA tensors); the arena
  // slots live with a CPU publisher's tensors and the shadow with a CPU subscriber's (on a GPU
  // they take device memory instead).
  const bool publisher_cpu = PublisherDeviceText(o) == "cpu";
  const bool subscriber_cpu = SubscriberDeviceText(o) == "cpu";
  uint64_t copies = 2 + (publisher_cpu ? static_cast<uint64_t>(o.slots) : 0) +
                    (subscriber_cpu && o.mode == "staged" ? 1 : 0);
  return copies * bytes;
}

namespace {

Result<DemoModel> BuildAt(const DemoOptions& o, double scale) {
  DemoModel m;
  WS_ASSIGN_OR_RETURN(ArchConfig base, FindPreset(o.model));
  WS_ASSIGN_OR_RETURN(m.config, ScaleConfig(base, scale));
  WS_ASSIGN_OR_RETURN(m.dtype, DTypeFromName(o.dtype));
  WS_ASSIGN_OR_RETURN(m.tensors, BuildTensors(m.config, m.dtype));
  m.scale = scale;
  m.bytes = bench::TotalBytes(m.tensors);
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    if (m.tensors[i].nbytes > m.tensors[m.largest].nbytes) m.largest = i;
  }
  return m;
}

Result<double> ParseScale(const std::string& text) {
  char* end = nullptr;
  double s = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(s > 0)) {
    return Status::InvalidArgument("--scale=", text, ": expected a positive number or 'auto'");
  }
  return s;
}

}  // namespace

Result<DemoModel> BuildDemoModel(const DemoOptions& o) {
  WS_ASSIGN_OR_RETURN(double scale, ParseScale(o.scale));
  return BuildAt(o, scale);
}

Result<DemoModel> ResolveDemoModel(const DemoOptions& o, std::string* note) {
  const uint64_t available = bench::MemAvailableBytes();
  // Leave room for the rest of the machine (and the page cache the shm arena lives in).
  const uint64_t budget = available * 6 / 10;
  if (o.scale != "auto") {
    WS_ASSIGN_OR_RETURN(DemoModel m, BuildDemoModel(o));
    uint64_t need = DemoMemoryNeed(o, m.bytes);
    if (available > 0 && need > available * 9 / 10) {
      return Status::ResourceExhausted("--model=", o.model, " --scale=", o.scale, ": needs about ",
                                       bench::FormatBytes(need), " across both processes but only ",
                                       bench::FormatBytes(available),
                                       " is available; pass a smaller --scale");
    }
    return m;
  }
  WS_ASSIGN_OR_RETURN(DemoModel full, BuildAt(o, 1.0));
  if (available == 0 || DemoMemoryNeed(o, full.bytes) <= budget) return full;
  // Largest scale (two significant digits) whose model fits the budget.
  double scale = static_cast<double>(budget) / DemoMemoryNeed(o, full.bytes);
  while (true) {
    double rounded = std::floor(scale * std::pow(10, 1 - std::floor(std::log10(scale)))) /
                     std::pow(10, 1 - std::floor(std::log10(scale)));
    WS_ASSIGN_OR_RETURN(DemoModel m, BuildAt(o, rounded));
    if (DemoMemoryNeed(o, m.bytes) <= budget || rounded < 1e-4) {
      std::ostringstream os;
      os << "scale auto → " << rounded << ": the full model (" << bench::FormatBytes(full.bytes)
         << ") would need about " << bench::FormatBytes(DemoMemoryNeed(o, full.bytes))
         << " across both processes; " << bench::FormatBytes(available) << " is available";
      *note = os.str();
      return m;
    }
    scale = rounded * 0.9;
  }
}

}  // namespace weightsync::tools
