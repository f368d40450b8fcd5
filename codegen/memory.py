"""Global loads, stores and atomics.

A tile of pointers holds one 64-bit address register per element. The tiling pass records `vector_width` w on
each load / store: the layout then gives each thread runs of w consecutive elements along its fastest dim (w
consecutive registers, `vector_groups` in layouts.py), which the axis analysis proved contiguous in memory, w * size
aligned and under one mask value. Each run becomes one access of w * size bytes:
  - 4- and 8-byte elements: `ld.global.v4.b32 {%f1, %f2, %f3, %f4}, [%rd]` (v2 / v4 / scalar),
  - 1- and 2-byte elements packed into 32-bit words: `ld.global.v4.b32` of 8 x bf16 then `mov.b32 {%h1, %h2}, %r`
    per word (i8 / i16: `bfe`; stores pack with `mov.b32 %r, {%h1, %h2}` / `bfi`),
  - single narrow elements: `ld.global.b16` (f16 / bf16), `ld.global.s8 / u8 / s16 / u16` into 32-bit registers.
A load's `cache_modifier` attr is its PTX cache operator (`ld.global.cg.v4.b32`), its `l2_prefetch` attr the L2's
fetch size on a miss (`ld.global.L2::256B.v4.b32`).
Masks are predicates (`@%p ld...`): the destination starts at 0 and masked-off elements then take `other`.
Booleans are one byte in memory. Elements several threads hold (replicated layouts) are stored by their owner
only; atomics likewise, and their old values are then shared with the other holders through shared memory.
Scalars: every thread loads; thread 0 stores.
Prefetches (`prefetch.global.L1 [%rd]`, or .L2) come one per 128-byte line of each thread's run of consecutive
pointers (the tiling pass makes the runs as long as the pointer is contiguous: `prefetch_layout`), from the
elements' owners only, each predicated on its own element's mask; a splatted pointer is prefetched once.
"""
from __future__ import annotations

from minitriton.ir import Operation, Value
from minitriton.ir.layouts import ThreadMap, vector_groups
from minitriton.ir.ops import CACHE_LINE_BYTES
from minitriton.ir.types import ScalarType

from .context import KernelContext
from .elementwise import bool_to_int
from .registers import CLASS_BYTES, reg_class


def elem_bytes(t: ScalarType) -> int:
    return 1 if t.is_bool else t.bytes


def _vec(n: int) -> str:
    return "" if n == 1 else f".v{n}"


def _regs(regs: list[str]) -> str:
    return regs[0] if len(regs) == 1 else "{" + ", ".join(regs) + "}"


def _pred(p: str | None) -> str:
    return f"@{p} " if p else ""


def _groups(ctx: KernelContext, op: Operation, tmap: ThreadMap) -> list[list[int]]:
    width = int(op.attrs.get("vector_width", 1))
    enc = op.operands[0].type.encoding
    if width == 1:
        return [[r] for r in range(tmap.num_regs)]
    if enc is None or enc.kind != "blocked":
        raise ctx.error(f"vector_width {width} needs a blocked layout, got {enc}")
    try:
        return vector_groups(tmap, enc.get("order")[0], width)
    except ValueError as e:
        raise ctx.error(f"vector_width {width} does not fit the layout: {e}") from None


def _and(ctx: KernelContext, a: str | None, b: str | None) -> str | None:
    if a is None or b is None:
        return a or b
    d = ctx.new("pred")
    ctx.emit(f"and.pred {d}, {a}, {b};")
    return d


# ------------------------------------------------------------------------------------------------ loads


