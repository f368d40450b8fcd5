"""PTX registers and the type tables the emitter shares: which register class holds each IR type, the instruction
type suffixes, and how constants are spelled.

Register classes (virtual registers; ptxas allocates the real ones):
  pred  %p    i1
  b16   %h    f16, bf16 (bit patterns; arithmetic converts to f32 and back)
  b32   %r    i8 ui8 i16 ui16 i32 ui32 — narrow integers live sign- or zero-extended (per their signedness) in
              32-bit registers, re-normalized after every op that can carry bits out of the type
  b64   %rd   i64 ui64, pointers (global addresses)
  f32   %f    f32
  f64   %fd   f64
"""
from __future__ import annotations

import struct

from minitriton.ir.numeric import round_float, wrap_int
from minitriton.ir.types import PointerType, ScalarType

CLASS_PREFIX = {"pred": "%p", "b16": "%h", "b32": "%r", "b64": "%rd", "f32": "%f", "f64": "%fd"}
DECL_TYPE = {"pred": ".pred", "b16": ".b16", "b32": ".b32", "b64": ".b64", "f32": ".f32", "f64": ".f64"}
CLASS_BYTES = {"pred": 1, "b16": 2, "b32": 4, "b64": 8, "f32": 4, "f64": 8}

Elem = ScalarType | PointerType


def reg_class(t: Elem) -> str:
    """The register class holding values of scalar type `t`."""
    if isinstance(t, PointerType):
        return "b64"
    if t.is_bool:
        return "pred"
    if t.name in ("f16", "bf16"):
        return "b16"
    if t.name == "f32":
        return "f32"
    if t.name == "f64":
        return "f64"
    return "b64" if t.bits == 64 else "b32"


def is_half(t: Elem) -> bool:
    """f16 / bf16: stored as 16 bits, computed in f32."""
    return isinstance(t, ScalarType) and t.name in ("f16", "bf16")


def int_suffix(t: ScalarType) -> str:
    """The arithmetic type of an integer as held in registers: s32 / u32 (also for narrow types), s64 / u64."""
    width = 64 if t.bits == 64 else 32
    return f"{'s' if t.is_signed else 'u'}{width}"


def float_suffix(t: ScalarType) -> str:
    """The type float math runs in: f64 for f64, else f32."""
    return "f64" if t.name == "f64" else "f32"


def f32_literal(x: float) -> str:
    return "0f%08X" % struct.unpack("<I", struct.pack("<f", x))[0]


def f64_literal(x: float) -> str:
    return "0d%016X" % struct.unpack("<Q", struct.pack("<d", x))[0]


def half_bits(x: float, t: ScalarType) -> int:
    """The 16-bit pattern of x rounded to f16 / bf16."""
    v = round_float(x, t)
    if t.name == "f16":
        return struct.unpack("<H", struct.pack("<e", v))[0]
    return struct.unpack("<I", struct.pack("<f", v))[0] >> 16  # a bf16 value is an f32 with 16 zero low bits


def literal(value: float | int | bool, t: ScalarType) -> str:
    """`value` of type `t` as a PTX immediate for a `mov` into a register of t's class."""
    if t.is_bool:
        return "1" if value else "0"
    if t.name == "f32":
        return f32_literal(round_float(float(value), t))
    if t.name == "f64":
        return f64_literal(float(value))
    if is_half(t):
        return "0x%04X" % half_bits(float(value), t)
    v = wrap_int(int(value), t)
    return str(v)


def mov_type(cls: str) -> str:
    """The type suffix of `mov` for a register class."""
    return {"pred": "pred", "b16": "b16", "b32": "b32", "b64": "b64", "f32": "f32", "f64": "f64"}[cls]


class RegisterFile:
    """Hands out fresh virtual registers per class and writes their declarations."""

    def __init__(self) -> None:
        self.counts = {cls: 0 for cls in CLASS_PREFIX}

    def new(self, cls: str) -> str:
        self.counts[cls] += 1
        return f"{CLASS_PREFIX[cls]}{self.counts[cls]}"

    def declarations(self) -> list[str]:
        return [f".reg {DECL_TYPE[cls]} {CLASS_PREFIX[cls]}<{n + 1}>;" for cls, n in self.counts.items() if n]
