"""How the interpreter holds IR values in numpy, and the conversions between number types.

Representation (one rule everywhere):
- a tile (`tensor<...>`) is an np.ndarray of the tile's shape; a scalar is a numpy scalar (np.generic);
- the dtype is `ScalarType.numpy_name`: bf16 is held as float32 whose value is always a bf16 value (every op that
  produces bf16 rounds with `round_bf16`), f16 as float16, i1 as bool;
- a pointer is an int64 byte address in the interpreter's virtual address space (see memory.py).

In memory (torch storage) a value has a *raw* form: bf16 is its 16 bit pattern (uint16), i1 one byte 0/1; every
other type is stored as its numpy dtype. `to_raw` / `from_raw` convert.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..ir.numeric import wrap_int
from ..ir.types import PointerType, ScalarType, Type

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
PTR = np.dtype(np.int64)  # pointer values are byte addresses


def dtype_of(t: Type) -> np.dtype:
    """The numpy dtype holding values of `t` (a scalar, pointer or tensor type)."""
    s = t.scalar
    if isinstance(s, PointerType):
        return PTR
    return np.dtype(s.numpy_name)


def raw_dtype(s: ScalarType) -> np.dtype:
    """The numpy dtype of `s`'s bit pattern in memory."""
    if s.name == "bf16":
        return np.dtype(np.uint16)
    if s.name == "i1":
        return np.dtype(np.uint8)
    return np.dtype(s.numpy_name)


# ------------------------------------------------------------------------------------------ rounding


def round_bf16(x: Any) -> Any:
    """float32 values rounded to the nearest bf16 (ties to even), still held as float32.

    NaN becomes the canonical 0x7FC0 bf16 NaN, as torch does, so results compare bit-exactly with torch.
    """
    return bf16_bits_to_f32(f32_to_bf16_bits(x))


def f32_to_bf16_bits(x: Any) -> Any:
    """The bf16 bit patterns (uint16) nearest to float32 values (round to nearest even, NaN -> 0x7FC0)."""
    a = np.asarray(x, dtype=F32)
    bits = a.view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    out = np.where(np.isnan(a), np.uint32(0x7FC0), rounded).astype(np.uint16)
    return out if a.ndim else out[()]


def bf16_bits_to_f32(bits: Any) -> Any:
    """float32 values of bf16 bit patterns (any 16-bit integer dtype)."""
    b = np.asarray(bits).astype(np.uint16).astype(np.uint32) << np.uint32(16)
    out = b.view(F32)
    return out if b.ndim else out[()]


def f64_to_bf16(x: Any) -> Any:
    """float64 values rounded once (correctly) to bf16, held as float32.

    Rounding to f32 first and then to bf16 could round twice; instead round to f32 toward zero with a sticky
    last bit ("round to odd"), which keeps enough information for the second rounding to be exact.
    """
    a = np.asarray(x, dtype=F64)
    y = a.astype(F32)
    inexact = (y.astype(F64) != a) & ~np.isnan(a)
    too_far = inexact & (np.abs(y.astype(F64)) > np.abs(a))
    y = np.where(too_far, np.nextafter(y, F32.type(0)), y).astype(F32)
    y = (y.view(np.uint32) | inexact.astype(np.uint32)).view(F32)
    out = round_bf16(y)
    return out if a.ndim else out[()]


