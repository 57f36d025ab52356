"""Trainer side of the PyTorch example: trains an nn.Module with SGD and publishes every step.

    python examples/torch_trainer.py --endpoint local://torch-example --steps 20

Needs torch (CPU is enough). The module's state_dict() tensors share storage with its
parameters, so registering them once is enough: optimizer.step() changes them in place and
publish() copies whatever they hold.
"""

import argparse
import time

import torch

import weightsync
from torch_model import build


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", default="local://torch-example")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--dtype", default="float32", help="float32 or bfloat16 (same on both sides)")
    ap.add_argument("--interval", type=float, default=0.05)
    ap.add_argument("--linger", type=float, default=2.0)
    args = ap.parse_args()

    model = build(args.dtype, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with weightsync.Publisher(args.endpoint) as pub:
        pub.register(model.state_dict())  # detached views of the live parameters
        for step in range(1, args.steps + 1):
            x = torch.randn(32, 64, dtype=model.mlp[0].weight.dtype)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            stats = pub.publish(step)
            print(f"trainer: step {step:3d} loss {loss.item():.4f} published in "
                  f"{stats.seconds * 1e6:.0f} us", flush=True)
            time.sleep(args.interval)
        time.sleep(args.linger)
    print("trainer: done", flush=True)


if __name__ == "__main__":
    main()
