"""The "weightsync" backend of vLLM's weight-transfer API (`vllm.distributed.weight_transfer`).

Inference side, `WeightsyncWeightTransferEngine` (one per vLLM worker; vLLM creates it when
`--weight-transfer-config '{"backend":"weightsync"}'` is set, the plugin having registered it):

  init_transfer_engine(info)   a Subscriber for the trainer's endpoint(s); connects at the first
                               update (lazy prepare)
  start_weight_update()        opens the session; touches neither the model nor the transfer
  update_weights({"step": s})  one update = one published step: the whole step arrives (staged:
                               into a shadow buffer, digest-checked with verify) before anything
                               of the model changes; then, by default, `model.load_weights(...)`
                               from the received buffers inside vLLM's layerwise reload; in
                               "direct" mode the step is written into the model's own parameters
                               (fused qkv/gate_up and this TP rank's slices as regions: only its
                               bytes move)
  finish_weight_update()       finalizes the layerwise reload; the step becomes this engine's
                               `weight_version`; the trainer then sets vLLM's weight version
  Worker.sleep()               Subscriber.sleep() first: the transfer handle and the received
                               buffers are released; the next update prepares again
  shutdown()                   closes the Subscriber

Trainer side, `WeightsyncTrainerWeightTransferEngine` over a vLLM `WeightSource`
(`WeightTransferTrainerFactory.trainer_init(WeightsyncTrainerInitInfo(rank=r, ...), client=...,
source=ModuleSource(model))`): every trainer rank publishes the parameters whose first owner it
is (replicated ones: rank 0) from a `weightsync.Publisher` of its own, as full tensors
(`iter_full`, vLLM's contract: DTensor shards are gathered there); rank 0 drives
the engine through the client and sets vLLM's weight version to the step only after every
worker's update succeeded.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

import weightsync
from weightsync._receiver import MODES, Receiver, endpoint_list
from weightsync.torch import ModulePublisher
from weightsync.vllm import BACKEND
from weightsync.vllm.plugin import register

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed.weight_transfer.base import VLLMWeightSyncClient

logger = logging.getLogger(__name__)

# The trainer process imports this module to build its init info; registering here spares it a
# plugin load (idempotent, by module path).
register()

UPDATE_MODES = ("staged", "in_place")


def _check_choice(what: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{what} {value!r}: expected one of {', '.join(choices)}")


@dataclass
class ApplyOptions:
    """How a worker applies a step; part of the worker's init info and of the trainer's (which
    passes them on).

    mode: "load_weights" (receive into buffers, then the model's own loader) or "direct" (the
      model's parameters are the destinations; names, dtypes and shapes must be the engine's).
    update_mode: "staged" (whole or nothing) or "in_place" (no shadow buffer).
    timeout: seconds for one update, end to end. verify: xxHash3 digests before commit.
    layerwise: run load_weights inside vLLM's layerwise reload; None: when vLLM recorded the
      model's layout at load (every model vLLM builds), not for a module built otherwise.
    buffer_device: where load_weights-mode buffers live: None (the model's device) or "cpu".
    lineage_policy: "follow" or "strict" (docs/python.md, trainer restarts).
    """

    mode: str = "load_weights"
    update_mode: str = "staged"
    timeout: float = 60.0
    verify: bool = False
    layerwise: bool | None = None
    buffer_device: str | None = None
    lineage_policy: str = "follow"

    def check_options(self) -> None:
        _check_choice("mode", self.mode, MODES)
        _check_choice("update_mode", self.update_mode, UPDATE_MODES)
        _check_choice("lineage_policy", self.lineage_policy, ("follow", "strict"))
        if self.buffer_device not in (None, "cpu"):
            raise ValueError(f"buffer_device {self.buffer_device!r}: expected None or 'cpu'")

    def options(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(ApplyOptions)}


@dataclass
class WeightsyncInitInfo(WeightTransferInitInfo, ApplyOptions):
    """What a worker needs to receive: the trainer's endpoint(s), one per publishing trainer
    rank ("local://NAME", "tcp://HOST:PORT"), and how to apply a step (ApplyOptions)."""

    endpoints: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.endpoints = endpoint_list(self.endpoints)
        self.check_options()


@dataclass
class WeightsyncUpdateInfo(WeightTransferUpdateInfo):
    """One update: the published step to apply (verify: override the init's for this one)."""

    step: int
    verify: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.step, int) or isinstance(self.step, bool) or self.step < 0:
            raise ValueError(f"step {self.step!r}: expected a non-negative int")


def _tensor_parallel() -> tuple[int, int]:
    """(size, rank) of this worker's tensor-parallel group; (1, 0) outside one."""
    from vllm.distributed import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 1, 0
    return (parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_tensor_model_parallel_rank())


def _layerwise_recorded(model: torch.nn.Module) -> bool:
    """vLLM records every model's layout for reloading when it builds it."""
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    return any(m in LAYERWISE_INFO for m in model.modules())


class WeightsyncWeightTransferEngine(
        WeightTransferEngine[WeightsyncInitInfo, WeightsyncUpdateInfo]):
    """Receives published steps into one vLLM worker's model (module docstring)."""

    init_info_cls = WeightsyncInitInfo
    update_info_cls = WeightsyncUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: WeightTransferConfig, vllm_config: VllmConfig,
                 device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.receiver: Receiver | None = None
        self.init_info: WeightsyncInitInfo | None = None
        self.weight_version: int | None = None  # the last step finished here
        self._pending_step: int | None = None
        self._layerwise_open = False
        _hook_worker_sleep()

    def init_transfer_engine(self, init_info: WeightsyncInitInfo) -> None:
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None
        device = "cpu" if init_info.buffer_device == "cpu" else self.device
        self.receiver = Receiver(init_info.endpoints, mode=init_info.mode,
                                 update_mode=init_info.update_mode, timeout=init_info.timeout,
                                 verify=init_info.verify, lineage_policy=init_info.lineage_policy,
                                 device=device, tp=_tensor_parallel())
        self.init_info = init_info

    def _receiver(self) -> Receiver:
        if self.receiver is None:
            raise RuntimeError("weightsync: init_weight_transfer_engine() has not been called "
                               "(or shutdown() was)")
        return self.receiver

    def start_weight_update(self) -> None:
        self._receiver()
        self._pending_step = None

    def _layerwise(self) -> bool:
        assert self.init_info is not None
        if self.init_info.layerwise is None:
            return _layerwise_recorded(self.model)
        return self.init_info.layerwise

    def _load(self, weights: Any) -> None:
        if self._layerwise() and not self._layerwise_open:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)
            self._layerwise_open = True
        from vllm.model_executor.model_loader.mtp_validation import (
            disable_mtp_completeness_check,
        )

        try:
            with disable_mtp_completeness_check():
                self.model.load_weights(weights)
        except BaseException:
            # The bytes arrived whole; the model's own loader failed (a name it does not know,
            # a shape). Put the layers vLLM moved to the meta device back rather than leave
            # them there; layers the loader had finished keep the new step.
            logger.error("weightsync: model.load_weights failed after the step arrived; the "
                         "model may hold part of it")
            if self._layerwise_open:
                from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

                self._layerwise_open = False
                try:
                    finalize_layerwise_reload(self.model, self.model_config)
                except Exception:
                    logger.exception("weightsync: finalizing the layerwise reload failed too")
            raise

    def receive_weights(self, update_info: WeightsyncUpdateInfo) -> None:
        stats = self._receiver().apply(self.model, update_info.step, update_info.verify,
                                       load=self._load)
        self._pending_step = stats.step

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """One update. The base class would end with `torch.accelerator.synchronize()`, which
        fails where there is no accelerator; weightsync's update returns with the bytes in
        place, so only the loader's own device work needs the wait."""
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type != "cpu":
            torch.accelerator.synchronize()

    def finish_weight_update(self) -> None:
        if self._layerwise_open:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            self._layerwise_open = False
            finalize_layerwise_reload(self.model, self.model_config)
        if self._pending_step is not None:
            self.weight_version = self._pending_step
            self._pending_step = None

    @property
    def committed_step(self) -> int:
        """The step the Subscriber holds (-1 before the first update)."""
        return -1 if self.receiver is None else self.receiver.committed_step

    def sleep(self) -> None:
        """Releases the transfer handle and the received buffers (vLLM's sleep calls it)."""
        if self.receiver is not None:
            self.receiver.sleep()

    def shutdown(self) -> None:
        if self.receiver is not None:
            receiver, self.receiver = self.receiver, None
            receiver.close()


