"""The `vllm.general_plugins` entry point (pyproject.toml): vLLM calls `register()` in every
process it starts (API server, engine core, workers), possibly more than once per process.

It registers the "weightsync" backend by module path with both factories, so nothing of
weightsync.vllm.engine (or of the extension) is imported until a process creates the engine.
"""

from weightsync.vllm import BACKEND

ENGINE_MODULE = "weightsync.vllm.engine"


def register() -> None:
    """Registers the worker and trainer engines under "weightsync"; idempotent. A vLLM without
    the weight-transfer API registers nothing (the worker extension still serves it)."""
    try:
        from vllm.distributed.weight_transfer.factory import (
            WeightTransferEngineFactory,
            WeightTransferTrainerFactory,
        )
    except ImportError:
        return
    for factory, class_name in (
        (WeightTransferEngineFactory, "WeightsyncWeightTransferEngine"),
        (WeightTransferTrainerFactory, "WeightsyncTrainerWeightTransferEngine"),
    ):
        if BACKEND in getattr(factory, "_registry", ()):
            continue
        try:
            factory.register_engine(BACKEND, ENGINE_MODULE, class_name)
        except ValueError as e:  # registered meanwhile; any other refusal is not ours to hide
            if "already registered" not in str(e):
                raise
