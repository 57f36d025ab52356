// Concurrency stated in code: a mutex the compiler can reason about. With clang, -Wthread-safety
// checks every WS_GUARDED_BY member is touched only with its mutex held and every WS_REQUIRES
// function is called with it; CI builds the library that way with the warnings as errors
// (scripts/ci_static.sh). libstdc++'s std::mutex carries no annotations, hence these wrappers.
// Other compilers see plain mutexes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define WS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define WS_THREAD_ANNOTATION(x)
#endif

#define WS_CAPABILITY(x) WS_THREAD_ANNOTATION(capability(x))
#define WS_SCOPED_CAPABILITY WS_THREAD_ANNOTATION(scoped_lockable)
#define WS_GUARDED_BY(x) WS_THREAD_ANNOTATION(guarded_by(x))
#define WS_PT_GUARDED_BY(x) WS_THREAD_ANNOTATION(pt_guarded_by(x))
#define WS_REQUIRES(...) WS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define WS_EXCLUDES(...) WS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define WS_ACQUIRE(...) WS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define WS_RELEASE(...) WS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define WS_TRY_ACQUIRE(...) WS_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define WS_RETURN_CAPABILITY(x) WS_THREAD_ANNOTATION(lock_returned(x))
// For the rare function the analysis cannot follow; say why next to it.
#define WS_NO_THREAD_SAFETY_ANALYSIS WS_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace weightsync::util {

class WS_CAPABILITY("mutex") Mutex {
 public:
  void Lock() WS_ACQUIRE() { mu_.lock(); }
  void Unlock() WS_RELEASE() { mu_.unlock(); }
  bool TryLock() WS_TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // BasicLockable, for std::condition_variable_any (CondVar below).
  void lock() WS_ACQUIRE() { mu_.lock(); }
  void unlock() WS_RELEASE() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

struct AdoptLock {};
inline constexpr AdoptLock kAdoptLock{};

// Holds a Mutex for its scope.
class WS_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) WS_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  // Takes over a Mutex the caller locked (e.g. with TryLock).
  MutexLock(Mutex* mu, AdoptLock) WS_REQUIRES(mu) : mu_(mu) {}
  ~MutexLock() WS_RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* mu_;
};

// A condition variable waited on with a Mutex held (released while waiting, held again after).
class CondVar {
 public:
  template <typename Rep, typename Period>
  void WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout) WS_REQUIRES(mu) {
    cv_.wait_for(*mu, timeout);
  }
  void Wait(Mutex* mu) WS_REQUIRES(mu) { cv_.wait(*mu); }
  void NotifyAll() { cv_.notify_all(); }
  void NotifyOne() { cv_.notify_one(); }

 private:
  std::condition_variable_any cv_;
};

}  // namespace weightsync::util
