"""The torch baselines of bench/gpu_update.py, on a 2-GPU machine: the link limits and the ways
RL frameworks move weights from a trainer GPU to an inference GPU today (NCCL broadcast per
tensor, in 1 GiB buckets, as one flat buffer; CUDA IPC handles re-opened every step).
Adapted from the platform probe (shared/probes/gpu_anchors.py) so both run in one command.

Run: python3 bench/torch_baselines.py  (needs 2 GPUs, torch with NCCL)
Prints one JSON object per measurement.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from model_shapes import model_shapes

GiB = 1 << 30


def qwen7b_like_shapes(scale=1.0):
    """Parameter shapes of a Qwen2.5-7B-style decoder (bf16), about 7.6e9 parameters at scale 1:
    the tensors ws_gpu_update moves (bench/model_shapes.py, tools/model_presets.cc)."""
    return model_shapes(scale, "qwen2.5-7b")


def emit(**kw):
    print(json.dumps(kw), flush=True)


def timed(fn, dev_list, reps=1):
    for d in dev_list:
        torch.cuda.synchronize(d)
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    for d in dev_list:
        torch.cuda.synchronize(d)
    return (time.perf_counter() - t) / reps


def single_process_links():
    a = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda:0")
    b = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda:1")
    b.copy_(a)
    s = timed(lambda: b.copy_(a), ["cuda:0", "cuda:1"], reps=10)
    emit(what="peer_copy_gpu0_to_gpu1", bytes=a.numel(), seconds=s, GBps=a.numel() / s / 1e9,
         can_access_peer=torch.cuda.can_device_access_peer(0, 1))
    h = torch.empty(2 * GiB, dtype=torch.uint8, pin_memory=True)
    a.copy_(h)
    s = timed(lambda: a.copy_(h, non_blocking=True), ["cuda:0"], reps=5)
    emit(what="h2d_pinned", bytes=h.numel(), seconds=s, GBps=h.numel() / s / 1e9)
    s = timed(lambda: h.copy_(a, non_blocking=True), ["cuda:0"], reps=5)
    emit(what="d2h_pinned", bytes=h.numel(), seconds=s, GBps=h.numel() / s / 1e9)
    p = torch.empty(512 << 20, dtype=torch.uint8)
    t = time.perf_counter(); p.copy_(h[: 512 << 20]); s = time.perf_counter() - t
    emit(what="host_memcpy_512MiB", seconds=s, GBps=p.numel() / s / 1e9)
    a2 = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda:0")
    s = timed(lambda: a2.copy_(a), ["cuda:0"], reps=10)
    emit(what="d2d_same_gpu", bytes=a.numel(), seconds=s, GBps=a.numel() / s / 1e9)
    del a, b, h, a2, p
    torch.cuda.empty_cache()


def worker(rank, world, q, scale=1.0, port=29533):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    t0 = time.perf_counter()
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device(f"cuda:{rank}"))
    x = torch.ones(1, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    init_s = time.perf_counter() - t0
    shapes = qwen7b_like_shapes(scale)
    tensors = [torch.empty(s, dtype=torch.bfloat16, device="cuda") for _, s in shapes]
    if rank == 0:
        for t in tensors:
            t.normal_()
    total = sum(t.numel() * t.element_size() for t in tensors)
    res = {"init_pg_first_collective_s": init_s, "tensors": len(tensors), "bytes": total}

    def per_tensor():
        for t in tensors:
            dist.broadcast(t, src=0)

    per_tensor(); torch.cuda.synchronize()
    dist.barrier(); t = time.perf_counter(); per_tensor(); torch.cuda.synchronize()
    res["per_tensor_broadcast_s"] = time.perf_counter() - t

    bucket = torch.empty(1 * GiB, dtype=torch.uint8, device="cuda")

    def bucketed():
        off, pending = 0, []
        flat = bucket
        for t in tensors:
            nb = t.numel() * t.element_size()
            if nb > flat.numel():
                dist.broadcast(t, src=0)
                continue
            if off + nb > flat.numel():
                dist.broadcast(flat[:off], src=0)
                if rank != 0:
                    o = 0
                    for pt in pending:
                        n = pt.numel() * pt.element_size()
                        pt.view(-1).view(torch.uint8).copy_(flat[o:o + n]); o += n
                off, pending = 0, []
            if rank == 0:
                flat[off:off + nb].copy_(t.view(-1).view(torch.uint8))
            pending.append(t); off += nb
        if off:
            dist.broadcast(flat[:off], src=0)
            if rank != 0:
                o = 0
                for pt in pending:
                    n = pt.numel() * pt.element_size()
                    pt.view(-1).view(torch.uint8).copy_(flat[o:o + n]); o += n

    bucketed(); torch.cuda.synchronize()
    dist.barrier(); t = time.perf_counter(); bucketed(); torch.cuda.synchronize()
    res["bucketed_1GiB_broadcast_s"] = time.perf_counter() - t

    flatall = torch.empty(total, dtype=torch.uint8, device="cuda")
    dist.broadcast(flatall, src=0); torch.cuda.synchronize()
    dist.barrier(); t = time.perf_counter(); dist.broadcast(flatall, src=0); torch.cuda.synchronize()
    res["one_flat_broadcast_s"] = time.perf_counter() - t
    del flatall

    # no handle reuse: a fresh NCCL group for every update step (the cost a cached handle avoids)
    dist.barrier(); t = time.perf_counter()
    g = dist.new_group([0, 1])
    y = torch.ones(1, device="cuda"); dist.all_reduce(y, group=g); torch.cuda.synchronize()
    res["new_group_first_collective_s"] = time.perf_counter() - t
    dist.destroy_process_group(g)
    if rank == 0:
        q.put(res)
    dist.barrier()
    dist.destroy_process_group()


def ipc_cost():
    """Cost of exporting and opening CUDA IPC handles for every tensor of the model, as
    colocated RL frameworks do each step (torch reductions) when nothing is cached."""
    from torch.multiprocessing.reductions import reduce_tensor
    shapes = qwen7b_like_shapes()
    tensors = [torch.empty(s, dtype=torch.bfloat16, device="cuda:0") for _, s in shapes]
    t = time.perf_counter()
    handles = [reduce_tensor(x) for x in tensors]
    torch.cuda.synchronize()
    emit(what="export_ipc_handles_all_tensors", tensors=len(tensors), seconds=time.perf_counter() - t)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_open_ipc, args=(handles, q))
    p.start()
    r = q.get(timeout=300)
    p.join()
    emit(what="open_ipc_handles_other_process", **r)


def _open_ipc(handles, q):
    torch.cuda.set_device(1)
    t = time.perf_counter()
    opened = [fn(*args) for fn, args in handles]
    torch.cuda.synchronize()
    first = time.perf_counter() - t
    tot = sum(x.numel() * x.element_size() for x in opened)
    dst = torch.empty(tot, dtype=torch.uint8, device="cuda:1")
    def pull():
        o = 0
        for x in opened:
            n = x.numel() * x.element_size()
            dst[o:o + n].copy_(x.view(-1).view(torch.uint8), non_blocking=True); o += n
    pull(); torch.cuda.synchronize()
    t = time.perf_counter(); pull(); torch.cuda.synchronize()
    pull_s = time.perf_counter() - t
    q.put({"open_seconds": first, "tensors": len(opened), "pull_all_via_ipc_s": pull_s, "bytes": tot,
           "pull_GBps": tot / pull_s / 1e9})


if __name__ == "__main__":
    emit(what="env", torch=torch.__version__, gpus=torch.cuda.device_count(),
         name=torch.cuda.get_device_name(0), nccl=".".join(map(str, torch.cuda.nccl.version())))
    single_process_links()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.spawn(worker, args=(2, q), nprocs=2, join=True)
    r = q.get()
    for k in ("per_tensor_broadcast_s", "bucketed_1GiB_broadcast_s", "one_flat_broadcast_s"):
        r[k.replace("_s", "_GBps")] = r["bytes"] / r[k] / 1e9
    emit(what="nccl_broadcast_7b_like", **r)
    ipc_cost()
