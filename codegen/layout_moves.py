"""Ops that move elements between threads or registers: splat, broadcast, expand_dims, convert_layout, trans,
reshape.

A convert_layout between equivalent layouts (`layouts_equivalent`: every element in the same thread and register,
e.g. a slice whose sliced-away dim had only warps, and the blocked layout without that dim) is a pure rename. The
tiling pass keeps such converts instead of recomputing index math, since they cost nothing here.

Each is "element e of the result is element index(e) of the operand". When every thread already holds, for each
result register, the operand element it needs in one fixed operand register (the same register index in every
thread), the op is free: the result is a list of the operand's register names (`register_permutation`). The
tiling pass arranges this for splat, broadcast, expand_dims and trans. Otherwise the tile goes through shared
memory (`exchange`): `bar.sync`, every owner stores its elements at their linear index, `bar.sync`, every thread
loads the elements it needs. Tiles larger than the shared-memory budget go in several rounds, each handling one
range of linear indices under per-register predicates.
"""
from __future__ import annotations

from typing import Callable, Sequence

from minitriton.ir import Operation
from minitriton.ir.layouts import ThreadMap, layouts_equivalent, linear_index, row_major_strides

from .context import KernelContext
from .registers import CLASS_BYTES, reg_class

Coord = tuple[int, ...]


def register_permutation(src: ThreadMap, dst: ThreadMap, index: Callable[[Coord], Coord]) -> list[int] | None:
    """For each dst register, the src register holding element index(dst element) in every thread; None when some
    thread does not hold it (the elements must then move between threads)."""
    if src.num_warps != dst.num_warps:
        return None
    if index is identity and src == dst:
        return list(range(dst.num_regs))
    perm = []
    holder0 = {src.element(0, r): r for r in range(src.num_regs)}
    for r in range(dst.num_regs):
        got = holder0.get(index(dst.element(0, r)))
        if got is None:
            return None
        perm.append(got)
    for tid in range(1, dst.num_threads):
        sb, db = src.base(tid), dst.base(tid)
        for r, s in enumerate(perm):
            want = index(tuple(b + o for b, o in zip(db, dst.reg_offsets[r])))
            if want != tuple(b + o for b, o in zip(sb, src.reg_offsets[s])):
                return None
    return perm


def identity(c: Coord) -> Coord:
    return c


def elem_bytes_of(cls: str) -> int:
    return 1 if cls == "pred" else CLASS_BYTES[cls]


def _st(ctx: KernelContext, cls: str, addr: str, reg: str, pred: str | None) -> None:
    guard = f"@{pred} " if pred else ""
    if cls == "pred":
        v = ctx.new("b32")
        ctx.emit(f"selp.u32 {v}, 1, 0, {reg};")
        ctx.emit(f"{guard}st.shared.u8 [{addr}], {v};")
    else:
        ctx.emit(f"{guard}st.shared.b{8 * CLASS_BYTES[cls]} [{addr}], {reg};")


def _ld(ctx: KernelContext, cls: str, addr: str, pred: str | None = None, dst: str | None = None) -> str:
    guard = f"@{pred} " if pred else ""
    if cls == "pred":
        v = ctx.new("b32")
        ctx.emit(f"ld.shared.u8 {v}, [{addr}];")
        d = dst or ctx.new("pred")
        ctx.emit(f"{guard}setp.ne.u32 {d}, {v}, 0;")
        return d
    d = dst or ctx.new(cls)
    ctx.emit(f"{guard}ld.shared.b{8 * CLASS_BYTES[cls]} {d}, [{addr}];")
    return d


def _const_index(offsets: Sequence[int], strides: Sequence[int]) -> int:
    return sum(o * s for o, s in zip(offsets, strides))


def exchange(ctx: KernelContext, regs: list[str], src: ThreadMap, src_strides: Sequence[int], dst: ThreadMap,
             dst_strides: Sequence[int], cls: str, numel: int, writer: str | None = None) -> list[str]:
    """Move a tile through shared memory: element e of src goes to linear index sum(e * src_strides); each dst
    register reads linear index sum(e * dst_strides). Owners write (and only where `writer` holds)."""
    size = elem_bytes_of(cls)
    pred = ctx.owner_pred(src)
    if writer is not None:
        pred = _and(ctx, pred, writer)
    if numel * size <= ctx.smem_limit:
        ctx.need_smem(numel * size)
        ctx.barrier()
        waddr = ctx.smem_addr(src, src_strides, size)
        for r, reg in enumerate(regs):
            _st(ctx, cls, f"{waddr}+{_const_index(src.reg_offsets[r], src_strides) * size}", reg, pred)
        ctx.barrier()
        raddr = ctx.smem_addr(dst, dst_strides, size)
        return [_ld(ctx, cls, f"{raddr}+{_const_index(dst.reg_offsets[r], dst_strides) * size}")
                for r in range(dst.num_regs)]
    return _exchange_in_rounds(ctx, regs, src, src_strides, dst, dst_strides, cls, numel, pred)


