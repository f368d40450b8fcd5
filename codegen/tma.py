"""Tensor descriptors on Hopper: TMA copies between global and shared memory, completed through an mbarrier.

A descriptor parameter is the CUtensorMap itself, passed by value (`.param .align 64 .b8 k_param_0[128]`); TMA
takes its *generic* address: `mov.b64 %rd1, k_param_0; cvta.param.u64 %rd2, %rd1;` (the param-space address
fails on the H200 with "misaligned address"). Coordinates are the op's i32 operands, given to TMA innermost first.

mt.descriptor_load (one box, then into the result's registers):

    fence.proxy.async.shared::cta;  bar.sync 0;        every thread is done with the buffer (and its earlier
                                                        generic writes are ordered before TMA's)
    @leader mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], BOX_BYTES;
    @leader cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [smem], [tmap, {x, y}], [bar];
    WAIT: mbarrier.try_wait.parity.shared::cta.b64 %p, [bar], %phase;  @!%p bra WAIT;
    xor.b32 %phase, %phase, 1;                          the next use of the barrier waits for the next phase
    ld.shared.v4.b32 ... (swizzled addresses)          each thread reads the elements its layout gives it

mt.descriptor_store: bar.sync; owners write their elements (swizzled); `fence.proxy.async.shared::cta` (generic
writes visible to the async proxy); bar.sync; the leader issues `cp.async.bulk.tensor.2d.global.shared::cta
.bulk_group`, `cp.async.bulk.commit_group`, `cp.async.bulk.wait_group.read 0` (the buffer is free again once the
leader passes the next bar.sync, which every later user of shared memory issues first; the writes to the tensor
complete in the background, and the kernel's `ret` waits for them: `cp.async.bulk.wait_group 0`). A tile of
several whole boxes goes out in rounds of up to 32 KB of boxes, each box 1024-aligned in the buffer, straight from
the registers of the tile's layout (e.g. a wgmma accumulator), with one TMA store per box.

The leader is thread 0. The box lives at offset 0 of the kernel's shared buffer (`smem`, aligned to 1024 bytes for
128B-swizzled boxes, 128 otherwise), reused by every lowering behind bar.sync. Loads share one mbarrier
(`tma_bar`, initialized once in the prologue with an arrival count of 1) and one phase register: every load
waits for its own completion before the next is issued, and control flow on scalars is uniform, so every thread
flips the phase the same number of times, in loops too.

128B swizzle (when a box row is exactly 128 bytes: TensorDescType.swizzle_bytes): TMA stores the 16-byte chunk j
of the box's 128-byte row r at chunk j ^ (r % 8) of that row (measured on the H200). As a function of the byte
offset o in the box (1024-byte aligned): `swizzle(o) = o ^ ((o >> 3) & 0x70)`. A run of up to 16 aligned bytes
stays contiguous, so threads read and write 16-byte vectors.

The pieces (tensor_map_address, mbarrier_init, arrive_expect_tx, tma_load, wait_phase, tma_store, swizzle,
read_box) take registers and addresses, so the pipelining passes can place buffers and barriers of
their own.

`wgmma_ring_boxes` is the layout contract a TMA-fed ring needs (docs/kernels/gemm.md, v2): the TMA boxes (with the
128B swizzle) that, landing at their offsets of a 1024-aligned slot, lay it out exactly as codegen/wgmma.py's
`operand_offset` (the layout the cp.async ring writes and wgmma reads in place): A in one box of 8 rows x 128
bytes per row group and 128-byte K chunk (A's rows are permuted, 8-row groups stay contiguous), B in one box of
K rows x 128 bytes per column atom. codegen/async_copy.py issues them for TMA-fed rings; the kernel passes
descriptors with these boxes (kernels_src/examples/matmul.py matmul_tma_ring_kernel).
"""
from __future__ import annotations

from typing import Sequence

