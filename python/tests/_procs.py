"""Child-process bodies for multiprocessing (spawn) tests. Kept import-light and top-level so the
spawned interpreter can unpickle them by name."""

import numpy as np


def dtype_tensors(seed):
    """One tensor per element type NumPy can hold, plus ml_dtypes/raw-bits ones; random bits."""
    rng = np.random.default_rng(seed)

    def bits(dtype, shape):
        dt = np.dtype(dtype)
        raw = rng.integers(0, 256, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
        return raw.view(dt).reshape(shape)

    tensors = {}
    dtypes = {}
    for name in ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                 "float16", "float32", "float64"]:
        tensors[name] = bits(name, (5, 33))
    tensors["bool"] = rng.integers(0, 2, size=(7, 9)).astype(bool)
    tensors["scalar"] = np.array(3.25, dtype=np.float64)
    tensors["empty"] = np.zeros((0, 4), dtype=np.float32)
    # Raw bits with an explicit dtype: what callers without ml_dtypes pass.
    tensors["raw.bfloat16"] = bits(np.uint16, (4, 17))
    dtypes["raw.bfloat16"] = "bfloat16"
    tensors["raw.float8_e4m3fn"] = bits(np.uint8, (4, 17))
    dtypes["raw.float8_e4m3fn"] = "float8_e4m3fn"
    tensors["raw.tfloat32"] = bits(np.uint32, (4, 3))
    dtypes["raw.tfloat32"] = "tfloat32"
    tensors["raw.float4_e2m1fn"] = bits(np.uint8, (4, 6))  # 4 x 12 packed values
    dtypes["raw.float4_e2m1fn"] = "float4_e2m1fn"
    try:
        import ml_dtypes
    except ImportError:
        pass
    else:
        for name in ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"]:
            raw = bits(np.uint16 if name == "bfloat16" else np.uint8, (6, 11))
            tensors["ml." + name] = raw.view(getattr(ml_dtypes, name))
    return tensors, dtypes


def serve_dtype_model(endpoint, seed, steps, ready, done):
    """Publishes dtype_tensors(seed + step) for each step in `steps`, waiting on `done` between."""
    import weightsync

    tensors, dtypes = dtype_tensors(seed)
    with weightsync.Publisher(endpoint) as pub:
        pub.register(tensors, dtypes=dtypes)
        for step in steps:
            fresh, _ = dtype_tensors(seed + step)
            for k in tensors:
                tensors[k][...] = fresh[k]
            pub.publish(step)
            ready.put(step)
            done.get(timeout=60)


def subscribe_and_report(endpoint, names_shapes, step, out):
    """Subscriber in a child: receives `step` and sends back the bytes of every tensor."""
    import weightsync

    with weightsync.Subscriber(endpoint, timeout=30) as sub:
        dst = {n: np.zeros(shape, dtype=dt) for n, (dt, shape) in names_shapes.items()}
        sub.register(dst)
        stats = sub.update(step)
        out.put((stats.step, {n: a.tobytes() for n, a in dst.items()}))
