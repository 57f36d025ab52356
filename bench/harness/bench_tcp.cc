// The tcp transport on loopback against the plainest way to move the same bytes through the same
// kernel path: one thread writes every tensor into a connected TCP socket, another reads them into
// the destination buffers.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <thread>
#include <vector>

#include "harness/bench_figures.h"
#include "harness/bench_pair.h"
#include "harness/byte_units.h"
#include "harness/sample_stats.h"

namespace weightsync::bench {
namespace {

// A connected pair of loopback TCP sockets.
Status SocketPair(int* sender, int* receiver) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Status::FromErrno(errno, "baseline listener");
  }
  *sender = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(*sender, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    return Status::FromErrno(errno, "baseline connect");
  }
  *receiver = ::accept(listener, nullptr, nullptr);
  ::close(listener);
  int one = 1;
  ::setsockopt(*sender, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return *receiver >= 0 ? Status::Ok() : Status::FromErrno(errno, "baseline accept");
}

void SendAll(int fd, const TensorStorage& from) {
  for (size_t i = 0; i < from.size(); ++i) {
    const uint8_t* p = from.data(i);
    uint64_t left = from.bytes(i);
    while (left > 0) {
      ssize_t n = ::send(fd, p, left, MSG_NOSIGNAL);
      if (n <= 0) return;
      p += n;
      left -= n;
    }
  }
}

bool ReceiveAll(int fd, TensorStorage& to) {
  for (size_t i = 0; i < to.size(); ++i) {
    uint8_t* p = to.data(i);
    uint64_t left = to.bytes(i);
    while (left > 0) {
      ssize_t n = ::recv(fd, p, left, 0);
      if (n <= 0) return false;
      p += n;
      left -= n;
    }
  }
  return true;
}

}  // namespace

Status MeasureTcpThroughput(const BenchOptions& o, BenchReport* report) {
  const std::vector<TensorSpec> tensors = UniformTensors(o.tensors, o.bytes / o.tensors);
  WS_ASSIGN_OR_RETURN(
      auto pair, BenchPair::Create(tensors, static_cast<int>(o.copy_threads), "tcp://127.0.0.1:0"));
  const uint64_t bytes = pair->bytes();
  const std::string model = FormatBytes(bytes) + " in " + std::to_string(o.tensors) + " tensors";

  int sender = -1, receiver = -1;
  WS_RETURN_IF_ERROR(SocketPair(&sender, &receiver));
  std::vector<double> plain_seconds;
  for (int64_t i = 0; i <= o.throughput_steps; ++i) {
    auto t0 = BenchClock::now();
    std::thread send([&] { SendAll(sender, pair->source()); });
    bool ok = ReceiveAll(receiver, pair->destination());
    send.join();
    if (!ok) return Status::IoError("baseline socket copy failed");
    if (i > 0) plain_seconds.push_back(SecondsSince(t0));
  }
  ::close(sender);
  ::close(receiver);
  const double plain_gbps = bytes / Median(plain_seconds) / 1e9;

  struct Mode {
    const char* id;
    UpdateMode mode;
  } modes[] = {{"in_place", UpdateMode::kInPlace}, {"staged", UpdateMode::kStaged}};
  for (const Mode& m : modes) {
    WS_ASSIGN_OR_RETURN(auto subscriber, pair->NewSubscriber(m.mode, /*verify=*/false));
    std::vector<double> seconds;
    const int64_t warmup = 2;
    for (int64_t i = 0; i < warmup + o.throughput_steps; ++i) {
      WS_ASSIGN_OR_RETURN(int64_t step, pair->PublishNext());
      WS_ASSIGN_OR_RETURN(UpdateStats stats, subscriber->Update(step));
      if (i >= warmup) seconds.push_back(stats.seconds);
    }
    const double gbps = bytes / Median(seconds) / 1e9;
    const double ratio = gbps / plain_gbps;
    report->figures.push_back(
        {"tcp_update_gbps_" + std::string(m.id), "tcp update on loopback, " + std::string(m.id),
         gbps, "GB/s", "plain socket copy", plain_gbps, "GB/s", ratio, "x socket",
         std::string(m.mode == UpdateMode::kInPlace ? ">= 0.8x" : ""),
         m.mode == UpdateMode::kInPlace ? std::optional<bool>(ratio >= 0.8) : std::nullopt,
         model + ": bytes / median Subscriber::Update() over tcp://127.0.0.1 (authenticated "
                 "session, no verify) vs two threads send()/recv() of the same tensors"});
    WS_RETURN_IF_ERROR(subscriber->Close());
  }
  return pair->publisher().Close();
}

}  // namespace weightsync::bench
