"""RL-style weight sync on the GPU: a trainer fine-tunes a causal LM, an engine serves its own copy.

    python examples/torch_gpu_rl/run.py                       # one GPU: both on cuda:0
    python examples/torch_gpu_rl/run.py --trainer-device cuda:0 --engine-device cuda:1
    python examples/torch_gpu_rl/run.py --device cpu --config tiny --steps 2   # no GPU

Two processes (multiprocessing, spawn). The trainer builds a Qwen2-architecture model from a
config (no download; `--config small`: ~168M parameters, 336 MB of bfloat16 weights), trains it
with AdamW to continue arithmetic progressions of token ids (the prompt is one) and after every
optimizer step publishes its weights
(weightsync.Publisher.publish(step): the copies are ordered after torch's current stream, no
device synchronize). The engine builds the same architecture with another initialisation,
registers its module's state_dict() once (updated in place: every data_ptr() stays), and after
each update computes the logits of a fixed prompt (token ids, no tokenizer).

How the two are compared: the trainer sends the bytes of its own logits of that prompt (computed
right after the step it published) over a multiprocessing queue; the engine computes its logits
with the same code and compares the bytes: equal weights + the same kernels on the same kind of
device = bit-identical logits, and a single wrong weight bit shows. The engine prints one line per
step; the run fails if any step differs. At the end both decode greedily from the prompt and the
engine prints both token lists.

Over one GPU (or two) the bytes move GPU to GPU (cuda-ipc); with --device cpu over shared memory.
"""

import argparse
import faulthandler
import hashlib
import multiprocessing as mp
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WAIT = 300  # seconds: the longest either process waits for the other


def parse():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--config", choices=["small", "tiny"], default=None,
                    help="model size (default: small on a GPU, tiny on the CPU)")
    ap.add_argument("--device", default=None,
                    help="both processes' device (default cuda:0; 'cpu' runs without a GPU)")
    ap.add_argument("--trainer-device", default=None)
    ap.add_argument("--engine-device", default=None)
    ap.add_argument("--mode", choices=["staged", "in_place"], default="staged")
    ap.add_argument("--batch", type=int, default=None, help="sequences per step (8; tiny: 2)")
    ap.add_argument("--seq", type=int, default=None, help="tokens per sequence (128; tiny: 16)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--generate", type=int, default=16, help="greedy tokens at the end")
    ap.add_argument("--endpoint", default=f"local://torch-gpu-rl-{os.getpid()}")
    args = ap.parse_args()
    device = args.device or "cuda:0"
    args.trainer_device = args.trainer_device or device
    args.engine_device = args.engine_device or device
    on_cpu = "cpu" in (args.trainer_device, args.engine_device)
    args.config = args.config or ("tiny" if on_cpu else "small")
    tiny = args.config == "tiny"
    args.batch = args.batch or (2 if tiny else 8)
    args.seq = args.seq or (16 if tiny else 128)
    return args


def setup(device):
    """Per process: a stack dump if a wait hangs, deterministic kernels, the device."""
    faulthandler.enable()
    sys.path.insert(0, HERE)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    torch.use_deterministic_algorithms(True, warn_only=True)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    else:
        torch.set_num_threads(1)  # the same reduction order in both processes
    return torch


def megabytes(n):
    return f"{n / 1e6:.0f} MB" if n >= 1e7 else f"{n / 1e3:.0f} kB"


def progressions(torch, generator, vocab, batch, seq):
    """Training data: rows of token ids going up by the prompt's stride from random starts."""
    starts = torch.randint(0, vocab, (batch, 1), generator=generator)
    return (starts + torch.arange(seq) * (7919 % vocab)) % vocab


def as_bytes(tensor):
    return tensor.detach().contiguous().view(-1).view(__import__("torch").uint8).cpu().numpy() \
        .tobytes()


