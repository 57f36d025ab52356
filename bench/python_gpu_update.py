"""weightsync through Python on the GPU, against the same transfer in C++ and against what Python
RL stacks do today, every row in one run on one machine.

    python3 bench/python_gpu_update.py [--scale 1] [--steps 20] [--build build-gpu]
        [--ckpt .baselines/checkpoint_engine] [--json python_gpu_update.json] [--rows ...]

(scripts/python_gpu_test.sh bench runs it on the GPU machine, building what it needs.)
The model: Qwen2.5-7B shapes in bfloat16, 339 tensors, 15.2 GB at --scale 1 (bench/model_shapes.py:
the tensors of tools/model_presets.cc, which ws_gpu_update moves; --scale shrinks it the same
way). The publisher (trainer) always holds its tensors on cuda:--src; the engine's tensors are on
cuda:1 when two GPUs exist (--dst), else on the same GPU. Rows (--rows picks some):

  limit      one GPU: a torch device-to-device copy of the same bytes (one copy_ of a flat
             buffer); two GPUs: the same as a peer copy src -> dst
  python     weightsync through Python: a publisher process (torch tensors, publish(step)) and
             Subscriber.update(step) in this one into preallocated torch tensors (cuda-ipc,
             --mode, default in_place); steady median and first update; Python allocations per
             steady update (tracemalloc and sys.getallocatedblocks: the target is 0); a last
             update with verify=True checks the bytes (GPU digests)
  zerocopy   the python row with PublisherOptions.zero_copy: the trainer's torch tensors are the
             published version (no arena; each update reads them in place), from PyTorch's caching
             allocator as it comes (cudaMalloc segments, shared by CUDA IPC handles)
  zerocopy_expandable
             the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the trainer's
             process (cuMem chunks, shared by fd); the row checks the segments are expandable
  cpp        the same transfer through the C++ bench binary (BUILD/bench/ws_gpu_update --only
             model, same scale, steps, mode, devices): Python's ratio to it (target <= 1.03)
  torch_ipc  PyTorch CUDA IPC as colocated RL stacks move weights (SGLang's
             update_weights_from_tensor under verl): every step the trainer re-sends
             torch.multiprocessing.reductions.reduce_tensor of every tensor (pickled, over a
             pipe), the engine process rebuilds them (torch caches the opened handles) and copies
             each into its own tensor (load_weights), then answers
  nccl       two GPUs only: torch.distributed NCCL broadcast per tensor, in 1 GiB buckets and as
             one flat buffer (bench/torch_baselines.py's worker, same shapes)
  ckpt       checkpoint-engine 0.4.2 on one GPU (its own bench: --ckpt is a copy of
             shared/baselines/checkpoint_engine inside the checkout, whose run.sh installs its
             wheels and runs it; full scale only): its update from registered pinned host
             buffers with the process group kept, and its whole step from GPU-resident trainer
             tensors (register + gather_metas + update)

Prints a table with each row's time per update, GB/s and ratio to weightsync-through-Python, and
writes every raw figure as JSON. Every child process and wait has a timeout.
"""

import argparse
import gc
import json
import os
import pickle
import select
import shlex
import socket
import statistics
import subprocess
import sys
import time
import tracemalloc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from model_shapes import model_shapes, total_bytes  # noqa: E402

ROWS = ("limit", "python", "zerocopy", "zerocopy_expandable", "cpp", "torch_ipc", "nccl", "ckpt")
# The trainer's memory of each publisher row: (PublisherOptions.zero_copy, expandable segments).
PUBLISHER_ROWS = {"python": (False, False), "zerocopy": (True, False),
                  "zerocopy_expandable": (True, True)}
