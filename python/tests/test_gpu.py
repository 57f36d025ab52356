"""CUDA tensors through the Python API, publisher and subscriber in separate processes.

The publisher runs in a child process (_gpu_child.py: torch, CuPy, JAX or NumPy tensors), the
subscriber in the test process; on one GPU both use cuda:0 (cuda-ipc works between processes on
one device). Tests marked `gpu` skip where weightsync.cuda_status() says no CUDA device; the GPU
machine runs them with scripts/python_gpu_test.sh (`pytest -m gpu`). Most tests also run with
host tensors on any machine (the `cpu` variants), which checks this harness itself.

Every wait is bounded: the child has a watchdog per command (faulthandler, dumps its stacks and
exits), the test reads its answers with a deadline, subscribers have timeouts, and a GPU test that
hangs dumps the test process's stacks (conftest.py). Destinations start poisoned (0xFF) and are
compared byte for byte with what the publisher wrote (_gpu_data.content).
"""

import gc
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc

import numpy as np
import pytest

import weightsync
from _gpu_data import (UINT, WIDTH, fp8_scale_shape, model_bytes, nbytes,
                       quantize_fp8_reference)

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "_gpu_child.py")
GPU = "cuda:0"
gpu = pytest.mark.gpu
ON = [pytest.param("cpu", id="cpu"), pytest.param(GPU, id="cuda", marks=gpu)]

# Every dtype issue 14 names, random bits (NaNs and infinities included), odd shapes.
SPEC = [
    ("model.embed.weight", "bfloat16", (257, 96), "bits"),
    ("model.norm.weight", "bfloat16", (96,), "bits"),
    ("half", "float16", (3, 129), "bits"),
    ("single", "float32", (7, 3, 5), "bits"),
    ("fp8.e4m3", "float8_e4m3fn", (64, 17), "bits"),
    ("fp8.e5m2", "float8_e5m2", (1000,), "bits"),
    ("counts", "int64", (3,), "bits"),
    ("scalar", "float32", (), "bits"),
]


# ---- helpers ------------------------------------------------------------------------------------

def need(device, framework="torch"):
    """The framework module, skipping the test where it (or its CUDA support) is missing."""
    mod = pytest.importorskip(framework)
    if device != "cpu" and framework == "torch" and not mod.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return mod


class ChildPublisher:
    """_gpu_child.py in its own process; every answer is awaited with a deadline."""

    def __init__(self, endpoint, spec, device=GPU, framework=None, seed=0, timeout=120,
                 env=None, zero_copy=False, ring=""):
        self.spec, self.seed, self.timeout = spec, seed, timeout
        # Host tensors from NumPy (starts in a fraction of torch's import time); CUDA: torch.
        framework = framework or ("numpy" if device == "cpu" else "torch")
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", CHILD, "--endpoint", endpoint, "--device",
             device, "--framework", framework, "--spec", json.dumps(spec), "--seed", str(seed),
             "--timeout", str(timeout)] + (["--zero-copy"] if zero_copy else []) +
            (["--ring", ring] if ring else []),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env)
        self.pid = self.proc.pid
        self.buf = b""
        line = self.readline(timeout)
        assert line.startswith("ready "), line + self.stderr()
        self.endpoint = line.split()[1]
        self.expandable_segments = "expandable=1" in line.split()

    def stderr(self):
        self.log.seek(0)
        return "\n--- publisher child's stderr:\n" + self.log.read()[-20000:].decode(
            errors="replace")

    def readline(self, timeout):
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise AssertionError(f"publisher child silent for {timeout} s" + self.stderr())
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    rc = self.proc.wait(30)
                    raise AssertionError(f"publisher child exited (rc {rc})" + self.stderr())
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def ask(self, command, step, timeout=None):
        self.proc.stdin.write(b"%s %d\n" % (command.encode(), step))
        self.proc.stdin.flush()
        line = self.readline(timeout or self.timeout)
        if line != "ok %d" % step:
            raise AssertionError(f"{command} {step}: {line!r}" + self.stderr())

    def publish(self, step):
        self.ask("publish", step)

    def expected(self, step):
        return model_bytes(self.spec, self.seed, step)

    def kill(self, sig=signal.SIGKILL):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            if sig == signal.SIGKILL:
                self.proc.wait(30)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b"exit\n")
                self.proc.stdin.flush()
                self.proc.wait(60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.kill()
                raise AssertionError("publisher child did not exit" + self.stderr())
            assert self.proc.returncode == 0, self.stderr()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, kind, *rest):
        if kind is None:
            self.close()
        else:
            self.kill()
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
            self.log.close()


