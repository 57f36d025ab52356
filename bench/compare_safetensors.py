"""weightsync vs safetensors through /dev/shm: the same model moved both ways, timed in one run.

    .venv/bin/python bench/compare_safetensors.py [--model qwen2.5-0.5b] [--scale 1.0] [--reps 5]

Both sides hold the model as bfloat16 bits (NumPy uint16 arrays, tagged bfloat16 for weightsync;
torch.bfloat16 tensors over the same memory for safetensors.torch), in one process:
  * weightsync: Publisher.register(trainer tensors) once; each rep publish(step) (copy into
    shared memory) + Subscriber.update(step) (copy into the engine's preallocated tensors).
  * safetensors.torch (the baseline PyTorch users have): save_file(trainer torch tensors,
    /dev/shm/...) + load_file(...) + copy_() into the engine's preallocated tensors (what
    load_state_dict does), the usual "checkpoint to tmpfs and reload" hand-over: the bytes end
    where weightsync puts them. Skipped without torch.
  * safetensors.torch without the copy_(): load_file maps the tmpfs file and returns tensors
    over it (no byte is read until used), so this row is save_file plus a mapping; shown for
    transparency, not like for like.
  * safetensors.numpy: save_file + load_file of the NumPy arrays (load_file returns new arrays,
    which is how that path is used).
Warm-up steps (weightsync: prepare + first touch of both slots; safetensors: one rep each) are
printed apart. Then per-method median and best times, GB/s, and the ratios safetensors /
weightsync (above 1: weightsync is faster), plus the machine. Results are checked bit for bit.
"""

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time

import numpy as np

import weightsync

# Architectures mirror tools/model_presets.cc (from each model's config.json): hidden,
# intermediate, layers, heads, kv_heads, head_dim, vocab, tied embeddings, qkv bias.
PRESETS = {
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2, 64, 151936, True, True),
    "qwen2.5-7b": (3584, 18944, 28, 28, 4, 128, 152064, False, True),
    "llama3-8b": (4096, 14336, 32, 32, 8, 128, 128256, False, False),
}


def model_specs(name, scale):
    """(name, shape) of every tensor, in checkpoint order; `scale` multiplies the layer count
    (and below one layer also the widths), as ScaleConfig in tools/model_presets.cc does."""
    hidden, inter, layers, heads, kv_heads, head_dim, vocab, tied, qkv_bias = PRESETS[name]
    n_layers = scale * layers
    layers = max(1, round(n_layers))
    if n_layers < 1:
        width = n_layers ** 0.5
        head_dim = max(8, int(head_dim * width / 8) * 8)
        hidden = heads * head_dim
        inter = max(64, int(inter * width / 64) * 64)
        vocab = max(64, int(vocab * width / 64) * 64)
    q, kv = heads * head_dim, kv_heads * head_dim
    specs = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        specs.append((p + "input_layernorm.weight", (hidden,)))
        for proj, rows in (("q", q), ("k", kv), ("v", kv)):
            specs.append((p + f"self_attn.{proj}_proj.weight", (rows, hidden)))
            if qkv_bias:
                specs.append((p + f"self_attn.{proj}_proj.bias", (rows,)))
        specs.append((p + "self_attn.o_proj.weight", (hidden, q)))
        specs.append((p + "post_attention_layernorm.weight", (hidden,)))
        specs.append((p + "mlp.gate_proj.weight", (inter, hidden)))
        specs.append((p + "mlp.up_proj.weight", (inter, hidden)))
        specs.append((p + "mlp.down_proj.weight", (hidden, inter)))
    specs.append(("model.norm.weight", (hidden,)))
    if not tied:
        specs.append(("lm_head.weight", (vocab, hidden)))
    return specs


def fill(tensors, step):
    """Changes every tensor for `step` cheaply (one word per 4 KiB page and the first/last)."""
    for i, a in enumerate(tensors.values()):
        flat = a.reshape(-1)
        flat[::2048] = (step * 7919 + i) & 0xFFFF
        flat[-1] = step & 0xFFFF


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Linux {platform.release()}"


def summarize(label, seconds, nbytes):
    med, best = statistics.median(seconds), min(seconds)
    print(f"  {label:<48} median {med * 1e3:9.1f} ms  best {best * 1e3:9.1f} ms  "
          f"{nbytes / med / 1e9:6.2f} GB/s")
    return med


