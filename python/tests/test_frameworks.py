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
