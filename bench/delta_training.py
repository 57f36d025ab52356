"""How much of a model an RL step changes, and what the segment delta sends for it, from a real
training run.

    .venv/bin/python bench/delta_training.py [--lrs 1e-6,1e-5,1e-4] [--steps 10]
        [--hidden 256 --layers 4 --vocab 8192] [--bf16-params] [--codec build/bench/ws_delta_codec]
        [--json delta_training.json]

A transformers Qwen2-architecture LM (random init, CPU) trained with AdamW (weight decay 0) on
random tokens: fp32 master weights, published as bf16 after every step, the way RL trainers
publish (--bf16-params trains bf16 parameters directly instead). Each step's published bytes and
the previous step's go to ws_delta_codec (bench/delta_codec.cc), which encodes every tensor as one
segment, applies the deltas to the previous version, checks the result bit for bit, and times
encode and apply against a memcpy of the model in the same run.

Rows per learning rate (median over the steps after the first two, whose AdamW moments are still
warming up): changed elements, the segment delta's bytes as a fraction of the model and per
changed byte, and, for the same change, a bitmap + values, a LEB128 gap list + values, and the
XOR of the two versions through zstd level 3 (when the `zstandard` package is installed; its
time, XOR included, against the same memcpy): the alternatives the encoding was chosen against
(docs/deltas.md).
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lrs", default="1e-6,1e-5,1e-4")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--bf16-params", action="store_true")
    p.add_argument("--codec", default=str(ROOT / "build/bench/ws_delta_codec"))
    p.add_argument("--json")
    return p.parse_args()


def make_model(args, torch, transformers):
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 64),
        num_key_value_heads=max(1, args.hidden // 128), max_position_embeddings=args.seq,
        tie_word_embeddings=False)
    model = transformers.Qwen2ForCausalLM(config)
    if args.bf16_params:
        model = model.to(torch.bfloat16)
    return model


def published(model, torch):
    """The bf16 bytes of every parameter, in order, and each one's size."""
    parts = [p.detach().to(torch.bfloat16).contiguous().view(torch.uint8).flatten()
             for p in model.parameters()]
    return torch.cat(parts).numpy().tobytes(), [int(t.numel()) for t in parts]


def zstd_xor(base, nxt):
    """Bytes and seconds (XOR and compression, one thread) of zstd level 3 over the XOR."""
    try:
        import numpy as np
        import zstandard
    except ImportError:
        return None, None
    start = time.perf_counter()
    x = np.frombuffer(base, dtype=np.uint16) ^ np.frombuffer(nxt, dtype=np.uint16)
    size = len(zstandard.ZstdCompressor(level=3).compress(x.tobytes()))
    return size, time.perf_counter() - start


def codec(args, base, nxt, sizes, tmp):
    paths = [tmp / "base.bin", tmp / "next.bin", tmp / "segments.txt"]
    paths[0].write_bytes(base)
    paths[1].write_bytes(nxt)
    paths[2].write_text("\n".join(map(str, sizes)) + "\n")
    out = subprocess.run([args.codec, "files", *map(str, paths), "--json", "--repeat", "3"],
                         check=True, capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_lr(args, lr, torch, transformers, tmp):
    model = make_model(args, torch, transformers)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(1)
    prev, sizes = published(model, torch)
    steps = []
    for step in range(1, args.steps + 1):
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
        loss = model(input_ids=tokens, labels=tokens).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        cur, _ = published(model, torch)
        row = codec(args, prev, cur, sizes, tmp)
        row["zstd_xor_bytes"], row["zstd_xor_s"] = zstd_xor(prev, cur)
        row["step"] = step
        steps.append(row)
        prev = cur
    return steps


def summarize(lr, steps):
    later = steps[2:] or steps
    model_bytes = later[0]["version_bytes"]

    def med(key):
        values = [r[key] for r in later if r.get(key) is not None]
        return statistics.median(values) if values else None

    changed = med("changed_elements")
    s = {
        "lr": lr, "model_bytes": model_bytes, "steps": len(steps),
        "changed_fraction": changed * 2 / model_bytes,
        "first_step_changed_fraction": steps[0]["changed_elements"] * 2 / model_bytes,
        "delta_fraction": med("delta_bytes") / model_bytes,
        "delta_per_changed_byte": med("delta_bytes") / max(1, changed * 2),
        "bitmap_fraction": med("bitmap_bytes") / model_bytes,
        "gap_list_fraction": med("gap_list_bytes") / model_bytes,
        "segments_sent_whole": med("sent_whole"), "segments": later[0]["segments"],
        "encode_per_memcpy": med("encode_s") / med("memcpy_s"),
        "apply_per_memcpy": med("apply_s") / med("memcpy_s"),
    }
    z = med("zstd_xor_bytes")
    s["zstd_xor_fraction"] = z / model_bytes if z is not None else None
    zs = med("zstd_xor_s")
    s["zstd_xor_per_memcpy"] = zs / med("memcpy_s") if zs is not None else None
    return s


def main():
    args = parse()
    if not os.access(args.codec, os.X_OK):
        sys.exit(f"delta_training: {args.codec} not built (cmake --build build --target "
                 "ws_delta_codec)")
    import torch
    import transformers
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    rows = []
    with tempfile.TemporaryDirectory(prefix="ws_delta_training_") as tmp:
        for lr in (float(x) for x in args.lrs.split(",")):
            rows.append(summarize(lr, run_lr(args, lr, torch, transformers, pathlib.Path(tmp))))
    kind = "bf16 parameters" if args.bf16_params else "fp32 master weights, published as bf16"
    print(f"Qwen2-architecture LM, {rows[0]['model_bytes'] / 2 / 1e6:.1f} M parameters, {kind}, "
          f"AdamW, median of steps 3-{args.steps}")
    print(f"{'lr':>7} {'changed':>8} {'(step 1)':>8} {'delta':>7} {'per chg B':>9} "
          f"{'bitmap':>7} {'gaps':>7} {'zstd xor':>8} {'whole':>7} {'enc/cpy':>7} {'apl/cpy':>7} "
          f"{'zstd/cpy':>8}")
    for r in rows:
        z = f"{100 * r['zstd_xor_fraction']:7.2f}%" if r["zstd_xor_fraction"] is not None else \
            "     n/a"
        print(f"{r['lr']:7.0e} {100 * r['changed_fraction']:7.2f}% "
              f"{100 * r['first_step_changed_fraction']:7.2f}% {100 * r['delta_fraction']:6.2f}% "
              f"{r['delta_per_changed_byte']:9.2f} {100 * r['bitmap_fraction']:6.2f}% "
              f"{100 * r['gap_list_fraction']:6.2f}% {z} "
              f"{r['segments_sent_whole']:3.0f}/{r['segments']:<3} "
              f"{r['encode_per_memcpy']:6.2f}x {r['apply_per_memcpy']:6.2f}x "
              + (f"{r['zstd_xor_per_memcpy']:7.1f}x" if r["zstd_xor_per_memcpy"] else "     n/a"))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows},
                                                      indent=1))


if __name__ == "__main__":
    main()
