"""constant-fold: evaluates ops on constants at compile time and applies exact algebraic identities.

Rewrites, in every kernel:
- an op whose operands are all `mt.constant` (scalars, or splat tensors) into one `mt.constant` holding the
  result, with the op set's exact semantics: integers wrap to the type's width, signedness comes from the type
  (i1 is the unsigned 0/1), div/rem truncate toward zero (C), shifts follow ops.py, floats round to nearest
  even in their type (f16/bf16 math is computed in f32 first), casts and same-width int<->float bitcasts;
  splat / broadcast / expand_dims / reshape / trans / convert_layout of a constant into a constant of the new
  type;
- exact identities into their operand or a constant: x+0, x-0, x*1, x/1, x|0, x^0, x&-1, x<<0, x>>0 (and
  mirror images) into x; x*0, x&0, x-x, x^x into 0 and x|-1 into -1 (integers only); x&x, x|x, max(x,x),
  min(x,x), select(c, x, x) into x; addptr(p, 0) into p; cmp of one integer value with itself into true/false;
  select with a constant condition into the taken value; casts / bitcasts / broadcasts / reshapes / transposes /
  layout conversions that change nothing into their operand. For floats only the identities exact for every
  input (signed zeros, NaN, inf) apply: x+(-0.0), x-(+0.0), x*1.0, x/1.0;
- `scf.if` with a constant condition into the ops of the taken region (inlined before it), its results into that
  region's yielded values; `scf.for` with constant bounds and lb >= ub (zero iterations) into its init values.

Left alone: what would trap or is undefined (integer division by zero, INT_MIN / -1), transcendental and pow
ops (the GPU computes them approximately), fma, reductions, NaN bit patterns through bitcasts, max/min of
zeros of different sign, and every memory op (load, store, atomic).
"""
from __future__ import annotations

import math
import operator
import struct
from fractions import Fraction
from typing import Callable, Union

import numpy as np

from minitriton.ir import OPS, Block, Module, Operation, ScalarType, Value, function_body
from minitriton.ir.numeric import round_exact, wrap_int  # exact rounding; ints wrapped to the type, i1 as 0/1

from .registry import register_pass

Number = Union[int, float]  # i1 and integers as Python ints (canonical, see wrap_int), floats as Python floats
Folded = Union[Value, Number]  # an op result becomes an existing value or a new constant

# ------------------------------------------------------------------------------ exact scalar semantics


def is_signed_int(ty: ScalarType) -> bool:
    """Two's complement signed; i1 is treated as the unsigned 0/1."""
    return ty.is_int and ty.is_signed and not ty.is_bool


def int_bounds(ty: ScalarType) -> tuple[int, int]:
    if is_signed_int(ty):
        return -(1 << (ty.bits - 1)), (1 << (ty.bits - 1)) - 1
    return 0, (1 << ty.bits) - 1


# (precision in bits including the hidden one, exponent of the smallest normal, largest exponent)
def round_op_result(x: float, ty: ScalarType) -> float:
    """Round an f64-computed result of +, -, *, / to the operand type. f16/bf16 math rounds through f32 as
    ops.py says; f64 -> f32 -> f16 is exact double rounding here (53 >= 2*24+2, 24 >= 2*11+2)."""
    if ty.name in ("f16", "bf16"):
        x = round_exact(x, ScalarType("f32"))
    return round_exact(x, ty)


def normalize(value: object, ty: ScalarType) -> Number:
    """A constant attribute as the canonical Python number of its type."""
    if ty.is_float:
        return round_exact(int(value) if isinstance(value, bool) else value, ty)  # type: ignore[arg-type]
    return wrap_int(int(value), ty)  # type: ignore[call-overload]


def attr_value(v: Number, ty: ScalarType) -> bool | int | float:
    """A canonical number as the `value` attribute of an mt.constant of type `ty`."""
    if ty.is_bool:
        return bool(v)
    return float(v) if ty.is_float else int(v)


def float_bits(x: float, ty: ScalarType) -> int:
    """The IEEE bits of a value of float type `ty` (bf16 is the top half of the f32)."""
    if ty.name == "bf16":
        return struct.unpack("<I", struct.pack("<f", x))[0] >> 16
    fmt = {"f16": "e", "f32": "f", "f64": "d"}[ty.name]
    return int.from_bytes(struct.pack("<" + fmt, x), "little")


def bits_float(bits: int, ty: ScalarType) -> float:
    if ty.name == "bf16":
        return struct.unpack("<f", struct.pack("<I", bits << 16))[0]
    fmt = {"f16": "e", "f32": "f", "f64": "d"}[ty.name]
    return struct.unpack("<" + fmt, bits.to_bytes(ty.bytes, "little"))[0]


# ----------------------------------------------------------------------------- integer and float ops


