"""Elementwise ops on one element: the PTX for each op, given its operand registers (tinygrad's op-table style).

`lower_elementwise` applies an op register by register (operands and result share one layout after tiling).
Semantics follow ops.py; where PTX rounds differently from the interpreter it is said here:
- f32 add / sub / mul are emitted without a rounding modifier (`add.f32`, `mul.f32`), which lets ptxas contract a
  multiply feeding an add into one fma (its default, --fmad=true), as Triton and nvcc do: a contracted a * b + c
  skips the product's rounding, so on the GPU it can differ from the interpreter's separately rounded ops by the
  rounding of a * b (at most half an ulp of the product). f64 keeps `.rn` (exact, never contracted).
- f16 / bf16: every op converts to f32 (`cvt.f32.bf16`, exact), computes, and rounds back once
  (`cvt.rn.bf16.f32`). The rounding back sits between any two ops, so nothing contracts across it and the results
  match the interpreter's bit for bit.
- Packed pairs: add / sub / mul on f16 / bf16 tiles whose registers come in pairs (an even count per thread) run
  two elements per instruction, `mul.rn.bf16x2` / `add.rn.f16x2` ... (HMUL2 / HADD2): the pair is packed into one
  32-bit register (`mov.b32 %r, {%h0, %h1}`, which ptxas folds into the producers) and unpacked after. The results
  are the same bits as the f32 route: a product of two halves is exact in f32 and a sum rounds twice harmlessly
  (f32 has 24 >= 2 * 11 + 2 bits), so rounding once to the half type (the packed op) equals the f32 route. `.rn`
  keeps ptxas from contracting them into fma.
- exp(x) = ex2.approx.ftz(x * log2 e), exp2 = ex2.approx.ftz (about 2 ulp; subnormal results flush to 0); log(x) =
  lg2.approx(x) * ln 2 and log2 = lg2.approx (absolute error about 2^-22); sqrt = sqrt.rn (IEEE); rsqrt =
  rsqrt.approx (about 2^-23 relative); sigmoid = rcp.rn(1 + ex2(-x log2 e)); tanh = tanh.approx (relative error
  up to 2^-11); sin / cos reduce x by 2 pi (two-constant Cody-Waite) then sin.approx / cos.approx (absolute error
  about 1e-6 for |x| < 1e5); erf: Taylor series below 0.5, Abramowitz-Stegun 7.1.26 above (absolute error
  about 2e-7); pow(a, b) = ex2(b * lg2 |a|) with the sign / NaN / b = 0 / a = 1 cases of C's powf (relative error
  about |b| * 2e-7); fmod via a - trunc(a / b) * b with one fma and a sign fix (exact while |a / b| < 2^24).
- f64: arithmetic, sqrt, floor / ceil, fmod are native; f64 transcendentals are not supported (CompilationError).
- Integers ≤ 32 bits compute in 32-bit registers and are re-normalized (sign / zero extension) after ops that can
  leave the type's range, so they wrap like the type. Shifts: PTX clamps amounts ≥ the register width, which
  gives ops.py's "0 for shl, sign fill for shr". Division by zero gives whatever the hardware gives.
- i1: add / sub / xor = xor, mul / and / min = and, or / max = or (arithmetic modulo 2 on 0 / 1), not = not,
  shifts as on the unsigned 0 / 1 (a shift by 1 gives 0), as the interpreter does.
"""
from __future__ import annotations

from typing import Callable

from minitriton.ir import Operation
from minitriton.ir.layouts import register_permutation
from minitriton.ir.types import PointerType, ScalarType

from .context import KernelContext
from .registers import Elem, f32_literal, f64_literal, float_suffix, int_suffix, is_half, reg_class

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
TWO_PI_HI = 6.2831854820251465  # float32(2 pi)
TWO_PI_LO = -1.7484555314695172e-07  # 2 pi - TWO_PI_HI, as float32
INV_TWO_PI = 0.15915493667125702

# ------------------------------------------------------------------------------------------- conversions


def half_name(t: ScalarType) -> str:
    return "bf16" if t.name == "bf16" else "f16"


def upcast(ctx: KernelContext, reg: str, t: Elem) -> str:
    """The value of an f16 / bf16 register as f32 (other types unchanged)."""
    if not is_half(t):
        return reg
    d = ctx.new("f32")
    ctx.emit(f"cvt.f32.{half_name(t)} {d}, {reg};")  # type: ignore[arg-type]
    return d


def downcast(ctx: KernelContext, reg: str, t: Elem) -> str:
    """An f32 result rounded to f16 / bf16 (other types unchanged)."""
    if not is_half(t):
        return reg
    d = ctx.new("b16")
    ctx.emit(f"cvt.rn.{half_name(t)}.f32 {d}, {reg};")  # type: ignore[arg-type]
    return d


