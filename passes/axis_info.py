"""Axis analysis (an analysis, not a pass): what is known about the integer and pointer values of a kernel, per dim.

For every integer or pointer value it computes an AxisInfo, after Triton's AxisInfo:
  contiguity[d]   runs of this length along d (starting at multiples of it) hold x, x+1, x+2, ... (pointers: step
                  one element)
  divisibility[d] the largest power of two known to divide the first value of every such run (pointers: in bytes);
                  when contiguity[d] == 1 every element along d is a run, so it divides every element
  constancy[d]    runs of this length along d (starting at multiples of it) hold one value
and, for scalars, the divisibility of the value. Facts come from arange (contiguous), constants and splats
(constant), the kernel's `divisibility` attribute (16 for pointers known 16-byte aligned and ints known to be
multiples of 16) and the arithmetic rules below; everything else is unknown (1, 1, 1).

The tiling pass reads it to pick a coalesced layout and vector width for each load and store: a vector of `w`
elements is legal where the pointer is contiguous for w elements, the first address is w*size aligned, and the
mask is constant over the w elements.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from typing import Sequence

from minitriton.ir import Operation, Value
from minitriton.ir.types import PointerType, ScalarType

MAX_DIV = 1 << 30  # the divisibility of 0


def pow2_divisor(v: int) -> int:
    """The largest power of two dividing v (MAX_DIV for 0)."""
    v = abs(int(v))
    if v == 0:
        return MAX_DIV
    return min(v & -v, MAX_DIV)


@dataclass(frozen=True)
class AxisInfo:
    contiguity: tuple[int, ...]
    divisibility: tuple[int, ...]
    constancy: tuple[int, ...]
    scalar_div: int = 1  # scalars: the divisibility of the value
    value: int | None = None  # the value of every element, when known

    @property
    def rank(self) -> int:
        return len(self.contiguity)

    def element_div(self) -> int:
        """A power of two dividing every element (scalars: the value)."""
        if not self.rank:
            return self.scalar_div
        if any(c > 1 for c in self.contiguity):
            return 1
        return max(self.divisibility)

    def dim_element_div(self, d: int) -> int:
        """A power of two dividing every element, as seen along dim d (a run of one is every element)."""
        if not self.rank:
            return self.scalar_div
        return self.divisibility[d] if self.contiguity[d] == 1 else 1


def unknown(shape: Sequence[int]) -> AxisInfo:
    n = len(shape)
    return AxisInfo((1,) * n, (1,) * n, (1,) * n)


def constant_info(shape: Sequence[int], div: int, value: int | None) -> AxisInfo:
    n = len(shape)
    return AxisInfo((1,) * n, (div,) * n, tuple(shape), div, value)


def join(a: AxisInfo, b: AxisInfo) -> AxisInfo:
    """What holds for a value that is either a or b (control flow merges)."""
    return AxisInfo(tuple(map(gcd, a.contiguity, b.contiguity)), tuple(map(gcd, a.divisibility, b.divisibility)),
                    tuple(map(gcd, a.constancy, b.constancy)), gcd(a.scalar_div, b.scalar_div),
                    a.value if a.value == b.value else None)


def _realign(div: int, contig: int, new_contig: int) -> int:
    """The divisibility of the starts of runs of `new_contig` cut out of runs of `contig` starting at `div`."""
    return div if new_contig >= contig else gcd(div, new_contig)


def _add(a: AxisInfo, b: AxisInfo, b_scale: int, subtract: bool) -> AxisInfo:
    """a + b * b_scale (b_scale: the pointee size for pointer + offset); a - b when `subtract`."""
    value = None
    if a.value is not None and b.value is not None:
        value = a.value - b.value * b_scale if subtract else a.value + b.value * b_scale
    if not a.rank:
        return AxisInfo((), (), (), gcd(a.scalar_div, b.scalar_div * b_scale), value)
    contig, div, const = [], [], []
    for d in range(a.rank):
        c = gcd(a.contiguity[d], b.constancy[d])
        if not subtract:
            c = max(c, gcd(a.constancy[d], b.contiguity[d]))
        contig.append(c)
        div.append(min(gcd(_realign(a.divisibility[d], a.contiguity[d], c),
                           _realign(b.divisibility[d], b.contiguity[d], c) * b_scale), MAX_DIV))
        const.append(gcd(a.constancy[d], b.constancy[d]))
    return AxisInfo(tuple(contig), tuple(div), tuple(const), 1, value)


def _mul(a: AxisInfo, b: AxisInfo) -> AxisInfo:
    value = a.value * b.value if a.value is not None and b.value is not None else None
    if not a.rank:
        return AxisInfo((), (), (), min(a.scalar_div * b.scalar_div, MAX_DIV), value)
    if a.value == 1:
        return AxisInfo(b.contiguity, b.divisibility, b.constancy, 1, value)
    if b.value == 1:
        return AxisInfo(a.contiguity, a.divisibility, a.constancy, 1, value)
    div = tuple(min(a.dim_element_div(d) * b.dim_element_div(d), MAX_DIV) for d in range(a.rank))
    const = tuple(map(gcd, a.constancy, b.constancy))
    return AxisInfo((1,) * a.rank, div, const, 1, value)


def _cmp(op: Operation, a: AxisInfo, b: AxisInfo) -> AxisInfo:
    """x < n over a contiguous x: constant over aligned blocks where both x's run starts and n are multiples."""
    pred = op.attrs.get("predicate")
    const = []
    for d in range(a.rank):
        k = gcd(a.constancy[d], b.constancy[d])
        if pred in ("lt", "ge") and a.contiguity[d] > 1 and b.constancy[d] >= a.contiguity[d]:
            k = max(k, gcd(a.contiguity[d], gcd(a.divisibility[d], b.divisibility[d])))
        if pred in ("gt", "le") and b.contiguity[d] > 1 and a.constancy[d] >= b.contiguity[d]:
            k = max(k, gcd(b.contiguity[d], gcd(b.divisibility[d], a.divisibility[d])))
        const.append(k)
    return AxisInfo((1,) * a.rank, (1,) * a.rank, tuple(const))


