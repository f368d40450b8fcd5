"""Ops that move elements between threads or registers: splat, broadcast, expand_dims, convert_layout, trans,
reshape, extract_slice, concat.

A convert_layout between equivalent layouts (`layouts_equivalent`: every element in the same thread and register,
e.g. a slice whose sliced-away dim had only warps, and the blocked layout without that dim) is a pure rename. The
tiling pass keeps such converts instead of recomputing index math, since they cost nothing here.

Each is "element e of the result is element index(e) of the operand". When every thread already holds, for each
result register, the operand element it needs in one fixed operand register (the same register index in every
thread), the op is free: the result is a list of the operand's register names (`register_permutation`). The
tiling pass arranges this for splat, broadcast, expand_dims and trans. Otherwise the tile goes through shared
memory (`exchange`): `bar.sync`, every owner stores its elements at their linear index, `bar.sync`, every thread
loads the elements it needs, with vector accesses (up to 16 bytes) wherever a thread's registers hold consecutive,
aligned linear indices (`vector_runs`). Back-to-back exchanges alternate between two scratch regions and skip the
leading `bar.sync` (codegen/context.py `scratch_for_exchange`). Tiles larger than the shared-memory budget go in
several rounds, each handling one range of linear indices under per-register predicates.

A 2-D convert_layout (the GEMM epilogue's accumulator -> store layout) takes a cheaper road when both layouts
allow it (`swizzled_exchange`): rows of the tile go through shared memory row-major with 16-byte chunks XOR-
swizzled by the row (chunk ^ (row % 8): the accumulator fragment's 8 rows x 4 threads of 4-byte pairs hit 32
distinct banks, and a row read as 16-byte vectors stays one row), vector st.shared / ld.shared (pairs of 16-bit
values packed into 32-bit words, up to 16 bytes), addresses `smem + (F(thread base) ^ F(register offset))` with F
the GF(2)-linear byte-offset map (one xor + add per vector, the per-thread part once in the prologue), and the
rounds static (blocks of rows that only the register offsets select, so no per-register predicates and no
addresses computed up front).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, Sequence

from minitriton.ir import Operation
from minitriton.ir.layouts import (ThreadMap, identity, layouts_equivalent, linear_index, register_permutation,
                                   registers_in_box, row_major_strides)

from .context import KernelContext
from .registers import CLASS_BYTES, reg_class

Coord = tuple[int, ...]


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
             dst_strides: Sequence[int], cls: str, numel: int, writer: str | None = None,
             read_offset: int = 0, needed: frozenset[int] | None = None) -> list[str]:
    """Move a tile through shared memory: element e of src goes to linear index sum(e * src_strides); each dst
    register reads linear index read_offset + sum(e * dst_strides). Owners write (and only where `writer`
    holds); `needed`: the src registers some reader wants (None: all), the other runs are not written."""
    size = elem_bytes_of(cls)
    pred = ctx.owner_pred(src)
    if writer is not None:
        pred = _and(ctx, pred, writer)
    if numel * size <= ctx.smem_limit:
        base = ctx.scratch_for_exchange(numel * size)
        waddr = ctx.smem_addr(src, src_strides, size, base)
        for run in vector_runs(src, tuple(src_strides), size if cls != "pred" else 0):
            if needed is not None and needed.isdisjoint(run):
                continue
            offset = _const_index(src.reg_offsets[run[0]], src_strides) * size
            _st_vector(ctx, cls, f"{waddr}+{offset}", [regs[r] for r in run], pred)
        ctx.exchange_published(base, numel * size)
        raddr = ctx.smem_addr(dst, dst_strides, size, base)
        out = [""] * dst.num_regs
        for run in vector_runs(dst, tuple(dst_strides), size if cls != "pred" else 0, read_offset):
            offset = (read_offset + _const_index(dst.reg_offsets[run[0]], dst_strides)) * size
            for r, d in zip(run, _ld_vector(ctx, cls, f"{raddr}+{offset}", len(run))):
                out[r] = d
        return out
    return _exchange_in_rounds(ctx, regs, src, src_strides, dst, dst_strides, cls, numel, pred, read_offset)


VECTOR_BYTES = 16  # the widest shared-memory access (ld / st.shared.v4.b32)


@lru_cache(maxsize=1024)
def vector_runs(tmap: ThreadMap, strides: tuple[int, ...], size: int, extra: int = 0) -> list[list[int]]:
    """The thread's registers grouped for vector shared-memory accesses: runs of registers whose elements sit at
    consecutive linear indices (sum(coord * strides) + extra), each run's first index a multiple of its length in
    every thread (so the address is aligned to the vector's bytes), at most VECTOR_BYTES per run, lengths 4, 2 or
    1. size 0 (predicates, stored as bytes through selp) keeps every register on its own. A warp's v4 access to 32
    consecutive 16-byte chunks costs the same shared-memory wavefronts as four scalar ones, in a quarter of the
    instructions: what the MIO queue of a conversion-heavy kernel is short of."""
    lin = [_const_index(o, strides) for o in tmap.reg_offsets]
    bases = {sum(b * s for b, s in zip(tmap.base(t), strides)) + extra for t in range(tmap.num_threads)}
    at = {index: r for r, index in enumerate(lin)}
    runs, done = [], set()
    for r in sorted(range(len(lin)), key=lin.__getitem__):
        if r in done:
            continue
        for width in (4, 2, 1):
            if width * size > VECTOR_BYTES or (width > 1 and size == 0):
                continue
            members = [at.get(lin[r] + i) for i in range(width)]
            if (None not in members and not done.intersection(members)
                    and all((base + lin[r]) % width == 0 for base in bases)):
                break
        runs.append(members)  # type: ignore[arg-type]
        done.update(members)  # type: ignore[arg-type]
    return runs


def _st_vector(ctx: KernelContext, cls: str, addr: str, regs: list[str], pred: str | None) -> None:
    if len(regs) == 1:
        _st(ctx, cls, addr, regs[0], pred)
        return
    guard = f"@{pred} " if pred else ""
    ctx.emit(f"{guard}st.shared.v{len(regs)}.b{8 * CLASS_BYTES[cls]} [{addr}], {{{', '.join(regs)}}};")


def _ld_vector(ctx: KernelContext, cls: str, addr: str, width: int) -> list[str]:
    if width == 1:
        return [_ld(ctx, cls, addr)]
    out = [ctx.new(cls) for _ in range(width)]
    ctx.emit(f"ld.shared.v{width}.b{8 * CLASS_BYTES[cls]} {{{', '.join(out)}}}, [{addr}];")
    return out


def _exchange_in_rounds(ctx: KernelContext, regs: list[str], src: ThreadMap, src_strides: Sequence[int],
                        dst: ThreadMap, dst_strides: Sequence[int], cls: str, numel: int,
                        pred: str | None, read_offset: int = 0) -> list[str]:
    size = elem_bytes_of(cls)
    chunk = 1 << ((ctx.smem_limit // size).bit_length() - 1)
    shift = chunk.bit_length() - 1
    ctx.need_smem(chunk * size)

    def placed(tmap: ThreadMap, strides: Sequence[int], r: int, extra: int = 0) -> tuple[str, str]:
        """(linear index >> shift, smem address of linear index % chunk) of register r."""
        lin, hi, lo, addr = ctx.new("b32"), ctx.new("b32"), ctx.new("b32"), ctx.new("b32")
        const = extra + _const_index(tmap.reg_offsets[r], strides)
        ctx.emit(f"add.u32 {lin}, {ctx.linear_base(tmap, strides)}, {const};")
        ctx.emit(f"shr.u32 {hi}, {lin}, {shift};")
        ctx.emit(f"and.b32 {lo}, {lin}, {chunk - 1};")
        ctx.emit(f"mad.lo.u32 {addr}, {lo}, {size}, {ctx.smem};")
        return hi, addr

    writes = [placed(src, src_strides, r) for r in range(src.num_regs)]
    reads = [placed(dst, dst_strides, r, read_offset) for r in range(dst.num_regs)]
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


def bind_renamed(ctx: KernelContext, op: Operation, index: Callable[[Coord], Coord]) -> bool:
    """Bind op's result to its operand's registers, renamed, when every thread already holds the elements it needs
    (result element e is operand element index(e)); False when elements must move between threads."""
    src_v, dst_v = op.operands[0], op.result
    perm = register_permutation(ctx.tmap(src_v), ctx.tmap(dst_v), index)
    if perm is None:
        return False
    regs = ctx.get(src_v)
    ctx.bind(dst_v, [regs[s] for s in perm])
    return True


def move(ctx: KernelContext, op: Operation, index: Callable[[Coord], Coord], src_strides: Sequence[int],
         dst_strides: Sequence[int], read_offset: int = 0, needed: frozenset[int] | None = None) -> None:
    """Bind the result of an element-moving op: register renaming when possible, else through shared memory
    (writing only the `needed` source registers, when given)."""
    if bind_renamed(ctx, op, index):
        return
    src_v, dst_v = op.operands[0], op.result
    src, dst = ctx.tmap(src_v), ctx.tmap(dst_v)
    regs = ctx.get(src_v)
    numel = 1
    for s in src.shape:
        numel *= s
    cls = reg_class(src_v.type.scalar)
    ctx.bind(dst_v, exchange(ctx, regs, src, src_strides, dst, dst_strides, cls, numel, read_offset=read_offset,
                             needed=needed))


def lower_splat(ctx: KernelContext, op: Operation) -> None:
    ctx.bind(op.result, [ctx.get1(op.operands[0])] * ctx.tmap(op.result).num_regs)


# ------------------------------------------------------------------------------- swizzled 2-D exchange


def vector_width(tmap: ThreadMap, size: int) -> int:
    """Elements per shared-memory vector (at most 16 bytes) along the last dim: runs of consecutive registers with
    consecutive columns, each starting at a multiple of the width in every thread."""
    base_cols = possible_bits(tmap, 1)
    width = 16 // size
    while width > 1:
        if base_cols % width == 0 and tmap.num_regs % width == 0 and all(
                tmap.reg_offsets[s][1] % width == 0
                and all(tmap.reg_offsets[s + i] == (tmap.reg_offsets[s][0], tmap.reg_offsets[s][1] + i)
                        for i in range(width))
                for s in range(0, tmap.num_regs, width)):
            return width
        width //= 2
    return 1


@lru_cache(maxsize=256)
def possible_bits(tmap: ThreadMap, dim: int) -> int:
    """The bits any thread's base coordinate along `dim` may have set."""
    bits = 0
    for tid in range(tmap.num_threads):
        bits |= tmap.base(tid)[dim]
    return bits


def _xor_linear(tmap: ThreadMap, rows_per_round: int) -> bool:
    """Whether base + offset == base ^ offset for every register (no bit of an offset is a possible base bit) and
    the base rows stay inside one round (so only the register offsets pick a register's round)."""
    rows, cols = possible_bits(tmap, 0), possible_bits(tmap, 1)
    return rows < rows_per_round and all(o[0] & rows == 0 and o[1] & cols == 0 for o in tmap.reg_offsets)


def swizzled_offset(row: int, col: int, row_bytes: int, size: int) -> int:
    """Byte offset of (row, col) in the swizzled row-major buffer: 16-byte chunk c of row r at c ^ (r % 8) (or
    % the chunks per row, when fewer). GF(2)-linear in the bits of row and col (power-of-two row_bytes)."""
    swz = min(8, row_bytes // 16)
    return (row * row_bytes + col * size) ^ ((row & (swz - 1)) << 4)


def swizzled_exchange(ctx: KernelContext, regs: list[str], src: ThreadMap, dst: ThreadMap,
                      cls: str) -> list[str] | None:
    """The identity move of a 2-D tile from src to dst through the swizzled buffer (module docstring); None when
    the layouts do not allow it (then `exchange` moves it)."""
    if len(src.shape) != 2 or cls not in ("b16", "b32", "f32") or src.shape != dst.shape:
        return None
    rows, cols = src.shape
    size = CLASS_BYTES[cls]
    row_bytes = cols * size
    if rows & (rows - 1) or cols & (cols - 1) or row_bytes < 16:
        return None
    rows_per_round = rows
    while rows_per_round > 1 and rows_per_round * row_bytes > ctx.smem_limit:
        rows_per_round //= 2
    if rows_per_round * row_bytes > ctx.smem_limit or not (_xor_linear(src, rows_per_round)
                                                           and _xor_linear(dst, rows_per_round)):
        return None
    ctx.need_smem(rows_per_round * row_bytes)
    src_width, dst_width = vector_width(src, size), vector_width(dst, size)
    owner = ctx.owner_pred(src)
    src_base, dst_base = _swizzled_base(ctx, src, row_bytes, size), _swizzled_base(ctx, dst, row_bytes, size)
    out = [""] * dst.num_regs
    for rnd in range(rows // rows_per_round):
        ctx.barrier()
        for s in range(0, src.num_regs, src_width):
            row, col = src.reg_offsets[s]
            if row // rows_per_round == rnd:
                addr = _swizzled_addr(ctx, src_base, swizzled_offset(row % rows_per_round, col, row_bytes, size))
                _store_vector(ctx, cls, addr, regs[s:s + src_width], owner)
        ctx.barrier()
        for s in range(0, dst.num_regs, dst_width):
            row, col = dst.reg_offsets[s]
            if row // rows_per_round == rnd:
                addr = _swizzled_addr(ctx, dst_base, swizzled_offset(row % rows_per_round, col, row_bytes, size))
                out[s:s + dst_width] = _load_vector(ctx, cls, addr, dst_width)
    return out


def _swizzled_base(ctx: KernelContext, tmap: ThreadMap, row_bytes: int, size: int) -> str:
    """F(thread's base) in the prologue: base_row * row_bytes + base_col * size, chunk bits ^ (base_row % 8) << 4."""
    row, col = (ctx.dim_base(dm) for dm in tmap.dims)
    swz = min(8, row_bytes // 16)
    scaled = ctx._pro(("swz_col", col, size), "b32", f"mul.lo.u32 {{d}}, {col}, {size};")
    lin = ctx._pro(("swz_lin", row, scaled, row_bytes), "b32", f"mad.lo.u32 {{d}}, {row}, {row_bytes}, {scaled};")
    low = ctx._pro(("swz_low", row, swz), "b32", f"and.b32 {{d}}, {row}, {swz - 1};")
    shifted = ctx._pro(("swz_shl", low), "b32", f"shl.b32 {{d}}, {low}, 4;")
    return ctx._pro(("swz_base", lin, shifted), "b32", f"xor.b32 {{d}}, {lin}, {shifted};")


def _swizzled_addr(ctx: KernelContext, base: str, offset: int) -> str:
    moved, addr = ctx.new("b32"), ctx.new("b32")
    ctx.emit(f"xor.b32 {moved}, {base}, {offset};")
    ctx.emit(f"add.u32 {addr}, {moved}, {ctx.smem};")
    return addr


def _store_vector(ctx: KernelContext, cls: str, addr: str, vals: list[str], pred: str | None) -> None:
    """st.shared of consecutive elements: 16-bit pairs packed into 32-bit words, 1, 2 or 4 words."""
    if cls == "b16" and len(vals) > 1:
        vals, cls = [pack(ctx, vals[i], vals[i + 1]) for i in range(0, len(vals), 2)], "b32"
    guard = f"@{pred} " if pred else ""
    kind = "b16" if cls == "b16" else "b32"  # bit-size type: f32 registers too (as `exchange` stores them)
    if len(vals) == 1:
        ctx.emit(f"{guard}st.shared.{kind} [{addr}], {vals[0]};")
    else:
        ctx.emit(f"{guard}st.shared.v{len(vals)}.{kind} [{addr}], {{{', '.join(vals)}}};")


def pack(ctx: KernelContext, lo: str, hi: str) -> str:
    """A 32-bit register holding two 16-bit values (lo in the low half): the register they were unpacked from when
    known (ldmatrix results record it under ("packed", lo, hi); written once, so valid wherever they are), else a
    new mov. codegen/mma.py uses it too."""
    known = ctx._cache.get(("packed", lo, hi))
    if known is not None:
        return known
    word = ctx.new("b32")
    ctx.emit(f"mov.b32 {word}, {{{lo}, {hi}}};")
    return word


def _load_vector(ctx: KernelContext, cls: str, addr: str, width: int) -> list[str]:
    """ld.shared of `width` consecutive elements (16-bit pairs loaded as 32-bit words and unpacked)."""
    if cls == "b16" and width > 1:
        words = [ctx.new("b32") for _ in range(width // 2)]
        vec = "" if len(words) == 1 else f".v{len(words)}"
        body = words[0] if len(words) == 1 else "{" + ", ".join(words) + "}"
        ctx.emit(f"ld.shared{vec}.b32 {body}, [{addr}];")
        out = []
        for w in words:
            lo, hi = ctx.new("b16"), ctx.new("b16")
            ctx.emit(f"mov.b32 {{{lo}, {hi}}}, {w};")
            ctx._cache[("packed", lo, hi)] = w  # a store of the pair reuses the word (codegen/mma.py pack)
            out += [lo, hi]
        return out
    vals = [ctx.new(cls) for _ in range(width)]
    body = vals[0] if width == 1 else "{" + ", ".join(vals) + "}"
    ctx.emit(f"ld.shared{'' if width == 1 else f'.v{width}'}.{'b16' if cls == 'b16' else 'b32'} {body}, [{addr}];")
    return vals


# ------------------------------------------------------------------------------------------- lowerings (cont.)


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
    src, dst = ctx.tmap(op.operands[0]), ctx.tmap(op.result)
    if register_permutation(src, dst, identity) is None:
        moved = swizzled_exchange(ctx, ctx.get(op.operands[0]), src, dst, reg_class(op.result.type.scalar))
        if moved is not None:
            ctx.bind(op.result, moved)
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


# ------------------------------------------------------------------------------------ static sub-tiles


def lower_extract_slice(ctx: KernelContext, op: Operation) -> None:
    """A register selection when every thread holds the sub-tile's elements (the tiling pass arranges it where it
    can: layouts.subtile_layout); else the source goes through shared memory and each thread reads its elements
    at the slice's offset."""
    offsets, sizes = tuple(op.attrs["offsets"]), tuple(op.attrs["sizes"])
    src_shape = op.operands[0].type.shape
    strides = row_major_strides(src_shape)
    move(ctx, op, lambda c: tuple(x + o for x, o in zip(c, offsets)), strides, strides,
         read_offset=_const_index(offsets, strides), needed=registers_in_box(ctx.tmap(op.operands[0]), offsets, sizes))


def lower_concat(ctx: KernelContext, op: Operation) -> None:
    """A register assembly when each result register is, in every thread, one fixed register of one piece; else
    every piece's owners write it at its place in the row-major result in shared memory and each thread reads
    the result's elements (one round: the result must fit in shared memory)."""
    axis = op.attrs["axis"]
    pieces = [ctx.tmap(v) for v in op.operands]
    dst = ctx.tmap(op.result)
    regs = [ctx.get(v) for v in op.operands]
    chosen = concat_registers(pieces, dst, axis)
    if chosen is not None:
        ctx.bind(op.result, [regs[i][r] for i, r in chosen])
        return
    shape = op.result.type.shape
    strides = row_major_strides(shape)
    cls = reg_class(op.result.type.scalar)
    size = elem_bytes_of(cls)
    numel = 1
    for s in shape:
        numel *= s
    ctx.need_smem(numel * size)
    ctx.barrier()
    extent = op.operands[0].type.shape[axis]
    for i, (tmap, piece_regs) in enumerate(zip(pieces, regs)):
        waddr = ctx.smem_addr(tmap, strides, size, i * extent * strides[axis] * size)
        pred = ctx.owner_pred(tmap)
        for r, reg in enumerate(piece_regs):
            _st(ctx, cls, f"{waddr}+{_const_index(tmap.reg_offsets[r], strides) * size}", reg, pred)
    ctx.barrier()
    raddr = ctx.smem_addr(dst, strides, size)
    ctx.bind(op.result, [_ld(ctx, cls, f"{raddr}+{_const_index(dst.reg_offsets[r], strides) * size}")
                         for r in range(dst.num_regs)])


def concat_registers(pieces: Sequence[ThreadMap], dst: ThreadMap, axis: int) -> list[tuple[int, int]] | None:
    """For each dst register, (piece, register of that piece) holding its element in every thread; None when some
    thread does not hold it (the pieces must then move through shared memory)."""
    if any(p.num_warps != dst.num_warps for p in pieces):
        return None
    extent = pieces[0].shape[axis]

    def locate(c: Coord) -> tuple[int, Coord]:
        i, x = divmod(c[axis], extent)
        return i, c[:axis] + (x,) + c[axis + 1:]

    holders0 = [{p.element(0, r): r for r in range(p.num_regs)} for p in pieces]
    chosen = []
    for r in range(dst.num_regs):
        i, local = locate(dst.element(0, r))
        got = holders0[i].get(local)
        if got is None:
            return None
        chosen.append((i, got))
    for tid in range(1, dst.num_threads):
        for r, (i, s) in enumerate(chosen):
            j, local = locate(dst.element(tid, r))
            if j != i or pieces[i].element(tid, s) != local:
                return None
    return chosen
