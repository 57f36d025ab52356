// weightsync demo: launches a publisher process and a subscriber process (this executable again,
// with a hidden --role), connects them with two pipes for lockstep, and reports both exit codes.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "command_line.h"
#include "commands.h"
#include "demo_options.h"
#include "demo_roles.h"
#include "harness/byte_units.h"
#include "weightsync/cuda.h"
#include "weightsync/tensor_view.h"

namespace weightsync::tools {
namespace {

constexpr char kSummary[] =
    "Starts a publisher process and a subscriber process on a shared-memory endpoint. The\n"
    "publisher holds a synthetic model whose tensor names and shapes follow the chosen\n"
    "architecture; every step it rewrites every weight with a deterministic pattern of\n"
    "(tensor, step) and publishes. The subscriber updates to each step (Update(step), verify on)\n"
    "and then checks every tensor against the xxHash3 of the bytes it must hold, recomputed\n"
    "independently. It prints one line per step and a summary: first (preparing) update vs\n"
    "steady-state median, heap allocations per steady-state step, RSS. Exit code 0 only if every\n"
    "step verified. See docs/demo.md.";

struct Child {
  pid_t pid = -1;
  int status = 0;
  bool done = false;
  const char* name = "";
};

// Starts this executable with `args`, keeping `keep_fds` open across exec.
Result<pid_t> Spawn(const std::vector<std::string>& args, std::initializer_list<int> keep_fds) {
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(self.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno(errno, "fork");
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    for (int fd : keep_fds) ::fcntl(fd, F_SETFD, 0);
    ::execv(self.c_str(), argv.data());
    ::_exit(127);
  }
  return pid;
}

std::string ExitText(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

bool Succeeded(const Child& c) { return WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0; }

// Waits for both; if one fails, the other gets `grace` to notice (it will, through its pipe)
// before it is killed.
void WaitBoth(Child* a, Child* b, std::chrono::seconds grace) {
  Child* children[] = {a, b};
  std::chrono::steady_clock::time_point failed_at{};
  bool any_failed = false;
  while (!a->done || !b->done) {
    for (Child* c : children) {
      if (c->done) continue;
      pid_t r = ::waitpid(c->pid, &c->status, WNOHANG);
      if (r == c->pid) {
        c->done = true;
        if (!Succeeded(*c) && !any_failed) {
          any_failed = true;
          failed_at = std::chrono::steady_clock::now();
        }
      }
    }
    if (any_failed && std::chrono::steady_clock::now() - failed_at > grace) {
      for (Child* c : children) {
        if (!c->done) {
          std::fprintf(stderr, "demo: %s still running %llds after its peer failed; killing it\n",
                       c->name, static_cast<long long>(grace.count()));
          ::kill(c->pid, SIGKILL);
          ::waitpid(c->pid, &c->status, 0);
          c->done = true;
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::vector<std::string> RoleArgs(const DemoOptions& o, const DemoModel& model,
                                  const std::string& role, int notify_fd, int ack_fd) {
  char scale[32];
  std::snprintf(scale, sizeof(scale), "%.17g", model.scale);
  return {"demo",
          "--role=" + role,
          "--model=" + o.model,
          std::string("--scale=") + scale,
          "--steps=" + std::to_string(o.steps),
          "--dtype=" + o.dtype,
          "--mode=" + o.mode,
          std::string("--verify=") + (o.verify ? "true" : "false"),
          "--copy-threads=" + std::to_string(o.copy_threads),
          "--slots=" + std::to_string(o.slots),
          "--timeout-ms=" + std::to_string(o.timeout_ms),
          "--progress=" + o.progress,
          "--endpoint=" + o.endpoint,
          "--publisher-device=" + PublisherDeviceText(o),
          "--subscriber-device=" + SubscriberDeviceText(o),
          "--notify-fd=" + std::to_string(notify_fd),
          "--ack-fd=" + std::to_string(ack_fd)};
}

int Launch(DemoOptions o) {
  std::string note;
  Result<DemoModel> model = ResolveDemoModel(o, &note);
  if (!model.ok()) {
    std::fprintf(stderr, "weightsync demo: %s\n", model.status().ToString().c_str());
    return 2;
  }
  const std::string publisher_device = PublisherDeviceText(o);
  const std::string subscriber_device = SubscriberDeviceText(o);
  if (publisher_device != "cpu" || subscriber_device != "cpu") {
    // Said once, here, rather than by both processes as they fail.
    if (Status cuda = CudaStatus(); !cuda.ok()) {
      std::fprintf(stderr, "weightsync demo: --publisher-device=%s --subscriber-device=%s: %s\n",
                   publisher_device.c_str(), subscriber_device.c_str(), cuda.ToString().c_str());
      return 2;
    }
  }
  if (o.endpoint.empty()) o.endpoint = "local://weightsync-demo-" + std::to_string(::getpid());
  const TensorSpec& largest = model->tensors[model->largest];
  std::printf("weightsync demo: a publisher process and a subscriber process on %s\n",
              o.endpoint.c_str());
  std::printf("  devices trainer tensors on %s, engine destinations on %s (%s)\n",
              publisher_device.c_str(), subscriber_device.c_str(),
              publisher_device == "cpu" && subscriber_device == "cpu"
                  ? "shared memory"
                  : "the path table picks the GPU data path");
  std::printf("  model   %s (%s), scale %g: %s\n", model->config.name.c_str(),
              model->config.source.c_str(), model->scale, Describe(model->config).c_str());
  std::printf("          %zu tensors, %s as %s; largest %s %s\n", model->tensors.size(),
              bench::FormatBytes(model->bytes).c_str(),
              std::string(DTypeName(model->dtype)).c_str(), largest.name.c_str(),
              ShapeString(largest.shape).c_str());
  if (!note.empty()) std::printf("          %s\n", note.c_str());
  std::printf(
      "  run     %lld steps, %s updates, verify %s; the publisher publishes step k+1 "
      "after the subscriber holds step k\n",
      static_cast<long long>(o.steps), o.mode.c_str(), o.verify ? "on" : "off");
  std::printf(
      "  memory  about %s of host memory across both processes (trainer tensors, %lld arena "
      "slots, destinations%s)\n\n",
      bench::FormatBytes(DemoMemoryNeed(o, model->bytes)).c_str(), static_cast<long long>(o.slots),
      o.mode == "staged" ? ", shadow" : "");

  int notify[2], ack[2];
  if (::pipe2(notify, O_CLOEXEC) != 0 || ::pipe2(ack, O_CLOEXEC) != 0) {
    std::perror("weightsync demo: pipe");
    return 1;
  }
  Child publisher{.name = "publisher"}, subscriber{.name = "subscriber"};
  Result<pid_t> p = Spawn(RoleArgs(o, *model, "publisher", notify[1], ack[0]), {notify[1], ack[0]});
  Result<pid_t> s =
      p.ok() ? Spawn(RoleArgs(o, *model, "subscriber", notify[0], ack[1]), {notify[0], ack[1]}) : p;
  // The children hold their ends now; closing ours makes a child's exit visible as EOF.
  for (int fd : {notify[0], notify[1], ack[0], ack[1]}) ::close(fd);
  if (!p.ok() || !s.ok()) {
    std::fprintf(stderr, "weightsync demo: %s\n", (p.ok() ? s : p).status().ToString().c_str());
    if (p.ok()) {
      ::kill(*p, SIGKILL);
      ::waitpid(*p, nullptr, 0);
    }
    return 1;
  }
  publisher.pid = *p;
  subscriber.pid = *s;
  WaitBoth(&publisher, &subscriber, std::chrono::seconds(10));
  if (Succeeded(publisher) && Succeeded(subscriber)) {
    std::printf("demo: PASS (publisher and subscriber exited 0)\n");
    return 0;
  }
  std::printf("demo: FAILED (publisher %s, subscriber %s)\n", ExitText(publisher.status).c_str(),
              ExitText(subscriber.status).c_str());
  return 1;
}

}  // namespace

int RunDemo(int argc, char** argv) {
  DemoOptions options;
  CommandLine flags("weightsync demo [flags]", kSummary);
  DeclareDemoFlags(&flags, &options);
  Status s = flags.Parse(argc, argv);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  if (s.ok()) s = ValidateDemoOptions(options);
  if (!s.ok()) {
    std::fprintf(stderr, "weightsync demo: %s\n", s.ToString().c_str());
    return 2;
  }
  // A peer that exits must surface as EPIPE/EOF, not kill the writer.
  ::signal(SIGPIPE, SIG_IGN);
  if (options.role == "publisher") return RunDemoPublisher(options);
  if (options.role == "subscriber") return RunDemoSubscriber(options);
  return Launch(std::move(options));
}

}  // namespace weightsync::tools