def trainer_main(args, to_engine, acks):
    torch = setup(args.trainer_device)
    import weightsync
    from model import build, greedy, logits, prompt

    device = args.trainer_device
    model = build(args.config, device, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    ids = prompt(args.config, device)
    data = torch.Generator(device="cpu").manual_seed(1234)
    vocab = model.config.vocab_size
    model.eval()
    to_engine.put(("logits", 0, as_bytes(logits(model, ids)), None))  # before any update
    with weightsync.Publisher(args.endpoint, timeout=60) as pub:
        pub.register(model.state_dict())  # tensors sharing storage with the parameters; once
        nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        print(f"trainer: {args.config} model on {device}, {megabytes(nbytes)} of "
              f"{next(model.parameters()).dtype} weights, publishing at {pub.endpoint}",
              flush=True)
        for step in range(1, args.steps + 1):
            faulthandler.dump_traceback_later(WAIT, exit=True)
            model.train()
            batch = progressions(torch, data, vocab, args.batch, args.seq).to(device)
            loss = model(input_ids=batch, labels=batch, use_cache=False).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            pub.publish(step)  # ordered after torch's current stream (the optimizer's kernels)
            publish_ms = (time.perf_counter() - t0) * 1e3
            model.eval()
            to_engine.put(("logits", step, as_bytes(logits(model, ids)), loss.item()))
            print(f"trainer: step {step:3d} loss {loss.item():.4f} published in "
                  f"{publish_ms:.1f} ms", flush=True)
            if step >= 2:  # two slots: step-1's slot is free once the engine has read it
                expect_ack(acks, step - 1)
        expect_ack(acks, args.steps)
        to_engine.put(("generation", None, greedy(model, ids, args.generate), None))
        expect_ack(acks, "done")
    faulthandler.cancel_dump_traceback_later()


def expect_ack(acks, what):
    got = acks.get(timeout=WAIT)
    if got != what:
        raise SystemExit(f"trainer: expected the engine's ack of {what!r}, got {got!r}")


def engine_main(args, from_trainer, acks):
    setup(args.engine_device)
    import weightsync
    from model import build, greedy, logits, prompt

    device = args.engine_device
    model = build(args.config, device, seed=1).eval().requires_grad_(False)  # its own weights
    ids = prompt(args.config, device)
    addresses = {n: t.data_ptr() for n, t in model.state_dict().items()}
    kind, step, theirs, _ = from_trainer.get(timeout=WAIT)
    mine = as_bytes(logits(model, ids))
    print(f"engine:  before the first update its logits "
          f"{'equal' if mine == theirs else 'differ from'} the trainer's (other initialisation)",
          flush=True)
    exact = 0
    with weightsync.Subscriber(args.endpoint, mode=args.mode, timeout=WAIT) as sub:
        sub.register(model.state_dict())  # updated in place, tied embeddings written once
        for expected in range(1, args.steps + 1):
            faulthandler.dump_traceback_later(WAIT, exit=True)
            kind, step, theirs, loss = from_trainer.get(timeout=WAIT)
            assert kind == "logits" and step == expected, (kind, step)
            stats = sub.update(step)  # returns with the weights in place, any stream may read
            mine = as_bytes(logits(model, ids))
            same = mine == theirs
            exact += same
            print(f"engine:  step {step:3d} logits "
                  f"{'bit-exact with' if same else 'DIFFER from'} the trainer's "
                  f"(sha256 {hashlib.sha256(mine).hexdigest()[:12]}); update "
                  f"{stats.seconds * 1e3:.1f} ms, {megabytes(stats.bytes)}, "
                  f"{stats.gbps:.1f} GB/s", flush=True)
            acks.put(step)
        kind, _, their_tokens, _ = from_trainer.get(timeout=WAIT)
        tokens = greedy(model, ids, args.generate)
        print(f"engine:  greedy generation {tokens[ids.shape[1]:]}", flush=True)
        print(f"trainer: greedy generation {their_tokens[ids.shape[1]:]} "
              f"({'the same' if tokens == their_tokens else 'DIFFERENT'})", flush=True)
        acks.put("done")
    moved = [n for n, t in model.state_dict().items() if t.data_ptr() != addresses[n]]
    ok = exact == args.steps and tokens == their_tokens and not moved
    print(f"engine:  {exact}/{args.steps} steps bit-exact; parameters updated in place "
          f"({'addresses unchanged' if not moved else f'MOVED: {moved}'})", flush=True)
    faulthandler.cancel_dump_traceback_later()
    if not ok:
        raise SystemExit(1)


def main():
    args = parse()
    ctx = mp.get_context("spawn")
    to_engine, acks = ctx.Queue(), ctx.Queue()
    print(f"torch_gpu_rl: trainer on {args.trainer_device}, engine on {args.engine_device}, "
          f"{args.config} model, {args.steps} steps, {args.mode}", flush=True)
    procs = [ctx.Process(target=trainer_main, args=(args, to_engine, acks), name="trainer"),
             ctx.Process(target=engine_main, args=(args, to_engine, acks), name="engine")]
    for p in procs:
        p.start()
    deadline = time.monotonic() + WAIT + 60 * args.steps
    failed = False
    while any(p.is_alive() for p in procs) and not failed and time.monotonic() < deadline:
        for p in procs:
            p.join(timeout=0.2)
        failed = any(p.exitcode not in (None, 0) for p in procs)
    rc = 0
    for p in procs:  # one failed (or the run is over time): stop the other
        if p.is_alive():
            p.terminate()
            p.join(10)
        if p.exitcode != 0:
            print(f"torch_gpu_rl: the {p.name} exited with {p.exitcode}", flush=True)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