def _int_div(a: int, b: int, ty: ScalarType) -> int | None:
    if b == 0 or (is_signed_int(ty) and a == int_bounds(ty)[0] and b == -1):
        return None  # traps / undefined: leave it to run time
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _int_rem(a: int, b: int, ty: ScalarType) -> int | None:
    q = _int_div(a, b, ty)
    return None if q is None else a - b * q


def _shift_amount(b: int, ty: ScalarType) -> int:
    return b & ((1 << ty.bits) - 1)  # the amount is read as unsigned: a negative amount is over-wide


def _shl(a: int, b: int, ty: ScalarType) -> int:
    amount = _shift_amount(b, ty)
    return 0 if amount >= ty.bits else a << amount


def _shr(a: int, b: int, ty: ScalarType) -> int:
    amount = _shift_amount(b, ty)
    if is_signed_int(ty):
        return a >> min(amount, ty.bits - 1)  # arithmetic; over-wide shifts saturate to 0 or -1
    return 0 if amount >= ty.bits else a >> amount


IntBinary = Callable[[int, int, ScalarType], "int | None"]
_INT_BINARY: dict[str, IntBinary] = {
    "mt.add": lambda a, b, t: a + b,
    "mt.sub": lambda a, b, t: a - b,
    "mt.mul": lambda a, b, t: a * b,
    "mt.div": _int_div,
    "mt.rem": _int_rem,
    "mt.maximum": lambda a, b, t: max(a, b),
    "mt.minimum": lambda a, b, t: min(a, b),
    "mt.and": lambda a, b, t: a & b,
    "mt.or": lambda a, b, t: a | b,
    "mt.xor": lambda a, b, t: a ^ b,
    "mt.shl": _shl,
    "mt.shr": _shr,
}

_INT_UNARY: dict[str, Callable[[int, ScalarType], int]] = {
    "mt.neg": lambda a, t: -a,
    "mt.not": lambda a, t: ~a,
    "mt.abs": lambda a, t: abs(a) if is_signed_int(t) else a,
}


def _f64(fn: Callable[[np.float64, np.float64], np.float64]) -> Callable[[float, float], float]:
    """Apply a numpy f64 operation with IEEE results (inf, nan) instead of Python exceptions."""

    def apply(a: float, b: float) -> float:
        with np.errstate(all="ignore"):
            return float(fn(np.float64(a), np.float64(b)))

    return apply


def _float_max_min(pick: Callable[[float, float], float]) -> Callable[[float, float], "float | None"]:
    def fold(a: float, b: float) -> float | None:
        if math.isnan(a):
            return b  # PTX max/min: a NaN operand yields the other one
        if math.isnan(b):
            return a
        if a == b == 0 and math.copysign(1, a) != math.copysign(1, b):
            return None  # the sign of the result is the hardware's choice
        return pick(a, b)

    return fold


# Computed in f64, then rounded by round_op_result: correctly rounded for +, -, *, / and exact for fmod.
_FLOAT_BINARY: dict[str, Callable[[float, float], "float | None"]] = {
    "mt.add": _f64(np.add),
    "mt.sub": _f64(np.subtract),
    "mt.mul": _f64(np.multiply),
    "mt.div": _f64(np.divide),
    "mt.rem": _f64(np.fmod),
    "mt.maximum": _float_max_min(max),
    "mt.minimum": _float_max_min(min),
}

_FLOAT_UNARY: dict[str, Callable[[float], float]] = {
    "mt.neg": lambda a: -a,
    "mt.abs": math.fabs,
    "mt.floor": lambda a: float(np.floor(np.float64(a))),
    "mt.ceil": lambda a: float(np.ceil(np.float64(a))),
}

_CMP: dict[str, Callable[[Number, Number], bool]] = {
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
}


def fold_cast(a: Number, src: ScalarType, dst: ScalarType) -> Number | None:
    """mt.cast semantics (ops.py): float rounding RNE, float -> int truncates and saturates, int -> int wraps,
    x -> i1 is x != 0."""
    if dst.is_bool:
        return None if isinstance(a, float) and math.isnan(a) else int(a != 0)
    if dst.is_float:
        return round_exact(a, dst)
    if src.is_int:
        return wrap_int(int(a), dst)
    if math.isnan(a):
        return 0
    low, high = int_bounds(dst)
    return low if a < low else high if a > high else math.trunc(a)


def fold_bitcast(a: Number, src: ScalarType, dst: ScalarType) -> Number | None:
    """Reinterpret the bits; NaNs are left alone (their payload does not survive a float constant)."""
    if src.is_float:
        if math.isnan(a):
            return None
        bits = float_bits(a, src)  # type: ignore[arg-type]
    else:
        bits = int(a) & ((1 << src.bits) - 1)
    if dst.is_int:
        return wrap_int(bits, dst)
    value = bits_float(bits, dst)
    return None if math.isnan(value) else value


