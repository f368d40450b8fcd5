"""Software-pipelining ops in the interpreter (passes/pipeline.py): a ring buffer is a numpy array whose leading dim
is the stage; copies happen when issued, so commits and waits do nothing.

    mt.alloc_ring    a fresh zero-filled array of the result's shape (interpreter/partitions.py: with the slots'
                     barriers)
    mt.async_copy    ring[slot] = the pointees (read through Memory, bounds-checked like mt.load); masked-off lanes 0
    mt.local_load    a copy of ring[slot]
    mt.ring_slot     a copy of ring[slot] too (on the GPU a view the dot reads in place; the pass rewrites a slot
                     only after the dot that read it retired, so the copy sees the same values)
    mt.async_commit, mt.async_wait, mt.dot_wait   no-ops (the copy is already complete)

The ring is mutated in place: the pass guarantees a slot is rewritten only after its last mt.local_load.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import InterpreterError
from ..ir.core import Operation
from ..ir.types import PointerType
from .values import from_raw

Step = Callable[[list, Any], None]
SlotOf = Callable[[Any], int]


def _slot(env: list, ring: int, slot: int, op: Operation) -> int:
    s = int(env[slot])
    if not 0 <= s < env[ring].shape[0]:
        raise InterpreterError(f"ring slot {s} out of range [0, {env[ring].shape[0]})", op.loc)
    return s


def build_async_copy(op: Operation, use: SlotOf, define: SlotOf) -> Step:
    ptr_t = op.operands[2].type.scalar
    assert isinstance(ptr_t, PointerType)
    s, shape, loc = ptr_t.pointee, op.operands[2].type.shape, op.loc
    ring, slot, ptr = (use(v) for v in op.operands[:3])
    mask = use(op.operands[3]) if len(op.operands) > 3 else None

    def async_copy(env: list, ctx: Any) -> None:
        active = None if mask is None else np.asarray(env[mask]).reshape(-1)
        raw = ctx.memory.gather(np.asarray(env[ptr]).reshape(-1), active, s, op.name, loc, shape)
        env[ring][_slot(env, ring, slot, op)] = from_raw(raw, s).reshape(shape)  # masked-off lanes read as 0

    return async_copy


def build_local_load(op: Operation, use: SlotOf, define: SlotOf) -> Step:
    ring, slot, out = use(op.operands[0]), use(op.operands[1]), define(op.result)

    def local_load(env: list, ctx: Any) -> None:
        env[out] = env[ring][_slot(env, ring, slot, op)].copy()

    return local_load


def build_nothing(op: Operation, use: SlotOf, define: SlotOf) -> Step:
    return lambda env, ctx: None


def build_ring_slot(op: Operation, use: SlotOf, define: SlotOf) -> Step:
    ring, slot, out = use(op.operands[0]), use(op.operands[1]), define(op.result)
    enc = op.result.type.encoding  # type: ignore[union-attr]
    transposed = enc is not None and enc.get("operand") == 2  # a B^T slot viewed as B

    def ring_slot(env: list, ctx: Any) -> None:
        tile = env[ring][_slot(env, ring, slot, op)]
        env[out] = (tile.T if transposed else tile).copy()

    return ring_slot


STEP_BUILDERS: dict[str, Callable[[Operation, SlotOf, SlotOf], Step]] = {
    "mt.async_copy": build_async_copy, "mt.local_load": build_local_load,
    "mt.ring_slot": build_ring_slot, "mt.async_commit": build_nothing, "mt.async_wait": build_nothing,
    "mt.dot_wait": build_nothing,
}
