#include "testing/test_util.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

#include "util/hash.h"

extern char** environ;

namespace weightsync::testing {

std::string UniqueEndpoint(const std::string& stem) {
  static std::atomic<int> counter{0};
  return "local://" + stem + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(counter.fetch_add(1));
}

LogCapture::LogCapture() {
  util::SetLogSink([this](util::LogLevel level, std::string_view comp, std::string_view line) {
    static const char kL[] = {'D', 'I', 'W', 'E'};
    std::lock_guard<std::mutex> lock(mu_);
    lines_.push_back(std::string(1, kL[static_cast<int>(level)]) + " " + std::string(comp) + ": " +
                     std::string(line));
  });
}
LogCapture::~LogCapture() { util::SetLogSink(nullptr); }
std::vector<std::string> LogCapture::Lines() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lines_;
}
bool LogCapture::Contains(const std::string& needle) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& l : lines_) {
    if (l.find(needle) != std::string::npos) return true;
  }
  return false;
}

namespace {
constexpr DType kCycle[] = {DType::kBFloat16,     DType::kFloat32, DType::kFloat16, DType::kInt8,
                            DType::kFloat8E4M3FN, DType::kInt64,   DType::kBool,    DType::kUInt16};
}

SyntheticModel::SyntheticModel(int count, int64_t elements_per_tensor) {
  for (int i = 0; i < count; ++i) {
    DType dt = kCycle[i % 8];
    int64_t n = elements_per_tensor + (i * 37) % 97;  // uneven sizes exercise segment tails
    std::vector<int64_t> shape =
        (i % 3 == 0) ? std::vector<int64_t>{n} : std::vector<int64_t>{2, n};
    specs_.push_back({"layers." + std::to_string(i) + ".weight", dt, shape, 0});
    TensorView v{nullptr, dt, shape};
    specs_.back().nbytes = *v.NumBytes();
    storage_.emplace_back(specs_.back().nbytes);
  }
}

void SyntheticModel::Pattern(int tensor, int64_t step, uint8_t* out, uint64_t bytes) {
  uint64_t x = (uint64_t(tensor) << 32) ^ uint64_t(step) * 0x9E3779B97F4A7C15ull ^ 0xABCDEFull;
  uint64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;  // xorshift64
    std::memcpy(out + i, &x, 8);
  }
  for (; i < bytes; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = static_cast<uint8_t>(x);
  }
}

void SyntheticModel::Fill(int64_t step) {
  for (size_t i = 0; i < storage_.size(); ++i) {
    Pattern(static_cast<int>(i), step, storage_[i].data(), storage_[i].size());
  }
}

std::vector<NamedTensor> SyntheticModel::Tensors() {
  std::vector<NamedTensor> out;
  for (size_t i = 0; i < specs_.size(); ++i) {
    out.push_back(
        {specs_[i].name, TensorView{storage_[i].data(), specs_[i].dtype, specs_[i].shape}});
  }
  return out;
}

uint64_t SyntheticModel::total_bytes() const {
  uint64_t t = 0;
  for (const auto& s : specs_) t += s.nbytes;
  return t;
}

std::vector<std::vector<uint8_t>> SyntheticModel::PoisonedStorage(
    const std::vector<NamedTensor>& like) {
  std::vector<std::vector<uint8_t>> out;
  for (const auto& t : like) out.emplace_back(*t.view.NumBytes(), 0xFF);
  return out;
}

std::vector<NamedTensor> SyntheticModel::Views(const std::vector<NamedTensor>& like,
                                               std::vector<std::vector<uint8_t>>& storage) {
  std::vector<NamedTensor> out;
  for (size_t i = 0; i < like.size(); ++i) {
    out.push_back(
        {like[i].name, TensorView{storage[i].data(), like[i].view.dtype, like[i].view.shape}});
  }
  return out;
}