CKPT_ARGS = "--bucket-gb 8 --updates 4 --keep-pg --e2e-gpu-src --budget-s 150"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0,
                    help="fraction of the 7B-like model (tools/model_presets.cc's rule)")
    ap.add_argument("--steps", type=int, default=20, help="updates per row (the first prepares)")
    ap.add_argument("--mode", choices=["in_place", "staged"], default="in_place")
    ap.add_argument("--build", default="build-gpu", help="CMake build folder of ws_gpu_update")
    ap.add_argument("--json", default="python_gpu_update.json")
    ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated subset of " +
                    ", ".join(ROWS))
    ap.add_argument("--src", type=int, default=0, help="the trainer's GPU")
    ap.add_argument("--dst", type=int, default=None,
                    help="the engine's GPU (default: 1 when two GPUs exist, else --src)")
    ap.add_argument("--ckpt", default=".baselines/checkpoint_engine",
                    help="checkpoint-engine baseline folder (with run.sh); '' skips the row")
    ap.add_argument("--ckpt-args", default=CKPT_ARGS, help="its bench's arguments")
    ap.add_argument("--ckpt-timeout", type=float, default=300.0)
    ap.add_argument("--row-timeout", type=float, default=240.0,
                    help="seconds any other row (and its children) may take")
    ap.add_argument("--cpu", action="store_true",
                    help="check this script without a GPU: the limit and python rows over host "
                         "memory (shared memory), the others skipped; use a small --scale")
    ap.add_argument("--role", default="main", help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", default="", help=argparse.SUPPRESS)
    ap.add_argument("--zero-copy", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not 0 < args.scale <= 16:
        ap.error(f"--scale {args.scale}: must be in (0, 16]")
    if args.steps < 3:
        ap.error("--steps: at least 3 (the first update prepares; the median needs two more)")
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        ap.error(f"--rows: unknown {', '.join(unknown)} (expected some of {', '.join(ROWS)})")
    args.rows = rows
    return args


def median(xs):
    return statistics.median(xs) if xs else None


def device(torch, args, index):
    return torch.device("cpu") if args.cpu else torch.device(f"cuda:{index}")


def synchronize(torch, *devices):
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


# ---- the table (CPU-checkable: python/tests/test_bench_python_gpu.py) ----------------------------

def _fmt_ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:,.1f}"


def _fmt_gbps(nbytes, seconds):
    return "-" if not seconds or not nbytes else f"{nbytes / seconds / 1e9:,.1f}"


def table(results):
    """The report's lines from {row name: result dict}. Each result has `seconds` (median per
    update) and `bytes`, or `skipped` (why); weightsync-through-Python ("python") is the
    reference every ratio is taken against."""
    ws = results.get("python") or {}
    ws_s = ws.get("seconds")
    out = [f"{'row':<62} {'ms/update':>10} {'GB/s':>8}  vs weightsync (Python)"]

    def line(label, r, compare):
        if r is None:
            return
        if r.get("skipped"):
            out.append(f"{label:<62} {'skipped':>10}           {r['skipped']}")
            return
        s = r.get("seconds")
        out.append(f"{label:<62} {_fmt_ms(s):>10} {_fmt_gbps(r.get('bytes'), s):>8}  "
                   f"{compare(s) if s and ws_s else ''}")

    def slower(s):
        return f"{s / ws_s:.2f}x the time" + (" (slower)" if s > ws_s else " (faster)")

    limit = results.get("limit")
    if limit:
        line(limit.get("label", "limit"), limit,
             lambda s: f"weightsync reaches {s / ws_s:.0%} of it")
    line("weightsync through Python (" + ws.get("path", "cuda-ipc") + ")", results.get("python"),
         lambda s: "1")
    if ws.get("library_median_s"):
        out.append(f"{'  of which inside the library (UpdateStats.seconds; copy)':<62} "
                   f"{_fmt_ms(ws['library_median_s']):>10} {_fmt_ms(ws['copy_median_s']):>8}  "
                   f"binding + Python {1e3 * (ws_s - ws['library_median_s']):.2f} ms")
    for row, label in (("zerocopy", "zero-copy, caching allocator (cudaMalloc)"),
                       ("zerocopy_expandable", "zero-copy, expandable segments (cuMem)")):
        r = results.get(row)
        line(f"Python, {label}", r, slower)
        if r and not r.get("skipped"):
            out.append(f"{'  trainer memory for versions (PublishStats.store_bytes); first':<62} "
                       f"{r.get('trainer_store_bytes', 0) / 2**20:>8.0f} MiB "
                       f"{_fmt_ms(r.get('first_update_s')):>6} ms")
    if ws and not ws.get("skipped") and ws.get("trainer_store_bytes") is not None:
        out.append(f"{'  arena publisher: trainer memory for versions (store_bytes)':<62} "
                   f"{ws['trainer_store_bytes'] / 2**20:>8.0f} MiB")
    cpp = results.get("cpp")
    line("weightsync C++ (ws_gpu_update, the same transfer)", cpp,
         lambda s: f"Python {100 * (ws_s / s - 1):+.1f}% vs C++ (target <= +3%)")
    if cpp and cpp.get("copy_median_s"):
        out.append(f"{'  of which copying (UpdateStats.copy_seconds)':<62} "
                   f"{'':>10} {_fmt_ms(cpp['copy_median_s']):>8}")
    if ws and not ws.get("skipped"):
        out.append(f"{'  Python allocations per steady update (tracemalloc bytes, blocks)':<62} "
                   f"{ws.get('tracemalloc_bytes_per_update', 0):>10.1f} "
                   f"{ws.get('blocks_per_update', 0):>8.2f}  target 0")
    line("PyTorch CUDA IPC, reduce_tensor re-sent every step", results.get("torch_ipc"), slower)
    nccl = results.get("nccl")
    if nccl and nccl.get("skipped"):
        line("torch.distributed NCCL broadcast", nccl, slower)
    elif nccl:
        for key, label in (("per_tensor_s", "per tensor"), ("bucketed_s", "in 1 GiB buckets"),
                           ("flat_s", "as one flat buffer")):
            line(f"torch.distributed NCCL broadcast, {label}",
                 {"seconds": nccl.get(key), "bytes": nccl.get("bytes")}, slower)
    ckpt = results.get("ckpt")
    if ckpt and ckpt.get("skipped"):
        line("checkpoint-engine 0.4.2", ckpt, slower)
    elif ckpt:
        line("checkpoint-engine 0.4.2 update (pinned host source, PG kept)",
             {"seconds": ckpt.get("update_keep_pg_s"), "bytes": ckpt.get("bytes")}, slower)
        line("checkpoint-engine 0.4.2 update (library default, PG per update)",
             {"seconds": ckpt.get("update_s"), "bytes": ckpt.get("bytes")}, slower)
        line("checkpoint-engine 0.4.2 whole step from GPU tensors",
             {"seconds": ckpt.get("step_gpu_src_s"), "bytes": ckpt.get("bytes")}, slower)
    return out


# ---- child processes --------------------------------------------------------------------------

class LineChild:
    """A child process answering one line per request, read with deadlines."""

    def __init__(self, cmd, timeout, env=None):
        self.timeout = timeout
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=sys.stderr, env=env)
        self.buf = b""

    def readline(self, timeout=None):
        deadline = time.monotonic() + (timeout or self.timeout)
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise TimeoutError(f"child {self.proc.args[:4]} silent for {self.timeout} s")
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise RuntimeError(f"child exited with {self.proc.wait(30)}")
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def ask(self, text):
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()
        return self.readline()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.kill()


