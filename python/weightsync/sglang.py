"""weightsync for SGLang: a custom weight loader and the trainer-side call that drives it.

Server (every TP rank runs the loader on its own model):

    python -m sglang.launch_server --model-path ... \\
        --custom-weight-loader weightsync.sglang.load_weights

Trainer:

    pub.publish(step)                                     # weightsync.Publisher / ModulePublisher
    weightsync.sglang.update_weights(engine, step, "local://policy")

`update_weights` sends SGLang's `update_weights_from_tensor` a *ticket* instead of tensors: one
uint8 tensor named "weightsync.ticket" holding JSON (the step, the endpoint(s), the options),
with `load_format="weightsync.sglang.load_weights"` and `weight_version=str(step)`. In each TP
rank, SGLang hands the ticket to `load_weights(model, named_tensors)`, which applies that step
with a Subscriber of the model's own (created at the first ticket, reused afterwards) and then
runs `model.load_weights(...)` from the received buffers (or writes the model's parameters in
"direct" mode). SGLang bumps its weight version only when the loader returns, so a failed
transfer (the loader raises; staged: the model untouched) leaves the version as it was.
`release(engine)` sends a ticket that releases every rank's transfer handle and buffers (before
`release_memory_occupation`). docs/engines.md has the lifecycle.
"""

from __future__ import annotations

import inspect
import json
import logging
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from weightsync._receiver import MODES, Receiver, endpoint_list

__all__ = ["LOADER", "TICKET", "load_weights", "release", "ticket", "update_weights"]

LOADER = "weightsync.sglang.load_weights"
TICKET = "weightsync.ticket"
_TICKET_VERSION = 1
_MAX_TICKET_BYTES = 64 << 10

logger = logging.getLogger(__name__)

# One receiver per engine model (per TP rank, each in its process), with the ticket options it
# was made for: a ticket with other ones replaces it.
_receivers: weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple, Receiver]] = (
    weakref.WeakKeyDictionary())


def ticket(step: int | None, endpoints: str | Sequence[str] | None = None, *,
           action: str = "update", mode: str = "load_weights", update_mode: str = "staged",
           timeout: float = 60.0, verify: bool = False) -> list[tuple[str, torch.Tensor]]:
    """The named tensors `update_weights_from_tensor` carries to the loader: one uint8 tensor of
    JSON. No pickle of ours: SGLang serializes its request as it always does."""
    body: dict[str, Any] = {"weightsync": _TICKET_VERSION, "action": action}
    if action == "update":
        body.update(step=step, endpoints=endpoint_list(endpoints), mode=mode,
                    update_mode=update_mode, timeout=timeout, verify=verify)
    _check(body)
    data = json.dumps(body).encode()
    return [(TICKET, torch.frombuffer(bytearray(data), dtype=torch.uint8))]


def _check(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict) or body.get("weightsync") != _TICKET_VERSION:
        raise ValueError(f"weightsync ticket: expected version {_TICKET_VERSION}, got {body!r}")
    action = body.get("action")
    if action == "sleep":
        return body
    if action != "update":
        raise ValueError(f"weightsync ticket: action {action!r}: expected 'update' or 'sleep'")
    step = body.get("step")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        raise ValueError(f"weightsync ticket: step {step!r}: expected a non-negative int or None")
    endpoint_list(body.get("endpoints"))
    if body.get("mode") not in MODES:
        raise ValueError(f"weightsync ticket: mode {body.get('mode')!r}: expected {MODES}")
    if body.get("update_mode") not in ("staged", "in_place"):
        raise ValueError(f"weightsync ticket: update_mode {body.get('update_mode')!r}")
    if not isinstance(body.get("timeout"), (int, float)) or not isinstance(body.get("verify"),
                                                                           bool):
        raise ValueError("weightsync ticket: timeout must be a number and verify a bool")
    return body


def _read_ticket(named_tensors: Any) -> dict[str, Any]:
    pairs = list(named_tensors)
    if len(pairs) != 1 or pairs[0][0] != TICKET:
        names = [name for name, _ in pairs][:4]
        raise ValueError(f"weightsync.sglang.load_weights expects the single tensor '{TICKET}' "
                         f"that weightsync.sglang.update_weights sends, got {names}")
    t = pairs[0][1]
    if t.dtype != torch.uint8 or t.dim() != 1 or t.numel() > _MAX_TICKET_BYTES:
        raise ValueError(f"weightsync ticket: expected a 1-d uint8 tensor of at most "
                         f"{_MAX_TICKET_BYTES} bytes, got {t.dtype} {tuple(t.shape)}")
    return _check(json.loads(bytes(t.cpu().numpy())))


def _model_device(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def load_weights(model: torch.nn.Module, named_tensors: Any) -> None:
    """SGLang's custom loader signature `(model, named_tensors)`: applies the step a ticket
    names into `model` (see the module docstring). Raises on any failure, so SGLang reports
    the update failed and keeps its weight version."""
    body = _read_ticket(named_tensors)
    options, receiver = _receivers.get(model, (None, None))
    if body["action"] == "sleep":
        if receiver is not None:
            receiver.sleep()
        return
    wanted = (tuple(body["endpoints"]), body["mode"], body["update_mode"], body["timeout"])
    if receiver is not None and options != wanted:
        del _receivers[model]
        receiver.close()
        receiver = None
    if receiver is None:
        receiver = Receiver(body["endpoints"], mode=body["mode"],
                            update_mode=body["update_mode"], timeout=body["timeout"],
                            device=_model_device(model))
        _receivers[model] = (wanted, receiver)
    stats = receiver.apply(model, body["step"], body["verify"])
    logger.info("weightsync: step %d applied (%d bytes, %.3f s%s)", stats.step, stats.bytes,
                stats.seconds, ", already held" if stats.up_to_date else "")


def _call(engine: Any, named: list[tuple[str, torch.Tensor]], version: str | None,
          flush_cache: bool) -> Any:
    method = engine.update_weights_from_tensor
    kwargs: dict[str, Any] = {"load_format": LOADER, "flush_cache": flush_cache}
    if version is not None:
        if "weight_version" in inspect.signature(method).parameters:
            kwargs["weight_version"] = version
        else:
            logger.warning("weightsync: this SGLang's update_weights_from_tensor takes no "
                           "weight_version; the step is not recorded as its weight version")
    result = method(named_tensors=named, **kwargs)
    if isinstance(result, tuple) and result and result[0] is False:
        raise RuntimeError(f"SGLang refused the weightsync update: {result[1:]}")
    if isinstance(result, dict) and result.get("success") is False:
        raise RuntimeError(f"SGLang refused the weightsync update: {result.get('message')}")
    return result


def update_weights(engine: Any, step: int, endpoints: str | Sequence[str], *,
                   flush_cache: bool = True, **options: Any) -> Any:
    """Trainer side: makes every TP rank of `engine` (an `sglang.Engine`, or anything with its
    `update_weights_from_tensor(named_tensors, load_format, flush_cache, weight_version)`) apply
    published `step` from `endpoints`, carrying `str(step)` as SGLang's weight version.
    `options`: mode ("load_weights" | "direct"), update_mode ("staged" | "in_place"), timeout,
    verify. Raises when SGLang reports the update failed."""
    return _call(engine, ticket(step, endpoints, **options), str(step), flush_cache)


def release(engine: Any) -> Any:
    """Releases every TP rank's transfer handle and received buffers (call before
    `engine.release_memory_occupation()`); the next update prepares again."""
    return _call(engine, ticket(None, action="sleep"), None, False)
