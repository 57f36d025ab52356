"""Shared fixtures: a private socket directory, unique endpoints, a model factory."""

import itertools
import os
import shutil
import tempfile

import numpy as np
import pytest

# Endpoints live in a private directory (0700, as the library requires) that spawned children
# inherit through the environment. Set at import so every test process agrees.
_SOCKET_DIR = tempfile.mkdtemp(prefix="ws-py-")
os.environ["WEIGHTSYNC_SOCKET_DIR"] = _SOCKET_DIR
os.environ.setdefault("WEIGHTSYNC_LOG_LEVEL", "WARN")
# JAX takes 75% of every GPU at its first use unless told not to; GPU tests share the device with
# torch and child processes (which inherit this).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

_counter = itertools.count()


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_SOCKET_DIR, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` skip where weightsync cannot use a CUDA device, saying why."""
    import weightsync

    status = weightsync.cuda_status()
    if status.available:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA device: {status.reason}")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # not item.keywords: ids say "gpu" too
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _dump_stacks_if_a_gpu_test_hangs(request):
    """A GPU test that hangs dumps every thread's stack (and exits) instead of stalling the run;
    its children have their own timeouts (test_gpu.py)."""
    if request.node.get_closest_marker("gpu") is None:
        yield
        return
    import faulthandler

    faulthandler.dump_traceback_later(int(os.environ.get("WS_GPU_TEST_TIMEOUT", "300")),
                                      exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture
def endpoint():
    return f"local://py-{os.getpid()}-{next(_counter)}"


def make_model(seed=0, count=6, elements=257):
    """A small model of assorted dtypes; deterministic in `seed`."""
    rng = np.random.default_rng(seed)
    dtypes = [np.float32, np.float16, np.int64, np.uint8, np.float64, np.int32]
    out = {}
    for i in range(count):
        dt = np.dtype(dtypes[i % len(dtypes)])
        shape = (elements,) if i % 2 else (3, elements)
        raw = rng.integers(0, 256, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
        out[f"layers.{i}.weight"] = raw.view(dt).reshape(shape)
    return out


def bump(model):
    """Changes every byte of every tensor (wrapping), without float arithmetic on random bits."""
    for v in model.values():
        v.view(np.uint8)[...] += 1


def zeros_like_model(model):
    return {k: np.zeros_like(v) for k, v in model.items()}


def assert_bit_exact(got, want):
    assert got.keys() == want.keys()
    for k in want:
        a, b = np.ascontiguousarray(got[k]), np.ascontiguousarray(want[k])
        assert a.shape == b.shape, k
        assert a.tobytes() == b.tobytes(), f"tensor {k!r} differs"
