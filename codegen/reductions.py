"""mt.reduce and mt.scan along one axis of a tile.

The layout (layouts.py) spreads the axis over three levels: registers of one thread, lanes of a warp (the lane
bits from `lane_shift`, of which `distinct_lanes` hold different elements), and warps (`distinct_warps`). Both ops
work level by level:

reduce  1. each thread combines its registers that differ only along the axis, in one chain (f32 sums may contract
           with the products feeding them into fmas);
        2. `shfl.sync.bfly.b32` over the axis' lane bits (every lane ends with the warp's result);
        3. if several warps hold the axis: lane 0 of each writes its partial to shared memory, `bar.sync`, and
           every thread combines all warps' partials in warp order. Every thread that holds a result element ends
           with the same bits, so a scalar result is uniform (safe to branch on).
scan    1. inclusive prefix over each thread's run of registers (per repetition of the layout's tile);
        2. inclusive scan of the run totals over lanes (`shfl.sync.up.b32`, Hillis-Steele), an exclusive prefix
           by one more shift, and the warp total (`shfl.sync.idx.b32` from the last lane);
        3. warp totals through shared memory: each thread adds the totals of the warps before it;
        4. each repetition of the tile adds the totals of all earlier repetitions.

f16 / bf16 combine in f32 and round once per result (as the interpreter does); i1 combines as 0 / 1 in 32-bit
(sum is then modulo 2: xor; max = or; min = and); narrow integers combine in 32 bits and wrap at the end.
"""
from __future__ import annotations

from minitriton.ir import Operation
from minitriton.ir.layouts import log2, row_major_strides
from minitriton.ir.types import ScalarType

from .context import KernelContext
from .elementwise import bool_to_int, downcast, float_const, normalize, upcast
from .registers import int_suffix, is_half

Key = tuple[int, ...]


class Combiner:
    """How to combine two partial values of one element type (in its compute registers)."""

    def __init__(self, ctx: KernelContext, kind: str, t: ScalarType):
        self.ctx, self.kind, self.t = ctx, kind, t
        if t.is_bool:
            self.cls, self.sfx = "b32", "u32"
        elif t.is_float:
            self.cls = self.sfx = "f64" if t.name == "f64" else "f32"
        else:
            self.sfx = int_suffix(t)
            self.cls = "b64" if t.bits == 64 else "b32"

    def __call__(self, a: str, b: str, contract: bool = False) -> str:
        d = self.ctx.new(self.cls)
        op = {"sum": "add", "max": "max", "min": "min"}[self.kind]
        rn = ".rn" if op == "add" and self.sfx.startswith("f") and not (contract and self.sfx == "f32") else ""
        self.ctx.emit(f"{op}{rn}.{self.sfx} {d}, {a}, {b};")
        return d

    def fold(self, values: list[str], contract: bool = False) -> str:
        """Combine in order, one chain. contract: an f32 sum uses `add.f32` (no rounding modifier), so ptxas may
        fuse each add with the multiply producing its operand into one fma (a dot product becomes an fma chain),
        as the elementwise f32 ops allow (codegen/elementwise.py)."""
        acc = values[0]
        for v in values[1:]:
            acc = self(acc, v, contract)
        return acc

    def identity(self) -> str:
        s = self.sfx
        if s.startswith("f"):
            x = {"sum": 0.0, "max": float("-inf"), "min": float("inf")}[self.kind]
            return float_const(self.ctx, x, s)
        bits = int(s[1:])
        signed = s[0] == "s"
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
        return self.ctx.const(str({"sum": 0, "max": lo, "min": hi}[self.kind]), self.cls)

    def to_compute(self, reg: str) -> str:
        if self.t.is_bool:
            return bool_to_int(self.ctx, reg, "u32")
        return upcast(self.ctx, reg, self.t)

    def from_compute(self, reg: str) -> str:
        ctx, t = self.ctx, self.t
        if t.is_bool:
            low, p = ctx.new("b32"), ctx.new("pred")
            ctx.emit(f"and.b32 {low}, {reg}, 1;")
            ctx.emit(f"setp.ne.u32 {p}, {low}, 0;")
            return p
        if is_half(t):
            return downcast(ctx, reg, t)
        return normalize(ctx, reg, t)

    def select(self, a: str, b: str, p: str) -> str:
        d = self.ctx.new(self.cls)
        self.ctx.emit(f"selp.{self.cls} {d}, {a}, {b}, {p};")
        return d


