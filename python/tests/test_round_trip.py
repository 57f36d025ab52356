"""Round trips between processes and within one: every dtype bit-exact, both update modes,
registered and arena-allocated tensors, receive() for engines with their own loader."""

import multiprocessing as mp

import numpy as np
import pytest

import weightsync
from _procs import dtype_tensors, serve_dtype_model, subscribe_and_report
from conftest import assert_bit_exact, bump, make_model, zeros_like_model

SPAWN = mp.get_context("spawn")


@pytest.mark.parametrize("mode", ["staged", "in_place"])
def test_two_processes_every_dtype_bit_exact(endpoint, mode):
    seed, steps = 11, [1, 2, 3]
    ready, done = SPAWN.Queue(), SPAWN.Queue()
    child = SPAWN.Process(target=serve_dtype_model, args=(endpoint, seed, steps, ready, done))
    child.start()
    try:
        like, dtypes = dtype_tensors(seed)
        dst = {k: np.full_like(v, 0x5A) if v.dtype.kind != "b" else np.zeros_like(v)
               for k, v in like.items()}
        with weightsync.Subscriber(endpoint, mode=mode, verify=True, timeout=30) as sub:
            sub.register(dst, dtypes=dtypes)
            for step in steps:
                assert ready.get(timeout=60) == step
                stats = sub.update(step)
                assert (stats.step, stats.verified, stats.up_to_date) == (step, True, False)
                assert stats.handle_created == (step == 1)
                assert stats.tensors == len(like)
                assert stats.path == "shm", stats  # host to host on one machine
                want, _ = dtype_tensors(seed + step)
                assert_bit_exact(dst, want)
                done.put(step)
    finally:
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0


def test_subscriber_in_child_process(endpoint):
    model = make_model(seed=3)
    with weightsync.Publisher(endpoint) as pub:
        pub.register(model)
        pub.publish(7)
        out = SPAWN.Queue()
        spec = {k: (v.dtype, v.shape) for k, v in model.items()}
        child = SPAWN.Process(target=subscribe_and_report, args=(endpoint, spec, 7, out))
        child.start()
        step, blobs = out.get(timeout=60)
        child.join(timeout=60)
    assert child.exitcode == 0 and step == 7
    for k, v in model.items():
        assert blobs[k] == v.tobytes(), k


def test_publisher_allocate_arena_views(endpoint):
    with weightsync.Publisher(endpoint) as pub:
        w = pub.allocate("w", "float32", (4, 8))
        b = pub.allocate("b", np.int16, 8)
        assert w.dtype == np.float32 and w.shape == (4, 8) and not w.any()
        w[...] = np.arange(32, dtype=np.float32).reshape(4, 8)
        b[...] = -np.arange(8, dtype=np.int16)
        assert pub.publish(1).bytes_copied == 0
        with weightsync.Subscriber(endpoint) as sub:
            dst = {"w": np.zeros((4, 8), np.float32), "b": np.zeros(8, np.int16)}
            sub.register(dst)
            sub.update(1)
            assert_bit_exact(dst, {"w": w, "b": b})
            pub.begin_write()
            w += 1
            pub.publish(2)
            sub.update(2)
            assert_bit_exact(dst, {"w": w, "b": b})
        del w, b  # the arena views must go before the publisher closes


def test_allocate_bfloat16_view(endpoint):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    with weightsync.Publisher(endpoint) as pub:
        w = pub.allocate("w", ml_dtypes.bfloat16, (3, 5))
        assert w.dtype == ml_dtypes.bfloat16
        w[...] = np.linspace(-2, 2, 15, dtype=np.float32).reshape(3, 5)
        pub.publish(1)
        with weightsync.Subscriber(endpoint) as sub:
            dst = np.zeros((3, 5), dtype=ml_dtypes.bfloat16)
            sub.register({"w": dst})
            sub.update()
            assert dst.tobytes() == w.tobytes()
        del w


def test_receive_yields_the_same_objects_every_step(endpoint):
    model = make_model(seed=5, count=4)
    with weightsync.Publisher(endpoint) as pub:
        pub.register(model)
        with weightsync.Subscriber(endpoint) as sub:
            for name, dtype, shape in pub.manifest:
                sub.allocate(name, dtype, shape)
            seen = None
            for step in range(1, 6):
                bump(model)
                pub.publish(step)
                pairs = list(sub.receive(step))
                assert [n for n, _ in pairs] == list(model)
                assert_bit_exact(dict(pairs), model)
                ids = [id(a) for _, a in pairs]
                assert seen is None or ids == seen
                seen = ids
            assert sub.committed_step == 5


