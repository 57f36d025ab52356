"""A step creates nothing that stays: 100,000 update() calls of a tiny model, RSS slope after
warm-up under 1 byte per call, and tracemalloc sees no growth of Python allocations."""

import gc
import os
import time
import tracemalloc

import numpy as np
import pytest

import weightsync

CALLS = int(os.environ.get("WS_MEMORY_CALLS", "100000"))
WARMUP = CALLS // 10
SAMPLE_EVERY = 1000
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def slope(xs, ys):
    """Least-squares slope of ys over xs."""
    x, y = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
    x -= x.mean()
    return float((x * (y - y.mean())).sum() / (x * x).sum())


@pytest.mark.slow
def test_update_loop_rss_slope_and_tracemalloc(endpoint):
    model = {f"t{i}": np.arange(64, dtype=np.float32) + i for i in range(4)}
    dst = {k: np.zeros_like(v) for k, v in model.items()}
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register(model)
        sub.register(dst)
        publish, update = pub.publish, sub.update
        calls, rss = [], []
        gc.collect()
        t0 = time.perf_counter()
        for i in range(1, CALLS + 1):
            publish(i)
            update()
            if i >= WARMUP and i % SAMPLE_EVERY == 0:
                calls.append(i)
                rss.append(rss_bytes())
        seconds = time.perf_counter() - t0
        per_call = slope(calls, rss)
        print(f"\n{CALLS} publish+update calls in {seconds:.1f} s "
              f"({seconds / CALLS * 1e6:.0f} us each); RSS {rss[0]} -> {rss[-1]} bytes, "
              f"least-squares slope {per_call:.4f} bytes/call")
        assert per_call < 1.0, f"RSS grows {per_call:.3f} bytes per update"
        assert all((dst[k] == model[k]).all() for k in model)

        # Python-level allocations: none survive a step (what remains is the loop variable).
        n = max(CALLS // 10, 1000)
        tracemalloc.start()
        try:
            for i in range(CALLS + 1, CALLS + 1 + 100):  # warm tracemalloc's own tables
                publish(i)
                update()
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            for i in range(CALLS + 101, CALLS + 101 + n):
                publish(i)
                update()
            gc.collect()
            growth = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        print(f"tracemalloc over {n} calls: {growth:+d} bytes")
        assert growth < 512, f"Python allocations grew {growth} bytes over {n} calls"
