"""Engine side of the NumPy example: keeps its own MLP up to date with the trainer's.

    python examples/numpy_engine.py --endpoint local://numpy-example --steps 20

--style register (default): the engine's arrays are registered once and updated in place.
--style receive: the engine loads weights through its own loader from (name, array) pairs, as
  inference engines with a load_weights(iterable) hook do; the Subscriber owns those arrays.
--serve ENDPOINT: this engine is also a relay (docs/relays.md): every version it commits is served
  there to other engines, which take --endpoint ENDPOINT instead of the trainer's.
"""

import argparse
import time

import numpy as np

import weightsync
from numpy_model import LAYERS, build_model, fingerprint, forward


def load_weights(model, weights):
    """An engine's own loader: copies (name, array) pairs into its parameters."""
    for name, array in weights:
        np.copyto(model[name], array)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", default="local://numpy-example")
    ap.add_argument("--steps", type=int, default=20, help="stop after this step")
    ap.add_argument("--style", choices=["register", "receive"], default="register")
    ap.add_argument("--verify", action="store_true", help="check xxHash3 digests")
    ap.add_argument("--serve", default="", help="relay what it commits at this endpoint")
    ap.add_argument("--linger", type=float, default=0.0,
                    help="seconds to stay up after the last step (a relay's children catch up)")
    args = ap.parse_args()

    model = build_model()
    x = np.ones(64, np.float32)
    addresses = {n: a.ctypes.data for n, a in model.items()}
    with weightsync.Subscriber(args.endpoint, timeout=30, verify=args.verify,
                               serve_endpoint=args.serve) as sub:
        if sub.serve_endpoint:
            print(f"engine:  relaying at {sub.serve_endpoint}", flush=True)
        if args.style == "register":
            sub.register(model)
        else:
            for name, (shape, dtype) in LAYERS.items():
                sub.allocate(name, dtype, shape)
        step = -1
        while step < args.steps:
            if args.style == "register":
                stats = sub.update()  # the latest step, or up_to_date when we already hold it
                fresh = not stats.up_to_date
            else:
                load_weights(model, sub.receive())
                fresh = sub.committed_step != step
            if not fresh:
                time.sleep(0.005)  # an engine would serve requests here
                continue
            step = sub.committed_step
            logits = forward(model, x)
            assert int(model["step_counter"]) == step
            print(f"engine:  at step {step:3d} fingerprint {fingerprint(model)} "
                  f"argmax {int(np.argmax(logits))}", flush=True)
        time.sleep(args.linger)
    assert all(model[n].ctypes.data == a for n, a in addresses.items()), "addresses moved"
    print("engine:  done; weights updated in place, addresses unchanged", flush=True)


if __name__ == "__main__":
    main()
