"""PyTorch modules and state dicts on both sides of a weightsync transfer.

Trainer::

    import weightsync, weightsync.torch
    pub = weightsync.torch.ModulePublisher(weightsync.Publisher("local://policy"), model)
    for step in range(1, 1001):
        train(model)
        pub.publish(step)

Engine::

    sub = weightsync.Subscriber("local://policy")
    weightsync.torch.register_module(sub, model)      # the module's own tensors, written in place
    sub.update()
    # or, with a loader of its own:  weightsync.torch.load_into(model, received_pairs)

What is published (`module_tensors`): every entry of `module.state_dict()` -- parameters under
every alias (tied weights: the C++ publisher copies an exact alias once and serves it under each
name), persistent buffers unless `buffers=False` -- detached (parameters that require grad share
their storage with the detached view). Registered tensors are never copied by this module: they
must be contiguous, and a non-contiguous one is refused with what to do.

FSDP2 / DTensor parameters: each rank publishes its local shard as the region of the full tensor
it is (`dtensors="regions"`, the default; docs/regions.md): nothing is gathered, and a
subscriber listing every rank's publisher receives the full tensor, or only its own slice, from
the ranks holding it. Shard(dim) and Replicate placements map to regions; Partial and strided
shards (FSDP2 over TP) do not, and are refused naming the tensor -- `dtensors="gather"` publishes
full tensors instead (`full_tensor()`, a collective every rank of the mesh must join, into a
staging tensor of the publisher's own at each `publish()`).

docs/engines.md describes how the vLLM and SGLang integrations use this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

import weightsync

__all__ = [
    "ModulePublisher",
    "dtype_name",
    "load_into",
    "module_tensors",
    "register_module",
]

NameMap = Mapping[str, "str | None"] | Callable[[str], "str | None"]


def dtype_name(dtype: torch.dtype) -> str:
    """The weightsync element type of a torch dtype ('bfloat16', 'float8_e4m3fn', ...)."""
    name = str(dtype).rsplit(".", 1)[-1]
    if name not in _WEIGHTSYNC_DTYPES:
        raise weightsync.InvalidArgument(
            f"torch dtype {dtype} has no weightsync element type (weightsync moves "
            f"{', '.join(_WEIGHTSYNC_DTYPES)}); convert it or pass raw bits with dtypes=")
    return name


_WEIGHTSYNC_DTYPES = tuple(weightsync.dtypes())


def _is_dtensor(t: Any) -> bool:
    # Duck-typed (as vLLM's materialize_full_tensor does): importing torch.distributed.tensor
    # costs time and fails on builds without distributed support.
    return callable(getattr(t, "full_tensor", None)) and hasattr(t, "device_mesh")


def _check_contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise weightsync.InvalidArgument(
            f"tensor '{name}' is not contiguous (shape {tuple(t.shape)}, strides {t.stride()}): "
            "weightsync registers a tensor's memory and never copies it, so it must be "
            "contiguous. Make the model's tensor contiguous once (e.g. "
            "`param.data = param.data.contiguous()` before creating the publisher) or publish "
            "a contiguous copy you keep and refresh yourself")


def module_tensors(source: torch.nn.Module | Mapping[str, torch.Tensor], *,
                   buffers: bool = True) -> dict[str, torch.Tensor]:
    """What a trainer publishes from `source`, by name.

    `source` is an `nn.Module` (its `state_dict()`: parameters under every alias of tied weights,
    persistent buffers) or a mapping name -> tensor (a state dict). `buffers=False` leaves the
    module's buffers out. Tensors are detached (storage shared); DTensors are returned as they
    are (`ModulePublisher` gathers them).
    """
    if isinstance(source, torch.nn.Module):
        entries = source.state_dict(keep_vars=True)
        if not buffers:
            buffer_names = {n for n, _ in source.named_buffers(remove_duplicate=False)}
            entries = {n: t for n, t in entries.items() if n not in buffer_names}
    elif isinstance(source, Mapping):
        entries = source
    else:
        raise TypeError(f"expected a torch.nn.Module or a mapping name -> tensor, got "
                        f"{type(source).__name__}")
    out = {}
    for name, t in entries.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {type(name).__name__}")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"'{name}': expected a torch.Tensor, got {type(t).__name__}")
        out[name] = t if _is_dtensor(t) else t.detach()
    return out


class _Entry:
    """One published name: either a registered tensor (its address checked at every publish) or
    a staging tensor of the publisher's own that each publish() copies into."""

    __slots__ = ("name", "staging", "address", "shape", "dtype")

    def __init__(self, name, staging, address, shape, dtype):
        self.name, self.staging, self.address = name, staging, address
        self.shape, self.dtype = shape, dtype