def normalize(ctx: KernelContext, reg: str, t: Elem) -> str:
    """Wrap a 32-bit register to a narrow integer type: sign-extend (i8 / i16) or zero-extend (ui8 / ui16)."""
    if not isinstance(t, ScalarType) or not t.is_int or t.is_bool or t.bits >= 32:
        return reg
    d = ctx.new("b32")
    if t.is_signed:
        ctx.emit(f"bfe.s32 {d}, {reg}, 0, {t.bits};")
    else:
        ctx.emit(f"and.b32 {d}, {reg}, {(1 << t.bits) - 1};")
    return d


def float_const(ctx: KernelContext, x: float, suffix: str) -> str:
    return ctx.const(f64_literal(x) if suffix == "f64" else f32_literal(x), suffix)


# ------------------------------------------------------------------------------------------- the table

Lowering = Callable[[KernelContext, Operation, list[str]], str]

_FLOAT_BINARY = {"mt.add": "add.rn", "mt.sub": "sub.rn", "mt.mul": "mul.rn", "mt.div": "div.rn",
                 "mt.maximum": "max", "mt.minimum": "min"}
# f32 ops ptxas may contract into fma (no rounding modifier); see the module docstring.
_CONTRACTABLE = {"mt.add": "add", "mt.sub": "sub", "mt.mul": "mul"}
_INT_BINARY = {"mt.add": "add.{s}", "mt.sub": "sub.{s}", "mt.mul": "mul.lo.{s}", "mt.div": "div.{s}",
               "mt.rem": "rem.{s}", "mt.maximum": "max.{s}", "mt.minimum": "min.{s}", "mt.and": "and.{b}",
               "mt.or": "or.{b}", "mt.xor": "xor.{b}"}
_WRAPS = {"mt.add", "mt.sub", "mt.mul", "mt.div", "mt.shl", "mt.neg", "mt.abs", "mt.not"}
_BOOL_BINARY = {"mt.add": "xor", "mt.sub": "xor", "mt.xor": "xor", "mt.mul": "and", "mt.and": "and",
                "mt.minimum": "and", "mt.div": "and", "mt.or": "or", "mt.maximum": "or"}
