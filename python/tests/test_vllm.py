"""The "weightsync" vLLM weight-transfer backend, driven through vLLM's own classes: the worker
engine from `WeightTransferEngineFactory.create_engine`, the trainer engine from
`WeightTransferTrainerFactory.trainer_init` over `ModuleSource`, on shared memory, with CPU
models of vLLM's layout (fused qkv / gate_up, `load_weights` stacking checkpoint names).

Needs the `vllm` wheel (installed without its dependencies plus what importing its weight-transfer
and model-loader modules needs: scripts/python_test.sh, VLLM=...); skips without it."""

import functools
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm.distributed.weight_transfer")

from vllm.config.weight_transfer import WeightTransferConfig  # noqa: E402
from vllm.distributed.weight_transfer import (  # noqa: E402
    ModuleSource,
    ParamMeta,
    WeightSource,
    WeightTransferEngineFactory,
    WeightTransferTrainerFactory,
)

import weightsync  # noqa: E402
from _engine_models import (  # noqa: E402
    FusedEngineModel,
    TrainerModel,
    assert_engine_holds,
    assert_same_bytes,
    engine_state,
    poison,
    train_step,
)
from weightsync.vllm import plugin  # noqa: E402

plugin.register()  # what vLLM's plugin loader does in its processes (entry point: tested below)

from weightsync.vllm.engine import (  # noqa: E402
    WeightsyncTrainerInitInfo,
    WeightsyncWeightTransferEngine,
)

TESTS = os.path.dirname(__file__)


class LocalClient:
    """A `VLLMWeightSyncClient` over in-process worker engines, with the session rules of
    vLLM's Worker (a failed update ends the session) and the version rule of its LLM
    (`finish_weight_update(weight_version)` sets it after every worker finished)."""

    def __init__(self, *engines):
        self.engines = engines
        self.weight_version = "default"
        self.active = False
        self.calls = []

    def init_weight_transfer_engine(self, init_info):
        self.calls.append("init")
        for e in self.engines:
            e.init_transfer_engine(e.parse_init_info(dict(init_info)))

    def start_weight_update(self):
        self.calls.append("start")
        assert not self.active, "start_weight_update while a session is active"
        for e in self.engines:
            e.start_weight_update()
        self.active = True

    def update_weights(self, update_info):
        self.calls.append("update")
        assert self.active, "update_weights outside a session"
        try:
            for e in self.engines:
                e.update_weights(update_info)
        except BaseException:
            self.active = False
            raise

    def finish_weight_update(self, weight_version=None):
        self.calls.append("finish")
        assert self.active, "finish_weight_update without a matching start"
        for e in self.engines:
            e.finish_weight_update()
        self.active = False
        if weight_version is not None:
            self.weight_version = weight_version


def vllm_config():
    # The base engine reads only these two (PLATFORM.md); no attention layers need model_config.
    return SimpleNamespace(parallel_config=None, model_config=None)


def create_engine(model):
    return WeightTransferEngineFactory.create_engine(
        WeightTransferConfig(backend="weightsync"), vllm_config(), torch.device("cpu"), model)


def record_layout(model):
    """What vLLM's model loader does after building a model (initialize_model)."""
    from vllm.model_executor.model_loader.reload import record_metadata_for_reloading

    record_metadata_for_reloading(model)


@pytest.mark.parametrize("layerwise", [True, False], ids=["layerwise", "plain_load_weights"])
def test_five_updates_bit_exact_through_vllm_factories(endpoint, layerwise):
    trainer = TrainerModel(seed=1)
    engine_model = FusedEngineModel()
    if layerwise:
        record_layout(engine_model)
    engine = create_engine(engine_model)
    assert isinstance(engine, WeightsyncWeightTransferEngine)
    client = LocalClient(engine)
    sender = WeightTransferTrainerFactory.trainer_init(
        WeightsyncTrainerInitInfo(rank=0, endpoint=endpoint, verify=True),
        client=client, source=ModuleSource(trainer))
    try:
        assert engine.receiver is not None and engine.init_info.endpoints == [endpoint]
        for step in range(1, 6):
            train_step(trainer, step)
            assert sender.send_weights() == step
            assert_engine_holds(engine_model, trainer)
            stats = engine.receiver.last_stats
            assert (stats.step, stats.verified, stats.handle_created) == (step, True, step == 1)
            assert client.weight_version == str(step) and engine.weight_version == step
            # ModuleSource publishes named_parameters(): the tied lm_head once, under one name.
            assert len(engine_model.loaded[-1]) == len(dict(trainer.named_parameters()))
        assert client.calls == ["init"] + ["start", "update", "finish"] * 5
        assert engine._layerwise() is layerwise
    finally:
        sender.shutdown()
        engine.shutdown()