def run_publisher(args):
    """--role publisher: torch tensors of the model on cuda:--src, published on request."""
    import faulthandler

    import torch

    import weightsync

    faulthandler.enable()
    dev = device(torch, args, args.src)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    g = torch.Generator(device=dev).manual_seed(0)
    tensors = {n: torch.empty(s, dtype=torch.bfloat16, device=dev).normal_(generator=g)
               for n, s in model_shapes(args.scale)}
    expandable = 0
    if dev.type == "cuda":  # every segment of the caching allocator an expandable one
        segments = torch.cuda.memory_snapshot()
        expandable = int(bool(segments) and all(x.get("is_expandable") for x in segments))
    with weightsync.Publisher(args.endpoint, timeout=120, zero_copy=args.zero_copy) as pub:
        pub.register(tensors)
        print("ready", pub.endpoint, expandable, flush=True)
        for line in sys.stdin:
            faulthandler.dump_traceback_later(120, exit=True)
            step = int(line.split()[1])
            stats = pub.publish(step)  # a zero-copy publish first waits for the last readers
            print("ok", step, stats.seconds, stats.store_bytes, flush=True)
            faulthandler.cancel_dump_traceback_later()
    return 0


# ---- rows -------------------------------------------------------------------------------------

def row_limit(args, torch, nbytes):
    src, dst = device(torch, args, args.src), device(torch, args, args.dst)
    a = torch.empty(nbytes, dtype=torch.uint8, device=src)
    b = torch.empty(nbytes, dtype=torch.uint8, device=dst)
    times = []
    for i in range(12):
        synchronize(torch, src, dst)
        t0 = time.perf_counter()
        b.copy_(a)
        synchronize(torch, dst, src)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    del a, b
    if not args.cpu:
        torch.cuda.empty_cache()
    same = args.src == args.dst
    label = ("limit: host memcpy of the same bytes (--cpu)" if args.cpu else
             "limit: torch device-to-device copy of the same bytes" if same else
             f"limit: torch peer copy cuda:{args.src} -> cuda:{args.dst}, same bytes")
    return {"what": "limit_d2d_same_gpu" if same else "limit_peer_copy", "label": label,
            "bytes": nbytes, "seconds": median(times), "min_s": min(times)}


