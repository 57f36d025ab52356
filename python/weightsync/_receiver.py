"""The engine side shared by the vLLM backend, the vLLM worker extension and the SGLang loader:
one Subscriber per engine model, applying one published step per call.

Two ways into the model (docs/engines.md):
  * "load_weights" (default): the subscriber writes buffers of its own (Subscriber.allocate, on
    the model's device unless told otherwise), and the engine's loader takes them from there
    (`model.load_weights(pairs)`: fused qkv / gate_up stacking, TP sharding, quantization are
    the engine's business). Staged: a failed transfer leaves the buffers, so the model, as they
    were; the loader runs only after the whole step arrived (and verified).
  * "direct": the model's own parameters are the subscriber's destinations
    (weightsync.torch.register_module), written in place with no copy of the model's size;
    needs the published names and dtypes to be the engine's, its fused parameters named by
    the model's `packed_modules_mapping` (qkv_proj from q/k/v, gate_up_proj from gate/up) and
    its tensor-parallel slices recognisable from the shapes (`tp`): then only this rank's bytes
    move, as regions (docs/regions.md).

Lifecycle: nothing connects until the first apply() (lazy prepare); the Subscriber's transfer
handle is reused by every later step; a failed step destroys it and the next one prepares again
(handle_created); sleep() releases the handle and, in load_weights mode, the buffers (freed when
the engine drops its references); close() releases everything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import weightsync

MODES = ("load_weights", "direct")


def endpoint_list(endpoints: str | Sequence[str]) -> list[str]:
    if isinstance(endpoints, str):
        endpoints = [endpoints]
    out = list(endpoints)
    if not out or not all(isinstance(e, str) and e for e in out):
        raise ValueError(f"endpoints: expected a non-empty str or list of str, got {endpoints!r}")
    return out


def device_arg(device: Any) -> str | None:
    """The `device=` of Subscriber.allocate for a torch.device / str / None."""
    if device is None:
        return None
    text = str(device)
    if text == "cpu":
        return None
    if text == "cuda":
        import torch

        return f"cuda:{torch.cuda.current_device()}"
    return text


class Receiver:
    """One Subscriber and the buffers it fills, for one engine model."""

    def __init__(self, endpoints: str | Sequence[str], *, mode: str = "load_weights",
                 update_mode: str = "staged", timeout: float = 60.0, verify: bool = False,
                 lineage_policy: str = "follow", device: Any = None,
                 tp: tuple[int, int] = (1, 0)):
        if mode not in MODES:
            raise ValueError(f"mode '{mode}': expected one of {', '.join(MODES)}")
        self.endpoints = endpoint_list(endpoints)
        self.mode = mode
        self.device = device_arg(device)
        self.tp = tp  # direct mode: (tensor-parallel size, this rank)
        self.subscriber = weightsync.Subscriber(
            self.endpoints if len(self.endpoints) > 1 else self.endpoints[0], mode=update_mode,
            timeout=timeout, verify=verify, lineage_policy=lineage_policy)
        self._allocated: list[str] = []  # load_weights mode: names of allocate()d buffers
        self._registered = False  # direct mode: the model's tensors are the destinations
        self.last_stats: weightsync.UpdateStats | None = None

    @property
    def committed_step(self) -> int:
        return self.subscriber.committed_step

    def _prepare_buffers(self) -> None:
        # Tied weights (one tensor the publisher serves under two names) get one buffer: the
        # alias is allocated over its original's, yielded under both names, moved once.
        for tensor in self.subscriber.published_manifest():
            name, dtype, shape = tensor
            self.subscriber.allocate(name, dtype, shape, framework="torch", device=self.device,
                                     alias_of=tensor.alias_of)
            self._allocated.append(name)

    def receive(self, step: int | None = None, verify: bool | None = None) -> weightsync.Received:
        """load_weights mode: applies `step` to the buffers; returns them with their stats."""
        if self.mode != "load_weights":
            raise RuntimeError("receive() is the load_weights mode's; use update() in direct mode")
        if not self._allocated:
            self._prepare_buffers()
        received = self.subscriber.receive(step=step, verify=verify)
        self.last_stats = received.stats
        return received

    def update(self, model: Any, step: int | None = None,
               verify: bool | None = None) -> weightsync.UpdateStats:
        """direct mode: applies `step` into `model`'s own tensors."""
        if self.mode != "direct":
            raise RuntimeError("update() is the direct mode's; use receive() in load_weights mode")
        if not self._registered:
            from weightsync.torch import register_module

            try:
                register_module(self.subscriber, model, buffers=False, tp=self.tp)
            except weightsync.InvalidArgument as e:
                raise weightsync.InvalidArgument(
                    f"mode='direct' writes the model's own parameters, so every one must be a "
                    f"published tensor, a stacking of them (packed_modules_mapping) or this "
                    f"rank's slice of one: {e}. Use mode='load_weights' (the engine's loader maps "
                    "checkpoint names, stacks fused projections and shards)") from None
            self._registered = True
        self.last_stats = self.subscriber.update(step=step, verify=verify)
        return self.last_stats

    def apply(self, model: Any, step: int | None = None, verify: bool | None = None,
              load: Any = None) -> weightsync.UpdateStats:
        """One step into `model`: direct, or receive() then `load(pairs)` (default
        `model.load_weights`) unless the step was already there (up_to_date)."""
        if self.mode == "direct":
            return self.update(model, step, verify)
        received = self.receive(step, verify)
        if not received.stats.up_to_date:
            (load or model.load_weights)(received)
        return received.stats

    def sleep(self) -> None:
        """Releases the transfer handle and, in load_weights mode, forgets the buffers (their
        memory is freed once nothing else references them); the next step prepares again.
        In direct mode, call it before the model's memory is released or moved."""
        self.subscriber.sleep()
        if self._allocated:
            self.subscriber.unregister(self._allocated)
            self._allocated = []
        self._registered = False

    def close(self) -> None:
        self._allocated = []
        self._registered = False
        self.subscriber.close()