def shfl(ctx: KernelContext, mode: str, value: str, cls: str, b: str | int) -> str:
    """One warp shuffle of a 32- or 64-bit value (64-bit: two halves)."""
    c = "0" if mode == "up" else "0x1f"
    if cls in ("b32", "f32"):
        d = ctx.new(cls)
        ctx.emit(f"shfl.sync.{mode}.b32 {d}, {value}, {b}, {c}, 0xffffffff;")
        return d
    lo, hi, lo2, hi2, d = ctx.new("b32"), ctx.new("b32"), ctx.new("b32"), ctx.new("b32"), ctx.new(cls)
    ctx.emit(f"mov.b64 {{{lo}, {hi}}}, {value};")
    ctx.emit(f"shfl.sync.{mode}.b32 {lo2}, {lo}, {b}, {c}, 0xffffffff;")
    ctx.emit(f"shfl.sync.{mode}.b32 {hi2}, {hi}, {b}, {c}, 0xffffffff;")
    ctx.emit(f"mov.b64 {d}, {{{lo2}, {hi2}}};")
    return d


def _bytes(cls: str) -> int:
    return 8 if cls in ("b64", "f64") else 4


def _drop(off: Key, axis: int) -> Key:
    return off[:axis] + off[axis + 1:]


def _lin(offsets: Key, strides: tuple[int, ...]) -> int:
    return sum(o * s for o, s in zip(offsets, strides))


# ----------------------------------------------------------------------------------------------- reduce


def lower_reduce(ctx: KernelContext, op: Operation) -> None:
    src, axis = op.operands[0], op.attrs["axis"]
    t: ScalarType = src.type.scalar  # type: ignore[assignment]
    comb = Combiner(ctx, op.attrs["kind"], t)
    tmap = ctx.tmap(src)
    regs = ctx.get(src)
    compute: dict[str, str] = {}
    groups: dict[Key, list[tuple[int, str]]] = {}
    for r, off in enumerate(tmap.reg_offsets):
        if regs[r] not in compute:
            compute[regs[r]] = comb.to_compute(regs[r])
        groups.setdefault(_drop(off, axis), []).append((off[axis], compute[regs[r]]))
    result_is_tile = op.result.type.is_tensor
    res_map = ctx.tmap(op.result) if result_is_tile else None
    keys = list(res_map.reg_offsets) if res_map is not None else [()]
    if set(keys) != set(groups):
        raise ctx.error("the result layout is not the slice of the operand's")
    partial = {k: comb.fold([v for _, v in sorted(groups[k])], contract=True) for k in keys}  # 1. in the thread
    dm = tmap.dims[axis]
    for i in range(log2(dm.distinct_lanes)):  # 2. across lanes
        mask = 1 << (dm.lane_shift + i)
        partial = {k: comb(p, shfl(ctx, "bfly", p, comb.cls, mask)) for k, p in partial.items()}
    nw = dm.distinct_warps
    if nw > 1:  # 3. across warps
        size = _bytes(comb.cls)
        strides = row_major_strides(res_map.shape) if res_map is not None else ()
        numel = 1
        for extent in res_map.shape if res_map is not None else ():
            numel *= extent
        nbytes = numel * nw * size
        at = ctx.scratch_for_exchange(nbytes)  # (its leading barrier, if one is needed, comes first)
        base = ctx.linear_base(res_map, strides) if res_map is not None else ctx.const("0", "b32")
        slot, wslot, waddr, raddr, writer = (ctx.new("b32"), ctx.new("b32"), ctx.new("b32"), ctx.new("b32"),
                                             ctx.new("pred"))
        ctx.emit(f"and.b32 {slot}, {ctx.warp_coord(dm)}, {nw - 1};")
        ctx.emit(f"mad.lo.u32 {wslot}, {base}, {nw}, {slot};")
        ctx.emit(f"mad.lo.u32 {waddr}, {wslot}, {size}, {ctx.smem_at(at)};")
        ctx.emit(f"mad.lo.u32 {raddr}, {base}, {nw * size}, {ctx.smem_at(at)};")
        ctx.emit(f"setp.eq.u32 {writer}, {ctx.lane_coord(dm)}, 0;")
        for k, p in partial.items():
            ctx.emit(f"@{writer} st.shared.b{8 * size} [{waddr}+{_lin(k, strides) * nw * size}], {p};")
        ctx.exchange_published(at, nbytes)
        for k in keys:
            parts = []
            for w in range(nw):
                d = ctx.new(comb.cls)
                ctx.emit(f"ld.shared.b{8 * size} {d}, [{raddr}+{(_lin(k, strides) * nw + w) * size}];")
                parts.append(d)
            partial[k] = comb.fold(parts)
    out = [comb.from_compute(partial[k]) for k in keys]
    ctx.bind(op.result, out)


