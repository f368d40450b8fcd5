"""Exact scalar arithmetic helpers shared by the frontend, constant folding and the interpreter:
rounding a number to a float type (f16, bf16, f32) and wrapping an integer to an integer type."""
from __future__ import annotations

import numpy as np

from .types import ScalarType


def bf16_round(x: np.ndarray | float) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), returned as float32. NaN stays NaN."""
    a = np.asarray(x, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    out = rounded.view(np.float32)
    return np.where(np.isnan(a), a, out)


def round_float(value: float, ty: ScalarType) -> float:
    """`value` rounded to the precision of float type `ty` (f64 unchanged)."""
    if ty.name == "f32":
        return float(np.float32(value))
    if ty.name == "f16":
        return float(np.float16(value))
    if ty.name == "bf16":
        return float(bf16_round(np.float32(value)))
    return float(value)


def wrap_int(value: int, ty: ScalarType) -> int:
    """`value` wrapped to the range of integer type `ty` (two's complement; i1 keeps the low bit)."""
    bits = ty.bits
    v = int(value) & ((1 << bits) - 1)
    if ty.is_signed and bits > 1 and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v
