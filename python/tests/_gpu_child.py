"""A publisher in its own process for the GPU tests (test_gpu.py), driven over stdin/stdout:

    python -X faulthandler _gpu_child.py --endpoint local://x --device cuda:0 --framework torch \
        --spec '[["w", "bfloat16", [64, 32], "bits"]]' --seed 7

prints `ready ENDPOINT` once the tensors are registered, then answers one line per command:
    publish STEP      fill every tensor with _gpu_data.content(..., STEP) and publish  -> ok STEP
                      (--zero-copy: begin_write() first, as a zero-copy trainer must)
    again STEP        publish STEP without changing the tensors (soak loops)          -> ok STEP
    stream STEP       torch only: write STEP's contents on a side stream behind ~0.1 s of GPU
                      work and publish(STEP, stream=side) at once                      -> ok STEP
    current STEP      the same, but publish(STEP) inside `with torch.cuda.stream(side)`
                      (stream=None: torch's current stream)                           -> ok STEP
    exit              close and exit 0
Each command runs under a watchdog (faulthandler.dump_traceback_later, --timeout seconds) that
dumps every thread's stack and exits if it hangs; EOF on stdin (the test died) exits too.
Frameworks: torch (CPU or CUDA), cupy (CUDA), numpy (CPU), jax (CUDA; its arrays are copied into
publisher-owned buffers from Publisher.allocate(device=...), as docs/python.md says).
"""

import argparse
import faulthandler
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _gpu_data import UINT, WIDTH, content, nbytes  # noqa: E402

import weightsync  # noqa: E402


class TorchTensors:
    def __init__(self, spec, device):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.raw, self.tensors = {}, {}
        for name, dtype, shape, _ in spec:
            raw = torch.empty(nbytes(dtype, shape), dtype=torch.uint8, device=self.device)
            self.raw[name] = raw
            self.tensors[name] = raw.view(getattr(torch, dtype)).view(shape)

    def register(self, pub):
        pub.register(self.tensors)

    def fill(self, name, data):
        if data.size:
            self.raw[name].copy_(self.torch.from_numpy(data))

    def publish(self, pub, step):
        return pub.publish(step)  # stream=None: torch's current stream when torch uses CUDA

    def on_side_stream(self, pub, step, contents, explicit):
        torch = self.torch
        staged = {n: torch.from_numpy(c).to(self.device) for n, c in contents.items() if c.size}
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))  # `staged` is ready before
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the new bytes land
            for n, c in staged.items():
                self.raw[n].copy_(c)
            if not explicit:
                pub.publish(step)  # torch's current stream is `side` here
        if explicit:
            pub.publish(step, stream=side)
        # `staged` must outlive the side stream's copies (the caching allocator would reuse it).
        for c in staged.values():
            c.record_stream(side)


class NumpyTensors:
    def __init__(self, spec, device):
        assert device == "cpu", "numpy tensors live on the CPU"
        self.raw, self.tensors, self.dtypes = {}, {}, {}
        for name, dtype, shape, _ in spec:
            raw = np.empty(nbytes(dtype, shape), np.uint8)
            self.raw[name] = raw
            self.tensors[name] = raw.view(UINT[WIDTH[dtype]]).reshape(shape)
            self.dtypes[name] = dtype

    def register(self, pub):
        pub.register(self.tensors, dtypes=self.dtypes)

    def fill(self, name, data):
        self.raw[name][...] = data

    def publish(self, pub, step):
        return pub.publish(step)


class CupyTensors:
    def __init__(self, spec, device):
        import cupy

        self.cupy = cupy
        index = int(device.split(":")[1])
        self.raw, self.tensors, self.dtypes = {}, {}, {}
        with cupy.cuda.Device(index):
            for name, dtype, shape, _ in spec:
                raw = cupy.empty(nbytes(dtype, shape), cupy.uint8)
                self.raw[name] = raw
                if dtype in ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
                             "uint8", "uint16", "uint32", "uint64"):
                    self.tensors[name] = raw.view(dtype).reshape(shape)
                else:  # bfloat16, float8: CuPy has no such dtype; raw bits + dtypes=
                    self.tensors[name] = raw.view(UINT[WIDTH[dtype]]).reshape(shape)
                    self.dtypes[name] = dtype
        self.index = index

    def register(self, pub):
        pub.register(self.tensors, dtypes=self.dtypes or None)

    def fill(self, name, data):
        if data.size:
            with self.cupy.cuda.Device(self.index):
                self.raw[name].set(data)  # on CuPy's current stream

    def publish(self, pub, step):
        with self.cupy.cuda.Device(self.index):
            return pub.publish(step, stream=self.cupy.cuda.get_current_stream())  # its .ptr


