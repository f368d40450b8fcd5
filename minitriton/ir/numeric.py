"""Exact scalar arithmetic helpers shared by the frontend, constant folding and the interpreter:
rounding a number to a float type (f16, bf16, f32) and wrapping an integer to an integer type."""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Union

import numpy as np

from .types import ScalarType

Number = Union[int, float]


def bf16_round(x: np.ndarray | float) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), returned as float32. NaN stays NaN."""
    a = np.asarray(x, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    out = rounded.view(np.float32)
    return np.where(np.isnan(a), a, out)


_FLOAT_FORMATS = {"f16": (11, -14, 15), "bf16": (8, -126, 127), "f32": (24, -126, 127), "f64": (53, -1022, 1023)}


def round_exact(x: Number | Fraction, ty: ScalarType) -> float:
    """The value of type `ty` nearest to the exact number `x`, ties to even, overflowing to inf (IEEE RNE).

    The exact value is rounded once, so an i64 -> f32 cast or an f64 -> bf16 cast gives what a single cvt.rn
    gives (going through f32 first would round twice).
    """
    if isinstance(x, float) and not math.isfinite(x):
        return x
    if x == 0:
        return float(x) if isinstance(x, float) else 0.0  # keeps the sign of a float zero
    precision, emin, emax = _FLOAT_FORMATS[ty.name]
    magnitude = abs(Fraction(x))
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:
        exponent -= 1  # now 2**exponent <= magnitude < 2**(exponent + 1)
    quantum = Fraction(2) ** (max(exponent, emin) - precision + 1)  # the spacing of values there (subnormals too)
    rounded = round(magnitude / quantum) * quantum  # Fraction rounds half to even
    largest = (2 - Fraction(2) ** (1 - precision)) * Fraction(2) ** emax
    result = math.inf if rounded > largest else float(rounded)  # float() is exact: rounded fits in an f64
    return -result if x < 0 else result


def round_float(value: float, ty: ScalarType) -> float:
    """`value` rounded once to the nearest value of float type `ty` (ties to even; NaN and inf unchanged)."""
    if isinstance(value, float) and math.isnan(value):
        return value
    return round_exact(value, ty)


def wrap_int(value: int, ty: ScalarType) -> int:
    """`value` wrapped to the range of integer type `ty` (two's complement; i1 keeps the low bit)."""
    bits = ty.bits
    v = int(value) & ((1 << bits) - 1)
    if ty.is_signed and bits > 1 and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v
