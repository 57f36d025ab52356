"""Regions from Python: FSDP trainer ranks (each holding rows of every weight) into tensor-parallel
engine ranks with fused qkv (GQA) and gate_up, row-parallel o_proj/down_proj and expert ranges,
checked byte for byte against NumPy slicing of the global tensors; the layout helpers; refusals."""

import itertools

import numpy as np
import pytest

import weightsync
from weightsync import regions as R

_endpoints = itertools.count()

# A layer with 8 query heads and 2 KV heads of dim 4, a gated MLP and 4 stacked experts.
SHAPES = {
    "q": (32, 16), "k": (8, 16), "v": (8, 16), "o": (16, 32),
    "gate": (24, 16), "up": (24, 16), "down": (16, 24), "norm": (16,), "experts": (4, 6, 8),
}


def global_tensors(step):
    rng = np.random.default_rng(step)
    return {name: rng.integers(0, 2**16, size=shape, dtype=np.uint16)
            for name, shape in SHAPES.items()}


def engine_layout(tp, rank, head_dim=4):
    """name → (regions, the expected NumPy value given the global tensors)."""
    g = lambda n: (n, SHAPES[n])  # noqa: E731
    return {
        "qkv_proj": R.qkv(g("q"), g("k"), g("v"), tp=tp, rank=rank, head_dim=head_dim),
        "o_proj": [R.row("o", SHAPES["o"], tp, rank)],
        "gate_up_proj": R.gate_up(g("gate"), g("up"), tp=tp, rank=rank),
        "down_proj": [R.row("down", SHAPES["down"], tp, rank)],
        "norm": [R.whole("norm", SHAPES["norm"])],
        "experts": [R.experts("experts", SHAPES["experts"], 2, rank % 2)],
    }


def expected(parts, tensors):
    """What a destination filled by `parts` holds: each part's slice placed at its `at`."""
    shape = [0] * len(parts[0].global_shape)
    for p in parts:
        at = p.at or (0,) * len(shape)
        shape = [max(s, a + e) for s, a, e in zip(shape, at, p.extent)]
    out = np.zeros(shape, dtype=np.uint16)
    for p in parts:
        at = p.at or (0,) * len(shape)
        src = tuple(slice(o, o + e) for o, e in zip(p.offset, p.extent))
        dst = tuple(slice(a, a + e) for a, e in zip(at, p.extent))
        out[dst] = tensors[p.tensor][src]
    return out


class Trainer:
    """FSDP rank `rank` of `world`: rows of every global tensor, registered as regions."""

    def __init__(self, world, rank):
        self.world, self.rank = world, rank
        self.pub = weightsync.Publisher(f"local://py-regions-{next(_endpoints)}", segment_bytes=64)
        self.regions = {n: R.fsdp(n, s, world, rank) for n, s in SHAPES.items()}
        self.shards = {n: np.zeros(r.extent, dtype=np.uint16) for n, r in self.regions.items()}
        self.pub.register(self.shards, dtypes={n: "bfloat16" for n in SHAPES},
                          regions=self.regions)

    def publish(self, step):
        tensors = global_tensors(step)
        for n, r in self.regions.items():
            self.shards[n][...] = tensors[n][r.offset[0]:r.offset[0] + r.extent[0]]
        self.pub.publish(step)


@pytest.fixture
def fsdp4():
    trainers = [Trainer(4, r) for r in range(4)]
    yield trainers
    for t in trainers:
        t.pub.close()


@pytest.mark.parametrize("mode", ["staged", "in_place"])
@pytest.mark.parametrize("verify", [False, True])
def test_fsdp4_into_tp2_fused_layouts_bit_exact(fsdp4, mode, verify):
    endpoints = [t.pub.endpoint for t in fsdp4]
    engines = []
    for rank in range(2):
        layout = engine_layout(2, rank)
        dst = {n: np.full(expected(p, global_tensors(0)).shape, 0xEEEE, dtype=np.uint16)
               for n, p in layout.items()}
        sub = weightsync.Subscriber(endpoints, mode=mode, verify=verify, policy="subset")
        sub.register(dst, dtypes={n: "bfloat16" for n in dst}, regions=layout)
        engines.append((sub, layout, dst))
    for step in (1, 2, 3):
        for t in fsdp4:
            t.publish(step)
        want = global_tensors(step)
        for sub, layout, dst in engines:
            stats = sub.update()
            assert stats.step == step and stats.verified == verify
            shard_bytes = sum(v.nbytes for v in dst.values())
            if verify:
                assert stats.bytes >= shard_bytes  # partly read segments move whole
            else:
                assert stats.bytes == shard_bytes
            assert stats.tensors == len(dst)
            for n, parts in layout.items():
                np.testing.assert_array_equal(dst[n], expected(parts, want), err_msg=n)
    for sub, _, _ in engines:
        sub.close()


