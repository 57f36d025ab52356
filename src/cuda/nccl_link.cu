// nccl_link.h with CUDA. <nccl.h> is included for its types only: every NCCL function is called
// through the table nccl_api.cc resolved with dlsym, so nothing links libnccl.
#include <cuda_runtime.h>
#include <nccl.h>
#include <poll.h>

// The explicit moves in `return std::move(x)` are needed by nvcc's front end, redundant to g++'s.
#pragma GCC diagnostic ignored "-Wredundant-move"

#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/nccl_api.h"
#include "cuda/nccl_link.h"
#include "util/ledger.h"
#include "util/logging.h"

namespace weightsync::cuda::nccl {
namespace {

using Clock = std::chrono::steady_clock;
using util::Deadline;

static_assert(sizeof(ncclUniqueId) == kUniqueIdBytes);
static_assert(NCCL_UNIQUE_ID_BYTES == kUniqueIdBytes);

// The loaded library, typed by <nccl.h>.
struct Api {
#define WS_NCCL_ENTRY_FIELD(index, symbol) decltype(&::symbol) index = nullptr;
  WS_NCCL_ENTRY_POINTS(WS_NCCL_ENTRY_FIELD)
#undef WS_NCCL_ENTRY_FIELD
  int version_code = 0;
};

struct LoadedApi {
  Api api;
  Status failure;
};

LoadedApi Load() {
  Result<const NcclLibrary*> lib = Nccl();
  if (!lib.ok()) return LoadedApi{Api{}, lib.status()};
  LoadedApi loaded;
#define WS_NCCL_ENTRY_BIND(index, symbol) \
  loaded.api.index = reinterpret_cast<decltype(&::symbol)>((*lib)->entry[NcclLibrary::k##index]);
  WS_NCCL_ENTRY_POINTS(WS_NCCL_ENTRY_BIND)
#undef WS_NCCL_ENTRY_BIND
  loaded.api.version_code = (*lib)->version_code;
  return loaded;
}

Result<const Api*> GetApi() {
  static const LoadedApi loaded = Load();  // thread-safe static initialization, once
  if (!loaded.failure.ok()) return loaded.failure;
  return &loaded.api;
}

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_aborted{0};

const char* ResultName(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "ncclResult?";
  }
}

// A remote error is the peer's doing; a system error an OS call (sockets, shared memory) NCCL
// made; anything else is a fault in NCCL, CUDA or our use of them.
StatusCode CodeFor(ncclResult_t r) {
  switch (r) {
    case ncclRemoteError:
      return StatusCode::kPeerLost;
    case ncclSystemError:
      return StatusCode::kIoError;
    case ncclInvalidArgument:
      return StatusCode::kInvalidArgument;
    default:
      return StatusCode::kInternal;
  }
}

Status NcclError(const Api& api, ncclComm_t comm, ncclResult_t r, std::string_view call) {
  std::string message = std::string(call) + ": " + ResultName(r);
  if (const char* text = api.GetErrorString(r); text != nullptr && *text != '\0') {
    message += std::string(" (") + text + ")";
  }
  if (const char* last = api.GetLastError(comm); last != nullptr && *last != '\0') {
    message += std::string("; NCCL: ") + last;
  }
  return Status(CodeFor(r), std::move(message));
}

// The control connection's view of the peer: closed (FIN, reset) → PeerLost. Waits up to
// `wait_ms` for that to show (0: just looks).
Status CheckPeer(const Watch& watch, int wait_ms) {
  if (watch.stopping != nullptr && watch.stopping->load(std::memory_order_acquire)) {
    return Status::Cancelled("the server is closing");
  }
  if (watch.control_fd < 0) return Status::Ok();
  pollfd p{watch.control_fd, POLLRDHUP, 0};
  int r = ::poll(&p, 1, wait_ms);
  if (r > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0) {
    return Status::PeerLost("the control connection was closed (the peer exited or dropped it)");
  }
  return Status::Ok();
}

// After this many polls without progress a wait sleeps between polls (a step's transfer takes
// milliseconds, so the first polls spin).
constexpr int kSpins = 2000;
constexpr auto kBackoff = std::chrono::microseconds(50);

}  // namespace

struct Link::Impl {
  const Api* api = nullptr;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;
  int rank = -1;
  int device = -1;
  bool live = false;  // comm created and not aborted
  double connect_seconds = 0;