_CMP_FLOAT = {"eq": "eq", "ne": "neu", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge"}


def binary(ctx: KernelContext, op: Operation, ins: list[str]) -> str:
    t = op.result.type.scalar
    a, b = ins
    if t.is_bool:  # type: ignore[union-attr]
        return _bool_binary(ctx, op.name, a, b)
    if t.is_float:  # type: ignore[union-attr]
        sfx = float_suffix(t)  # type: ignore[arg-type]
        a, b = upcast(ctx, a, t), upcast(ctx, b, t)
        if op.name == "mt.rem":
            d = _fmod(ctx, a, b, sfx)
        elif op.name == "mt.pow":
            d = _pow(ctx, a, b, sfx)
        else:
            d = ctx.new(sfx)
            contract = t.name == "f32" and op.name in _CONTRACTABLE  # type: ignore[union-attr]
            instr = _CONTRACTABLE[op.name] if contract else _FLOAT_BINARY[op.name]
            ctx.emit(f"{instr}.{sfx} {d}, {a}, {b};")
        return downcast(ctx, d, t)
    s, bits = int_suffix(t), f"b{64 if t.bits == 64 else 32}"  # type: ignore[arg-type,union-attr]
    cls = reg_class(t)
    d = ctx.new(cls)
    if op.name in ("mt.shl", "mt.shr"):
        amount = b
        if t.bits == 64:  # type: ignore[union-attr]  the amount register of a 64-bit shift is 32-bit
            clamped, amount = ctx.new("b64"), ctx.new("b32")
            ctx.emit(f"min.u64 {clamped}, {b}, 64;")
            ctx.emit(f"cvt.u32.u64 {amount}, {clamped};")
        ctx.emit(f"{'shl.' + bits if op.name == 'mt.shl' else 'shr.' + s} {d}, {a}, {amount};")
    else:
        ctx.emit(f"{_INT_BINARY[op.name].format(s=s, b=bits)} {d}, {a}, {b};")
    return normalize(ctx, d, t) if op.name in _WRAPS else d


def _bool_binary(ctx: KernelContext, name: str, a: str, b: str) -> str:
    d = ctx.new("pred")
    if name in _BOOL_BINARY:
        ctx.emit(f"{_BOOL_BINARY[name]}.pred {d}, {a}, {b};")
    elif name == "mt.rem":  # x % 1 == 0
        ctx.emit(f"mov.pred {d}, 0;")
    elif name in ("mt.shl", "mt.shr"):  # 0 / 1 values: x shifted by 0 is x, by 1 (or more) is 0
        nb = ctx.new("pred")
        ctx.emit(f"not.pred {nb}, {b};")
        ctx.emit(f"and.pred {d}, {a}, {nb};")
    else:
        raise ctx.error(f"{name} on i1 is not supported")
    return d


def _fmod(ctx: KernelContext, a: str, b: str, t: str) -> str:
    """C fmod: a - trunc(a / b) * b, fixed when a / b rounded across an integer; the result has a's sign."""
    q, qt, nq, r = ctx.new(t), ctx.new(t), ctx.new(t), ctx.new(t)
    ctx.emit(f"div.rn.{t} {q}, {a}, {b};")
    ctx.emit(f"cvt.rzi.{t}.{t} {qt}, {q};")
    ctx.emit(f"neg.{t} {nq}, {qt};")
    ctx.emit(f"fma.rn.{t} {r}, {nq}, {b}, {a};")
    zero = float_const(ctx, 0.0, t)
    a_neg, r_neg, r_pos = ctx.new("pred"), ctx.new("pred"), ctx.new("pred")
    ctx.emit(f"setp.lt.{t} {a_neg}, {a}, {zero};")
    ctx.emit(f"setp.lt.{t} {r_neg}, {r}, {zero};")
    ctx.emit(f"setp.gt.{t} {r_pos}, {r}, {zero};")
    keep_pos, a_pos, keep_neg, wrong = ctx.new("pred"), ctx.new("pred"), ctx.new("pred"), ctx.new("pred")
    ctx.emit(f"and.pred {keep_pos}, {a_neg}, {r_pos};")  # wrong sign: a < 0 < r, or r < 0 <= a
    ctx.emit(f"not.pred {a_pos}, {a_neg};")
    ctx.emit(f"and.pred {keep_neg}, {a_pos}, {r_neg};")
    ctx.emit(f"or.pred {wrong}, {keep_pos}, {keep_neg};")
    adj, fixed = ctx.new(t), ctx.new(t)
    ctx.emit(f"copysign.{t} {adj}, {a}, {b};")
    ctx.emit(f"add.rn.{t} {fixed}, {r}, {adj};")
    r2 = ctx.new(t)
    ctx.emit(f"selp.{t} {r2}, {fixed}, {r}, {wrong};")
    # fmod(finite a, +-inf) = a (the fma above gives NaN from 0 * inf)
    inf = float_const(ctx, float("inf"), t)
    aabs, babs, a_finite, b_inf, keep_a = ctx.new(t), ctx.new(t), ctx.new("pred"), ctx.new("pred"), ctx.new("pred")
    ctx.emit(f"abs.{t} {aabs}, {a};")
    ctx.emit(f"abs.{t} {babs}, {b};")
    ctx.emit(f"setp.lt.{t} {a_finite}, {aabs}, {inf};")
    ctx.emit(f"setp.eq.{t} {b_inf}, {babs}, {inf};")
    ctx.emit(f"and.pred {keep_a}, {a_finite}, {b_inf};")
    r3, out = ctx.new(t), ctx.new(t)
    ctx.emit(f"selp.{t} {r3}, {a}, {r2}, {keep_a};")
    ctx.emit(f"copysign.{t} {out}, {a}, {r3};")  # an exact zero keeps a's sign
    return out


def _pow(ctx: KernelContext, a: str, b: str, t: str) -> str:
    if t != "f32":
        raise ctx.error("pow on f64 is not supported by the PTX backend")
    absa, lg, prod, r = ctx.new("f32"), ctx.new("f32"), ctx.new("f32"), ctx.new("f32")
    ctx.emit(f"abs.f32 {absa}, {a};")
    ctx.emit(f"lg2.approx.f32 {lg}, {absa};")
    ctx.emit(f"mul.rn.f32 {prod}, {b}, {lg};")
    ctx.emit(f"ex2.approx.ftz.f32 {r}, {prod};")
    # a < 0: an odd integer b negates the result, a non-integer b gives NaN
    bt, half, ht = ctx.new("f32"), ctx.new("f32"), ctx.new("f32")
    b_int, b_odd_half, b_odd, a_neg = ctx.new("pred"), ctx.new("pred"), ctx.new("pred"), ctx.new("pred")
    ctx.emit(f"cvt.rzi.f32.f32 {bt}, {b};")
    ctx.emit(f"setp.eq.f32 {b_int}, {bt}, {b};")
    ctx.emit(f"mul.rn.f32 {half}, {b}, 0f3F000000;")
    ctx.emit(f"cvt.rzi.f32.f32 {ht}, {half};")
    ctx.emit(f"setp.neu.f32 {b_odd_half}, {ht}, {half};")
    ctx.emit(f"and.pred {b_odd}, {b_int}, {b_odd_half};")
    ctx.emit(f"setp.lt.f32 {a_neg}, {a}, 0f00000000;")
    neg_r, signed, neg_case, r2 = ctx.new("f32"), ctx.new("f32"), ctx.new("f32"), ctx.new("f32")
    ctx.emit(f"neg.f32 {neg_r}, {r};")
    ctx.emit(f"selp.f32 {signed}, {neg_r}, {r}, {b_odd};")
    ctx.emit(f"selp.f32 {neg_case}, {signed}, 0f7FFFFFFF, {b_int};")
    ctx.emit(f"selp.f32 {r2}, {neg_case}, {r}, {a_neg};")
    # pow(x, 0) = pow(1, y) = 1, even for NaN
    b_zero, a_one, one_case, out = ctx.new("pred"), ctx.new("pred"), ctx.new("pred"), ctx.new("f32")
    ctx.emit(f"setp.eq.f32 {b_zero}, {b}, 0f00000000;")
    ctx.emit(f"setp.eq.f32 {a_one}, {a}, 0f3F800000;")
    ctx.emit(f"or.pred {one_case}, {b_zero}, {a_one};")
    ctx.emit(f"selp.f32 {out}, 0f3F800000, {r2}, {one_case};")
    return out


# ------------------------------------------------------------------------------------------- unary


def unary(ctx: KernelContext, op: Operation, ins: list[str]) -> str:
    t = op.result.type.scalar
    (a,) = ins
    name = op.name
    if t.is_bool:  # type: ignore[union-attr]
        d = ctx.new("pred")
        ctx.emit(f"not.pred {d}, {a};" if name == "mt.not" else f"mov.pred {d}, {a};")
        return d
    if t.is_int:  # type: ignore[union-attr]
        s = int_suffix(t)  # type: ignore[arg-type]
        d = ctx.new(reg_class(t))
        if name == "mt.neg":
            ctx.emit(f"neg.s{s[1:]} {d}, {a};")
        elif name == "mt.not":
            ctx.emit(f"not.b{s[1:]} {d}, {a};")
        elif name == "mt.abs":
            ctx.emit(f"abs.{s} {d}, {a};" if t.is_signed else f"mov.b{s[1:]} {d}, {a};")  # type: ignore
        else:
            raise ctx.error(f"{name} needs a float operand")
        return normalize(ctx, d, t)
    sfx = float_suffix(t)  # type: ignore[arg-type]
    x = upcast(ctx, a, t)
    if sfx == "f64" and name not in _F64_UNARY:
        raise ctx.error(f"{name} on f64 is not supported by the PTX backend")
    d = _FLOAT_UNARY[name](ctx, x, sfx)
    return downcast(ctx, d, t)


def _one(instr: str) -> Callable[[KernelContext, str, str], str]:
    def f(ctx: KernelContext, x: str, t: str) -> str:
        d = ctx.new(t)
        ctx.emit(f"{instr.format(t=t)} {d}, {x};")
        return d

    return f


def _scaled(instr: str, scale: float, after: bool) -> Callable[[KernelContext, str, str], str]:
    """instr(x * scale) (after=False) or instr(x) * scale (after=True)."""

    def f(ctx: KernelContext, x: str, t: str) -> str:
        y, d = ctx.new("f32"), ctx.new("f32")
        if after:
            ctx.emit(f"{instr} {y}, {x};")
            ctx.emit(f"mul.rn.f32 {d}, {y}, {f32_literal(scale)};")
        else:
            ctx.emit(f"mul.rn.f32 {y}, {x}, {f32_literal(scale)};")
            ctx.emit(f"{instr} {d}, {y};")
        return d

    return f


def _rsqrt(ctx: KernelContext, x: str, t: str) -> str:
    d = ctx.new(t)
    if t == "f32":
        ctx.emit(f"rsqrt.approx.f32 {d}, {x};")
    else:
        s = ctx.new(t)
        ctx.emit(f"sqrt.rn.f64 {s}, {x};")
        ctx.emit(f"div.rn.f64 {d}, 0d3FF0000000000000, {s};")
    return d


def _sigmoid(ctx: KernelContext, x: str, t: str) -> str:
    e = _scaled("ex2.approx.ftz.f32", -LOG2E, after=False)(ctx, x, t)
    s, d = ctx.new("f32"), ctx.new("f32")
    ctx.emit(f"add.rn.f32 {s}, {e}, 0f3F800000;")
    ctx.emit(f"rcp.rn.f32 {d}, {s};")
    return d


def _trig(instr: str) -> Callable[[KernelContext, str, str], str]:
    def f(ctx: KernelContext, x: str, t: str) -> str:
        k, nk, r1, r2, d = (ctx.new("f32") for _ in range(5))
        ctx.emit(f"mul.rn.f32 {k}, {x}, {f32_literal(INV_TWO_PI)};")
        ctx.emit(f"cvt.rni.f32.f32 {k}, {k};")
        ctx.emit(f"neg.f32 {nk}, {k};")
        ctx.emit(f"fma.rn.f32 {r1}, {nk}, {f32_literal(TWO_PI_HI)}, {x};")
        ctx.emit(f"fma.rn.f32 {r2}, {nk}, {f32_literal(TWO_PI_LO)}, {r1};")
        ctx.emit(f"{instr} {d}, {r2};")
        return d

    return f


_ERF_TAYLOR = [1.1283791670955126, -0.37612638903183754, 0.11283791670955126, -0.026866170645131252,
               0.005223977625442188, -0.0008548327023450852, 0.00012055332981789664]
_ERF_AS = (0.3275911, [0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429])


def _horner(ctx: KernelContext, coeffs: list[float], t: str) -> str:
    """coeffs[0] + coeffs[1] t + ... by Horner's rule, highest first."""
    acc = ctx.const(f32_literal(coeffs[-1]), "f32")
    for c in reversed(coeffs[:-1]):
        nxt = ctx.new("f32")
        ctx.emit(f"fma.rn.f32 {nxt}, {acc}, {t}, {f32_literal(c)};")
        acc = nxt
    return acc


def _erf(ctx: KernelContext, x: str, t: str) -> str:
    ax, x2 = ctx.new("f32"), ctx.new("f32")
    ctx.emit(f"abs.f32 {ax}, {x};")
    ctx.emit(f"mul.rn.f32 {x2}, {x}, {x};")
    small = ctx.new("f32")  # |x| < 0.5: x * P(x^2), relative error ~1e-8
    ctx.emit(f"mul.rn.f32 {small}, {x}, {_horner(ctx, _ERF_TAYLOR, x2)};")
    p, coeffs = _ERF_AS  # |x| >= 0.5: 1 - t (a1 + a2 t + ...) exp(-x^2), t = 1 / (1 + p |x|)
    den, tt = ctx.new("f32"), ctx.new("f32")
    ctx.emit(f"fma.rn.f32 {den}, {ax}, {f32_literal(p)}, 0f3F800000;")
    ctx.emit(f"rcp.rn.f32 {tt}, {den};")
    poly, tp = _horner(ctx, coeffs, tt), ctx.new("f32")
    ctx.emit(f"mul.rn.f32 {tp}, {poly}, {tt};")
    e = _scaled("ex2.approx.ftz.f32", -LOG2E, after=False)(ctx, x2, t)
    big, signed = ctx.new("f32"), ctx.new("f32")
    ctx.emit(f"mul.rn.f32 {tp}, {tp}, {e};")
    ctx.emit(f"sub.rn.f32 {big}, 0f3F800000, {tp};")
    ctx.emit(f"copysign.f32 {signed}, {x}, {big};")
    is_small, d = ctx.new("pred"), ctx.new("f32")
    ctx.emit(f"setp.lt.f32 {is_small}, {ax}, 0f3F000000;")
    ctx.emit(f"selp.f32 {d}, {small}, {signed}, {is_small};")
    return d


_FLOAT_UNARY: dict[str, Callable[[KernelContext, str, str], str]] = {
    "mt.neg": _one("neg.{t}"), "mt.abs": _one("abs.{t}"), "mt.floor": _one("cvt.rmi.{t}.{t}"),
    "mt.ceil": _one("cvt.rpi.{t}.{t}"), "mt.sqrt": _one("sqrt.rn.{t}"), "mt.rsqrt": _rsqrt,
    "mt.exp": _scaled("ex2.approx.ftz.f32", LOG2E, after=False), "mt.exp2": _one("ex2.approx.ftz.f32"),
    "mt.log": _scaled("lg2.approx.f32", LN2, after=True), "mt.log2": _one("lg2.approx.f32"),
    "mt.sigmoid": _sigmoid, "mt.tanh": _one("tanh.approx.f32"), "mt.sin": _trig("sin.approx.f32"),
    "mt.cos": _trig("cos.approx.f32"), "mt.erf": _erf,
}
_F64_UNARY = {"mt.neg", "mt.abs", "mt.floor", "mt.ceil", "mt.sqrt", "mt.rsqrt"}


# --------------------------------------------------------------------------------- fma, cmp, select


def fma(ctx: KernelContext, op: Operation, ins: list[str]) -> str:
    t = op.result.type.scalar
    if is_half(t):  # native fused f16 / bf16: going through f32 would round twice (exact -> f32 -> f16)
        d = ctx.new("b16")
        ctx.emit(f"fma.rn.{half_name(t)} {d}, {ins[0]}, {ins[1]}, {ins[2]};")  # type: ignore[arg-type]
        return d
    sfx = float_suffix(t)  # type: ignore[arg-type]
    a, b, c = (upcast(ctx, x, t) for x in ins)
    d = ctx.new(sfx)
    ctx.emit(f"fma.rn.{sfx} {d}, {a}, {b}, {c};")
    return downcast(ctx, d, t)


def cmp(ctx: KernelContext, op: Operation, ins: list[str]) -> str:
    t = op.operands[0].type.scalar
    pred = op.attrs["predicate"]
    a, b = ins
    d = ctx.new("pred")
    if isinstance(t, PointerType):
        ctx.emit(f"setp.{pred}.u64 {d}, {a}, {b};")
    elif t.is_bool:
        a, b = bool_to_int(ctx, a, "u32"), bool_to_int(ctx, b, "u32")
        ctx.emit(f"setp.{pred}.u32 {d}, {a}, {b};")
    elif t.is_float:
        sfx = float_suffix(t)
        ctx.emit(f"setp.{_CMP_FLOAT[pred]}.{sfx} {d}, {upcast(ctx, a, t)}, {upcast(ctx, b, t)};")
    else:
        ctx.emit(f"setp.{pred}.{int_suffix(t)} {d}, {a}, {b};")
    return d


def bool_to_int(ctx: KernelContext, p: str, sfx: str) -> str:
    """0 / 1 in a register of type u32 / u64 / u16 (sfx)."""
    d = ctx.new({"u16": "b16", "u32": "b32", "u64": "b64"}[sfx])
    ctx.emit(f"selp.{sfx} {d}, 1, 0, {p};")
    return d


def select(ctx: KernelContext, op: Operation, ins: list[str]) -> str:
    c, a, b = ins
    cls = reg_class(op.result.type.scalar)
    d = ctx.new(cls)
    if cls == "pred":
        ctx.emit(f"@{c} mov.pred {d}, {a};")
        ctx.emit(f"@!{c} mov.pred {d}, {b};")
    else:
        ctx.emit(f"selp.{cls} {d}, {a}, {b}, {c};")
    return d


# --------------------------------------------------------------------------------------------- casts


def cast(ctx: KernelContext, op: Operation, ins: list[str]) -> str:
    return convert(ctx, ins[0], op.operands[0].type.scalar, op.result.type.scalar)  # type: ignore[arg-type]


def convert(ctx: KernelContext, a: str, src: ScalarType, dst: ScalarType) -> str:
    """mt.cast of one register from src to dst (ops.py: round to nearest even, float -> int truncates and
    saturates with NaN -> 0, int -> int wraps, x -> i1 is x != 0)."""
    if src == dst:
        return a
    if dst.is_bool:
        d = ctx.new("pred")
        if src.is_float:
            sfx = float_suffix(src)
            ctx.emit(f"setp.neu.{sfx} {d}, {upcast(ctx, a, src)}, {float_const(ctx, 0.0, sfx)};")
        else:
            ctx.emit(f"setp.ne.{int_suffix(src)} {d}, {a}, 0;")
        return d
    if src.is_bool:
        if dst.is_float:
            sfx = float_suffix(dst)
            d = ctx.new(sfx)
            one, zero = float_const(ctx, 1.0, sfx), float_const(ctx, 0.0, sfx)
            ctx.emit(f"selp.{sfx} {d}, {one}, {zero}, {a};")
            return downcast(ctx, d, dst)
        return bool_to_int(ctx, a, "u64" if dst.bits == 64 else "u32")
    if src.is_int and dst.is_int:
        return _int_to_int(ctx, a, src, dst)
    if src.is_int:  # -> float, one rounding straight from the integer
        d = ctx.new(reg_class(dst))
        target = half_name(dst) if is_half(dst) else dst.name
        ctx.emit(f"cvt.rn.{target}.{int_suffix(src)} {d}, {a};")
        return d
    if dst.is_int:
        return _float_to_int(ctx, upcast(ctx, a, src), float_suffix(src), dst)
    return _float_to_float(ctx, a, src, dst)


def _int_to_int(ctx: KernelContext, a: str, src: ScalarType, dst: ScalarType) -> str:
    if src.bits <= 32 and dst.bits <= 32:  # both in 32-bit registers, src extended by its own signedness
        return normalize(ctx, a, dst) if dst.bits < 32 else a
    if src.bits <= 32:  # -> 64: extend by the source's signedness (the value is preserved, then wraps)
        d = ctx.new("b64")
        ctx.emit(f"cvt.{int_suffix(dst)[0]}64.{int_suffix(src)} {d}, {a};")
        return d
    if dst.bits == 64:
        return a
    d = ctx.new("b32")
    ctx.emit(f"cvt.u32.u64 {d}, {a};")  # truncate
    return normalize(ctx, d, dst)


def _float_to_int(ctx: KernelContext, x: str, sfx: str, dst: ScalarType) -> str:
    """Truncate toward zero, saturating at the type's range; NaN -> 0.

    cvt.rzi saturates, but its NaN result depends on the widths: 0 for f32 -> 32-bit, the most negative integer for
    64-bit results and for f64 sources (measured on the H200), so NaN is selected to 0 explicitly."""
    width = 64 if dst.bits == 64 else 32
    kind = "s" if dst.is_signed else "u"
    raw, d, nan = ctx.new("b64" if width == 64 else "b32"), ctx.new("b64" if width == 64 else "b32"), ctx.new("pred")
    ctx.emit(f"cvt.rzi.{kind}{width}.{sfx} {raw}, {x};")
    ctx.emit(f"setp.nan.{sfx} {nan}, {x}, {x};")
    ctx.emit(f"selp.b{width} {d}, 0, {raw}, {nan};")
    if dst.bits < 32:  # saturate to the narrow range explicitly
        lo, hi = (-(1 << (dst.bits - 1)), (1 << (dst.bits - 1)) - 1) if dst.is_signed else (0, (1 << dst.bits) - 1)
        clamped, out = ctx.new("b32"), ctx.new("b32")
        ctx.emit(f"min.{kind}32 {clamped}, {d}, {hi};")
        ctx.emit(f"max.{kind}32 {out}, {clamped}, {lo};")
        return out
    return d


def _float_to_float(ctx: KernelContext, a: str, src: ScalarType, dst: ScalarType) -> str:
    if is_half(dst):
        d = ctx.new("b16")
        if src.name == "f64":
            ctx.emit(f"cvt.rn.{half_name(dst)}.f64 {d}, {a};")
        else:  # f32, or the other 16-bit type through its exact f32 value
            ctx.emit(f"cvt.rn.{half_name(dst)}.f32 {d}, {upcast(ctx, a, src)};")
        return d
    x = upcast(ctx, a, src)
    if dst.name == float_suffix(src):
        return x
    d = ctx.new(dst.name)
    ctx.emit(f"cvt.f64.f32 {d}, {x};" if dst.name == "f64" else f"cvt.rn.f32.f64 {d}, {x};")
    return d


def bitcast(ctx: KernelContext, op: Operation, ins: list[str]) -> str:
    src, dst = op.operands[0].type.scalar, op.result.type.scalar
    (a,) = ins
    sc, dc = reg_class(src), reg_class(dst)
    d = ctx.new(dc)
    if sc == dc:
        if isinstance(dst, ScalarType) and dst.is_int and dst.bits < 32:
            return normalize(ctx, a, dst)
        ctx.emit(f"mov.{dc} {d}, {a};")
    elif sc == "b16":  # f16 / bf16 bits -> i16 / ui16 in a 32-bit register
        ctx.emit(f"cvt.{'s32.s16' if dst.is_signed else 'u32.u16'} {d}, {a};")  # type: ignore[union-attr]
    elif dc == "b16":
        ctx.emit(f"cvt.u16.u32 {d}, {a};")
    else:  # f32 <-> b32, f64 / pointer <-> b64
        ctx.emit(f"mov.b{64 if '64' in dc else 32} {d}, {a};")
    return d


def lower_bitcast_split(ctx: KernelContext, op: Operation) -> None:
    """mt.bitcast_split: each thread splits the registers it holds, one `mov.b32 {lo, hi}` (`mov.b64`) per operand
    register, which ptxas folds away (the halves of a 32-bit register are addressed in place). The tiling pass gives
    the result the operand's layout plus an in-thread pair dim, so no element changes thread."""
    src_v, dst_v = op.operands[0], op.result
    rank = len(src_v.type.shape)
    dst_map = ctx.tmap(dst_v)
    perm = register_permutation(ctx.tmap(src_v), dst_map, lambda c: c[:rank])
    if perm is None or any(b[rank] for b in (dst_map.base(t) for t in range(dst_map.num_threads))):
        raise ctx.error("bitcast_split: a thread does not hold both halves of the elements it splits (layouts)")
    dst = dst_v.type.scalar
    src_class = reg_class(src_v.type.scalar)
    regs = ctx.get(src_v)
    halves: dict[str, tuple[str, str]] = {}

    def split(reg: str) -> tuple[str, str]:
        if reg not in halves:
            halves[reg] = _split_register(ctx, reg, src_class, dst)
        return halves[reg]

    ctx.bind(dst_v, [split(regs[s])[dst_map.reg_offsets[r][rank]] for r, s in enumerate(perm)])


def _split_register(ctx: KernelContext, reg: str, src_class: str, dst: ScalarType) -> tuple[str, str]:
    """The low and high halves of a 64-, 32- or 16-bit value's register (of class src_class) as registers of dst's
    class."""
    dc = reg_class(dst)
    if dc == "b16":  # f16 / bf16: 16-bit registers, straight out of the 32-bit one
        lo, hi = ctx.new("b16"), ctx.new("b16")
        ctx.emit(f"mov.b32 {{{lo}, {hi}}}, {reg};")
        return lo, hi
    if dst.bits == 32:  # 64 -> 32: two 32-bit registers, moved to f32 when that is the class
        lo, hi = ctx.new("b32"), ctx.new("b32")
        ctx.emit(f"mov.b64 {{{lo}, {hi}}}, {reg};")
        if dc == "b32":
            return lo, hi
        flo, fhi = ctx.new(dc), ctx.new(dc)
        ctx.emit(f"mov.b32 {flo}, {lo};")
        ctx.emit(f"mov.b32 {fhi}, {hi};")
        return flo, fhi
    # 16- and 8-bit integers live in 32-bit registers, wrapped to their type: one bit-field extract per half,
    # straight from the source register (a 16-bit source is already wrapped, so its low 16 bits are its bits); bfe
    # takes integer registers, so an f32 source is moved to a b32 one first (ptxas folds the move)
    if src_class == "f32":
        bits = ctx.new("b32")
        ctx.emit(f"mov.b32 {bits}, {reg};")
        reg = bits
    halves = []
    for offset in (0, dst.bits):
        d = ctx.new("b32")
        ctx.emit(f"{'bfe.s32' if dst.is_signed else 'bfe.u32'} {d}, {reg}, {offset}, {dst.bits};")
        halves.append(d)
    return halves[0], halves[1]


# ------------------------------------------------------------------------------------------- dispatch

LOWERINGS: dict[str, Lowering] = {"mt.fma": fma, "mt.cmp": cmp, "mt.select": select, "mt.cast": cast,
                                  "mt.bitcast": bitcast}
for _name in list(_INT_BINARY) + ["mt.shl", "mt.shr", "mt.pow"]:
    LOWERINGS[_name] = binary
for _name in list(_FLOAT_UNARY) + ["mt.not"]:
    LOWERINGS[_name] = unary


_PACKED_HALF = {"mt.add": "add.rn", "mt.sub": "sub.rn", "mt.mul": "mul.rn"}


def _packs_in_pairs(op: Operation, n: int) -> bool:
    """add / sub / mul of f16 / bf16 values with an even number of registers per thread: two per instruction."""
    t = op.result.type.scalar
    return op.name in _PACKED_HALF and is_half(t) and n % 2 == 0 and all(
        v.type.scalar == t for v in op.operands)


def _lower_packed_pairs(ctx: KernelContext, op: Operation, operands: list[list[str]]) -> list[str]:
    """Registers 2i and 2i + 1 of each operand packed into one b32, one `<op>.rn.{bf16x2,f16x2}` per pair."""
    kind = f"{half_name(op.result.type.scalar)}x2"  # type: ignore[arg-type]
    packed: dict[tuple[str, str], str] = {}

    def pack(pair: tuple[str, str]) -> str:
        if pair not in packed:
            packed[pair] = ctx.new("b32")
            ctx.emit(f"mov.b32 {packed[pair]}, {{{pair[0]}, {pair[1]}}};")
        return packed[pair]

    memo: dict[tuple[tuple[str, str], ...], tuple[str, str]] = {}
    out: list[str] = []
    for i in range(0, len(operands[0]), 2):
        key = tuple((r[i], r[i + 1]) for r in operands)
        if key not in memo:
            ins = [pack(pair) for pair in key]
            d, lo, hi = ctx.new("b32"), ctx.new("b16"), ctx.new("b16")
            ctx.emit(f"{_PACKED_HALF[op.name]}.{kind} {d}, {', '.join(ins)};")
            ctx.emit(f"mov.b32 {{{lo}, {hi}}}, {d};")
            memo[key] = (lo, hi)
        out.extend(memo[key])
    return out


def lower_elementwise(ctx: KernelContext, op: Operation) -> None:
    """Apply the op's element lowering to each register; equal operand registers give one instruction."""
    fn = LOWERINGS[op.name]
    operands = [ctx.get(v) for v in op.operands]
    n = len(operands[0])
    if any(len(r) != n for r in operands):
        raise ctx.error("operands hold different numbers of registers (mismatched layouts)")
    if _packs_in_pairs(op, n):
        ctx.bind(op.result, _lower_packed_pairs(ctx, op, operands))
        return
    memo: dict[tuple[str, ...], str] = {}
    out = []
    for i in range(n):
        ins = tuple(r[i] for r in operands)
        if ins not in memo:
            memo[ins] = fn(ctx, op, list(ins))
        out.append(memo[ins])
    ctx.bind(op.result, out)