def _exchange_in_rounds(ctx: KernelContext, regs: list[str], src: ThreadMap, src_strides: Sequence[int],
                        dst: ThreadMap, dst_strides: Sequence[int], cls: str, numel: int,
                        pred: str | None) -> list[str]:
    size = elem_bytes_of(cls)
    chunk = 1 << ((ctx.smem_limit // size).bit_length() - 1)
    shift = chunk.bit_length() - 1
    ctx.need_smem(chunk * size)

    def placed(tmap: ThreadMap, strides: Sequence[int], r: int) -> tuple[str, str]:
        """(linear index >> shift, smem address of linear index % chunk) of register r."""
        lin, hi, lo, addr = ctx.new("b32"), ctx.new("b32"), ctx.new("b32"), ctx.new("b32")
        ctx.emit(f"add.u32 {lin}, {ctx.linear_base(tmap, strides)}, {_const_index(tmap.reg_offsets[r], strides)};")
        ctx.emit(f"shr.u32 {hi}, {lin}, {shift};")
        ctx.emit(f"and.b32 {lo}, {lin}, {chunk - 1};")
        ctx.emit(f"mad.lo.u32 {addr}, {lo}, {size}, {ctx.smem};")
        return hi, addr

    writes = [placed(src, src_strides, r) for r in range(src.num_regs)]
    reads = [placed(dst, dst_strides, r) for r in range(dst.num_regs)]
    out = [ctx.new(cls) for _ in range(dst.num_regs)]
    for c in range(numel // chunk):
        ctx.barrier()
        for reg, (hi, addr) in zip(regs, writes):
            p = ctx.new("pred")
            ctx.emit(f"setp.eq.u32 {p}, {hi}, {c};")
            _st(ctx, cls, addr, reg, _and(ctx, p, pred))
        ctx.barrier()
        for d, (hi, addr) in zip(out, reads):
            p = ctx.new("pred")
            ctx.emit(f"setp.eq.u32 {p}, {hi}, {c};")
            _ld(ctx, cls, addr, p, d)
    return out


def _and(ctx: KernelContext, a: str | None, b: str | None) -> str | None:
    if a is None or b is None:
        return a or b
    d = ctx.new("pred")
    ctx.emit(f"and.pred {d}, {a}, {b};")
    return d


def share_from_owners(ctx: KernelContext, regs: list[str], tmap: ThreadMap | None, cls: str) -> list[str]:
    """Values only the owner of each element computed (atomics), given to every thread that holds the element."""
    if tmap is None:  # a scalar: thread 0 has it
        ctx.need_smem(elem_bytes_of(cls))
        ctx.barrier()
        _st(ctx, cls, ctx.smem, regs[0], ctx.owner_pred(None))
        ctx.barrier()
        return [_ld(ctx, cls, ctx.smem)]
    strides = row_major_strides(tmap.shape)
    numel = 1
    for s in tmap.shape:
        numel *= s
    return exchange(ctx, regs, tmap, strides, tmap, strides, cls, numel)


# ------------------------------------------------------------------------------------------- lowerings


def move(ctx: KernelContext, op: Operation, index: Callable[[Coord], Coord], src_strides: Sequence[int],
         dst_strides: Sequence[int]) -> None:
    """Bind the result of an element-moving op: register renaming when possible, else through shared memory."""
    src_v, dst_v = op.operands[0], op.result
    src, dst = ctx.tmap(src_v), ctx.tmap(dst_v)
    regs = ctx.get(src_v)
    perm = register_permutation(src, dst, index)
    if perm is not None:
        ctx.bind(dst_v, [regs[s] for s in perm])
        return
    numel = 1
    for s in src.shape:
        numel *= s
    cls = reg_class(src_v.type.scalar)
    ctx.bind(dst_v, exchange(ctx, regs, src, src_strides, dst, dst_strides, cls, numel))


def lower_splat(ctx: KernelContext, op: Operation) -> None:
    ctx.bind(op.result, [ctx.get1(op.operands[0])] * ctx.tmap(op.result).num_regs)


def lower_convert_layout(ctx: KernelContext, op: Operation) -> None:
    enc = op.result.type.encoding
    if enc is not None and enc.kind == "dot_op":  # mma.sync operand fragments: ldmatrix (codegen/mma.py)
        from .mma import lower_to_dot_operand

        lower_to_dot_operand(ctx, op)
        return
    src_enc = op.operands[0].type.encoding
    if src_enc is not None and enc is not None and layouts_equivalent(src_enc, enc, op.result.type.shape):
        ctx.bind(op.result, list(ctx.get(op.operands[0])))  # same element in the same register of every thread
        return
    strides = row_major_strides(op.result.type.shape)
    move(ctx, op, identity, strides, strides)


def lower_broadcast(ctx: KernelContext, op: Operation) -> None:
    src_shape = op.operands[0].type.shape
    grown = [s == 1 and d != 1 for s, d in zip(src_shape, op.result.type.shape)]
    strides = row_major_strides(src_shape)
    move(ctx, op, lambda c: tuple(0 if g else x for g, x in zip(grown, c)), strides,
         [0 if g else s for g, s in zip(grown, strides)])


def lower_expand_dims(ctx: KernelContext, op: Operation) -> None:
    axis = op.attrs["axis"]
    strides = list(row_major_strides(op.operands[0].type.shape))
    move(ctx, op, lambda c: c[:axis] + c[axis + 1:], strides, strides[:axis] + [0] + strides[axis:])


def lower_trans(ctx: KernelContext, op: Operation) -> None:
    perm = list(op.attrs["order"])  # result dim i is operand dim perm[i]
    dst_strides = row_major_strides(op.result.type.shape)
    src_strides = [0] * len(perm)
    for i, p in enumerate(perm):
        src_strides[p] = dst_strides[i]
    inverse = [perm.index(d) for d in range(len(perm))]
    move(ctx, op, lambda c: tuple(c[inverse[d]] for d in range(len(perm))), src_strides, dst_strides)


def lower_reshape(ctx: KernelContext, op: Operation) -> None:
    src_shape, dst_shape = op.operands[0].type.shape, op.result.type.shape

    def index(c: Coord) -> Coord:
        lin, out = linear_index(c, dst_shape), []
        for s in reversed(src_shape):
            lin, x = divmod(lin, s)
            out.append(x)
        return tuple(reversed(out))

    move(ctx, op, index, row_major_strides(src_shape), row_major_strides(dst_shape))
