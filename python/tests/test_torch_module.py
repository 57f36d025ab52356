"""weightsync.torch: publishing a module or state dict, loading into a module (both ways)."""

import contextlib
import multiprocessing as mp
import os

import pytest

torch = pytest.importorskip("torch")

import weightsync  # noqa: E402
import weightsync.torch as wst  # noqa: E402
from _engine_models import TrainerModel, assert_same_bytes, poison, train_step  # noqa: E402

SPAWN = mp.get_context("spawn")


@contextlib.contextmanager
def child_process(target, *args, join_timeout=120):
    """A spawned child running `target(*args)`; joined (killed if it hangs) and required to
    exit 0 when the block ends."""
    child = SPAWN.Process(target=target, args=args)
    child.start()
    try:
        yield child
    finally:
        child.join(timeout=join_timeout)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0


class WithBuffers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 8)
        self.head = torch.nn.Linear(8, 64, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.norm = torch.nn.LayerNorm(8)
        self.register_buffer("steps", torch.zeros(3, dtype=torch.int64))
        self.register_buffer("cache", torch.ones(5), persistent=False)


def state(module):
    return {n: t.detach().clone() for n, t in module.state_dict().items()}


def test_module_tensors_aliases_buffers_detached():
    m = WithBuffers()
    names = wst.module_tensors(m)
    assert set(names) == {"embed.weight", "head.weight", "norm.weight", "norm.bias", "steps"}
    assert names["embed.weight"].data_ptr() == names["head.weight"].data_ptr()
    assert not any(t.requires_grad for t in names.values())
    assert m.embed.weight.requires_grad  # the module's own parameters are untouched
    assert "steps" not in wst.module_tensors(m, buffers=False)
    assert "cache" not in names  # non-persistent buffers are not state


def test_tied_weights_are_copied_once_and_land_under_every_name(endpoint):
    src, dst = WithBuffers(), WithBuffers()
    poison(dst)
    unique = sum(t.numel() * t.element_size() for n, t in src.state_dict().items()
                 if n != "head.weight")
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        mp_ = wst.ModulePublisher(pub, src)
        stats = mp_.publish(1)
        assert stats.bytes_copied == unique  # the alias is copied once
        assert sorted(mp_.names) == sorted(src.state_dict())
        wst.register_module(sub, dst)
        got = sub.update()
        assert got.bytes == unique  # ... and moved once
        assert_same_bytes(state(dst), state(src))
        assert dst.head.weight.data_ptr() == dst.embed.weight.data_ptr()


def test_module_round_trip_five_steps_in_place_into_the_engines_module(endpoint):
    trainer, engine = TrainerModel(seed=1), TrainerModel(seed=2)
    poison(engine)
    addresses = {n: t.data_ptr() for n, t in engine.state_dict().items()}
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint, verify=True) as sub:
        publisher = wst.ModulePublisher(pub, trainer)
        publisher.publish(1)
        assert sorted(wst.register_module(sub, engine)) == sorted(trainer.state_dict())
        for step in range(1, 6):
            if step > 1:
                train_step(trainer, step)
                publisher.publish(step)
            stats = sub.update(step)
            assert stats.verified and stats.handle_created == (step == 1)
            assert_same_bytes(state(engine), state(trainer))
    assert {n: t.data_ptr() for n, t in engine.state_dict().items()} == addresses
    assert all(p.requires_grad for p in trainer.parameters())


def test_buffers_left_out_by_choice(endpoint):
    src, dst = WithBuffers(), WithBuffers()
    src.steps.fill_(7)
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        wst.ModulePublisher(pub, src, buffers=False).publish(1)
        assert "steps" not in {n for n, _, _ in pub.manifest}
        wst.register_module(sub, dst, buffers=False)
        sub.update()
    assert dst.steps.tolist() == [0, 0, 0]
    assert torch.equal(dst.embed.weight, src.embed.weight)