class TorchDestinations:
    """Destinations of `spec` as torch tensors on `device`, poisoned with 0xFF."""

    def __init__(self, spec, device):
        import torch

        self.raw, self.tensors = {}, {}
        for name, dtype, shape, *_ in spec:
            raw = torch.full((nbytes(dtype, shape),), 255, dtype=torch.uint8, device=device)
            self.raw[name] = raw
            self.tensors[name] = raw.view(getattr(torch, dtype)).view(shape)

    def register(self, sub):
        sub.register(self.tensors)

    def bytes(self):
        return {n: r.cpu().numpy().tobytes() for n, r in self.raw.items()}


class RawDestinations:
    """Destinations as raw unsigned integers of each dtype's width (registered with dtypes=),
    poisoned with 0xFF, in `xp`'s memory: NumPy on the host, CuPy on a GPU."""

    def __init__(self, spec, xp, to_bytes):
        self.raw, self.tensors, self.dtypes = {}, {}, {}
        self._to_bytes = to_bytes
        for name, dtype, shape, *_ in spec:
            raw = xp.full(nbytes(dtype, shape), 255, xp.uint8)
            self.raw[name] = raw
            self.tensors[name] = raw.view(UINT[WIDTH[dtype]]).reshape(shape)
            self.dtypes[name] = dtype

    def register(self, sub):
        sub.register(self.tensors, dtypes=self.dtypes)

    def bytes(self):
        return {n: self._to_bytes(r) for n, r in self.raw.items()}


def NumpyDestinations(spec):
    return RawDestinations(spec, np, lambda r: r.tobytes())


def CupyDestinations(spec, device):
    import cupy

    with cupy.cuda.Device(int(device.split(":")[1])):
        return RawDestinations(spec, cupy, lambda r: r.get().tobytes())


def assert_same(got, want, what=""):
    assert got.keys() == want.keys()
    bad = [n for n in want if got[n] != want[n]]
    assert not bad, f"{what}: tensors differ from what the publisher wrote: {bad}"


def importable(name):
    import importlib.util
    return importlib.util.find_spec(name) is not None


def torch_bytes(t):
    return t.detach().reshape(-1).view(__import__("torch").uint8).cpu().numpy().tobytes()


def ledger():
    d = weightsync.ledger()
    d.pop("release_failures")
    return d


# ---- round trips ------------------------------------------------------------------------------

# (device, zero_copy): host tensors over shm, CUDA tensors through the publisher's GPU arena, and
# CUDA tensors published where they are (zero-copy: torch's caching allocator packs several into
# one cudaMalloc segment; with expandable segments, into cuMem chunks shared by fd).
PUBLISHERS = [pytest.param("cpu", False, id="cpu"), pytest.param(GPU, False, id="cuda", marks=gpu),
              pytest.param(GPU, True, id="cuda-zero-copy", marks=gpu),
              pytest.param(GPU, "expandable", id="cuda-zero-copy-expandable-segments", marks=gpu),
              pytest.param(GPU, "ring", id="cuda-ring", marks=gpu)]
PATHS = {("cpu", False): "shm", (GPU, False): "cuda-ipc", (GPU, True): "cuda-ipc-zero-copy",
         (GPU, "expandable"): "cuda-ipc-zero-copy", (GPU, "ring"): "cuda-ipc-ring"}


