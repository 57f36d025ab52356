"""The model both example processes agree on: a two-layer MLP as named NumPy arrays.

The trainer and the engine each build their own copy; weightsync matches them by name, dtype and
shape at the engine's first update.
"""

import numpy as np

LAYERS = {
    "mlp.0.weight": ((256, 64), np.float32),
    "mlp.0.bias": ((256,), np.float32),
    "mlp.2.weight": ((10, 256), np.float32),
    "mlp.2.bias": ((10,), np.float32),
    "step_counter": ((), np.int64),
}


def build_model(seed=None):
    """Fresh arrays: random when `seed` is given (the trainer), zeros otherwise (the engine)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, dtype) in LAYERS.items():
        if seed is None or dtype == np.int64:
            out[name] = np.zeros(shape, dtype)
        else:
            out[name] = (rng.standard_normal(shape) * 0.1).astype(dtype)
    return out


def forward(model, x):
    h = np.maximum(model["mlp.0.weight"] @ x + model["mlp.0.bias"], 0)
    return model["mlp.2.weight"] @ h + model["mlp.2.bias"]


def fingerprint(model):
    """A short digest of every byte, for comparing the two sides by eye."""
    import hashlib

    h = hashlib.sha256()
    for name in LAYERS:
        h.update(np.ascontiguousarray(model[name]).tobytes())
    return h.hexdigest()[:16]
