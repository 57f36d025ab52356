// HostCopyPath (shm, shm-ring): a publisher's host store on this host into host destinations —
// the store mapped read-only once (a store view: an arena, or a ring whose buckets the publisher
// announces one by one), each step copied by CPU threads unit by unit into the host landing
// (staging, or the destinations in place).
#pragma once

#include <memory>
#include <string>

#include "transport/path/data_path.h"
#include "transport/path/host_landing.h"
#include "transport/view/store_view.h"

namespace weightsync::transport::path {

class HostCopyPath final : public DataPath {
 public:
  ~HostCopyPath() override;
  Status Prepare(const PathContext& ctx) override;
  Status Copy(const wire::StepBegin& begin, bool verify, const util::Deadline& deadline) override;
  Status Verify(std::span<const uint64_t> digests, int64_t step,
                const util::Deadline& deadline) override;
  Status Commit(const util::Deadline& deadline) override;
  std::string Describe() const override { return view_ ? view_->Describe() : ""; }
  uint64_t staging_bytes() const override { return landing_.staging_bytes(); }
  ConversionReport conversion() const override { return landing_.conversion(); }
  Status Release() override;

 private:
  const wire::Welcome* welcome_ = nullptr;
  std::string peer_;
  std::unique_ptr<view::StoreView> view_;
  HostLanding landing_;
};

}  // namespace weightsync::transport::path
