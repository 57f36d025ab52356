#include "transport/path/data_path.h"

#include "util/worker_pool.h"

namespace weightsync::transport::path {

int PathContext::CopyThreads() const {
  return options->copy_threads > 0 ? options->copy_threads : util::DefaultThreads();
}

// The host ↔ GPU paths, where the copy engines move the bytes and the CPU only hashes (verify)
// and commits: more of them when verifying by default (docs/gpu.md).
int PathContext::HashingThreads() const {
  if (options->copy_threads > 0) return options->copy_threads;
  return options->verify ? util::HashThreads() : util::DefaultThreads();
}

}  // namespace weightsync::transport::path
