#include "cuda/launch_registry.h"

#include <atomic>

#include "cuda/arg_pack.h"
#include "cuda/kernel_table.h"
#include "util/logging.h"
#include "weightsync/dtype.h"

namespace weightsync::cuda {
namespace {

// Relaxed: a statistic read for logs and tests, ordered with nothing else.
std::atomic<int64_t> g_live_launches{0};

int CountScalarTypes() {
  int ready = 0;
  const DTypeInfo* all = AllDTypes();
  for (int i = 0; i < kDTypeCount; ++i) {
    const ArgType t = ArgType::Scalar(all[i].dtype);
    const ArgType one[] = {t};
    Result<ArgPack> pack = ArgPack::Create(one);
    // A scalar must hold a whole element (a 4-bit float takes a byte) at its natural alignment.
    if (pack.ok() && t.size() * 8 >= all[i].bits && pack->value_bytes() == t.size() &&
        reinterpret_cast<uintptr_t>(pack->value_ptr(0)) % t.alignment() == 0) {
      ++ready;
    }
  }
  return ready;
}

}  // namespace

int ReadyScalarTypeCount() {
  static const int count = CountScalarTypes();
  return count;
}

int ReadyKernelCount() { return kKernelCount; }

int64_t LivePreparedLaunches() { return g_live_launches.load(std::memory_order_relaxed); }

int64_t LogPreparedLaunchesReady() {
  const int64_t launches = LivePreparedLaunches();
  WS_LOG(INFO, "cuda") << "prepared launches ready: " << ReadyScalarTypeCount() << " scalar types, "
                       << launches << " launches (" << ReadyKernelCount() << " kernels)";
  return launches;
}

namespace internal {
void CountPreparedLaunch(int delta) { g_live_launches.fetch_add(delta, std::memory_order_relaxed); }
}  // namespace internal

}  // namespace weightsync::cuda