def round_tf32(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to tf32 (10 mantissa bits), to nearest with ties to even (PTX cvt.rn.tf32.f32, which
    the compiled code uses): adding 0xFFF plus the kept part's lowest bit carries exactly when the 13 cut bits
    are over half, or half with an odd kept part. Overflow rounds to infinity, as IEEE does; NaN and inf stay."""
    a = np.asarray(x, dtype=F32)
    bits = a.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0xFFF + ((bits >> 13) & 1)) & 0xFFFFE000).astype(np.uint32).view(F32)
    return np.where(np.isfinite(a), rounded, a)


def truncate_tf32(x: np.ndarray) -> np.ndarray:
    """float32 values cut to tf32 (the low 13 mantissa bits cleared): what an mma.sync reads from an f32 register
    it takes as tf32 without a cvt (the tf32x3 split's parts)."""
    a = np.asarray(x, dtype=F32)
    return (a.view(np.uint32) & np.uint32(0xFFFFE000)).view(F32)


def rounder(s: ScalarType):  # type: ignore[no-untyped-def]
    """A function mapping float32 results to values of the low-precision float type `s` (None for others)."""
    if s.name == "bf16":
        return round_bf16
    if s.name == "f16":
        return lambda x: x.astype(np.float16)
    return None


# ------------------------------------------------------------------------------------------ memory form


def from_raw(raw: np.ndarray, s: ScalarType) -> np.ndarray:
    """Values of type `s` from their in-memory bit patterns."""
    if s.name == "bf16":
        return bf16_bits_to_f32(raw)
    if s.name == "i1":
        return raw != 0
    return raw


def to_raw(values: Any, s: ScalarType) -> Any:
    """In-memory bit patterns of values of type `s`."""
    if s.name == "bf16":
        return f32_to_bf16_bits(values)
    if s.name == "i1":
        return np.asarray(values).astype(np.uint8)
    return values


# ------------------------------------------------------------------------------------------ constants


def scalar_value(value: int | float | bool, s: ScalarType) -> Any:
    """A Python number as a numpy scalar of type `s` (ints wrap, floats round to nearest even)."""
    if s.is_bool:
        return np.bool_(bool(value))
    if s.is_int:
        return np.dtype(s.numpy_name).type(wrap_int(int(value), s))
    if s.name == "bf16":
        return f64_to_bf16(float(value))
    return np.dtype(s.numpy_name).type(float(value))


# ------------------------------------------------------------------------------------------ casts


def cast(x: Any, src: ScalarType, dst: ScalarType) -> Any:
    """mt.cast: float -> float rounds to nearest even; float -> int truncates toward zero and saturates, NaN -> 0;
    int -> int wraps; int -> float rounds to nearest even; anything -> i1 is x != 0. Returns an array or scalar
    as `x` is."""
    a = np.asarray(x)
    if dst.is_bool:
        out = a != 0
    elif dst.is_float:
        out = _to_float(a, src, dst)
    elif src.is_float:
        out = _float_to_int(a, dst)
    else:
        out = a.astype(dst.numpy_name)  # numpy integer casts wrap (two's complement)
    out = np.asarray(out)
    return out if a.ndim else out[()]


def _to_float(a: np.ndarray, src: ScalarType, dst: ScalarType) -> np.ndarray:
    if dst.name == "bf16":
        if src.name in ("bf16", "f32"):
            return round_bf16(a.astype(F32))
        return f64_to_bf16(a.astype(F64))  # one correct rounding (f16 and ints up to 2**53 convert exactly)
    return a.astype(dst.numpy_name)  # numpy converts with one round-to-nearest-even


def _float_to_int(a: np.ndarray, dst: ScalarType) -> np.ndarray:
    info = np.iinfo(dst.numpy_name)
    t = np.trunc(a.astype(F64))
    nan = np.isnan(t)
    # float(info.max) may round up (2**63 for int64); any t at or above it saturates to max.
    high, low = t >= float(info.max), t <= float(info.min)
    safe = np.where(high | low | nan, 0.0, t)
    out = safe.astype(dst.numpy_name)
    out = np.where(high, info.max, out)
    out = np.where(low, info.min, out)
    return out.astype(dst.numpy_name)


def bitcast(x: Any, src: Type, dst: Type) -> Any:
    """mt.bitcast: reinterpret the bits (same width). bf16's bits are its 16-bit pattern; pointers are 64-bit."""
    a = np.asarray(x)
    s, d = src.scalar, dst.scalar
    if isinstance(s, ScalarType) and s.name == "bf16":
        a = f32_to_bf16_bits(a)
        a = np.asarray(a)
    elif isinstance(s, ScalarType) and s.is_bool:
        a = a.astype(np.uint8)
    if isinstance(d, ScalarType) and d.name == "bf16":
        out = bf16_bits_to_f32(a.view(np.uint16))
    elif isinstance(d, ScalarType) and d.is_bool:
        out = a.view(np.uint8) != 0
    else:
        out = a.view(dtype_of(dst))
    out = np.asarray(out)
    return out if out.ndim else out[()]
