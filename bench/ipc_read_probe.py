#!/usr/bin/env python3
"""Does a copy read memory opened by CUDA IPC more slowly than the process's own memory?

    python3 bench/ipc_read_probe.py [--gib 4] [--split 1] [--reps 20] [--json FILE]

Issue 16's zero-copy rows: with the trainer's `cudaMalloc` memory opened by IPC handle, the
engine's copies ran at 0.80-0.88x of the arena's (cuMem memory imported by fd), and the cause was
not known. This probe takes weightsync out of it: a parent process allocates one buffer with
torch (the caching allocator: a `cudaMalloc` segment of its own) and sends it to a child through
torch.multiprocessing (torch's CUDA IPC: `cudaIpcGetMemHandle` / `cudaIpcOpenMemHandle`). The
child then times, on the same GPU and the same bytes, in one run:
  own    device-to-device copy from a buffer the child allocated itself (the baseline)
  ipc    the same copy from the parent's buffer opened by IPC
and prints the ratio ipc / own (1.00: IPC memory reads as fast). --split N copies the buffer as N
equal pieces, one copy_ each on one stream (a model's tensors), and also reports the host time to
enqueue them (a runtime that resolves IPC pointers slowly would show there). Needs one CUDA GPU
(exit 2 without one; exit 1 if a copy was not bit-exact).
"""
import argparse
import json
import sys
import time

import torch
import torch.multiprocessing as mp


def time_copy(dst, src, reps):
    """Median (GPU ms, host enqueue ms) of copying src's pieces into dst's, CUDA events, after two
    warm copies."""
    def copy():
        for d, s in zip(dst, src):
            d.copy_(s)
    for _ in range(2):
        copy()
    gpu, host = [], []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        copy()
        host.append((time.perf_counter() - t0) * 1e3)
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end))
    gpu.sort()
    host.sort()
    return gpu[len(gpu) // 2], host[len(host) // 2]


def child(queue, done, reps, split, result):
    shared = queue.get()  # opened here by cudaIpcOpenMemHandle
    own = torch.empty_like(shared)
    own.copy_(shared)
    dst = torch.empty_like(shared)
    pieces = lambda t: list(torch.tensor_split(t, split))
    rows = {}
    for _ in range(2):  # alternate, twice: the machine is noisy
        rows.setdefault("own", []).append(time_copy(pieces(dst), pieces(own), reps))
        rows.setdefault("ipc", []).append(time_copy(pieces(dst), pieces(shared), reps))
    ok = bool(torch.equal(dst, own))
    result.put({k: min(v) for k, v in rows.items()} | {"bit_exact": ok})
    del shared
    done.set()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--split", type=int, default=1, help="copy as this many equal pieces")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("ipc_read_probe: needs a CUDA device (torch sees none)", file=sys.stderr)
        return 2
    ctx = mp.get_context("spawn")
    queue, result, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    n = int(args.gib * (1 << 30)) // 2
    src = torch.randint(-(1 << 15), 1 << 15, (n,), dtype=torch.int16, device="cuda:0")
    p = ctx.Process(target=child, args=(queue, done, args.reps, args.split, result))
    p.start()
    queue.put(src)
    r = result.get()
    done.wait()
    p.join()
    nbytes = n * 2
    (own, own_host), (ipc, ipc_host) = r["own"], r["ipc"]
    out = {
        "bytes": nbytes,
        "pieces": args.split,
        "own_ms": own,
        "ipc_ms": ipc,
        "own_enqueue_ms": own_host,
        "ipc_enqueue_ms": ipc_host,
        "own_gbps": nbytes / own / 1e6,
        "ipc_gbps": nbytes / ipc / 1e6,
        "ipc_vs_own": own / ipc,
        "bit_exact": r["bit_exact"],
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
    }
    print(f"{nbytes / 2**30:.2f} GiB as {args.split} piece(s), {out['device']}: own memory "
          f"{own:.2f} ms ({out['own_gbps']:.0f} GB/s, enqueued in {own_host:.2f} ms), IPC-opened "
          f"{ipc:.2f} ms ({out['ipc_gbps']:.0f} GB/s, enqueued in {ipc_host:.2f} ms): "
          f"ipc / own = {out['ipc_vs_own']:.3f}x, bit-exact {r['bit_exact']}")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(out) + "\n")
    return 0 if r["bit_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
