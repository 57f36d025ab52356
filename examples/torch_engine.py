"""Engine side of the PyTorch example: keeps an nn.Module's parameters equal to the trainer's,
updating module.parameters() in place (data_ptr() of every parameter never changes).

    python examples/torch_engine.py --endpoint local://torch-example --steps 20
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
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--mode", choices=["staged", "in_place"], default="staged")
    args = ap.parse_args()

    model = build(args.dtype).eval().requires_grad_(False)
    addresses = {n: p.data_ptr() for n, p in model.named_parameters()}
    x = torch.ones(1, 64, dtype=model.mlp[0].weight.dtype)
    with weightsync.Subscriber(args.endpoint, mode=args.mode, timeout=30) as sub:
        sub.register(model.state_dict())  # tensors sharing storage with the parameters
        step = -1
        while step < args.steps:
            stats = sub.update()
            if stats.up_to_date:
                time.sleep(0.005)  # an engine would serve requests here
                continue
            step = stats.step
            with torch.inference_mode():
                y = model(x)
            print(f"engine:  step {step:3d} ({stats.bytes} bytes in {stats.seconds * 1e6:.0f} us)"
                  f" output[0] {y[0, 0].item():+.4f}", flush=True)
    moved = [n for n, p in model.named_parameters() if p.data_ptr() != addresses[n]]
    assert not moved, f"parameters moved: {moved}"
    print("engine:  done; module.parameters() updated in place, addresses unchanged", flush=True)


if __name__ == "__main__":
    main()