def row_python(args, torch, shapes, nbytes, row="python"):
    import weightsync

    zero_copy, expandable = PUBLISHER_ROWS[row]
    dev = device(torch, args, args.dst)
    dst = {n: torch.empty(s, dtype=torch.bfloat16, device=dev) for n, s in shapes}
    endpoint = f"local://ws-py-gpu-bench-{os.getpid()}-{row}"
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if expandable:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    child = LineChild([sys.executable, "-X", "faulthandler", os.path.abspath(__file__), "--role",
                       "publisher", "--endpoint", endpoint, "--scale", repr(args.scale), "--src",
                       str(args.src)] + (["--cpu"] if args.cpu else []) +
                      (["--zero-copy"] if zero_copy else []), timeout=args.row_timeout, env=env)
    try:
        ready = child.readline().split()
        assert ready[0] == "ready", ready
        if ready[2] != str(int(expandable)):
            raise RuntimeError(f"the trainer's segments: expandable={ready[2]}, the row needs "
                               f"{int(expandable)}")
        sub = weightsync.Subscriber(ready[1], mode=args.mode, timeout=120)
        sub.register(dst)
        step, steady, publish, first, path, store_bytes = 0, [], [], None, None, None
        inside, copying = [], []  # the library's own UpdateStats: where a Python gap is

        def one():
            nonlocal step, store_bytes
            step += 1
            answer = child.ask(f"publish {step}").split()
            assert answer[:2] == ["ok", str(step)], answer
            store_bytes = int(answer[3])
            t0 = time.perf_counter()
            stats = sub.update(step)
            return time.perf_counter() - t0, float(answer[2]), stats

        for i in range(args.steps):
            seconds, pub_s, stats = one()
            if i == 0:
                first = seconds
            else:
                steady.append(seconds)
                publish.append(pub_s)
                inside.append(stats.seconds)
                copying.append(stats.copy_seconds)
        # Python allocations that outlive a steady update: live blocks, then traced bytes.
        gc.collect()
        blocks0 = sys.getallocatedblocks()
        for _ in range(20):
            one()
        gc.collect()
        blocks = (sys.getallocatedblocks() - blocks0) / 20
        tracemalloc.start()
        try:
            gc.collect()
            traced0 = tracemalloc.get_traced_memory()[0]
            for _ in range(20):
                one()
            gc.collect()
            traced = (tracemalloc.get_traced_memory()[0] - traced0) / 20
        finally:
            tracemalloc.stop()
        step += 1
        child.ask(f"publish {step}")
        verified = sub.update(step, verify=True).verified  # the bytes, checked on the GPU
        path = ("shm (--cpu), " + args.mode if args.cpu else
                "cuda-ipc, " + args.mode + (f", cuda:{args.src} -> cuda:{args.dst}"
                                            if args.src != args.dst else ", one GPU"))
        path += {"python": "", "zerocopy": ", zero-copy", "zerocopy_expandable":
                 ", zero-copy from expandable segments"}[row]
        sub.close()
    finally:
        child.close()
        child.kill()
    del dst
    if not args.cpu:
        torch.cuda.empty_cache()
    return {"what": "weightsync_python", "row": row, "path": path,
            "trainer_store_bytes": store_bytes, "trainer_expandable_segments": expandable, "mode": args.mode, "bytes": nbytes,
            "tensors": len(shapes), "first_update_s": first, "seconds": median(steady),
            "min_s": min(steady), "publish_median_s": median(publish),
            "library_median_s": median(inside), "copy_median_s": median(copying),
            "tracemalloc_bytes_per_update": traced, "blocks_per_update": blocks,
            "verified": verified}