def test_engine_mirrors_the_published_manifest_without_being_told(endpoint):
    """An engine with its own loader asks the publisher what to allocate, then receives."""
    model = make_model(seed=6, count=4)
    with weightsync.Publisher(endpoint) as pub:
        pub.register(model)
        pub.publish(1)
        with weightsync.Subscriber(endpoint) as sub:
            manifest = sub.published_manifest()
            assert manifest == pub.manifest
            for name, dtype, shape in manifest:
                sub.allocate(name, dtype, shape)
            assert_bit_exact(dict(sub.receive(1)), model)


def test_published_manifest_without_a_publisher_is_an_error(endpoint):
    with weightsync.Subscriber(endpoint, timeout=0.3) as sub:
        with pytest.raises(weightsync.Error, match="manifest"):
            sub.published_manifest()


def test_receive_without_allocate_is_an_error(endpoint):
    with weightsync.Subscriber(endpoint) as sub:
        with pytest.raises(weightsync.FailedPrecondition, match="allocate"):
            sub.receive()


def test_update_latest_and_up_to_date(endpoint):
    model = make_model(seed=1, count=2)
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register(model)
        dst = zeros_like_model(model)
        sub.register(list(dst.items()))  # pairs work as well as a mapping
        pub.publish(4)
        pub.publish(9)
        stats = sub.update()
        assert stats.step == 9 and stats.bytes == sum(v.nbytes for v in model.values())
        again = sub.update()
        assert again.up_to_date and again.step == 9 and not again.handle_created
        assert_bit_exact(dst, model)


def test_update_stats_is_read_only_and_complete(endpoint):
    import re

    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register({"x": np.ones(3)})
        sub.register({"x": np.zeros(3)})
        pub.publish(1)
        stats = sub.update()
    header = open(_update_stats_header()).read()
    body = header[header.index("struct UpdateStats {"):]
    body = body[:body.index("\n};")]  # UpdateStats' own fields, not WeightsCheck's
    fields = re.findall(r"^\s+\w+ (\w+) = [^;]+;", body, re.M)
    assert len(fields) >= 14
    for f in fields:
        assert hasattr(stats, f), f
        with pytest.raises(AttributeError):
            setattr(stats, f, getattr(stats, f))
    assert "step=1" in repr(stats)


def _update_stats_header():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    return root / "include" / "weightsync" / "update_stats.h"


@pytest.mark.parametrize("mode", ["staged", "in_place"])
def test_two_publishers_each_holding_half(endpoint, mode):
    """Two trainer ranks, each publishing half of the model; one subscriber takes both halves."""
    model = make_model(seed=5)
    names = sorted(model)
    halves = [{k: model[k] for k in names[:3]}, {k: model[k] for k in names[3:]}]
    endpoints = [endpoint + "-rank0", endpoint + "-rank1"]
    with weightsync.Publisher(endpoints[0]) as p0, weightsync.Publisher(endpoints[1]) as p1:
        p0.register(halves[0])
        p1.register(halves[1])
        with weightsync.Subscriber(endpoints, mode=mode, verify=True) as sub:
            dst = zeros_like_model(model)
            sub.register(dst)
            for step in (1, 2):
                bump(model)
                p0.publish(step)
                p1.publish(step)
                stats = sub.update()
                assert (stats.step, stats.tensors, stats.verified) == (step, len(model), True)
                assert_bit_exact(dst, model)


def test_subscriber_endpoint_list_must_hold_strings(endpoint):
    with pytest.raises(TypeError, match="sequence of str"):
        weightsync.Subscriber([endpoint, 3])
    with pytest.raises(ValueError, match="empty"):
        weightsync.Subscriber([])


@pytest.mark.parametrize("mode", ["staged", "in_place"])
def test_convert_dtypes_casts_bfloat16_to_float32(endpoint, mode):
    """A bf16 trainer, a float32 engine: each float32 is the bf16 bits shifted up (exact)."""
    rng = np.random.default_rng(9)
    bits = rng.normal(size=1000).astype(np.float32).view(np.uint32) >> 16
    src = {"w": bits.astype(np.uint16)}
    with weightsync.Publisher(endpoint) as pub:
        pub.register(src, dtypes={"w": "bfloat16"})
        pub.publish(1)
        dst = {"w": np.zeros(1000, dtype=np.float32)}
        with weightsync.Subscriber(endpoint, mode=mode, verify=True) as strict:
            strict.register(dst)
            with pytest.raises(ValueError, match="convert_dtypes"):
                strict.update()
        with weightsync.Subscriber(endpoint, mode=mode, verify=True, convert_dtypes=True) as sub:
            sub.register(dst)
            assert sub.update().step == 1
    want = (src["w"].astype(np.uint32) << 16).view(np.float32)
    assert dst["w"].tobytes() == want.tobytes()