class JaxTensors:
    """JAX arrays are immutable, so the publisher owns the buffers (Publisher.allocate on the
    device) and each step's new arrays are copied in on the GPU (through torch, zero-copy
    DLPack on both sides)."""

    def __init__(self, spec, device):
        import jax
        import torch

        self.jax, self.torch = jax, torch
        self.spec = {name: (dtype, shape) for name, dtype, shape, _ in spec}
        index = int(device.split(":")[1])
        self.jax_device = [d for d in jax.devices() if d.platform == "gpu"][index]
        self.device = device
        self.buffers = {}

    def register(self, pub):
        for name, (dtype, shape) in self.spec.items():
            self.buffers[name] = pub.allocate(name, dtype, shape, framework="torch",
                                              device=self.device)

    def fill(self, name, data):
        import ml_dtypes

        dtype, shape = self.spec[name]
        npdt = getattr(ml_dtypes, dtype) if dtype == "bfloat16" else np.dtype(dtype)
        x = self.jax.device_put(data.view(npdt).reshape(shape), self.jax_device)  # a JAX array
        self.buffers[name].copy_(self.torch.from_dlpack(x))

    def publish(self, pub, step):
        return pub.publish(step)


FRAMEWORKS = {"torch": TorchTensors, "numpy": NumpyTensors, "cupy": CupyTensors,
              "jax": JaxTensors}


def expandable_segments(framework):
    """'expandable=1' when torch's caching allocator holds its memory in expandable segments (cuMem
    chunks: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), so a test can tell it got them."""
    if framework != "torch":
        return "expandable=0"
    import torch
    if not torch.cuda.is_initialized():
        return "expandable=0"
    segments = torch.cuda.memory_snapshot()
    return "expandable=" + ("1" if segments and all(s.get("is_expandable") for s in segments)
                            else "0")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--framework", default="torch", choices=sorted(FRAMEWORKS))
    ap.add_argument("--spec", required=True, help="JSON [[name, dtype, shape, kind], ...]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=120.0, help="watchdog per command, seconds")
    ap.add_argument("--publisher-timeout", type=float, default=30.0)
    ap.add_argument("--zero-copy", action="store_true",
                    help="Publisher(zero_copy=True); each publish begins with begin_write()")
    ap.add_argument("--ring", default="", metavar="BUCKETS:BYTES",
                    help="Publisher(ring_buckets=, ring_bucket_bytes=); each publish begins with "
                         "begin_write()")
    args = ap.parse_args()
    faulthandler.enable()
    faulthandler.dump_traceback_later(args.timeout, exit=True)  # start-up
    spec = [(n, d, tuple(s), k) for n, d, s, k in json.loads(args.spec)]
    tensors = FRAMEWORKS[args.framework](spec, args.device)
    ring = [int(x) for x in args.ring.split(":")] if args.ring else [0, 0]
    fenced = args.zero_copy or bool(args.ring)
    with weightsync.Publisher(args.endpoint, timeout=args.publisher_timeout,
                              zero_copy=args.zero_copy, ring_buckets=ring[0],
                              ring_bucket_bytes=ring[1]) as pub:
        tensors.register(pub)
        print("ready", pub.endpoint, expandable_segments(args.framework), flush=True)
        faulthandler.cancel_dump_traceback_later()
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            faulthandler.dump_traceback_later(args.timeout, exit=True)
            cmd, arg = words[0], words[1:]
            if cmd == "exit":
                break
            step = int(arg[0])
            if cmd == "again":
                tensors.publish(pub, step)
                print("ok", step, flush=True)
                faulthandler.cancel_dump_traceback_later()
                continue
            contents = {name: content(i, dtype, shape, kind, args.seed, step)
                        for i, (name, dtype, shape, kind) in enumerate(spec)}
            if cmd == "publish":
                if fenced:
                    pub.begin_write()  # subscribers read these very tensors
                for name, c in contents.items():
                    tensors.fill(name, c)
                tensors.publish(pub, step)
            elif cmd in ("stream", "current"):
                tensors.on_side_stream(pub, step, contents, explicit=cmd == "stream")
            else:
                raise SystemExit(f"_gpu_child: unknown command {line!r}")
            print("ok", step, flush=True)
            faulthandler.cancel_dump_traceback_later()
        del tensors
    print("bye", flush=True)


if __name__ == "__main__":
    main()