# ------------------------------------------------------------------------------------------------- scan


def lower_scan(ctx: KernelContext, op: Operation) -> None:
    src, axis = op.operands[0], op.attrs["axis"]
    t: ScalarType = src.type.scalar  # type: ignore[assignment]
    comb = Combiner(ctx, op.attrs["kind"], t)
    tmap = ctx.tmap(src)
    regs = ctx.get(src)
    dm = tmap.dims[axis]
    # chunks[key][rep] = registers of one run, in order along the axis
    chunks: dict[Key, dict[int, list[tuple[int, int]]]] = {}
    for r, off in enumerate(tmap.reg_offsets):
        rep, s = divmod(off[axis], dm.tile)
        chunks.setdefault(_drop(off, axis), {}).setdefault(rep, []).append((s, r))
    prefix: dict[int, str] = {}  # 1. in the thread: inclusive prefix of each run
    total: dict[tuple[Key, int], str] = {}
    for key, reps in chunks.items():
        for rep, run in reps.items():
            acc = None
            for _, r in sorted(run):
                v = comb.to_compute(regs[r])
                acc = v if acc is None else comb(acc, v)
                prefix[r] = acc
            total[(key, rep)] = acc  # type: ignore[assignment]
    slots = sorted(total)
    lane_excl, warp_total = _scan_lanes(ctx, comb, dm, total, slots)  # 2. across lanes
    warp_excl, block_total = _scan_warps(ctx, comb, tmap, axis, warp_total, slots)  # 3. across warps
    out = []
    for r, off in enumerate(tmap.reg_offsets):
        rep, _ = divmod(off[axis], dm.tile)
        key = _drop(off, axis)
        parts = [block_total[(key, e)] for e in range(rep)]  # 4. earlier repetitions of the tile
        if warp_excl is not None:
            parts.append(warp_excl[(key, rep)])
        if lane_excl is not None:
            parts.append(lane_excl[(key, rep)])
        v = comb(comb.fold(parts), prefix[r]) if parts else prefix[r]
        out.append(comb.from_compute(v))
    ctx.bind(op.result, out)