def row_cpp(args, nbytes):
    exe = os.path.join(args.build, "bench", "ws_gpu_update")
    if not os.access(exe, os.X_OK):
        return {"what": "weightsync_cpp", "skipped": f"no {exe} (scripts/python_gpu_test.sh "
                                                      "bench builds it)"}
    cmd = [exe, "--only", "model", "--scale", repr(args.scale), "--steps", str(args.steps),
           "--mode", args.mode, "--src", str(args.src), "--dst", str(args.dst), "--nccl", "0",
           "--fp8", "0"]
    env = dict(os.environ, WEIGHTSYNC_LOG_LEVEL="warn")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.row_timeout, env=env)
    sys.stderr.write(out.stderr[-4000:])
    if out.returncode != 0:
        return {"what": "weightsync_cpp", "skipped": f"{exe} failed ({out.returncode}): "
                                                      f"{out.stderr.strip()[-300:]}"}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            if r.get("what") == "weightsync_cuda_ipc" and r.get("label") == "model":
                if r["bytes"] != nbytes:
                    return {"what": "weightsync_cpp", "skipped": f"moved {r['bytes']} bytes, "
                                                                  f"Python {nbytes}: not the same"}
                return dict(r, what="weightsync_cpp", seconds=r["steady_median_s"],
                            command=shlex.join(cmd))
    return {"what": "weightsync_cpp", "skipped": "no model row in its output"}


def _ipc_engine(conn, shapes, device_index):
    import faulthandler

    import torch

    faulthandler.enable()
    faulthandler.dump_traceback_later(600, exit=True)  # the bench kills it sooner; stacks first
    device = torch.device(f"cuda:{device_index}")
    torch.cuda.set_device(device)
    dst = {n: torch.empty(s, dtype=torch.bfloat16, device=device) for n, s in shapes}
    conn.send("ready")
    while True:
        payload = conn.recv_bytes()
        if not payload:
            break
        received = pickle.loads(payload)
        for name, (rebuild, rebuild_args) in received:
            dst[name].copy_(rebuild(*rebuild_args), non_blocking=True)  # load_weights
        for d in range(torch.cuda.device_count()):
            torch.cuda.synchronize(d)
        del received
        conn.send("done")