def test_state_dict_source_and_name_map(endpoint):
    src = {"a.w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
           "b.w": torch.arange(5, dtype=torch.int32)}
    dst = torch.nn.Module()
    dst.register_buffer("A", torch.zeros(3, 4))
    dst.register_buffer("B", torch.zeros(5, dtype=torch.int32))
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        wst.ModulePublisher(pub, src).publish(1)
        wst.register_module(sub, dst, name_map={"a.w": "A", "b.w": "B"})
        sub.update()
    assert torch.equal(dst.A, src["a.w"]) and torch.equal(dst.B, src["b.w"])


def test_non_contiguous_tensor_is_refused_with_what_to_do(endpoint):
    m = torch.nn.Linear(4, 6)
    m.weight.data = m.weight.data.t().contiguous().t()  # a transposed view
    with weightsync.Publisher(endpoint) as pub:
        with pytest.raises(weightsync.InvalidArgument) as info:
            wst.ModulePublisher(pub, m).publish(1)
    text = str(info.value)
    assert "'weight' is not contiguous" in text and ".contiguous()" in text


def test_a_moved_parameter_is_refused_not_published_stale(endpoint):
    m = torch.nn.Linear(4, 4)
    with weightsync.Publisher(endpoint) as pub:
        publisher = wst.ModulePublisher(pub, m)
        publisher.publish(1)
        m.weight = torch.nn.Parameter(torch.zeros(4, 4))
        with pytest.raises(weightsync.InvalidArgument, match="'weight' moved"):
            publisher.publish(2)
        assert pub.latest_step == 1


def test_pairs_source_stages_what_is_materialized_per_call(endpoint):
    """A `pairs()` callable (what a vLLM WeightSource gives): parameters are registered, tensors
    made per call (a gather, a cast) are copied into arena staging at each publish."""
    m = torch.nn.Linear(3, 5)
    calls = []

    def pairs():
        calls.append(1)
        yield "weight", m.weight
        yield "scaled", (m.bias * 2).to(torch.float16)  # made per call

    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        publisher = wst.ModulePublisher(pub, pairs=pairs)
        dst = {"weight": torch.empty(5, 3), "scaled": torch.empty(5, dtype=torch.float16)}
        for step in (1, 2):
            with torch.no_grad():
                m.bias.add_(1)
                m.weight.mul_(2)
            publisher.publish(step)
            if step == 1:
                sub.register(dst)
            sub.update(step)
            assert torch.equal(dst["weight"], m.weight.detach())
            assert torch.equal(dst["scaled"], (m.bias.detach() * 2).half())
    assert len(calls) == 2


def test_load_into_checks_everything_before_copying(endpoint):
    trainer, engine = TrainerModel(seed=3), TrainerModel(seed=4)
    before = state(engine)
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        wst.ModulePublisher(pub, trainer).publish(1)
        for name, dtype, shape in sub.published_manifest():
            sub.allocate(name, dtype, shape, framework="torch")
        received = list(sub.receive())
    bad = [(n.replace("norm", "nrm"), t) if n == "model.norm.weight" else (n, t)
           for n, t in received]
    with pytest.raises(weightsync.InvalidArgument) as info:
        wst.load_into(engine, bad)
    assert "model.nrm.weight" in str(info.value) and "model.norm.weight" in str(info.value)
    assert_same_bytes(state(engine), before)  # nothing copied
    wrong_dtype = [(n, t.double() if n == "model.norm.weight" else t) for n, t in received]
    with pytest.raises(weightsync.InvalidArgument, match="torch.float64"):
        wst.load_into(engine, wrong_dtype)
    loaded = wst.load_into(engine, bad, name_map={"model.nrm.weight": "model.norm.weight"})
    assert "model.norm.weight" in loaded
    assert_same_bytes(state(engine), state(trainer))
    # Not strict: unknown names and uncovered tensors are skipped.
    assert wst.load_into(engine, [("unknown", torch.zeros(1))], strict=False) == []


def test_register_module_lists_every_mismatch(endpoint):
    src = {"w": torch.zeros(2, 3), "v": torch.zeros(4)}
    dst = torch.nn.Module()
    dst.register_buffer("w", torch.zeros(3, 2))
    dst.register_buffer("extra", torch.zeros(1))
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        wst.ModulePublisher(pub, src).publish(1)
        with pytest.raises(weightsync.InvalidArgument) as info:
            wst.register_module(sub, dst)
    text = str(info.value)
    assert "'w' -> 'w': published float32 (2, 3), module float32 (3, 2)" in text
    assert "'v' -> 'v': no such tensor" in text and "extra" in text


