// HostCopyPath: a publisher's host store (shared memory on this host) into host destinations —
// the store mapped read-only once, each step copied by CPU threads bucket by bucket (host
// landing: staging, or the destinations in place). From a ring store, bucket by bucket as the
// publisher announces each (ring_bucket_ready), confirming each once copied (ring_bucket_done).
#pragma once

#include "transport/path/data_path.h"
#include "transport/path/host_landing.h"
#include "transport/store/shm_segment.h"

namespace weightsync::transport::path {

class HostCopyPath final : public DataPath {
 public:
  ~HostCopyPath() override;
  Status Prepare(const PathContext& ctx) override;
  Status Copy(const wire::StepBegin& begin, bool verify, const util::Deadline& deadline) override;
  Status Verify(std::span<const uint64_t> digests, int64_t step,
                const util::Deadline& deadline) override;
  Status Commit(const util::Deadline& deadline) override;
  uint64_t staging_bytes() const override { return landing_.staging_bytes(); }
  Status Release() override;

 private:
  Status CopyFromRing(const wire::StepBegin& begin, const util::Deadline& deadline);

  link::Link* link_ = nullptr;
  const wire::Welcome* welcome_ = nullptr;
  std::string peer_;
  store::Mapping mapping_;
  HostLanding landing_;
};

}  // namespace weightsync::transport::path
