"""Elementwise ops: each builder takes the op and returns a plain function of its operand values.

Floats: f32 and f64 compute in their own type with numpy's float32/float64 routines; f16 and bf16 compute in f32
and round the result back (ops.py's rule). Transcendentals are numpy's (erf: torch's), correctly rounded or
within a few ulp, so they are *more* accurate than the GPU's approximate instructions (ex2.approx, lg2.approx,
sin/cos.approx, rsqrt.approx: about 2 ulp, sin/cos absolute error about 1e-6 on [-pi, pi]); compare GPU results
with relative bounds around 1e-5 for f32 transcendentals. fma on f32/f16/bf16 is exact: the product is exact in f64,
the sum is rounded to odd in f64 (TwoSum gives its error; an inexact sum gets its last bit set), and one rounding
to the type follows, which equals a single rounding of a*b + c because f64 keeps more than 2 extra bits (a plain f64
sum then a second rounding differed from fma.rn.f16 in rare ties). On f64 it is a*b + c with two roundings.

Integers wrap (two's complement). div truncates toward zero and rem takes the dividend's sign (C); x / 0 and
x % 0 are undefined in ops.py and give 0 here. shl by the bit width or more gives 0; shr by the width or more
gives the sign fill (signed) or 0 (unsigned); shift amounts are read as unsigned. i1 arithmetic is modulo 2
(add/sub = xor, mul = and).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from ..ir.core import Operation
from ..ir.types import PointerType, ScalarType
from .values import F32, F64, bitcast, cast, f64_to_bf16, rounder

Fn = Callable[..., Any]


def _erf(x: Any) -> Any:
    a = np.asarray(x)
    out = torch.special.erf(torch.from_numpy(np.ascontiguousarray(a))).numpy()
    return out if a.ndim else out[()]


def _rsqrt(x: Any) -> Any:
    return np.reciprocal(np.sqrt(x))


def _sigmoid(x: Any) -> Any:
    return np.reciprocal(1 + np.exp(-x))


FLOAT_BINARY: dict[str, Fn] = {
    "mt.add": np.add, "mt.sub": np.subtract, "mt.mul": np.multiply, "mt.div": np.divide, "mt.rem": np.fmod,
    "mt.maximum": np.fmax, "mt.minimum": np.fmin, "mt.pow": np.power,
}

FLOAT_UNARY: dict[str, Fn] = {
    "mt.neg": np.negative, "mt.abs": np.abs, "mt.exp": np.exp, "mt.exp2": np.exp2, "mt.log": np.log,
    "mt.log2": np.log2, "mt.sqrt": np.sqrt, "mt.rsqrt": _rsqrt, "mt.sigmoid": _sigmoid, "mt.sin": np.sin,
    "mt.cos": np.cos, "mt.tanh": np.tanh, "mt.floor": np.floor, "mt.ceil": np.ceil, "mt.erf": _erf,
}


def _float_op(fn: Fn, s: ScalarType) -> Fn:
    """`fn` for values of float type `s`: direct for f32/f64, through f32 and rounded back for f16/bf16."""
    round_back = rounder(s)
    if round_back is None:
        return fn
    if s.name == "f16":
        return lambda *xs: round_back(fn(*(x.astype(F32) for x in xs)))
    return lambda *xs: round_back(fn(*xs))  # bf16 values are already float32


def _fma(s: ScalarType) -> Fn:
    if s.name == "f64":
        return lambda a, b, c: a * b + c
    to_type: Fn = f64_to_bf16 if s.name == "bf16" else (lambda x: x.astype(s.numpy_name))
    return lambda a, b, c: to_type(_sum_rounded_to_odd(a.astype(F64) * b.astype(F64), c.astype(F64)))


def _sum_rounded_to_odd(p: np.ndarray, c: np.ndarray) -> np.ndarray:
    """p + c in f64 rounded to odd, so that rounding it again to a narrower float is a single correct rounding."""
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + c
        back = s - p
        err = (p - (s - back)) + (c - back)  # TwoSum: s + err == p + c exactly (finite s)
        even = (np.asarray(s).view(np.int64) & 1) == 0
        nudge = np.isfinite(s) & (err != 0) & even
        return np.where(nudge, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)


# ---------------------------------------------------------------------------------------------- integers


def _unsigned(dt: np.dtype) -> np.dtype:
    return np.dtype(f"uint{dt.itemsize * 8}")


def _int_div(signed: bool) -> Fn:
    def div(a: Any, b: Any) -> Any:
        zero = b == 0
        safe = np.where(zero, 1, b)
        if signed:  # floor division fixed up to truncation: a - fmod(a, b) is an exact multiple of b
            q = (a - np.fmod(a, safe)) // safe
        else:
            q = a // safe
        return np.where(zero, 0, q).astype(q.dtype)

    return div


def _int_rem(a: Any, b: Any) -> Any:
    zero = b == 0
    r = np.fmod(a, np.where(zero, 1, b))
    return np.where(zero, 0, r).astype(r.dtype)


def _shl(bits: int) -> Fn:
    def shl(a: Any, b: Any) -> Any:
        amount = np.asarray(b).astype(_unsigned(np.asarray(a).dtype))
        wide = amount >= bits
        shifted = np.left_shift(a, np.where(wide, 0, amount).astype(np.asarray(a).dtype))
        return np.where(wide, 0, shifted).astype(np.asarray(a).dtype)

    return shl


def _shr(bits: int, signed: bool) -> Fn:
    def shr(a: Any, b: Any) -> Any:
        dt = np.asarray(a).dtype
        amount = np.asarray(b).astype(_unsigned(dt))
        wide = amount >= bits
        clamped = np.where(wide, bits - 1 if signed else 0, amount).astype(dt)
        shifted = np.right_shift(a, clamped)
        return shifted if signed else np.where(wide, 0, shifted).astype(dt)  # arithmetic shr saturates by itself

    return shr


def _int_abs(signed: bool) -> Fn:
    return np.abs if signed else (lambda a: a)


def _int_binary(name: str, bits: int, signed: bool) -> Fn | None:
    return {
        "mt.add": np.add, "mt.sub": np.subtract, "mt.mul": np.multiply, "mt.div": _int_div(signed),
        "mt.rem": _int_rem, "mt.maximum": np.maximum, "mt.minimum": np.minimum, "mt.and": np.bitwise_and,
        "mt.or": np.bitwise_or, "mt.xor": np.bitwise_xor, "mt.shl": _shl(bits), "mt.shr": _shr(bits, signed),
    }.get(name)


def _int_unary(name: str, signed: bool) -> Fn | None:
    return {"mt.neg": np.negative, "mt.abs": _int_abs(signed), "mt.not": np.invert}.get(name)


def _bool_op(fn: Fn) -> Fn:
    """An integer op on i1 values: computed on 0/1 bytes, kept modulo 2."""
    return lambda *xs: (fn(*(np.asarray(x).astype(np.uint8) for x in xs)) & 1) != 0


# ---------------------------------------------------------------------------------------------- builders


def build_arith(op: Operation) -> Fn:
    """add/sub/.../shr, neg/not/abs, the math functions and fma, for the operand type."""
    s = op.operands[0].type.scalar
    assert isinstance(s, ScalarType), f"{op.name} on pointers"
    if s.is_float:
        if op.name == "mt.fma":
            return _fma(s)
        fn = FLOAT_BINARY.get(op.name) or FLOAT_UNARY.get(op.name)
        if fn is None:
            raise KeyError(op.name)
        return _float_op(fn, s)
    if s.is_bool:
        if op.name in ("mt.and", "mt.or", "mt.xor", "mt.maximum", "mt.minimum", "mt.not"):
            return {"mt.and": np.logical_and, "mt.or": np.logical_or, "mt.xor": np.logical_xor,
                    "mt.maximum": np.logical_or, "mt.minimum": np.logical_and, "mt.not": np.logical_not}[op.name]
        fn = _int_binary(op.name, 1, False) or _int_unary(op.name, False)
        if fn is None:
            raise KeyError(op.name)
        return _bool_op(fn)
    fn = _int_binary(op.name, s.bits, s.is_signed) or _int_unary(op.name, s.is_signed)
    if fn is None:
        raise KeyError(op.name)
    return fn


CMP: dict[str, Fn] = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
                      "gt": np.greater, "ge": np.greater_equal}


def build_cmp(op: Operation) -> Fn:
    """Comparisons follow the operand type: signedness for integers, unordered `ne` for NaN (NaN != x is true,
    every other predicate with a NaN is false), byte addresses for pointers."""
    return CMP[op.attrs["predicate"]]


def build_select(op: Operation) -> Fn:
    return np.where


def build_cast(op: Operation) -> Fn:
    src, dst = op.operands[0].type.scalar, op.result.type.scalar
    assert isinstance(src, ScalarType) and isinstance(dst, ScalarType)
    if src == dst:
        return lambda x: x
    return lambda x: cast(x, src, dst)


def build_bitcast(op: Operation) -> Fn:
    src, dst = op.operands[0].type, op.result.type
    if isinstance(src.scalar, PointerType) and isinstance(dst.scalar, PointerType) or src.scalar == dst.scalar:
        return lambda x: x
    return lambda x: bitcast(x, src, dst)


ARITH_OPS = sorted(set(FLOAT_BINARY) | set(FLOAT_UNARY) |
                   {"mt.and", "mt.or", "mt.xor", "mt.shl", "mt.shr", "mt.not", "mt.fma"})

BUILDERS: dict[str, Callable[[Operation], Fn]] = {name: build_arith for name in ARITH_OPS}
BUILDERS.update({"mt.cmp": build_cmp, "mt.select": build_select, "mt.cast": build_cast, "mt.bitcast": build_bitcast})


# ------------------------------------------------------------------- static sub-tiles (not elementwise, but pure)


def build_extract_slice(op: Operation) -> Fn:
    """x[offsets[d] : offsets[d] + sizes[d]] along every dim (a copy, as every tile value is)."""
    index = tuple(slice(o, o + s) for o, s in zip(op.attrs["offsets"], op.attrs["sizes"]))
    return lambda x: np.ascontiguousarray(x[index])


def build_concat(op: Operation) -> Fn:
    axis = op.attrs["axis"]
    return lambda *xs: np.concatenate(xs, axis=axis)


BUILDERS.update({"mt.extract_slice": build_extract_slice, "mt.concat": build_concat})
