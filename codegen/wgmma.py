"""mt.dot on Hopper tensor cores: `wgmma.mma_async.sync.aligned.m64nNk16` (warpgroup MMA; B in shared memory, A in
shared memory or in registers).

The dot-lowering pass gives such a dot `mt.local_alloc` operands (`#mt.shared<{swizzle = S, order}>`, K-major) and an
`#mt.mma<{version = 3, warpsPerCTA = [W, 1], instrShape = [16, Ni, 16]}>` result. Here:

Staging. `mt.local_alloc` binds its result to the operand's registers; the dot writes both operands to shared
memory itself, right before the wgmmas, behind the usual barriers (one scratch buffer serves every lowering, so a
tile cannot stay resident across other lowerings; a loop-invariant operand is re-staged per use). Layout in shared
memory, per operand, K-major with an S-byte swizzle (S = 128, 64 or 32; S / 2 K values per row of an atom):
  A: M / 64 tiles of 64 rows (tile T = m-block r of warpgroup wg = r * W / 4 + wg), B: N / Ni tiles of Ni rows
  (B's row n is column n of the K x N operand). A tile is K / (S / 2) chunks of rows x S bytes; a chunk is
  rows / 8 atoms of 8 rows x S bytes (SBO = 8 * S between them); the byte offset of 16-byte piece j of a row is
  then swizzled: offset ^ (((offset >> 7) & (S / 16 - 1)) << 4) (the hardware XORs the same address bits, so the
  buffer is aligned to 1024 bytes and every tile and chunk starts at a multiple of the atom).
  A B whose registers run along N (an accumulator's pairs, a row-major [K, N] load) is staged MN-major instead
  (`b_mn_swizzle`): the layout of an MN-major ring slot below, in 4- to 16-byte vectors rather than one 16-bit
  store per element, read with imm-trans-b = 1. The `#mt.shared` encoding still says K-major: how a staged
  operand is laid out is this lowering's private choice (nothing else reads the scratch).
  A's rows are permuted (minitriton/ir/mma_layouts.py): tile row R goes to tile T, hardware row 16 * w + 8 * i + g
  of warpgroup wg, for R = g + 8 * (4 * wg + w) + 8 * W * (i + 2 * r) — so D's fragment lands in the registers
  the blocked-equivalent accumulator layout assigns.
  The offset of an element is GF(2)-linear in the bits of its coordinates (every field is a power of two, the
  swizzle is an XOR), so a store address is smem + (f(thread's base) ^ f(register offset)): f(base) once per
  thread in the prologue, one xor + add per vector (16 bytes along K when the registers run along K).
Sync. `bar.sync`; the owners store; `fence.proxy.async.shared::cta` (the generic-proxy stores must be visible to
the async proxy the wgmma reads through); `bar.sync`; the accumulator copied into fresh registers;
`wgmma.fence.sync.aligned`; for every m-block, n-block and K step of 16 one
`wgmma.mma_async.sync.aligned.m64n{Ni}k16.f32.bf16.bf16 {d}, desc_a, desc_b, 1, 1, 1, 0, 0` (scale-d 1: D += A B);
`wgmma.commit_group.sync.aligned`; `wgmma.wait_group.sync.aligned 0`.
A in registers (`#mt.dot_op<{opIdx = 0, parent = #mt.mma<{version = 3, ..}>, kWidth = 2}>`, dot-lowering's choice
when A is an accumulator-layout tile: an earlier dot's result or a recurrent state): per m-block and K step the
thread's four words of the m16n8k16 A fragment (codegen/mma.py `a_registers`, with the same row permutation),
packed before the wgmma.fence, passed as `{a0, a1, a2, a3}` in place of A's descriptor (that form has no
trans-a). Only B is staged then.
Descriptors (hopper_ptx.md 2.4): `make_descriptor`: start address >> 4 in bits 0-13, LBO 1 (unused when K-major
swizzled), SBO = 8 * S >> 4 in bits 32-45, swizzle mode in bits 62-63 (1 = 128B, 2 = 64B, 3 = 32B). Stepping K by
16 inside a swizzle row adds 32 bytes to the start address (the hardware applies the swizzle to the address).
Ring slots (passes/pipeline.py, `mt.ring_slot`): a slot whose `#mt.shared` encoding has `operand = 0 | 1` is laid
out as the wgmma operand by the cp.async copies themselves (codegen/async_copy.py, `operand_offset`), so the dot
reads it in place: no staging, no barrier of its own (the ring's mt.async_wait published it, with the proxy fence).
  A (operand 0, M x K, K contiguous): exactly the staged A layout above (K-major, rows permuted).
  B^T (operand 2, the slot holds B transposed: N x K, K contiguous; the dot's B is `mt.trans` of it): exactly the
  staged K-major B layout above (tiles of min(N, 256) rows), read with imm-trans-b = 0.
  B (operand 1, K x N, N contiguous): MN-major, S-byte swizzle: N / (S / 2) column atoms of K rows x S bytes, LBO
  = K * S bytes apart (the next S / 2 columns), k-rows S bytes apart, 8-row groups SBO = 8 * S apart (CuTe's
  canonical ((T, S/16, m), (8, k)) : ((1, T, LBO), (S/16 T, SBO)) in 16-byte units); byte offset of (k, n):
  swizzled((n // (S/2)) * K * S + k * S + (n % (S/2)) * 2). The wgmma takes it with imm-trans-b = 1; K step kk
  starts 16 * kk * S bytes in, n-block nb at (nb * Ni / (S/2)) * K * S.
Asynchronous dots: an mt.dot with attr `async_groups = G` ends with `wgmma.wait_group G` instead of 0, then
`bar.sync` (every warpgroup's older groups retired: the ring slots they read may be rewritten; its result is in
flight; the pass puts an `mt.dot_wait {pending = 0}` (`wgmma.wait_group 0`) before anything reads it). Its
accumulator is updated in place (d = c's registers: no mov may touch registers a wgmma in flight owns). With attr
`deferred_wait` as well it ends at the commit: the pass's `mt.dot_wait {pending = 1}` comes later, and no barrier
(the pipeline refills a slot two iterations old, freed by the loop's top barrier).
Accumulator fragment of m64nNk16 (`d_fragment`): thread (warp w of the warpgroup, lane = 4 g + t) holds N / 2 f32,
register j at row 16 w + 8 ((j >> 1) & 1) + g, column 8 (j >> 2) + 2 t + (j & 1).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from minitriton.ir import Operation, Value
from minitriton.ir.layouts import ThreadMap, log2
from minitriton.ir.types import LayoutAttr

from .context import KernelContext
from .layout_moves import possible_bits
from .mma import _words_16, a_registers, register_index, staging_dim, store_shared_b16, store_width

SWIZZLE_MODE = {128: 1, 64: 2, 32: 3}
WARPGROUP_WARPS = 4
ALIGN = 1024  # the 128B swizzle's atom; also a multiple of the smaller ones

Offset = Callable[[int, int], int]


# ------------------------------------------------------------------------------------------- pure maps


def make_descriptor_mn(addr: int, swizzle: int, k_extent: int) -> int:
    """The descriptor of an MN-major, `swizzle`-byte swizzled operand (column atoms of k_extent rows x swizzle
    bytes): LBO = k_extent * swizzle (next column atom), SBO = 8 * swizzle (next 8 k-rows)."""
    return (((addr & 0x3FFFF) >> 4) | (((k_extent * swizzle) >> 4) << 16) | (((8 * swizzle) >> 4) << 32)
            | (SWIZZLE_MODE[swizzle] << 62))


def operand_offset(operand: int, shape: tuple[int, ...], swizzle: int, num_warps: int) -> Offset:
    """Byte offset of element (row, col) in a ring slot laid out as wgmma operand `operand` (module docstring)."""
    rows, cols = shape[0], shape[1]
    if operand == 2:  # B^T [N, K]: the staged K-major B layout (tiles of min(N, 256) rows)
        n_rows = min(rows, 256)

        def bt_offset(n: int, k: int) -> int:
            return tile_offset(n // n_rows, n % n_rows, k, n_rows, cols, swizzle)
        return bt_offset
    if operand == 0:
        def a_offset(row: int, k: int) -> int:
            tile, hw_row = a_tile_row(row, num_warps)
            return tile_offset(tile, hw_row, k, 64, cols, swizzle)
        return a_offset
    atom = swizzle // 2

    def b_offset(k: int, n: int) -> int:
        return swizzled((n // atom) * rows * swizzle + k * swizzle + (n % atom) * 2, swizzle)
    return b_offset


def make_descriptor(addr: int, swizzle: int) -> int:
    """The 64-bit wgmma matrix descriptor of a K-major, `swizzle`-byte swizzled operand at shared address `addr`."""
    return (((addr & 0x3FFFF) >> 4) | (1 << 16) | (((8 * swizzle) >> 4) << 32) | (SWIZZLE_MODE[swizzle] << 62))


def swizzled(offset: int, swizzle: int) -> int:
    """Where byte `offset` (from an atom-aligned base) of an unswizzled row-major layout of `swizzle`-byte rows goes."""
    return offset ^ (((offset >> 7) & (swizzle // 16 - 1)) << 4)


def d_fragment(thread: int, j: int) -> tuple[int, int]:
    """(row, col) in a warpgroup's 64 x N accumulator of register j of `thread` (0..127)."""
    warp, lane = thread >> 5, thread & 31
    g, t = lane >> 2, lane & 3
    return 16 * warp + 8 * ((j >> 1) & 1) + g, 8 * (j >> 2) + 2 * t + (j & 1)


