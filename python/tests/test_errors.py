"""Typed exceptions: one mapping from StatusCode, built-in bases, messages that name things."""

import threading
import time

import numpy as np
import pytest

import weightsync
from weightsync import _errors

BUILTIN = {
    "InvalidArgument": ValueError,
    "NotFound": LookupError,
    "AlreadyExists": FileExistsError,
    "FailedPrecondition": RuntimeError,
    "Busy": RuntimeError,
    "Timeout": TimeoutError,
    "PeerLost": ConnectionError,
    "Unauthenticated": PermissionError,
    "ResourceExhausted": MemoryError,
    "IoError": OSError,
    "NotSupported": NotImplementedError,
    "Internal": RuntimeError,
}


def test_every_status_code_has_a_class():
    codes = {"invalid_argument", "not_found", "already_exists", "failed_precondition", "busy",
             "timeout", "peer_lost", "corruption", "protocol_error", "unauthenticated",
             "resource_exhausted", "io_error", "unavailable", "not_supported", "cancelled",
             "internal"}
    assert set(_errors.BY_CODE) == codes
    for cls in _errors.BY_CODE.values():
        assert issubclass(cls, weightsync.Error)
        assert getattr(weightsync, cls.__name__) is cls
        assert cls.__module__ == "weightsync"


@pytest.mark.parametrize("name,builtin", sorted(BUILTIN.items()))
def test_builtin_bases(name, builtin):
    cls = getattr(weightsync, name)
    assert issubclass(cls, builtin) and issubclass(cls, weightsync.Error)
    assert str(cls("the message")) == "the message"


def test_cancelled_is_not_a_keyboard_interrupt():
    assert not issubclass(weightsync.Cancelled, KeyboardInterrupt)
    assert issubclass(weightsync.Cancelled, Exception)


def test_invalid_endpoint_is_value_error():
    with pytest.raises(ValueError, match="unsupported scheme"):
        weightsync.Subscriber("http://nope")
    with pytest.raises(weightsync.InvalidArgument):
        weightsync.Publisher("local://has space")


def test_bad_mode_policy_timeout(endpoint):
    with pytest.raises(ValueError, match="'staged' or 'in_place'"):
        weightsync.Subscriber(endpoint, mode="sometimes")
    with pytest.raises(ValueError, match="'strict' or 'subset'"):
        weightsync.Subscriber(endpoint, policy="lenient")
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="timeout"):
            weightsync.Subscriber(endpoint, timeout=bad)


def test_second_publisher_on_endpoint(endpoint):
    with weightsync.Publisher(endpoint):
        with pytest.raises(weightsync.AlreadyExists):
            weightsync.Publisher(endpoint)


def test_no_publisher_is_not_found(endpoint):
    with weightsync.Subscriber(endpoint, timeout=0.2) as sub:
        sub.register({"x": np.zeros(4)})
        with pytest.raises(weightsync.NotFound, match="no publisher"):
            sub.update()


def test_step_never_published_is_timeout(endpoint):
    with weightsync.Publisher(endpoint) as pub, \
            weightsync.Subscriber(endpoint, timeout=0.3) as sub:
        pub.register({"x": np.ones(4)})
        sub.register({"x": np.zeros(4)})
        pub.publish(1)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="step 2"):
            sub.update(2)
        assert time.monotonic() - t0 < 2
        assert sub.update(1).step == 1  # the next update re-prepares and works


def test_stale_step_is_failed_precondition(endpoint):
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register({"x": np.ones(4)})
        sub.register({"x": np.zeros(4)})
        pub.publish(3)
        sub.update(3)
        with pytest.raises(weightsync.FailedPrecondition, match="not newer"):
            sub.update(2)
        # The same class on both sides: a stale step is a state, not a bad argument.
        with pytest.raises(weightsync.FailedPrecondition, match="steps must increase"):
            pub.publish(3)