@pytest.mark.parametrize("mode", ["staged", "in_place"])
@pytest.mark.parametrize("device,zero_copy", PUBLISHERS)
def test_torch_round_trip(endpoint, device, zero_copy, mode):
    """bf16, fp16, fp32, fp8 (e4m3fn, e5m2) and more: bit-exact into poisoned destinations,
    verified, over 3 steps on one prepared handle."""
    need(device)
    expandable = zero_copy == "expandable"
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True") if expandable else None
    # The ring: two 16 KiB buckets on the trainer's GPU, the ~60 KB model streamed through them.
    ring = "2:16384" if zero_copy == "ring" else ""
    with ChildPublisher(endpoint, SPEC, device, zero_copy=zero_copy in (True, "expandable"),
                        env=env, ring=ring) as pub:
        assert pub.expandable_segments == expandable, "the trainer's memory is not what the row says"
        dst = TorchDestinations(SPEC, device)
        with weightsync.Subscriber(pub.endpoint, mode=mode, verify=True, timeout=60) as sub:
            dst.register(sub)
            for step in (1, 2, 3):
                pub.publish(step)
                stats = sub.update(step)
                assert stats.step == step and stats.verified
                assert stats.handle_created == (step == 1)
                assert stats.path == PATHS[(device, zero_copy)], stats
                assert_same(dst.bytes(), pub.expected(step), f"step {step}")
            assert sub.weights_valid and sub.committed_step == 3


@pytest.mark.parametrize("device", ON)
def test_zero_sized_and_scalar_tensors(endpoint, device):
    need(device)
    spec = [("empty", "float32", (0, 4), "bits"), ("scalar", "bfloat16", (), "bits"),
            ("one", "float8_e4m3fn", (1,), "bits"), ("w", "float32", (5, 5), "bits")]
    with ChildPublisher(endpoint, spec, device) as pub:
        dst = TorchDestinations(spec, device)
        with weightsync.Subscriber(pub.endpoint, verify=True, timeout=60) as sub:
            dst.register(sub)
            for step in (1, 2):
                pub.publish(step)
                sub.update(step)
                assert_same(dst.bytes(), pub.expected(step))


@pytest.mark.parametrize("framework", ["torch", "dlpack", "cupy"])
@pytest.mark.parametrize("device", ON)
def test_allocate_and_receive(endpoint, device, framework):
    """Subscriber-owned tensors on the device (allocate(device=...)): zero-copy views that
    torch.from_dlpack / cupy.from_dlpack take; receive() yields the same objects every step."""
    torch = need(device)
    if framework == "cupy":
        if device == "cpu":
            pytest.skip("CuPy views CUDA memory only")
        cupy = pytest.importorskip("cupy")
    with ChildPublisher(endpoint, SPEC, device) as pub:
        pub.publish(1)
        with weightsync.Subscriber(pub.endpoint, verify=True, timeout=60) as sub:
            views = {name: sub.allocate(name, dtype, shape, framework=framework,
                                        device=None if device == "cpu" else device)
                     for name, dtype, shape in sub.published_manifest()}
            if framework == "torch":
                as_torch = views
                for name, dtype, shape, _ in SPEC:
                    t = views[name]
                    assert t.dtype == getattr(torch, dtype) and tuple(t.shape) == shape
                    assert t.device == torch.device(device)
            elif framework == "dlpack":
                as_torch = {n: torch.from_dlpack(v) for n, v in views.items()}  # zero-copy
                if device != "cpu" and importable("cupy"):
                    import cupy
                    for name, dtype, _, _ in SPEC:
                        if dtype in ("float16", "float32", "int64"):  # dtypes CuPy has
                            assert cupy.from_dlpack(views[name]).data.ptr == \
                                as_torch[name].data_ptr()
            if framework == "cupy":  # bfloat16 and float8 as raw uint16/uint8 bits
                assert all(isinstance(v, cupy.ndarray) for v in views.values())
                raw = {n: v.reshape(-1).view(cupy.uint8) for n, v in views.items()}

                def read():
                    return {n: r.get().tobytes() for n, r in raw.items()}

                def pointers():
                    return {n: r.data.ptr for n, r in raw.items()}  # views of `views`

                for r in raw.values():
                    r.fill(255)  # poison
            else:
                def read():
                    return {n: torch_bytes(t) for n, t in as_torch.items()}

                def pointers():
                    return {n: t.data_ptr() for n, t in as_torch.items()}

                for t in as_torch.values():
                    t.reshape(-1).view(torch.uint8).fill_(255)  # poison
            before = pointers()
            for step in (1, 2, 3):
                if step > 1:
                    pub.publish(step)
                received = sub.receive(step)
                pairs = list(received)
                assert received.stats.step == step and received.stats.verified
                assert [n for n, _ in pairs] == list(views)
                assert all(v is views[n] for n, v in pairs), "receive() made new objects"
                assert_same(read(), pub.expected(step), f"step {step}")
                assert pointers() == before
            del pairs, received
        del views  # the device memory goes with its last view


