// CPU-only build: the nccl transport answers Unavailable (nccl_link.cu is the real one).
#include "cuda/nccl_link.h"

#if !WS_WITH_CUDA

namespace weightsync::cuda::nccl {
namespace {
Status NoCuda() { return Status::Unavailable("built without CUDA: no nccl transport"); }
}  // namespace

struct Link::Impl {};

Status NcclAvailable() { return NoCuda(); }
int NcclVersionCode() { return 0; }
Result<UniqueId> NewUniqueId() { return NoCuda(); }
int64_t LiveCommunicators() { return 0; }
int64_t AbortedCommunicators() { return 0; }

Link::Link(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Link::~Link() = default;
Result<std::unique_ptr<Link>> Link::Connect(const UniqueId&, int, int, const util::Deadline&,
                                            const Watch&) {
  return NoCuda();
}
Status Link::Transfer(std::span<const Piece>, const util::Deadline&, const Watch&) {
  return NoCuda();
}
Status Link::Abort() { return Status::Ok(); }
Status Link::Close() { return Status::Ok(); }
int Link::rank() const { return -1; }
int Link::device() const { return -1; }
bool Link::live() const { return false; }
double Link::connect_seconds() const { return 0; }

}  // namespace weightsync::cuda::nccl

#endif  // !WS_WITH_CUDA