  // What a wait was for, spelled out only when it failed (the success path builds no string).
  struct Op {
    const char* what;  // "joining the communicator", "sending", "receiving"
    size_t count = 0;  // pieces in flight
    uint64_t bytes = 0;
  };
  Status Wait(const Op& op, bool stream_work, const Deadline& deadline, const Watch& watch);
  Status Fail(const Op& op, const Watch& watch, const Status& cause);
  Status AbortNow();
};

Status Link::Impl::Fail(const Op& op, const Watch& watch, const Status& cause) {
  std::string message = std::string("nccl rank ") + std::to_string(rank) +
                        " on cuda:" + std::to_string(device) + ", " + op.what;
  if (op.count > 0) {
    message += " (" + std::to_string(op.count) + (rank == 0 ? " sends, " : " receives, ") +
               std::to_string(op.bytes) + " bytes)";
  }
  message +=
      std::string(rank == 0 ? " to " : " from ") + std::string(watch.peer) + ": " + cause.message();
  Status aborted = AbortNow();
  message += aborted.ok() ? "; communicator aborted"
                          : "; aborting the communicator failed too: " + aborted.message();
  return Status(cause.code(), std::move(message));
}

Status Link::Impl::Wait(const Op& op, bool stream_work, const Deadline& deadline,
                        const Watch& watch) {
  bool recorded = false;
  int spins = 0;
  while (true) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = api->CommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return Fail(op, watch, NcclError(*api, comm, r, "ncclCommGetAsyncError"));
    if (state != ncclSuccess && state != ncclInProgress) {
      // A peer that died shows as a closed control connection at about the time NCCL's sockets
      // notice: prefer that explanation when it comes within a moment.
      Status peer = CheckPeer(watch, 100);
      return Fail(op, watch, peer.ok() ? NcclError(*api, comm, state, "NCCL async error") : peer);
    }
    if (state == ncclSuccess) {
      if (!stream_work) return Status::Ok();
      // Non-blocking NCCL enqueues a group's kernels only once the async state is success: the
      // event must be recorded after that, or it would complete before the transfer.
      if (!recorded) {
        cudaError_t e = cudaEventRecord(event, stream);
        if (e != cudaSuccess) return Fail(op, watch, cuda::CudaErrorStatus(e, "cudaEventRecord"));
        recorded = true;
      }
      cudaError_t e = cudaEventQuery(event);
      if (e == cudaSuccess) return Status::Ok();
      if (e != cudaErrorNotReady) {
        return Fail(op, watch, cuda::CudaErrorStatus(e, "waiting for the NCCL stream"));
      }
    }
    ++spins;
    if (spins > kSpins || spins % 32 == 0) {
      if (Status s = CheckPeer(watch, 0); !s.ok()) return Fail(op, watch, s);
      if (deadline.cancelled()) return Fail(op, watch, Status::Cancelled("cancelled"));
      if (deadline.expired()) {
        return Fail(op, watch,
                    Status::Timeout("no progress before the deadline (the peer is alive but "
                                    "silent, or its GPU is stuck)"));
      }
    }
    if (spins > kSpins) std::this_thread::sleep_for(kBackoff);
  }
}

Status Link::Impl::AbortNow() {
  if (!live) return Status::Ok();
  live = false;
  Status result;
  (void)cudaSetDevice(device);
  ncclResult_t r = api->CommAbort(comm);
  comm = nullptr;
  g_live.fetch_sub(1, std::memory_order_relaxed);
  g_aborted.fetch_add(1, std::memory_order_relaxed);
  if (r != ncclSuccess && r != ncclInProgress) {
    result.Update(Status(CodeFor(r), std::string("ncclCommAbort: ") + ResultName(r)));
  }
  // Aborted NCCL kernels exit; nothing may touch the pieces (staging, destinations, a slot) once
  // this returns, so wait for the stream — bounded, a stuck GPU is reported, not waited out.
  if (stream != nullptr) {
    auto until = Clock::now() + std::chrono::seconds(10);
    while (true) {
      cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) {
        result.Update(cuda::CudaErrorStatus(e, "draining the NCCL stream after ncclCommAbort"));
        break;
      }
      if (Clock::now() > until) {
        result.Update(Status::Internal("GPU work still in flight on the NCCL stream of cuda:",
                                       device, " 10 s after ncclCommAbort"));
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  if (!result.ok()) util::LedgerAdd(util::LedgerItem::kReleaseFailures, 1);
  return result;
}

Status NcclAvailable() { return GetApi().status(); }

int NcclVersionCode() {
  auto api = GetApi();
  return api.ok() ? (*api)->version_code : 0;
}

Result<UniqueId> NewUniqueId() {
  WS_ASSIGN_OR_RETURN(const Api* api, GetApi());
  ncclUniqueId id;
  ncclResult_t r = api->GetUniqueId(&id);
  if (r != ncclSuccess) return NcclError(*api, nullptr, r, "ncclGetUniqueId");
  UniqueId out;
  std::memcpy(out.data(), id.internal, kUniqueIdBytes);
  return out;
}

int64_t LiveCommunicators() { return g_live.load(std::memory_order_relaxed); }
int64_t AbortedCommunicators() { return g_aborted.load(std::memory_order_relaxed); }

Link::Link(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Link::~Link() {
  if (Status s = Close(); !s.ok()) WS_LOG(WARN, "nccl") << "link cleanup: " << s;
}

Result<std::unique_ptr<Link>> Link::Connect(const UniqueId& id, int rank, int device,
                                            const Deadline& deadline, const Watch& watch) {
  WS_ASSIGN_OR_RETURN(const Api* api, GetApi());
  const auto t0 = Clock::now();
  auto impl = std::make_unique<Impl>();
  impl->api = api;
  impl->rank = rank;
  impl->device = device;
  std::unique_ptr<Link> link(new Link(std::move(impl)));
  Impl& d = *link->impl_;
  WS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), "nccl: cudaSetDevice(", device, ")");
  WS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking),
                          "nccl: creating a stream on cuda:", device);
  WS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&d.event, cudaEventDisableTiming),
                          "nccl: creating an event on cuda:", device);
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.data(), kUniqueIdBytes);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every NCCL call returns at once; we poll, with a deadline
  ncclResult_t r = api->CommInitRankConfig(&d.comm, 2, uid, rank, &config);
  if (d.comm != nullptr) {
    d.live = true;
    g_live.fetch_add(1, std::memory_order_relaxed);
  }
  const Impl::Op op{"joining the communicator"};
  if (r != ncclSuccess && r != ncclInProgress) {
    return d.Fail(op, watch, NcclError(*api, d.comm, r, "ncclCommInitRankConfig"));
  }
  if (!d.live) {
    return Status::Internal("nccl: ncclCommInitRankConfig returned ", ResultName(r),
                            " but no communicator");
  }
  WS_RETURN_IF_ERROR(d.Wait(op, /*stream_work=*/false, deadline, watch));
  d.connect_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return std::move(link);
}

