// TcpReadPath: a publisher's host store on another host (or this one) into host destinations: the
// publisher streams the selected tensors' bytes on the connection, and one scatter-gather read per
// step puts them straight into staging or the destinations (host landing). No staging copy.
#pragma once

#include <sys/uio.h>

#include <vector>

#include "transport/path/data_path.h"
#include "transport/path/host_landing.h"

namespace weightsync::transport::path {

class TcpReadPath final : public DataPath {
 public:
  ~TcpReadPath() override;
  Status Prepare(const PathContext& ctx) override;
  Status Copy(const wire::StepBegin& begin, bool verify, const util::Deadline& deadline) override;
  Status Verify(std::span<const uint64_t> digests, int64_t step,
                const util::Deadline& deadline) override;
  Status Commit(const util::Deadline& deadline) override;
  uint64_t staging_bytes() const override { return landing_.staging_bytes(); }
  Status Release() override;

 private:
  link::Link* link_ = nullptr;
  const plan::Plan* plan_ = nullptr;
  wire::DigestKind digest_kind_ = wire::DigestKind::kXxh3;
  HostLanding landing_;
  std::vector<iovec> parts_;  // one per planned tensor, refilled per step without allocating
};

}  // namespace weightsync::transport::path
