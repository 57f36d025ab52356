"""The GPU side of the Python API, checked on any machine: weightsync.cuda_status(), how CUDA
tensors (and tensors of devices weightsync does not move) are refused where CUDA cannot be used,
the device= and stream= arguments. The GPU round trips themselves are in test_gpu.py (marker
`gpu`, run by scripts/python_gpu_test.sh)."""

import subprocess
import sys

import numpy as np
import pytest

import weightsync
from _dlpack import CPU, CUDA, CUDA_HOST, CUDA_MANAGED, ROCM, FakeTensor

STATUS = weightsync.cuda_status()
needs_no_cuda = pytest.mark.skipif(STATUS.available, reason="checks refusals without CUDA")


def test_cuda_status_shape():
    s = weightsync.cuda_status()
    assert isinstance(s, weightsync.CudaStatus)
    assert isinstance(s.available, bool) and isinstance(s.built_with_cuda, bool)
    assert bool(s) == s.available
    assert repr(s).startswith("CudaStatus(available=")
    if s.available:
        assert s.built_with_cuda and s.device_count >= 1 and s.reason == ""
    else:
        assert s.device_count == 0 and s.reason
    assert weightsync.cuda_status().reason == s.reason  # probed once, cached


@needs_no_cuda
def test_cuda_status_says_why_not():
    s = weightsync.cuda_status()
    if s.built_with_cuda:
        # Built with the toolkit on a machine without a GPU or driver (this development VM):
        # the runtime's own error names what is missing.
        assert s.reason.startswith("no CUDA device: cuda"), s.reason
        assert "driver" in s.reason.lower() or "device" in s.reason.lower(), s.reason
    else:
        assert s.reason == "built without CUDA"


def test_pyproject_builds_the_gpu_data_plane_where_it_can():
    import pathlib
    text = (pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert 'WS_CUDA = "AUTO"' in text


# ---- CUDA tensors where CUDA cannot be used ----------------------------------------------------

@needs_no_cuda
@pytest.mark.parametrize("side", ["publisher", "subscriber"])
def test_cuda_tensor_refused_with_the_reason(endpoint, side):
    cls = weightsync.Publisher if side == "publisher" else weightsync.Subscriber
    with cls(endpoint) as obj:
        fake = FakeTensor((4, 8), CUDA, 0)
        with pytest.raises(weightsync.Unavailable) as info:
            obj.register({"layers.0.w": fake})
    msg = str(info.value)
    assert msg.startswith("tensor 'layers.0.w' is on cuda:0, but this weightsync module cannot "
                          "use CUDA: "), msg
    assert STATUS.reason in msg, msg


@needs_no_cuda
def test_refused_cuda_tensor_registers_nothing(endpoint):
    with weightsync.Publisher(endpoint) as pub:
        with pytest.raises(weightsync.Unavailable):
            pub.register({"a": np.zeros(3, np.float32), "b": FakeTensor((3,), CUDA, 0)})
        assert pub.manifest == []
        pub.register({"a": np.zeros(3, np.float32)})
        pub.publish(1)


@pytest.mark.parametrize("device_type,what", [
    (ROCM, r"on DLPack device type 10 \(ROCm\); weightsync moves CPU and CUDA tensors"),
    (CUDA_MANAGED, r"in CUDA managed memory \(DLPack device type 13\)"),
    (99, r"on DLPack device type 99 \(unknown\)"),
])
def test_devices_weightsync_does_not_move(endpoint, device_type, what):
    with weightsync.Subscriber(endpoint) as sub:
        with pytest.raises(weightsync.InvalidArgument, match=r"^tensor 'w': " + what):
            sub.register({"w": FakeTensor((2, 2), device_type, 0)})


def test_pinned_host_memory_is_host_memory(endpoint):
    """DLPack's CUDA host device (pinned memory) is ordinary host memory to weightsync."""
    src = np.arange(12, dtype=np.float32)
    dst = np.zeros_like(src)
    a = FakeTensor((12,), CUDA_HOST, 0, data=src.ctypes.data)
    b = FakeTensor((12,), CUDA_HOST, 0, data=dst.ctypes.data)
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register({"w": a})
        sub.register({"w": b})
        pub.publish(1)
        sub.update()
    assert (dst == src).all()


def test_fake_cpu_tensor_round_trips(endpoint):
    """The ctypes producer itself works (a CPU one is imported and moved like any tensor)."""
    src = np.arange(6, dtype=np.float32) + 0.5
    dst = np.zeros_like(src)
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register({"w": FakeTensor((2, 3), CPU, 0, data=src.ctypes.data)})
        sub.register({"w": FakeTensor((2, 3), CPU, 0, data=dst.ctypes.data)})
        pub.publish(1)
        sub.update()
    assert (dst == src).all()


def test_jax_array_on_a_gpu_gets_gpu_advice(endpoint):
    """Recognised as JAX by its type's module; a CUDA one is told about device= buffers."""
    class ArrayImpl:
        __module__ = "jaxlib.xla_extension"

        def __dlpack_device__(self):
            return (CUDA, 0)

    with weightsync.Subscriber(endpoint) as sub:
        with pytest.raises(weightsync.InvalidArgument) as info:
            sub.register({"w": ArrayImpl()})
    assert "device='cuda:N'" in str(info.value) and "jax.dlpack.from_dlpack" in str(info.value)
    with weightsync.Publisher(endpoint + "-p") as pub:
        with pytest.raises(weightsync.InvalidArgument) as info:
            pub.register({"w": ArrayImpl()})
    assert "device='cuda:N'" in str(info.value) and "torch.from_dlpack" in str(info.value)


# ---- allocate(device=...) ------------------------------------------------------------------------

@pytest.mark.parametrize("device", [None, "cpu"])
def test_allocate_on_the_cpu(endpoint, device):
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register({"w": np.arange(6, dtype=np.float32)})
        pub.publish(1)
        w = sub.allocate("w", "float32", 6, device=device)
        sub.update()
        assert w.tolist() == list(range(6))


def test_allocate_device_torch_cpu(endpoint):
    torch = pytest.importorskip("torch")
    with weightsync.Subscriber(endpoint) as sub:
        w = sub.allocate("w", "bfloat16", (2, 3), framework="torch", device=torch.device("cpu"))
    assert w.dtype == torch.bfloat16 and w.device.type == "cpu"


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "cuda:-1", -1, "cuda:99999999999",
                                    True, 1.5])