bool SyntheticModel::Holds(const std::vector<NamedTensor>& views, int64_t step, std::string* why) {
  std::vector<uint8_t> expect;
  for (size_t i = 0; i < views.size(); ++i) {
    uint64_t n = *views[i].view.NumBytes();
    expect.resize(n);
    // Tensor index comes from the name so subsets still compare against the right pattern.
    const std::string& name = views[i].name;
    int index = std::atoi(name.c_str() + name.find('.') + 1);
    Pattern(index, step, expect.data(), n);
    if (n && std::memcmp(expect.data(), views[i].view.data, n) != 0) {
      if (why) *why = "tensor '" + name + "' differs from step " + std::to_string(step);
      return false;
    }
  }
  return true;
}

std::unique_ptr<Subscriber> NewSubscriber(const SubscriberOptions& options,
                                          const std::vector<NamedTensor>& destinations) {
  auto s = Subscriber::Create(options);
  EXPECT_TRUE(s.ok()) << s.status();
  EXPECT_OK((*s)->Register(destinations));
  return std::move(s).value();
}

bool LedgerSettlesTo(const LedgerSnapshot& expected, LedgerSnapshot* last, int timeout_ms) {
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    *last = ReadLedger();
    if (last->SameLiveCounts(expected)) return true;
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool Eventually(const std::function<bool()>& holds, int timeout_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!holds()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

std::vector<uint64_t> Digests(const std::vector<NamedTensor>& views) {
  std::vector<uint64_t> out;
  for (const auto& v : views) out.push_back(util::Hash64(v.view.data, *v.view.NumBytes()));
  return out;
}

ChildProcess ChildProcess::Spawn(const std::vector<std::string>& argv,
                                 const std::vector<std::string>& env) {
  int to_child[2], from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return {};
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) envs.push_back(*e);
  for (const auto& e : env) envs.push_back(e);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : envs) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  ChildProcess c;
  int rc = posix_spawn(&c.pid_, argv[0].c_str(), &fa, nullptr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(to_child[0]);
  ::close(from_child[1]);
  if (rc != 0) {
    ADD_FAILURE() << "posix_spawn " << argv[0] << ": " << std::strerror(rc);
    ::close(to_child[1]);
    ::close(from_child[0]);
    c.pid_ = -1;
    return c;
  }
  c.in_ = to_child[1];
  c.out_ = from_child[0];
  return c;
}

ChildProcess::ChildProcess(ChildProcess&& o) noexcept { *this = std::move(o); }
ChildProcess& ChildProcess::operator=(ChildProcess&& o) noexcept {
  std::swap(pid_, o.pid_);
  std::swap(in_, o.in_);
  std::swap(out_, o.out_);
  std::swap(buffer_, o.buffer_);
  return *this;
}

ChildProcess::~ChildProcess() {
  if (in_ >= 0) ::close(in_);
  if (out_ >= 0) ::close(out_);
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

std::string ChildProcess::ReadLine(int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                    deadline - std::chrono::steady_clock::now())
                                    .count());
    if (left <= 0) return "";
    pollfd p{out_, POLLIN, 0};
    if (::poll(&p, 1, left) <= 0) continue;
    char buf[4096];
    ssize_t n = ::read(out_, buf, sizeof(buf));
    if (n <= 0) return "";
    buffer_.append(buf, n);
  }
}

std::string ChildProcess::Command(const std::string& line, int timeout_ms) {
  std::string l = line + "\n";
  if (::write(in_, l.data(), l.size()) != static_cast<ssize_t>(l.size())) return "";
  return ReadLine(timeout_ms);
}

void ChildProcess::Signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

bool ChildProcess::Stop() {
  if (pid_ <= 0 || ::kill(pid_, SIGSTOP) != 0) return false;
  int status = 0;
  return ::waitpid(pid_, &status, WUNTRACED) == pid_ && WIFSTOPPED(status);
}

int ChildProcess::Wait() {
  int status = 0;
  if (pid_ > 0) {
    // Interrupted by a signal (EINTR), waitpid returns no status: wait again, or a killed child
    // would read as one that exited 0.
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  pid_ = -1;
  return status;
}

std::string HelperPath(const std::string& name) {
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  return (self.parent_path() / ("ws_" + name)).string();
}

}  // namespace weightsync::testing
