#include "transport/shm/shm_handle.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "cuda/device.h"
#include "transport/cuda_ipc/cuda_data_path.h"
#include "transport/cuda_ipc/gpu_to_host_path.h"
#include "transport/cuda_ipc/host_to_gpu_path.h"
#include "transport/host_data_path.h"
#include "transport/step_exchange.h"
#include "transport/shm/shm_segment.h"
#include "util/fail_point.h"
#include "util/hash.h"
#include "util/ledger.h"
#include "util/logging.h"
#include "util/worker_pool.h"
#include "wire/channel.h"
#include "wire/messages.h"

namespace weightsync::transport::shm {
namespace {

using util::Deadline;
using util::LedgerAdd;
using util::LedgerItem;

class ShmHandle final : public TransferHandle {
 public:
  ShmHandle(Endpoint endpoint, SubscriberOptions options)
      : endpoint_(std::move(endpoint)), options_(std::move(options)) {}
  ~ShmHandle() override {
    if (Status s = Release(); !s.ok()) WS_LOG(WARN, "shm") << "handle cleanup: " << s;
  }

  std::string_view transport_name() const override { return gpu_ ? "cuda-ipc" : "shm"; }
  const plan::Plan& plan() const override { return plan_; }
  Result<const wire::Welcome*> Connect(const Deadline& deadline) override;

  Status Prepare(const std::vector<plan::Destination>& destinations,
                 const PrepareOptions& options, const Deadline& deadline) override;
  Result<int64_t> BeginStep(std::optional<int64_t> step, int64_t after_step,
                            const Deadline& deadline) override;
  Status CopyStep(bool verify, const Deadline& deadline) override;
  Result<std::span<const uint64_t>> EndStep(const Deadline& deadline) override;
  Status Verify(std::span<const uint64_t> digests, int64_t step,
                const Deadline& deadline) override;
  Status Commit(const Deadline& deadline) override;
  Status Release() override;

 private:
  // Workers of the host ↔ GPU paths, where the copy engines move the bytes and the CPU only
  // hashes (verify) and commits: more of them when verifying by default (docs/gpu.md).
  int HashingThreads() const {
    if (options_.copy_threads > 0) return options_.copy_threads;
    return options_.verify ? util::HashThreads() : util::DefaultThreads();
  }
  std::string DataPathText() const;    // for the prepare log line
  std::string ConversionText() const;  // likewise
  Status PrepareHost(util::UniqueFd arena_fd, const std::vector<plan::Destination>& destinations,
                     UpdateMode mode);

  Endpoint endpoint_;
  SubscriberOptions options_;
  std::string peer_;
  bool gpu_ = false;  // the publisher's arena is GPU memory (cuda-ipc)
  // Created in this order by Prepare, released in reverse by Release.
  std::unique_ptr<wire::Channel> channel_;
  Mapping mapping_;            // host arena
  HostDataPath host_;          // host arena
  cuda_ipc::CudaDataPath gpu_path_;  // GPU arena
  cuda_ipc::HostToGpuPath host_to_gpu_;  // host arena, CUDA destinations
  bool to_gpu_ = false;                  // host_to_gpu_ is the data path
  cuda_ipc::GpuToHostPath gpu_to_host_;  // GPU arena, host destinations
  bool to_host_ = false;                 // gpu_to_host_ is the data path
  bool counted_ = false;       // ledger "handles"
  bool connected_ = false;
  util::UniqueFd arena_fd_;    // from the Welcome until Prepare maps or imports it