@gpu
def test_cupy_round_trip(endpoint):
    cupy = pytest.importorskip("cupy")
    spec = [(n, d, s, k) for n, d, s, k in SPEC]
    with ChildPublisher(endpoint, spec, GPU, framework="cupy") as pub:
        dst = CupyDestinations(spec, GPU)
        with weightsync.Subscriber(pub.endpoint, verify=True, timeout=60) as sub:
            dst.register(sub)
            for step in (1, 2):
                pub.publish(step)
                sub.update(step)
                cupy.cuda.get_current_stream().synchronize()
                assert_same(dst.bytes(), pub.expected(step), f"step {step}")


@gpu
def test_jax_publisher_and_jax_views(endpoint):
    """JAX arrays are immutable: the JAX publisher copies its new arrays into buffers from
    Publisher.allocate(device=...) (through torch, zero-copy DLPack both ways), and the JAX engine
    takes fresh zero-copy JAX arrays of subscriber-owned buffers after each update."""
    need(GPU)
    jax = pytest.importorskip("jax")
    if not [d for d in jax.devices() if d.platform == "gpu"]:
        pytest.skip("JAX has no GPU backend here")
    spec = [("w", "float32", (64, 48), "bits"), ("h", "bfloat16", (300,), "bits")]
    with ChildPublisher(endpoint, spec, GPU, framework="jax") as pub:
        pub.publish(1)
        with weightsync.Subscriber(pub.endpoint, verify=True, timeout=60) as sub:
            views = {n: sub.allocate(n, d, s, framework="dlpack", device=GPU)
                     for n, d, s in sub.published_manifest()}
            with pytest.raises(weightsync.InvalidArgument, match="JAX array is immutable"):
                sub.register({"w": jax.dlpack.from_dlpack(views["w"])})
            for step in (1, 2):
                if step > 1:
                    pub.publish(step)
                sub.receive(step)
                got = {n: np.asarray(jax.dlpack.from_dlpack(v)).tobytes() for n, v in views.items()}
                assert_same(got, pub.expected(step), f"step {step}")


@pytest.mark.parametrize("mode", ["staged", "in_place"])
@pytest.mark.parametrize("ring", ["", "2:16384"], ids=["arena", "ring"])
@pytest.mark.parametrize("direction", ["host_to_gpu", "gpu_to_host"])
@gpu
def test_host_and_gpu_mixed(endpoint, direction, ring, mode):
    """A host publisher into CUDA destinations (shm, the GPU's copy engines read the arena), and a
    GPU publisher into host destinations (cuda-ipc mapped, copied down); each also through a ring
    of two 16 KiB buckets (host memory, or the trainer's GPU) instead of the arena."""
    need(GPU)
    pub_device = "cpu" if direction == "host_to_gpu" else GPU
    with ChildPublisher(endpoint, SPEC, pub_device, ring=ring) as pub:
        dst = TorchDestinations(SPEC, GPU) if direction == "host_to_gpu" else \
            NumpyDestinations(SPEC)
        with weightsync.Subscriber(pub.endpoint, mode=mode, verify=True, timeout=60) as sub:
            dst.register(sub)
            for step in (1, 2, 3):
                pub.publish(step)
                stats = sub.update(step)
                path = direction.replace("_", "-") + ("-ring" if ring else "")
                assert stats.verified and stats.path == path, stats
                assert_same(dst.bytes(), pub.expected(step), f"step {step}")


# ---- bf16 -> fp8 in flight ----------------------------------------------------------------------

FP8_SOURCE = [("w0", "bfloat16", (300, 260), "finite"), ("w1", "bfloat16", (128, 128), "finite"),
              ("w2", "bfloat16", (2, 3, 130), "finite"), ("norm", "bfloat16", (260,), "finite")]


def fp8_destinations(source):
    out = []
    for name, dtype, shape, kind in source:
        if len(shape) < 2:
            out.append((name, dtype, shape, kind))
            continue
        out.append((name, "float8_e4m3fn", shape, kind))
        out.append((name + "_scale_inv", "float32", fp8_scale_shape(shape), kind))
    return out


