"""What a subscriber writes can change while nothing is prepared: an engine that freed and
re-allocated its weights registers the new tensors under the same names (or unregisters some), and
the next update writes only the new memory. Tied weights (one tensor under two names) move once;
overlapping destinations are refused; an allocate() loop over 100k tensors stays linear."""

import time

import numpy as np
import pytest

import weightsync


def test_re_registered_tensors_after_sleep_are_written_and_the_old_never(endpoint):
    src = {"a": np.arange(64, dtype=np.float32), "b": np.arange(32, dtype=np.int64)}
    old = {n: np.zeros_like(t) for n, t in src.items()}
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register(src)
        sub.register(old)
        pub.publish(1)
        sub.update()
        sub.sleep()
        for t in old.values():
            t.fill(7)  # "freed": must stay as it is now
        new = {n: np.zeros_like(t) for n, t in src.items()}
        sub.register(new)  # same names, new memory
        stats = sub.update()
        assert stats.step == 1 and not stats.up_to_date  # the new memory lacked step 1
        for n in src:
            assert (new[n] == src[n]).all(), n
            assert (old[n] == 7).all(), n
        src["a"] += 1
        pub.publish(2)
        sub.update()
        assert (new["a"] == src["a"]).all() and (old["a"] == 7).all()


def test_unregister_drops_tensors_and_unknown_names_remove_nothing(endpoint):
    src = {"a": np.ones(8, np.float32), "b": np.ones(8, np.float32)}
    dst = {n: np.zeros_like(t) for n, t in src.items()}
    with weightsync.Publisher(endpoint) as pub, \
            weightsync.Subscriber(endpoint, policy="subset") as sub:
        pub.register(src)
        sub.register(dst)
        with pytest.raises(weightsync.NotFound, match="'nope'"):
            sub.unregister(["a", "nope"])
        sub.unregister("a")
        pub.publish(1)
        stats = sub.update()
        assert stats.tensors == 1
        assert (dst["a"] == 0).all() and (dst["b"] == 1).all()
        with pytest.raises(weightsync.FailedPrecondition, match="Sleep"):
            sub.unregister("b")  # prepared


def test_allocate_again_replaces_the_tensor_receive_yields(endpoint):
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register({"w": np.full(4, 3, np.float32)})
        pub.publish(1)
        sub.allocate("w", "float32", (4,))
        fresh = sub.allocate("w", "float32", (4,))  # replaces the first (nothing prepared yet)
        pairs = list(sub.receive())
        assert len(pairs) == 1 and pairs[0][1] is fresh and (fresh == 3).all()


def test_tied_weights_move_once(endpoint):
    torch = pytest.importorskip("torch")
    emb = torch.nn.Embedding(64, 16)
    head = torch.nn.Linear(16, 64, bias=False)
    head.weight = emb.weight  # tied, as in most small causal LMs
    trainer = {"embed.weight": emb.weight.detach(), "lm_head.weight": head.weight.detach()}
    engine_weight = torch.zeros(64, 16)
    engine = {"embed.weight": engine_weight, "lm_head.weight": engine_weight}
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register(trainer)
        sub.register(engine)
        published = pub.publish(1)
        stats = sub.update()
    assert published.bytes_copied == 64 * 16 * 4
    assert stats.bytes == 64 * 16 * 4
    assert torch.equal(engine_weight, emb.weight.detach())


def test_published_manifest_names_tied_weights_and_allocate_shares_them(endpoint):
    # An engine mirroring the publisher through published_manifest() + allocate() + receive() (the
    # SGLang loader path): the tied name is allocated over its original, yielded under both names,
    # and its bytes move once.
    emb = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)
    norm = np.ones(16, np.float32)
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register({"embed.weight": emb, "norm.weight": norm, "lm_head.weight": emb})
        pub.publish(1)
        manifest = sub.published_manifest()
        assert [t.alias_of for t in manifest] == [None, None, "embed.weight"]
        assert [tuple(t) for t in manifest] == [("embed.weight", "float32", (64, 16)),
                                               ("norm.weight", "float32", (16,)),
                                               ("lm_head.weight", "float32", (64, 16))]
        views = {}
        for t in manifest:
            name, dtype, shape = t  # still unpacks as the (name, dtype, shape) it always was
            views[name] = sub.allocate(name, dtype, shape, alias_of=t.alias_of)
        assert views["lm_head.weight"] is views["embed.weight"]
        received = sub.receive()
        assert received.stats.bytes == emb.nbytes + norm.nbytes  # the tied bytes moved once
        pairs = dict(received)
        assert sorted(pairs) == ["embed.weight", "lm_head.weight", "norm.weight"]
        assert pairs["lm_head.weight"] is pairs["embed.weight"]
        np.testing.assert_array_equal(pairs["lm_head.weight"], emb)


def test_an_alias_allocate_names_its_problem_and_registers_nothing(endpoint):
    with weightsync.Subscriber(endpoint) as sub:
        with pytest.raises(weightsync.InvalidArgument, match="'w' is no allocate\\(\\)d tensor"):
            sub.allocate("w_tied", "float32", (4,), alias_of="w")
        sub.allocate("w", "float32", (4,))
        with pytest.raises(weightsync.InvalidArgument,
                           match="shares its original's memory, float32 \\[4\\] on cpu, not "
                                 "float32 \\[5\\] on cpu"):
            sub.allocate("w_tied", "float32", (5,), alias_of="w")
        with pytest.raises(weightsync.NotFound):
            sub.unregister("w_tied")  # nothing was registered under it


def test_overlapping_destinations_are_refused(endpoint):
    memory = np.zeros(64, np.float32)
    with weightsync.Subscriber(endpoint) as sub:
        with pytest.raises(weightsync.InvalidArgument, match="'b' overlaps tensor 'a'"):
            sub.register({"a": memory[:32], "b": memory[16:48]})
        sub.register({"a": memory[:32], "b": memory[32:]})  # disjoint: fine


def test_a_hundred_thousand_allocates_stay_linear(endpoint):
    # The documented published_manifest() + allocate() loop of a 100k-tensor MoE model. It was
    # quadratic (~25 min); linear it takes seconds. The bound only tells O(n) from O(n^2).
    count = 100_000
    with weightsync.Subscriber(endpoint, policy="subset") as sub:
        t0 = time.monotonic()
        for i in range(count):
            sub.allocate(f"experts.{i}", "float32", (1,))
        elapsed = time.monotonic() - t0
    assert elapsed < 60, f"{count} allocate() calls took {elapsed:.1f} s"
