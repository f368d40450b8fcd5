"""Specialization: what a kernel is compiled for, spelled the way Triton spells it.

Every runtime argument of a launch is summarised by a short code string, which is both the piece of the
specialization key (cheap to hash: Python caches string hashes) and a Triton-style type spelling:

    *fp32:16   pointer to f32 whose address is a multiple of 16 bytes
    *bf16      pointer to bf16, alignment unknown
    i32:16     32-bit int known to be a multiple of 16
    i32=1      32-bit int equal to 1 (the kernel is compiled with the value folded in)
    i64, fp32, i1
    tensordesc<bf16[64,64]>   a TMA tensor descriptor of bf16 moved in 64x64 blocks (runtime/tma.py)

`parse_arg_spec` turns such a code back into an ArgSpec (type, divisibility, equal-to-one) and is the one parser for
these spellings: the launch path decodes its keys with it, and `parse_signature` (the AOT `--signature
"x:*fp32,n:i32"` strings of `kernel.specialize` and the CLI) is built on it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

from minitriton.ir.types import PointerType, ScalarType, TensorDescType, TRITON_SPELLINGS, Type

# Integer ranges a Python int is passed in; anything else cannot be a kernel argument.
I32_MIN, I32_MAX = -(2**31), 2**31 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1


class SignatureError(ValueError):
    """A signature string names an unknown type or parameter, or does not cover the kernel's parameters."""


@dataclass(frozen=True)
class ArgSpec:
    """What the compiler may assume about one runtime argument."""

    type: Type
    divisibility: int = 1  # 16 when the address / value is known to be a multiple of 16
    equal_to_one: bool = False

    @property
    def code(self) -> str:
        """The Triton-style spelling (`*fp32:16`, `i32=1`); parse_arg_spec(code) == self."""
        base = type_spelling(self.type)
        if self.equal_to_one:
            return base + "=1"
        return base + (":16" if self.divisibility == 16 else "")


def type_spelling(ty: Type) -> str:
    """`!mt.ptr<f32>` -> `*fp32`, `i32` -> `i32` (Triton's spelling)."""
    if isinstance(ty, PointerType):
        return "*" + ty.pointee.triton_name
    if isinstance(ty, ScalarType):
        return ty.triton_name
    if isinstance(ty, TensorDescType):
        from .tma import descriptor_code

        return descriptor_code(ty)
    raise TypeError(f"{ty} has no Triton spelling")


@functools.lru_cache(maxsize=None)
def parse_arg_spec(text: str) -> ArgSpec:
    """Parse `*fp32`, `*bf16:16`, `i32`, `i32:16`, `i32=1`, `fp32` into an ArgSpec (SignatureError if unknown)."""
    body = text.strip()
    if body.startswith("tensordesc<"):  # a TMA tensor descriptor: `tensordesc<bf16[64,64]>` (runtime/tma.py)
        from .tma import parse_descriptor_code

        try:
            desc = parse_descriptor_code(body)
        except ValueError as e:
            raise SignatureError(str(e)) from None
        if desc is None:
            raise SignatureError(f"bad tensor descriptor type {text!r}; expected e.g. tensordesc<bf16[64,64]>")
        return ArgSpec(desc)
    equal_to_one = body.endswith("=1")
    if equal_to_one:
        body = body[:-2]
    divisibility = 1
    if ":" in body:
        body, _, div = body.partition(":")
        if div.strip() not in ("1", "16"):
            raise SignatureError(f"bad divisibility ':{div.strip()}' in {text!r}: only ':16' (or ':1') is supported")
        divisibility = int(div)
    body = body.strip()
    is_pointer = body.startswith("*")
    scalar = TRITON_SPELLINGS.get(body[1:].strip() if is_pointer else body)
    if scalar is None:
        raise SignatureError(f"unknown type {body!r} in {text!r}; known types: {known_spellings()}")
    ty: Type = PointerType(scalar) if is_pointer else scalar
    if equal_to_one and (is_pointer or not scalar.is_int or scalar.is_bool):
        raise SignatureError(f"'=1' only applies to integer scalars, not {body!r}")
    if divisibility == 16 and not is_pointer and not scalar.is_int:
        raise SignatureError(f"':16' only applies to pointers and integers, not {body!r}")
    return ArgSpec(ty, divisibility, equal_to_one)


