// Which copy kernel moves a model's tensors, device to device on one GPU, closest to the speed of
// one flat cudaMemcpyAsync of the same bytes? The question behind issue 16's "≥0.95× of a device
// copy": a step on one GPU copies every tensor out of one packed arena (or the trainer's own
// memory) into the engine's separate allocations; the runtime makes each copy a launch of its own,
// our copy group makes them one. This probe times, on the qwen2.5-7b tensor mix (339 tensors,
// 15.2 GB bf16; src packed 256-byte aligned as the arena packs it, dst one cudaMalloc per tensor):
//   flat        one cudaMemcpyAsync of all the bytes into one buffer (the reference)
//   per_tensor  one cudaMemcpyAsync per tensor
//   group       weightsync's copy group (cuda::PrepareCopyGroup) over every tensor
//   v_*         copy-kernel variants: threads per block, 16-byte loads in flight per thread, job
//               size, job assignment (round robin or contiguous ranges), cache hints, grid
//   batch       one cudaMemcpyBatchAsync of every tensor on one stream
//   per_tensor_streamsN  the per-tensor copies round robin over N streams
//   batch_lanesN         cuda::CutIntoLanes runs, one cudaMemcpyBatchAsync per stream, N streams
//   copy_queue  cuda::CopyQueue::EnqueueBatch of the prepared batch (the product's copy lanes)
//   copy_queue_host  the same host-timed, finished by CopyQueue::Wait (the paths' polled wait)
//               and by cudaStreamSynchronize: what the wait adds to a step
//   hybrid      copy engines (first tensors, a share of the bytes) and the kernel at once
//   tma_*       TMA bulk copies, global -> shared -> global, pipelines of S stages
// Each row: median of --reps timed runs after two warm-ups (cudaEvents), GB/s and its ratio to
// flat, and a byte-for-byte check of the destination (every variant must copy exactly).
// --src says where the source lives: "own" (one cudaMalloc of this process, the default), "cumem"
// (this process's 20 MiB cuMem chunks, as a GPU arena or PyTorch's expandable segments) or "ipc"
// (one cudaMalloc of a child process, opened here by its CUDA IPC handle: the zero-copy
// publisher's `cudaMalloc` memory); "ipc" and "cumem" also time the flat copy from one cudaMalloc
// of this process ("flat_own"), so one run says what the source's kind costs. --round-to N: the
// owner's cudaMalloc is the bytes rounded up to a multiple of N (PyTorch's caching allocator
// rounds large blocks to 2 MiB). Across GPUs (issue 18: copy kernels against the copy engines over
// NVLink): --src-device / --dst-device place the source and the destinations, --run-on the stream
// every row runs on (default the source's GPU: kernels write across the link; the destination's:
// they read across it).
// Prints one JSON object per line. Not a test: bench/results keeps what it printed.
#include <cuda_runtime.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/kernels.h"
#include "cuda/vmm.h"
#include "model_presets.h"
#include "spawn_self.h"
#include "util/deadline.h"