def test_torch_destinations_with_regions(fsdp4):
    torch = pytest.importorskip("torch")
    layout = engine_layout(2, 1)
    dst = {n: torch.zeros(expected(p, global_tensors(0)).shape, dtype=torch.bfloat16)
           for n, p in layout.items()}
    with weightsync.Subscriber([t.pub.endpoint for t in fsdp4], policy="subset") as sub:
        sub.register(dst, regions=layout)
        for t in fsdp4:
            t.publish(5)
        sub.update()
    want = global_tensors(5)
    for n, parts in layout.items():
        got = dst[n].view(torch.int16).numpy().view(np.uint16)
        np.testing.assert_array_equal(got, expected(parts, want), err_msg=n)


def test_layout_helpers():
    assert R.shard("w", (10, 4), 0, 3, 1) == R.Region("w", (10, 4), (3, 0), (3, 4))
    assert R.row("o", (16, 32), 4, 3) == R.Region("o", (16, 32), (0, 24), (16, 8))
    fused = R.gate_up(("g", (24, 16)), ("u", (24, 16)), tp=2, rank=1)
    assert [(p.tensor, p.offset, p.at) for p in fused] == [("g", (12, 0), (0, 0)),
                                                            ("u", (12, 0), (12, 0))]
    # GQA with fewer KV heads (2) than ranks (4): ranks 0-1 share KV head 0, ranks 2-3 head 1.
    q, k, v = ("q", (32, 16)), ("k", (8, 16)), ("v", (8, 16))
    for rank, head in [(0, 0), (1, 0), (2, 1), (3, 1)]:
        parts = R.qkv(q, k, v, tp=4, rank=rank, head_dim=4)
        assert parts[0].offset == (8 * rank, 0) and parts[0].extent == (8, 16)
        assert parts[1].offset == (4 * head, 0) and parts[1].extent == (4, 16)
        assert parts[1].at == (8, 0) and parts[2].at == (12, 0)
    with pytest.raises(ValueError, match="tp=3 is not a multiple of its 2 KV heads"):
        R.qkv(q, k, v, tp=3, rank=0, head_dim=4)
    with pytest.raises(ValueError, match="rank 2 of 2"):
        R.shard("w", (4,), 0, 2, 2)


def test_refusals_name_the_tensor_and_the_problem(endpoint):
    a = np.zeros((4, 6), dtype=np.float32)
    with weightsync.Publisher(endpoint) as pub:
        with pytest.raises(weightsync.InvalidArgument, match="regions names tensors not in this "
                                                             "call: 'b'"):
            pub.register({"a": a}, regions={"b": R.fsdp("b", (8, 6), 2, 0)})
        with pytest.raises(TypeError, match=r"regions\['a'\]: a part needs 'offset'"):
            pub.register({"a": a}, regions={"a": {"tensor": "g", "global_shape": (8, 6)}})
        with pytest.raises(weightsync.InvalidArgument, match="tensor 'a': holds 'a' \\[0:8, 3:6\\]"):
            pub.register({"a": a}, regions={"a": R.shard("a", (8, 6), 1, 2, 1)})
        # A dict works as well as a Region; the refusals above left nothing registered.
        pub.register({"a": a}, regions={"a": {"tensor": "g", "global_shape": (8, 6),
                                              "offset": (4, 0)}})
        assert [name for name, _, _ in pub.manifest] == ["a"]
    with weightsync.Subscriber(endpoint) as sub:
        with pytest.raises(weightsync.InvalidArgument, match="tensor 'w' region part 0 .*dim 0 "
                                                             "does not fit"):
            sub.register({"w": np.zeros((4, 6), np.float32)},
                         regions={"w": R.Region("g", (8, 6), (6, 0), (4, 6))})


def test_an_engine_with_its_own_loader_receives_whole_tensors_from_shards(fsdp4):
    """published_manifest() shows the global tensors of a sharded trainer; allocate() + receive()
    then assembles each from the ranks holding its rows (the load_weights path of the engine
    integrations)."""
    for t in fsdp4:
        t.publish(7)  # the layout a manifest describes exists from the first publish on
    with weightsync.Subscriber([t.pub.endpoint for t in fsdp4]) as sub:
        manifest = {name: tuple(shape) for name, _, shape in sub.published_manifest()}
        assert manifest == SHAPES
        for name, dtype, shape in sub.published_manifest():
            sub.allocate(name, dtype, shape)
        got = {name: np.asarray(a).view(np.uint16) for name, a in sub.receive()}
    want = global_tensors(7)
    for name, shape in SHAPES.items():
        np.testing.assert_array_equal(got[name].reshape(shape), want[name], err_msg=name)