def _select(c: AxisInfo, a: AxisInfo, b: AxisInfo) -> AxisInfo:
    contig, div, const = [], [], []
    for d in range(a.rank):
        k = min(gcd(a.contiguity[d], b.contiguity[d]), c.constancy[d])
        contig.append(max(k, 1))
        div.append(gcd(_realign(a.divisibility[d], a.contiguity[d], contig[-1]),
                       _realign(b.divisibility[d], b.contiguity[d], contig[-1])))
        const.append(gcd(gcd(a.constancy[d], b.constancy[d]), c.constancy[d]))
    return AxisInfo(tuple(contig), tuple(div), tuple(const))


def _is_int_like(t: object) -> bool:
    s = t.scalar  # type: ignore[attr-defined]
    return isinstance(s, PointerType) or (isinstance(s, ScalarType) and s.is_int)


class AxisAnalysis:
    """Runs the analysis over one kernel; `info(value)` answers for any value (unknown when nothing is known)."""

    def __init__(self, func: Operation):
        self.infos: dict[Value, AxisInfo] = {}
        body = func.regions[0].block
        divs = func.attrs.get("divisibility") or [1] * len(body.args)
        for arg, div in zip(body.args, divs):
            if _is_int_like(arg.type):
                self.infos[arg] = AxisInfo((), (), (), max(1, int(div)))
        self._block(body)

    def info(self, v: Value) -> AxisInfo:
        got = self.infos.get(v)
        if got is not None:
            return got
        return unknown(v.type.shape)

    def _block(self, block) -> None:  # type: ignore[no-untyped-def]
        for op in block.ops:
            self._op(op)

    def _set(self, v: Value, info: AxisInfo) -> None:
        if _is_int_like(v.type):
            self.infos[v] = info

    def _op(self, op: Operation) -> None:
        if op.name == "scf.for":
            self._for(op)
            return
        if op.name == "scf.if":
            for region in op.regions:
                self._block(region.block)
            for i, r in enumerate(op.results):
                t, e = (region.block.terminator.operands[i] for region in op.regions)
                self._set(r, join(self.info(t), self.info(e)))
            return
        if op.name == "scf.while":
            for region in op.regions:
                self._block(region.block)
            return
        if len(op.results) != 1 or not _is_int_like(op.result.type):
            for region in op.regions:
                self._block(region.block)
            return
        self._set(op.result, self._compute(op))

    def _for(self, op: Operation) -> None:
        """Carried values start from their init's facts and keep what survives one more trip around the loop."""
        body = op.regions[0].block
        lb, _, step = (self.info(v) for v in op.operands[:3])
        self._set(body.args[0], AxisInfo((), (), (), gcd(lb.scalar_div, step.scalar_div)))
        carried = [self.info(v) for v in op.operands[3:]]
        for _ in range(32):  # gcd joins only shrink powers of two, so this settles fast
            for arg, info in zip(body.args[1:], carried):
                self._set(arg, info)
            self._block(body)
            nxt = [join(c, self.info(y)) for c, y in zip(carried, body.terminator.operands)]
            if nxt == carried:
                break
            carried = nxt
        else:
            carried = [unknown(a.type.shape) for a in body.args[1:]]
            for arg, info in zip(body.args[1:], carried):
                self._set(arg, info)
            self._block(body)
        for r, info in zip(op.results, carried):
            self._set(r, info)

    def _compute(self, op: Operation) -> AxisInfo:
        shape = op.result.type.shape
        ins = [self.info(v) for v in op.operands]
        name = op.name
        if name == "mt.constant":
            v = op.attrs["value"]
            if isinstance(v, float):
                return unknown(shape)
            return constant_info(shape, pow2_divisor(int(v)), int(v))
        if name == "mt.arange":
            return AxisInfo((shape[0],), (pow2_divisor(op.attrs["start"]),), (1,))
        if name == "mt.splat":
            return constant_info(shape, ins[0].scalar_div, ins[0].value)
        if name == "mt.broadcast":
            src = op.operands[0].type.shape
            a = ins[0]
            grow = [s != t for s, t in zip(src, shape)]
            return AxisInfo(tuple(1 if g else c for g, c in zip(grow, a.contiguity)), a.divisibility,
                            tuple(t if g else k for g, t, k in zip(grow, shape, a.constancy)))
        if name == "mt.convert_layout":  # a layout change moves values between threads; the values stay
            return ins[0]
        if name == "mt.expand_dims":
            a, ax = ins[0], op.attrs["axis"]
            ins_at = lambda t, x: t[:ax] + (x,) + t[ax:]  # noqa: E731
            return AxisInfo(ins_at(a.contiguity, 1), ins_at(a.divisibility, a.element_div()), ins_at(a.constancy, 1))
        if name == "mt.trans":
            a, order = ins[0], op.attrs["order"]
            return AxisInfo(tuple(a.contiguity[i] for i in order), tuple(a.divisibility[i] for i in order),
                            tuple(a.constancy[i] for i in order))
        if name == "mt.addptr":
            size = op.result.type.scalar.pointee.bytes  # type: ignore[union-attr]
            return _add(ins[0], ins[1], size, subtract=False)
        if name in ("mt.add", "mt.sub"):
            return _add(ins[0], ins[1], 1, subtract=name == "mt.sub")
        if name == "mt.mul":
            return _mul(ins[0], ins[1])
        if name == "mt.shl" and ins[1].value is not None and 0 <= ins[1].value < 31:
            k = 1 << ins[1].value
            return _mul(ins[0], constant_info(shape, pow2_divisor(k), k))
        if name == "mt.cmp" and shape:
            return _cmp(op, ins[0], ins[1])
        if name == "mt.select" and shape:
            return _select(ins[0], ins[1], ins[2])
        if name == "mt.cast":
            src, dst = op.operands[0].type.scalar, op.result.type.scalar
            if isinstance(src, ScalarType) and src.is_int and not src.is_bool and dst.is_int and \
                    dst.bits >= src.bits:  # type: ignore[union-attr]  (widening keeps every value)
                return ins[0]
        if not shape:
            return AxisInfo((), (), (), 1)
        if name in _ELEMENTWISE_KEEP_CONST:  # elementwise: constant wherever every operand is
            const = tuple(gcd(*(i.constancy[d] for i in ins)) for d in range(len(shape)))
            return AxisInfo((1,) * len(shape), (1,) * len(shape), const)
        return unknown(shape)


# Ops whose result is constant wherever all their operands are (pure elementwise functions).
_ELEMENTWISE_KEEP_CONST = {
    "mt.add", "mt.sub", "mt.mul", "mt.div", "mt.rem", "mt.and", "mt.or", "mt.xor", "mt.shl", "mt.shr",
    "mt.maximum", "mt.minimum", "mt.neg", "mt.not", "mt.abs", "mt.cmp", "mt.select", "mt.cast", "mt.bitcast",
}

