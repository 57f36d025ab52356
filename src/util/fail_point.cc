#include "util/fail_point.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "util/knobs.h"
#include "util/mutex.h"

namespace weightsync::util {
namespace {

struct Point {
  FailAction action = FailAction::kNone;
  int64_t arg = 0;
  int64_t remaining = -1;  // -1: unlimited
  int64_t hits = 0;
};

struct Registry {
  Mutex mu;
  std::map<std::string, Point, std::less<>> points WS_GUARDED_BY(mu);
  // Fast path: no point armed at all.
  std::atomic<int> armed{0};
  std::once_flag env_once;
};

Registry& Reg() {
  static Registry* r = new Registry();  // leaked on purpose: usable during static destruction
  return *r;
}

void RecountArmed(Registry& r) WS_REQUIRES(r.mu) {
  int n = 0;
  for (auto& [name, p] : r.points) n += (p.action != FailAction::kNone && p.remaining != 0);
  r.armed.store(n, std::memory_order_release);
}

}  // namespace

Status FailPoints::ArmSpec(std::string_view spec) {
  // name=action[:arg][*count];...
  while (!spec.empty()) {
    size_t end = spec.find(';');
    std::string_view item = spec.substr(0, end);
    spec = end == std::string_view::npos ? std::string_view() : spec.substr(end + 1);
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return Status::InvalidArgument("WEIGHTSYNC_FAILPOINTS: '", item, "' lacks '='");
    }
    std::string name(item.substr(0, eq));
    std::string rest(item.substr(eq + 1));
    int64_t count = -1, arg = 0;
    if (size_t star = rest.find('*'); star != std::string::npos) {
      count = std::atoll(rest.c_str() + star + 1);
      rest.resize(star);
    }
    if (size_t colon = rest.find(':'); colon != std::string::npos) {
      arg = std::atoll(rest.c_str() + colon + 1);
      rest.resize(colon);
    }
    FailAction action;
    if (rest == "error")
      action = FailAction::kError;
    else if (rest == "sleep")
      action = FailAction::kSleep;
    else if (rest == "flip")
      action = FailAction::kFlip;
    else if (rest == "abort")
      action = FailAction::kAbort;
    else
      return Status::InvalidArgument("WEIGHTSYNC_FAILPOINTS: unknown action '", rest, "'");
    Arm(name, action, arg, count);
  }
  return Status::Ok();
}

void FailPoints::Arm(std::string_view name, FailAction action, int64_t arg, int64_t count) {
  Registry& r = Reg();
  MutexLock lock(&r.mu);
  Point& p = r.points[std::string(name)];
  p.action = action;
  p.arg = arg;
  p.remaining = count;
  RecountArmed(r);
}

void FailPoints::Disarm(std::string_view name) {
  Registry& r = Reg();
  MutexLock lock(&r.mu);
  auto it = r.points.find(name);
  if (it != r.points.end()) it->second.action = FailAction::kNone;
  RecountArmed(r);
}

void FailPoints::DisarmAll() {
  Registry& r = Reg();
  MutexLock lock(&r.mu);
  r.points.clear();
  RecountArmed(r);
}

int64_t FailPoints::Hits(std::string_view name) {
  Registry& r = Reg();
  MutexLock lock(&r.mu);
  auto it = r.points.find(name);
  return it == r.points.end() ? 0 : it->second.hits;
}

Status FailPoints::LoadFromEnv() {
  Status result;
  std::call_once(Reg().env_once, [&] {
    if (std::optional<std::string> v = KnobValue(Knob::kFailPoints)) result = ArmSpec(*v);
  });
  return result;
}

FailHit FailPoints::Check(std::string_view name) {
  Registry& r = Reg();
  // Acquire pairs with the release in RecountArmed so an armed point is seen with its fields.
  if (r.armed.load(std::memory_order_acquire) == 0) return {};
  FailHit hit;
  {
    MutexLock lock(&r.mu);
    auto it = r.points.find(name);
    if (it == r.points.end()) return {};
    Point& p = it->second;
    if (p.action == FailAction::kNone || p.remaining == 0) return {};
    if (p.remaining > 0) --p.remaining;
    ++p.hits;
    hit = {p.action, p.arg};
    RecountArmed(r);
  }
  if (hit.action == FailAction::kSleep) {
    std::this_thread::sleep_for(std::chrono::milliseconds(hit.arg));
  } else if (hit.action == FailAction::kAbort) {
    std::abort();
  }
  return hit;
}

}  // namespace weightsync::util