def test_convert_on_publisher_gpu_is_accepted_and_host_arenas_convert_here(endpoint):
    """The option only moves cuda-ipc conversions; a host arena converts on the CPU either way,
    with the same bytes, and a wrong type for it is a TypeError naming nothing half-built."""
    src = {"w": (np.arange(64, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)}
    with weightsync.Publisher(endpoint) as pub:
        pub.register(src, dtypes={"w": "bfloat16"})
        pub.publish(1)
        results = []
        for on_publisher in (False, True):
            dst = {"w": np.zeros(64, dtype=np.float32)}
            with weightsync.Subscriber(endpoint, mode="in_place", convert_dtypes=True,
                                       convert_on_publisher_gpu=on_publisher) as sub:
                sub.register(dst)
                assert sub.update().step == 1
            results.append(dst["w"].tobytes())
        assert results[0] == results[1]
        assert results[0] == (src["w"].astype(np.uint32) << 16).view(np.float32).tobytes()
        with pytest.raises(TypeError):
            weightsync.Subscriber(endpoint, convert_on_publisher_gpu="yes")


def test_raw_bits_last_dimension_rule(endpoint):
    """docs/python.md: the last dimension's bytes must hold whole elements. uint8 (4, 6) read as
    bfloat16 is (4, 3); uint8 (4, 5) is refused; uint8 (4, 6) as float4_e2m1fn is (4, 12)."""
    src = np.arange(24, dtype=np.uint8).reshape(4, 6)
    with weightsync.Publisher(endpoint) as pub:
        pub.register({"bf": src, "fp4": src}, dtypes={"bf": "bfloat16", "fp4": "float4_e2m1fn"})
        assert pub.manifest == [("bf", "bfloat16", (4, 3)), ("fp4", "float4_e2m1fn", (4, 12))]
        with pytest.raises(ValueError, match=r"\[4, 5\] cannot be read as bfloat16"):
            pub.register({"odd": np.zeros((4, 5), np.uint8)}, dtypes={"odd": "bfloat16"})
        pub.publish(1)
        with weightsync.Subscriber(endpoint) as sub:
            dst = np.zeros((4, 3), np.uint16)
            sub.register({"bf": dst, "fp4": np.zeros((4, 6), np.uint8)},
                         dtypes={"bf": "bfloat16", "fp4": "float4_e2m1fn"})
            sub.update()
            assert dst.tobytes() == src.tobytes()



def test_publisher_endpoint_is_the_bound_one():
    """A tcp://HOST:0 publisher reports the port it bound, which a subscriber can use."""
    with weightsync.Publisher("tcp://127.0.0.1:0") as pub:
        host, port = pub.endpoint.rsplit(":", 1)
        assert host == "tcp://127.0.0.1" and int(port) > 0, pub.endpoint
        assert pub.endpoint in repr(pub)
        pub.register({"x": np.arange(4.0)})
        pub.publish(1)
        with weightsync.Subscriber(pub.endpoint) as sub:
            dst = np.zeros(4)
            sub.register({"x": dst})
            sub.update()
            assert (dst == np.arange(4.0)).all()


@pytest.mark.parametrize("mode", ["staged", "in_place"])
@pytest.mark.parametrize("tcp", [False, True], ids=["local", "tcp"])
def test_ring_of_two_buckets_streams_a_model_ten_times_a_bucket(endpoint, tcp, mode):
    # Bounded staging: 2 buckets of 64 KiB in shared memory instead of two copies of the model.
    # Over tcp the session sends the version from the tensors themselves (path "tcp").
    model = make_model(seed=5, count=6, elements=40000)
    assert sum(v.nbytes for v in model.values()) >= 10 * 65536
    where = "tcp://127.0.0.1:0" if tcp else endpoint
    with weightsync.Publisher(where, ring_buckets=2, ring_bucket_bytes=65536) as pub:
        pub.register(model)
        dst = zeros_like_model(model)
        with weightsync.Subscriber(pub.endpoint, mode=mode, verify=True, timeout=30) as sub:
            sub.register(dst)
            for step in (1, 2, 3):
                pub.begin_write()
                bump(model)
                pub.publish(step)
                stats = sub.update()
                assert (stats.step, stats.verified) == (step, True)
                assert stats.path == ("tcp" if tcp else "shm-ring"), stats
                assert_bit_exact(dst, model)


@pytest.mark.parametrize("mode", ["staged", "in_place"])
def test_ring_stats_say_what_memory_each_side_holds(endpoint, mode):
    # PublishStats.store_bytes: the ring's 2 buckets in host memory, not the model's copies;
    # UpdateStats.staging_bytes: the subscriber's shadow (staged) or none (in place), exactly its
    # share of the ledger's staging_bytes; no GPU memory anywhere (device_bytes).
    model = make_model(seed=6, count=6, elements=40000)
    total = sum(v.nbytes for v in model.values())
    base = weightsync.ledger()
    with weightsync.Publisher(endpoint, ring_buckets=2, ring_bucket_bytes=65536) as pub:
        pub.register(model)
        published = pub.publish(1)
        assert (published.store_bytes, published.store_device) == (2 * 65536, -1)
        assert published.bytes_copied == 0
        assert "store_bytes=131072, store_device=-1" in repr(published)
        with weightsync.Subscriber(endpoint, mode=mode, timeout=30) as sub:
            sub.register(zeros_like_model(model))
            stats = sub.update()
            if mode == "staged":
                assert total <= stats.staging_bytes < total + 64 * len(model)
            else:
                assert stats.staging_bytes == 0
            held = weightsync.ledger()
            assert stats.staging_bytes == held["staging_bytes"] - base["staging_bytes"]
            assert held["device_bytes"] == base["device_bytes"]
            assert f"staging_bytes={stats.staging_bytes}" in repr(stats)
            sub.sleep()
            assert weightsync.ledger()["staging_bytes"] == base["staging_bytes"]


def test_ring_refuses_one_bucket(endpoint):
    with pytest.raises(weightsync.InvalidArgument, match="ring_buckets = 1"):
        weightsync.Publisher(endpoint, ring_buckets=1)


def test_check_weights_names_a_changed_tensor_and_the_next_update_restores_it(endpoint):
    model = {"a": np.arange(4096, dtype=np.float32), "b": np.ones(64, np.float32)}
    dst = {k: np.zeros_like(v) for k, v in model.items()}
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register(model)
        sub.register(dst)
        with pytest.raises(weightsync.FailedPrecondition, match="prepared transfer handle"):
            sub.check_weights()  # nothing committed yet
        pub.publish(1)
        stats = sub.update(check_weights=True)
        assert stats.weights_checked and stats.check_seconds >= 0
        check = sub.check_weights()
        assert isinstance(check, weightsync.WeightsCheck)
        assert (check.step, check.tensors, check.bytes, check.unchecked_tensors) == (
            1, 2, model["a"].nbytes + model["b"].nbytes, 0)
        dst["a"][1000] = -1.0  # the engine's memory changes behind the subscriber's back
        with pytest.raises(weightsync.Corruption, match="tensor 'a' bytes"):
            sub.check_weights()
        assert not sub.weights_valid
        restored = sub.update()  # the committed step again: rewritten, not "up to date"
        assert not restored.up_to_date and sub.weights_valid
        np.testing.assert_array_equal(dst["a"], model["a"])
        sub.check_weights()


def test_tcp_token_from_the_constructors(tmp_path):
    # token= / token_file= on both sides (no environment variables): the right secret moves the
    # bytes, a wrong one is refused as Unauthenticated, and a token file must be owner-only.
    model = {"w": np.arange(256, dtype=np.float32)}
    secret = tmp_path / "token"
    secret.write_text("correct horse battery staple 42")
    secret.chmod(0o600)
    with weightsync.Publisher("tcp://127.0.0.1:0", token_file=str(secret)) as pub:
        pub.register(model)
        pub.publish(1)
        dst = {"w": np.zeros(256, np.float32)}
        with weightsync.Subscriber(pub.endpoint, token="correct horse battery staple 42",
                                   verify=True) as sub:
            sub.register(dst)
            assert sub.update().verified
        np.testing.assert_array_equal(dst["w"], model["w"])
        with weightsync.Subscriber(pub.endpoint, token="a wrong but long enough token",
                                   timeout=3.0) as sub:
            sub.register({"w": np.zeros(256, np.float32)})
            with pytest.raises(weightsync.Unauthenticated):
                sub.update()
    secret.chmod(0o644)
    with pytest.raises(weightsync.Error, match="mode 644: it must not be readable by group"):
        weightsync.Publisher("tcp://127.0.0.1:0", token_file=str(secret))