def fp8_expected(source_bytes):
    want = {}
    for name, _, shape, _ in FP8_SOURCE:
        if len(shape) < 2:
            want[name] = source_bytes[name]
        else:
            want[name], want[name + "_scale_inv"] = quantize_fp8_reference(source_bytes[name],
                                                                            shape)
    return want


@pytest.mark.parametrize("mode", ["staged", "in_place"])
@pytest.mark.parametrize("device", ON)
def test_bf16_to_fp8_in_flight(endpoint, device, mode):
    """convert_dtypes: fp8 weights and float32 block scales on the device equal, byte for byte, a
    host subscriber's of the same step (the host path converts with the CPU reference), which in
    turn equals this file's NumPy reference from the format's definition (_gpu_data)."""
    need(device)
    pytest.importorskip("ml_dtypes")
    dst_spec = fp8_destinations(FP8_SOURCE)
    with ChildPublisher(endpoint, FP8_SOURCE, device) as pub:
        on_device = TorchDestinations(dst_spec, device)
        on_host = NumpyDestinations(dst_spec)
        options = dict(mode=mode, verify=True, timeout=60, convert_dtypes=True)
        with weightsync.Subscriber(pub.endpoint, **options) as a, \
                weightsync.Subscriber(pub.endpoint, **options) as b:
            on_device.register(a)
            on_host.register(b)
            for step in (1, 2):
                pub.publish(step)
                assert a.update(step).verified and b.update(step).verified
                reference = fp8_expected(pub.expected(step))
                assert_same(on_host.bytes(), reference, f"host path vs NumPy, step {step}")
                assert_same(on_device.bytes(), reference, f"{device} vs reference, step {step}")


# ---- streams -----------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["stream", "current"])
@gpu
def test_publish_waits_for_the_callers_stream(endpoint, how):
    """The child writes the new bytes on a side stream behind ~0.1 s of GPU work and publishes at
    once (stream=side, or stream=None inside `with torch.cuda.stream(side)`): the version holds
    the new bytes, not the old ones the copy would read if it did not wait for that stream."""
    need(GPU)
    spec = [("w", "float32", (1024, 1024), "bits"), ("b", "bfloat16", (4096,), "bits")]
    with ChildPublisher(endpoint, spec, GPU) as pub:
        dst = TorchDestinations(spec, GPU)
        with weightsync.Subscriber(pub.endpoint, verify=True, timeout=60) as sub:
            dst.register(sub)
            pub.publish(1)
            sub.update(1)
            for step in (2, 3):
                pub.ask(how, step)
                sub.update(step)
                assert_same(dst.bytes(), pub.expected(step), f"{how}, step {step}")


# ---- Ctrl-C --------------------------------------------------------------------------------------

def interrupt_after(seconds, start=True):
    sent = {}

    def fire():
        sent["at"] = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(seconds, fire)
    if start:
        timer.start()
    return timer, sent


@pytest.mark.skipif(signal.getsignal(signal.SIGINT) is not signal.default_int_handler,
                    reason="needs Python's default SIGINT handler")