def time_safetensors(save_file, load_file, tensors, same, path, reps, fill_all, deliver=None):
    """[warm-up seconds], [timed seconds] of save_file + load_file (+ deliver(loaded)) through
    `path`; the last rep's result is checked bit for bit with same(result tensor, name)."""
    times, warm = [], []
    for rep in range(1 + reps):
        fill_all(1000 + rep)
        t0 = time.perf_counter()
        save_file(tensors, path)
        loaded = load_file(path)
        if deliver is not None:
            loaded = deliver(loaded)
        (times if rep >= 1 else warm).append(time.perf_counter() - t0)
        os.unlink(path)
    assert all(same(loaded[n], n) for n in tensors), "safetensors: mismatch"
    return warm, times


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(PRESETS), default="qwen2.5-0.5b")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiplies the layer count (below 1 layer: also the widths)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--mode", choices=["staged", "in_place"], default="staged")
    ap.add_argument("--verify", action="store_true", help="weightsync checks xxHash3 digests")
    ap.add_argument("--dir", default="/dev/shm", help="where safetensors writes its file")
    args = ap.parse_args()

    try:
        import safetensors.numpy as st_numpy
    except ImportError:
        raise SystemExit("compare_safetensors: pip install safetensors (scripts/python_test.sh "
                         "installs it into .venv)")
    try:
        import torch
        import safetensors.torch as st_torch
    except ImportError:
        torch = st_torch = None
        print("compare_safetensors: torch not installed; the safetensors.torch row is skipped")

    specs = model_specs(args.model, args.scale)
    trainer = {n: np.zeros(s, np.uint16) for n, s in specs}
    engine = {n: np.zeros(s, np.uint16) for n, s in specs}
    bf16 = {n: "bfloat16" for n, _ in specs}
    nbytes = sum(a.nbytes for a in trainer.values())
    free = shutil.disk_usage(args.dir).free
    if free < 2 * nbytes:
        raise SystemExit(f"compare_safetensors: {args.dir} has {free / 1e9:.1f} GB free, needs "
                         f"{2 * nbytes / 1e9:.1f} GB; lower --scale")
    print(f"model {args.model} x{args.scale}: {len(specs)} tensors, {nbytes / 1e9:.3f} GB "
          f"bfloat16; {args.reps} reps; safetensors through {args.dir}; machine: {machine()}")

    # weightsync: the first update prepares (connect, plan, map, staging) and the first two
    # publishes fault in the arena's two slots; those warm-up steps are reported, not timed.
    warmup = 2
    endpoint = f"local://bench-st-{os.getpid()}"
    ws_times, ws_warm = [], []
    with weightsync.Publisher(endpoint, slots=2) as pub, \
            weightsync.Subscriber(endpoint, mode=args.mode, verify=args.verify, timeout=120) as sub:
        pub.register(trainer, dtypes=bf16)
        sub.register(engine, dtypes=bf16)
        for step in range(warmup + args.reps):
            fill(trainer, step)
            t0 = time.perf_counter()
            pub.publish(step)
            sub.update(step)
            (ws_times if step >= warmup else ws_warm).append(time.perf_counter() - t0)
        assert all(np.array_equal(engine[n], trainer[n]) for n in trainer), "weightsync: mismatch"

    # safetensors: save to tmpfs and load back; one warm-up rep, then every rep timed.
    results = {}  # backend -> (warm-up, timed)
    folder = tempfile.mkdtemp(prefix="ws-bench-", dir=args.dir)
    path = os.path.join(folder, "model.safetensors")
    fill_all = lambda step: fill(trainer, step)  # noqa: E731
    try:
        if st_torch is not None:
            # torch.bfloat16 tensors over the trainer's memory: fill() changes them too.
            as_torch = {n: torch.from_numpy(a).view(torch.bfloat16) for n, a in trainer.items()}
            engine_t = {n: torch.from_numpy(a).view(torch.bfloat16) for n, a in engine.items()}
            same = lambda t, n: np.array_equal(t.view(torch.uint16).numpy(), trainer[n])  # noqa

            def copy_into_engine(loaded):
                for n, t in loaded.items():
                    engine_t[n].copy_(t)
                return engine_t

            results["torch"] = time_safetensors(st_torch.save_file, st_torch.load_file, as_torch,
                                                same, path, args.reps, fill_all, copy_into_engine)
            results["torch (no copy_, mapped)"] = time_safetensors(
                st_torch.save_file, st_torch.load_file, as_torch, same, path, args.reps, fill_all)
            del as_torch, engine_t
        results["numpy"] = time_safetensors(st_numpy.save_file, st_numpy.load_file, trainer,
                                            lambda a, n: np.array_equal(a, trainer[n]), path,
                                            args.reps, fill_all)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    print("  warm-up (not in the figures below): weightsync "
          + ", ".join(f"{t * 1e3:.0f} ms" for t in ws_warm)
          + "".join(f"; safetensors.{b} " + ", ".join(f"{t * 1e3:.0f} ms" for t in warm)
                    for b, (warm, _) in results.items()))
    ws = summarize(f"weightsync publish+update ({args.mode})", ws_times, nbytes)
    what = {"torch": "save+load+copy_", "numpy": "save+load"}
    medians = {b: summarize(f"safetensors.{b} {what.get(b, 'save+load')}", times, nbytes)
               for b, (_, times) in results.items()}
    for backend, st in medians.items():
        print(f"ratio safetensors.{backend} / weightsync = {st / ws:.2f}x "
              "(median; >1: weightsync faster)")


if __name__ == "__main__":
    main()
