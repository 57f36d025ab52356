"""DLPack producers other than NumPy: PyTorch and Paddle CPU tensors, updated in place (addresses
unchanged). Each test skips cleanly where its framework is not installed."""

import numpy as np
import pytest

import weightsync


def test_torch_parameters_update_in_place(endpoint):
    torch = pytest.importorskip("torch")
    src = torch.nn.Linear(8, 4)
    dst = torch.nn.Linear(8, 4)
    with torch.no_grad():
        for p in dst.parameters():
            p.zero_()
    before = {n: p.data_ptr() for n, p in dst.named_parameters()}
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register({n: p.detach() for n, p in src.named_parameters()})
        sub.register({n: p.detach() for n, p in dst.named_parameters()})
        pub.publish(1)
        sub.update()
    for (n, a), (_, b) in zip(src.named_parameters(), dst.named_parameters()):
        assert torch.equal(a, b), n
        assert b.data_ptr() == before[n]


def test_torch_bfloat16(endpoint):
    torch = pytest.importorskip("torch")
    a = torch.randn(5, 3).to(torch.bfloat16)
    b = torch.zeros(5, 3, dtype=torch.bfloat16)
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register({"w": a})
        sub.register({"w": b})
        pub.publish(1)
        sub.update()
    assert torch.equal(a, b)


def test_paddle_tensor(endpoint):
    paddle = pytest.importorskip("paddle")
    a = paddle.to_tensor(np.arange(6, dtype=np.float32))
    b = paddle.zeros([6], dtype="float32")
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register({"w": a})
        sub.register({"w": b})
        pub.publish(1)
        sub.update()
    assert (b.numpy() == a.numpy()).all()


def test_torch_tensors_that_require_grad_are_accepted(endpoint):
    """nanobind imports them through torch.utils.dlpack.to_dlpack (torch's __dlpack__ refuses
    them): both sides share the parameters' storage, no detach() needed."""
    torch = pytest.importorskip("torch")
    src = torch.nn.Linear(8, 4)
    dst = torch.nn.Linear(8, 4)
    assert all(p.requires_grad for p in dst.parameters())
    before = {n: p.data_ptr() for n, p in dst.named_parameters()}
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register(dict(src.named_parameters()))
        sub.register(dict(dst.named_parameters()))
        pub.publish(1)
        sub.update()
        with torch.no_grad():
            for p in src.parameters():
                p.add_(1)  # in place: the registered memory
        pub.publish(2)
        sub.update()
    for (n, a), (_, b) in zip(src.named_parameters(), dst.named_parameters()):
        assert torch.equal(a, b), n
        assert b.data_ptr() == before[n] and b.requires_grad


def test_jax_publishing_pattern_allocate_and_copy(endpoint):
    """JAX arrays are immutable, so a JAX trainer publishes through arena tensors: allocate()
    once, then before each publish() begin_write() and copy the new arrays in."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    params = {"w": jnp.arange(12, dtype=jnp.float32).reshape(3, 4),
              "h": jnp.linspace(-1, 1, 8, dtype=jnp.bfloat16)}
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        views = {n: pub.allocate(n, a.dtype, a.shape) for n, a in params.items()}
        dst = {n: np.zeros(a.shape, a.dtype) for n, a in params.items()}
        sub.register(dst)
        for step in (1, 2, 3):
            params = jax.tree_util.tree_map(lambda a: a * 2 + 1, params)  # new arrays
            pub.begin_write()
            for n, a in params.items():
                np.copyto(views[n], np.asarray(a))
            pub.publish(step)
            assert sub.update().step == step
            for n, a in params.items():
                assert dst[n].tobytes() == np.asarray(a).tobytes(), (n, step)
        del views
