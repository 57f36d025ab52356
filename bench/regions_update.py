"""Sharded trainer into sharded engine: weightsync regions against gathering, in one run.

    python3 bench/regions_update.py [--device cpu|cuda] [--scale 0.1] [--steps 5]
        [--json regions_update.json]

The model: Qwen2.5-7B shapes in bfloat16 (bench/model_shapes.py; --scale keeps the real widths
and fewer layers). The trainer is FSDP-4: four processes, each holding rows [r/4, (r+1)/4) of
every tensor. The engine is TP-2 as vLLM lays it out: two processes, each with a fused
qkv_proj (q, k, v column slices; Qwen2.5's 4 KV heads split 2 per rank) and qkv bias,
gate_up_proj (column slices), row-parallel o_proj and down_proj, vocabulary-parallel
embed_tokens and lm_head, and the norms whole. Both on one device: --device cpu (shared memory)
or cuda (every process on cuda:0: cuda-ipc).

Rows, each timed from the coordinator (wall clock per step: trainer side, then engine side):

  regions  each trainer rank publishes its shard (weightsync, regions); each engine rank updates
           with its TP layout as regions (in_place): only its slice moves, from the ranks that
           hold it
  gather   checkpoint-engine's way: the shards are gathered into one trainer process (counted
           as one device copy of the 3/4 of the model the other ranks hold: a lower bound of any
           gather), which publishes whole tensors; each engine rank receives the whole model
           (weightsync, in_place) and slices its TP layout out of it (torch copies)

Figures: bytes each engine rank receives (regions: exactly its shard), time per step (median of
--steps after the first), the first update (which prepares: planning included), Python heap per
steady update (tracemalloc, in the engine process). A final check compares every engine
destination with the trainer's pattern. Every child wait has a timeout.
"""

import argparse
import gc
import json
import math
import multiprocessing as mp
import os
import statistics
import sys
import time
import tracemalloc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from model_shapes import model_shapes, scale_config, total_bytes  # noqa: E402

TIMEOUT = 600.0  # seconds any one answer from a child may take
os.environ.setdefault("WEIGHTSYNC_LOG_LEVEL", "WARN")  # children inherit it


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--scale", type=float, default=0.1,
                    help="model scale (bench/model_shapes.py; 1 = 15.2 GB)")
    ap.add_argument("--steps", type=int, default=5, help="steady steps per row (after the first)")
    ap.add_argument("--rows", default="regions,gather",
                    help="regions, gather, zero_copy (regions from zero-copy trainers; cuda)")
    ap.add_argument("--json", default="regions_update.json")
    return ap.parse_args(argv)


# ---- the layouts ----------------------------------------------------------------------------


def fused_names(shapes):
    """Engine tensor name → list of (global name, dim fused along) in vLLM's Qwen2 layout."""
    have = {n for n, _ in shapes}
    out = {}
    for name, _ in shapes:
        if ".self_attn.q_proj." in name:
            kind = name.rsplit(".", 1)[1]  # weight or bias
            base = name.split(".self_attn.")[0] + ".self_attn."
            parts = [base + p + "." + kind for p in ("q_proj", "k_proj", "v_proj")]
            out[base + "qkv_proj." + kind] = parts
        elif ".mlp.gate_proj." in name:
            base = name.split(".mlp.")[0] + ".mlp."
            out[base + "gate_up_proj.weight"] = [base + "gate_proj.weight", base + "up_proj.weight"]
        elif any(k in name for k in (".k_proj.", ".v_proj.", ".up_proj.")):
            continue
        else:
            out[name] = [name]
    assert all(p in have for parts in out.values() for p in parts)
    return out


def engine_layout(regions, shapes, tp, rank):
    """TP rank `rank`'s destinations: name → list of weightsync Regions (fused along dim 0)."""
    shape = dict(shapes)
    layout = {}
    for name, parts in fused_names(shapes).items():
        if len(parts) > 1:
            layout[name] = regions.fuse(0, [regions.column(p, shape[p], tp, rank) for p in parts])
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            layout[name] = [regions.row(name, shape[name], tp, rank)]
        elif "embed_tokens" in name or "lm_head" in name:
            layout[name] = [regions.column(name, shape[name], tp, rank)]  # vocabulary-parallel
        else:
            layout[name] = [regions.whole(name, shape[name])]
    return layout