namespace {

#define CHECK_CUDA(expr)                                                                         \
  do {                                                                                           \
    cudaError_t e_ = (expr);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

struct Job {
  const uint8_t* src;
  uint8_t* dst;
  uint64_t bytes;
};

enum Hint { kPlain = 0, kStreaming = 1, kNoAllocate = 2 };

template <int H>
__device__ __forceinline__ uint4 Load(const uint4* p) {
  if constexpr (H == kStreaming) return __ldcs(p);
  if constexpr (H == kNoAllocate) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
  }
  return *p;
}

template <int H>
__device__ __forceinline__ void Store(uint4* p, uint4 v) {
  if constexpr (H == kPlain) {
    *p = v;
  } else {
    __stcs(p, v);
  }
}

// One job by the whole block: tiles of T × U vectors, every load of a tile issued before its
// stores, each warp's loads contiguous.
template <int T, int U, int H>
__device__ __forceinline__ void BlockCopy(const Job& job) {
  const uint4* s = reinterpret_cast<const uint4*>(job.src);
  uint4* d = reinterpret_cast<uint4*>(job.dst);
  const uint64_t n = job.bytes / 16;
  uint64_t base = 0;
  for (; base + uint64_t(T) * U <= n; base += uint64_t(T) * U) {
    uint4 r[U];
#pragma unroll
    for (int k = 0; k < U; ++k) r[k] = Load<H>(s + base + k * T + threadIdx.x);
#pragma unroll
    for (int k = 0; k < U; ++k) Store<H>(d + base + k * T + threadIdx.x, r[k]);
  }
  for (uint64_t v = base + threadIdx.x; v < n; v += T) Store<H>(d + v, Load<H>(s + v));
  for (uint64_t i = n * 16 + threadIdx.x; i < job.bytes; i += T) job.dst[i] = job.src[i];
}

// A = 0: block b copies jobs b, b + grid, ... (as the copy group does today).
// A = 1: block b copies the contiguous range [b·count/grid, (b+1)·count/grid).
template <int T, int U, int H, int A>
__global__ void __launch_bounds__(T) GroupVariant(const Job* __restrict__ jobs, uint32_t count) {
  if constexpr (A == 0) {
    for (uint32_t j = blockIdx.x; j < count; j += gridDim.x) BlockCopy<T, U, H>(jobs[j]);
  } else {
    const uint32_t lo = uint64_t(count) * blockIdx.x / gridDim.x;
    const uint32_t hi = uint64_t(count) * (blockIdx.x + 1) / gridDim.x;
    for (uint32_t j = lo; j < hi; ++j) BlockCopy<T, U, H>(jobs[j]);
  }
}

// ---- TMA bulk copies (sm_90): global -> shared -> global by one thread per block --------------
__device__ __forceinline__ uint32_t Smem(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void BarInit(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(Smem(bar)) : "memory");
}
__device__ __forceinline__ void BarExpect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(Smem(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void BarWait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}\n" ::"r"(Smem(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void BulkLoad(void* smem, const void* src, uint32_t bytes,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(Smem(smem)),
      "l"(src), "r"(bytes), "r"(Smem(bar))
      : "memory");
}
__device__ __forceinline__ void BulkStore(void* dst, const void* smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst),
               "r"(Smem(smem)), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void BulkWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// S buffers of P bytes in shared memory; K loads in flight. Pieces: each job of the block (round
// robin) cut into P-byte pieces. Sizes must be multiples of 16 (checked by the mismatch count).
template <int S, int K, uint32_t P>
__global__ void __launch_bounds__(32) TmaGroup(const Job* __restrict__ jobs, uint32_t count) {
  extern __shared__ __align__(128) uint8_t buf[];
  __shared__ __align__(8) uint64_t bar[S];
  if (threadIdx.x != 0) return;
  for (int s = 0; s < S; ++s) BarInit(&bar[s]);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  uint8_t* pdst[S] = {};
  uint32_t pbytes[S] = {};
  uint64_t loaded = 0, stored = 0;
  auto complete = [&] {
    const uint32_t s = stored % S;
    BarWait(&bar[s], uint32_t(stored / S) & 1);
    BulkStore(pdst[s], buf + uint64_t(s) * P, pbytes[s]);
    ++stored;
  };
  uint64_t off = 0;
  for (uint32_t j = blockIdx.x; j < count;) {
    const Job job = jobs[j];
    const uint32_t b = uint32_t(min(uint64_t(P), job.bytes - off));
    const uint32_t s = loaded % S;
    if (loaded >= S) BulkWaitRead<S - K - 1>();  // the store of piece loaded - S read buffer s
    BarExpect(&bar[s], b);
    BulkLoad(buf + uint64_t(s) * P, job.src + off, b, &bar[s]);
    pdst[s] = job.dst + off;
    pbytes[s] = b;
    ++loaded;
    if (loaded - stored > K) complete();
    off += b;
    if (off >= job.bytes) off = 0, j += gridDim.x;
  }
  while (stored < loaded) complete();
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

__global__ void CountMismatches(const Job* __restrict__ jobs, uint32_t count,
                                unsigned long long* bad) {
  for (uint32_t j = blockIdx.x; j < count; j += gridDim.x) {
    const Job job = jobs[j];
    unsigned long long n = 0;
    for (uint64_t i = threadIdx.x; i < job.bytes; i += blockDim.x) n += job.src[i] != job.dst[i];
    if (n) atomicAdd(bad, n);
  }
}

__global__ void Fill(uint8_t* p, uint64_t bytes) {
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes;
       i += uint64_t(gridDim.x) * blockDim.x) {
    p[i] = uint8_t((i * 2654435761u) >> 13);
  }
}

