"""The meaning of the language's operations: type promotion, broadcasting, checks, and the IR they emit.

The AST visitor (ast_to_ir.py) hands every expression here. Values are either Python constants (folded in Python,
"weakly typed": `x * 2.0` keeps x's float type) or `TileValue`s wrapping an IR value (a scalar or a tile).
Every user mistake raises CompilationError; the visitor adds the source location.

Promotion (as in Triton): float beats int; the wider float wins and f16 with bf16 gives f32; among ints the wider
wins and, at equal width, unsigned wins; `/` on integers computes in f32; `//` and `%` on integers truncate (C).
"""
from __future__ import annotations

import builtins
import math
from typing import Any, Sequence

from minitriton.errors import CompilationError
from minitriton.ir import Builder, Value
from minitriton.ir.numeric import round_float, wrap_int
from minitriton.ir.ops import (BLOCK_KINDS, CACHE_MODIFIERS, DOT_INSTRUCTIONS, FENCE_SEMANTICS, L2_PREFETCH_BYTES,
                              PREFETCH_LEVELS)
from minitriton.ir.types import (PointerType, ScalarType, TensorDescType, TensorType, Type, bf16, f16, f32, f64, i1,
                                 i32, i64, is_power_of_two, with_scalar)

Number = (int, float, bool)
INF = builtins.float("inf")


class TileValue:
    """A frontend value backed by an IR value: a scalar or a tile. `x.to(...)`, `x.shape` etc. live here."""

    __slots__ = ("handle",)

    def __init__(self, handle: Value):
        self.handle = handle

    @property
    def type(self) -> Type:
        return self.handle.type

    @property
    def dtype(self) -> ScalarType | PointerType:
        return self.handle.type.scalar

    @property
    def shape(self) -> tuple[int, ...]:
        return self.handle.type.shape

    @property
    def is_tile(self) -> bool:
        return self.handle.type.is_tensor

    def __repr__(self) -> str:
        return f"<{self.type}>"


def error(msg: str) -> CompilationError:
    return CompilationError(msg)


def describe(x: Any) -> str:
    if isinstance(x, TileValue):
        return str(x.type)
    return f"{type(x).__name__} {x!r}"


def promote_scalars(a: ScalarType, b: ScalarType) -> ScalarType:
    """The common type of two element types."""
    if a == b:
        return a
    if a.is_float or b.is_float:
        if not (a.is_float and b.is_float):
            return a if a.is_float else b
        if {a.name, b.name} == {"f16", "bf16"}:
            return f32
        return a if a.bits >= b.bits else b
    if a.is_bool:
        return b
    if b.is_bool:
        return a
    if a.bits != b.bits:
        return a if a.bits > b.bits else b
    return a if not a.is_signed else b


def python_constant_type(c: Any) -> ScalarType:
    if isinstance(c, bool):
        return i1
    if isinstance(c, int):
        return i32 if -2**31 <= c < 2**31 else i64
    return f32


def weak_type(c: Any, other: ScalarType) -> ScalarType:
    """The type a Python constant takes next to a value of type `other`."""
    if isinstance(c, bool):
        return other
    if isinstance(c, int):
        if other.is_float:
            return other
        if other.is_bool:
            return python_constant_type(c)
        if c >= 2**(other.bits - (1 if other.is_signed else 0)) or (c < 0 and not other.is_signed and other.bits < 32):
            return promote_scalars(other, python_constant_type(c))
        return other
    return other if other.is_float else f32