def logical_row(hw_row: int, warpgroup: int, rep: int, num_warps: int) -> int:
    """The tile row that hardware row `hw_row` (0..63) of m-block `rep` of `warpgroup` computes."""
    w, i, g = hw_row >> 4, (hw_row >> 3) & 1, hw_row & 7
    return g + 8 * (WARPGROUP_WARPS * warpgroup + w) + 8 * num_warps * (i + 2 * rep)


def a_tile_row(row: int, num_warps: int) -> tuple[int, int]:
    """(A tile, hardware row) that tile row `row` is staged at: the inverse of `logical_row`."""
    g, warp = row & 7, (row >> 3) % num_warps
    rest = row // (8 * num_warps)
    i, rep = rest & 1, rest >> 1
    tile = rep * (num_warps // WARPGROUP_WARPS) + warp // WARPGROUP_WARPS
    return tile, 16 * (warp % WARPGROUP_WARPS) + 8 * i + g


def tile_offset(tile: int, row: int, k: int, rows: int, k_extent: int, swizzle: int) -> int:
    """Byte offset of element (row, k) of `tile` (tiles of `rows` x `k_extent` 16-bit values, K-major, swizzled)."""
    per_row = swizzle // 2
    off = tile * rows * k_extent * 2 + (k // per_row) * rows * swizzle + row * swizzle + (k % per_row) * 2
    return swizzled(off, swizzle)


def descriptor_offset(tile: int, kk: int, rows: int, k_extent: int, swizzle: int) -> int:
    """Byte offset (unswizzled: the hardware swizzles) of the start of K step kk (16 wide) of `tile`."""
    per_row = swizzle // 2
    return tile * rows * k_extent * 2 + (16 * kk // per_row) * rows * swizzle + (16 * kk % per_row) * 2


def d_registers(tmap: ThreadMap, num_warps: int, n_instr: int, rep: int, nb: int) -> list[int]:
    """The registers of an mma version 3 accumulator that hold d_0 .. d_{n_instr / 2 - 1} of the wgmma for m-block
    `rep`, n-block `nb` (read off thread 0, whose base is the origin)."""
    index = register_index(tmap)
    out = []
    for j in range(n_instr // 2):
        row, col = d_fragment(0, j)
        out.append(index[(logical_row(row, 0, rep, num_warps), nb * n_instr + col)])
    return out


# -------------------------------------------------------------------------------------------- lowering


def lower_local_alloc(ctx: KernelContext, op: Operation) -> None:
    """The shared copy is written by its consumer (see the module docstring): the value keeps the registers."""
    ctx.bind(op.result, ctx.get(op.operands[0]))


def lower_dot(ctx: KernelContext, op: Operation) -> None:
    """mt.dot with an `#mt.mma` version 3 result (see the module docstring)."""
    a_v, b_v, c_v = op.operands
    enc = op.result.type.encoding
    num_warps = enc.get("warpsPerCTA")[0]
    n_instr = enc.get("instrShape")[1]
    (m, k), n = a_v.type.shape, b_v.type.shape[1]
    t = a_v.type.scalar.name  # type: ignore[union-attr]
    a_slot, b_slot = _slot_of(a_v, 0), _slot_of(b_v, 1)
    a_words = _a_register_words(ctx, a_v, num_warps, m, k)  # A from registers (None: from shared memory)
    stage_a = a_slot is None and a_words is None
    staged = StagedOperands(0, 0, 0)
    if stage_a or b_slot is None:
        staged = _stage_operands(ctx, a_v if stage_a else None, b_v if b_slot is None else None,
                                 num_warps, n_instr)
    c_map = ctx.tmap(op.result)
    c_regs = ctx.get(c_v)
    in_place = "async_groups" in op.attrs  # the accumulator stays in c's registers (nothing may move them)
    # ... except a constant's, which other ops may share (CSE, the register cache): copied before the wgmma issues
    fresh = not in_place or (c_v.defining_op is not None and c_v.defining_op.name == "mt.constant")
    out = [""] * c_map.num_regs
    blocks = []
    for rep in range(m // (16 * num_warps)):
        for nb in range(n // n_instr):
            idx = d_registers(c_map, num_warps, n_instr, rep, nb)
            if not fresh:
                d = [c_regs[i] for i in idx]
            else:
                d = [ctx.new("f32") for _ in idx]
                for reg, i in zip(d, idx):
                    ctx.emit(f"mov.f32 {reg}, {c_regs[i]};")
            blocks.append((rep, nb, idx, d))
    if a_words is None:
        a_desc, a_step = _a_descriptor(ctx, a_v, a_slot, staged, num_warps, k)
    b_desc, b_step, trans_b = _b_descriptor(ctx, b_v, b_slot, staged, n_instr, k)
    ctx.emit("wgmma.fence.sync.aligned;")  # after every write of the accumulators and A's words
    for rep, nb, idx, d in blocks:
        for kk in range(k // 16):
            db = _descriptor(ctx, b_desc, b_step(nb, kk))
            if a_words is None:
                a, trans_a = _descriptor(ctx, a_desc, a_step(rep, kk)), ", 0"
            else:  # the register form has no trans-a (A is K-major in registers)
                a, trans_a = f"{{{', '.join(a_words[(rep, kk)])}}}", ""
            ctx.emit(f"wgmma.mma_async.sync.aligned.m64n{n_instr}k16.f32.{t}.{t} {{{', '.join(d)}}}, {a}, {db}, "
                     f"1, 1, 1{trans_a}, {trans_b};")
        for i, reg in zip(idx, d):
            out[i] = reg
    ctx.emit("wgmma.commit_group.sync.aligned;")
    if op.attrs.get("deferred_wait"):  # an mt.dot_wait follows (the pipeline's copies in between)
        ctx.bind(op.result, out)
        return
    ctx.emit(f"wgmma.wait_group.sync.aligned {int(op.attrs.get('async_groups', 0))};")
    if in_place:
        ctx.barrier()  # every warpgroup's older groups retired: the slots they read may be rewritten
    ctx.bind(op.result, out)


def _a_register_words(ctx: KernelContext, a_v: Value, num_warps: int, m: int, k: int
                      ) -> dict[tuple[int, int], list[str]] | None:
    """A's four 32-bit words per (m-block, K step) when A is in registers (`#mt.dot_op`, version 3 parent): the
    m16n8k16 A fragment of the thread's warp within its warpgroup, packed here, before the wgmma.fence. None when
    A is in shared memory."""
    enc = a_v.type.encoding  # type: ignore[union-attr]
    if enc is None or enc.kind != "dot_op":
        return None
    a_map, regs = ctx.tmap(a_v), ctx.get(a_v)
    return {(rep, kk): _words_16(ctx, [regs[i] for i in a_registers(a_map, num_warps, rep, kk)])[0]
            for rep in range(m // (16 * num_warps)) for kk in range(k // 16)}


def lower_dot_wait(ctx: KernelContext, op: Operation) -> None:
    ctx.emit(f"wgmma.wait_group.sync.aligned {int(op.attrs['pending'])};")


def _slot_of(v: Value, operand: int) -> Value | None:
    """v when it is a ring slot laid out as wgmma operand `operand` (read in place), else None (staged)."""
    op = v.defining_op
    enc = v.type.encoding  # type: ignore[union-attr]
    if op is not None and op.name == "mt.ring_slot" and enc is not None and (
            enc.get("operand") == operand or (operand == 1 and enc.get("operand") == 2)):
        return v
    return None


@dataclass(frozen=True)
class StagedOperands:
    """Where `_stage_operands` put the register operands: A's (and a K-major B's) swizzle, B's offset in the
    scratch, and B's swizzle when B went MN-major (0: K-major)."""
    swizzle: int
    b_base: int
    b_mn_swizzle: int


def b_mn_swizzle(tmap: ThreadMap, n_instr: int) -> int:
    """The swizzle of an MN-major staging of a B operand whose registers run along N (0: stage it K-major).

    A B held with consecutive N elements per thread (an accumulator: pairs along N; a row-major [K, N] load:
    vectors along N) would be stored K-major one 16-bit value at a time; MN-major it is stored in 4- to 16-byte
    vectors, and the wgmma reads it with imm-trans-b = 1 (16-bit types only, which is all this lowering takes).
    The swizzle atom (S / 2 columns) must divide an n-block so that each n-block starts on a column atom."""
    if staging_dim(tmap, 0) != 1 or n_instr < 16:
        return 0
    return min(128, 2 * n_instr)


def _stage_operands(ctx: KernelContext, a_v: Value | None, b_v: Value | None, num_warps: int,
                    n_instr: int) -> StagedOperands:
    """Stage the register operands (those given) into the scratch buffer."""
    v = a_v if a_v is not None else b_v
    assert v is not None
    k = v.type.shape[1] if v is a_v else v.type.shape[0]  # type: ignore[union-attr]
    b_src = _allocated(ctx, b_v) if b_v is not None else None
    b_mn = b_mn_swizzle(ctx.tmap(b_src), n_instr) if b_src is not None else 0
    swizzle = _swizzle_of(ctx, a_v, 1) if a_v is not None else 0
    if b_v is not None and not b_mn:
        b_swizzle = _swizzle_of(ctx, b_v, 0)
        if swizzle and b_swizzle != swizzle:
            raise ctx.error("wgmma operands with different swizzles")
        swizzle = b_swizzle
    m = a_v.type.shape[0] if a_v is not None else 0  # type: ignore[union-attr]
    n = b_v.type.shape[1] if b_v is not None else 0  # type: ignore[union-attr]
    b_base = (m * k * 2 + ALIGN - 1) // ALIGN * ALIGN
    ctx.need_smem(b_base + n * k * 2)
    ctx.smem_align = max(getattr(ctx, "smem_align", 16), ALIGN)

    def a_offset(row: int, kk: int) -> int:
        tile, hw_row = a_tile_row(row, num_warps)
        return tile_offset(tile, hw_row, kk, 64, k, swizzle)

    def b_offset(kk: int, col: int) -> int:
        return tile_offset(col // n_instr, col % n_instr, kk, n_instr, k, swizzle)

    ctx.barrier()
    if a_v is not None:
        _stage(ctx, _allocated(ctx, a_v), a_offset, 0, k_dim=1)
    if b_src is not None:
        if b_mn:
            _stage(ctx, b_src, operand_offset(1, (k, n), b_mn, num_warps), b_base, k_dim=1)
        else:
            _stage(ctx, b_src, b_offset, b_base, k_dim=0)
    ctx.emit("fence.proxy.async.shared::cta;")
    ctx.barrier()
    return StagedOperands(swizzle, b_base, b_mn)


def _slot_descriptor(ctx: KernelContext, addr: str, const: int) -> str:
    """The descriptor of the shared address in register `addr` (in the body: a slot moves every iteration)."""
    masked, wide, desc = ctx.new("b32"), ctx.new("b64"), ctx.new("b64")
    ctx.emit(f"bfe.u32 {masked}, {addr}, 4, 14;")
    ctx.emit(f"cvt.u64.u32 {wide}, {masked};")
    ctx.emit(f"or.b64 {desc}, {wide}, {const:#x};")
    return desc


def _a_descriptor(ctx: KernelContext, a_v: Value, slot: Value | None, staged: StagedOperands, num_warps: int,
                  k: int) -> tuple[str, Callable[[int, int], int]]:
    """A's descriptor (the warpgroup's tile) and the byte offset of (m-block, K step) from it."""
    tile_bytes = 64 * k * 2
    if slot is None:
        swizzle = staged.swizzle
        base = _descriptor_base(ctx, make_descriptor(0, swizzle), num_warps, tile_bytes, 0)
    else:
        swizzle = slot.type.encoding.get("swizzle")  # type: ignore[union-attr]
        addr = ctx.get(slot)[0]
        if num_warps > WARPGROUP_WARPS:
            wg = warpgroup_index(ctx, num_warps)
            moved = ctx.new("b32")
            ctx.emit(f"mad.lo.u32 {moved}, {wg}, {tile_bytes}, {addr};")
            addr = moved
        base = _slot_descriptor(ctx, addr, make_descriptor(0, swizzle))
    per_rep = num_warps // WARPGROUP_WARPS
    return base, lambda rep, kk: descriptor_offset(rep * per_rep, kk, 64, k, swizzle)


def _b_descriptor(ctx: KernelContext, b_v: Value, slot: Value | None, staged: StagedOperands, n_instr: int,
                  k: int) -> tuple[str, Callable[[int, int], int], int]:
    """B's descriptor, the byte offset of (n-block, K step) from it, and imm-trans-b (1: MN-major)."""
    if slot is None and not staged.b_mn_swizzle:
        swizzle = staged.swizzle
        base = _descriptor_base(ctx, make_descriptor(0, swizzle), 0, 0, staged.b_base)
        return base, lambda nb, kk: descriptor_offset(nb, kk, n_instr, k, swizzle), 0
    if slot is not None and slot.type.encoding.get("operand") == 2:  # type: ignore[union-attr]  # B^T: K-major
        swizzle = slot.type.encoding.get("swizzle")  # type: ignore[union-attr]
        base = _slot_descriptor(ctx, ctx.get(slot)[0], make_descriptor(0, swizzle))
        return base, lambda nb, kk: descriptor_offset(nb, kk, n_instr, k, swizzle), 0
    if slot is None:  # staged MN-major: the layout of an MN-major ring slot, at b_base
        swizzle = staged.b_mn_swizzle
        base = _descriptor_base(ctx, make_descriptor_mn(0, swizzle, k), 0, 0, staged.b_base)
    else:
        swizzle = slot.type.encoding.get("swizzle")  # type: ignore[union-attr]
        base = _slot_descriptor(ctx, ctx.get(slot)[0], make_descriptor_mn(0, swizzle, k))
    atom = swizzle // 2
    return base, lambda nb, kk: (nb * n_instr // atom) * k * swizzle + 16 * kk * swizzle, 1


def _allocated(ctx: KernelContext, v: Value) -> Value:
    """The register tile a wgmma operand is a shared copy of."""
    op = v.defining_op
    if op is None or op.name != "mt.local_alloc":
        raise ctx.error(f"wgmma operands come from mt.local_alloc, got {v.type}")
    return op.operands[0]


def _swizzle_of(ctx: KernelContext, v: Value, k_dim: int) -> int:
    enc: LayoutAttr = v.type.encoding  # type: ignore[assignment]
    if enc is None or enc.kind != "shared" or enc.get("order")[0] != k_dim:
        raise ctx.error(f"wgmma operands are staged K-major, got {enc}")
    swizzle = enc.get("swizzle")
    k = v.type.shape[k_dim]
    if swizzle not in SWIZZLE_MODE or (k * 2) % swizzle:
        raise ctx.error(f"a {swizzle}-byte swizzle does not tile a K extent of {k}")
    return swizzle


def _stage(ctx: KernelContext, src: Value, offset: Offset, region: int, k_dim: int) -> None:
    """Owners store the tile's elements at smem + region + offset(row, col), vectors along K where they can."""
    tmap = ctx.tmap(src)
    regs = ctx.get(src)
    width = store_width(tmap, k_dim)
    groups = [list(range(s, s + width)) for s in range(0, tmap.num_regs, width)]
    owner = ctx.owner_pred(tmap)
    base_bits = (possible_bits(tmap, 0), possible_bits(tmap, 1))
    base = _linear(ctx, [ctx.dim_base(tmap.dims[d]) for d in (0, 1)], base_bits, offset)
    start = ctx._pro(("stage_at", ctx.smem, region), "b32", f"add.u32 {{d}}, {ctx.smem}, {region};")
    for group in groups:
        off = tmap.reg_offsets[group[0]]
        if all(base_bits[d] & off[d] == 0 for d in (0, 1)):  # base + off == base ^ off: offset(base) ^ offset(off)
            moved = ctx.new("b32")
            ctx.emit(f"xor.b32 {moved}, {base}, {offset(off[0], off[1])};")
        else:
            moved = offset_of_register(ctx, tmap, off, offset)
        addr = ctx.new("b32")
        ctx.emit(f"add.u32 {addr}, {start}, {moved};")
        store_shared_b16(ctx, addr, [regs[r] for r in group], owner)


def offset_of_register(ctx: KernelContext, tmap: ThreadMap, off: tuple[int, ...], offset: Offset) -> str:
    """offset(the thread's coordinates + a register's offset `off`), computed in the body: the general case, when
    the register offset shares bits with the thread's coordinates (so the XOR shortcut does not apply)."""
    coords = []
    for d in (0, 1):
        c = ctx.new("b32")
        ctx.emit(f"add.u32 {c}, {ctx.dim_base(tmap.dims[d])}, {off[d]};")
        coords.append(c)
    return _linear(ctx, coords, (tmap.shape[0] - 1, tmap.shape[1] - 1), offset, in_body=True)


def _linear(ctx: KernelContext, coords: list[str], bits: tuple[int, int], offset: Offset,
            in_body: bool = False) -> str:
    """offset(coords) for a GF(2)-linear `offset`: the XOR, over the set bits b of each coordinate (within `bits`),
    of offset(2^b along that dim). In the prologue (cached) for thread bases, else in the body."""
    terms = []
    for d in (0, 1):
        for b in range(bits[d].bit_length()):
            if bits[d] >> b & 1:
                unit = offset(1 << b, 0) if d == 0 else offset(0, 1 << b)
                terms.append((coords[d], b, unit))
    if not in_body:
        key = ("linear", tuple(coords), tuple(terms))
        cached = ctx._cache.get(key)
        if cached is not None:
            return cached
    lines, acc = [], None
    for reg, b, unit in terms:
        bit, part = ctx.new("b32"), ctx.new("b32")
        lines.append(f"bfe.u32 {bit}, {reg}, {b}, 1;")
        lines.append(f"mul.lo.u32 {part}, {bit}, {unit};")
        if acc is None:
            acc = part
        else:
            nxt = ctx.new("b32")
            lines.append(f"xor.b32 {nxt}, {acc}, {part};")
            acc = nxt
    if acc is None:
        return ctx.const("0", "b32")
    if in_body:
        for line in lines:
            ctx.emit(line)
        return acc
    ctx.prologue.extend(f"  {line}" for line in lines)
    ctx._cache[key] = acc
    return acc


def _descriptor_base(ctx: KernelContext, const: int, num_warps: int, tile_bytes: int, region: int) -> str:
    """The descriptor of smem + region (+ the warpgroup's A tile when num_warps > 4), in the prologue; `const`: the
    descriptor's address-free bits (make_descriptor / make_descriptor_mn at address 0)."""
    addr = ctx._pro(("stage_at", ctx.smem, region), "b32", f"add.u32 {{d}}, {ctx.smem}, {region};")
    if num_warps > WARPGROUP_WARPS:
        wg = warpgroup_index(ctx, num_warps)
        addr = ctx._pro(("wg_tile", addr, tile_bytes), "b32", f"mad.lo.u32 {{d}}, {wg}, {tile_bytes}, {addr};")
    masked = ctx._pro(("desc_addr", addr), "b32", f"bfe.u32 {{d}}, {addr}, 4, 14;")  # (addr & 0x3FFFF) >> 4
    wide = ctx._pro(("desc_wide", masked), "b64", f"cvt.u64.u32 {{d}}, {masked};")
    return ctx._pro(("desc", wide, const), "b64", f"or.b64 {{d}}, {wide}, {const:#x};")


def warpgroup_index(ctx: KernelContext, num_warps: int) -> str:
    """The thread's warpgroup among the `num_warps` warps of its code: the warp index's bits 2 .. log2(num_warps)
    - 1 (a partition's first warp is a multiple of its warp count, so these are its own warpgroup's bits)."""
    bits = log2(num_warps // WARPGROUP_WARPS)
    return ctx._pro(("warpgroup", bits), "b32", f"bfe.u32 {{d}}, {ctx.warp}, {log2(WARPGROUP_WARPS)}, {bits};")


def _descriptor(ctx: KernelContext, base: str, offset: int) -> str:
    if offset == 0:
        return base
    d = ctx.new("b64")
    ctx.emit(f"add.s64 {d}, {base}, {offset >> 4};")
    return d
