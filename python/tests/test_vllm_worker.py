"""weightsync.vllm.worker.WorkerExtension: the receiving side for vLLM without the
weight-transfer API, called the way `collective_rpc` calls a worker (vLLM mixes the extension
into its worker class, which has `model_runner.model` and `device`). Needs torch, not vLLM."""

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import weightsync  # noqa: E402
from _engine_models import FusedEngineModel, TrainerModel, assert_engine_holds  # noqa: E402
from _engine_models import train_step  # noqa: E402
from weightsync.torch import ModulePublisher  # noqa: E402
from weightsync.vllm.worker import WorkerExtension  # noqa: E402


class Worker(WorkerExtension):
    """What vLLM's worker class looks like to the extension."""

    def __init__(self, model):
        self.model_runner = SimpleNamespace(model=model)
        self.device = torch.device("cpu")


def collective_rpc(workers, method, args=(), kwargs=None):
    return [getattr(w, method)(*args, **(kwargs or {})) for w in workers]


def test_collective_rpc_updates_every_worker(endpoint):
    trainer = TrainerModel(seed=1)
    workers = [Worker(FusedEngineModel()), Worker(FusedEngineModel())]  # two TP ranks' worth
    with weightsync.Publisher(endpoint) as pub:
        publisher = ModulePublisher(pub, dict(trainer.named_parameters()))
        with pytest.raises(RuntimeError, match="weightsync_init"):
            collective_rpc(workers, "weightsync_update", args=(1,))
        collective_rpc(workers, "weightsync_init", args=(endpoint,), kwargs={"verify": True})
        for step in (1, 2, 3):
            train_step(trainer, step)
            publisher.publish(step)
            assert collective_rpc(workers, "weightsync_update", args=(step,)) == [step, step]
            for w in workers:
                assert_engine_holds(w.model_runner.model, trainer)
        held = weightsync.ledger()["mappings"]
        collective_rpc(workers, "weightsync_sleep")
        assert weightsync.ledger()["mappings"] < held
        train_step(trainer, 4)
        publisher.publish(4)
        assert collective_rpc(workers, "weightsync_update") == [4, 4]  # the latest
        assert workers[0]._weightsync.last_stats.handle_created
        collective_rpc(workers, "weightsync_close")
        collective_rpc(workers, "weightsync_close")  # idempotent