def _dtensor_trainer(endpoint, ready, done):
    """A one-rank gloo mesh: the parameter is a DTensor (Shard(0)), published gathered."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    m = torch.nn.Linear(4, 6, bias=False)
    m.weight = torch.nn.Parameter(distribute_tensor(m.weight.detach(), mesh, [Shard(0)]))
    with weightsync.Publisher(endpoint) as pub:
        publisher = wst.ModulePublisher(pub, m)
        for step in (1, 2):
            with torch.no_grad():
                m.weight.add_(step)
            publisher.publish(step)
            ready.put(m.weight.full_tensor().detach().numpy().tobytes())
            done.get(timeout=60)
    dist.destroy_process_group()


def test_dtensor_parameters_publish_as_full_tensors(endpoint):
    ready, done = SPAWN.Queue(), SPAWN.Queue()
    dst = {"weight": torch.empty(6, 4)}
    with child_process(_dtensor_trainer, endpoint, ready, done), \
            weightsync.Subscriber(endpoint, timeout=30) as sub:
        for step in (1, 2):
            want = ready.get(timeout=120)
            if step == 1:
                sub.register(dst)
            sub.update(step)
            assert dst["weight"].numpy().tobytes() == want
            done.put(step)


def _tiny_llama(seed, device):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, tie_word_embeddings=True)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16)


def _llama_trainer(endpoint, device, ready, done, zero_copy=False):
    model = _tiny_llama(1, device)
    with weightsync.Publisher(endpoint, zero_copy=zero_copy) as pub:
        publisher = wst.ModulePublisher(pub, model)
        for step in (1, 2, 3):
            publisher.begin_write()  # zero-copy: the engine reads these very parameters
            train_step(model, step)
            publisher.publish(step)
            ready.put({n: t.detach().cpu().view(torch.uint8).numpy().tobytes()
                       for n, t in model.state_dict().items()})
            done.get(timeout=120)


@pytest.mark.parametrize("device,zero_copy", [
    ("cpu", False), pytest.param("cuda", False, marks=pytest.mark.gpu),
    pytest.param("cuda", True, marks=pytest.mark.gpu)], ids=["cpu", "cuda", "cuda-zero-copy"])
def test_transformers_model_round_trip(endpoint, device, zero_copy):
    """A Hugging Face Llama (tied embeddings, bf16) from a trainer process into an engine's own
    module, in place, on `device` (cuda: cuda-ipc between the processes, or zero-copy from the
    trainer's own parameters; the GPU machine runs it, `pytest -m gpu`)."""
    engine = _tiny_llama(2, device)
    poison(engine)
    ready, done = SPAWN.Queue(), SPAWN.Queue()
    with child_process(_llama_trainer, endpoint, device, ready, done, zero_copy), \
            weightsync.Subscriber(endpoint, timeout=60, verify=True) as sub:
        for step in (1, 2, 3):
            want = ready.get(timeout=300)
            if step == 1:
                wst.register_module(sub, engine)
            stats = sub.update(step)
            assert stats.step == step and stats.verified
            got = {n: t.detach().cpu().view(torch.uint8).numpy().tobytes()
                   for n, t in engine.state_dict().items()}
            assert got == want
            done.put(step)


def _tp_engine(tp):
    """FusedEngineModel's names with tensor-parallel shapes (vLLM's TP rank): qkv_proj and
    gate_up_proj column slices, o_proj and down_proj row slices, the rest whole."""
    from _engine_models import HIDDEN, INTER, KV, Q, FusedEngineModel

    m = FusedEngineModel()

    def param(*shape):
        return torch.nn.Parameter(torch.full(shape, float("nan")), requires_grad=False)

    kv_rows = KV // tp if KV // 4 >= tp else 4  # 2 KV heads of 4: replicated past tp=2
    for layer in m.model.layers:
        layer.self_attn.qkv_proj.weight = param(Q // tp + 2 * kv_rows, HIDDEN)
        layer.self_attn.o_proj.weight = param(HIDDEN, Q // tp)
        layer.mlp.gate_up_proj.weight = param(2 * INTER // tp, HIDDEN)
        layer.mlp.down_proj.weight = param(HIDDEN, INTER // tp)
    return m, kv_rows


def _tp_expected(state, tp, rank, kv_rows):
    """What TP rank `rank`'s module must hold, from a trainer state (checkpoint names)."""
    out = {}
    for name, t in state.items():
        if ".q_proj." in name:
            base = name.replace(".q_proj.", ".qkv_proj.")
            q = t.chunk(tp)[rank]
            k, v = (state[name.replace("q_proj", p)] for p in ("k_proj", "v_proj"))
            head = rank * (k.shape[0] // kv_rows) // tp if kv_rows * tp > k.shape[0] else rank
            out[base] = torch.cat([q, k[head * kv_rows:(head + 1) * kv_rows],
                                   v[head * kv_rows:(head + 1) * kv_rows]])
        elif ".gate_proj." in name:
            up = state[name.replace("gate_proj", "up_proj")]
            out[name.replace("gate_proj", "gate_up_proj")] = torch.cat(
                [t.chunk(tp)[rank], up.chunk(tp)[rank]])
        elif ".o_proj." in name or ".down_proj." in name:
            out[name] = t.chunk(tp, dim=1)[rank]
        elif not any(p in name for p in (".k_proj.", ".v_proj.", ".up_proj.")):
            out[name] = t
    return out


@pytest.mark.parametrize("tp", [2, 4])
def test_register_module_fills_tensor_parallel_fused_ranks_with_regions(endpoint, tp):
    """Every TP rank of a fused engine registers its own parameters: fused qkv (GQA: 2 KV heads,
    replicated at tp=4) and gate_up from the published q/k/v and gate/up, o/down row slices;
    only the rank's bytes move."""
    trainer = TrainerModel(seed=4)
    with weightsync.Publisher(endpoint) as pub:
        publisher = wst.ModulePublisher(pub, trainer)
        publisher.publish(1)
        engines = []
        for rank in range(tp):
            model, kv_rows = _tp_engine(tp)
            sub = weightsync.Subscriber(endpoint, verify=rank % 2 == 1)
            wst.register_module(sub, model, tp=(tp, rank))
            engines.append((rank, model, sub, kv_rows))
        for step in (2, 3):
            train_step(trainer, step)
            publisher.publish(step)
            for rank, model, sub, kv_rows in engines:
                stats = sub.update(step)
                moved = sum(p.numel() * p.element_size()
                            for p in {p.data_ptr(): p for p in model.parameters()}.values())
                if not stats.verified:
                    assert stats.bytes == moved, (rank, stats.bytes, moved)
                want = _tp_expected(state(trainer), tp, rank, kv_rows)
                got = {n: p for n, p in state(model).items() if n in want}
                assert_same_bytes(got, want)
        for _, _, sub, _ in engines:
            sub.close()


def test_register_module_names_a_parameter_that_is_no_slice_of_what_is_published(endpoint):
    trainer = TrainerModel(seed=4)
    model, _ = _tp_engine(2)
    layer = model.model.layers[0]
    layer.self_attn.o_proj.weight = torch.nn.Parameter(torch.zeros(7, 8), requires_grad=False)
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        wst.ModulePublisher(pub, trainer).publish(1)
        with pytest.raises(weightsync.InvalidArgument) as info:
            wst.register_module(sub, model, tp=(2, 0))
        assert "model.layers.0.self_attn.o_proj.weight" in str(info.value)
        assert "not a 1/2 slice of it" in str(info.value)
        with pytest.raises(weightsync.InvalidArgument) as info:
            wst.register_module(sub, _tp_engine(2)[0], packed={})
        assert "nothing published fills" in str(info.value) and "qkv_proj" in str(info.value)


def _dtensor_rank(endpoint, port, rank, world, ready, done):
    """Rank `rank` of a gloo mesh of `world`: a Linear whose weight is Shard(0) across the ranks
    (FSDP-style) and whose bias is replicated, published as regions from a Publisher of its own."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)  # the same full tensors on every rank, then each keeps its part
    m = torch.nn.Linear(4, 6)
    m.weight = torch.nn.Parameter(distribute_tensor(m.weight.detach(), mesh, [Shard(0)]))
    m.bias = torch.nn.Parameter(distribute_tensor(m.bias.detach(), mesh, [Replicate()]))
    with weightsync.Publisher(f"{endpoint}-{rank}") as pub:
        publisher = wst.ModulePublisher(pub, m)
        for step in (1, 2):
            with torch.no_grad():
                m.weight.add_(step)
                m.bias.add_(step)
            publisher.publish(step)
            full = {"weight": m.weight.full_tensor(), "bias": m.bias.full_tensor()}
            if step == 1:
                ready.put(("manifest", rank, pub.manifest))
            if rank == 0:
                ready.put(("want", {n: t.detach().numpy().tobytes() for n, t in full.items()}))
            done.get(timeout=60)
    dist.destroy_process_group()


def test_dtensor_shards_publish_as_regions_without_gathering(endpoint):
    """Two FSDP-style ranks publish their local shards; one subscriber takes the full tensors
    from both, another only rows [3, 6) of the weight (and the replicated bias) — from rank 1
    alone, exactly those bytes."""
    import socket

    from weightsync import regions as R

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready, done = SPAWN.Queue(), SPAWN.Queue()
    endpoints = [f"{endpoint}-{r}" for r in range(2)]
    with child_process(_dtensor_rank, endpoint, port, 0, 2, ready, done), \
            child_process(_dtensor_rank, endpoint, port, 1, 2, ready, done), \
            weightsync.Subscriber(endpoints, timeout=30) as whole, \
            weightsync.Subscriber(endpoints, timeout=30, policy="subset") as half:
        full_dst = {"weight": torch.empty(6, 4), "bias": torch.empty(6)}
        half_dst = {"weight": torch.empty(3, 4), "bias": torch.empty(6)}
        for step in (1, 2):
            got = [ready.get(timeout=120) for _ in range(3 if step == 1 else 1)]
            want = next(item[1] for item in got if item[0] == "want")
            if step == 1:
                # Each rank publishes its own rows, not a gathered copy.
                manifests = {item[1]: item[2] for item in got if item[0] == "manifest"}
                for rank in (0, 1):
                    assert dict((n, s) for n, _, s in manifests[rank]) == {
                        "weight": (3, 4), "bias": (6,)}, manifests
                whole.register(full_dst)
                half.register(half_dst, regions={"weight": R.shard("weight", (6, 4), 0, 2, 1)})
            assert whole.update(step).bytes == (24 + 6) * 4
            assert half.update(step).bytes == (12 + 6) * 4
            assert full_dst["weight"].numpy().tobytes() == want["weight"]
            assert full_dst["bias"].numpy().tobytes() == want["bias"]
            assert half_dst["weight"].numpy().tobytes() == want["weight"][12 * 4:]
            done.put(step)
            done.put(step)


def _partial_dtensor(endpoint, out):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    m = torch.nn.Linear(4, 6, bias=False)
    m.weight = torch.nn.Parameter(DTensor.from_local(m.weight.detach(), mesh, [Partial()]))
    with weightsync.Publisher(endpoint) as pub:
        try:
            wst.ModulePublisher(pub, m).publish(1)
            out.put("published")
        except weightsync.InvalidArgument as e:
            out.put(str(e))
        out.put(wst.ModulePublisher(pub, m, dtensors="gather").publish(2).step)
    dist.destroy_process_group()


def test_a_partial_dtensor_is_refused_as_a_region_and_published_gathered(endpoint):
    out = SPAWN.Queue()
    with child_process(_partial_dtensor, endpoint, out):
        text = out.get(timeout=120)
        assert "tensor 'weight' is a DTensor placed" in text and "dtensors='gather'" in text
        assert out.get(timeout=120) == 2