def fold_constants_of(op: Operation, values: list[Number]) -> Number | None:
    """The result of a one-result op whose operands are the constants `values`, or None when it does not fold."""
    ty = op.operands[0].type.scalar
    out = op.result.type.scalar
    if op.name in ("mt.splat", "mt.broadcast", "mt.expand_dims", "mt.reshape", "mt.trans", "mt.convert_layout"):
        return values[0]  # a splat stays the same number in every element, whatever the shape or layout
    if op.name == "mt.select":
        return values[1] if values[0] else values[2]
    if op.name == "mt.cast":
        return fold_cast(values[0], ty, out)  # type: ignore[arg-type]
    if op.name == "mt.bitcast":
        return None if ty.is_pointer or out.is_pointer else fold_bitcast(values[0], ty, out)  # type: ignore
    if op.name == "mt.cmp":
        return int(_CMP[op.attrs["predicate"]](values[0], values[1]))
    if not isinstance(ty, ScalarType):
        return None
    if ty.is_int:
        return _fold_int(op.name, values, ty)
    if len(values) == 2 and op.name in _FLOAT_BINARY:
        result = _FLOAT_BINARY[op.name](*values)  # type: ignore[arg-type]
    elif len(values) == 1 and op.name in _FLOAT_UNARY:
        result = _FLOAT_UNARY[op.name](values[0])  # type: ignore[arg-type]
    else:
        return None
    return None if result is None else round_op_result(result, ty)


def _fold_int(name: str, values: list[Number], ty: ScalarType) -> int | None:
    if len(values) == 2 and name in _INT_BINARY:
        result = _INT_BINARY[name](int(values[0]), int(values[1]), ty)
    elif len(values) == 1 and name in _INT_UNARY:
        result = _INT_UNARY[name](int(values[0]), ty)
    else:
        return None
    return None if result is None else wrap_int(result, ty)


# ----------------------------------------------------------------------------------------- identities


def _is_float_zero(c: Number | None, negative: bool) -> bool:
    return isinstance(c, float) and c == 0 and (math.copysign(1, c) < 0) == negative


def fold_unary_identity(op: Operation, a: Value) -> Folded | None:
    """Conversions and shape ops that leave the operand as it is."""
    if op.name in ("mt.cast", "mt.bitcast", "mt.broadcast", "mt.reshape", "mt.convert_layout") \
            and op.result.type == a.type:
        return a
    if op.name == "mt.trans" and list(op.attrs["order"]) == list(range(len(a.type.shape))):
        return a
    return None


def fold_binary_identity(op: Operation, a: Value, b: Value, ca: Number | None, cb: Number | None) -> Folded | None:
    """Exact identities of a two-operand op; ca, cb are the operands' constant values where known."""
    ty = a.type.scalar
    if op.name == "mt.addptr":
        return a if cb == 0 else None
    if not isinstance(ty, ScalarType):
        return None
    if op.name == "mt.cmp":
        return int(op.attrs["predicate"] in ("eq", "le", "ge")) if a is b and ty.is_int else None
    if ty.is_float:
        return _fold_float_identity(op.name, a, b, ca, cb)
    return _fold_int_identity(op.name, a, b, ca, cb, ty)


def _fold_float_identity(name: str, a: Value, b: Value, ca: Number | None, cb: Number | None) -> Folded | None:
    # Only what holds for every input: x + 0.0 is not x for x = -0.0, and x * 0.0 is not 0 for inf or NaN.
    if name == "mt.add":
        return a if _is_float_zero(cb, negative=True) else b if _is_float_zero(ca, negative=True) else None
    if name == "mt.sub" and _is_float_zero(cb, negative=False):
        return a
    if name == "mt.mul":
        return a if cb == 1.0 else b if ca == 1.0 else None
    if name == "mt.div" and cb == 1.0:
        return a
    if name in ("mt.maximum", "mt.minimum") and a is b:
        return a
    return None


def _fold_int_identity(name: str, a: Value, b: Value, ca: Number | None, cb: Number | None,
                       ty: ScalarType) -> Folded | None:
    all_ones = wrap_int(-1, ty)
    if a is b and name in ("mt.and", "mt.or", "mt.maximum", "mt.minimum"):
        return a
    if a is b and name in ("mt.sub", "mt.xor"):
        return 0
    if name == "mt.or" and all_ones in (ca, cb):
        return all_ones
    if name in ("mt.add", "mt.or", "mt.xor"):
        return a if cb == 0 else b if ca == 0 else None
    if name == "mt.mul":
        return 0 if 0 in (ca, cb) else a if cb == 1 else b if ca == 1 else None
    if name == "mt.and":
        return 0 if 0 in (ca, cb) else a if cb == all_ones else b if ca == all_ones else None
    if name in ("mt.sub", "mt.shl", "mt.shr") and cb == 0:
        return a
    if name == "mt.div" and cb == 1:
        return a
    return None