def test_allocate_bad_device(endpoint, device):
    with weightsync.Subscriber(endpoint) as sub:
        with pytest.raises(weightsync.InvalidArgument, match=r"^device .*: expected None, 'cpu'"):
            sub.allocate("w", "float32", 3, framework="torch", device=device)
        assert sub.allocate("w", "float32", 3).shape == (3,)  # nothing was registered


@pytest.mark.parametrize("cls", [weightsync.Publisher, weightsync.Subscriber])
def test_allocate_cuda_in_numpy_is_refused(endpoint, cls):
    with cls(endpoint) as obj:
        with pytest.raises(weightsync.InvalidArgument,
                           match=r"framework='numpy' cannot hold CUDA memory; use "
                                 r"framework='torch', 'cupy' or 'dlpack'"):
            obj.allocate("w", "float32", 3, device="cuda:0")


@pytest.mark.parametrize("cls", [weightsync.Publisher, weightsync.Subscriber])
def test_cupy_views_cuda_memory_only(endpoint, cls):
    with cls(endpoint) as obj:
        with pytest.raises(weightsync.InvalidArgument, match=r"framework='cupy' holds CUDA memory"):
            obj.allocate("w", "float32", 3, framework="cupy")


@needs_no_cuda
@pytest.mark.parametrize("cls", [weightsync.Publisher, weightsync.Subscriber])
@pytest.mark.parametrize("device", ["cuda", "cuda:0", 0])
def test_allocate_on_cuda_without_cuda(endpoint, cls, device):
    with cls(endpoint) as obj:
        with pytest.raises(weightsync.Unavailable) as info:
            obj.allocate("w", "bfloat16", (4, 4), framework="dlpack", device=device)
        assert str(info.value).startswith("allocate('w') is on cuda:0, but this weightsync "
                                          "module cannot use CUDA: " + STATUS.reason)
        if cls is weightsync.Publisher:
            assert obj.manifest == []


# ---- publish(stream=...) -------------------------------------------------------------------------

class TorchLikeStream:
    cuda_stream = 0x1234

    class device:  # noqa: N801  (torch.device-like: .index)
        index = 0


class CupyLikeStream:
    ptr = 0x5678
    device_id = 0


@pytest.mark.parametrize("stream", [None, 0, 1, 2, 0xDEADBEEF, TorchLikeStream(),
                                    CupyLikeStream()])
def test_publish_takes_any_stream_form(endpoint, stream):
    """Host tensors do not use the stream; every accepted form is accepted all the same."""
    with weightsync.Publisher(endpoint) as pub:
        pub.register({"w": np.zeros(3, np.float32)})
        assert pub.publish(1, stream=stream).step == 1
        assert pub.publish(2, stream).step == 2


@pytest.mark.parametrize("stream,error,match", [
    ("0", TypeError, r"stream: expected None, an int \(a cudaStream_t\) or a stream object with "
                     r"\.cuda_stream \(torch\.cuda\.Stream\) or \.ptr \(cupy\.cuda\.Stream\), "
                     r"got str"),
    (1.5, TypeError, r"got float"),
    (True, TypeError, r"got bool"),
    (-1, weightsync.InvalidArgument, r"stream: -1 is not a cudaStream_t"),
    (2**64, weightsync.InvalidArgument, r"is not a cudaStream_t"),
])
def test_publish_refuses_what_is_not_a_stream(endpoint, stream, error, match):
    with weightsync.Publisher(endpoint) as pub:
        pub.register({"w": np.zeros(3, np.float32)})
        with pytest.raises(error, match=match):
            pub.publish(1, stream=stream)
        assert pub.latest_step == -1
        pub.publish(1)


def test_publish_never_imports_torch(endpoint):
    code = (
        "import sys, numpy as np, weightsync\n"
        "with weightsync.Publisher(sys.argv[1]) as pub:\n"
        "    pub.register({'x': np.zeros(3)})\n"
        "    pub.publish(1)\n"
        "    pub.publish(2, stream=None)\n"
        "weightsync.cuda_status()\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n")
    out = subprocess.run([sys.executable, "-c", code, endpoint], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