  wire::Welcome welcome_;
  plan::Plan plan_;
  wire::StepBegin begin_;
  wire::StepEnd end_;
};

Result<const wire::Welcome*> ShmHandle::Connect(const Deadline& deadline) {
  if (connected_) return &welcome_;
  peer_ = "publisher local://" + endpoint_.name;
  counted_ = true;
  LedgerAdd(LedgerItem::kHandles, 1);
  WS_FAIL_POINT_RETURN("shm.prepare");

  WS_ASSIGN_OR_RETURN(util::UniqueFd fd, ConnectUnix(endpoint_.socket_path, deadline));
  channel_ = std::make_unique<wire::Channel>(std::move(fd), peer_);
  LedgerAdd(LedgerItem::kConnections, 1);

  WS_RETURN_IF_ERROR(channel_->Send(wire::FrameType::kHello, SubscriberHello(deadline), deadline));
  WS_RETURN_IF_ERROR(
      channel_->ReceiveExpect(wire::FrameType::kWelcome, &welcome_, deadline, &arena_fd_));
  if (!arena_fd_.valid()) {
    return Status::ProtocolError(peer_, ": welcome frame carried no arena fd");
  }
  WS_RETURN_IF_ERROR(plan::ValidateLayout(welcome_).WithContext(peer_));
  connected_ = true;
  return &welcome_;
}

Status ShmHandle::Prepare(const std::vector<plan::Destination>& destinations,
                          const PrepareOptions& options, const Deadline& deadline) {
  WS_RETURN_IF_ERROR(Connect(deadline).status());
  util::UniqueFd arena_fd = std::move(arena_fd_);
  WS_ASSIGN_OR_RETURN(plan_, plan::BuildPlan(welcome_, destinations, options.policy,
                                             /*bucket_bytes=*/4ull << 20, options.convert));
  switch (welcome_.arena_kind) {
    case wire::ArenaKind::kHostMemfd:
      WS_RETURN_IF_ERROR(PrepareHost(std::move(arena_fd), destinations, options.mode));
      break;
    case wire::ArenaKind::kCudaMem:
      gpu_ = true;
      // Host destinations: the copy engines of the arena's GPU write them; CUDA ones: cuda-ipc.
      to_host_ = !destinations.empty() && !destinations[0].device.is_cuda();
      if (to_host_) {
        WS_RETURN_IF_ERROR(gpu::CudaAvailable().WithContext(
            peer_ + " keeps its arena on cuda:" + std::to_string(welcome_.device) +
            " and the destinations are in host memory"));
        WS_RETURN_IF_ERROR(gpu_to_host_
                               .Prepare(arena_fd.get(), welcome_, &plan_, destinations,
                                        options.mode, HashingThreads())
                               .WithContext(peer_));
        WS_RETURN_IF_ERROR(arena_fd.Close());  // the import holds the allocation
        break;
      }
      WS_RETURN_IF_ERROR(
          gpu_path_
              .Prepare(arena_fd.get(), welcome_, &plan_, destinations, options.mode,
                       options.convert.on_publisher_gpu)
              .WithContext(peer_));
      WS_RETURN_IF_ERROR(arena_fd.Close());  // the import holds the allocation
      break;
    case wire::ArenaKind::kNone:
      return Status::ProtocolError(peer_, ": welcome on a local socket names no arena");
  }
  end_.digests.reserve(plan_.digest_count);

  WS_LOG(INFO, "shm") << "prepared " << transport_name() << " handle for " << peer_ << ": "
                      << plan_.tensors.size() << " tensors, " << plan_.total_bytes << " bytes, "
                      << plan_.buckets.size() << " buckets, " << plan_.segments.size()
                      << " segments, " << welcome_.slot_count << " slots mapped ("
                      << welcome_.arena_bytes << " bytes" << DataPathText() << ")"
                      << ConversionText();
  return Status::Ok();
}

// ", GPU arena from cuda:0 into cuda:1" and the like: which data path the prepare line describes.
std::string ShmHandle::DataPathText() const {
  auto pinned = [](bool yes, std::string_view reason, const char* pinned_text,
                   const char* pageable_text) {
    return yes ? std::string(pinned_text)
               : std::string(pageable_text) + " (" + std::string(reason) + ")";
  };
  if (to_host_) {
    return ", GPU arena into host memory by the copy engines of cuda:" +
           std::to_string(gpu_to_host_.device()) +
           pinned(gpu_to_host_.pinned(), gpu_to_host_.pageable_reason(), ", pinned", ", pageable");
  }
  if (gpu_) {
    return ", GPU arena from cuda:" + std::to_string(welcome_.device) + " into cuda:" +
           std::to_string(gpu_path_.device());
  }
  if (to_gpu_) {
    return ", host arena into cuda:" + std::to_string(host_to_gpu_.device()) +
           pinned(host_to_gpu_.pinned(), host_to_gpu_.pageable_reason(), " from pinned memory",
                  " from pageable memory");
  }
  return "";
}

// "; 12 conversions on cuda:0 (the publisher's GPU: ...)" over cuda-ipc; empty otherwise.
std::string ShmHandle::ConversionText() const {
  if (!gpu_ || to_host_ || plan_.converted.empty()) return "";
  const int at = gpu_path_.conversion_source_device();
  return "; " + std::to_string(plan_.converted.size()) + " conversions on cuda:" +
         std::to_string(at >= 0 ? at : gpu_path_.device()) +
         (at >= 0 ? " (the publisher's GPU: only converted bytes cross the link)" : "");
}

Status ShmHandle::PrepareHost(util::UniqueFd arena_fd,
                              const std::vector<plan::Destination>& destinations,
                              UpdateMode mode) {
  // Host destinations: CPU threads copy. CUDA destinations (all on one device): the copy engines
  // read the pinned arena. Both checked before anything is mapped.
  to_gpu_ = std::any_of(destinations.begin(), destinations.end(),
                        [](const plan::Destination& d) { return d.device.is_cuda(); });
  if (to_gpu_) {
    WS_RETURN_IF_ERROR(cuda_ipc::GpuReceiver::DestinationDevice(destinations, "shm").status());
    WS_RETURN_IF_ERROR(gpu::CudaAvailable().WithContext(
        peer_ + " keeps its arena in host memory and the destinations are CUDA tensors"));
  }
  WS_RETURN_IF_ERROR(CheckImportedSegment(arena_fd.get(), welcome_.arena_bytes).WithContext(peer_));
  WS_ASSIGN_OR_RETURN(mapping_, Mapping::Map(arena_fd.get(), welcome_.arena_bytes,
                                             /*writable=*/false, "arena of " + peer_));
  // The mapping keeps the memory alive; the fd is no longer needed.
  WS_RETURN_IF_ERROR(arena_fd.Close());
  int threads = options_.copy_threads > 0 ? options_.copy_threads : util::DefaultThreads();
  if (to_gpu_) {
    return host_to_gpu_
        .Prepare(mapping_.data(), welcome_, &plan_, destinations, mode, HashingThreads())
        .WithContext(peer_);
  }
  threads = std::min<int>(threads, std::max<size_t>(plan_.buckets.size(), 1));
  return host_.Prepare(&plan_, destinations, mode, threads);
}

Result<int64_t> ShmHandle::BeginStep(std::optional<int64_t> step, int64_t after_step,
                                     const Deadline& deadline) {
  WS_ASSIGN_OR_RETURN(int64_t offered,
                      RequestStep(*channel_, peer_, step, after_step, &begin_, deadline));
  if (offered != after_step && plan_.uses_slots && begin_.slot >= welcome_.slot_count) {
    return Status::ProtocolError(peer_, ": step ", begin_.step, " in slot ", begin_.slot,
                                 " but the arena has ", welcome_.slot_count, " slots");
  }
  return offered;
}

Status ShmHandle::CopyStep(bool verify, const Deadline& deadline) {
  if (to_host_) {
    WS_RETURN_IF_ERROR(gpu_to_host_.Copy(begin_.slot, deadline));
  } else if (gpu_) {
    WS_RETURN_IF_ERROR(gpu_path_.Copy(begin_.slot, verify, deadline));
  } else if (to_gpu_) {
    WS_RETURN_IF_ERROR(host_to_gpu_.Copy(begin_.slot, verify, deadline));
  } else {
    const uint8_t* arena = mapping_.data();
    host_.CopyFromArena(
        arena + welcome_.slots_offset + uint64_t{begin_.slot} * welcome_.slot_bytes,
        arena + welcome_.direct_offset);
    host_.MaybeInjectBitFlip();
  }
  // Bytes in shared memory cannot be "lost"; a publisher that died or was stopped meanwhile is
  // caught by EndStep, which needs its confirmation before anything is committed.
  if (util::FailPoints::Check("shm.after_copy").action == util::FailAction::kError) {
    return Status::Internal("injected failure at fail point 'shm.after_copy'");
  }
  if (deadline.expired()) {
    return Status::Timeout(peer_, ": copy of step ", begin_.step, " did not finish in time");
  }
  return Status::Ok();
}

Result<std::span<const uint64_t>> ShmHandle::EndStep(const Deadline& deadline) {
  WS_RETURN_IF_ERROR(
      channel_->Send(wire::FrameType::kCopyDone, wire::CopyDone{begin_.step}, deadline));
  return ReceiveStepEnd(*channel_, peer_, begin_.step, plan_.digest_count, &end_, deadline);
}

Status ShmHandle::Verify(std::span<const uint64_t> digests, int64_t step,
                         const Deadline& deadline) {
  if (to_host_) return gpu_to_host_.Verify(digests, step);
  if (gpu_) return gpu_path_.Verify(digests, step, deadline);
  if (to_gpu_) return host_to_gpu_.Verify(digests, step, deadline);
  return host_.Verify(digests, welcome_.digest_kind, step);
}

Status ShmHandle::Commit(const Deadline& deadline) {
  if (to_host_) return gpu_to_host_.Commit();
  if (gpu_) return gpu_path_.Commit(deadline);
  if (to_gpu_) return host_to_gpu_.Commit(deadline);
  return host_.Commit();
}

Status ShmHandle::Release() {
  Status result;
  // Reverse order of creation: data paths (staging, workers, GPU mappings), mapping, connection.
  if (Status s = gpu_path_.Release(); !s.ok()) {
    WS_LOG(WARN, "cuda-ipc") << "release: " << s;
    result.Update(s);
  }
  if (Status s = gpu_to_host_.Release(); !s.ok()) {
    WS_LOG(WARN, "cuda-ipc") << "release: " << s;
    result.Update(s);
  }
  to_host_ = false;
  if (Status s = host_to_gpu_.Release(); !s.ok()) {  // unpins before the unmap below
    WS_LOG(WARN, "shm") << "release: " << s;
    result.Update(s);
  }
  to_gpu_ = false;
  if (Status s = host_.Release(); !s.ok()) {
    WS_LOG(WARN, "shm") << "release: " << s;
    result.Update(s);
  }
  if (Status s = mapping_.Close(); !s.ok()) {
    WS_LOG(WARN, "shm") << "release: " << s;
    result.Update(s);
  }
  if (Status s = arena_fd_.Close(); !s.ok()) {  // connected but never prepared
    WS_LOG(WARN, "shm") << "release: arena fd of " << peer_ << ": " << s;
    result.Update(s);
  }
  connected_ = false;
  if (channel_) {
    if (Status s = channel_->Close(); !s.ok()) {
      WS_LOG(WARN, "shm") << "release: connection to " << peer_ << ": " << s;
      result.Update(s);
    }
    channel_.reset();
    LedgerAdd(LedgerItem::kConnections, -1);
  }
  if (counted_) {
    counted_ = false;
    LedgerAdd(LedgerItem::kHandles, -1);
  }
  return result;
}

}  // namespace

Result<util::UniqueFd> ConnectUnix(const std::string& path, const util::Deadline& deadline) {
  int raw = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (raw < 0) return Status::FromErrno(errno, "socket");
  util::UniqueFd fd(raw);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  // A listening publisher accepts at once; retry briefly while it starts (ENOENT/ECONNREFUSED).
  while (true) {
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) break;
    int err = errno;
    if (err == EINTR) continue;
    if (deadline.cancelled()) return Status::Cancelled("connecting to '", path, "': cancelled");
    if ((err == ENOENT || err == ECONNREFUSED) && !deadline.expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (err == ENOENT || err == ECONNREFUSED) {
      return Status::NotFound("no publisher is serving '", path, "' (", std::strerror(err), ")");
    }
    return Status::FromErrno(err, "connect '" + path + "'");
  }
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Status::FromErrno(errno, "SO_PEERCRED on '" + path + "'");
  }
  if (cred.uid != ::getuid()) {
    return Status::Unauthenticated("'", path, "' is served by uid ", cred.uid,
                                   ", not by this user (uid ", ::getuid(), ")");
  }
  return fd;
}

std::unique_ptr<TransferHandle> NewShmHandle(const Endpoint& endpoint,
                                             const SubscriberOptions& options) {
  return std::make_unique<ShmHandle>(endpoint, options);
}

}  // namespace weightsync::transport::shm