def load_run(ctx: KernelContext, t: ScalarType, addr: str, n: int, pred: str | None,
             space: str = "global", cop: str = "") -> list[str]:
    """Load n consecutive elements of type t at addr (one vector access) from `space` (global or shared), with the
    cache operator `cop` ("" or e.g. ".cg"); 0 where pred is false."""
    size = elem_bytes(t)
    space += cop
    if size >= 4:
        cls = reg_class(t)
        dst = [ctx.new(cls) for _ in range(n)]
        if pred:
            for d in dst:
                ctx.emit(f"mov.b{8 * size} {d}, 0;")
        ctx.emit(f"{_pred(pred)}ld.{space}{_vec(n)}.b{8 * size} {_regs(dst)}, [{addr}];")
        return dst
    if n * size >= 4:
        words = [ctx.new("b32") for _ in range(n * size // 4)]
        if pred:
            for w in words:
                ctx.emit(f"mov.b32 {w}, 0;")
        ctx.emit(f"{_pred(pred)}ld.{space}{_vec(len(words))}.b32 {_regs(words)}, [{addr}];")
        return [x for w in words for x in unpack_word(ctx, t, w)]
    if n != 1:
        raise ctx.error(f"cannot load a run of {n} x {t}")
    if t.is_float:  # f16 / bf16
        d = ctx.new("b16")
        if pred:
            ctx.emit(f"mov.b16 {d}, 0;")
        ctx.emit(f"{_pred(pred)}ld.{space}.b16 {d}, [{addr}];")
        return [d]
    d = ctx.new("b32")
    if pred:
        ctx.emit(f"mov.b32 {d}, 0;")
    kind = "u" if t.is_bool or not t.is_signed else "s"
    ctx.emit(f"{_pred(pred)}ld.{space}.{kind}{8 * size} {d}, [{addr}];")
    return [_byte_to_bool(ctx, d)] if t.is_bool else [d]


def _byte_to_bool(ctx: KernelContext, r: str) -> str:
    p = ctx.new("pred")
    ctx.emit(f"setp.ne.u32 {p}, {r}, 0;")
    return p


def unpack_word(ctx: KernelContext, t: ScalarType, w: str) -> list[str]:
    """The 2 (16-bit) or 4 (8-bit) elements of a 32-bit word, lowest address first."""
    if t.is_float:
        lo, hi = ctx.new("b16"), ctx.new("b16")
        ctx.emit(f"mov.b32 {{{lo}, {hi}}}, {w};")
        return [lo, hi]
    bits = 8 * elem_bytes(t)
    out = []
    for pos in range(0, 32, bits):
        d = ctx.new("b32")
        kind = "s" if t.is_signed and not t.is_bool else "u"
        ctx.emit(f"bfe.{kind}32 {d}, {w}, {pos}, {bits};")
        out.append(_byte_to_bool(ctx, d) if t.is_bool else d)
    return out


def _is_zero(v: Value) -> bool:
    """Whether `v` is a constant 0 (then masked-off elements need no `other`)."""
    op = v.defining_op
    while op is not None and op.name in ("mt.splat", "mt.broadcast", "mt.convert_layout"):
        op = op.operands[0].defining_op
    if op is None or op.name != "mt.constant":
        return False
    value = op.attrs["value"]
    return value == 0 and not str(value).startswith("-")


def _with_other(ctx: KernelContext, t: ScalarType, loaded: str, other: str, pred: str) -> str:
    cls = reg_class(t)
    d = ctx.new(cls)
    if cls == "pred":
        ctx.emit(f"@{pred} mov.pred {d}, {loaded};")
        ctx.emit(f"@!{pred} mov.pred {d}, {other};")
    else:
        ctx.emit(f"selp.{cls} {d}, {loaded}, {other}, {pred};")
    return d


def lower_load(ctx: KernelContext, op: Operation) -> None:
    ptr = op.operands[0]
    t: ScalarType = ptr.type.scalar.pointee  # type: ignore[union-attr]
    ptrs = ctx.get(ptr)
    masks = ctx.get(op.operands[1]) if len(op.operands) > 1 else None
    others = ctx.get(op.operands[2]) if len(op.operands) > 2 and not _is_zero(op.operands[2]) else None
    groups = [[0]] if not ptr.type.is_tensor else _groups(ctx, op, ctx.tmap(ptr))
    cop = op.attrs.get("cache_modifier", "")
    if "l2_prefetch" in op.attrs:  # ld.global.cg.L2::256B.v4.b32
        cop += f".L2::{op.attrs['l2_prefetch']}B"
    out: list[str] = [""] * len(ptrs)
    memo: dict[tuple[str, str | None, int], list[str]] = {}
    for group in groups:
        pred = masks[group[0]] if masks else None
        key = (ptrs[group[0]], pred, len(group))
        if key not in memo:  # a splatted pointer loads once
            memo[key] = load_run(ctx, t, ptrs[group[0]], len(group), pred, cop=cop)
        for r, v in zip(group, memo[key]):
            out[r] = _with_other(ctx, t, v, others[r], pred) if others and pred else v
    ctx.bind(op.result, out)


# -------------------------------------------------------------------------------------------- prefetches

def lower_prefetch(ctx: KernelContext, op: Operation) -> None:
    """`prefetch.global.L1|L2` at elements 0, L, 2L, ... of each vector_width run (L: elements per line), plus the
    run's last element when attr `line_tail` says its start may not be line-aligned; owners only, each under its
    own element's mask (a masked-off lane never names an address)."""
    ptr = op.operands[0]
    t: ScalarType = ptr.type.scalar.pointee  # type: ignore[union-attr]
    ptrs = ctx.get(ptr)
    masks = ctx.get(op.operands[1]) if len(op.operands) > 1 else None
    tmap = ctx.tmap(ptr) if ptr.type.is_tensor else None
    owner = ctx.owner_pred(tmap)
    step = max(1, CACHE_LINE_BYTES // elem_bytes(t))
    done: set[tuple[str, str | None]] = set()
    for group in [[0]] if tmap is None else _groups(ctx, op, tmap):
        picks = group[::step]  # one element per line of the run (line_tail: the last one's line too)
        if op.attrs.get("line_tail") and group[-1] not in picks:
            picks.append(group[-1])
        for r in picks:
            key = (ptrs[r], masks[r] if masks else None)
            if key not in done:
                done.add(key)
                pred = _and(ctx, key[1], owner)
                ctx.emit(f"{_pred(pred)}prefetch.global.{op.attrs['level']} [{ptrs[r]}];")


# ----------------------------------------------------------------------------------------------- stores


def pack_word(ctx: KernelContext, t: ScalarType, vals: list[str]) -> str:
    """One 32-bit word of 2 (16-bit) or 4 (8-bit) elements, the first in the low bits."""
    w = ctx.new("b32")
    if t.is_float:
        ctx.emit(f"mov.b32 {w}, {{{vals[0]}, {vals[1]}}};")
        return w
    bits = 8 * elem_bytes(t)
    vals = [bool_to_int(ctx, v, "u32") if t.is_bool else v for v in vals]
    acc = vals[0]
    for k, v in enumerate(vals[1:], start=1):
        nxt = ctx.new("b32")
        ctx.emit(f"bfi.b32 {nxt}, {v}, {acc}, {k * bits}, {bits};")
        acc = nxt
    ctx.emit(f"mov.b32 {w}, {acc};")
    return w


def store_run(ctx: KernelContext, t: ScalarType, addr: str, vals: list[str], pred: str | None,
              space: str = "global") -> None:
    size = elem_bytes(t)
    n = len(vals)
    if size >= 4:
        ctx.emit(f"{_pred(pred)}st.{space}{_vec(n)}.b{8 * size} [{addr}], {_regs(vals)};")
    elif n * size >= 4:
        per = 4 // size
        words = [pack_word(ctx, t, vals[i:i + per]) for i in range(0, n, per)]
        ctx.emit(f"{_pred(pred)}st.{space}{_vec(len(words))}.b32 [{addr}], {_regs(words)};")
    elif n != 1:
        raise ctx.error(f"cannot store a run of {n} x {t}")
    elif t.is_float:
        ctx.emit(f"{_pred(pred)}st.{space}.b16 [{addr}], {vals[0]};")
    else:
        v = bool_to_int(ctx, vals[0], "u32") if t.is_bool else vals[0]
        ctx.emit(f"{_pred(pred)}st.{space}.u{8 * size} [{addr}], {v};")


def lower_store(ctx: KernelContext, op: Operation) -> None:
    ptr = op.operands[0]
    t: ScalarType = ptr.type.scalar.pointee  # type: ignore[union-attr]
    ptrs, vals = ctx.get(ptr), ctx.get(op.operands[1])
    masks = ctx.get(op.operands[2]) if len(op.operands) > 2 else None
    tmap = ctx.tmap(ptr) if ptr.type.is_tensor else None
    owner = ctx.owner_pred(tmap)
    groups = [[0]] if tmap is None else _groups(ctx, op, tmap)
    for group in groups:
        pred = _and(ctx, masks[group[0]] if masks else None, owner)
        store_run(ctx, t, ptrs[group[0]], [vals[r] for r in group], pred)


# ---------------------------------------------------------------------------------------------- atomics

_ATOMIC_ADD = {"f32": "add.f32", "f64": "add.f64", "i32": "add.s32", "ui32": "add.u32", "i64": "add.u64",
               "ui64": "add.u64", "bf16": "add.noftz.bf16", "f16": "add.noftz.f16"}


def lower_atomic_add(ctx: KernelContext, op: Operation) -> None:
    from .layout_moves import share_from_owners

    ptr = op.operands[0]
    t: ScalarType = ptr.type.scalar.pointee  # type: ignore[union-attr]
    if t.name not in _ATOMIC_ADD:
        raise ctx.error(f"atomic_add on {t} is not supported (f16, bf16, f32, f64, i32, ui32, i64, ui64)")
    ptrs, vals = ctx.get(ptr), ctx.get(op.operands[1])
    masks = ctx.get(op.operands[2]) if len(op.operands) > 2 else None
    tmap = ctx.tmap(ptr) if ptr.type.is_tensor else None
    owner = ctx.owner_pred(tmap)
    cls = reg_class(t)
    old = []
    for r, (p, v) in enumerate(zip(ptrs, vals)):
        pred = _and(ctx, masks[r] if masks else None, owner)
        d = ctx.new(cls)
        if pred:
            ctx.emit(f"mov.b{8 * CLASS_BYTES[cls]} {d}, 0;")
        ctx.emit(f"{_pred(pred)}atom.global.{_ATOMIC_ADD[t.name]} {d}, [{p}], {v};")
        old.append(d)
    if owner is not None and op.result in ctx.used:
        old = share_from_owners(ctx, old, tmap, cls)
    ctx.bind(op.result, old)

