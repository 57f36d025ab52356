// Static-analysis canary (deliberately broken, NOT a weightsync test): a member guarded by a
// mutex, written without holding it. scripts/ci_static.sh REQUIRES that compiling this with the
// thread-safety flags of the check build fails with "requires holding mutex", which proves the
// check can fail.
#include "util/mutex.h"

class Counter {
 public:
  void Increment() { ++value_; }  // the violation: mu_ is not held

 private:
  weightsync::util::Mutex mu_;
  int value_ WS_GUARDED_BY(mu_) = 0;
};

int main() {
  Counter c;
  c.Increment();
  return 0;
}