class Semantic:
    """Emits IR for language operations through `builder`."""

    def __init__(self, builder: Builder):
        self.b = builder

    # ---------------------------------------------------------------------------------- constants

    def constant(self, value: Any, ty: Type) -> TileValue:
        s = ty.scalar
        if isinstance(s, PointerType):
            raise error(f"cannot make a pointer from the constant {value!r}")
        if s.is_float:
            v: Any = round_float(value, s)  # the IR holds the value its type can represent
        elif s.is_bool:
            v = bool(value)
        else:
            if isinstance(value, builtins.float) and (value != value or value in (INF, -INF)):
                raise error(f"the constant {value!r} cannot be converted to the integer type {s}")
            v = int(value)
            if isinstance(value, builtins.float) and value != v:
                raise error(f"the constant {value!r} is not an integer of type {s}")
            v = wrap_int(v, s)
        return TileValue(self.b.create1("mt.constant", [], ty, value=v))

    def to_value(self, x: Any, like: ScalarType | None = None) -> TileValue:
        """A TileValue for x; Python constants take the type they would next to `like`."""
        if isinstance(x, TileValue):
            return x
        if isinstance(x, Number):
            ty = weak_type(x, like) if like is not None else python_constant_type(x)
            return self.constant(x, ty)
        raise error(f"expected a number, scalar or tile, got {describe(x)}")

    # ---------------------------------------------------------------------------------- indices

    def program_id(self, axis: Any) -> TileValue:
        axis = self.static_int(axis, "axis")
        if axis not in (0, 1, 2):
            raise error(f"program_id axis must be 0, 1 or 2, got {axis}")
        return TileValue(self.b.create1("mt.program_id", [], i32, axis=axis))

    def num_programs(self, axis: Any) -> TileValue:
        axis = self.static_int(axis, "axis")
        if axis not in (0, 1, 2):
            raise error(f"num_programs axis must be 0, 1 or 2, got {axis}")
        return TileValue(self.b.create1("mt.num_programs", [], i32, axis=axis))

    def arange(self, start: Any, end: Any) -> TileValue:
        start, end = self.static_int(start, "arange start"), self.static_int(end, "arange end")
        n = end - start
        if not is_power_of_two(n):
            raise error(f"arange({start}, {end}) has {n} elements; tile sizes must be powers of two")
        return TileValue(self.b.create1("mt.arange", [], TensorType((n,), i32), start=start, end=end))

    def static_int(self, x: Any, what: str) -> int:
        if isinstance(x, bool) or not isinstance(x, int):
            raise error(f"{what} must be a compile-time integer (a literal or an mt.constexpr), got {describe(x)}")
        return x

    def static_shape(self, shape: Any) -> tuple[int, ...]:
        if isinstance(shape, int):
            shape = (shape,)
        if not isinstance(shape, (tuple, list)):
            raise error(f"a shape must be a tuple of compile-time integers, got {describe(shape)}")
        dims = tuple(self.static_int(d, "a shape dimension") for d in shape)
        for d in dims:
            if not is_power_of_two(d):
                raise error(f"shape {dims}: tile dimensions must be powers of two")
        return dims

    def full(self, shape: Any, value: Any, dtype: Any) -> TileValue:
        dims = self.static_shape(shape)
        dtype = self.check_dtype(dtype)
        ty = TensorType(dims, dtype) if dims else dtype
        if isinstance(value, Number):
            return self.constant(value, ty)
        v = self.cast(self.to_value(value), dtype)
        if v.is_tile:
            raise error(f"full() takes a scalar value, got {describe(value)}")
        return self.splat(v, dims) if dims else v

    def check_dtype(self, dtype: Any) -> ScalarType:
        if not isinstance(dtype, ScalarType):
            raise error(f"expected a dtype such as mt.float32, got {describe(dtype)}")
        return dtype

    # ---------------------------------------------------------------------------------- shapes

    def splat(self, x: TileValue, shape: tuple[int, ...]) -> TileValue:
        return TileValue(self.b.create1("mt.splat", [x.handle], TensorType(shape, x.dtype)))

    def expand_dims(self, x: Any, axis: Any) -> TileValue:
        x = self.to_value(x)
        axis = self.static_int(axis, "axis")
        if not x.is_tile:
            x = self.splat(x, (1,))
            if axis in (0, -1):
                return x
            raise error(f"axis {axis} out of range for a scalar")
        rank = len(x.shape)
        if not -rank - 1 <= axis <= rank:
            raise error(f"expand_dims axis {axis} out of range for shape {x.shape}")
        axis %= rank + 1
        shape = list(x.shape)
        shape.insert(axis, 1)
        return TileValue(self.b.create1("mt.expand_dims", [x.handle], TensorType(tuple(shape), x.dtype), axis=axis))

    def broadcast_to(self, x: Any, shape: Any) -> TileValue:
        x = self.to_value(x)
        dims = self.static_shape(shape)
        if not x.is_tile:
            return self.splat(x, dims)
        if x.shape == dims:
            return x
        if len(x.shape) > len(dims):
            raise error(f"cannot broadcast shape {x.shape} to {dims}")
        while len(x.shape) < len(dims):
            x = self.expand_dims(x, 0)
        for a, b in zip(x.shape, dims):
            if a != b and a != 1:
                raise error(f"cannot broadcast shape {x.shape} to {dims}")
        return TileValue(self.b.create1("mt.broadcast", [x.handle], TensorType(dims, x.dtype)))

    def broadcast_shapes(self, *shapes: tuple[int, ...]) -> tuple[int, ...]:
        rank = builtins.max(len(s) for s in shapes)
        out = []
        for i in range(rank):
            dims = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0}
            dims.discard(1)
            if len(dims) > 1:
                pretty = " and ".join(str(s) for s in shapes)
                raise error(f"shapes {pretty} cannot be broadcast together")
            out.append(dims.pop() if dims else 1)
        return tuple(out)

    def broadcast_all(self, *xs: TileValue) -> list[TileValue]:
        shapes = [x.shape for x in xs if x.is_tile]
        if not shapes:
            return list(xs)
        shape = self.broadcast_shapes(*shapes)
        return [self.broadcast_to(x, shape) for x in xs]

    def reshape(self, x: Any, shape: Any) -> TileValue:
        x = self.to_value(x)
        dims = self.static_shape(shape)
        n = 1
        for d in dims:
            n *= d
        numel = x.handle.type.numel if x.is_tile else 1  # type: ignore[union-attr]
        if n != numel:
            raise error(f"cannot reshape {x.shape} ({numel} elements) to {dims} ({n} elements)")
        if not x.is_tile:
            return self.splat(x, dims)
        if dims == x.shape:
            return x
        return TileValue(self.b.create1("mt.reshape", [x.handle], TensorType(dims, x.dtype)))

    def trans(self, x: Any, dims: Sequence[int]) -> TileValue:
        x = self.to_value(x)
        if not x.is_tile:
            raise error("trans needs a tile")
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        order = [self.static_int(d, "a dim") for d in dims] if dims else list(range(len(x.shape)))[::-1]
        if sorted(order) != list(range(len(x.shape))):
            raise error(f"trans order {order} is not a permutation of the dims of {x.shape}")
        shape = tuple(x.shape[i] for i in order)
        return TileValue(self.b.create1("mt.trans", [x.handle], TensorType(shape, x.dtype), order=order))

    def extract_slice(self, x: TileValue, bounds: Sequence[tuple[Any, Any, Any] | None]) -> TileValue:
        """x[start:stop, ...] with one (start, stop, step) per dim (None: the whole dim). Bounds are compile-time
        ints; each slice has a power-of-two size and starts at a multiple of it, inside the tile."""
        if len(bounds) != len(x.shape):
            raise error(f"{len(bounds)} slices for a tile of shape {x.shape}")
        offsets, sizes = [], []
        for d, (extent, b) in enumerate(zip(x.shape, bounds)):
            start, stop, step = b if b is not None else (None, None, None)
            start = 0 if start is None else self.static_int(start, f"a slice bound (dim {d})")
            stop = extent if stop is None else self.static_int(stop, f"a slice bound (dim {d})")
            if step is not None and self.static_int(step, "a slice step") != 1:
                raise error(f"tile slices take no step, got {step} in dim {d}")
            size = stop - start
            if not 0 <= start < stop <= extent:
                raise error(f"slice {start}:{stop} is out of range for dim {d} of a tile of shape {x.shape}")
            if not is_power_of_two(size) or start % size:
                raise error(f"slice {start}:{stop} of dim {d} must have a power-of-two size and start at a "
                            "multiple of it")
            offsets.append(start)
            sizes.append(size)
        if tuple(sizes) == x.shape:
            return x
        return TileValue(self.b.create1("mt.extract_slice", [x.handle], TensorType(tuple(sizes), x.dtype),
                                        offsets=offsets, sizes=sizes))

    def cat(self, xs: Any, axis: Any) -> TileValue:
        """The tiles in `xs` (one type, a power-of-two count) end to end along `axis`."""
        if not isinstance(xs, (tuple, list)) or not xs:
            raise error(f"cat needs a list of tiles, got {describe(xs)}")
        xs = [self.to_value(x) for x in xs]
        if len(xs) == 1:
            return xs[0]
        if not is_power_of_two(len(xs)):
            raise error(f"cat needs a power-of-two number of tiles (the result's extent must be one), got {len(xs)}")
        first = xs[0]
        if not first.is_tile:
            raise error("cat needs tiles, got a scalar")
        for x in xs[1:]:
            if x.type != first.type:
                raise error(f"cat needs tiles of one shape and dtype, got {first.type} and {x.type}")
        rank = len(first.shape)
        axis = self.static_int(axis, "cat's axis")
        if not -rank <= axis < rank:
            raise error(f"cat axis {axis} is out of range for shape {first.shape}")
        axis %= rank
        shape = tuple(s * len(xs) if d == axis else s for d, s in enumerate(first.shape))
        return TileValue(self.b.create1("mt.concat", [x.handle for x in xs], TensorType(shape, first.dtype),
                                        axis=axis))

    # ---------------------------------------------------------------------------------- casts

    def cast(self, x: Any, dtype: Any, bitcast: bool = False) -> TileValue:
        dtype = self.check_dtype(dtype)
        if isinstance(x, Number):
            return self.constant(x, dtype) if not bitcast else self.cast(self.to_value(x), dtype, True)
        x = self.to_value(x)
        src = x.dtype
        if src == dtype:
            return x
        if isinstance(src, PointerType):
            if bitcast and dtype.bits == 64:
                return TileValue(self.b.create1("mt.bitcast", [x.handle], with_scalar(x.type, dtype)))
            raise error(f"cannot convert a pointer ({x.type}) to {dtype}")
        if bitcast:
            if src.bits != dtype.bits:
                raise error(f"bitcast needs equal bit widths: {src} has {src.bits} bits, {dtype} has {dtype.bits}")
            return TileValue(self.b.create1("mt.bitcast", [x.handle], with_scalar(x.type, dtype)))
        return TileValue(self.b.create1("mt.cast", [x.handle], with_scalar(x.type, dtype)))

    def bitcast_split(self, x: Any, dtype: Any) -> TileValue:
        """[..., n] of a 64- / 32-bit type, or a 16-bit integer -> [..., n, 2] of `dtype` (half the width): the low
        and high halves of each element's bits (mt.bitcast_split)."""
        dtype = self.check_dtype(dtype)
        x = self.to_value(x)
        if not x.is_tile or isinstance(x.dtype, PointerType):
            raise error(f"bitcast_split needs a tile of numbers, got {x.type}")
        narrow_float = x.dtype.bits == 16 and (x.dtype.is_float or dtype.is_float)
        if x.dtype.bits not in (16, 32, 64) or dtype.bits * 2 != x.dtype.bits or narrow_float or dtype.is_bool:
            raise error(f"bitcast_split splits 64-, 32- or 16-bit (integer) elements into two of half the width: "
                        f"{x.dtype} ({x.dtype.bits} bits) -> {dtype} ({dtype.bits} bits)")
        return TileValue(self.b.create1("mt.bitcast_split", [x.handle], TensorType((*x.shape, 2), dtype)))

    def unify(self, a: Any, b: Any, what: str) -> tuple[TileValue, TileValue]:
        """Give two operands one element type and one shape (scalars splat only when the other is a tile)."""
        if not isinstance(a, TileValue) and not isinstance(b, TileValue):
            raise error(f"{what} needs a scalar or tile operand")
        for x in (a, b):
            if not isinstance(x, (TileValue,) + Number):
                raise error(f"unsupported operand for {what}: {describe(x)}")
        if isinstance(a, TileValue) and isinstance(a.dtype, PointerType) or \
                isinstance(b, TileValue) and isinstance(b.dtype, PointerType):
            raise error(f"{what} is not defined on pointers ({describe(a)}, {describe(b)})")
        ta = a.dtype if isinstance(a, TileValue) else None
        tb = b.dtype if isinstance(b, TileValue) else None
        if ta is None:
            ty = weak_type(a, tb)  # type: ignore[arg-type]
        elif tb is None:
            ty = weak_type(b, ta)
        else:
            ty = promote_scalars(ta, tb)  # type: ignore[arg-type]
        va, vb = self.cast(a, ty), self.cast(b, ty)
        va, vb = self.broadcast_all(va, vb)
        return va, vb

    # ---------------------------------------------------------------------------------- arithmetic

    def binary(self, op: str, a: Any, b: Any) -> Any:
        """a <op> b for op in add sub mul div floordiv rem and or xor shl shr maximum minimum pow."""
        if op in ("add", "sub") and (self.is_pointer(a) or self.is_pointer(b)):
            return self.pointer_arith(op, a, b)
        if op == "div":
            return self.true_div(a, b)
        x, y = self.unify(a, b, OP_SYMBOLS.get(op, op))
        s = x.dtype
        if op in ("and", "or", "xor", "shl", "shr") and s.is_float:  # type: ignore[union-attr]
            raise error(f"'{OP_SYMBOLS[op]}' needs integer operands, got {x.type} and {y.type}")
        if op == "floordiv":
            if s.is_float:  # type: ignore[union-attr]
                raise error("'//' is only defined on integers here; use mt.floor(a / b) for floats")
            op = "div"
        if op == "pow" and not s.is_float:  # type: ignore[union-attr]
            raise error("'**' needs floating-point operands")
        return TileValue(self.b.create1(f"mt.{op}", [x.handle, y.handle], x.type))

    def true_div(self, a: Any, b: Any) -> TileValue:
        x, y = self.unify(a, b, "/")
        if not x.dtype.is_float:  # type: ignore[union-attr]
            x, y = self.cast(x, f32), self.cast(y, f32)
        return TileValue(self.b.create1("mt.div", [x.handle, y.handle], x.type))

    def is_pointer(self, x: Any) -> bool:
        return isinstance(x, TileValue) and isinstance(x.dtype, PointerType)

    def pointer_arith(self, op: str, a: Any, b: Any) -> TileValue:
        if self.is_pointer(b):
            if op == "sub":
                raise error("pointer subtraction (int - pointer or pointer - pointer) is not supported")
            a, b = b, a
        if self.is_pointer(b):
            raise error("cannot add two pointers")
        off = self.to_value(b)
        if off.dtype.is_float or isinstance(off.dtype, PointerType):  # type: ignore[union-attr]
            raise error(f"pointer offsets must be integers, got {off.type}")
        if off.dtype.is_bool or off.dtype.bits < 32:  # type: ignore[union-attr]
            off = self.cast(off, i32)
        if op == "sub":
            off = TileValue(self.b.create1("mt.neg", [off.handle], off.type))
        p, off = self.broadcast_all(a, off)
        return TileValue(self.b.create1("mt.addptr", [p.handle, off.handle], p.type))

    def compare(self, pred: str, a: Any, b: Any) -> TileValue:
        x, y = self.unify(a, b, CMP_SYMBOLS[pred])
        return TileValue(self.b.create1("mt.cmp", [x.handle, y.handle], with_scalar(x.type, i1), predicate=pred))

    def neg(self, x: Any) -> TileValue:
        x = self.to_value(x)
        if isinstance(x.dtype, PointerType):
            raise error("cannot negate a pointer")
        return TileValue(self.b.create1("mt.neg", [x.handle], x.type))

    def invert(self, x: Any) -> TileValue:
        x = self.to_value(x)
        if isinstance(x.dtype, PointerType) or x.dtype.is_float:
            raise error(f"'~' needs integer operands, got {x.type}")
        return TileValue(self.b.create1("mt.not", [x.handle], x.type))

    def logical_not(self, x: TileValue) -> TileValue:
        return TileValue(self.b.create1("mt.not", [self.to_bool(x).handle], with_scalar(x.type, i1)))

    def to_bool(self, x: Any) -> TileValue:
        """x != 0 for numbers, x itself for i1."""
        x = self.to_value(x)
        if x.dtype == i1:
            return x
        if isinstance(x.dtype, PointerType):
            raise error("a pointer cannot be used as a condition")
        return self.compare("ne", x, 0)

    def unary_math(self, name: str, x: Any) -> TileValue:
        x = self.to_value(x, like=f32)
        if isinstance(x.dtype, PointerType):
            raise error(f"mt.{name} is not defined on pointers")
        if not x.dtype.is_float:
            x = self.cast(x, f32)
        return TileValue(self.b.create1(f"mt.{name}", [x.handle], x.type))

    def abs(self, x: Any) -> Any:
        if isinstance(x, Number):
            return builtins.abs(x)
        x = self.to_value(x)
        if isinstance(x.dtype, PointerType):
            raise error("mt.abs is not defined on pointers")
        return TileValue(self.b.create1("mt.abs", [x.handle], x.type))

    def fma(self, x: Any, y: Any, z: Any) -> TileValue:
        a, b = self.unify(x, y, "fma")
        a, c = self.unify(a, z, "fma")
        a, b = self.unify(a, b, "fma")
        if not a.dtype.is_float:  # type: ignore[union-attr]
            raise error("mt.fma needs floating-point operands")
        return TileValue(self.b.create1("mt.fma", [a.handle, b.handle, c.handle], a.type))

    def cdiv(self, x: Any, y: Any) -> Any:
        if isinstance(x, int) and isinstance(y, int):
            return -(-x // y)
        return self.binary("floordiv", self.binary("sub", self.binary("add", x, y), 1), y)

    def where(self, cond: Any, x: Any, y: Any) -> Any:
        if isinstance(cond, Number):
            return x if cond else y
        c = self.to_bool(cond)
        if isinstance(x, TileValue) and isinstance(x.dtype, PointerType):
            if not (isinstance(y, TileValue) and y.dtype == x.dtype):
                raise error(f"where() needs two pointers of one type, got {describe(x)} and {describe(y)}")
            a, b = x, y
            c, a, b = self.broadcast_all(c, a, b)
        else:
            if not isinstance(x, TileValue) and not isinstance(y, TileValue):
                x = self.to_value(x, like=python_constant_type(y) if isinstance(y, Number) else None)
            a, b = self.unify(x, y, "where")
            c, a, b = self.broadcast_all(c, a, b)
        return TileValue(self.b.create1("mt.select", [c.handle, a.handle, b.handle], a.type))

    # ---------------------------------------------------------------------------------- memory

    def pointer_operand(self, p: Any, what: str) -> TileValue:
        if not self.is_pointer(p):
            raise error(f"{what} needs a pointer or a tile of pointers, got {describe(p)}")
        return p

    def mask_operand(self, mask: Any, p: TileValue) -> tuple[TileValue, TileValue]:
        m = self.to_bool(mask)
        p, m = self.broadcast_all(p, m)
        return p, m

    def load(self, pointer: Any, mask: Any, other: Any, cache_modifier: Any = "", l2_prefetch: Any = 0,
             layout: Any = None) -> TileValue:
        p = self.pointer_operand(pointer, "load")
        attrs = {**self.cache_modifier_attr(cache_modifier), **self.l2_prefetch_attr(l2_prefetch),
                 **self.layout_attr(layout, p, "load")}
        operands = [p]
        if mask is not None:
            p, m = self.mask_operand(mask, p)
            operands = [p, m]
            if other is not None:
                o = self.cast(other, p.dtype.pointee)  # type: ignore[union-attr]
                p, m, o = self.broadcast_all(p, m, o)
                operands = [p, m, o]
        elif other is not None:
            raise error("load(..., other=...) needs a mask")
        ty = with_scalar(p.type, p.dtype.pointee)  # type: ignore[union-attr]
        return TileValue(self.b.create1("mt.load", [v.handle for v in operands], ty, **attrs))

    @staticmethod
    def cache_modifier_attr(cache_modifier: Any) -> dict[str, str]:
        """The load's `cache_modifier` attr (none for the default "")."""
        if cache_modifier in ("", None):
            return {}
        if cache_modifier not in CACHE_MODIFIERS:
            raise error(f"load(cache_modifier=...) must be one of '', {', '.join(map(repr, CACHE_MODIFIERS))}, "
                        f"got {cache_modifier!r}")
        return {"cache_modifier": cache_modifier}

    @staticmethod
    def layout_attr(layout: Any, p: TileValue, what: str = "load") -> dict[str, Any]:
        """A load's or store's explicit `layout` attr (an mt.blocked of the tile's rank), checked here (num_warps:
        the tiling pass)."""
        if layout is None:
            return {}
        from minitriton import language as mtl
        from minitriton.ir.layouts import blocked as blocked_layout

        if not isinstance(layout, mtl.blocked):
            raise error(f"{what}(layout=...) takes an mt.blocked(size_per_thread, threads_per_warp, warps_per_cta, "
                        f"order), got {layout!r}")
        rank = len(p.type.shape) if p.is_tile else 0
        fields = (layout.size_per_thread, layout.threads_per_warp, layout.warps_per_cta, layout.order)
        if not all(isinstance(x, int) and not isinstance(x, bool) for f in fields for x in f):
            raise error(f"{what}(layout={layout!r}) takes compile-time ints")
        if rank == 0 or any(len(f) != rank for f in fields):
            raise error(f"{what}(layout={layout!r}) needs a tile {what} with one entry per dim (rank {rank})")
        try:
            return {"layout": blocked_layout(*fields)}
        except ValueError as e:
            raise error(f"{what}(layout={layout!r}): {e}") from None

    @staticmethod
    def l2_prefetch_attr(l2_prefetch: Any) -> dict[str, int]:
        """The load's `l2_prefetch` attr (none for the default 0)."""
        if l2_prefetch in (0, None):
            return {}
        if isinstance(l2_prefetch, bool) or l2_prefetch not in L2_PREFETCH_BYTES:
            raise error(f"load(l2_prefetch=...) must be 0 or one of {', '.join(map(str, L2_PREFETCH_BYTES))} (bytes), "
                        f"got {l2_prefetch!r}")
        return {"l2_prefetch": int(l2_prefetch)}

    def prefetch(self, pointer: Any, mask: Any, level: Any) -> None:
        p = self.pointer_operand(pointer, "prefetch")
        if level not in PREFETCH_LEVELS:
            raise error(f"prefetch(level=...) must be one of {', '.join(map(repr, PREFETCH_LEVELS))}, got {level!r}")
        operands = [p] if mask is None else list(self.mask_operand(mask, p))
        self.b.create("mt.prefetch", [v.handle for v in operands], attrs={"level": level})

    def store(self, pointer: Any, value: Any, mask: Any, layout: Any = None) -> None:
        p = self.pointer_operand(pointer, "store")
        v = self.cast(value, p.dtype.pointee)  # type: ignore[union-attr]
        if v.is_tile and (not p.is_tile or self.broadcast_shapes(p.shape, v.shape) != p.shape):
            raise error(f"cannot store a value of shape {v.shape} through pointers of shape {p.shape}")
        operands = [p, v]
        if mask is not None:
            m = self.to_bool(mask)
            operands = self.broadcast_all(p, v, m)
        else:
            operands = self.broadcast_all(p, v)
        self.b.create("mt.store", [o.handle for o in operands], attrs=self.layout_attr(layout, operands[0], "store"))

    def barrier(self) -> None:
        self.b.create("mt.barrier", [])

    def griddep(self, name: str) -> None:
        self.b.create(name, [])

    def fence(self, sem: Any) -> None:
        if sem not in FENCE_SEMANTICS:
            raise error(f"fence(sem=...) must be one of {', '.join(map(repr, FENCE_SEMANTICS))}, got {sem!r}")
        self.b.create("mt.fence", [], attrs={"sem": sem})

    def atomic_add(self, pointer: Any, value: Any, mask: Any) -> TileValue:
        p = self.pointer_operand(pointer, "atomic_add")
        v = self.cast(value, p.dtype.pointee)  # type: ignore[union-attr]
        operands = self.broadcast_all(p, v) if mask is None else self.broadcast_all(p, v, self.to_bool(mask))
        return TileValue(self.b.create1("mt.atomic_add", [o.handle for o in operands], operands[1].type))

    # ---------------------------------------------------------------------------------- tensor descriptors

    def descriptor_operand(self, desc: Any, what: str) -> TensorDescType:
        if not (isinstance(desc, TileValue) and isinstance(desc.type, TensorDescType)):
            raise error(f"{what} needs a tensor descriptor (an mt.TensorDescriptor argument), got {describe(desc)}")
        return desc.type

    def descriptor_coords(self, ty: TensorDescType, offsets: Any, what: str) -> list[Value]:
        """One i32 scalar per block dim (ints of other widths convert, as TMA coordinates are 32-bit)."""
        rank = len(ty.block_shape)
        if isinstance(offsets, (Number, TileValue)) and rank == 1:
            offsets = (offsets,)
        if not isinstance(offsets, (tuple, list)) or len(offsets) != rank:
            raise error(f"{what} needs {rank} offsets (one per dim of the block {list(ty.block_shape)}), "
                        f"got {describe(offsets)}")
        coords = []
        for x in offsets:
            v = self.to_value(x, like=i32) if isinstance(x, (bool, int)) else x
            if not isinstance(v, TileValue) or v.is_tile or isinstance(v.dtype, (PointerType, TensorDescType)) \
                    or not v.dtype.is_int or v.dtype.is_bool:  # type: ignore[union-attr]
                raise error(f"{what} offsets must be integer scalars, got {describe(x)}")
            coords.append(self.cast(v, i32).handle)
        return coords

    def descriptor_load(self, desc: Any, offsets: Any) -> TileValue:
        ty = self.descriptor_operand(desc, "load_tensor_descriptor")
        coords = self.descriptor_coords(ty, offsets, "load_tensor_descriptor")
        return TileValue(self.b.create1("mt.descriptor_load", [desc.handle, *coords], ty.block))

    def descriptor_store(self, desc: Any, offsets: Any, value: Any) -> None:
        ty = self.descriptor_operand(desc, "store_tensor_descriptor")
        coords = self.descriptor_coords(ty, offsets, "store_tensor_descriptor")
        v = self.cast(value, ty.element)
        block = ty.block_shape
        whole_blocks = v.is_tile and len(v.shape) == len(block) and all(
            n >= b and n % b == 0 for n, b in zip(v.shape, block))
        if v.is_tile and not whole_blocks and (len(v.shape) > len(block) or
                                               any(a not in (1, b) for a, b in zip(reversed(v.shape), reversed(block)))):
            raise error(f"cannot store a tile of shape {v.shape} into descriptor blocks of shape {ty.block_shape}: "
                        "give a tile of the block's shape (or one that broadcasts to it) or of whole blocks")
        if not whole_blocks:
            v = self.broadcast_to(v, ty.block_shape)
        self.b.create("mt.descriptor_store", [desc.handle, *coords, v.handle])

    # ---------------------------------------------------------------------------------- reductions

    def accumulation_type(self, s: ScalarType) -> ScalarType:
        if s.is_float:
            return f32 if s.bits < 32 else s
        return i32 if s.bits < 32 else s

    def normalize_axis(self, axis: Any, rank: int) -> int:
        axis = self.static_int(axis, "axis")
        if not -rank <= axis < rank:
            raise error(f"axis {axis} is out of range for a tile of rank {rank}")
        return axis % rank

    def reduce(self, x: Any, axis: Any, kind: str, keep_dims: bool) -> TileValue:
        x = self.to_value(x)
        if isinstance(x.dtype, PointerType):
            raise error(f"cannot reduce pointers with {kind}")
        if not x.is_tile:
            raise error(f"mt.{kind} needs a tile, got the scalar {x.type}")
        if kind == "sum":
            x = self.cast(x, self.accumulation_type(x.dtype))  # type: ignore[arg-type]
        if axis is None:
            shape = x.shape
            flat = self.reshape(x, (x.handle.type.numel,))  # type: ignore[union-attr]
            r = self.reduce_axis(flat, 0, kind)
            if keep_dims:
                return self.reshape(r, (1,) * len(shape))
            return r
        if isinstance(axis, (tuple, list)):
            return self.reduce_axes(x, axis, kind, keep_dims)
        ax = self.normalize_axis(axis, len(x.shape))
        r = self.reduce_axis(x, ax, kind)
        return self.expand_dims(r, ax) if keep_dims else r

    def reduce_axes(self, x: TileValue, axes: Sequence[Any], kind: str, keep_dims: bool) -> TileValue:
        """`mt.sum(x, axis=(0, 3))`: the reduced axes move last (mt.trans), merge (mt.reshape) and reduce once.
        Correct for any axes; the tiling pass may move the merged tile through shared memory (measured on a
        [4, 128, 8, 4] tile: 8 barriers against 2 for nested single-axis reductions), so nested reductions stay
        the faster spelling when the axes live in different places of the layout."""
        rank, shape = len(x.shape), x.shape
        reduced = sorted({self.normalize_axis(a, rank) for a in axes})
        if len(reduced) != len(axes):
            raise error(f"axis {tuple(axes)} names an axis twice")
        if not reduced:
            raise error("an empty axis tuple reduces nothing")
        kept = [i for i in range(rank) if i not in reduced]
        if kept + reduced != list(range(rank)):
            x = self.trans(x, kept + reduced)
        merged = tuple(shape[i] for i in kept) + (math.prod(shape[i] for i in reduced),)
        r = self.reduce_axis(self.reshape(x, merged), len(kept), kind)
        return self.reshape(r, tuple(1 if i in reduced else n for i, n in enumerate(shape))) if keep_dims else r

    def reduce_axis(self, x: TileValue, axis: int, kind: str) -> TileValue:
        shape = x.shape[:axis] + x.shape[axis + 1:]
        ty = TensorType(shape, x.dtype) if shape else x.dtype
        return TileValue(self.b.create1("mt.reduce", [x.handle], ty, axis=axis, kind=kind))

    def scan(self, x: Any, axis: Any, kind: str) -> TileValue:
        x = self.to_value(x)
        if not x.is_tile or isinstance(x.dtype, PointerType):
            raise error(f"cumulative {kind} needs a tile of numbers, got {x.type}")
        if kind == "sum":
            x = self.cast(x, self.accumulation_type(x.dtype))  # type: ignore[arg-type]
        ax = self.normalize_axis(axis, len(x.shape))
        return TileValue(self.b.create1("mt.scan", [x.handle], x.type, axis=ax, kind=kind))

    def dot(self, a: Any, b: Any, acc: Any, input_precision: Any, block_structure: Any = None,
            k_chains: Any = 1, instruction: Any = None) -> TileValue:
        a, b = self.to_value(a), self.to_value(b)
        for name, t in (("a", a), ("b", b)):
            if not t.is_tile or len(t.shape) != 2:
                raise error(f"dot operand {name} must be a 2-D tile, got {t.type}")
            if t.dtype not in (f16, bf16, f32):
                raise error(f"dot operand {name} must be f16, bf16 or f32, got {t.dtype}")
        if a.dtype != b.dtype:
            raise error(f"dot operands must have one dtype, got {a.dtype} and {b.dtype}; cast one with .to()")
        (m, k), (k2, n) = a.shape, b.shape
        if k != k2:
            raise error(f"dot shapes do not match: a is {m}x{k}, b is {k2}x{n}")
        if acc is None:
            c = self.full((m, n), 0.0, f32)
        else:
            c = self.to_value(acc)
            if c.shape != (m, n) or c.dtype != f32:
                raise error(f"dot accumulator must be an f32 tile of shape {(m, n)}, got {c.type}")
        precision = input_precision if input_precision is not None else "ieee"
        if precision not in ("ieee", "tf32", "tf32x3"):
            raise error(f"input_precision must be 'ieee', 'tf32' or 'tf32x3', got {precision!r}")
        attrs: dict[str, Any] = {}
        if block_structure is not None:
            size, a_kind, b_kind = self.block_structure(block_structure, m, k, n)
            a, b = self.block_mask(a, size, a_kind), self.block_mask(b, size, b_kind)
            attrs = dict(block=size, a_blocks=a_kind, b_blocks=b_kind)
        chains = self.static_int(k_chains, "k_chains")
        if chains < 1:
            raise error(f"k_chains must be at least 1, got {chains}")
        if chains > 1:
            attrs["k_chains"] = chains
        if instruction is not None:
            if instruction not in DOT_INSTRUCTIONS:
                raise error(f"instruction must be one of {DOT_INSTRUCTIONS}, got {describe(instruction)}")
            attrs["instruction"] = instruction
        return TileValue(self.b.create1("mt.dot", [a.handle, b.handle, c.handle], c.type,
                                        input_precision=precision, **attrs))

    def block_structure(self, structure: Any, m: int, k: int, n: int) -> tuple[int, str, str]:
        """(block size, a kind, b kind) of mt.dot's block_structure, checked against the dot's shape."""
        if not (isinstance(structure, tuple) and len(structure) == 3):
            raise error(f"block_structure must be a tuple (block size, a kind, b kind), got {describe(structure)}")
        size = self.static_int(structure[0], "the block_structure block size")
        kinds = structure[1:]
        for what, kind in zip(("a", "b"), kinds):
            if kind not in BLOCK_KINDS:
                raise error(f"block_structure: {what}'s kind must be one of {BLOCK_KINDS}, got {describe(kind)}")
        if size <= 0 or m % size or k % size or n % size:
            raise error(f"block_structure: block size {size} must divide the dot's M, K and N ({m}, {k}, {n})")
        return size, kinds[0], kinds[1]

    def block_mask(self, x: TileValue, size: int, kind: str) -> TileValue:
        """x with the blocks that `kind` does not allow set to zero (block_structure's explicit masks)."""
        if kind == "full":
            return x
        rows, cols = x.shape
        i = self.binary("floordiv", self.expand_dims(self.arange(0, rows), 1), size)
        j = self.binary("floordiv", self.expand_dims(self.arange(0, cols), 0), size)
        keep = self.compare({"diag": "eq", "lower": "le", "strict_lower": "lt"}[kind], j, i)
        return self.where(keep, x, 0.0)

    def static_assert(self, condition: Any, message: str) -> None:
        if isinstance(condition, TileValue):
            raise error("static_assert needs a compile-time condition")
        if not condition:
            raise error(f"static_assert failed: {message}" if message else "static_assert failed")


OP_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "rem": "%", "and": "&", "or": "|",
              "xor": "^", "shl": "<<", "shr": ">>", "pow": "**", "maximum": "maximum", "minimum": "minimum"}
CMP_SYMBOLS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