def run_direct_mode(endpoint, engine_model, check):
    """Three steps of a trainer into `engine_model` in direct mode through vLLM's factories;
    `check(trainer)` after each. The parameters never move and no receive buffer exists (nothing
    of the model's size besides the subscriber's shadow). Returns the engine, shut down."""
    trainer = TrainerModel(seed=2)
    before = {n: p.data_ptr() for n, p in engine_model.named_parameters()}
    engine = create_engine(engine_model)
    sender = WeightTransferTrainerFactory.trainer_init(
        WeightsyncTrainerInitInfo(rank=0, endpoint=endpoint, mode="direct"),
        client=LocalClient(engine), source=ModuleSource(trainer))
    try:
        for step in range(1, 4):
            train_step(trainer, step)
            sender.send_weights()
            check(trainer)
        assert {n: p.data_ptr() for n, p in engine_model.named_parameters()} == before
        assert engine.receiver._allocated == []
    finally:
        sender.shutdown()
        engine.shutdown()
    return engine


def test_direct_mode_writes_the_engines_own_parameters(endpoint):
    engine_model = TrainerModel(seed=3)  # same names and layout as the trainer's
    poison(engine_model)
    run_direct_mode(endpoint, engine_model,
                    lambda trainer: assert_same_bytes(engine_state(engine_model),
                                                      engine_state(trainer)))


def test_direct_mode_fills_fused_parameters_in_place(endpoint):
    """vLLM's fused qkv_proj / gate_up_proj (packed_modules_mapping) are written straight from
    the published q/k/v and gate/up tensors, as regions: no receive buffers, no loader."""
    engine_model = FusedEngineModel()
    engine = run_direct_mode(endpoint, engine_model,
                             lambda trainer: assert_engine_holds(engine_model, trainer))
    assert engine_model.loaded == [] and engine.weight_version == 3


def test_direct_mode_refuses_a_fused_layout_it_cannot_name_and_changes_nothing(endpoint):
    trainer = TrainerModel(seed=2)
    engine_model = FusedEngineModel()
    engine_model.packed_modules_mapping = {}  # a model that does not say what it fuses
    engine = create_engine(engine_model)
    client = LocalClient(engine)
    sender = WeightTransferTrainerFactory.trainer_init(
        WeightsyncTrainerInitInfo(rank=0, endpoint=endpoint, mode="direct"),
        client=client, source=ModuleSource(trainer))
    try:
        with pytest.raises(weightsync.InvalidArgument) as info:
            sender.send_weights()
        text = str(info.value)
        assert "q_proj" in text and "qkv_proj" in text and "load_weights" in text
        assert all(torch.isnan(p).all() for p in engine_model.parameters())
        assert client.weight_version == "default" and engine.weight_version is None
    finally:
        sender.shutdown()
        engine.shutdown()


FAILED_UPDATE = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    from test_vllm import *  # the same harness, in a process whose fail point is armed
    from _engine_models import *
    trainer, engine_model = TrainerModel(seed=4), FusedEngineModel()
    record_layout(engine_model)
    engine_model.load_weights(trainer.state_dict().items())  # the checkpoint vLLM loaded
    good = engine_state(engine_model)
    assert_same_bytes(good, expected_engine_state(trainer_state(trainer)))
    engine = create_engine(engine_model)
    client = LocalClient(engine)
    sender = WeightTransferTrainerFactory.trainer_init(
        WeightsyncTrainerInitInfo(rank=0, endpoint={endpoint!r}, verify=True),
        client=client, source=ModuleSource(trainer))
    train_step(trainer, 1)
    try:
        sender.send_weights()                  # step 1: one bit flipped after it landed
    except weightsync.Corruption as e:
        print("refused:", e)
    else:
        raise SystemExit("step 1 was not refused")
    assert_same_bytes(engine_state(engine_model), good)     # the old weights, whole
    assert client.weight_version == "default" and engine.weight_version is None
    assert engine.committed_step == -1 and not client.active
    assert engine_model.loaded == [list(trainer.state_dict())]  # load_weights never ran again
    train_step(trainer, 2)
    assert sender.send_weights() == 2          # the next update prepares a new handle
    assert engine.receiver.last_stats.handle_created
    assert_engine_holds(engine_model, trainer)
    assert client.weight_version == "2" and engine.weight_version == 2
    sender.shutdown(); engine.shutdown()
    print("ok")