def _hook_worker_sleep() -> None:
    """Makes vLLM's `Worker.sleep()` release weightsync's handle and buffers first.

    vLLM's sleep frees the memory of the weights and the KV cache but does not tell the
    weight-transfer engine; without this, the received buffers (a model's size, on the GPU by
    default) would stay allocated through the sleep. Wraps the method once, only when vLLM's
    worker module is already imported (the engine is created by that worker); a vLLM whose
    worker has no `sleep` is left alone.
    """
    module = sys.modules.get("vllm.v1.worker.gpu_worker")
    worker = getattr(module, "Worker", None)
    original = getattr(worker, "sleep", None)
    if original is None or getattr(original, "_weightsync_hook", False):
        return

    @functools.wraps(original)
    def sleep(self: Any, *args: Any, **kwargs: Any) -> Any:
        engine = getattr(self, "weight_transfer_engine", None)
        if isinstance(engine, WeightsyncWeightTransferEngine):
            engine.sleep()
        return original(self, *args, **kwargs)

    sleep._weightsync_hook = True  # type: ignore[attr-defined]
    worker.sleep = sleep


# ---- trainer side ----


@dataclass
class WeightsyncTrainerInitInfo(TrainerInitInfo, ApplyOptions):
    """Trainer-side init info. `endpoint` is where this rank's Publisher listens; with several
    publishing ranks it must contain "{rank}" ("local://policy-{rank}"). The ApplyOptions go to
    the workers; slots, lineage and resume_from_step to the Publisher (docs/python.md)."""

    backend: ClassVar[str] = BACKEND
    endpoint: str = "local://weightsync-vllm"
    slots: int = 2
    lineage: str = ""
    resume_from_step: int = -1

    def __post_init__(self) -> None:
        self.check_options()  # refuse bad options here, not in every worker

    def engine_init_info(self, endpoints: list[str]) -> dict[str, Any]:
        """The workers' init info (what init_weight_transfer_engine receives)."""
        return {"endpoints": endpoints, **self.options()}


