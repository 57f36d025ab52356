"""Regions: sharded trainers into sharded engines, with nothing gathered.

A tensor registered on either side may be a *region* of a larger, global tensor:

* a trainer rank holds one region of each global tensor it publishes (an FSDP shard, a
  tensor-parallel slice, a range of stacked experts) and registers it with
  ``publisher.register(tensors, regions={name: region})``;
* an engine rank's destination is filled by one region (its TP slice) or several (a fused
  parameter such as vLLM's ``qkv_proj`` or ``gate_up_proj``):
  ``subscriber.register(tensors, regions={name: [region, ...]})``.

At every prepare the subscriber intersects what its publishers hold with what it wants: each
destination byte comes exactly once, from the least-loaded publisher holding it, and only those
bytes move (with ``verify``, digest segments read only in part move whole). One error lists every
range nobody holds and every one written twice.

Coordinates are elements of the global tensor, per dimension, row-major::

    from weightsync import regions as R

    # trainer rank r of an FSDP-4 trainer: rows of every weight
    pub.register({"q_proj.weight": q_shard},
                 regions={"q_proj.weight": R.fsdp("q_proj.weight", (3584, 3584), 4, r)})

    # TP rank t of a TP-2 engine with a fused qkv_proj (GQA: 28 query heads, 4 KV heads of 128)
    sub.register({"qkv_proj.weight": qkv},
                 regions={"qkv_proj.weight": R.qkv(("q_proj.weight", (3584, 3584)),
                                                    ("k_proj.weight", (512, 3584)),
                                                    ("v_proj.weight", (512, 3584)),
                                                    tp=2, rank=t, head_dim=128)})
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

Shape = Tuple[int, ...]


@dataclass(frozen=True)
class Region:
    """A region of global tensor ``tensor``: ``extent`` elements per dim from ``offset``, placed at
    ``at`` in the registered tensor (both of the registered tensor's rank).

    ``extent`` None: the registered tensor's shape (a single part). ``at`` None: its origin.
    ``tensor`` "": the registered name.
    """

    tensor: str
    global_shape: Shape
    offset: Shape
    extent: Optional[Shape] = None
    at: Optional[Shape] = None


def whole(tensor: str, global_shape: Sequence[int]) -> Region:
    """All of ``tensor``."""
    shape = tuple(int(d) for d in global_shape)
    return Region(tensor, shape, (0,) * len(shape), shape)


def shard(tensor: str, global_shape: Sequence[int], dim: int, parts: int, rank: int) -> Region:
    """Rank ``rank`` of ``parts`` even shards along ``dim``: elements [n·r/parts, n·(r+1)/parts)
    of a dim of n (the same split as the C++ weightsync::Shard)."""
    shape = tuple(int(d) for d in global_shape)
    if not 0 <= dim < len(shape):
        raise ValueError(f"shard of '{tensor}': dim {dim} of a {len(shape)}-dim tensor")
    if parts <= 0 or not 0 <= rank < parts:
        raise ValueError(f"shard of '{tensor}': rank {rank} of {parts}")
    n = shape[dim]
    lo, hi = n * rank // parts, n * (rank + 1) // parts
    offset = [0] * len(shape)
    extent = list(shape)
    offset[dim], extent[dim] = lo, hi - lo
    return Region(tensor, shape, tuple(offset), tuple(extent))


def fuse(dim: int, parts: Sequence[Region]) -> list[Region]:
    """``parts`` one after another along ``dim`` of the destination (sets each part's ``at``)."""
    out, at = [], 0
    for part in parts:
        if part.extent is None:
            raise ValueError(f"fuse: part of '{part.tensor}' needs an extent")
        where = [0] * len(part.global_shape)
        where[dim] = at
        at += part.extent[dim]
        out.append(Region(part.tensor, part.global_shape, part.offset, part.extent, tuple(where)))
    return out


# ---- trainer layouts -----------------------------------------------------------------------


def fsdp(tensor: str, global_shape: Sequence[int], world: int, rank: int) -> Region:
    """FSDP (and ZeRO-3) shard ``rank`` of ``world``: rows of the tensor (dim 0)."""
    return shard(tensor, global_shape, 0, world, rank)


# ---- engine layouts (vLLM / SGLang / Megatron tensor parallelism) ----------------------------


def column(tensor: str, global_shape: Sequence[int], tp: int, rank: int) -> Region:
    """Column-parallel slice (vLLM ColumnParallelLinear: output rows, dim 0)."""
    return shard(tensor, global_shape, 0, tp, rank)


def row(tensor: str, global_shape: Sequence[int], tp: int, rank: int) -> Region:
    """Row-parallel slice (vLLM RowParallelLinear: input columns, dim 1)."""
    return shard(tensor, global_shape, 1, tp, rank)


def _kv(tensor: str, shape: Shape, tp: int, rank: int, head_dim: Optional[int]) -> Region:
    heads = shape[0] // head_dim if head_dim else None
    if heads is None or heads >= tp:
        if heads is not None and heads % tp:
            raise ValueError(f"'{tensor}': {heads} KV heads do not split over tp={tp}")
        return column(tensor, shape, tp, rank)
    # Fewer KV heads than ranks: each head is replicated on tp / heads ranks (vLLM's QKV layout).
    if tp % heads:
        raise ValueError(f"'{tensor}': tp={tp} is not a multiple of its {heads} KV heads")
    head = rank * heads // tp
    offset = [0] * len(shape)
    extent = list(shape)
    offset[0], extent[0] = head * head_dim, head_dim
    return Region(tensor, shape, tuple(offset), tuple(extent))


def qkv(
    q: Tuple[str, Sequence[int]],
    k: Tuple[str, Sequence[int]],
    v: Tuple[str, Sequence[int]],
    *,
    tp: int,
    rank: int,
    head_dim: Optional[int] = None,
) -> list[Region]:
    """TP rank ``rank``'s fused qkv_proj: its rows of q, then of k, then of v (dim 0).

    q, k, v: (global name, global shape). With grouped-query attention the k and v rows split
    evenly when there are at least ``tp`` KV heads; with fewer (give ``head_dim``) each rank holds
    the one KV head it shares with tp / heads others, as vLLM's QKVParallelLinear does.
    """
    qn, qs = q[0], tuple(int(d) for d in q[1])
    kn, ks = k[0], tuple(int(d) for d in k[1])
    vn, vs = v[0], tuple(int(d) for d in v[1])
    return fuse(0, [column(qn, qs, tp, rank), _kv(kn, ks, tp, rank, head_dim),
                    _kv(vn, vs, tp, rank, head_dim)])


def gate_up(
    gate: Tuple[str, Sequence[int]], up: Tuple[str, Sequence[int]], *, tp: int, rank: int
) -> list[Region]:
    """TP rank ``rank``'s fused gate_up_proj: its rows of gate, then of up (dim 0)."""
    return fuse(0, [column(gate[0], gate[1], tp, rank), column(up[0], up[1], tp, rank)])


def experts(tensor: str, global_shape: Sequence[int], ep: int, rank: int) -> Region:
    """Expert-parallel rank ``rank`` of ``ep``: its range of the stacked experts (dim 0)."""
    return shard(tensor, global_shape, 0, ep, rank)


__all__ = [
    "Region",
    "column",
    "experts",
    "fsdp",
    "fuse",
    "gate_up",
    "qkv",
    "row",
    "shard",
    "whole",
]
