"""Ops that need the running program: program_id, num_programs, addptr (pure, but about memory), load, store,
prefetch (checks its addresses, does nothing else), atomic_add, barrier (a no-op: a program's ops run one at a
time, each whole, so every write is already visible).
Each builder returns a *step* `step(env, ctx)` reading operand slots of `env` and writing result slots; `ctx` is
the program's Context (program.py) holding its ids, the grid and the Memory."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..ir.core import Operation
from ..ir.types import PointerType, ScalarType
from .values import F32, dtype_of, from_raw, raw_dtype, round_bf16, to_raw

Step = Callable[[list, Any], None]
SlotOf = Callable[[Any], int]


def build_program_id(op: Operation, use: SlotOf, define: SlotOf) -> Step:
    axis, out = op.attrs["axis"], define(op.result)

    def program_id(env: list, ctx: Any) -> None:
        env[out] = np.int32(ctx.pid[axis])

    return program_id


def build_num_programs(op: Operation, use: SlotOf, define: SlotOf) -> Step:
    axis, out = op.attrs["axis"], define(op.result)

    def num_programs(env: list, ctx: Any) -> None:
        env[out] = np.int32(ctx.grid[axis])

    return num_programs


def build_addptr(op: Operation) -> Callable[[Any, Any], Any]:
    """Pointer + offset * sizeof(pointee), in 64-bit byte addresses (offsets of any integer type, sign-extended
    when signed)."""
    size = np.int64(op.operands[0].type.scalar.pointee.bytes)  # type: ignore[union-attr]
    return lambda p, off: p + off.astype(np.int64) * size


def _flat(x: Any) -> np.ndarray:
    return np.asarray(x).reshape(-1)


def _pointee(op: Operation) -> ScalarType:
    ptr = op.operands[0].type.scalar
    assert isinstance(ptr, PointerType)
    return ptr.pointee


def build_load(op: Operation, use: SlotOf, define: SlotOf) -> Step:
    s, t, loc = _pointee(op), op.result.type, op.loc
    ptr, out = use(op.operands[0]), define(op.result)
    mask = use(op.operands[1]) if len(op.operands) > 1 else None
    other = use(op.operands[2]) if len(op.operands) > 2 else None
    shape = t.shape

    def load(env: list, ctx: Any) -> None:
        active = None if mask is None else _flat(env[mask])
        raw = ctx.memory.gather(_flat(env[ptr]), active, s, op.name, loc, shape)
        value = from_raw(raw, s).reshape(shape)  # masked-off lanes read as 0
        if other is not None:
            value = np.where(active.reshape(shape), value, env[other])  # type: ignore[union-attr]
        env[out] = value if shape else value[()]

    return load


def build_store(op: Operation, use: SlotOf, define: SlotOf) -> Step:
    s, loc, shape = _pointee(op), op.loc, op.operands[0].type.shape
    ptr, val = use(op.operands[0]), use(op.operands[1])
    mask = use(op.operands[2]) if len(op.operands) > 2 else None

    def store(env: list, ctx: Any) -> None:
        active = None if mask is None else _flat(env[mask])
        ctx.memory.scatter(_flat(env[ptr]), active, _flat(to_raw(env[val], s)), s, op.name, loc, shape)

    return store


def build_prefetch(op: Operation, use: SlotOf, define: SlotOf) -> Step:
    """A prefetch changes nothing, but its enabled lanes are checked as a load's are: on the GPU a prefetch of a
    wild address is silently harmless, which is exactly why a wrong one would go unnoticed there."""
    s, loc, shape = _pointee(op), op.loc, op.operands[0].type.shape
    ptr = use(op.operands[0])
    mask = use(op.operands[1]) if len(op.operands) > 1 else None
    itemsize = raw_dtype(s).itemsize

    def prefetch(env: list, ctx: Any) -> None:
        active = None if mask is None else _flat(env[mask])
        ctx.memory.resolve(_flat(env[ptr]), active, itemsize, op.name, loc, shape)

    return prefetch


def adder(s: ScalarType) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """a + b in type `s` (ints wrap; f16/bf16 add in f32 and round)."""
    if s.name == "f16":
        return lambda a, b: (a.astype(F32) + b.astype(F32)).astype(np.float16)
    if s.name == "bf16":
        return lambda a, b: round_bf16(a + b)
    if s.is_bool:
        return np.logical_xor
    return np.add


def build_atomic_add(op: Operation, use: SlotOf, define: SlotOf) -> Step:
    s, loc, t = _pointee(op), op.loc, op.result.type
    ptr, val, out = use(op.operands[0]), use(op.operands[1]), define(op.result)
    mask = use(op.operands[2]) if len(op.operands) > 2 else None
    add, dt = adder(s), dtype_of(t)

    def atomic_add(env: list, ctx: Any) -> None:
        active = None if mask is None else _flat(env[mask])
        values = _flat(env[val]).astype(dt, copy=False)
        old = ctx.memory.atomic_add(_flat(env[ptr]), active, values, s, add, op.name, loc, t.shape)
        env[out] = old.reshape(t.shape) if t.shape else old[0]

    return atomic_add


def build_barrier(op: Operation, use: SlotOf, define: SlotOf) -> Step:
    return lambda env, ctx: None


STEP_BUILDERS: dict[str, Callable[[Operation, SlotOf, SlotOf], Step]] = {
    "mt.program_id": build_program_id, "mt.num_programs": build_num_programs, "mt.load": build_load,
    "mt.store": build_store, "mt.prefetch": build_prefetch, "mt.atomic_add": build_atomic_add,
    # programs run one at a time and kernels one after another: nothing to order or overlap
    "mt.barrier": build_barrier, "mt.fence": build_barrier, "mt.griddep_wait": build_barrier,
    "mt.griddep_launch": build_barrier,
}