def destination_shape(parts):
    shape = [0] * len(parts[0].global_shape)
    for p in parts:
        at = p.at or (0,) * len(shape)
        shape = [max(s, a + e) for s, a, e in zip(shape, at, p.extent)]
    return tuple(shape)


def pattern(torch, name, shape, device, lo=0, hi=None):
    """Rows [lo, hi) of the trainer's global tensor `name` (all rows by default): element
    (row, flat column) holds ((7·row + 31·column + seed(name)) mod 65521) - 32760 as int16 bits,
    computed in int32 for just those rows."""
    hi = shape[0] if hi is None else hi
    cols = math.prod(shape[1:])
    seed = sum(name.encode()) % 977
    r = torch.arange(lo, hi, dtype=torch.int32, device=device)[:, None] * 7
    c = torch.arange(cols, dtype=torch.int32, device=device)[None, :] * 31 + seed
    v = (r + c) % 65521 - 32760
    return v.to(torch.int16).view(torch.bfloat16).reshape((hi - lo, *shape[1:]))


def slices(offset, extent):
    return tuple(slice(o, o + e) for o, e in zip(offset, extent))


# ---- children -------------------------------------------------------------------------------


def _answer(conn, fn):
    try:
        conn.send(("ok", fn()))
    except Exception as e:  # report, then let the coordinator stop everything
        conn.send(("error", f"{type(e).__name__}: {e}"))
        raise


def trainer(conn, endpoint, shapes, device, world, rank, whole, zero_copy=False):
    """FSDP rank `rank` of `world` (whole=False), or the gathered trainer holding everything.
    zero_copy: the rank's own CUDA shards are published where they are (no arena copy); each
    publish begins with begin_write(), as its optimizer step would."""
    import torch

    import weightsync
    from weightsync import regions as R

    dev = torch.device(device)
    pub = weightsync.Publisher(endpoint, slots=1, timeout=TIMEOUT, zero_copy=zero_copy)
    if whole:
        full = {n: pattern(torch, n, s, dev) for n, s in shapes}
        tensors, reg = full, None
        # The gather's copy: the (world-1)/world of every tensor the other ranks hold, into this
        # one, from a buffer standing in for what arrives (one flat buffer: the memory it needs).
        received = {n: t.shape[0] - t.shape[0] // world for n, t in full.items()}
        arriving = torch.empty(sum(received[n] * t[0].numel() for n, t in full.items()),
                               dtype=torch.bfloat16, device=dev)
        others, at = {}, 0
        for n, t in full.items():
            count = received[n] * t[0].numel()
            others[n] = arriving[at:at + count].view(received[n], *t.shape[1:])
            others[n].copy_(t[:received[n]])
            at += count
    else:
        reg = {n: R.fsdp(n, s, world, rank) for n, s in shapes}
        tensors = {n: pattern(torch, n, s, dev, reg[n].offset[0], reg[n].offset[0] + reg[n].extent[0])
                   for n, s in shapes}
    pub.register(tensors, regions=reg)
    conn.send(("ready", pub.endpoint))
    while True:
        cmd, step = conn.recv()
        if cmd == "quit":
            pub.close()
            return

        def publish():
            t0 = time.perf_counter()
            if zero_copy:
                pub.begin_write()
            gather_s = 0.0
            if whole:
                for n, t in tensors.items():
                    t[:received[n]].copy_(others[n])
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                gather_s = time.perf_counter() - t0
            stats = pub.publish(step)
            return {"seconds": time.perf_counter() - t0, "gather_seconds": gather_s,
                    "publish_seconds": stats.seconds}

        _answer(conn, publish)


def engine(conn, endpoints, shapes, device, tp, rank, whole):
    """TP rank `rank`: its layout as regions (whole=False), or whole tensors then sliced."""
    import torch

    import weightsync
    from weightsync import regions as R

    dev = torch.device(device)
    layout = engine_layout(R, shapes, tp, rank)
    dst = {n: torch.zeros(destination_shape(p), dtype=torch.bfloat16, device=dev)
           for n, p in layout.items()}
    sub = weightsync.Subscriber(endpoints, mode="in_place", policy="subset", timeout=TIMEOUT)
    if whole:
        full = {n: torch.zeros(s, dtype=torch.bfloat16, device=dev) for n, s in shapes}
        sub.register(full)
        copies = [(dst[n][slices(p.at or (0,) * len(p.extent), p.extent)],
                   full[p.tensor][slices(p.offset, p.extent)])
                  for n, parts in layout.items() for p in parts]
    else:
        sub.register(dst, regions=layout)
    conn.send(("ready", sum(t.numel() * 2 for t in dst.values())))
    tracemalloc.start()
    while True:
        cmd, step = conn.recv()
        if cmd == "quit":
            sub.close()
            return
        if cmd == "heap":  # the Python heap earlier steps left behind
            gc.collect()
            conn.send(("ok", tracemalloc.get_traced_memory()[0]))
            continue
        if cmd == "check":
            def check():
                bad = []
                for n, parts in layout.items():
                    for p in parts:
                        rows = pattern(torch, p.tensor, p.global_shape, dev, p.offset[0],
                                       p.offset[0] + p.extent[0])
                        want = rows[(slice(None),) + slices(p.offset[1:], p.extent[1:])]
                        got = dst[n][slices(p.at or (0,) * len(p.extent), p.extent)]
                        if not torch.equal(got.view(torch.int16), want.view(torch.int16)):
                            bad.append(n)
                return bad
            _answer(conn, check)
            continue

        def update():
            t0 = time.perf_counter()
            stats = sub.update(step)
            update_s = time.perf_counter() - t0
            figures = {"bytes": stats.bytes, "prepare_seconds": stats.prepare_seconds,
                       "path": stats.path}
            slice_s = 0.0
            if whole:
                t1 = time.perf_counter()
                for d, s in copies:
                    d.copy_(s)
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                slice_s = time.perf_counter() - t1
            return {"seconds": update_s + slice_s, "update_seconds": update_s,
                    "slice_seconds": slice_s, **figures}

        _answer(conn, update)


# ---- coordinator ----------------------------------------------------------------------------


class Child:
    def __init__(self, ctx, target, *args):
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(theirs, *args), daemon=True)
        self.proc.start()

    def get(self, what):
        if not self.conn.poll(TIMEOUT):
            raise TimeoutError(f"no answer to {what} within {TIMEOUT} s")
        kind, value = self.conn.recv()
        if kind == "error":
            raise RuntimeError(f"{what}: {value}")
        return value

    def ready(self, what):
        """The value a child sends once set up ("ready", value)."""
        answer = self.conn.recv() if self.conn.poll(TIMEOUT) else None
        if answer is None or answer[0] != "ready":
            raise RuntimeError(f"{what} did not start: {answer}")
        return answer[1]

    def ask(self, cmd, step=None):
        self.conn.send((cmd, step))
        return self.get(f"{cmd} {step}")

    def stop(self):
        try:
            self.conn.send(("quit", None))
        except OSError:
            pass
        self.proc.join(timeout=60)
        if self.proc.is_alive():
            self.proc.kill()


