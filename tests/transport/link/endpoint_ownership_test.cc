// Who owns a local:// endpoint: exactly one live publisher, decided atomically. Two publishers
// starting over a stale socket never both succeed, a publisher that failed to start (or closed)
// never removes a live one's socket, and a crashed publisher's leftovers never block its
// successor.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "testing/test_util.h"
#include "transport/link/endpoint.h"
#include "util/fail_point.h"
#include "util/unique_fd.h"

namespace weightsync {
namespace {

using testing::SyntheticModel;
using util::FailAction;
using util::FailPoints;

constexpr auto kTimeout = std::chrono::milliseconds(testing::kUnderSanitizer ? 10000 : 2000);

transport::link::Endpoint Resolve(const std::string& endpoint) {
  auto ep = transport::link::ParseEndpoint(endpoint);
  EXPECT_TRUE(ep.ok()) << ep.status();
  return *ep;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// A Unix socket bound at `path`, listening when `listen` is true.
util::UniqueFd BindUnix(const std::string& path, bool listen) {
  util::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_TRUE(fd.valid()) << std::strerror(errno);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
      << path << ": " << std::strerror(errno);
  if (listen) {
    EXPECT_EQ(::listen(fd.get(), 8), 0) << std::strerror(errno);
  }
  return fd;
}

// What a publisher that crashed leaves: a socket file nobody listens on.
void MakeStaleSocket(const transport::link::Endpoint& ep) {
  ASSERT_OK(transport::link::EnsureSocketDir(ep));
  BindUnix(ep.socket_path, /*listen=*/false);  // closed without unlinking
  ASSERT_TRUE(Exists(ep.socket_path));
}

Result<std::unique_ptr<Publisher>> CreatePublisher(const std::string& endpoint) {
  PublisherOptions o;
  o.endpoint = endpoint;
  o.timeout = kTimeout;
  return Publisher::Create(o);
}

void ExpectAlreadyServed(const Status& s, const transport::link::Endpoint& ep) {
  ASSERT_STATUS_IS(kAlreadyExists, s,
                   "endpoint " + ep.ToString() + " is already served by a live publisher (" +
                       ep.socket_path + ")");
}

// A tiny model served by one publisher, checked through fresh subscribers.
class TinyModel {
 public:
  void Serve(Publisher* publisher, int64_t step) {
    ASSERT_OK(publisher->Register(model_.Tensors()));
    model_.Fill(step);
    auto r = publisher->Publish(step);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  // A new subscriber connects to `endpoint` and receives `step` bit for bit.
  void ExpectReceives(const std::string& endpoint, int64_t step) {
    auto like = model_.Tensors();
    auto storage = SyntheticModel::PoisonedStorage(like);
    auto dst = SyntheticModel::Views(like, storage);
    SubscriberOptions o;
    o.endpoint = endpoint;
    o.timeout = kTimeout;
    auto sub = Subscriber::Create(o);
    ASSERT_TRUE(sub.ok()) << sub.status();
    ASSERT_OK((*sub)->Register(dst));
    auto stats = (*sub)->Update(step);
    ASSERT_TRUE(stats.ok()) << stats.status();
    std::string why;
    EXPECT_TRUE(SyntheticModel::Holds(dst, step, &why)) << why;
  }

 private:
  SyntheticModel model_{1, 16};
};

TEST(EndpointOwnership, TwoPublishersRacingOverAStaleSocketExactlyOneWins) {
  const LedgerSnapshot baseline = ReadLedger();
  testing::LogCapture logs;
  TinyModel model;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) {
    SCOPED_TRACE("attempt " + std::to_string(i));
    const std::string endpoint = testing::UniqueEndpoint("race");
    const transport::link::Endpoint ep = Resolve(endpoint);
    ASSERT_NO_FATAL_FAILURE(MakeStaleSocket(ep));

    Result<std::unique_ptr<Publisher>> results[2] = {Status::Internal("not run"),
                                                     Status::Internal("not run")};
    std::atomic<int> waiting{0};
    std::atomic<bool> go{false};
    std::thread racers[2];
    for (int k = 0; k < 2; ++k) {
      racers[k] = std::thread([&, k] {
        waiting.fetch_add(1);
        while (!go.load()) std::this_thread::yield();
        results[k] = CreatePublisher(endpoint);
      });
    }
    while (waiting.load() < 2) std::this_thread::yield();
    go.store(true);
    for (auto& t : racers) t.join();

    const int winners = results[0].ok() + results[1].ok();
    ASSERT_EQ(winners, 1) << "two publishers both own " << endpoint;
    const int winner = results[0].ok() ? 0 : 1;
    ASSERT_NO_FATAL_FAILURE(ExpectAlreadyServed(results[1 - winner].status(), ep));
    results[1 - winner] = Status::Internal("destroyed");  // the loser's cleanup has run

    std::unique_ptr<Publisher> survivor = std::move(results[winner]).value();
    ASSERT_NO_FATAL_FAILURE(model.Serve(survivor.get(), 1));
    ASSERT_NO_FATAL_FAILURE(model.ExpectReceives(endpoint, 1));
    ASSERT_OK(survivor->Close());
    survivor.reset();
    EXPECT_FALSE(Exists(ep.socket_path)) << ep.socket_path << " left behind";
    EXPECT_FALSE(Exists(ep.lock_path)) << ep.lock_path << " left behind";
  }
  const auto elapsed =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  // About 3 ms an attempt. A Close() that waited out the accept loop's 50 ms poll slice instead
  // of waking it would take 10 s.
  if (!testing::kUnderSanitizer) {
    EXPECT_LT(elapsed.count(), 8000) << "200 attempts, slowly";
  }
  for (const std::string& line : logs.Lines()) {
    EXPECT_NE(line.rfind("W ", 0), 0u) << "a clean start/close warned: " << line;
  }
  LedgerSnapshot last;
  EXPECT_TRUE(testing::LedgerSettlesTo(baseline, &last))
      << "ledger " << last.ToString() << " vs baseline " << baseline.ToString();
}

TEST(EndpointOwnership, FailedPublisherNeverRemovesTheLiveOnesSocket) {
  const std::string endpoint = testing::UniqueEndpoint("owner");
  const transport::link::Endpoint ep = Resolve(endpoint);
  TinyModel model;
  auto a = CreatePublisher(endpoint);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_NO_FATAL_FAILURE(model.Serve(a->get(), 1));
  {
    auto b = CreatePublisher(endpoint);
    ASSERT_NO_FATAL_FAILURE(ExpectAlreadyServed(b.status(), ep));
  }  // whatever B built is destroyed here
  EXPECT_TRUE(Exists(ep.socket_path));
  ASSERT_NO_FATAL_FAILURE(model.ExpectReceives(endpoint, 1));
  ASSERT_OK((*a)->Close());
}

// Close() removes its socket file before it gives up the endpoint's lock, never after: a successor
// can take the endpoint only once the old socket is gone, so the old publisher's unlink can never
// remove the successor's socket (which would leave it alive, holding the lock, unreachable).
// The fail point holds A's Close just before its unlink while B tries to take the endpoint.
TEST(EndpointOwnership, ASuccessorTakingTheEndpointDuringACloseStaysReachable) {
  FailPoints::DisarmAll();
  const std::string endpoint = testing::UniqueEndpoint("handover");
  const transport::link::Endpoint ep = Resolve(endpoint);
  TinyModel model;
  auto a = CreatePublisher(endpoint);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_NO_FATAL_FAILURE(model.Serve(a->get(), 1));
  FailPoints::Arm("shm.server.before_unlink", FailAction::kSleep, 400, 1);
  std::thread closer([&] { EXPECT_OK((*a)->Close()); });
  while (FailPoints::Hits("shm.server.before_unlink") == 0) std::this_thread::yield();
  // A is inside its Close: B keeps trying until the endpoint is free.
  std::unique_ptr<Publisher> b;
  const auto give_up = std::chrono::steady_clock::now() + kTimeout;
  while (!b) {
    auto created = CreatePublisher(endpoint);
    if (created.ok()) {
      b = std::move(created).value();
    } else {
      ASSERT_NO_FATAL_FAILURE(ExpectAlreadyServed(created.status(), ep));
      ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "the endpoint never came free";
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  closer.join();
  EXPECT_EQ(FailPoints::Hits("shm.server.before_unlink"), 1) << "the close never paused";
  FailPoints::DisarmAll();
  ASSERT_TRUE(Exists(ep.socket_path)) << "A's close removed B's socket";
  ASSERT_NO_FATAL_FAILURE(model.Serve(b.get(), 2));
  ASSERT_NO_FATAL_FAILURE(model.ExpectReceives(endpoint, 2));
  ASSERT_OK(b->Close());
}

// A live publisher of a build that predates the lock file holds the socket but no lock: the
// socket answering is proof enough that the endpoint is served.
TEST(EndpointOwnership, ListeningSocketWithoutLockIsLiveNotStale) {
  const std::string endpoint = testing::UniqueEndpoint("legacy");
  const transport::link::Endpoint ep = Resolve(endpoint);
  ASSERT_OK(transport::link::EnsureSocketDir(ep));
  util::UniqueFd legacy = BindUnix(ep.socket_path, /*listen=*/true);
  auto p = CreatePublisher(endpoint);
  ASSERT_NO_FATAL_FAILURE(ExpectAlreadyServed(p.status(), ep));
  struct stat st;
  ASSERT_EQ(::lstat(ep.socket_path.c_str(), &st), 0) << "the live socket was removed";
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  // Still the same socket: a client reaches the legacy listener.
  util::UniqueFd client(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, ep.socket_path.c_str(), sizeof(addr.sun_path) - 1);
  EXPECT_EQ(::connect(client.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
      << std::strerror(errno);
  ::unlink(ep.socket_path.c_str());
}

TEST(EndpointOwnership, CrashedPublisherLeavesNothingThatBlocksItsSuccessor) {
  const std::string endpoint = testing::UniqueEndpoint("crash");
  const transport::link::Endpoint ep = Resolve(endpoint);
  auto child =
      testing::ChildProcess::Spawn({testing::HelperPath("publisher"), endpoint, "1", "16"});
  ASSERT_EQ(child.ReadLine(), "ready " + endpoint);
  child.Signal(SIGKILL);
  const int status = child.Wait();
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "publisher not killed";
  // The kill left both files; only the flock died with the process.
  ASSERT_TRUE(Exists(ep.socket_path));
  ASSERT_TRUE(Exists(ep.lock_path));

  testing::LogCapture logs;
  TinyModel model;
  auto p = CreatePublisher(endpoint);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(logs.Contains("replacing stale socket " + ep.socket_path));
  ASSERT_NO_FATAL_FAILURE(model.Serve(p->get(), 1));
  ASSERT_NO_FATAL_FAILURE(model.ExpectReceives(endpoint, 1));
  ASSERT_OK((*p)->Close());
  EXPECT_FALSE(Exists(ep.socket_path));
  EXPECT_FALSE(Exists(ep.lock_path));
}

// The lock-file race: B opens the lock file of A, A closes (unlinking it) and C takes the endpoint
// with a new lock file, then B's flock succeeds on the unlinked file. B must notice the path now
// names another file and defer to C. C is caught between its lock and its bind, so no listening
// socket gives it away: only the lock says the endpoint is taken.
TEST(EndpointOwnership, LockOnAnUnlinkedLockFileIsNotOwnership) {
  const std::string endpoint = testing::UniqueEndpoint("relock");
  const transport::link::Endpoint ep = Resolve(endpoint);
  FailPoints::DisarmAll();
  auto a = CreatePublisher(endpoint);
  ASSERT_TRUE(a.ok()) << a.status();

  const int64_t pause_ms = testing::kUnderSanitizer ? 3000 : 500;
  FailPoints::Arm("shm.lock_file_opened", FailAction::kSleep, pause_ms, /*count=*/1);
  Result<std::unique_ptr<Publisher>> b = Status::Internal("not run");
  std::thread b_thread([&] { b = CreatePublisher(endpoint); });
  struct JoinOnExit {
    std::thread& t;
    ~JoinOnExit() {
      if (t.joinable()) t.join();
    }
  } join_b{b_thread};
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (FailPoints::Hits("shm.lock_file_opened") == 0 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(FailPoints::Hits("shm.lock_file_opened"), 1) << "B never opened the lock file";
  // While B holds A's lock file open: A leaves, and C locks a new lock file the way a starting
  // publisher does.
  ASSERT_OK((*a)->Close());
  a->reset();
  ASSERT_FALSE(Exists(ep.lock_path));
  util::UniqueFd c(::open(ep.lock_path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0600));
  ASSERT_TRUE(c.valid()) << std::strerror(errno);
  ASSERT_EQ(::flock(c.get(), LOCK_EX | LOCK_NB), 0) << std::strerror(errno);
  b_thread.join();
  FailPoints::DisarmAll();
  ASSERT_NO_FATAL_FAILURE(ExpectAlreadyServed(b.status(), ep));
  EXPECT_FALSE(Exists(ep.socket_path)) << "B bound the socket of an endpoint C owns";

  // C gives the endpoint up as a publisher does; the next one starts and serves.
  ASSERT_EQ(::unlink(ep.lock_path.c_str()), 0);
  ASSERT_OK(c.Close());
  TinyModel model;
  auto d = CreatePublisher(endpoint);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_NO_FATAL_FAILURE(model.Serve(d->get(), 1));
  ASSERT_NO_FATAL_FAILURE(model.ExpectReceives(endpoint, 1));
  ASSERT_OK((*d)->Close());
}

// Publishers that keep replacing the lock file under a starting one (the race above, over and
// over) make it give up after a bounded number of attempts, with an error that says so.
TEST(EndpointOwnership, LockFileReplacedOnEveryAttemptGivesUpWithAClearError) {
  const std::string endpoint = testing::UniqueEndpoint("churn");
  const transport::link::Endpoint ep = Resolve(endpoint);
  ASSERT_OK(transport::link::EnsureSocketDir(ep));
  FailPoints::DisarmAll();
  const int64_t pause_ms = testing::kUnderSanitizer ? 200 : 40;
  FailPoints::Arm("shm.lock_file_opened", FailAction::kSleep, pause_ms);
  Result<std::unique_ptr<Publisher>> p = Status::Internal("not run");
  std::atomic<bool> done{false};
  std::thread starter([&] {
    p = CreatePublisher(endpoint);
    done.store(true);
  });
  // Each time the publisher has opened the lock file, unlink it before its flock: what a
  // departing owner does. Far more often than any bound the publisher may reasonably keep.
  int unlinked = 0;
  for (int64_t seen = 0; seen < 40 && !done.load();) {
    if (FailPoints::Hits("shm.lock_file_opened") > seen) {
      ++seen;
      if (::unlink(ep.lock_path.c_str()) == 0) ++unlinked;
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  starter.join();
  FailPoints::DisarmAll();
  ASSERT_GT(unlinked, 1) << "the lock file was never replaced";
  ASSERT_STATUS_IS(kFailedPrecondition, p, "'" + ep.lock_path + "' was replaced");
  EXPECT_FALSE(Exists(ep.socket_path));
  ::unlink(ep.lock_path.c_str());
}

// A failure to remove the lock file on Close() is reported, logged and counted, and does not
// stop the rest of the release: the lock is given up and a successor starts.
TEST(EndpointOwnership, LockFileReleaseFailureIsReportedNotSwallowed) {
  const std::string endpoint = testing::UniqueEndpoint("release");
  const transport::link::Endpoint ep = Resolve(endpoint);
  FailPoints::DisarmAll();
  const LedgerSnapshot baseline = ReadLedger();
  testing::LogCapture logs;
  {
    auto p = CreatePublisher(endpoint);
    ASSERT_TRUE(p.ok()) << p.status();
    FailPoints::Arm("shm.unlink_lock_file", FailAction::kError, 0, /*count=*/1);
    Status s = (*p)->Close();
    FailPoints::DisarmAll();
    ASSERT_FALSE(s.ok()) << "lock file release failure swallowed";
    EXPECT_NE(s.message().find("unlink lock file '" + ep.lock_path + "'"), std::string::npos) << s;
  }
  EXPECT_TRUE(logs.Contains("release: ")) << "failure not logged";
  LedgerSnapshot now = ReadLedger();
  EXPECT_EQ(now.release_failures, baseline.release_failures + 1);
  EXPECT_TRUE(now.SameLiveCounts(baseline))
      << "ledger " << now.ToString() << " vs baseline " << baseline.ToString();
  auto successor = CreatePublisher(endpoint);
  ASSERT_TRUE(successor.ok()) << successor.status();
  ASSERT_OK((*successor)->Close());
}

}  // namespace
}  // namespace weightsync
