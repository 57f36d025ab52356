"""Transfer-handle lifecycle from Python: sleep/update cycles, close, context managers, arena
views that keep their owner alive, and the resource ledger back at its baseline."""

import gc

import numpy as np
import pytest

import weightsync
from conftest import assert_bit_exact, bump, make_model, zeros_like_model


def live(ledger):
    return {k: v for k, v in ledger.items() if k != "release_failures"}


def test_sleep_update_cycles(endpoint):
    model = make_model(seed=2, count=3)
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register(model)
        dst = zeros_like_model(model)
        sub.register(dst)
        for step in range(1, 11):
            bump(model)
            pub.publish(step)
            stats = sub.update()
            assert stats.step == step
            assert stats.handle_created == (step % 2 == 1)
            assert stats.prepare_count == (step + 1) // 2
            assert_bit_exact(dst, model)
            if step % 2 == 0:
                sub.sleep()
                assert weightsync.ledger()["handles"] >= 0


def test_register_more_after_sleep(endpoint):
    with weightsync.Publisher(endpoint) as pub, \
            weightsync.Subscriber(endpoint, policy="subset") as sub:
        pub.register({"a": np.arange(3.0), "b": np.arange(4.0)})
        pub.publish(1)
        a, b = np.zeros(3), np.zeros(4)
        sub.register({"a": a})
        sub.update()
        with pytest.raises(weightsync.FailedPrecondition, match="Sleep"):
            sub.register({"b": b})
        sub.sleep()
        sub.register({"b": b})
        pub.publish(2)
        sub.update()
        assert (b == np.arange(4.0)).all()


def test_ledger_returns_to_baseline(endpoint):
    gc.collect()
    before = live(weightsync.ledger())
    pub = weightsync.Publisher(endpoint)
    pub.register({"x": np.ones(1000)})
    pub.publish(1)
    sub = weightsync.Subscriber(endpoint)
    sub.register({"x": np.zeros(1000)})
    sub.update()
    during = live(weightsync.ledger())
    assert during["handles"] == before["handles"] + 1
    assert during["connections"] > before["connections"]
    sub.close()
    pub.close()
    del sub, pub
    gc.collect()
    assert live(weightsync.ledger()) == before


def test_dropping_objects_releases_everything(endpoint):
    gc.collect()
    before = live(weightsync.ledger())

    def scope():
        pub = weightsync.Publisher(endpoint)
        pub.register({"x": np.ones(10)})
        pub.publish(1)
        sub = weightsync.Subscriber(endpoint)
        sub.register({"x": np.zeros(10)})
        sub.update()
        # no close(): the destructors release, subscriber first (reverse order of creation)

    scope()
    gc.collect()
    assert live(weightsync.ledger()) == before


def test_arena_view_keeps_publisher_alive(endpoint):
    pub = weightsync.Publisher(endpoint)
    view = pub.allocate("w", "float64", 16)
    del pub
    gc.collect()
    view[...] = 7.0  # still mapped: the view owns a reference to its publisher
    assert view.sum() == 112.0
    del view
    gc.collect()
    # The publisher is gone with its last view: the endpoint is free again.
    with weightsync.Publisher(endpoint):
        pass


def test_close_refuses_while_views_are_alive(endpoint):
    pub = weightsync.Publisher(endpoint)
    view = pub.allocate("w", "float32", 4)
    with pytest.raises(weightsync.FailedPrecondition, match="still alive"):
        pub.close()
    del view
    gc.collect()
    pub.close()


def test_exit_with_live_views_closes_after_the_last_one(endpoint):
    with weightsync.Publisher(endpoint) as pub:
        view = pub.allocate("w", "float32", 4)
        pub.publish(1)
    # Still serving: the view points into the arena.
    with pytest.raises(weightsync.AlreadyExists):
        weightsync.Publisher(endpoint)
    view += 1
    del view
    gc.collect()
    with weightsync.Publisher(endpoint):
        pass


def test_in_place_mode_round_trip(endpoint):
    model = make_model(seed=4, count=2)
    with weightsync.Publisher(endpoint) as pub, \
            weightsync.Subscriber(endpoint, mode="in_place") as sub:
        pub.register(model)
        dst = zeros_like_model(model)
        sub.register(dst)
        pub.publish(1)
        sub.update()
        assert sub.weights_valid and sub.committed_step == 1
        assert_bit_exact(dst, model)


def test_close_from_another_thread_while_update_blocks(endpoint):
    import threading

    with weightsync.Publisher(endpoint) as pub:
        pub.register({"x": np.ones(4)})
        pub.publish(1)
        sub = weightsync.Subscriber(endpoint, timeout=30.0)
        sub.register({"x": np.zeros(4)})
        sub.update(1)
        errors = []

        def blocked():
            try:
                sub.update(2)  # never published: would wait its whole 30 s timeout
            except weightsync.Error as e:
                errors.append(e)

        t = threading.Thread(target=blocked)
        t.start()
        import time

        time.sleep(0.2)
        t0 = time.monotonic()
        sub.close()  # cancels the update in flight, waits for it, then releases
        assert time.monotonic() - t0 < 5, "close() waited for the update's timeout"
        t.join(timeout=5)
        assert not t.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], weightsync.Cancelled), errors
        assert sub.committed_step == 1
        with pytest.raises(weightsync.FailedPrecondition, match="closed"):
            sub.update()
        with pytest.raises(weightsync.FailedPrecondition, match="closed"):
            sub.sleep()
        del sub
        gc.collect()
