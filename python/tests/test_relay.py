"""Relays from Python (docs/relays.md): a subscriber with serve_endpoint serves what it commits to
other subscribers, under the trainer's lineage and digests; a chain holds the trainer's bytes at
every level, and over tcp the leaf gets deltas through the relays; replicas that all dial the
trainer past its max_direct are redirected into a tree of relays."""

import time

import numpy as np
import pytest

import weightsync
from conftest import assert_bit_exact, bump, make_model, zeros_like_model
from test_delta import change_some


@pytest.mark.parametrize("link", ["tcp", "local"])
def test_a_chain_of_relays_holds_the_trainers_bytes_at_every_level(link, tmp_path):
    rng = np.random.default_rng(42)
    model = make_model(seed=6, elements=20000)

    def endpoint(name):
        return "tcp://127.0.0.1:0" if link == "tcp" else f"local://relay-py-{name}-{tmp_path.name}"

    with weightsync.Publisher(endpoint("trainer"), segment_bytes=16384,
                              lineage="py-relay") as pub:
        pub.register(model)
        pub.publish(1)
        first, second, leaf = (zeros_like_model(model) for _ in range(3))
        with weightsync.Subscriber(pub.endpoint, serve_endpoint=endpoint("a"), timeout=30) as a, \
                weightsync.Subscriber(a.serve_endpoint, serve_endpoint=endpoint("b"),
                                      verify=True, timeout=30) as b, \
                weightsync.Subscriber(b.serve_endpoint, verify=True, timeout=30) as sub:
            assert a.serve_endpoint and b.serve_endpoint and sub.serve_endpoint == ""
            for s, dst in ((a, first), (b, second), (sub, leaf)):
                s.register(dst)
            for step in range(1, 6):
                if step > 1:
                    change_some(model, rng, 0.01)
                    pub.publish(step)
                for relay in (a, b):
                    stats = relay.update()
                    assert (stats.step, stats.served_step) == (step, step), stats
                    assert f"served_step={step}" in repr(stats)
                stats = sub.update()
                assert stats.step == step and stats.verified and stats.served_step == -1
                assert stats.lineage == "py-relay"
                if link == "tcp" and step > 1:
                    assert stats.delta_base_step == step - 1, stats
                    assert stats.received_bytes < stats.bytes // 4, stats
                for dst in (first, second, leaf):
                    assert_bit_exact(dst, model)


def test_a_relay_of_several_publishers_is_refused_with_the_reason():
    with pytest.raises(weightsync.InvalidArgument, match="serve_endpoint with 2 publishers"):
        weightsync.Subscriber(["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"],
                              serve_endpoint="tcp://127.0.0.1:0")


def eventually(get, timeout=5.0):
    # What another thread does on its own (a session reading a report): polled until it holds.
    deadline = time.monotonic() + timeout
    while True:
        got = get()
        if got or time.monotonic() > deadline:
            assert got, "did not settle within %.1f s" % timeout
            return got
        time.sleep(0.005)


def only(members, held_step):
    # The one member, once it holds `held_step`; None before.
    return members[0] if len(members) == 1 and members[0].held_step == held_step else None


def test_membership_says_which_step_each_subscriber_holds_at_each_level():
    model = make_model(seed=7, elements=5000)
    with weightsync.Publisher("tcp://127.0.0.1:0") as pub:
        pub.register(model)
        pub.publish(1)
        mid, leaf = zeros_like_model(model), zeros_like_model(model)
        with weightsync.Subscriber(pub.endpoint, serve_endpoint="tcp://127.0.0.1:0") as relay, \
                weightsync.Subscriber(relay.serve_endpoint, verify=True) as sub:
            relay.register(mid)
            sub.register(leaf)
            assert pub.members() == [] and relay.served_members() == []
            relay.update()
            sub.update()
            pub.publish(2)
            relay.update()
            sub.update()
            # Each says what it committed once it did; the publisher's session reads that on
            # its own thread.
            r = eventually(lambda: only(pub.members(), held_step=2))
            assert (r.held_step, r.sent_step, r.receiving_step) == (2, 2, -1), r
            c = eventually(lambda: only(relay.served_members(), held_step=2))
            assert (c.held_step, c.sent_step) == (2, 2), c
            assert "sent_step=2" in repr(c)
            assert sub.served_members() == [] and sub.served_tree() == []
            # The whole tree from the trainer: the relay, then its child one level down.
            tree = eventually(lambda: pub.tree() if len(pub.tree()) == 2 and
                              pub.tree()[1].held_step == 2 else None)
            assert [(m.depth, m.via, m.held_step) for m in tree] == \
                [(1, "", 2), (2, relay.serve_endpoint, 2)], tree
            assert tree[0].serves == relay.serve_endpoint
            assert "depth=2" in repr(tree[1]) and "depth" not in repr(tree[0])
            assert [m.depth for m in relay.served_tree()] == [1]
            assert_bit_exact(leaf, model)


