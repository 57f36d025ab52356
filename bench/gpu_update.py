"""GPU update benchmark: weightsync cuda-ipc vs the torch baselines, one command, one machine.

Run on a 2-GPU machine after building (cmake --build build --target ws_gpu_update):
    python3 bench/gpu_update.py [--build build] [--steps 20] [--json gpu_update.json]
Runs, in this order: build/bench/ws_gpu_update (in_place, then staged + verify), then
bench/torch_baselines.py; prints a table with each figure's ratio to its baseline and writes all
raw figures as JSON.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json_lines(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    sys.stderr.write(out.stderr[-4000:])
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", default="20")
    ap.add_argument("--json", default="gpu_update.json")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-staged", action="store_true")
    ap.add_argument("--only", default="", help="rows of ws_gpu_update to run (its --only)")
    args = ap.parse_args()
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", WEIGHTSYNC_LOG_LEVEL="warn")
    exe = os.path.join(args.build, "bench", "ws_gpu_update")
    rows = []
    only = ["--only", args.only] if args.only else []
    rows += run_json_lines([exe, "--steps", args.steps, "--mode", "in_place"] + only, env)
    if not args.skip_staged:
        rows += [dict(r, run="staged_verify") for r in
                 run_json_lines([exe, "--steps", args.steps, "--mode", "staged", "--verify", "1",
                                 "--nccl", "0", "--fp8", "0", "--only", "model,zerocopy,ring,tiny"],
                                env)
                 if r["what"] in ("weightsync_cuda_ipc", "weightsync_cuda_ipc_zero_copy",
                                  "weightsync_cuda_ipc_ring")]
    if not args.skip_torch:
        rows += run_json_lines([sys.executable, os.path.join(HERE, "torch_baselines.py")], env)
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=1)

    by = {}
    for r in rows:
        key = r["what"] + ("/" + r.get("label", "") if "label" in r else "") + \
            ("/" + r["run"] if "run" in r else "")
        by[key] = r
    peer = by.get("peer_copy_limit")
    ws_in = by.get("weightsync_cuda_ipc/model")
    ws_zero = by.get("weightsync_cuda_ipc_zero_copy/model")
    ws_ring = by.get("weightsync_cuda_ipc_ring/model_ring_2x1024MiB")
    ws_st = by.get("weightsync_cuda_ipc/model/staged_verify")
    ws_nccl = by.get("weightsync_nccl/model")
    ws_nccl_zero = by.get("weightsync_nccl_zero_copy/model")
    ws_nccl_ring = by.get("weightsync_nccl_ring/model_ring")
    ws_fp8 = by.get("weightsync_cuda_ipc/model_fp8")
    ws_fp8_dst = by.get("weightsync_cuda_ipc/model_fp8_on_destination_gpu")
    tiny = by.get("weightsync_cuda_ipc/tiny")
    many = by.get("weightsync_cuda_ipc/many_100k")
    torch = by.get("nccl_broadcast_7b_like")
    ipc = by.get("open_ipc_handles_other_process")
    torch_peer = by.get("peer_copy_gpu0_to_gpu1")
    h2d_limit = by.get("pinned_h2d_limit")
    ws_h2d = by.get("weightsync_shm_to_gpu/model_from_host")
    d2h_limit = by.get("pinned_d2h_limit")
    ws_d2h = by.get("weightsync_cuda_ipc_to_host/model_to_host")
    print(f"{'figure':<52} {'value':>12}  {'baseline':>28}  ratio")

    def line(name, value, base_name=None, base=None, higher_better=False):
        ratio = ""
        if base and (higher_better or value):
            ratio = f"{(value / base if higher_better else base / value):.2f}x"
        b = f"{base_name} {base:.4g}" if base is not None else ""
        print(f"{name:<52} {value:>12.4g}  {b:>28}  {ratio}")

    if ws_in and peer:
        line("cuda-ipc steady GB/s, in_place (15.2 GB bf16)", ws_in["steady_GBps"],
             "peer copy GB/s", peer["GBps"], higher_better=True)
        line("cuda-ipc steady ms, in_place", ws_in["steady_median_s"] * 1e3)
        line("cuda-ipc first update ms (prepare + copy)", ws_in["first_update_s"] * 1e3,
             "steady ms", ws_in["steady_median_s"] * 1e3)
    if ws_zero and ws_in:
        line("zero-copy steady ms, in_place (no arena)", ws_zero["steady_median_s"] * 1e3,
             "arena steady ms", ws_in["steady_median_s"] * 1e3)
        if peer:
            line("zero-copy steady GB/s", ws_zero["steady_GBps"], "peer copy GB/s", peer["GBps"],
                 higher_better=True)
        line("zero-copy trainer-visible publish ms", ws_zero["publish_median_s"] * 1e3,
             "arena publish ms", ws_in["publish_median_s"] * 1e3)
        line("zero-copy extra GPU MiB on the trainer's GPU",
             ws_zero["publisher_extra_gpu_bytes"] / 2**20, "arena MiB",
             ws_in["publisher_extra_gpu_bytes"] / 2**20)
        line("zero-copy extra GPU MiB on the engine's GPU",
             ws_zero["subscriber_extra_gpu_bytes"] / 2**20)
    if ws_ring and ws_in:
        # On one GPU the ring's update moves the bytes twice (fill, then copy out) through the
        # same HBM, as the arena's publish + update do; on two the fill is local and overlaps.
        line("ring (2 x 1 GiB) steady update ms", ws_ring["steady_median_s"] * 1e3,
             "arena steady ms", ws_in["steady_median_s"] * 1e3)
        line("ring steady ms vs arena publish + update",
             ws_ring["steady_median_s"] * 1e3 + ws_ring["publish_median_s"] * 1e3,
             "arena publish + update ms",
             (ws_in["steady_median_s"] + ws_in["publish_median_s"]) * 1e3)
        if peer:
            line("ring steady GB/s", ws_ring["steady_GBps"], "peer copy GB/s", peer["GBps"],
                 higher_better=True)
        line("ring trainer-visible publish ms", ws_ring["publish_median_s"] * 1e3,
             "arena publish ms", ws_in["publish_median_s"] * 1e3)
        line("ring extra GPU MiB on the trainer's GPU",
             ws_ring["publisher_extra_gpu_bytes"] / 2**20, "arena MiB",
             ws_in["publisher_extra_gpu_bytes"] / 2**20)
        line("ring extra GPU MiB on the engine's GPU",
             ws_ring["subscriber_extra_gpu_bytes"] / 2**20)
    for memory, what in (("packed", "one cudaMalloc"), ("cumem", "20 MiB cuMem chunks")):
        r = by.get(f"weightsync_cuda_ipc_zero_copy/model_{memory}")
        if r and ws_in:
            line(f"zero-copy steady ms, tensors in {what}", r["steady_median_s"] * 1e3,
                 "arena steady ms", ws_in["steady_median_s"] * 1e3)
            if peer:
                line(f"zero-copy steady GB/s, {what}", r["steady_GBps"], "peer copy GB/s",
                     peer["GBps"], higher_better=True)
            line(f"zero-copy first update ms, {what}", r["first_update_s"] * 1e3)
    if ws_fp8 and ws_in:
        line("cuda-ipc bf16→fp8 in flight ms (publisher's GPU)", ws_fp8["steady_median_s"] * 1e3,
             "bf16 copy ms", ws_in["steady_median_s"] * 1e3)
    for fmt in ("mxfp8", "nvfp4"):
        r = by.get(f"weightsync_cuda_ipc/model_{fmt}")
        if r and ws_in:
            line(f"cuda-ipc bf16→{fmt.upper()} in flight ms", r["steady_median_s"] * 1e3,
                 "bf16 copy ms", ws_in["steady_median_s"] * 1e3)
            line(f"cuda-ipc bf16→{fmt.upper()} heap allocations per step",
                 r["heap_allocs_per_step"])
    if ws_fp8_dst and ws_in:
        line("cuda-ipc bf16→fp8 in flight ms (destination GPU)",
             ws_fp8_dst["steady_median_s"] * 1e3, "bf16 copy ms", ws_in["steady_median_s"] * 1e3)
    if ws_nccl and peer:
        line("nccl steady GB/s, in_place (2-rank communicator)", ws_nccl["steady_GBps"],
             "peer copy GB/s", peer["GBps"], higher_better=True)
        line("nccl first update ms (incl. communicator init)", ws_nccl["first_update_s"] * 1e3,
             "steady ms", ws_nccl["steady_median_s"] * 1e3)
        if torch:
            line("nccl steady ms vs torch one_flat_broadcast", ws_nccl["steady_median_s"] * 1e3,
                 "torch ms", torch["one_flat_broadcast_s"] * 1e3)
    for name, r in (("zero-copy", ws_nccl_zero), ("ring", ws_nccl_ring)):
        if r and ws_nccl:
            line(f"nccl {name} steady ms (sent from the trainer's tensors)",
                 r["steady_median_s"] * 1e3, "nccl from the arena ms",
                 ws_nccl["steady_median_s"] * 1e3)
            line(f"nccl {name} extra GPU MiB on the trainer's GPU",
                 r["publisher_extra_gpu_bytes"] / 2**20, "arena MiB",
                 ws_nccl["publisher_extra_gpu_bytes"] / 2**20)
    if ws_st and peer:
        line("cuda-ipc steady GB/s, staged + GPU verify", ws_st["steady_GBps"],
             "peer copy GB/s", peer["GBps"], higher_better=True)
    if ws_h2d and h2d_limit:
        line(f"shm → GPU steady GB/s ({ws_h2d['bytes'] / 1e9:.1f} GB host arena, pinned)",
             ws_h2d["steady_GBps"], "pinned H2D GB/s", h2d_limit["GBps"], higher_better=True)
        line("shm → GPU first update ms (map, pin, plan)", ws_h2d["first_update_s"] * 1e3,
             "steady ms", ws_h2d["steady_median_s"] * 1e3)
    if ws_d2h and d2h_limit:
        line(f"GPU → host steady GB/s ({ws_d2h['bytes'] / 1e9:.1f} GB, pinned destinations)",
             ws_d2h["steady_GBps"], "pinned D2H GB/s", d2h_limit["GBps"], higher_better=True)
    if torch_peer:
        line("torch peer copy GB/s (same run)", torch_peer["GBps"])
    if ws_in and torch:
        for k in ("per_tensor_broadcast_s", "bucketed_1GiB_broadcast_s", "one_flat_broadcast_s"):
            line(f"cuda-ipc steady ms vs torch {k[:-2]}", ws_in["steady_median_s"] * 1e3,
                 "torch ms", torch[k] * 1e3)
    if ws_in and ipc:
        reopen = ipc["open_seconds"] + ipc["pull_all_via_ipc_s"]
        line("cuda-ipc steady ms vs torch IPC re-opened per step", ws_in["steady_median_s"] * 1e3,
             "torch ms", reopen * 1e3)
    if tiny:
        line("host overhead per step ms (339 tensors x 128 B)", tiny["steady_median_s"] * 1e3,
             "target ms", 1.0)
    if many:
        line("per-tensor cost µs (100,000 x 64 KiB, steady step / tensors)",
             many["steady_median_s"] * 1e6 / many["tensors"], "target µs", 1.0)
        if peer:
            line("100,000 x 64 KiB steady GB/s", many["steady_GBps"], "peer copy GB/s",
                 peer["GBps"], higher_better=True)
    if ws_in:
        line("heap allocations per steady step (subscriber)", ws_in["heap_allocs_per_step"])
    print(f"raw figures: {args.json}")


if __name__ == "__main__":
    main()