class ModulePublisher:
    """Publishes the tensors of a module, a state dict or a `pairs()` callable through a
    `weightsync.Publisher`.

    * `source` an `nn.Module` or a mapping: `module_tensors(source, buffers=buffers)`; plain
      tensors are registered (publish() copies them into the publisher's versions, nothing else);
      DTensors publish their local shard as a region (`dtensors="regions"`) or are gathered into
      staging tensors at each publish() (`dtensors="gather"`).
    * `pairs` a callable returning `(name, tensor)` pairs, called once per publish() (e.g. a
      vLLM `WeightSource.iter_full`): `nn.Parameter`s are registered; any other tensor is taken
      for one materialized per call (a gather, a cast) and copied into a staging tensor.

    Registration happens at the first publish(), from what the source yields then. Every later
    publish() checks that the same names come back and that registered tensors still live at the
    same address (a `module.to()` or a replaced Parameter would otherwise publish stale memory):
    a mismatch is an `InvalidArgument` naming the tensor, and nothing is published.
    """

    def __init__(self, publisher: weightsync.Publisher,
                 source: torch.nn.Module | Mapping[str, torch.Tensor] | None = None, *,
                 buffers: bool = True,
                 pairs: Callable[[], Iterable[tuple[str, torch.Tensor]]] | None = None,
                 dtensors: str = "regions"):
        if (source is None) == (pairs is None):
            raise TypeError("pass exactly one of `source` (a module or state dict) and `pairs`")
        if dtensors not in ("regions", "gather"):
            raise ValueError(f"dtensors={dtensors!r}: expected 'regions' or 'gather'")
        self._dtensors = dtensors
        self.publisher = publisher
        self._source = source
        self._buffers = buffers
        self._pairs = pairs
        self._entries: dict[str, _Entry] | None = None
        self._host_staging = False

    @property
    def names(self) -> list[str]:
        """The published names (empty before the first publish())."""
        return list(self._entries or ())

    def _walk(self) -> Iterator[tuple[str, torch.Tensor, bool]]:
        """(name, tensor, registrable) for this publish; a DTensor published as a region comes
        as its local shard."""
        if self._pairs is None:
            for name, t in module_tensors(self._source, buffers=self._buffers).items():
                if _is_dtensor(t) and self._dtensors == "regions":
                    yield name, t.to_local().detach(), True
                else:
                    yield name, t, not _is_dtensor(t)
            return
        for name, t in self._pairs():
            stable = isinstance(t, torch.nn.Parameter) and not _is_dtensor(t)
            yield name, (t.detach() if stable else t), stable

    def _regions(self) -> dict[str, Any]:
        """The region of its full tensor each DTensor's local shard is (dtensors="regions")."""
        if self._pairs is not None or self._dtensors != "regions":
            return {}
        out = {}
        for name, t in module_tensors(self._source, buffers=self._buffers).items():
            if _is_dtensor(t):
                out[name] = _dtensor_region(name, t)
        return out

    def _register(self) -> None:
        register: dict[str, torch.Tensor] = {}
        entries: dict[str, _Entry] = {}
        regions = self._regions()
        for name, t, stable in self._walk():
            if name in entries:
                raise weightsync.InvalidArgument(f"tensor '{name}' yielded twice")
            if stable:
                _check_contiguous(name, t)
                register[name] = t
                entries[name] = _Entry(name, None, t.data_ptr(), tuple(t.shape), t.dtype)
                continue
            full = t.full_tensor() if _is_dtensor(t) else t
            device = None if full.device.type == "cpu" else str(full.device)
            staging = self.publisher.allocate(name, dtype_name(full.dtype), tuple(full.shape),
                                              framework="torch", device=device)
            staging.copy_(full)
            self._host_staging = self._host_staging or device is None
            entries[name] = _Entry(name, staging, None, tuple(full.shape), full.dtype)
        if register:
            self.publisher.register(register, regions={n: r for n, r in regions.items()
                                                       if n in register} or None)
        self._entries = entries

    def _refresh(self) -> None:
        if self._host_staging:
            self.publisher.begin_write()  # host staging lives in the arena subscribers read
        seen = set()
        for name, t, _ in self._walk():
            entry = self._entries.get(name)
            if entry is None:
                raise weightsync.InvalidArgument(
                    f"tensor '{name}' was not there at the first publish(); the set of "
                    "published names is fixed then (create a new Publisher to change it)")
            seen.add(name)
            if entry.staging is not None:
                entry.staging.copy_(t.full_tensor() if _is_dtensor(t) else t)
            elif (t.data_ptr(), tuple(t.shape), t.dtype) != (entry.address, entry.shape,
                                                              entry.dtype):
                raise weightsync.InvalidArgument(
                    f"tensor '{name}' moved since the first publish() (now {tuple(t.shape)} "
                    f"{t.dtype} at {t.data_ptr():#x}, registered {entry.shape} {entry.dtype} at "
                    f"{entry.address:#x}): weightsync publishes the memory it registered; a "
                    "module.to(), a new Parameter or a resize replaced it. Create a new "
                    "Publisher and ModulePublisher for the new tensors")
        missing = [n for n in self._entries if n not in seen]
        if missing:
            raise weightsync.InvalidArgument(
                f"{len(missing)} tensor(s) published before are missing now: "
                f"{', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")

    def begin_write(self) -> None:
        """Call before the optimizer changes the weights when the publisher is zero-copy
        (`Publisher(zero_copy=True)`: subscribers read the parameters themselves): waits until
        none reads them, as `Publisher.begin_write` does. Returns at once for a publisher that
        copies (its subscribers read a snapshot)."""
        self.publisher.begin_write()

    def publish(self, step: int, stream: Any = None) -> weightsync.PublishStats:
        """Gathers what needs gathering and publishes `step` (`Publisher.publish`)."""
        if self._entries is None:
            self._register()
        else:
            self._refresh()
        return self.publisher.publish(step, stream=stream)


