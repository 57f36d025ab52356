"""Delta updates from Python (docs/deltas.md): over tcp loopback, a step that changes a few
elements arrives as deltas, lands bit-exact, and both sides' stats say what moved."""

import numpy as np
import pytest

import weightsync
from conftest import assert_bit_exact, make_model, zeros_like_model


def change_some(model, rng, fraction):
    """Changes about `fraction` of every tensor's elements (one byte of each, never to itself)."""
    for v in model.values():
        flat = v.reshape(-1).view(np.uint8).reshape(v.size, v.itemsize)
        rows = np.flatnonzero(rng.random(v.size) < fraction)
        flat[rows, 0] ^= rng.integers(1, 256, size=rows.size, dtype=np.uint8)


@pytest.mark.parametrize("mode", ["staged", "in_place"])
def test_sparse_steps_arrive_as_deltas_and_land_bit_exact(mode):
    rng = np.random.default_rng(41)
    model = make_model(seed=4, elements=20000)
    with weightsync.Publisher("tcp://127.0.0.1:0", segment_bytes=16384) as pub:
        pub.register(model)
        first = pub.publish(1)
        assert first.delta_base_step == -1
        dst = zeros_like_model(model)
        with weightsync.Subscriber(pub.endpoint, mode=mode, timeout=30) as sub:
            sub.register(dst)
            stats = sub.update()
            assert (stats.delta_base_step, stats.received_bytes) == (-1, stats.bytes)
            for step in range(2, 6):
                change_some(model, rng, 0.01)
                # Every other publish returns before its deltas are encoded: deltas() waits.
                waited = step % 2 == 0
                published = pub.publish(step, wait_for_deltas=waited)
                assert published.delta_base_step == step - 1
                encoded = pub.deltas()
                assert (encoded.step, encoded.base_step) == (step, step - 1)
                assert encoded.delta_segments > 0
                assert 0 < encoded.changed_bytes < encoded.delta_bytes
                assert encoded.encode_seconds > 0
                if waited:
                    assert not published.delta_pending
                    assert (published.delta_segments, published.delta_bytes) == (
                        encoded.delta_segments, encoded.delta_bytes)
                assert "delta_base_step=" in repr(published)
                stats = sub.update()
                assert stats.delta_base_step == step - 1, stats
                assert stats.delta_segments == encoded.delta_segments
                assert stats.received_bytes < stats.bytes // 4, stats
                assert_bit_exact(dst, model)


def test_delta_off_on_either_side_moves_every_byte():
    model = make_model(seed=5, elements=20000)
    rng = np.random.default_rng(5)
    for pub_delta, sub_delta in (("off", True), ("auto", False)):
        with weightsync.Publisher("tcp://127.0.0.1:0", delta=pub_delta) as pub:
            pub.register(model)
            pub.publish(1)
            dst = zeros_like_model(model)
            with weightsync.Subscriber(pub.endpoint, delta=sub_delta, timeout=30) as sub:
                sub.register(dst)
                sub.update()
                change_some(model, rng, 0.01)
                published = pub.publish(2)
                assert published.delta_base_step == (-1 if pub_delta == "off" else 1)
                stats = sub.update()
                assert (stats.delta_base_step, stats.delta_segments) == (-1, 0)
                assert stats.received_bytes == stats.bytes
                assert_bit_exact(dst, model)


def test_an_unknown_delta_mode_is_refused_by_name():
    with pytest.raises(weightsync.InvalidArgument, match="delta 'sometimes'"):
        weightsync.Publisher("tcp://127.0.0.1:0", delta="sometimes")


def test_deltas_before_any_publish_is_refused_by_name():
    with weightsync.Publisher("tcp://127.0.0.1:0") as pub:
        with pytest.raises(weightsync.FailedPrecondition, match="nothing published yet"):
            pub.deltas()