# ---------------------------------------------------------------------------------------- the rewriter


class _Folder:
    """Folds one kernel in a single walk. Replaced values are recorded in `mapping` and looked through while
    folding, then substituted in one `replace_uses` at the end (see core.Operation.replace_uses)."""

    def __init__(self) -> None:
        self.mapping: dict[Value, Value] = {}
        self.changed = False

    def resolve(self, v: Value) -> Value:
        while v in self.mapping:
            v = self.mapping[v]
        return v

    def constant(self, v: Value) -> Number | None:
        op = self.resolve(v).defining_op
        if op is None or op.name != "mt.constant":
            return None
        return normalize(op.attrs["value"], v.type.scalar)  # type: ignore[arg-type]

    def fold_function(self, func: Operation) -> None:
        self.fold_block(function_body(func))
        func.replace_uses({old: self.resolve(old) for old in self.mapping})

    def fold_block(self, block: Block) -> None:
        i = 0
        while i < len(block.ops):
            op = block.ops[i]
            rewrite = self.fold(op)
            if rewrite is None:
                for region in op.regions:
                    for inner in region.blocks:
                        self.fold_block(inner)
                i += 1
            else:
                self.replace(block, i, op, *rewrite)  # stay at i: what was inserted there is visited next

    def replace(self, block: Block, index: int, op: Operation, inlined: list[Operation],
                results: list[Folded]) -> None:
        """Move `inlined` to block.ops[index:], then new constants, and drop `op` for its replacements."""
        for moved in inlined:
            moved.erase()
            block.insert(index, moved)
            index += 1
        for old, new in zip(op.results, results):
            if not isinstance(new, Value):
                new = self.materialize(block, index, new, old)
                index += 1
            self.mapping[old] = new
        op.erase()
        self.changed = True

    def materialize(self, block: Block, index: int, number: Number, like: Value) -> Value:
        """Insert at block.ops[index] an `mt.constant` holding `number`, with `like`'s type and location."""
        const = Operation("mt.constant", [], [like.type], {"value": attr_value(number, like.type.scalar)},
                          loc=like.owner.loc)  # type: ignore[union-attr]
        block.insert(index, const)
        return const.result

    def fold(self, op: Operation) -> tuple[list[Operation], list[Folded]] | None:
        """(ops to inline before `op`, one replacement per result), or None to keep `op`."""
        if op.name == "scf.if":
            return self.fold_if(op)
        if op.name == "scf.for":
            return self.fold_for(op)
        if op.regions or len(op.results) != 1 or op.name == "mt.constant" or not _is_pure(op):
            return None
        result = self.fold_value(op)
        if result is None or (isinstance(result, Value) and result.type != op.result.type):
            return None
        return [], [result]

    def fold_value(self, op: Operation) -> Folded | None:
        operands = [self.resolve(v) for v in op.operands]
        consts = [self.constant(v) for v in operands]
        if op.name == "mt.select":
            cond, a, b = operands
            if consts[0] is not None:
                return a if consts[0] else b
            return a if a is b else None
        if operands and all(c is not None for c in consts):
            folded = fold_constants_of(op, consts)  # type: ignore[arg-type]
            if folded is not None:
                return folded
        if len(operands) == 1:
            return fold_unary_identity(op, operands[0])
        if len(operands) == 2:
            return fold_binary_identity(op, operands[0], operands[1], consts[0], consts[1])
        return None

    def fold_if(self, op: Operation) -> tuple[list[Operation], list[Folded]] | None:
        cond = self.constant(op.operands[0])
        if cond is None:
            return None
        taken = op.regions[0 if cond else 1].block
        yielded = taken.ops[-1].operands
        if any(v.type != r.type for v, r in zip(yielded, op.results)):
            return None
        return list(taken.ops[:-1]), [self.resolve(v) for v in yielded]

    def fold_for(self, op: Operation) -> tuple[list[Operation], list[Folded]] | None:
        lb, ub = self.constant(op.operands[0]), self.constant(op.operands[1])
        inits = op.operands[3:]
        if lb is None or ub is None or lb < ub or any(v.type != r.type for v, r in zip(inits, op.results)):
            return None
        return [], [self.resolve(v) for v in inits]


def _is_pure(op: Operation) -> bool:
    spec = OPS.get(op.name)
    return spec is not None and spec.pure


def fold_module(module: Module) -> bool:
    """Fold every kernel of `module` in place; True when anything changed."""
    changed = False
    for func in module.functions:
        folder = _Folder()
        folder.fold_function(func)
        changed |= folder.changed
    return changed


@register_pass("constant-fold")
def constant_fold(module: Module) -> Module:
    """Fold constant ops, exact identities and control flow with constant conditions (see the module doc)."""
    fold_module(module)
    return module