def row_torch_ipc(args, torch, shapes, nbytes):
    import torch.multiprocessing as tmp
    from torch.multiprocessing.reductions import reduce_tensor

    device = torch.device(f"cuda:{args.src}")
    g = torch.Generator(device=device).manual_seed(0)
    src = {n: torch.empty(s, dtype=torch.bfloat16, device=device).normal_(generator=g)
           for n, s in shapes}
    ctx = tmp.get_context("spawn")
    parent, child_end = ctx.Pipe()
    engine = ctx.Process(target=_ipc_engine, args=(child_end, shapes, args.dst), daemon=True)
    engine.start()

    def recv(what):
        if not parent.poll(args.row_timeout):
            raise TimeoutError(f"torch IPC engine: no '{what}' in {args.row_timeout} s")
        got = parent.recv()
        assert got == what, got
        return got

    times, first = [], None
    try:
        recv("ready")
        for i in range(args.steps):
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            payload = pickle.dumps([(n, reduce_tensor(t)) for n, t in src.items()])
            parent.send_bytes(payload)
            recv("done")
            seconds = time.perf_counter() - t0
            if i == 0:
                first = seconds
            else:
                times.append(seconds)
        parent.send_bytes(b"")
        engine.join(60)
    finally:
        if engine.is_alive():
            engine.kill()
            engine.join(30)
    del src
    torch.cuda.empty_cache()
    return {"what": "torch_cuda_ipc_resent", "bytes": nbytes, "tensors": len(shapes),
            "first_update_s": first, "seconds": median(times), "min_s": min(times),
            "payload_bytes": len(payload)}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def row_nccl(args, gpus, nbytes):
    if gpus < 2:
        return {"what": "torch_nccl_broadcast", "skipped": "needs two GPUs"}
    import torch.multiprocessing as tmp

    import torch_baselines

    q = tmp.get_context("spawn").Queue()
    ctx = tmp.start_processes(torch_baselines.worker, args=(2, q, args.scale, free_port()),
                              nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + args.row_timeout
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            return {"what": "torch_nccl_broadcast", "skipped": f"over {args.row_timeout} s"}
    r = q.get(timeout=30)
    return {"what": "torch_nccl_broadcast", "bytes": r["bytes"], "tensors": r["tensors"],
            "per_tensor_s": r["per_tensor_broadcast_s"],
            "bucketed_s": r["bucketed_1GiB_broadcast_s"], "flat_s": r["one_flat_broadcast_s"],
            "init_s": r["init_pg_first_collective_s"], "seconds": r["per_tensor_broadcast_s"]}


def row_ckpt(args, out_dir):
    run = os.path.join(args.ckpt, "run.sh") if args.ckpt else ""
    if not run or not os.path.isfile(run):
        return {"what": "checkpoint_engine", "skipped":
                f"no {run or '--ckpt'}: copy shared/baselines/checkpoint_engine into the "
                "checkout (e.g. .baselines/checkpoint_engine) and carry it"}
    if args.scale != 1.0:
        return {"what": "checkpoint_engine", "skipped": "its bench moves the full 7B-like model "
                                                        "only (--scale 1)"}
    os.makedirs(out_dir, exist_ok=True)
    env = dict(os.environ, OUT=out_dir)
    try:
        out = subprocess.run(["bash", run, *shlex.split(args.ckpt_args)], capture_output=True,
                             text=True, timeout=args.ckpt_timeout, env=env)
        log = out.stdout[-3000:]
    except subprocess.TimeoutExpired as e:
        log = f"timed out after {args.ckpt_timeout} s; {e.stdout!r:.2000}"
    sys.stderr.write("== checkpoint-engine run.sh\n" + log + "\n")
    rows = {}
    path = os.path.join(out_dir, "ckpt_engine.jsonl")
    if os.path.isfile(path):
        with open(path) as f:
            for line in f:
                if line.startswith("{"):
                    r = json.loads(line)
                    rows.setdefault(r.get("what"), r)  # the first series of each kind
    ok = [r for r in rows.values() if r.get("verify") == "bit-exact all tensors, every update"]
    if not ok:
        return {"what": "checkpoint_engine", "skipped": "no verified figure (see "
                f"{out_dir}/ckpt_engine.log)", "raw": list(rows.values())}

    def steady(what):
        r = rows.get(what) or {}
        return r.get("steady_median_s") if r.get("verify", "").startswith("bit-exact") else None

    return {"what": "checkpoint_engine", "bytes": ok[0].get("bytes"),
            "update_s": steady("checkpoint_engine_broadcast_ws1"),
            "update_keep_pg_s": steady("checkpoint_engine_broadcast_ws1_keep_pg"),
            "step_gpu_src_s": steady("checkpoint_engine_step_ws1_gpu_src"),
            "seconds": steady("checkpoint_engine_step_ws1_gpu_src"), "raw": list(rows.values())}


# ---- main ---------------------------------------------------------------------------------------

def main(argv=None):
    args = parse_args(argv)
    if args.role == "publisher":
        return run_publisher(args)
    import torch

    import weightsync

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    status = weightsync.cuda_status()
    if args.cpu:
        gpus, args.dst, name = 0, args.src, "no GPU (--cpu)"
        args.rows = [r for r in args.rows if r in ("limit", "python")]  # zero-copy: CUDA only
    elif not status or not torch.cuda.is_available():
        print(f"python_gpu_update: needs a CUDA device ({status.reason or 'torch sees none'}); "
              "--cpu checks the script without one", file=sys.stderr)
        return 2
    else:
        gpus = torch.cuda.device_count()
        if args.dst is None:
            args.dst = 1 if gpus >= 2 and args.src == 0 else args.src
        name = torch.cuda.get_device_name(args.src)
    shapes = model_shapes(args.scale)
    nbytes = total_bytes(shapes)
    machine = {"gpus": gpus, "gpu": name, "torch":
               torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
               "weightsync": weightsync.__version__, "cuda_status": repr(status)}
    print(f"python_gpu_update: {len(shapes)} tensors, {nbytes / 1e9:.2f} GB bf16 "
          f"(scale {args.scale}); trainer {device(torch, args, args.src)}, engine "
          f"{device(torch, args, args.dst)}; {gpus} x {machine['gpu']}", flush=True)
    results, t_start = {}, time.monotonic()
    out_dir = os.path.dirname(os.path.abspath(args.json))
    for row in args.rows:
        t0 = time.monotonic()
        try:
            if row == "limit":
                r = row_limit(args, torch, nbytes)
            elif row in PUBLISHER_ROWS:
                r = row_python(args, torch, shapes, nbytes, row)
            elif row == "cpp":
                r = row_cpp(args, nbytes)
            elif row == "torch_ipc":
                r = row_torch_ipc(args, torch, shapes, nbytes)
            elif row == "nccl":
                r = row_nccl(args, gpus, nbytes)
            else:
                r = row_ckpt(args, os.path.join(out_dir, "ckpt"))
        except Exception as e:  # noqa: BLE001  (one failed row must not lose the others)
            r = {"what": row, "skipped": f"failed: {type(e).__name__}: {e}"[:400]}
        r["row_seconds"] = time.monotonic() - t0
        results[row] = r
        print(f"python_gpu_update: {row} done in {r['row_seconds']:.0f} s"
              + (f" (skipped: {r['skipped']})" if r.get("skipped") else ""), flush=True)
    lines = table(results)
    print("\n".join(lines))
    with open(args.json, "w") as f:
        json.dump({"machine": machine, "args": {k: v for k, v in vars(args).items()
                                                if k not in ("role", "endpoint")},
                   "rows": results, "table": lines,
                   "seconds": time.monotonic() - t_start}, f, indent=1, default=str)
    print(f"raw figures: {args.json}")
    failed = [k for k, r in results.items() if r.get("skipped", "").startswith("failed")]
    return 1 if failed or not results.get("python", {}).get("verified", True) else 0


if __name__ == "__main__":
    sys.exit(main())