def run_row(args, row, shapes):
    ctx = mp.get_context("spawn")
    tag = f"{os.getpid()}-{row}"
    whole = row == "gather"
    zero_copy = row == "zero_copy"  # regions, from zero-copy trainer ranks (cuda only)
    trainers = []
    try:
        ranks = 1 if whole else 4
        for r in range(ranks):
            trainers.append(Child(ctx, trainer, f"local://regions-bench-{tag}-{r}", shapes,
                                  args.device, 4, r, whole, zero_copy))
        endpoints = [t.ready("trainer") for t in trainers]
        engines = [Child(ctx, engine, endpoints, shapes, args.device, 2, r, whole)
                   for r in range(2)]
        shard_bytes = [e.ready("engine") for e in engines]
        steps, heap = [], []
        for step in range(1, args.steps + 2):
            if step == 2:
                heap = [e.ask("heap") for e in engines]
            t0 = time.perf_counter()
            for t in trainers:
                t.conn.send(("publish", step))
            published = [t.get(f"publish {step}") for t in trainers]
            t1 = time.perf_counter()
            for e in engines:
                e.conn.send(("update", step))
            updated = [e.get(f"update {step}") for e in engines]
            t2 = time.perf_counter()
            steps.append({"step": step, "trainer_seconds": t1 - t0, "engine_seconds": t2 - t1,
                          "seconds": t2 - t0, "trainers": published, "engines": updated})
        heap = [(e.ask("heap") - h) / args.steps for e, h in zip(engines, heap)]
        bad = [e.ask("check") for e in engines]
        for e in engines:
            e.stop()
    finally:
        for t in trainers:
            t.stop()
    steady = steps[1:]
    med = lambda key: statistics.median(s[key] for s in steady)  # noqa: E731
    return {
        "row": row,
        "seconds": med("seconds"),
        "trainer_seconds": med("trainer_seconds"),
        "engine_seconds": med("engine_seconds"),
        "gather_seconds": statistics.median(s["trainers"][0]["gather_seconds"] for s in steady),
        "slice_seconds": statistics.median(max(e["slice_seconds"] for e in s["engines"])
                                           for s in steady),
        "first_update_seconds": max(e["seconds"] for e in steps[0]["engines"]),
        "first_prepare_seconds": max(e["prepare_seconds"] for e in steps[0]["engines"]),
        "bytes_per_engine_rank": [e["bytes"] for e in steps[-1]["engines"]],
        "shard_bytes_per_engine_rank": shard_bytes,
        # Python heap the steady updates left behind, per update (traced before and after).
        "python_heap_bytes_per_steady_update": max(heap),
        "path": steps[-1]["engines"][0]["path"],
        "mismatched_destinations": bad,
        "steps": steps,
    }