def test_mismatch_lists_every_name(endpoint):
    with weightsync.Publisher(endpoint) as pub:
        pub.register({"a": np.ones(4, np.float32), "b": np.ones(4, np.float32),
                      "only_pub": np.ones(2), "c": np.ones((2, 3))})
        pub.publish(1)
        with weightsync.Subscriber(endpoint) as sub:
            sub.register({"a": np.zeros(5, np.float32),       # shape
                          "b": np.zeros(4, np.float64),       # dtype
                          "c": np.zeros((2, 3)),
                          "only_sub": np.zeros(1)})
            with pytest.raises(ValueError) as info:
                sub.update()
            msg = str(info.value)
            for name in ("'a'", "'b'", "only_pub", "only_sub"):
                assert name in msg, (name, msg)
            assert "'c'" not in msg


def test_subset_policy(endpoint):
    with weightsync.Publisher(endpoint) as pub:
        model = {"a": np.arange(4.0), "b": np.arange(3.0)}
        pub.register(model)
        pub.publish(1)
        with weightsync.Subscriber(endpoint, policy="subset") as sub:
            dst = {"b": np.zeros(3)}
            sub.register(dst)
            sub.update()
            assert (dst["b"] == model["b"]).all()


def test_tensor_argument_errors(endpoint):
    with weightsync.Subscriber(endpoint) as sub:
        with pytest.raises(ValueError, match="'t': not C-contiguous"):
            sub.register({"t": np.zeros((4, 4))[:, 1]})
        ro = np.zeros(4)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="'r': read-only"):
            sub.register({"r": ro})
        with pytest.raises(TypeError,
                           match=r"'l': expected a tensor with __dlpack__ \(CPU or CUDA\)"):
            sub.register({"l": [1.0, 2.0]})
        with pytest.raises(ValueError, match="'z': .*complex|'z': unsupported"):
            sub.register({"z": np.zeros(2, np.complex64)})
        with pytest.raises(TypeError, match="names must be str"):
            sub.register({1: np.zeros(2)})
        with pytest.raises(ValueError, match="'nope'"):
            sub.register({"x": np.zeros(2, np.uint16)}, dtypes={"nope": "bfloat16"})
        with pytest.raises(ValueError, match="cannot be read as bfloat16"):
            sub.register({"x": np.zeros((2, 3), np.uint8)}, dtypes={"x": "bfloat16"})
        with pytest.raises(ValueError, match="not one weightsync moves"):
            sub.allocate("x", "complex64", 4)
        with pytest.raises(ValueError, match="duplicate|twice|unique"):
            sub.register([("d", np.zeros(2)), ("d", np.zeros(2))])


def test_publisher_read_only_source_is_fine(endpoint):
    src = np.arange(4.0)
    src.flags.writeable = False
    with weightsync.Publisher(endpoint) as pub:
        pub.register({"x": src})


def test_register_after_publish(endpoint):
    with weightsync.Publisher(endpoint) as pub:
        pub.register({"x": np.ones(2)})
        pub.publish(1)
        with pytest.raises(weightsync.FailedPrecondition, match="after the first Publish"):
            pub.register({"y": np.ones(2)})


def test_concurrent_update_is_busy(endpoint):
    with weightsync.Publisher(endpoint) as pub, \
            weightsync.Subscriber(endpoint, timeout=5) as sub:
        pub.register({"x": np.ones(2)})
        sub.register({"x": np.zeros(2)})
        pub.publish(1)
        sub.update(1)
        result = {}

        def blocked():
            result["stats"] = sub.update(2)  # waits for step 2

        t = threading.Thread(target=blocked)
        t.start()
        time.sleep(0.2)
        with pytest.raises(weightsync.Busy):
            sub.update(2)
        pub.publish(2)
        t.join(timeout=10)
        assert result["stats"].step == 2


def test_closed_objects(endpoint):
    pub = weightsync.Publisher(endpoint)
    pub.register({"x": np.ones(2)})
    pub.close()
    pub.close()  # idempotent
    with pytest.raises(weightsync.FailedPrecondition, match="closed"):
        pub.publish(1)
    sub = weightsync.Subscriber(endpoint)
    sub.register({"x": np.zeros(2)})
    sub.close()
    sub.close()
    with pytest.raises(weightsync.FailedPrecondition, match="closed"):
        sub.update()
    with pytest.raises(weightsync.FailedPrecondition, match="closed"):
        sub.sleep()  # like every other call, not a silent no-op
