"""IR types: scalars, pointers, tensors (with an optional layout encoding) and function types.

Every type prints as valid MLIR type syntax:
  scalars   i1 i8 ui8 i16 ui16 i32 ui32 i64 ui64 f16 bf16 f32 f64
  pointers  !mt.ptr<f32>            (a global-memory address of an f32)
  TMA descs !mt.tensordesc<tensor<64x64xbf16>>   (a tensor map moving 64x64 bf16 boxes)
  tensors   tensor<64x128xbf16>     or, after tiling, tensor<64x128xbf16, #mt.blocked<{...}>>
  functions (!mt.ptr<f32>, i32) -> ()

Types are immutable and hashable, so they compare by value and can key dictionaries.
The language's dtypes (`mt.float32`, `mt.bfloat16`, ...) are the scalar types themselves.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class Type:
    """Base of every IR type."""

    @property
    def scalar(self) -> "ScalarType | PointerType":
        """The element type of a tensor, or the type itself."""
        return self  # type: ignore[return-value]

    @property
    def shape(self) -> tuple[int, ...]:
        return ()

    @property
    def is_tensor(self) -> bool:
        return False

    @property
    def is_pointer(self) -> bool:
        return isinstance(self.scalar, PointerType)


@dataclass(frozen=True)
class ScalarType(Type):
    """A number type. `name` is its MLIR spelling (i32, ui8, bf16, ...)."""

    name: str

    def __post_init__(self) -> None:
        if self.name not in _SCALAR_INFO:
            raise ValueError(f"unknown scalar type {self.name!r}")

    @property
    def bits(self) -> int:
        return _SCALAR_INFO[self.name][0]

    @property
    def is_float(self) -> bool:
        return self.name.startswith(("f", "bf"))

    @property
    def is_int(self) -> bool:
        return not self.is_float

    @property
    def is_bool(self) -> bool:
        return self.name == "i1"

    @property
    def is_signed(self) -> bool:
        """Integers: two's complement signed (i8..i64) or unsigned (ui8..ui64); floats are signed."""
        return not self.name.startswith("ui")

    @property
    def bytes(self) -> int:
        return max(1, self.bits // 8)

    @property
    def numpy_name(self) -> str:
        """The numpy dtype name holding this type's values (bf16 is held as float32, rounded)."""
        return _SCALAR_INFO[self.name][1]

    @property
    def triton_name(self) -> str:
        """The spelling Triton signatures use (fp32, bf16, i32, u8, i1)."""
        return _SCALAR_INFO[self.name][2]

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__


# name -> (bits, numpy dtype holding values, Triton spelling)
_SCALAR_INFO: dict[str, tuple[int, str, str]] = {
    "i1": (1, "bool", "i1"),
    "i8": (8, "int8", "i8"),
    "ui8": (8, "uint8", "u8"),
    "i16": (16, "int16", "i16"),
    "ui16": (16, "uint16", "u16"),
    "i32": (32, "int32", "i32"),
    "ui32": (32, "uint32", "u32"),
    "i64": (64, "int64", "i64"),
    "ui64": (64, "uint64", "u64"),
    "f16": (16, "float16", "fp16"),
    "bf16": (16, "float32", "bf16"),
    "f32": (32, "float32", "fp32"),
    "f64": (64, "float64", "fp64"),
}

int1 = i1 = ScalarType("i1")
int8 = i8 = ScalarType("i8")
uint8 = u8 = ScalarType("ui8")
int16 = i16 = ScalarType("i16")
uint16 = u16 = ScalarType("ui16")
int32 = i32 = ScalarType("i32")
uint32 = u32 = ScalarType("ui32")
int64 = i64 = ScalarType("i64")
uint64 = u64 = ScalarType("ui64")
float16 = f16 = ScalarType("f16")
bfloat16 = bf16 = ScalarType("bf16")
float32 = f32 = ScalarType("f32")
float64 = f64 = ScalarType("f64")

SCALAR_TYPES: dict[str, ScalarType] = {n: ScalarType(n) for n in _SCALAR_INFO}
TRITON_SPELLINGS: dict[str, ScalarType] = {info[2]: SCALAR_TYPES[n] for n, info in _SCALAR_INFO.items()}
TRITON_SPELLINGS.update({"f32": f32, "f16": f16, "f64": f64, "bool": i1, "int32": i32, "int64": i64})


@dataclass(frozen=True)
class PointerType(Type):
    """An address in global memory of an element of type `pointee`."""

    pointee: ScalarType

    def __str__(self) -> str:
        return f"!mt.ptr<{self.pointee}>"

    __repr__ = __str__


@dataclass(frozen=True)
class LayoutAttr:
    """A layout encoding: `#mt.<kind><{key = value, ...}>`.

    The IR core only stores and prints the parameters; the tiling pass (passes/tiling.py) and the codegen give
    them meaning (blocked, slice, mma, dot_op, shared). `params` is a tuple of (key, value) pairs so the
    attribute is hashable; values are ints, strings, tuples of ints, or nested LayoutAttrs.
    """

    kind: str
    params: tuple[tuple[str, Any], ...] = ()

    def get(self, key: str, default: Any = None) -> Any:
        for k, v in self.params:
            if k == key:
                return v
        return default

    def __str__(self) -> str:
        from .printer import format_attr  # the printer owns attribute syntax

        body = ", ".join(f"{k} = {format_attr(v)}" for k, v in self.params)
        return f"#mt.{self.kind}<{{{body}}}>"

    __repr__ = __str__


def layout(kind: str, **params: Any) -> LayoutAttr:
    """Build a LayoutAttr from keywords (lists become tuples so it stays hashable)."""
    items = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items())
    return LayoutAttr(kind, items)


