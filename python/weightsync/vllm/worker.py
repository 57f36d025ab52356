"""weightsync for vLLM without the weight-transfer API: a worker extension driven by
`collective_rpc` (the pattern of vLLM's RLHF examples before `vllm.distributed.weight_transfer`).

    llm = LLM(model=..., worker_extension_cls="weightsync.vllm.worker.WorkerExtension")
    llm.collective_rpc("weightsync_init", args=("local://policy",))
    ...                                                    # trainer: pub.publish(step)
    llm.collective_rpc("weightsync_update", args=(step,))  # -> [step] per worker
    llm.collective_rpc("weightsync_sleep")                 # before llm.sleep()

Each worker holds one weightsync Receiver (weightsync/_receiver.py): lazy prepare at the first
update, the handle reused afterwards, rebuilt after a failure, released by weightsync_sleep.
vLLM mixes the extension into its worker class, so `self.model_runner` and `self.device` are the
worker's. Imports nothing of vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from weightsync._receiver import Receiver


class WorkerExtension:
    """Methods vLLM adds to each worker (`worker_extension_cls`)."""

    def weightsync_init(self, endpoints: str | Sequence[str], mode: str = "load_weights",
                        update_mode: str = "staged", timeout: float = 60.0,
                        verify: bool = False, buffer_device: str | None = None) -> None:
        """A Subscriber for the trainer's endpoint(s); connects at the first update. Calling it
        again replaces the previous one."""
        self.weightsync_close()
        device = "cpu" if buffer_device == "cpu" else getattr(self, "device", None)
        self._weightsync = Receiver(endpoints, mode=mode, update_mode=update_mode,
                                    timeout=timeout, verify=verify, device=device)

    def _weightsync_receiver(self) -> Receiver:
        receiver = getattr(self, "_weightsync", None)
        if receiver is None:
            raise RuntimeError("weightsync: call collective_rpc('weightsync_init', ...) first")
        return receiver

    def weightsync_update(self, step: int | None = None, verify: bool | None = None) -> int:
        """Applies `step` (None: the latest) to the worker's model; returns the step now held.
        load_weights mode: the whole step arrives before `model.load_weights` runs."""
        model = self.model_runner.model
        stats = self._weightsync_receiver().apply(model, step, verify)
        return stats.step

    def weightsync_sleep(self) -> None:
        """Releases the transfer handle and the received buffers (before `LLM.sleep()`)."""
        receiver = getattr(self, "_weightsync", None)
        if receiver is not None:
            receiver.sleep()

    def weightsync_close(self) -> None:
        receiver: Any = getattr(self, "_weightsync", None)
        self._weightsync = None
        if receiver is not None:
            receiver.close()
