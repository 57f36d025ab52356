#include "transport/path/tcp_read_path.h"

#include "util/logging.h"

namespace weightsync::transport::path {

TcpReadPath::~TcpReadPath() {
  if (Status s = Release(); !s.ok()) WS_LOG(WARN, "tcp") << "path cleanup: " << s;
}

Status TcpReadPath::Prepare(const PathContext& ctx) {
  digest_kind_ = ctx.welcome->digest_kind;
  staged_ = ctx.mode == UpdateMode::kStaged;
  committed_here_ = false;
  WS_RETURN_IF_ERROR(landing_.Prepare(ctx.plan, *ctx.destinations, ctx.mode, ctx.CopyThreads()));
  reader_.Prepare(ctx, &landing_, DeltaReceiver::Fits(*ctx.plan, *ctx.welcome));
  return Status::Ok();
}

Status TcpReadPath::Copy(const wire::StepBegin& begin, bool /*verify*/,
                         const util::Deadline& deadline) {
  committed_here_ = false;  // from the first byte read, the shadow holds neither version
  return reader_.Read(begin, observer_, deadline);
}

Status TcpReadPath::Verify(std::span<const uint64_t> digests, int64_t step,
                           const util::Deadline& /*deadline*/) {
  return landing_.Verify(digests, digest_kind_, step);
}

Status TcpReadPath::Commit(const util::Deadline& /*deadline*/) {
  // Staged, a step that came as deltas writes only what changed into the destinations.
  bool sparse = false;
  if (staged_ && reader_.deltas().expected()) sparse = reader_.deltas().CommitSparse();
  if (!sparse) WS_RETURN_IF_ERROR(landing_.Commit());
  committed_here_ = true;
  return Status::Ok();
}

Status TcpReadPath::Release() {
  Status s = reader_.Release();
  s.Update(landing_.Release());
  if (!s.ok()) WS_LOG(WARN, "tcp") << "release: " << s;
  return s;
}

}  // namespace weightsync::transport::path