def table(results, model_bytes):
    base = results.get("gather")
    lines = [f"{'row':8} {'step':>9} {'trainer':>9} {'engine':>9} {'first':>9} "
             f"{'bytes/engine rank':>22} {'vs shard':>8} {'vs gather':>9}"]
    for row, r in results.items():
        received = max(r["bytes_per_engine_rank"])
        shard = max(r["shard_bytes_per_engine_rank"])
        ratio = f"{base['seconds'] / r['seconds']:.2f}x" if base else "-"
        lines.append(
            f"{row:8} {r['seconds'] * 1e3:7.1f}ms {r['trainer_seconds'] * 1e3:7.1f}ms "
            f"{r['engine_seconds'] * 1e3:7.1f}ms {r['first_update_seconds'] * 1e3:7.1f}ms "
            f"{received / 1e9:13.3f} GB (of {model_bytes / 1e9:.2f}) {received / shard:7.2f}x "
            f"{ratio:>9}")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    shapes = model_shapes(args.scale)
    model_bytes = total_bytes(shapes)
    config = scale_config("qwen2.5-7b", args.scale)
    print(f"regions_update: Qwen2.5-7B shapes at scale {args.scale}: {len(shapes)} tensors, "
          f"{model_bytes / 1e9:.2f} GB bf16, {config['layers']} layers; FSDP-4 trainer -> TP-2 "
          f"engine on {args.device}; {args.steps} steady steps", flush=True)
    results = {}
    for row in args.rows.split(","):
        results[row] = run_row(args, row, shapes)
        r = results[row]
        print(f"  {row}: step {r['seconds'] * 1e3:.1f} ms (trainer {r['trainer_seconds'] * 1e3:.1f},"
              f" engine {r['engine_seconds'] * 1e3:.1f}), path {r['path']}, mismatches "
              f"{r['mismatched_destinations']}", flush=True)
    print(table(results, model_bytes))
    if "regions" in results and "gather" in results:
        g, d = results["gather"], results["regions"]
        print(f"regions vs gather: {d['seconds'] / g['seconds']:.2f}x the time per step "
              f"(target <= 0.6 on the GPU), {max(d['bytes_per_engine_rank']) / 1e9:.3f} vs "
              f"{max(g['bytes_per_engine_rank']) / 1e9:.3f} GB per engine rank; Python heap per "
              f"steady update {d['python_heap_bytes_per_steady_update']} bytes")
    with open(args.json, "w") as f:
        json.dump({"device": args.device, "scale": args.scale, "model_bytes": model_bytes,
                   "tensors": len(shapes), "results": results}, f, indent=1)
    if "zero_copy" in results and "gather" in results:
        g, z = results["gather"], results["zero_copy"]
        print(f"zero-copy regions vs gather: {z['seconds'] / g['seconds']:.2f}x the time per step "
              f"(trainer {z['trainer_seconds'] * 1e3:.1f} vs {g['trainer_seconds'] * 1e3:.1f} ms)")
    bad = any(r["mismatched_destinations"] != [[], []] for r in results.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
