"""Subscriber-owned tensors for engines with their own loader, as PyTorch tensors or as any
DLPack consumer's: allocate(..., framework=) and receive() (which also reports UpdateStats).
Zero-copy, bit-exact for bfloat16 and float8, the same objects every step."""

import numpy as np
import pytest

import weightsync

# weightsync dtype -> (torch attribute, raw-bits NumPy dtype)
LOW_PRECISION = {
    "bfloat16": ("bfloat16", np.uint16),
    "float8_e4m3fn": ("float8_e4m3fn", np.uint8),
    "float8_e5m2": ("float8_e5m2", np.uint8),
    "float8_e8m0fnu": ("float8_e8m0fnu", np.uint8),
}


def random_bits(dtype, shape, seed):
    raw = np.random.default_rng(seed).integers(0, 256, size=int(np.prod(shape)) *
                                                np.dtype(dtype).itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", sorted(LOW_PRECISION))
def test_torch_round_trip_bit_exact_same_objects(endpoint, dtype):
    torch = pytest.importorskip("torch")
    torch_name, raw = LOW_PRECISION[dtype]
    if not hasattr(torch, torch_name):
        pytest.skip(f"torch {torch.__version__} has no {torch_name}")
    shape = (6, 10)
    src = random_bits(raw, shape, seed=1)
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register({"w": src, "b": np.arange(10, dtype=np.float32)}, dtypes={"w": dtype})
        for name, dt, shp in pub.manifest:
            t = sub.allocate(name, dt, shp, framework="torch")
            assert isinstance(t, torch.Tensor) and tuple(t.shape) == tuple(shp)
        param = torch.nn.Parameter(torch.zeros(shape, dtype=getattr(torch, torch_name)),
                                   requires_grad=False)
        seen = None
        for step in (1, 2, 3):
            src[...] = random_bits(raw, shape, seed=step)
            pub.publish(step)
            received = sub.receive()
            assert received.stats.step == step and received.stats.tensors == 2
            assert not received.stats.up_to_date
            pairs = dict(received)
            w = pairs["w"]
            assert w.dtype == getattr(torch, torch_name)
            # Bit-exact: the tensor's bytes are the publisher's bytes.
            assert bytes(w.view(torch.uint8).numpy().tobytes()) == src.tobytes()
            param.data.copy_(w)  # what an engine's load_weights does
            assert param.data.view(torch.uint8).numpy().tobytes() == src.tobytes()
            ids = {n: id(t) for n, t in pairs.items()}
            assert seen is None or ids == seen  # the same objects every step
            seen = ids
        assert torch.equal(pairs["b"], torch.arange(10, dtype=torch.float32))


def test_torch_tensors_are_zero_copy_over_the_received_memory(endpoint):
    torch = pytest.importorskip("torch")
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        src = np.arange(12, dtype=np.float32)
        pub.register({"w": src})
        t = sub.allocate("w", "float32", 12, framework="torch")
        ptr = t.data_ptr()
        for step in (1, 2):
            src += 1
            pub.publish(step)
            (name, got), = sub.receive()
            assert got is t and got.data_ptr() == ptr
            assert torch.equal(t, torch.from_numpy(src))


def test_dlpack_framework_feeds_any_consumer(endpoint):
    """framework='dlpack': objects with __dlpack__ that torch, NumPy (and JAX) import."""
    torch = pytest.importorskip("torch")
    src = random_bits(np.uint16, (3, 8), seed=4)
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register({"w": src}, dtypes={"w": "bfloat16"})
        view = sub.allocate("w", "bfloat16", (3, 8), framework="dlpack")
        assert hasattr(view, "__dlpack__") and hasattr(view, "__dlpack_device__")
        t = torch.from_dlpack(view)
        assert t.dtype == torch.bfloat16
        pub.publish(1)
        stats = sub.receive().stats
        assert stats.step == 1
        assert t.view(torch.uint16).numpy().tobytes() == src.tobytes()  # zero-copy
        ptr = t.data_ptr()
        assert torch.from_dlpack(view).data_ptr() == ptr


@pytest.mark.parametrize("consumer", ["numpy", "jax", "paddle"])
def test_dlpack_views_for_other_consumers(endpoint, consumer):
    if consumer == "numpy":
        from_dlpack = np.from_dlpack
    elif consumer == "jax":
        from_dlpack = pytest.importorskip("jax.dlpack").from_dlpack
    else:
        from_dlpack = pytest.importorskip("paddle").from_dlpack
    src = np.arange(6, dtype=np.float32)
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register({"w": src})
        view = sub.allocate("w", "float32", 6, framework="dlpack")
        pub.publish(1)
        sub.receive()
        assert np.asarray(from_dlpack(view)).tolist() == src.tolist()


def test_publisher_allocate_torch_arena_tensor(endpoint):
    torch = pytest.importorskip("torch")
    with weightsync.Publisher(endpoint) as pub:
        w = pub.allocate("w", "bfloat16", (4, 4), framework="torch")
        assert w.dtype == torch.bfloat16 and not w.any()
        w.copy_(torch.eye(4, dtype=torch.bfloat16))
        pub.publish(1)
        with pytest.raises(weightsync.FailedPrecondition, match="still alive"):
            pub.close()
        with weightsync.Subscriber(endpoint) as sub:
            dst = torch.zeros(4, 4, dtype=torch.bfloat16)
            sub.register({"w": dst})
            sub.update()
            assert torch.equal(dst, w)
        del w  # the arena tensor keeps the publisher's arena mapped until it goes


def test_receive_reports_stats_and_still_iterates_pairs(endpoint):
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register({"a": np.arange(3.0), "b": np.ones(2, np.int32)})
        for name, dt, shp in pub.manifest:
            sub.allocate(name, dt, shp)
        pub.publish(5)
        received = sub.receive()
        assert isinstance(received.stats, weightsync.UpdateStats)
        assert received.stats.step == 5 and received.stats.bytes == 3 * 8 + 2 * 4
        assert iter(received) is received  # an iterator, as before
        assert [n for n, _ in received] == ["a", "b"]
        again = sub.receive()
        assert again.stats.up_to_date and again.stats.step == 5
        assert len(list(again)) == 2


def test_framework_argument_is_checked(endpoint):
    with weightsync.Subscriber(endpoint) as sub:
        with pytest.raises(ValueError, match="framework 'tensorflow'.*'numpy', 'torch'"):
            sub.allocate("x", "float32", 3, framework="tensorflow")
        # Nothing was registered: the same name allocates fine afterwards.
        assert sub.allocate("x", "float32", 3).shape == (3,)