def _publishing_rank(meta: ParamMeta) -> int:
    """Who publishes a parameter: its first owner; every rank's (replicated) ones: rank 0."""
    return meta.owners[0] if meta.owners else 0


class WeightsyncTrainerWeightTransferEngine(
        TrainerWeightTransferEngine[WeightsyncTrainerInitInfo]):
    """Publishes a WeightSource step by step and drives the workers (module docstring)."""

    init_info_cls = WeightsyncTrainerInitInfo

    def __init__(self, *, client: VLLMWeightSyncClient, source: WeightSource,
                 init_info: WeightsyncTrainerInitInfo) -> None:
        super().__init__(client=client, source=source, is_sender=init_info.is_sender,
                         rank=init_info.rank)
        ranks = sorted({_publishing_rank(m) for m in source.metadata})
        if len(ranks) > 1 and "{rank}" not in init_info.endpoint:
            raise ValueError(
                f"endpoint '{init_info.endpoint}': trainer ranks {ranks} each publish part of "
                "the model, so the endpoint needs a '{rank}' placeholder (one Publisher per rank)")
        self.endpoints = [init_info.endpoint.replace("{rank}", str(r)) for r in ranks]
        self._mine = {m.name for m in source.metadata if _publishing_rank(m) == self.rank}
        self.step = init_info.resume_from_step if init_info.resume_from_step >= 0 else 0
        self.publisher: ModulePublisher | None = None
        if self._mine:
            self.publisher = ModulePublisher(
                weightsync.Publisher(init_info.endpoint.replace("{rank}", str(self.rank)),
                                     slots=init_info.slots, timeout=init_info.timeout,
                                     lineage=init_info.lineage,
                                     resume_from_step=init_info.resume_from_step),
                pairs=self._pairs)

    @classmethod
    def trainer_init(cls, init_info: WeightsyncTrainerInitInfo, *,
                     client: VLLMWeightSyncClient,
                     source: WeightSource | None = None) -> WeightsyncTrainerWeightTransferEngine:
        if source is None:
            raise ValueError("the weightsync trainer engine publishes a WeightSource; pass "
                             "source= (e.g. ModuleSource(model))")
        if not source.implements_iter_full():
            raise TypeError(f"weightsync publishes full tensors, but {type(source).__name__} "
                            "does not implement iter_full()")
        engine = cls(client=client, source=source, init_info=init_info)
        if engine.is_sender:
            engine.client.init_weight_transfer_engine(init_info.engine_init_info(engine.endpoints))
        return engine

    def _pairs(self) -> Iterator[tuple[str, torch.Tensor]]:
        # Every rank iterates the whole source: a DTensor's full_tensor() is a collective among
        # its owners, so skipping names would leave the others waiting.
        assert self.source is not None
        for name, tensor in self.source.iter_full():
            if name in self._mine:
                yield name, tensor

    def send_weights(self, step: int | None = None) -> int:
        """Publishes `step` (default: the last one + 1) on every rank; the sender then drives
        start / update / finish and sets vLLM's weight version to str(step) after every worker
        applied it. A failed update raises here, and vLLM's version stays the previous one."""
        step = self.step + 1 if step is None else step
        if self.publisher is not None:
            self.publisher.publish(step)
        else:
            for _ in self._pairs():
                pass
        self.step = step
        if self.is_sender:
            self.client.start_weight_update()
            self.client.update_weights({"step": step})
            self.client.finish_weight_update(weight_version=str(step))
        return step

    def shutdown(self) -> None:
        if self.publisher is not None:
            publisher, self.publisher = self.publisher, None
            publisher.publisher.close()