@gpu
def test_ctrl_c_during_a_gpu_update(endpoint):
    """KeyboardInterrupt within 200 ms, and the weights are one whole step: the old one (nothing
    committed) or, for an interrupt that came too late to cancel, the new one (it says so)."""
    torch = need(GPU)
    spec = [(f"w{i}", "bfloat16", (2048, 4096), "bits") for i in range(4)]  # 64 MiB
    with ChildPublisher(endpoint, spec, GPU) as pub:
        dst = TorchDestinations(spec, GPU)
        with weightsync.Subscriber(pub.endpoint, mode="staged", timeout=30) as sub:
            dst.register(sub)
            pub.publish(1)
            sub.update(1)
            # 1. While the update waits for a step that is not published yet.
            timer, sent = interrupt_after(0.3)
            with pytest.raises(KeyboardInterrupt):
                sub.update(2)
            latency = time.monotonic() - sent["at"]
            timer.join()
            assert latency < 0.2, f"KeyboardInterrupt {latency * 1e3:.0f} ms after SIGINT"
            assert sub.committed_step == 1 and sub.weights_valid
            assert_same(dst.bytes(), pub.expected(1), "after the interrupt")
            pub.publish(2)
            seconds = sub.update(2).seconds
            assert_same(dst.bytes(), pub.expected(2))
            # 2. At points spread over the update itself (prepare, copies, commit).
            sub.sleep()  # the next update prepares again: a longer window
            committed, outcomes = 2, []
            for k, fraction in enumerate(np.linspace(0.0, 1.5, 10), start=3):
                pub.publish(k)
                timer, sent = interrupt_after(fraction * max(seconds, 0.002), start=False)
                try:
                    try:
                        timer.start()  # inside: an early signal is caught below all the same
                        sub.update(k)
                    finally:
                        timer.join()  # the signal is sent before this block is left
                except KeyboardInterrupt:
                    latency = time.monotonic() - sent["at"]
                    assert latency < 0.2, f"KeyboardInterrupt {latency * 1e3:.0f} ms after SIGINT"
                timer.join()
                torch.cuda.synchronize()
                # Either step, never a mixture. (Whether an interrupt that lands after the commit
                # carries .update_stats cannot be told from here: it may also have arrived after
                # update() returned; test_interrupt.py pins that case down with a fail point.)
                now = sub.committed_step
                assert now in (committed, k) and sub.weights_valid
                assert_same(dst.bytes(), pub.expected(now), f"attempt {k}: a whole step")
                outcomes.append("kept" if now == committed else "committed")
                committed = now
                sub.sleep()
            print("interrupt outcomes:", outcomes)


# ---- a publisher that dies or stalls --------------------------------------------------------------

@pytest.mark.parametrize("device", ON)
def test_publisher_killed_while_the_subscriber_waits(endpoint, device):
    need(device)
    with ChildPublisher(endpoint, SPEC, device) as pub:
        dst = TorchDestinations(SPEC, device)
        with weightsync.Subscriber(pub.endpoint, timeout=5, verify=True) as sub:
            dst.register(sub)
            pub.publish(1)
            sub.update(1)
            sub.sleep()
            base = ledger()
            killer = threading.Timer(0.5, pub.kill)
            killer.start()
            t0 = time.monotonic()
            with pytest.raises((weightsync.PeerLost, weightsync.NotFound, weightsync.Timeout)):
                sub.update(2)
            elapsed = time.monotonic() - t0
            killer.join()
            assert pub.proc.returncode == -signal.SIGKILL
            assert elapsed < 5 + 1.5, f"the error came after {elapsed:.1f} s (timeout 5 s)"
            assert sub.committed_step == 1 and sub.weights_valid
            assert_same(dst.bytes(), pub.expected(1), "after the publisher died")
            assert ledger() == base