""")


@pytest.mark.slow
def test_failed_update_keeps_old_weights_and_version(endpoint):
    """Staged + verify: a bit flipped after the bytes landed (fail point
    subscriber.flip_received, armed in a child process only, firing once) is caught before
    commit: the model keeps the weights it had, `load_weights` does not run, neither vLLM's
    version nor the engine's moves, and the next update succeeds with a new handle. The
    Corruption proves the fault fired (unflipped, verification passes)."""
    env = dict(os.environ, WEIGHTSYNC_FAILPOINTS="subscriber.flip_received=flip*1")
    code = FAILED_UPDATE.format(tests=TESTS, endpoint=endpoint)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "refused:" in r.stdout and "ok" in r.stdout


def test_timed_out_update_keeps_the_committed_step(endpoint):
    """After a committed step, an update for a step nobody publishes times out: the model keeps
    that step and the version stays; the session ends as vLLM's worker ends it."""
    trainer, engine_model = TrainerModel(seed=7), FusedEngineModel()
    engine = create_engine(engine_model)
    client = LocalClient(engine)
    sender = WeightTransferTrainerFactory.trainer_init(
        WeightsyncTrainerInitInfo(rank=0, endpoint=endpoint, timeout=0.5),
        client=client, source=ModuleSource(trainer))
    try:
        sender.send_weights()
        good = engine_state(engine_model)
        client.start_weight_update()
        with pytest.raises(weightsync.Timeout):
            client.update_weights({"step": 2})
        assert not client.active
        assert_same_bytes(engine_state(engine_model), good)
        assert client.weight_version == "1" and engine.weight_version == 1
        assert engine.committed_step == 1
    finally:
        sender.shutdown()
        engine.shutdown()


def test_a_failing_load_weights_leaves_no_layer_on_the_meta_device(endpoint):
    """The step arrived whole but the model's loader refuses a name: the error reaches the
    trainer, no version moves, and the layers vLLM's layerwise reload had moved to the meta
    device are put back (finalized) instead of left there."""
    trainer, engine_model = TrainerModel(seed=8), FusedEngineModel()
    trainer.extra = torch.nn.Linear(2, 2)  # a name the engine's loader does not know, last
    record_layout(engine_model)
    engine = create_engine(engine_model)
    client = LocalClient(engine)
    sender = WeightTransferTrainerFactory.trainer_init(
        WeightsyncTrainerInitInfo(rank=0, endpoint=endpoint),
        client=client, source=ModuleSource(trainer))
    try:
        with pytest.raises(KeyError, match="extra.weight"):
            sender.send_weights()
        assert not any(p.is_meta for p in engine_model.parameters())
        assert not engine._layerwise_open
        assert client.weight_version == "default" and engine.weight_version is None
    finally:
        sender.shutdown()
        engine.shutdown()


def test_engine_sleep_releases_handle_and_buffers(endpoint):
    trainer, engine_model = TrainerModel(seed=5), FusedEngineModel()
    engine = create_engine(engine_model)
    sender = WeightTransferTrainerFactory.trainer_init(
        WeightsyncTrainerInitInfo(rank=0, endpoint=endpoint),
        client=LocalClient(engine), source=ModuleSource(trainer))
    try:
        sender.send_weights()
        held = weightsync.ledger()
        engine.sleep()
        after = weightsync.ledger()
        assert after["mappings"] < held["mappings"] and after["connections"] < held["connections"]
        assert engine.receiver._allocated == []
        train_step(trainer, 2)
        sender.send_weights()
        assert engine.receiver.last_stats.handle_created
        assert_engine_holds(engine_model, trainer)
    finally:
        sender.shutdown()
        engine.shutdown()


def test_vllm_worker_sleep_calls_engine_sleep_first(monkeypatch):
    gpu_worker = pytest.importorskip("vllm.v1.worker.gpu_worker")
    order = []

    def original_sleep(self, level=1):
        order.append(("worker.sleep", level))

    monkeypatch.setattr(gpu_worker.Worker, "sleep", original_sleep)
    engine = create_engine(FusedEngineModel())  # wraps Worker.sleep once
    create_engine(FusedEngineModel())  # ... and not twice
    monkeypatch.setattr(engine, "sleep", lambda: order.append(("engine.sleep",)))
    gpu_worker.Worker.sleep(SimpleNamespace(weight_transfer_engine=engine), level=2)
    gpu_worker.Worker.sleep(SimpleNamespace(weight_transfer_engine=None))
    assert order == [("engine.sleep",), ("worker.sleep", 2), ("worker.sleep", 1)]
    assert gpu_worker.Worker.sleep.__wrapped__ is original_sleep