from minitriton.ir import Operation
from minitriton.ir.layouts import ThreadMap, log2, row_major_strides, vector_groups
from minitriton.ir.types import LayoutAttr, ScalarType, TensorDescType

from .context import KernelContext
from .memory import load_run, pack_word, store_run
from .wgmma import a_tile_row, tile_offset

TENSOR_MAP_BYTES = 128
TENSOR_MAP_ALIGN = 64
SWIZZLE_ATOM_BYTES = 1024  # 8 rows of 128 bytes: the span one 128B-swizzle pattern covers
MAX_VECTOR_BYTES = 16


# ------------------------------------------------------------------------------------------ parameters


def param_declaration(pname: str) -> str:
    return f".param .align {TENSOR_MAP_ALIGN} .b8 {pname}[{TENSOR_MAP_BYTES}]"


def tensor_map_address(ctx: KernelContext, pname: str) -> str:
    """The generic address of a tensor-map parameter (what cp.async.bulk.tensor takes)."""
    param, generic = ctx.new("b64"), ctx.new("b64")
    ctx.emit(f"mov.b64 {param}, {pname};")
    ctx.emit(f"cvta.param.u64 {generic}, {param};")
    return generic


# ------------------------------------------------------------------------------------------- swizzling


def swizzle(offset: int, swizzle_bytes: int) -> int:
    """Where byte `offset` of a box lands in shared memory (relative to a 1024-byte aligned buffer)."""
    if swizzle_bytes == 0:
        return offset
    if swizzle_bytes != 128:
        raise ValueError(f"only the 128B swizzle is supported, got {swizzle_bytes}")
    return offset ^ ((offset >> 3) & 0x70)


def _box_addresses(ctx: KernelContext, tmap: ThreadMap, groups: list[list[int]], shape: tuple[int, ...],
                   elem: int, swizzle_bytes: int, base: str, offsets: list[tuple] | None = None,
                   in_box: tuple[int, ...] | None = None) -> list[str]:
    """For each register group, the address (`%r+imm` text) of its first element in the box at shared `base`
    (`offsets`: each group's element offset in the box, when it is not the register's offset in the tile;
    `in_box`: the thread's coordinates taken modulo these box dims, for a tile of several boxes).

    The swizzle reads bits 7-9 of the offset and changes bits 4-6, so adding a multiple of 1024 commutes with it:
    each group's address is a per-thread prologue register for its offset modulo 1024, plus an immediate."""
    strides = row_major_strides(shape)
    lin = ctx.linear_base(tmap, strides) if in_box is None else _local_linear_base(ctx, tmap, strides, in_box)
    out = []
    for i, g in enumerate(groups):
        off = tmap.reg_offsets[g[0]] if offsets is None else offsets[i]
        const = elem * sum(o * s for o, s in zip(off, strides))
        if swizzle_bytes == 0:
            addr = ctx.in_prologue(("tma_addr", base, lin, elem), "b32", f"mad.lo.u32 {{d}}, {lin}, {elem}, {base};")
            out.append(f"{addr}+{const}")
            continue
        low, high = const % SWIZZLE_ATOM_BYTES, const - const % SWIZZLE_ATOM_BYTES
        off = ctx.in_prologue(("tma_off", lin, elem, low), "b32", f"mad.lo.u32 {{d}}, {lin}, {elem}, {low};")
        bits = ctx.in_prologue(("tma_bits", off), "b32", f"shr.u32 {{d}}, {off}, 3;")
        mask = ctx.in_prologue(("tma_mask", bits), "b32", f"and.b32 {{d}}, {bits}, 112;")
        swz = ctx.in_prologue(("tma_swz", off), "b32", f"xor.b32 {{d}}, {off}, {mask};")
        addr = ctx.in_prologue(("tma_saddr", base, swz), "b32", f"add.u32 {{d}}, {base}, {swz};")
        out.append(f"{addr}+{high}")
    return out


