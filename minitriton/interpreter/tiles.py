"""Tile ops that are pure functions of their operands: constants, arange, shape ops (and mt.convert_layout, an
identity here: layouts are ignored), reduce, scan and dot.

Each builder takes the op and returns a function of the operand values (see elementwise.py for the same pattern).
Reductions and scans of f16/bf16 accumulate in f32 and round once per output element, so they are at least as
accurate as the GPU's tree of rounded steps. dot computes a @ b in float64 (every product of f16/bf16/f32 inputs is
exact there, and the sum is nearly exact), adds the f32 accumulator and rounds once to f32: an upper bound on the
accuracy of the GPU's f32 accumulation.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..ir.core import Operation
from ..ir.types import ScalarType, with_scalar
from .values import F32, F64, bitcast, dtype_of, rounder, round_tf32, scalar_value, truncate_tf32

Fn = Callable[..., Any]


def build_constant(op: Operation) -> Fn:
    t = op.result.type
    value = scalar_value(op.attrs["value"], t.scalar)  # type: ignore[arg-type]
    if t.is_tensor:
        tile = np.full(t.shape, value, dtype=dtype_of(t))
        tile.flags.writeable = False  # shared by every program; ops never write their inputs
        return lambda: tile
    return lambda: value


def build_arange(op: Operation) -> Fn:
    tile = np.arange(op.attrs["start"], op.attrs["end"], dtype=np.int32)
    tile.flags.writeable = False
    return lambda: tile


def build_splat(op: Operation) -> Fn:
    shape, dt = op.result.type.shape, dtype_of(op.result.type)
    return lambda x: np.full(shape, x, dtype=dt)


def build_broadcast(op: Operation) -> Fn:
    shape = op.result.type.shape
    return lambda x: np.broadcast_to(x, shape)  # a read-only view; later ops make new arrays


def build_expand_dims(op: Operation) -> Fn:
    axis = op.attrs["axis"]
    return lambda x: np.expand_dims(x, axis)


def build_reshape(op: Operation) -> Fn:
    shape = op.result.type.shape
    return lambda x: np.reshape(x, shape)  # row-major, as ops.py says


def build_bitcast_split(op: Operation) -> Fn:
    """mt.bitcast_split: [..., n] of 32 / 64 bits -> [..., n, 2], the low then the high half of each element's bits
    (through the unsigned half-width integers, then mt.bitcast's reinterpretation, so bf16 halves decode as bf16)."""
    src, dst = op.operands[0].type, op.result.type
    half = dst.scalar.bits  # type: ignore[union-attr]
    whole = np.dtype(f"uint{2 * half}")
    unsigned_half = ScalarType(f"ui{half}")

    def split(x: Any) -> Any:
        u = np.ascontiguousarray(np.asarray(x, dtype=dtype_of(src))).view(whole)
        pairs = np.stack([u & whole.type((1 << half) - 1), u >> whole.type(half)], axis=-1)
        return bitcast(pairs.astype(f"uint{half}"), with_scalar(dst, unsigned_half), dst)

    return split


def build_convert_layout(op: Operation) -> Fn:
    """Layouts only say which GPU thread holds which element; the interpreter ignores them."""
    return lambda x: x


def build_trans(op: Operation) -> Fn:
    order = tuple(op.attrs["order"])
    return lambda x: np.transpose(x, order)


# ---------------------------------------------------------------------------------------- reduce, scan


def _combine(kind: str, s: ScalarType) -> tuple[Fn, Fn]:
    """(reduce(x, axis), accumulate(x, axis)) for `kind` on values of `s`, computed in `s`'s compute type."""
    if s.is_bool:  # i1: sum is modulo 2
        ufunc = {"sum": np.logical_xor, "max": np.logical_or, "min": np.logical_and}[kind]
    elif s.is_float:
        ufunc = {"sum": np.add, "max": np.fmax, "min": np.fmin}[kind]  # max/min ignore NaN, like PTX max.f32
    else:
        ufunc = {"sum": np.add, "max": np.maximum, "min": np.minimum}[kind]
    compute = F32 if s.name in ("f16", "bf16") else np.dtype(s.numpy_name)
    if s.is_bool:
        return ufunc.reduce, ufunc.accumulate
    # dtype= keeps integer sums in their own type (numpy would widen small ints), so they wrap.
    return (lambda x, axis: ufunc.reduce(x, axis=axis, dtype=compute),
            lambda x, axis: ufunc.accumulate(x, axis=axis, dtype=compute))


def _rounded(fn: Fn, s: ScalarType) -> Fn:
    round_back = rounder(s)
    return fn if round_back is None else (lambda x, axis: round_back(fn(x, axis)))


def build_reduce(op: Operation) -> Fn:
    s = op.operands[0].type.scalar
    assert isinstance(s, ScalarType)
    reduce, _ = _combine(op.attrs["kind"], s)
    fn, axis = _rounded(reduce, s), op.attrs["axis"]
    return lambda x: fn(x, axis)


def build_scan(op: Operation) -> Fn:
    s = op.operands[0].type.scalar
    assert isinstance(s, ScalarType)
    _, accumulate = _combine(op.attrs["kind"], s)
    fn, axis = _rounded(accumulate, s), op.attrs["axis"]
    return lambda x: fn(x, axis)


# ---------------------------------------------------------------------------------------------- dot


def build_dot(op: Operation) -> Fn:
    s = op.operands[0].type.scalar
    precision = op.attrs.get("input_precision", "ieee") if s.name == "f32" else "ieee"  # type: ignore[union-attr]

    def dot(a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> np.ndarray:
        if precision == "tf32":
            a, b = round_tf32(a), round_tf32(b)
        if precision == "tf32x3":  # hi = x cut to tf32, lo = (x - hi) cut to tf32 (codegen/mma.py); no lo * lo
            a_hi, b_hi = truncate_tf32(a), truncate_tf32(b)
            a_lo, b_lo = truncate_tf32(a - a_hi), truncate_tf32(b - b_hi)
            return (acc.astype(F64) + a_hi.astype(F64) @ b_hi.astype(F64) + a_hi.astype(F64) @ b_lo.astype(F64)
                    + a_lo.astype(F64) @ b_hi.astype(F64)).astype(F32)
        return (acc.astype(F64) + a.astype(F64) @ b.astype(F64)).astype(F32)

    return dot


BUILDERS: dict[str, Callable[[Operation], Fn]] = {
    "mt.constant": build_constant, "mt.arange": build_arange, "mt.splat": build_splat,
    "mt.broadcast": build_broadcast, "mt.expand_dims": build_expand_dims, "mt.reshape": build_reshape,
    "mt.trans": build_trans, "mt.convert_layout": build_convert_layout, "mt.reduce": build_reduce,
    "mt.scan": build_scan, "mt.dot": build_dot, "mt.bitcast_split": build_bitcast_split,
    "mt.local_alloc": build_convert_layout,  # a shared-memory copy: the same values
}