class _ShardedSource(WeightSource):
    """Two trainer ranks, each the only owner of half the parameters (a pipeline split)."""

    def __init__(self, model, rank):
        self.model, self.rank = model, rank
        names = [n for n, _ in model.named_parameters()]
        self.owner = {n: (0 if i < len(names) // 2 else 1) for i, n in enumerate(names)}

    @functools.cached_property
    def metadata(self):
        return [ParamMeta(n, p.dtype, tuple(p.shape), owners=(self.owner[n],))
                for n, p in self.model.named_parameters()]

    def iter_full(self):
        for n, p in self.model.named_parameters():
            if self.owner[n] == self.rank:
                yield n, p


def test_each_owning_rank_publishes_its_parameters(endpoint):
    trainer, engine_model = TrainerModel(seed=6), FusedEngineModel()
    engine = create_engine(engine_model)
    client = LocalClient(engine)
    with pytest.raises(ValueError, match=r"\{rank\}"):
        WeightTransferTrainerFactory.trainer_init(
            WeightsyncTrainerInitInfo(rank=0, endpoint=endpoint),
            client=client, source=_ShardedSource(trainer, 0))
    template = endpoint + "-rank{rank}"
    rank1 = WeightTransferTrainerFactory.trainer_init(
        WeightsyncTrainerInitInfo(rank=1, endpoint=template), client=None,
        source=_ShardedSource(trainer, 1))
    rank0 = WeightTransferTrainerFactory.trainer_init(
        WeightsyncTrainerInitInfo(rank=0, endpoint=template), client=client,
        source=_ShardedSource(trainer, 0))
    try:
        assert engine.init_info.endpoints == [endpoint + "-rank0", endpoint + "-rank1"]
        for step in (1, 2):
            train_step(trainer, step)
            rank1.send_weights()  # publishes its half; never touches the client
            rank0.send_weights()  # publishes its half and drives the workers
            assert_engine_holds(engine_model, trainer)
        assert client.weight_version == "2"
    finally:
        rank0.shutdown()
        rank1.shutdown()
        engine.shutdown()


def test_bad_init_info_is_refused_where_it_is_built(endpoint):
    with pytest.raises(ValueError, match="mode 'fast'"):
        WeightsyncTrainerInitInfo(rank=0, endpoint=endpoint, mode="fast")
    engine = create_engine(FusedEngineModel())
    with pytest.raises(ValueError, match="update_mode"):
        engine.parse_init_info({"endpoints": [endpoint], "update_mode": "eventually"})
    with pytest.raises(ValueError, match="endpoints"):
        engine.parse_init_info({"endpoints": []})
    with pytest.raises(ValueError, match="step"):
        engine.parse_update_info({"step": -1})
    with pytest.raises(RuntimeError, match="init_weight_transfer_engine"):
        engine.start_weight_update()


ENTRY_POINT = textwrap.dedent("""
    from vllm.plugins import load_general_plugins
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory, WeightTransferTrainerFactory)
    import sys
    assert "weightsync" not in WeightTransferEngineFactory._registry
    assert "weightsync.vllm.engine" not in sys.modules
    load_general_plugins()
    load_general_plugins()  # once per process, and harmless twice
    from weightsync.vllm.plugin import register; register()
    assert "weightsync.vllm.engine" not in sys.modules  # registered lazily, by module path
    from types import SimpleNamespace
    import torch
    from vllm.config.weight_transfer import WeightTransferConfig
    engine = WeightTransferEngineFactory.create_engine(
        WeightTransferConfig(backend="weightsync"),
        SimpleNamespace(parallel_config=None, model_config=None), torch.device("cpu"),
        torch.nn.Linear(2, 2))
    trainer_cls = WeightTransferTrainerFactory._registry["weightsync"]()
    print(type(engine).__name__, trainer_cls.__name__)
""")


def test_entry_point_registers_the_backend_by_name():
    r = subprocess.run([sys.executable, "-c", ENTRY_POINT], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, VLLM_PLUGINS="weightsync"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "WeightsyncWeightTransferEngine WeightsyncTrainerWeightTransferEngine" in r.stdout