def test_replicas_past_the_publishers_bound_arrange_themselves_into_a_chain(tmp_path):
    # max_direct=1 and relays of one child each: three replicas that all dial the trainer's
    # endpoint are redirected down the line, first -> second -> third.
    model = make_model(seed=8, elements=5000)
    with weightsync.Publisher(f"local://topology-py-trainer-{tmp_path.name}", max_direct=1,
                              segment_bytes=16384, lineage="py-topology") as pub:
        pub.register(model)
        pub.publish(1)
        replicas = []
        try:
            for i in range(3):
                dst = zeros_like_model(model)
                s = weightsync.Subscriber(
                    pub.endpoint, serve_endpoint=f"local://topology-py-{i}-{tmp_path.name}",
                    serve_max_direct=1, verify=True, timeout=30)
                replicas.append((s, dst))
                s.register(dst)
                stats = s.update()  # its place in the chain is decided at its first Hello
                assert (stats.step, stats.served_step) == (1, 1) and stats.verified, stats
                assert_bit_exact(dst, model)
            bump(model)
            pub.publish(2)
            for s, _ in replicas:  # parents before their children
                stats = s.update()
                assert (stats.step, stats.served_step) == (2, 2) and stats.verified, stats
            for _, dst in replicas:
                assert_bit_exact(dst, model)
            (first, _), (second, _), (third, _) = replicas
            [direct] = pub.members()
            assert direct.serves == first.serve_endpoint, direct
            [child] = first.served_members()
            assert child.serves == second.serve_endpoint, child
            assert child.below == 1, child  # third, as second's request for step 2 said
            # `below` is as of each relay's latest request: first asked for step 2 before second
            # said it serves third, so the publisher counts third from first's next request on.
            assert direct.below == 1, direct
            stats = first.update()
            assert stats.up_to_date and stats.step == 2, stats
            [direct] = pub.members()
            assert direct.below == 2, direct
            assert f"serves='{first.serve_endpoint}'" in repr(direct) and "below=2" in repr(direct)
            [grandchild] = second.served_members()
            assert grandchild.serves == third.serve_endpoint, grandchild
            assert grandchild.below == 0
            assert third.served_members() == []
        finally:
            for s, _ in reversed(replicas):
                s.close()


def test_relay_topology_options_without_serve_endpoint_are_refused_with_the_reason():
    with pytest.raises(weightsync.InvalidArgument, match="serve_endpoint"):
        weightsync.Subscriber("tcp://127.0.0.1:1", serve_max_direct=2)
    with pytest.raises(weightsync.InvalidArgument, match="serve_endpoint"):
        weightsync.Subscriber("tcp://127.0.0.1:1", serve_announce="tcp://10.0.0.7:7000")


def test_a_replica_goes_to_a_relay_of_its_own_locality(tmp_path):
    model = make_model(seed=9, elements=3000)
    with weightsync.Publisher(f"local://locality-py-trainer-{tmp_path.name}", max_direct=2,
                              segment_bytes=16384) as pub:
        pub.register(model)
        pub.publish(1)
        opened = []
        try:
            for rack in ("rack-a", "rack-b"):
                relay = weightsync.Subscriber(
                    pub.endpoint, serve_endpoint=f"local://locality-py-{rack}-{tmp_path.name}",
                    locality=rack, timeout=30)
                opened.append(relay)
                relay.register(zeros_like_model(model))
                relay.update()
            dst = zeros_like_model(model)
            leaf = weightsync.Subscriber(pub.endpoint, locality="rack-b", verify=True, timeout=30)
            opened.append(leaf)
            leaf.register(dst)
            assert leaf.update().verified
            assert_bit_exact(dst, model)
            a, b = opened[0], opened[1]
            assert a.served_members() == []
            [child] = b.served_members()
            assert child.locality == "rack-b" and "locality='rack-b'" in repr(child)
            assert [m.locality for m in pub.members()] == ["rack-a", "rack-b"]
        finally:
            for s in reversed(opened):
                s.close()
    with pytest.raises(weightsync.InvalidArgument, match="locality"):
        weightsync.Subscriber("tcp://127.0.0.1:1", locality="rack 3")