def _scan_lanes(ctx: KernelContext, comb: Combiner, dm, total: dict, slots: list):  # type: ignore[no-untyped-def]
    """(exclusive lane prefix, warp total) per slot; (None, total) when one lane holds the axis."""
    nl = dm.distinct_lanes
    if nl == 1:
        return None, total
    coord = ctx.new("b32")
    ctx.emit(f"and.b32 {coord}, {ctx.lane_coord(dm)}, {nl - 1};")
    incl = dict(total)
    delta = 1
    while delta < nl:
        ge = ctx.new("pred")
        ctx.emit(f"setp.ge.u32 {ge}, {coord}, {delta};")
        for s in slots:
            y = shfl(ctx, "up", incl[s], comb.cls, delta << dm.lane_shift)
            incl[s] = comb.select(comb(y, incl[s]), incl[s], ge)
        delta *= 2
    first, last_lane = ctx.new("pred"), ctx.new("b32")
    ctx.emit(f"setp.eq.u32 {first}, {coord}, 0;")
    ctx.emit(f"or.b32 {last_lane}, {ctx.lane}, {(nl - 1) << dm.lane_shift};")
    excl, wtotal = {}, {}
    for s in slots:
        prev = shfl(ctx, "up", incl[s], comb.cls, 1 << dm.lane_shift)
        excl[s] = comb.select(comb.identity(), prev, first)
        wtotal[s] = shfl(ctx, "idx", incl[s], comb.cls, last_lane)
    return excl, wtotal


def _scan_warps(ctx: KernelContext, comb: Combiner, tmap, axis: int, wtotal: dict,  # type: ignore[no-untyped-def]
                slots: list):
    """(exclusive warp prefix, block total) per slot; (None, warp total) when one warp holds the axis."""
    dm = tmap.dims[axis]
    nw = dm.distinct_warps
    if nw == 1:
        return None, wtotal
    size = _bytes(comb.cls)
    other_shape = tmap.shape[:axis] + tmap.shape[axis + 1:]
    other_strides = row_major_strides(other_shape)
    strides = other_strides[:axis] + (0,) + other_strides[axis:]
    numel = 1
    for s in other_shape:
        numel *= s
    reps = dm.reps
    nbytes = numel * reps * nw * size
    at = ctx.scratch_for_exchange(nbytes)  # (its leading barrier, if one is needed, comes first)
    base = ctx.linear_base(tmap, strides)
    wc, wslot, waddr, raddr, writer = ctx.new("b32"), ctx.new("b32"), ctx.new("b32"), ctx.new("b32"), ctx.new("pred")
    ctx.emit(f"and.b32 {wc}, {ctx.warp_coord(dm)}, {nw - 1};")
    ctx.emit(f"mad.lo.u32 {wslot}, {base}, {reps * nw}, {wc};")
    ctx.emit(f"mad.lo.u32 {waddr}, {wslot}, {size}, {ctx.smem_at(at)};")
    ctx.emit(f"mad.lo.u32 {raddr}, {base}, {reps * nw * size}, {ctx.smem_at(at)};")
    ctx.emit(f"setp.eq.u32 {writer}, {ctx.lane_coord(dm)}, 0;")

    def offset(key: Key, rep: int, w: int) -> int:
        return ((_lin(key, other_strides) * reps + rep) * nw + w) * size

    for key, rep in slots:
        ctx.emit(f"@{writer} st.shared.b{8 * size} [{waddr}+{offset(key, rep, 0)}], {wtotal[(key, rep)]};")
    ctx.exchange_published(at, nbytes)
    excl, block = {}, {}
    for key, rep in slots:
        parts = []
        for w in range(nw):
            d = ctx.new(comb.cls)
            ctx.emit(f"ld.shared.b{8 * size} {d}, [{raddr}+{offset(key, rep, w)}];")
            parts.append(d)
        acc = comb.identity()
        for w in range(nw - 1):  # the warps before this one
            before = ctx.new("pred")
            ctx.emit(f"setp.gt.u32 {before}, {wc}, {w};")
            acc = comb.select(comb(acc, parts[w]), acc, before)
        excl[(key, rep)] = acc
        block[(key, rep)] = comb.fold(parts)
    return excl, block