def known_spellings() -> str:
    names = sorted({s.triton_name for s in TRITON_SPELLINGS.values()})
    return ", ".join(names) + " (pointers: *" + ", *".join(names) + ")"


def parse_signature(signature: str, runtime_params: Sequence[str],
                    constexpr_params: Sequence[str] = ()) -> dict[str, ArgSpec]:
    """Parse an AOT signature into {param name: ArgSpec}, one entry per runtime (non-constexpr) parameter.

    Accepts `"x:*fp32, y:*fp32:16, n:i32"` (named, any order) or `"*fp32,*fp32,i32"` (positional, in the kernel's
    order of runtime parameters). Constexpr parameters are not part of a signature: their values are given as
    keyword arguments (or `-D NAME=VALUE`).
    """
    entries = [e.strip() for e in split_top_level(signature)]
    if entries == [""]:
        entries = []
    if any(not e for e in entries):
        raise SignatureError(f"empty entry in signature {signature!r}")
    named: dict[str, ArgSpec] = {}
    positional: list[ArgSpec] = []
    for entry in entries:
        name, spec = _split_entry(entry, runtime_params, constexpr_params)
        if name is None:
            positional.append(spec)
        elif name in named:
            raise SignatureError(f"parameter '{name}' appears twice in signature {signature!r}")
        else:
            named[name] = spec
    if named and positional:
        raise SignatureError(f"signature {signature!r} mixes named and positional entries; use one style")
    if positional:
        if len(positional) != len(runtime_params):
            raise SignatureError(
                f"signature {signature!r} has {len(positional)} types but the kernel has {len(runtime_params)} "
                f"runtime parameters ({', '.join(runtime_params) or 'none'})")
        return dict(zip(runtime_params, positional))
    missing = [p for p in runtime_params if p not in named]
    if missing:
        raise SignatureError(f"signature {signature!r} gives no type for parameter(s) {', '.join(missing)}")
    return {p: named[p] for p in runtime_params}


def split_top_level(text: str) -> list[str]:
    """Split at the commas outside brackets (`tensordesc<bf16[64,64]>` holds commas of its own)."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "[<":
            depth += 1
        elif c in "]>":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _split_entry(entry: str, runtime_params: Sequence[str],
                 constexpr_params: Sequence[str]) -> tuple[str | None, ArgSpec]:
    """`name:type` -> (name, spec); `type` or `type:16` -> (None, spec)."""
    head, sep, rest = entry.partition(":")
    head = head.strip()
    if sep and head in runtime_params:
        return head, parse_arg_spec(rest)
    if sep and head in constexpr_params:
        raise SignatureError(f"'{head}' is a constexpr parameter: give its value as {head}=VALUE, not a type")
    try:
        return None, parse_arg_spec(entry)
    except SignatureError:
        if sep and head.isidentifier() and head not in TRITON_SPELLINGS:
            known = ", ".join(runtime_params) or "none"
            raise SignatureError(f"unknown parameter '{head}' in signature entry {entry!r}; "
                                 f"runtime parameters: {known}") from None
        raise


# ------------------------------------------------------------------------------------ launch-time codes


def int_code(value: int) -> str:
    """The key code of a Python int argument (ValueError if it does not fit in 64 bits)."""
    if I32_MIN <= value <= I32_MAX:
        if value == 1:
            return "i32=1"
        return "i32" if value & 15 else "i32:16"
    if I64_MIN <= value <= I64_MAX:
        return "i64" if value & 15 else "i64:16"
    raise ValueError(f"{value} does not fit in a 64-bit integer")


@functools.lru_cache(maxsize=None)
def torch_pointer_codes() -> dict[Any, tuple[str, str]]:
    """torch dtype -> (code when unaligned, code when 16-byte aligned); indexing by `ptr % 16 == 0` picks one."""
    import torch

    table = {
        torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
        torch.int8: "i8", torch.uint8: "u8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
        torch.bool: "i1",
    }
    for name, spelling in (("uint16", "u16"), ("uint32", "u32"), ("uint64", "u64")):
        if hasattr(torch, name):  # unsigned wide dtypes exist from torch 2.3
            table[getattr(torch, name)] = spelling
    return {dtype: ("*" + s, "*" + s + ":16") for dtype, s in table.items()}


def supported_dtypes() -> str:
    return ", ".join(str(d).replace("torch.", "") for d in torch_pointer_codes())
