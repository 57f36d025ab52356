"""weightsync.sglang: the custom weight loader, called as SGLang calls one, and the trainer-side
call that drives it. Needs torch, not SGLang: `FakeSGLang` does what SGLang does with an
`update_weights_from_tensor` request (serialize the named tensors once per TP rank; in each rank
deserialize, move them to the rank's device, resolve `load_format` among the
`--custom-weight-loader` paths by import and call it as `loader(model, named_tensors)`; bump the
weight version only when that returned)."""

import importlib
import pickle

import pytest

torch = pytest.importorskip("torch")

import weightsync  # noqa: E402
import weightsync.sglang as wsg  # noqa: E402
from _engine_models import (  # noqa: E402
    FusedEngineModel,
    TrainerModel,
    assert_engine_holds,
    assert_same_bytes,
    engine_state,
    train_step,
)
from weightsync.torch import ModulePublisher  # noqa: E402


def dynamic_import(path):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


class FakeSGLang:
    """sglang.Engine's update_weights_from_tensor as the ModelRunner of each TP rank runs it."""

    def __init__(self, tp_size=2, custom_weight_loader=(wsg.LOADER,)):
        self.models = [FusedEngineModel() for _ in range(tp_size)]
        self.custom_weight_loader = list(custom_weight_loader)
        self.weight_version = "default"

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True,
                                   weight_version=None):
        serialized = [pickle.dumps(named_tensors) for _ in self.models]
        try:
            for rank, model in enumerate(self.models):
                named = [(n, t.to("cpu")) for n, t in pickle.loads(serialized[rank])]
                if load_format not in self.custom_weight_loader:
                    raise NotImplementedError(f"Unknown load_format={load_format}")
                dynamic_import(load_format)(model, named)
        except Exception as e:
            return False, f"Failed to update weights: {e}"
        if weight_version is not None:
            self.weight_version = weight_version
        return True, "Success"


def states_equal(engine, trainer):
    for model in engine.models:
        assert_engine_holds(model, trainer)


def test_five_updates_bit_exact_with_the_step_as_weight_version(endpoint):
    trainer, engine = TrainerModel(seed=1), FakeSGLang()
    with weightsync.Publisher(endpoint) as pub:
        publisher = ModulePublisher(pub, dict(trainer.named_parameters()))
        for step in range(1, 6):
            train_step(trainer, step)
            publisher.publish(step)
            assert wsg.update_weights(engine, step, endpoint, verify=True)[0]
            states_equal(engine, trainer)
            assert engine.weight_version == str(step)
        # Each rank has its own subscriber, prepared once.
        receivers = [wsg._receivers[m][1] for m in engine.models]
        assert len({id(r) for r in receivers}) == 2
        assert all(r.last_stats.prepare_count == 1 for r in receivers)
        held = weightsync.ledger()["mappings"]
        wsg.release(engine)
        assert weightsync.ledger()["mappings"] < held
        assert engine.weight_version == "5"  # a release is no version
        train_step(trainer, 6)
        publisher.publish(6)
        wsg.update_weights(engine, 6, endpoint)
        states_equal(engine, trainer)
        assert all(r.last_stats.handle_created for r in receivers)
    for m in engine.models:
        wsg._receivers[m][1].close()


def test_tied_weights_reach_the_loader_under_both_names_and_move_once(endpoint):
    # A trainer publishing its module (state_dict: the embedding also as lm_head.weight, copied
    # once). The loader path mirrors published_manifest(): the alias shares its original's buffer,
    # the loader sees both names, and the bytes cross once.
    trainer, engine = TrainerModel(seed=3), FakeSGLang(tp_size=1)
    unique = sum(p.numel() * p.element_size() for p in trainer.parameters())  # tied once
    with weightsync.Publisher(endpoint) as pub:
        publisher = ModulePublisher(pub, trainer)
        publisher.publish(1)
        assert "lm_head.weight" in publisher.names
        assert wsg.update_weights(engine, 1, endpoint, verify=True)[0]
        states_equal(engine, trainer)
        model = engine.models[0]
        assert {"lm_head.weight", "model.embed_tokens.weight"} <= set(model.loaded[-1])
        receiver = wsg._receivers[model][1]
        assert receiver.last_stats.bytes == unique, "the tied embedding crossed twice"
        receiver.close()


def test_failed_update_keeps_weights_and_version(endpoint):
    trainer, engine = TrainerModel(seed=2), FakeSGLang(tp_size=1)
    with weightsync.Publisher(endpoint) as pub:
        publisher = ModulePublisher(pub, dict(trainer.named_parameters()))
        publisher.publish(1)
        wsg.update_weights(engine, 1, endpoint)
        good = engine_state(engine.models[0])
        with pytest.raises(RuntimeError, match="step 2.*deadline"):
            wsg.update_weights(engine, 2, endpoint, timeout=0.5)  # never published
        assert engine.weight_version == "1"
        assert_same_bytes(engine_state(engine.models[0]), good)
        assert engine.models[0].loaded[-1] == engine.models[0].loaded[0]  # not loaded again
    wsg._receivers[engine.models[0]][1].close()


def test_loader_must_be_listed_and_tickets_are_checked(endpoint):
    engine = FakeSGLang(tp_size=1, custom_weight_loader=())
    with pytest.raises(RuntimeError, match="Unknown load_format"):
        wsg.update_weights(engine, 1, endpoint)
    model = FusedEngineModel()
    with pytest.raises(ValueError, match="expects the single tensor"):
        wsg.load_weights(model, [("model.norm.weight", torch.zeros(16))])
    with pytest.raises(ValueError, match="uint8"):
        wsg.load_weights(model, [(wsg.TICKET, torch.zeros(4))])
    with pytest.raises(ValueError, match="mode"):
        wsg.ticket(1, endpoint, mode="fast")
    bad = b'{"weightsync": 1, "action": "update", "step": -3}'
    with pytest.raises(ValueError, match="step"):
        wsg.load_weights(model, [(wsg.TICKET, torch.frombuffer(bytearray(bad), dtype=torch.uint8))])
    assert model not in wsg._receivers