SUBSCRIBER_CHILD = r"""
import faulthandler, json, os, sys, time
faulthandler.dump_traceback_later(120, exit=True)
sys.path.insert(0, sys.argv[1])
import torch, weightsync
from _gpu_data import model_bytes
from test_gpu import TorchDestinations
endpoint, device, mode, spec = sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
spec = [(n, d, tuple(s), k) for n, d, s, k in spec]
dst = TorchDestinations(spec, device)
with weightsync.Subscriber(endpoint, mode=mode, verify=True, timeout=10) as sub:
    dst.register(sub)
    sub.update(1)  # warm: CUDA, the handle (the fail point's first sleep)
    assert dst.bytes() == model_bytes(spec, 0, 1), "step 1 did not arrive"
    print("updating", flush=True)
    t0 = time.monotonic()
    try:
        sub.update(2)  # the fail point holds step 2 acquired; the test kills the publisher
        out = {"error": None}
    except weightsync.Error as e:
        out = {"error": type(e).__name__, "message": str(e)}
    out.update(elapsed=time.monotonic() - t0, committed=sub.committed_step,
               valid=sub.weights_valid, kept=dst.bytes() == model_bytes(spec, 0, 1))
print(json.dumps(out), flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["staged", "in_place"])
@pytest.mark.parametrize("device", ON)
def test_publisher_killed_mid_transfer(endpoint, device, mode):
    """The subscriber (its own process) holds step 2 for 3 s after acquiring it (fail point
    subscriber.before_copy); the publisher is SIGKILLed meanwhile. A typed error within the
    timeout; staged: step 1 intact; in place: weights marked invalid."""
    need(device)
    with ChildPublisher(endpoint, SPEC, device) as pub:
        pub.publish(1)
        pub.publish(2)  # two slots: both held
        env = dict(os.environ, WEIGHTSYNC_FAILPOINTS="subscriber.before_copy=sleep:3000*2")
        spec = json.dumps([[n, d, list(s), k] for n, d, s, k in SPEC])
        sub = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", "-c", SUBSCRIBER_CHILD, HERE, pub.endpoint,
             device, mode, spec], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env)
        try:
            ready, _, _ = select.select([sub.stdout], [], [], 120)
            line = sub.stdout.readline().strip() if ready else "(nothing in 120 s)"
            if line != "updating":
                sub.kill()
                raise AssertionError(f"subscriber child: {line!r}\n{sub.communicate()[1]}")
            time.sleep(1.0)
            pub.kill()
            out, err = sub.communicate(timeout=60)
        finally:
            if sub.poll() is None:
                sub.kill()
                sub.wait(30)
    assert sub.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["error"] in ("PeerLost", "Timeout"), result
    assert 2.9 < result["elapsed"] < 10 + 1.5, result  # the fail point fired; within the timeout
    assert result["committed"] == 1, result
    if mode == "staged":
        assert result["valid"] and result["kept"], result
    else:
        assert not result["valid"], result


@pytest.mark.slow
@pytest.mark.parametrize("device", ON)
def test_stalled_publisher_times_out(endpoint, device):
    """A publisher that stops answering (SIGSTOP) costs the subscriber its timeout, no more, and
    the next update after it resumes succeeds."""
    need(device)
    with ChildPublisher(endpoint, SPEC, device) as pub:
        pub.publish(1)
        dst = TorchDestinations(SPEC, device)
        with weightsync.Subscriber(pub.endpoint, timeout=2, verify=True) as sub:
            dst.register(sub)
            pub.kill(signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                with pytest.raises(weightsync.Timeout):
                    sub.update(1)
                elapsed = time.monotonic() - t0
            finally:
                pub.kill(signal.SIGCONT)
            assert 1.5 < elapsed < 2 + 2.0, f"timed out after {elapsed:.2f} s (timeout 2 s)"
            assert sub.committed_step == -1
            sub.update(1)
            assert_same(dst.bytes(), pub.expected(1), "after the publisher resumed")


# ---- resources -------------------------------------------------------------------------------

@gpu
def test_sleep_wake_cycles_return_to_baseline(endpoint):
    """50 cycles of update + sleep: torch's allocated memory, the device's free memory and the
    ledger come back to where they were after the first cycle."""
    torch = need(GPU)
    spec = [("w", "bfloat16", (1024, 1024), "bits"), ("b", "float32", (4096,), "bits")]
    with ChildPublisher(endpoint, spec, GPU) as pub:
        dst = TorchDestinations(spec, GPU)
        with weightsync.Subscriber(pub.endpoint, mode="staged", verify=True, timeout=60) as sub:
            dst.register(sub)
            pub.publish(1)
            sub.update(1)
            sub.sleep()
            torch.cuda.synchronize()
            base = (torch.cuda.memory_allocated(0), torch.cuda.mem_get_info(0)[0], ledger())
            for cycle in range(2, 52):
                pub.publish(cycle)
                assert sub.update(cycle).handle_created
                if cycle % 10 == 0:
                    assert_same(dst.bytes(), pub.expected(cycle), f"cycle {cycle}")
                sub.sleep()
            torch.cuda.synchronize()
            after = (torch.cuda.memory_allocated(0), torch.cuda.mem_get_info(0)[0], ledger())
    assert after[0] == base[0], f"torch.cuda.memory_allocated {base[0]} -> {after[0]}"
    assert after[2] == base[2], f"ledger {base[2]} -> {after[2]}"
    assert after[1] >= base[1] - (2 << 20), f"free device memory {base[1]} -> {after[1]}"


@pytest.mark.parametrize("device", ON)
def test_engine_memory_freed_on_sleep_and_reallocated_on_wake(endpoint, device):
    """A colocated engine frees its weights on sleep and gets new ones, at new addresses, on wake
    (torch_memory_saver, vLLM sleep level 2): sleep() releases everything pointing at the old
    memory, register() takes the new tensors, the next update prepares again and writes only
    them; 50 cycles leave torch's allocated memory, the device's free memory and the ledger where
    they were."""
    torch = need(device)
    spec = [("w", "bfloat16", (512, 256), "bits"), ("b", "float32", (1024,), "bits")]
    cuda = device != "cpu"
    with ChildPublisher(endpoint, spec, device) as pub:
        with weightsync.Subscriber(pub.endpoint, mode="staged", timeout=60) as sub:
            dst = TorchDestinations(spec, device)
            dst.register(sub)
            pub.publish(1)
            sub.update(1)
            sub.sleep()
            del dst
            gc.collect()
            if cuda:
                torch.cuda.synchronize()
            base = (torch.cuda.memory_allocated(0) if cuda else 0,
                    torch.cuda.mem_get_info(0)[0] if cuda else 0, ledger())
            for cycle in range(2, 52):
                # Something else takes the freed memory first, so the new tensors land elsewhere.
                squatter = torch.empty(4096, dtype=torch.uint8, device=device)
                dst = TorchDestinations(spec, device)
                dst.register(sub)  # same names, new memory
                pub.publish(cycle)
                stats = sub.update(cycle)
                assert stats.handle_created and stats.step == cycle
                assert_same(dst.bytes(), pub.expected(cycle), f"cycle {cycle}")
                sub.sleep()
                del dst, squatter
            gc.collect()
            if cuda:
                torch.cuda.synchronize()
            after = (torch.cuda.memory_allocated(0) if cuda else 0,
                     torch.cuda.mem_get_info(0)[0] if cuda else 0, ledger())
    assert after[0] == base[0], f"torch.cuda.memory_allocated {base[0]} -> {after[0]}"
    assert after[2] == base[2], f"ledger {base[2]} -> {after[2]}"
    assert after[1] >= base[1] - (2 << 20), f"free device memory {base[1]} -> {after[1]}"


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def slope(xs, ys):
    x, y = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
    x -= x.mean()
    return float((x * (y - y.mean())).sum() / (x * x).sum())


@gpu
def test_steady_gpu_updates_allocate_nothing(endpoint):
    """Steady GPU updates leave nothing behind in this process: no Python allocations that stay
    (tracemalloc) and an RSS slope under 1 byte per update over 10,000 updates (least squares,
    after warm-up)."""
    need(GPU)
    steps = int(os.environ.get("WS_GPU_SOAK_STEPS", "10000"))
    spec = [("w", "bfloat16", (64, 64), "bits"), ("b", "float32", (64,), "bits")]
    with ChildPublisher(endpoint, spec, GPU) as pub:
        dst = TorchDestinations(spec, GPU)
        with weightsync.Subscriber(pub.endpoint, mode="in_place", timeout=60) as sub:
            dst.register(sub)
            pub.publish(1)
            sub.update(1)
            ask, update = pub.ask, sub.update
            # Python allocations: none survive a step.
            for step in range(2, 102):
                ask("again", step)
                update(step)
            gc.collect()
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                for step in range(102, 1102):
                    ask("again", step)
                    update(step)
                gc.collect()
                growth = tracemalloc.get_traced_memory()[0] - before
            finally:
                tracemalloc.stop()
            assert growth < 512, f"Python allocations grew {growth} bytes over 1000 updates"
            # RSS over `steps` updates.
            first, xs, ys = 1102, [], []
            t0 = time.monotonic()
            for step in range(first, first + steps):
                ask("again", step)
                update(step)
                if step - first >= steps // 10 and step % 100 == 0:
                    xs.append(step)
                    ys.append(rss_bytes())
            seconds = time.monotonic() - t0
            per_update = slope(xs, ys)
            print(f"\n{steps} GPU publish+update round trips in {seconds:.1f} s; RSS "
                  f"{ys[0]} -> {ys[-1]} bytes, slope {per_update:.4f} bytes/update; tracemalloc "
                  f"{growth:+d} bytes over 1000 updates")
            assert per_update < 1.0, f"RSS grows {per_update:.3f} bytes per update"
            assert_same(dst.bytes(), pub.expected(1))