def _dtensor_region(name: str, t: Any) -> Any:
    """The region of `t`'s full tensor its local shard is: Shard(dim) and Replicate placements
    only (a Partial tensor is no part of the full one; a strided shard is no box of it)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    from weightsync import regions as R

    for p in t.placements:
        if type(p) not in (Shard, Replicate):
            raise weightsync.InvalidArgument(
                f"tensor '{name}' is a DTensor placed {tuple(t.placements)}: only Shard(dim) and "
                "Replicate local shards are regions of the full tensor; publish this module with "
                "ModulePublisher(..., dtensors='gather') (full tensors)")
    shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    if tuple(shape) != tuple(t.to_local().shape):
        raise weightsync.InvalidArgument(
            f"tensor '{name}': its local shard is {tuple(t.to_local().shape)}, the placements "
            f"say {tuple(shape)} (padded shards): publish with dtensors='gather'")
    return R.Region(name, tuple(t.shape), tuple(offset), tuple(shape))


def _mapped(name: str, name_map: NameMap | None) -> str | None:
    if name_map is None:
        return name
    if callable(name_map):
        return name_map(name)
    return name_map.get(name, name)


def _targets(module: torch.nn.Module, buffers: bool) -> dict[str, torch.Tensor]:
    targets = module_tensors(module, buffers=buffers)
    for name, t in targets.items():
        if _is_dtensor(t):
            raise weightsync.InvalidArgument(
                f"tensor '{name}' of the engine's module is a DTensor; weightsync writes whole "
                "local tensors (load full tensors into a plain module)")
    return targets


def _names(names: list[str], limit: int = 8) -> str:
    return ", ".join(names[:limit]) + (f" ... ({len(names)} in all)" if len(names) > limit
                                       else "")


def _column_parts(name: str, shape: tuple[int, ...],
                  parts: list[tuple[str, tuple[int, ...]]], tp: int, rank: int):
    """The regions that fill fused module tensor `name` (`shape`) from published `parts` (name,
    global shape), stacked along dim 0: each part's TP column slice (vLLM's
    MergedColumnParallelLinear / QKVParallelLinear). Grouped-query attention with fewer KV heads
    than ranks is recognised from the shapes: each rank then holds one whole KV head (k and v the
    same size, the rest q), as vLLM's QKVParallelLinear does. None if the shapes do not fit."""
    from weightsync import regions as R

    if any(tuple(g[1:]) != tuple(shape[1:]) for _, g in parts):
        return None
    if all(g[0] % tp == 0 for _, g in parts) and sum(g[0] // tp for _, g in parts) == shape[0]:
        return R.fuse(0, [R.column(n, g, tp, rank) for n, g in parts])
    if len(parts) == 3 and parts[1][1] == parts[2][1] and parts[0][1][0] % tp == 0:
        (qn, qs), (kn, ks), (vn, vs) = parts
        rows = shape[0] - qs[0] // tp  # this rank's k and v rows
        head = rows // 2
        if rows % 2 == 0 and head > 0 and ks[0] % head == 0 and tp % (ks[0] // head) == 0:
            return R.qkv((qn, qs), (kn, ks), (vn, vs), tp=tp, rank=rank, head_dim=head)
    return None


def _sliced(name: str, shape: tuple[int, ...], published: tuple[int, ...], tp: int, rank: int):
    """The TP slice region of a published tensor that module tensor `shape` is (one dim 1/tp of
    the published one, every other dim equal), or None."""
    from weightsync import regions as R

    if tp == 1 or len(shape) != len(published):
        return None
    dims = [d for d in range(len(shape)) if shape[d] != published[d]]
    if len(dims) != 1 or published[dims[0]] != shape[dims[0]] * tp:
        return None
    return R.shard(name, published, dims[0], tp, rank)


def register_module(subscriber: weightsync.Subscriber, module: torch.nn.Module, *,
                    name_map: NameMap | None = None, buffers: bool = True,
                    packed: Mapping[str, list[str]] | None = None,
                    tp: tuple[int, int] = (1, 0)) -> list[str]:
    """Registers `module`'s own tensors as `subscriber`'s destinations: updates then write the
    module's parameters (and buffers) in place, staged or in place as the subscriber's mode
    says, with no copy of the model's size outside the subscriber.

    `name_map` maps a published name to the module's name (a mapping -- unlisted names map to
    themselves -- or a callable); `None` leaves a published tensor out (the subscriber then
    needs `policy="subset"`). Reads the publisher's manifest (`published_manifest()`), so a
    publisher must be serving.

    Sharded and fused engines (regions, docs/regions.md): `packed` names fused module tensors as
    vLLM's `packed_modules_mapping` does ({"qkv_proj": ["q_proj", "k_proj", "v_proj"],
    "gate_up_proj": ["gate_proj", "up_proj"]}; default: the module's own attribute of that name):
    a module tensor named with a fused key, say `layers.0.self_attn.qkv_proj.weight`, is filled by
    the published `...q_proj.weight`, `...k_proj.weight` and `...v_proj.weight` stacked along
    dim 0. `tp` = (tensor-parallel size, this rank): fused tensors take each part's column slice
    (GQA KV heads replicated when fewer than ranks), and a module tensor that is 1/size of a
    published one along one dim (column: dim 0, row: dim 1) is this rank's slice of it. Only this
    rank's bytes move.

    A module tensor nothing published fills, or a dtype/shape mismatch, is an `InvalidArgument`
    listing every one. Returns the published names registered (or the module names, for tensors
    filled by regions). Call `subscriber.sleep()` before moving the module's tensors, then this
    again.
    """
    size, rank = tp
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"tp={tp}: expected (size >= 1, 0 <= rank < size)")
    packed = getattr(module, "packed_modules_mapping", None) if packed is None else packed
    targets = _targets(module, buffers)
    manifest = {name: (dtype, tuple(shape)) for name, dtype, shape in
                subscriber.published_manifest()}
    register: dict[str, torch.Tensor] = {}
    regions: dict[str, Any] = {}
    problems, covered = [], set()
    for name, (dtype, shape) in manifest.items():
        target_name = _mapped(name, name_map)
        if target_name is None:
            continue
        t = targets.get(target_name)
        if t is None:
            continue  # a part of a fused tensor, or nothing of the module's (checked below)
        if dtype_name(t.dtype) != dtype:
            problems.append(f"'{name}' -> '{target_name}': published {dtype} {shape}, module "
                            f"{dtype_name(t.dtype)} {tuple(t.shape)}")
            continue
        if tuple(t.shape) != shape:
            part = _sliced(name, tuple(t.shape), shape, size, rank)
            if part is None:
                problems.append(f"'{name}' -> '{target_name}': published {dtype} {shape}, "
                                f"module {dtype_name(t.dtype)} {tuple(t.shape)}"
                                + (f" (not a 1/{size} slice of it)" if size > 1 else ""))
                continue
            regions[target_name] = part
            register[target_name] = t
        else:
            register[name] = t
        _check_contiguous(target_name, t)
        covered.add(t.data_ptr())
    for target_name, t in targets.items():
        if t.data_ptr() in covered or not t.numel():
            continue
        fused = next((k for k in (packed or {}) if f".{k}." in f".{target_name}"), None)
        if fused is None:
            continue
        parts = []
        for shard in packed[fused]:
            part_name = f".{target_name}".replace(f".{fused}.", f".{shard}.", 1)[1:]
            published = next((n for n in manifest if _mapped(n, name_map) == part_name), None)
            if published is None:
                break
            parts.append((published, manifest[published]))
        if len(parts) != len(packed[fused]):
            continue  # reported as uncovered below, naming the tensor
        dtypes = {d for _, (d, _) in parts}
        layout = (_column_parts(target_name, tuple(t.shape), [(n, g) for n, (_, g) in parts],
                                size, rank)
                  if dtypes == {dtype_name(t.dtype)} else None)
        if layout is None:
            problems.append(f"'{target_name}' ({dtype_name(t.dtype)} {tuple(t.shape)}): not the "
                            f"tp={size} rank {rank} stacking of " +
                            ", ".join(f"'{n}' {d} {g}" for n, (d, g) in parts))
            continue
        _check_contiguous(target_name, t)
        register[target_name] = t
        regions[target_name] = layout
        covered.add(t.data_ptr())
    uncovered = [n for n, t in targets.items() if t.data_ptr() not in covered and t.numel()]
    if uncovered:
        problems.append(f"module tensors nothing published fills: {_names(uncovered)}")
    parts = {p.tensor for r in regions.values() for p in (r if isinstance(r, list) else [r])}
    for name in manifest:
        target_name = _mapped(name, name_map)
        if target_name is not None and target_name not in targets and name not in parts:
            problems.append(f"'{name}' -> '{target_name}': no such tensor in the module")
    if problems:
        raise weightsync.InvalidArgument(
            "register_module: the published tensors do not fit the module "
            f"({len(problems)} problem(s)): " + "; ".join(problems) +
            ". Pass name_map (published name -> module name), packed (fused tensors) or tp, or "
            "load through the engine's own loader (Subscriber.allocate + receive(), load_into)")
    subscriber.register(register, regions=regions or None)
    return list(register)


@torch.no_grad()
def load_into(module: torch.nn.Module,
              weights: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor], *,
              name_map: NameMap | None = None, strict: bool = True,
              buffers: bool = True) -> list[str]:
    """Copies `(name, tensor)` pairs (`Subscriber.receive()`, a state dict) into `module`'s
    parameters and buffers; returns the module names written.

    Everything is checked before the first byte is copied, so a mismatch changes nothing: an
    unknown name (with `strict`), a dtype or shape mismatch (never cast silently), and with
    `strict` a module tensor no pair covers (tied weights count as covered when any alias is
    written). `name_map` as in `register_module`; `None` skips a pair.
    """
    targets = _targets(module, buffers)
    pairs = weights.items() if isinstance(weights, Mapping) else weights
    plan, problems, covered = [], [], set()
    for name, src in pairs:
        target_name = _mapped(name, name_map)
        if target_name is None:
            continue
        t = targets.get(target_name)
        if t is None:
            if strict:
                problems.append(f"'{name}' -> '{target_name}': no such tensor in the module")
            continue
        if not isinstance(src, torch.Tensor):
            src = torch.from_dlpack(src)
        if src.dtype != t.dtype or tuple(src.shape) != tuple(t.shape):
            problems.append(f"'{name}' -> '{target_name}': got {src.dtype} {tuple(src.shape)}, "
                            f"module {t.dtype} {tuple(t.shape)}")
            continue
        plan.append((target_name, t, src))
        covered.add(t.data_ptr())
    if strict:
        uncovered = [n for n, t in targets.items() if t.data_ptr() not in covered and t.numel()]
        if uncovered:
            problems.append(f"module tensors no pair covers: {_names(uncovered)}")
    if problems:
        raise weightsync.InvalidArgument(
            f"load_into: nothing loaded, {len(problems)} problem(s): " + "; ".join(problems))
    for _, t, src in plan:
        t.copy_(src)
    return [n for n, _, _ in plan]
