#include "testing/path_harness.h"

#include <utility>

#include "core/destination_set.h"
#include "transport/link/endpoint.h"

namespace weightsync::testing {

PathHarness::PathHarness(SubscriberOptions options) : options_(std::move(options)) {}

PathHarness::~PathHarness() {
  if (link_) (void)link_->Release();
}

Status PathHarness::Connect(const std::vector<NamedTensor>& destinations) {
  core::DestinationSet set;
  WS_RETURN_IF_ERROR(set.Add(destinations));
  destinations_ = set.destinations();
  WS_ASSIGN_OR_RETURN(transport::link::Endpoint endpoint,
                      transport::link::ParseEndpoint(options_.endpoint));
  link_ = transport::link::NewLink(endpoint, options_);
  WS_RETURN_IF_ERROR(link_->Connect(deadline_).status());
  store_fd_ = link_->TakeStoreFd();
  WS_ASSIGN_OR_RETURN(plan_, plan::BuildPlan(link_->welcome(), destinations_, options_.policy,
                                             /*bucket_bytes=*/4ull << 20));
  return Status::Ok();
}

transport::path::PathContext PathHarness::Context() {
  return {.link = link_.get(),
          .welcome = &link_->welcome(),
          .store_fd = &store_fd_,
          .plan = &plan_,
          .destinations = &destinations_,
          .mode = options_.mode,
          .options = &options_,
          .deadline = &deadline_};
}

Status PathHarness::Prepare(transport::path::DataPath& path) {
  const transport::path::PathContext ctx = Context();
  WS_RETURN_IF_ERROR(path.Available(ctx));
  WS_RETURN_IF_ERROR(link_->Select(plan_, deadline_));
  return path.Prepare(ctx);
}

Result<int64_t> PathHarness::Step(transport::path::DataPath& path) {
  WS_ASSIGN_OR_RETURN(int64_t step, link_->BeginStep(std::nullopt, committed_, deadline_));
  WS_RETURN_IF_ERROR(path.Copy(link_->begin(), options_.verify, deadline_));
  WS_ASSIGN_OR_RETURN(std::span<const uint64_t> digests,
                      link_->EndStep(plan_.digest_count, deadline_));
  if (options_.verify) WS_RETURN_IF_ERROR(path.Verify(digests, step, deadline_));
  WS_RETURN_IF_ERROR(path.Commit(deadline_));
  committed_ = step;
  return step;
}

}  // namespace weightsync::testing