Status Link::Transfer(std::span<const Piece> pieces, const Deadline& deadline, const Watch& watch) {
  Impl& d = *impl_;
  if (!d.live) {
    return Status::FailedPrecondition("nccl: the communicator was aborted; the link is dead");
  }
  if (pieces.empty()) return Status::Ok();
  Impl::Op op{d.rank == 0 ? "sending" : "receiving", pieces.size(), 0};
  cudaError_t ce = cudaSetDevice(d.device);
  if (ce != cudaSuccess) return d.Fail(op, watch, cuda::CudaErrorStatus(ce, "cudaSetDevice"));
  ncclResult_t r = d.api->GroupStart();
  if (r != ncclSuccess) return d.Fail(op, watch, NcclError(*d.api, d.comm, r, "ncclGroupStart"));
  ncclResult_t failed = ncclSuccess;
  size_t failed_at = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    op.bytes += p.bytes;
    // Root 0 sends from p.data (in place: nothing is copied at the root); rank 1 receives
    // there. Grouped broadcasts, not grouped ncclSend/ncclRecv: 41.8 ms vs 43.1 ms for the
    // 7B-like model on 2xH200 in the same run (scripts/nccl_env_sweep.sh, docs/gpu.md).
    r = d.api->Broadcast(p.data, p.data, p.bytes, ncclInt8, 0, d.comm, d.stream);
    if (r != ncclSuccess && r != ncclInProgress) {
      failed = r;
      failed_at = i;
      break;
    }
  }
  ncclResult_t end = d.api->GroupEnd();  // always balances GroupStart
  if (failed != ncclSuccess) {
    return d.Fail(op, watch,
                  NcclError(*d.api, d.comm, failed,
                            std::string("ncclBroadcast of piece ") + std::to_string(failed_at)));
  }
  if (end != ncclSuccess && end != ncclInProgress) {
    return d.Fail(op, watch, NcclError(*d.api, d.comm, end, "ncclGroupEnd"));
  }
  return d.Wait(op, /*stream_work=*/true, deadline, watch);
}

Status Link::Abort() { return impl_->AbortNow(); }

Status Link::Close() {
  Impl& d = *impl_;
  Status result = d.AbortNow();
  if (d.event != nullptr) {
    cudaError_t e = cudaEventDestroy(std::exchange(d.event, nullptr));
    if (e != cudaSuccess) result.Update(cuda::CudaErrorStatus(e, "nccl: cudaEventDestroy"));
  }
  if (d.stream != nullptr) {
    cudaError_t e = cudaStreamDestroy(std::exchange(d.stream, nullptr));
    if (e != cudaSuccess) result.Update(cuda::CudaErrorStatus(e, "nccl: cudaStreamDestroy"));
  }
  return result;
}

int Link::rank() const { return impl_->rank; }
int Link::device() const { return impl_->device; }
bool Link::live() const { return impl_->live; }
double Link::connect_seconds() const { return impl_->connect_seconds; }

}  // namespace weightsync::cuda::nccl
