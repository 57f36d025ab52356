"""Trainer side of the NumPy example: "trains" a small MLP and publishes every step.

    python examples/numpy_trainer.py --endpoint local://numpy-example --steps 20

Run examples/numpy_engine.py with the same endpoint next to it, or both at once with
examples/run_example.sh numpy.
"""

import argparse
import time

import numpy as np

import weightsync
from numpy_model import build_model, fingerprint


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", default="local://numpy-example")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--interval", type=float, default=0.05, help="seconds between steps")
    ap.add_argument("--linger", type=float, default=2.0,
                    help="seconds to keep serving after the last step, so engines catch up")
    args = ap.parse_args()

    model = build_model(seed=0)
    rng = np.random.default_rng(1)
    with weightsync.Publisher(args.endpoint) as pub:
        # Registered once: the arrays stay ours; publish() copies them into shared memory, so we
        # may change them again as soon as it returns.
        pub.register(model)
        for step in range(1, args.steps + 1):
            for name, w in model.items():  # a stand-in for an optimizer step, in place
                if w.dtype == np.float32:
                    w -= 0.01 * rng.standard_normal(w.shape).astype(np.float32)
            model["step_counter"][...] = step
            stats = pub.publish(step)
            print(f"trainer: published step {step:3d} ({stats.bytes_copied} bytes in "
                  f"{stats.seconds * 1e6:.0f} us) fingerprint {fingerprint(model)}", flush=True)
            time.sleep(args.interval)
        time.sleep(args.linger)
    print("trainer: done", flush=True)


if __name__ == "__main__":
    main()