struct Setup {
  std::vector<uint64_t> sizes;
  uint8_t* src = nullptr;         // packed, each tensor at a 256-byte boundary
  std::vector<uint64_t> offsets;  // into src
  std::vector<uint8_t*> dst;      // one allocation per tensor
  uint8_t* flat_dst = nullptr;    // total bytes, for the flat reference
  uint64_t total = 0, packed = 0;
};

std::vector<Job> Jobs(const Setup& s, uint64_t chunk) {
  std::vector<Job> jobs;
  for (size_t i = 0; i < s.sizes.size(); ++i) {
    for (uint64_t off = 0; off < s.sizes[i]; off += chunk) {
      jobs.push_back(
          Job{s.src + s.offsets[i] + off, s.dst[i] + off, std::min(chunk, s.sizes[i] - off)});
    }
  }
  return jobs;
}

template <typename F>
double MedianMs(cudaStream_t stream, int reps, F&& launch) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 2; ++i) launch();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(a, stream));
    launch();
    CHECK_CUDA(cudaEventRecord(b, stream));
    CHECK_CUDA(cudaEventSynchronize(b));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Probe {
  Setup& s;
  cudaStream_t stream;
  int reps;
  double flat_ms = 0;
  Job* verify_table = nullptr;
  uint32_t verify_count = 0;
  unsigned long long* bad = nullptr;

  void ClearDst() {
    for (size_t i = 0; i < s.sizes.size(); ++i) {
      CHECK_CUDA(cudaMemsetAsync(s.dst[i], 0, s.sizes[i], stream));
    }
  }
  unsigned long long Mismatches() {
    CHECK_CUDA(cudaMemsetAsync(bad, 0, sizeof(*bad), stream));
    CountMismatches<<<1024, 256, 0, stream>>>(verify_table, verify_count, bad);
    unsigned long long h = 0;
    CHECK_CUDA(cudaMemcpyAsync(&h, bad, sizeof(h), cudaMemcpyDeviceToHost, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    return h;
  }
  template <typename F>
  void Row(const std::string& name, const std::string& extra, bool verify, F&& launch) {
    if (verify) ClearDst();
    const double ms = MedianMs(stream, reps, launch);
    CHECK_CUDA(cudaGetLastError());
    if (name == "flat") flat_ms = ms;
    const long long bad_bytes = verify ? (long long)Mismatches() : -1;
    std::printf(
        "{\"row\":\"%s\",%s\"ms\":%.4f,\"gbps\":%.1f,\"vs_flat\":%.4f,\"mismatched_bytes\":%lld}\n",
        name.c_str(), extra.c_str(), ms, s.total / ms / 1e6, flat_ms > 0 ? flat_ms / ms : 0.0,
        bad_bytes);
    std::fflush(stdout);
  }
};

// Side streams forked from and joined back to one stream by events.
struct Lanes {
  std::vector<cudaStream_t> streams;
  std::vector<cudaEvent_t> done;
  cudaEvent_t fork = nullptr;
  explicit Lanes(size_t n) : streams(n), done(n) {
    CHECK_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    for (size_t k = 0; k < n; ++k) {
      CHECK_CUDA(cudaStreamCreateWithFlags(&streams[k], cudaStreamNonBlocking));
      CHECK_CUDA(cudaEventCreateWithFlags(&done[k], cudaEventDisableTiming));
    }
  }
  void Fork(cudaStream_t from) {
    CHECK_CUDA(cudaEventRecord(fork, from));
    for (cudaStream_t l : streams) CHECK_CUDA(cudaStreamWaitEvent(l, fork));
  }
  void Join(cudaStream_t into) {
    for (size_t k = 0; k < streams.size(); ++k) {
      CHECK_CUDA(cudaEventRecord(done[k], streams[k]));
      CHECK_CUDA(cudaStreamWaitEvent(into, done[k]));
    }
  }
};

// The job table in device memory (the caller frees it).
Job* UploadJobs(const std::vector<Job>& jobs) {
  Job* table = nullptr;
  CHECK_CUDA(cudaMalloc(&table, jobs.size() * sizeof(Job)));
  CHECK_CUDA(cudaMemcpy(table, jobs.data(), jobs.size() * sizeof(Job), cudaMemcpyHostToDevice));
  return table;
}

// As many blocks of `kernel` as stay resident at once (at most per_sm_cap per SM when > 0), no
// more than there are jobs.
template <typename Kernel>
uint32_t ResidentGrid(Kernel kernel, int threads, int smem, int per_sm_cap, size_t jobs) {
  int per_sm = 0, sms = 0, dev = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  if (per_sm_cap > 0) per_sm = std::min(per_sm, per_sm_cap);
  return uint32_t(std::min<uint64_t>(uint64_t(sms) * per_sm, jobs));
}

template <int T, int U, int H, int A>
void Variant(Probe& p, const char* tag, uint64_t chunk, int per_sm_cap) {
  const std::vector<Job> jobs = Jobs(p.s, chunk);
  Job* table = UploadJobs(jobs);
  const uint32_t grid = ResidentGrid(GroupVariant<T, U, H, A>, T, 0, per_sm_cap, jobs.size());
  const uint32_t count = uint32_t(jobs.size());
  char extra[256];
  std::snprintf(extra, sizeof(extra),
                "\"threads\":%d,\"unroll\":%d,\"hint\":%d,\"assign\":\"%s\",\"chunk_kib\":%llu,"
                "\"grid\":%u,\"jobs\":%u,",
                T, U, H, A == 0 ? "round_robin" : "contiguous", (unsigned long long)(chunk >> 10),
                grid, count);
  p.Row(std::string("v_") + tag, extra, true,
        [&] { GroupVariant<T, U, H, A><<<grid, T, 0, p.stream>>>(table, count); });
  CHECK_CUDA(cudaFree(table));
}

template <int S, int K, uint32_t P>
void Tma(Probe& p, const char* tag, uint64_t chunk, int per_sm_cap) {
  const std::vector<Job> jobs = Jobs(p.s, chunk);
  Job* table = UploadJobs(jobs);
  const int smem = S * int(P);
  CHECK_CUDA(
      cudaFuncSetAttribute(TmaGroup<S, K, P>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const uint32_t grid = ResidentGrid(TmaGroup<S, K, P>, 32, smem, per_sm_cap, jobs.size());
  const uint32_t count = uint32_t(jobs.size());
  char extra[256];
  std::snprintf(extra, sizeof(extra),
                "\"stages\":%d,\"in_flight\":%d,\"piece_kib\":%u,\"chunk_kib\":%llu,\"grid\":%u,"
                "\"jobs\":%u,",
                S, K, P >> 10, (unsigned long long)(chunk >> 10), grid, count);
  p.Row(std::string("tma_") + tag, extra, true,
        [&] { TmaGroup<S, K, P><<<grid, 32, smem, p.stream>>>(table, count); });
  CHECK_CUDA(cudaFree(table));
}

}  // namespace

// The "ipc" source's owner (a child of the probe): one cudaMalloc of `bytes`, filled; prints its
// IPC handle in hex and keeps the memory until its stdin closes.
int RunOwner(uint64_t bytes, uint64_t round_to) {
  uint8_t* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, round_to > 1 ? (bytes + round_to - 1) / round_to * round_to : bytes));
  Fill<<<1024, 256>>>(p, bytes);
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaIpcMemHandle_t h;
  CHECK_CUDA(cudaIpcGetMemHandle(&h, p));
  for (size_t i = 0; i < sizeof(h); ++i) std::printf("%02x", uint8_t(h.reserved[i]));
  std::printf("\n");
  std::fflush(stdout);
  while (std::getchar() != EOF) {
  }
  return 0;
}

// Spawns the owner of `bytes` (a child of this probe) and opens its memory here.
uint8_t* OpenOwnersMemory(uint64_t bytes, uint64_t round_to, weightsync::bench::SelfChild* owner) {
  *owner = weightsync::bench::SpawnSelf(
      {"--owner", std::to_string(bytes), "--round-to", std::to_string(round_to)});
  FILE* out = owner->out;
  char hex[2 * sizeof(cudaIpcMemHandle_t) + 2] = {};
  if (!std::fgets(hex, sizeof(hex), out)) std::exit(1);
  std::fclose(out);
  owner->out = nullptr;
  cudaIpcMemHandle_t h;
  for (size_t i = 0; i < sizeof(h); ++i) {
    unsigned v = 0;
    std::sscanf(hex + 2 * i, "%2x", &v);
    h.reserved[i] = char(v);
  }
  void* p = nullptr;
  CHECK_CUDA(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
  return static_cast<uint8_t*>(p);
}

int main(int argc, char** argv) {
  int reps = 10;
  std::string preset = "qwen2.5-7b";
  std::string src_kind = "own";
  uint64_t round_to = 0;
  int src_device = 0, dst_device = 0, run_on = -1;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--round-to") && i + 1 < argc) round_to = std::stoull(argv[++i]);
  }
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--owner") && i + 1 < argc) {
      return RunOwner(std::stoull(argv[i + 1]), round_to);
    }
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--preset") && i + 1 < argc) preset = argv[++i];
    if (!std::strcmp(argv[i], "--src") && i + 1 < argc) src_kind = argv[++i];
    if (!std::strcmp(argv[i], "--src-device") && i + 1 < argc) src_device = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--dst-device") && i + 1 < argc) dst_device = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--run-on") && i + 1 < argc) run_on = std::atoi(argv[++i]);
  }
  if (run_on < 0) run_on = src_device;
  if (src_kind != "own" && src_kind != "cumem" && src_kind != "ipc") {
    return std::fprintf(stderr, "--src: own, cumem or ipc, not %s\n", src_kind.c_str()), 1;
  }
  if (src_kind == "cumem" && run_on != src_device) {
    // ChunkedAllocation grants access to its own device only.
    return std::fprintf(stderr, "--src cumem: rows run on the source's GPU (--run-on)\n"), 1;
  }
  if (src_kind == "ipc" && src_device != 0) {
    return std::fprintf(stderr, "--src ipc: the owner allocates on device 0\n"), 1;
  }
  // Across GPUs the kernels on `run_on` read or write the other GPU's memory (peer access both
  // ways, so that the byte check on `run_on` reads both sides too).
  for (int a : {src_device, dst_device, run_on}) {
    for (int b : {src_device, dst_device, run_on}) {
      if (a == b) continue;
      CHECK_CUDA(cudaSetDevice(a));
      const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) CHECK_CUDA(e);
      (void)cudaGetLastError();
    }
  }
  using namespace weightsync;
  auto config = tools::FindPreset(preset);
  if (!config.ok()) return std::fprintf(stderr, "%s\n", config.status().ToString().c_str()), 1;
  auto specs = tools::BuildTensors(*config, DType::kBFloat16);
  if (!specs.ok()) return std::fprintf(stderr, "%s\n", specs.status().ToString().c_str()), 1;

  Setup s;
  for (const TensorSpec& t : *specs) {
    s.offsets.push_back(s.packed);
    s.sizes.push_back(t.nbytes);
    s.total += t.nbytes;
    s.packed += (t.nbytes + 255) / 256 * 256;
  }
  weightsync::bench::SelfChild owner;
  cuda::ChunkedAllocation chunks;
  uint8_t* own_src = nullptr;  // "flat_own"'s source when s.src is not this process's cudaMalloc
  CHECK_CUDA(cudaSetDevice(src_device));
  if (src_kind == "ipc") {
    s.src = OpenOwnersMemory(s.packed, round_to, &owner);
  } else if (src_kind == "cumem") {
    auto c = cuda::ChunkedAllocation::Create(src_device, s.packed, true, uint64_t{20} << 20);
    if (!c.ok()) return std::fprintf(stderr, "%s\n", c.status().ToString().c_str()), 1;
    chunks = std::move(c).value();
    s.src = chunks.data();
  } else {
    CHECK_CUDA(cudaMalloc(&s.src, s.packed));
  }
  if (src_kind != "own") CHECK_CUDA(cudaMalloc(&own_src, s.packed));
  if (src_kind != "ipc") Fill<<<1024, 256>>>(s.src, s.packed);
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaSetDevice(dst_device));
  CHECK_CUDA(cudaMalloc(&s.flat_dst, s.total));
  for (uint64_t n : s.sizes) {
    uint8_t* d = nullptr;
    CHECK_CUDA(cudaMalloc(&d, n));
    s.dst.push_back(d);
  }
  CHECK_CUDA(cudaSetDevice(run_on));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, run_on));
  std::printf(
      "{\"device\":\"%s\",\"sms\":%d,\"preset\":\"%s\",\"src\":\"%s\",\"round_to\":%llu,"
      "\"src_device\":%d,\"dst_device\":%d,\"run_on\":%d,\"tensors\":%zu,\"bytes\":%llu,"
      "\"reps\":%d}\n",
      prop.name, prop.multiProcessorCount, preset.c_str(), src_kind.c_str(),
      (unsigned long long)round_to, src_device, dst_device, run_on, s.sizes.size(),
      (unsigned long long)s.total, reps);

  Probe p{s, stream, reps};
  CHECK_CUDA(cudaMalloc(&p.bad, sizeof(*p.bad)));
  const std::vector<Job> verify = Jobs(s, uint64_t{1} << 20);
  p.verify_table = UploadJobs(verify);
  p.verify_count = uint32_t(verify.size());

  p.Row("flat", "", false, [&] {
    CHECK_CUDA(cudaMemcpyAsync(s.flat_dst, s.src, s.total, cudaMemcpyDeviceToDevice, stream));
  });
  if (own_src) {
    p.Row("flat_own", "", false, [&] {
      CHECK_CUDA(cudaMemcpyAsync(s.flat_dst, own_src, s.total, cudaMemcpyDeviceToDevice, stream));
    });
  }
  p.Row("per_tensor", "", true, [&] {
    for (size_t i = 0; i < s.sizes.size(); ++i) {
      CHECK_CUDA(cudaMemcpyAsync(s.dst[i], s.src + s.offsets[i], s.sizes[i],
                                 cudaMemcpyDeviceToDevice, stream));
    }
  });
  {
    std::vector<cuda::SingleCopy> copies;
    for (size_t i = 0; i < s.sizes.size(); ++i) {
      copies.push_back(cuda::SingleCopy{s.dst[i], s.src + s.offsets[i], s.sizes[i]});
    }
    auto group = cuda::PrepareCopyGroup(copies, stream);
    if (!group.ok()) return std::fprintf(stderr, "%s\n", group.status().ToString().c_str()), 1;
    p.Row("group", "", true, [&] {
      const Status st = group->Launch();
      if (!st.ok()) std::fprintf(stderr, "%s\n", st.ToString().c_str()), std::exit(1);
    });
  }
  constexpr uint64_t K = 1024;
  // As the group today (256 threads, 4 in flight, 1 MiB round robin), then one change at a time.
  Variant<256, 4, kPlain, 0>(p, "base", 1024 * K, 0);
  Variant<256, 4, kPlain, 0>(p, "chunk256k", 256 * K, 0);
  Variant<256, 4, kPlain, 0>(p, "chunk4m", 4096 * K, 0);
  Variant<256, 4, kPlain, 1>(p, "contiguous", 1024 * K, 0);
  Variant<256, 4, kPlain, 1>(p, "contiguous64k", 64 * K, 0);
  Variant<256, 8, kPlain, 0>(p, "unroll8", 1024 * K, 0);
  Variant<256, 2, kPlain, 0>(p, "unroll2", 1024 * K, 0);
  Variant<512, 4, kPlain, 0>(p, "t512", 1024 * K, 0);
  Variant<1024, 4, kPlain, 0>(p, "t1024", 1024 * K, 0);
  Variant<256, 4, kStreaming, 0>(p, "streaming", 1024 * K, 0);
  Variant<256, 4, kNoAllocate, 0>(p, "noalloc", 1024 * K, 0);
  Variant<256, 8, kStreaming, 0>(p, "streaming_u8", 1024 * K, 0);
  Variant<256, 4, kPlain, 0>(p, "grid2", 1024 * K, 2);
  Variant<256, 4, kPlain, 0>(p, "grid4", 1024 * K, 4);
  Variant<256, 8, kStreaming, 0>(p, "streaming_u8_256k", 256 * K, 0);
  Variant<256, 8, kStreaming, 1>(p, "streaming_u8_contig64k", 64 * K, 0);
  Variant<512, 8, kStreaming, 0>(p, "streaming_t512_u8", 1024 * K, 0);
  Variant<1024, 4, kStreaming, 1>(p, "streaming_t1024_contig256k", 256 * K, 0);
  // The tensor copies as the arrays a batch call takes.
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  for (size_t i = 0; i < s.sizes.size(); ++i) {
    dsts.push_back(s.dst[i]);
    srcs.push_back(s.src + s.offsets[i]);
    sizes.push_back(s.sizes[i]);
  }
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t attr_index = 0;
  // Tensor copies in one cudaMemcpyBatchAsync (what the product does for copies >= 16 MiB).
  p.Row("batch", "", true, [&] {
    CHECK_CUDA(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr,
                                    &attr_index, 1, stream));
  });
  // Per-tensor copies spread round robin over n streams.
  for (size_t n : {size_t{2}, size_t{4}, size_t{8}}) {
    Lanes lanes(n);
    p.Row("per_tensor_streams" + std::to_string(n), "", true, [&] {
      lanes.Fork(stream);
      for (size_t i = 0; i < s.sizes.size(); ++i) {
        CHECK_CUDA(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDeviceToDevice,
                                   lanes.streams[i % n]));
      }
      lanes.Join(stream);
    });
  }
  // Contiguous runs of about equal bytes (cuda::CutIntoLanes), one cudaMemcpyBatchAsync per
  // stream: the lanes CopyQueue uses, with 2, 4 and 8 of them.
  for (size_t n : {size_t{2}, size_t{4}, size_t{8}}) {
    const cuda::LaneCuts cuts = cuda::CutIntoLanes(sizes, n);
    Lanes lanes(cuts.count);
    p.Row("batch_lanes" + std::to_string(n), "", true, [&] {
      lanes.Fork(stream);
      for (size_t k = 0; k < cuts.count; ++k) {
        const size_t b = cuts.begin[k];
        CHECK_CUDA(cudaMemcpyBatchAsync(dsts.data() + b, srcs.data() + b, sizes.data() + b,
                                        cuts.begin[k + 1] - b, &attr, &attr_index, 1,
                                        lanes.streams[k]));
      }
      lanes.Join(stream);
    });
  }
  // The product's own path: a CopyQueue given the prepared batch (its copy lanes).
  {
    auto queue = cuda::CopyQueue::Create(run_on);
    if (!queue.ok()) return std::fprintf(stderr, "%s\n", queue.status().ToString().c_str()), 1;
    cuda::CopyBatch batch;
    for (size_t i = 0; i < s.sizes.size(); ++i)
      batch.Add(s.dst[i], s.src + s.offsets[i], s.sizes[i], i);
    auto qstream = static_cast<cudaStream_t>(queue->stream());
    CHECK_CUDA(cudaStreamSynchronize(stream));
    Probe q{s, qstream, reps, p.flat_ms, p.verify_table, p.verify_count, p.bad};
    q.Row("copy_queue", "", true, [&] {
      const Status st = queue->EnqueueBatch(batch);
      if (!st.ok()) std::fprintf(stderr, "%s\n", st.ToString().c_str()), std::exit(1);
    });
    std::printf("{\"copy_queue_side_lanes\":%zu}\n", queue->side_lanes());
    // Host-timed, as a step sees it: the batch then CopyQueue::Wait (polled under a deadline, as
    // the paths wait) against the batch then cudaStreamSynchronize (blocking, no deadline).
    const util::Deadline deadline(std::chrono::seconds(30));
    auto host_ms = [&](auto&& finish) {
      std::vector<double> ms;
      for (int i = 0; i < reps + 2; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        const Status st = queue->EnqueueBatch(batch);
        if (!st.ok()) std::fprintf(stderr, "%s\n", st.ToString().c_str()), std::exit(1);
        finish();
        const std::chrono::duration<double, std::milli> d = std::chrono::steady_clock::now() - t0;
        if (i >= 2) ms.push_back(d.count());
      }
      std::sort(ms.begin(), ms.end());
      return ms[ms.size() / 2];
    };
    const double waited = host_ms([&] {
      const Status st = queue->Wait(deadline);
      if (!st.ok()) std::fprintf(stderr, "%s\n", st.ToString().c_str()), std::exit(1);
    });
    const double synced = host_ms([&] { CHECK_CUDA(cudaStreamSynchronize(qstream)); });
    std::printf(
        "{\"row\":\"copy_queue_host\",\"wait_ms\":%.4f,\"sync_ms\":%.4f,"
        "\"wait_over_sync_us\":%.1f}\n",
        waited, synced, (waited - synced) * 1e3);
  }
  // Copy engines and SMs at once: the first tensors (about `share` of the bytes) by runtime copies
  // on a side stream, the rest by the 512-thread kernel on `stream`.
  for (double share : {0.5, 0.7, 0.85}) {
    std::vector<char> by_ce(s.sizes.size(), 0);
    uint64_t ce_bytes = 0;
    for (size_t i = 0; i < s.sizes.size() && ce_bytes < share * s.total; ++i) {
      by_ce[i] = 1;
      ce_bytes += s.sizes[i];
    }
    std::vector<Job> jobs;
    for (size_t i = 0; i < s.sizes.size(); ++i) {
      if (by_ce[i]) continue;
      for (uint64_t off = 0; off < s.sizes[i]; off += uint64_t{1} << 20) {
        jobs.push_back(Job{s.src + s.offsets[i] + off, s.dst[i] + off,
                           std::min(uint64_t{1} << 20, s.sizes[i] - off)});
      }
    }
    Job* table = UploadJobs(jobs);
    Lanes side(1);
    char extra[128];
    std::snprintf(extra, sizeof(extra), "\"ce_share\":%.3f,", double(ce_bytes) / s.total);
    p.Row("hybrid", extra, true, [&] {
      side.Fork(stream);
      for (size_t i = 0; i < s.sizes.size(); ++i) {
        if (by_ce[i]) {
          CHECK_CUDA(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDeviceToDevice,
                                     side.streams[0]));
        }
      }
      GroupVariant<512, 8, kStreaming, 0><<<264, 512, 0, stream>>>(table, uint32_t(jobs.size()));
      side.Join(stream);
    });
    CHECK_CUDA(cudaFree(table));
  }
  Tma<8, 4, 16 * 1024>(p, "s8_k4_16k", 1024 * K, 0);
  Tma<4, 2, 32 * 1024>(p, "s4_k2_32k", 1024 * K, 0);
  Tma<8, 6, 8 * 1024>(p, "s8_k6_8k", 1024 * K, 0);
  Tma<16, 12, 8 * 1024>(p, "s16_k12_8k", 1024 * K, 0);
  Tma<6, 4, 32 * 1024>(p, "s6_k4_32k", 1024 * K, 0);
  Tma<8, 4, 16 * 1024>(p, "s8_k4_16k_256k", 256 * K, 0);
  Tma<4, 2, 16 * 1024>(p, "s4_k2_16k", 1024 * K, 0);
  // The flat reference again: how much the machine drifted over the run.
  p.Row("flat", "", false, [&] {
    CHECK_CUDA(cudaMemcpyAsync(s.flat_dst, s.src, s.total, cudaMemcpyDeviceToDevice, stream));
  });
  if (owner.pid > 0) {
    CHECK_CUDA(cudaIpcCloseMemHandle(s.src));
    std::fclose(owner.in);
    int status = 0;
    waitpid(owner.pid, &status, 0);
  }
  return 0;
}