def _local_linear_base(ctx: KernelContext, tmap: ThreadMap, strides: Sequence[int], box: tuple[int, ...]) -> str:
    """sum_d (thread base_d mod box_d) * strides[d] (a prologue register)."""
    acc = ctx.const("0", "b32")
    for dm, stride, n in zip(tmap.dims, strides, box):
        if stride == 0 or dm.size == 1 or dm.tpw * dm.wpc == 1:
            continue
        base = ctx.dim_base(dm)
        if dm.size > n:
            base = ctx.in_prologue(("box_local", base, n), "b32", f"and.b32 {{d}}, {base}, {n - 1};")
        acc = ctx.in_prologue(("box_lin", acc, base, stride), "b32", f"mad.lo.u32 {{d}}, {base}, {stride}, {acc};")
    return acc


def _vector_groups(tmap: ThreadMap, enc: LayoutAttr | None, elem: int) -> list[list[int]]:
    """Registers in runs of consecutive elements along the innermost dim, at most 16 bytes and at least one 32-bit
    word (or single elements), each aligned to its size (so a run never straddles a 16-byte swizzle chunk)."""
    rank = len(tmap.dims)
    width = 1
    if enc is not None and (enc.kind != "blocked" or enc.get("order")[0] == rank - 1):  # e.g. an mma accumulator's
        width = min(tmap.dims[-1].run, MAX_VECTOR_BYTES // elem)                         # column pairs
    while width > 1 and width * elem >= 4:
        try:
            return vector_groups(tmap, rank - 1, width)
        except ValueError:
            width //= 2
    return [[r] for r in range(tmap.num_regs)]


def read_box(ctx: KernelContext, tmap: ThreadMap, enc: LayoutAttr | None, t: ScalarType, shape: tuple[int, ...],
             swizzle_bytes: int, base: str) -> list[str]:
    """Each thread loads the box elements its layout (`tmap`, from encoding `enc`) holds: the box lies row-major at
    shared address `base` (1024-byte aligned when swizzled), as TMA wrote it."""
    groups = _vector_groups(tmap, enc, t.bytes)
    out: list[str] = [""] * tmap.num_regs
    for g, addr in zip(groups, _box_addresses(ctx, tmap, groups, shape, t.bytes, swizzle_bytes, base)):
        for r, v in zip(g, load_run(ctx, t, addr, len(g), None, space="shared")):
            out[r] = v
    return out


# ------------------------------------------------------------------------------------- TMA and mbarriers


def mbarrier_init(bar: str, arrive_count: int, leader: str) -> list[str]:
    """Lines initializing the mbarrier at shared address `bar` (by the leader) and fencing the init; a bar.sync
    must follow before any thread uses it."""
    return [f"@{leader} mbarrier.init.shared::cta.b64 [{bar}], {arrive_count};",
            "fence.mbarrier_init.release.cluster;"]


def arrive_expect_tx(ctx: KernelContext, bar: str, nbytes: int, leader: str) -> None:
    """The leader announces `nbytes` of TMA traffic on `bar` and arrives (the phase completes when they land)."""
    ctx.emit(f"@{leader} mbarrier.arrive.expect_tx.shared::cta.b64 _, [{bar}], {nbytes};")


def tma_load(ctx: KernelContext, dst: str, tensor_map: str, coords: list[str], bar: str, leader: str) -> None:
    """The leader copies the box at `coords` (outermost first) into shared address `dst`, completing on `bar`."""
    c = ", ".join(reversed(coords))
    ctx.emit(f"@{leader} cp.async.bulk.tensor.{len(coords)}d.shared::cluster.global.mbarrier::complete_tx::bytes "
             f"[{dst}], [{tensor_map}, {{{c}}}], [{bar}];")


def wait_phase(ctx: KernelContext, bar: str, phase: str) -> None:
    """Every thread waits until the phase of `bar` with parity `phase` has completed, then flips `phase`."""
    done, loop = ctx.new("pred"), ctx.new_label("tma_wait")
    ctx.label(loop)
    ctx.emit(f"mbarrier.try_wait.parity.shared::cta.b64 {done}, [{bar}], {phase};")
    ctx.emit(f"@!{done} bra {loop};")
    ctx.emit(f"xor.b32 {phase}, {phase}, 1;")


def tma_store(ctx: KernelContext, tensor_map: str, coords: list[str], src: str, leader: str) -> None:
    """The leader copies shared address `src` to the box at `coords` (outermost first); the caller commits the
    bulk group and waits for it."""
    c = ", ".join(reversed(coords))
    ctx.emit(f"@{leader} cp.async.bulk.tensor.{len(coords)}d.global.shared::cta.bulk_group "
             f"[{tensor_map}, {{{c}}}], [{src}];")


# ------------------------------------------------------------------------------- TMA-fed wgmma ring slots


TMA_SWIZZLE_ROW_BYTES = 128
RING_BOX_ROWS = 8  # rows of an A box: one 8-row group of the permuted A (one 128B swizzle atom when K-major)


A_PAIR_ROWS = 64  # the row distance of two 8-row groups of A that land in adjacent swizzle atoms (a_tile_row)


def wgmma_ring_boxes(operand: int, shape: tuple[int, int], num_warps: int, elem: int = 2, rank: int = 2
                     ) -> list[tuple[tuple[int, int], tuple[int, ...], int]]:
    """The TMA boxes that fill a ring slot laid out as wgmma operand `operand` (0 = A, M x K; 1 = B, K x N; 2 = B^T,
    N x K, read K-major; 16-bit
    elements, 128B swizzle, the contiguous extent a multiple of 64 elements): per box ((row, col) of its first
    element in the tile, box shape, byte offset in the slot). Every offset is a multiple of 1024, so TMA's swizzle
    (16-byte chunk j of box row r at j ^ (r % 8)) is the one `operand_offset` applies.

    rank 2: boxes (rows, cols). rank 4 (A only): A viewed as [M / 64, 8, 8, K] (row = 64 q + 8 u + g), boxes
    (2, 1, 8, cols) = the 8-row group at `row` and the one 64 rows below it, which a_tile_row puts in adjacent
    atoms (row groups 8 i + 4 t + w at atom 2 w + i): half the boxes of rank 2 (8 instead of 16 for 128 rows)."""
    if rank == 4 and operand == 0:
        return _paired_a_boxes(shape, num_warps, elem)
    if rank != 2:
        raise ValueError(f"no rank-{rank} TMA ring boxes for operand {operand}")
    rows, cols = shape
    per_row = TMA_SWIZZLE_ROW_BYTES // elem  # elements of one 128-byte row
    if elem != 2 or cols % per_row or (operand == 0 and rows % RING_BOX_ROWS):
        raise ValueError(f"no TMA ring boxes for operand {operand} of shape {shape} ({elem}-byte elements)")
    boxes = []
    if operand == 2:  # B^T [N, K]: per tile of min(N, 256) rows, one [rows, 64] box per 128-byte K chunk
        n_rows = min(rows, 256)
        for row in range(0, rows, n_rows):
            for col in range(0, cols, per_row):
                boxes.append(((row, col), (n_rows, per_row), tile_offset(row // n_rows, 0, col, n_rows, cols, 128)))
        return boxes
    if operand == 0:
        for row in range(0, rows, RING_BOX_ROWS):
            tile, hw_row = a_tile_row(row, num_warps)
            for col in range(0, cols, per_row):
                boxes.append(((row, col), (RING_BOX_ROWS, per_row), tile_offset(tile, hw_row, col, 64, cols, 128)))
        return boxes
    for col in range(0, cols, per_row):  # one column atom of K rows x 128 bytes (MN-major)
        boxes.append(((0, col), (rows, per_row), (col // per_row) * rows * TMA_SWIZZLE_ROW_BYTES))
    return boxes


def _paired_a_boxes(shape: tuple[int, int], num_warps: int, elem: int
                    ) -> list[tuple[tuple[int, int], tuple[int, ...], int]]:
    """wgmma_ring_boxes(0, ..., rank=4): each pair of rank-2 boxes (row, col) and (row + 64, col) whose atoms are
    adjacent in the slot (the second 1024 bytes after the first) as one (2, 1, 8, cols) box."""
    flat = wgmma_ring_boxes(0, shape, num_warps, elem)
    at = {start: dst for start, _, dst in flat}
    paired = []
    for (row, col), (rows, cols), dst in flat:
        if (row // A_PAIR_ROWS) % 2:
            continue
        partner = at.get((row + A_PAIR_ROWS, col))
        if partner is None:
            raise ValueError(f"A of shape {shape} has no row group {A_PAIR_ROWS} rows below row {row}: no rank-4 "
                             "boxes (rows a multiple of 128 needed)")
        if partner != dst + RING_BOX_ROWS * TMA_SWIZZLE_ROW_BYTES:
            raise ValueError(f"A rows {row} and {row + A_PAIR_ROWS} do not land in adjacent atoms of a {shape} "
                             f"slot on {num_warps} warps: no rank-4 boxes")
        paired.append(((row, col), (2, 1, rows, cols), dst))
    return paired



# ------------------------------------------------------------------------------------------ lowerings


TMA_BAR_DECL = ".shared .align 8 .b64 tma_bar;"


def _kernel_barrier(ctx: KernelContext) -> tuple[str, str]:
    """(address, phase register) of the kernel's TMA-load mbarrier, declared and initialized on first use."""
    bar = ctx.in_prologue("tma_bar", "b32", "mov.u32 {d}, tma_bar;")
    phase = ctx.in_prologue("tma_phase", "b32", "mov.u32 {d}, 0;")
    if TMA_BAR_DECL not in ctx.shared_decls:
        ctx.shared_decls.append(TMA_BAR_DECL)
        leader: str = ctx.owner_pred(None)  # type: ignore[assignment]
        ctx.prologue += [f"  {line}" for line in mbarrier_init(bar, 1, leader)]
    return bar, phase


def _box_buffer(ctx: KernelContext, desc: TensorDescType) -> str:
    ctx.need_smem(desc.box_bytes)
    ctx.smem_align = max(ctx.smem_align, SWIZZLE_ATOM_BYTES if desc.swizzle_bytes else 128)
    return ctx.smem


def lower_descriptor_load(ctx: KernelContext, op: Operation) -> None:
    desc: TensorDescType = op.operands[0].type  # type: ignore[assignment]
    tensor_map = ctx.get1(op.operands[0])
    coords = [ctx.get1(v) for v in op.operands[1:]]
    buf = _box_buffer(ctx, desc)
    bar, phase = _kernel_barrier(ctx)
    leader = ctx.owner_pred(None)
    ctx.emit("fence.proxy.async.shared::cta;")
    ctx.barrier()
    arrive_expect_tx(ctx, bar, desc.box_bytes, leader)  # type: ignore[arg-type]
    tma_load(ctx, buf, tensor_map, coords, bar, leader)  # type: ignore[arg-type]
    wait_phase(ctx, bar, phase)
    t = op.result.type
    ctx.bind(op.result, read_box(ctx, ctx.tmap(op.result), t.encoding, desc.element, desc.block_shape,
                                 desc.swizzle_bytes, buf))


def lower_descriptor_store(ctx: KernelContext, op: Operation) -> None:
    """One box, or a tile of whole boxes (each 1024-aligned in the buffer, swizzled as TMA reads it): the owners
    write their elements, then the leader issues one TMA store per box (tma_store; it waits only until shared
    memory was read, so the threads go on while the copy engine writes the tensor). When each register's box does
    not depend on the thread (a wgmma accumulator's: the thread's part of its coordinates stays inside a box), the
    boxes go out in rounds of up to BOX_ROUND_BYTES, else all at once, each thread finding its box from its
    coordinates."""
    desc: TensorDescType = op.operands[0].type  # type: ignore[assignment]
    value = op.operands[-1]
    tmap, enc = ctx.tmap(value), value.type.encoding
    block = tuple(desc.block_shape)
    boxes = box_grid(tuple(value.type.shape), block)
    slot = _aligned(desc.box_bytes) if len(boxes) > 1 else desc.box_bytes
    groups = _vector_groups(tmap, enc, desc.element.bytes)
    _check_disjoint(ctx, tmap, enc)
    if _thread_stays_in_a_box(tmap, block):
        per_round = max(1, min(len(boxes), BOX_ROUND_BYTES // slot))
        rounds = [boxes[i:i + per_round] for i in range(0, len(boxes), per_round)]
    elif len(boxes) * slot <= BOX_ROUND_BYTES:
        rounds = [boxes]
    else:
        raise ctx.error(f"a tile of {len(boxes)} [{', '.join(map(str, block))}] boxes in layout {enc} needs "
                        f"{len(boxes) * slot} bytes of shared memory at once; store it in smaller tiles")
    runs = _packed_runs(ctx, desc.element, ctx.get(value), groups)
    for round_boxes in rounds:
        _store_round(ctx, op, desc, tmap, groups, runs, boxes, round_boxes, slot)
    ctx.tma_stores_pending = True  # type: ignore[attr-defined]  # the kernel's exit waits for the writes


WORD = ScalarType("ui32")


def _packed_runs(ctx: KernelContext, t: ScalarType, regs: list[str], groups: list[list[int]]
                 ) -> list[tuple[ScalarType, list[str]]]:
    """Each register group as what one st.shared writes: 16- / 8-bit elements packed into 32-bit words up front,
    right after the values were computed (when the tile is a wgmma accumulator, reading it later, between the
    rounds' barriers, makes ptxas serialize the wgmmas: warning C7514)."""
    out = []
    for g in groups:
        vals = [regs[r] for r in g]
        if t.bytes < 4 and len(vals) * t.bytes >= 4:
            per = 4 // t.bytes
            out.append((WORD, [pack_word(ctx, t, vals[i:i + per]) for i in range(0, len(vals), per)]))
        else:
            out.append((t, vals))
    return out


BOX_ROUND_BYTES = 32 * 1024  # the scratch one round of a many-box store fills


def _store_round(ctx: KernelContext, op: Operation, desc: TensorDescType, tmap: ThreadMap, groups: list[list[int]],
                 runs: list[tuple[ScalarType, list[str]]], boxes: list[tuple[int, ...]],
                 round_boxes: list[tuple[int, ...]], slot: int) -> None:
    block = tuple(desc.block_shape)
    tensor_map, coords = ctx.get1(op.operands[0]), [ctx.get1(v) for v in op.operands[1:-1]]
    ctx.need_smem(slot * len(round_boxes))
    ctx.smem_align = max(ctx.smem_align, SWIZZLE_ATOM_BYTES if desc.swizzle_bytes else 128)
    buf = ctx.smem
    ctx.barrier()  # the buffer is free: every earlier user passed it, and the leader waited for the TMA reads
    mine = [i for i, g in enumerate(groups) if len(round_boxes) == len(boxes)
            or _box_of(tmap.reg_offsets[g[0]], block) in round_boxes]
    addrs = _tile_box_addresses(ctx, tmap, [groups[i] for i in mine], boxes, round_boxes, block, desc, slot, buf)
    for i, addr in zip(mine, addrs):
        t, vals = runs[i]
        store_run(ctx, t, addr, vals, ctx.owner_pred(tmap), space="shared")
    ctx.emit("fence.proxy.async.shared::cta;")
    ctx.barrier()
    leader = ctx.owner_pred(None)
    for i, b in enumerate(round_boxes):
        at = [ctx.plus(c, o * n) for c, o, n in zip(coords, b, block)]
        tma_store(ctx, tensor_map, at, ctx.smem_at(i * slot), leader)  # type: ignore[arg-type]
    ctx.emit(f"@{leader} cp.async.bulk.commit_group;")
    ctx.emit(f"@{leader} cp.async.bulk.wait_group.read 0;")


def _aligned(nbytes: int) -> int:
    return -(-nbytes // SWIZZLE_ATOM_BYTES) * SWIZZLE_ATOM_BYTES


def box_grid(shape: tuple[int, ...], block: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The box indices (per dim) a tile of whole blocks covers, row-major."""
    grid: list[tuple[int, ...]] = [()]
    for n, b in zip(shape, block):
        grid = [g + (i,) for g in grid for i in range(n // b)]
    return grid


def _box_of(coords: tuple[int, ...], block: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(c // b for c, b in zip(coords, block))


def _check_disjoint(ctx: KernelContext, tmap: ThreadMap, enc: LayoutAttr | None) -> None:
    """Every element is the thread's base plus the register's offset with no common bits (so box index and offset
    in the box split bitwise between the two); checked element by element."""
    for tid in range(tmap.num_threads):
        base = tmap.base(tid)
        for r in range(tmap.num_regs):
            off = tmap.reg_offsets[r]
            if tmap.element(tid, r) != tuple(b + o for b, o in zip(base, off)) or any(
                    b & o for b, o in zip(base, off)):
                raise ctx.error(f"a tile in layout {enc} cannot be stored register by register into TMA boxes")


def _thread_stays_in_a_box(tmap: ThreadMap, block: tuple[int, ...]) -> bool:
    return all(b < n for tid in range(tmap.num_threads) for b, n in zip(tmap.base(tid), block))


def _tile_box_addresses(ctx: KernelContext, tmap: ThreadMap, groups: list[list[int]], boxes: list[tuple[int, ...]],
                        round_boxes: list[tuple[int, ...]], block: tuple[int, ...], desc: TensorDescType, slot: int,
                        buf: str) -> list[str]:
    """For each register group, its address among the round's boxes (box i of the round at buf + i * slot): the
    box and the offset in it are the thread's part plus the register's (disjoint bits: see _check_disjoint)."""
    elem = desc.element.bytes
    grid = [max(b[d] for b in boxes) + 1 for d in range(len(block))]
    if len(round_boxes) == len(boxes):  # one round: the thread's box index counts too
        thread_box = ctx.const("0", "b32")
        box_strides = row_major_strides(tuple(grid))
        for d, dm in enumerate(tmap.dims):
            if box_strides[d] and dm.tpw * dm.wpc > 1 and dm.size > block[d]:
                part = ctx.in_prologue(("tma_box_part", d, block[d], box_strides[d] * slot), "b32",
                                       f"shr.u32 {{d}}, {ctx.dim_base(dm)}, {log2(block[d])};")
                thread_box = ctx.in_prologue(("tma_box_sum", thread_box, part, box_strides[d] * slot), "b32",
                                             f"mad.lo.u32 {{d}}, {part}, {box_strides[d] * slot}, {thread_box};")
        start = ctx.in_prologue(("tma_box_start", buf, thread_box), "b32", f"add.u32 {{d}}, {buf}, {thread_box};")
        index = {b: sum(i * s for i, s in zip(b, box_strides)) for b in boxes}
    else:
        start, index = buf, {b: i for i, b in enumerate(round_boxes)}
    local = [tuple(o % n for o, n in zip(tmap.reg_offsets[g[0]], block)) for g in groups]
    where = [index[_box_of(tmap.reg_offsets[g[0]], block)] * slot for g in groups]
    addrs = _box_addresses(ctx, tmap, groups, block, elem, desc.swizzle_bytes, start, local, in_box=block)
    return [f"{a.rsplit('+', 1)[0]}+{int(a.rsplit('+', 1)[1]) + w}" for a, w in zip(addrs, where)]