@dataclass(frozen=True)
class TensorType(Type):
    """A tile: a static shape of power-of-two dims, an element type and, after tiling, a layout encoding."""

    dims: tuple[int, ...]
    element: ScalarType | PointerType
    encoding: LayoutAttr | None = field(default=None)

    @property
    def scalar(self) -> ScalarType | PointerType:
        return self.element

    @property
    def shape(self) -> tuple[int, ...]:
        return self.dims

    @property
    def is_tensor(self) -> bool:
        return True

    @property
    def numel(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def rank(self) -> int:
        return len(self.dims)

    def with_element(self, element: ScalarType | PointerType) -> "TensorType":
        return TensorType(self.dims, element, self.encoding)

    def with_encoding(self, encoding: LayoutAttr | None) -> "TensorType":
        return TensorType(self.dims, self.element, encoding)

    def __str__(self) -> str:
        dims = "".join(f"{d}x" for d in self.dims)
        enc = f", {self.encoding}" if self.encoding is not None else ""
        return f"tensor<{dims}{self.element}{enc}>"

    __repr__ = __str__


# Element types a TMA tensor map can describe (cuTensorMapEncodeTiled's data types; no i1).
DESCRIPTOR_ELEMENTS = ("i8", "ui8", "i16", "ui16", "i32", "ui32", "i64", "ui64", "f16", "bf16", "f32", "f64")
TMA_SWIZZLE_BYTES = 128  # the one swizzle mode used: 16-byte chunk j of 128-byte row r holds chunk j ^ (r % 8)


@dataclass(frozen=True)
class TensorDescType(Type):
    """A TMA tensor descriptor: `!mt.tensordesc<tensor<64x64xbf16>>` describes a global tensor of that element type
    that loads and stores move in boxes of the block's shape. The global shape and strides are runtime values
    (inside the host-built tensor map); only the block shape and element type are compile-time."""

    block: TensorType

    @property
    def block_shape(self) -> tuple[int, ...]:
        return self.block.dims

    @property
    def element(self) -> ScalarType:
        return self.block.element  # type: ignore[return-value]

    @property
    def box_bytes(self) -> int:
        """Bytes one box (one block) occupies in shared memory."""
        return self.block.numel * self.element.bytes

    @property
    def swizzle_bytes(self) -> int:
        """The shared-memory swizzle span the host encodes and the codegen undoes: 128 when a block row is exactly
        128 bytes (the layout wgmma reads), else 0 (no swizzle). Host and codegen both read it from here."""
        inner = self.block.dims[-1] * self.element.bytes
        return TMA_SWIZZLE_BYTES if inner == TMA_SWIZZLE_BYTES else 0

    def problem(self) -> str | None:
        """Why TMA cannot move this block (None when it can): rank 1 to 5, an element type a tensor map describes,
        box dims that are powers of two of at most 256, and block rows of a multiple of 16 bytes."""
        dims, name = self.block.dims, getattr(self.block.element, "name", None)
        if not 1 <= len(dims) <= 5:
            return f"a tensor descriptor block has rank 1 to 5, got {len(dims)}"
        if name not in DESCRIPTOR_ELEMENTS:
            return f"a tensor descriptor cannot hold {self.block.element} (TMA types: {', '.join(DESCRIPTOR_ELEMENTS)})"
        if any(not is_power_of_two(d) or d > 256 for d in dims):
            return f"tensor descriptor block {list(dims)}: each dim must be a power of two of at most 256"
        if dims[-1] * self.element.bytes % 16:
            return (f"tensor descriptor block {list(dims)} of {name}: the innermost dim must span a multiple of 16 "
                    f"bytes, it spans {dims[-1] * self.element.bytes}")
        return None

    def __str__(self) -> str:
        return f"!mt.tensordesc<{self.block}>"

    __repr__ = __str__


@dataclass(frozen=True)
class FunctionType(Type):
    """The type of a kernel: its argument types; kernels return nothing."""

    inputs: tuple[Type, ...]
    results: tuple[Type, ...] = ()

    def __str__(self) -> str:
        ins = ", ".join(map(str, self.inputs))
        outs = ", ".join(map(str, self.results))
        return f"({ins}) -> ({outs})"

    __repr__ = __str__


def tensor(shape: tuple[int, ...] | list[int], element: ScalarType | PointerType) -> TensorType:
    return TensorType(tuple(shape), element)


def with_scalar(ty: Type, scalar: ScalarType | PointerType) -> Type:
    """`ty` with its element type replaced (a scalar becomes `scalar`, a tensor keeps its shape and layout)."""
    if isinstance(ty, TensorType):
        return ty.with_element(scalar)
    return scalar


def with_shape(ty: Type, shape: tuple[int, ...]) -> Type:
    """A tensor of `shape` holding `ty`'s element type (a scalar when shape is empty); the layout is dropped."""
    return TensorType(tuple(shape), ty.scalar) if shape else ty.scalar


def is_power_of_two(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0
