"""mt.dot on tensor cores with `mma.sync.aligned.m16n8k16` (warp-level MMA), and conversions into its operand layouts.

Fragments (PTX ISA "matrix fragments for mma.m16n8k16"; CUTLASS SM80_16x8x16_F32BF16BF16F32_TN). With
g = lane / 4 and t = lane % 4, one warp holds, per instruction:
  A 16 x 16 (row-major, 8 x 16-bit: a0..a7, two per 32-bit register, the lower index in the low half):
      element j at (row g + 8 * ((j >> 1) & 1), col 2 * t + (j & 1) + 8 * (j >> 2))
  B 16 x 8 (k x n, "col": K-adjacent pairs per register, b0..b3):
      element j at (k 2 * t + (j & 1) + 8 * (j >> 1), n g)
  C / D 16 x 8 (f32: c0..c3):  element j at (row g + 8 * (j >> 1), col 2 * t + (j & 1))

The tile layouts (minitriton/ir/mma_layouts.py) put fragment row g + 8 * i of m-block r of warp-row warp_m at tile
row g + 8 * warp_m + 8 * WM * (2 * r + i) (`logical_row`), and fragment column c of n-block b of warp-column warp_n
at tile column c + 8 * warp_n + 8 * WN * b. So the accumulator, A and B fragments are whole registers of the
values' thread maps; which register holds which fragment element is read off the thread map at thread 0 (where
every base coordinate is 0), and tests/test_mma.py checks the result against the fragment maps for every thread.

Operands (`mt.convert_layout` to `#mt.dot_op`): a register renaming when the source layout already puts every
element in the right thread (attention's P = softmax(S) from an accumulator with WN = 1), else through shared
memory: `bar.sync`, the owners store the tile with 16-byte vectors along its contiguous dim (rows padded by 16
bytes so the 8 rows an ldmatrix phase reads hit distinct banks), `bar.sync`, then `ldmatrix.sync.aligned.m8n8.x4`
(x2 for a lone 8-column block of B) reads the fragments — `.trans` when K is not the contiguous dim in shared
memory. ldmatrix: lanes 8q .. 8q + 7 give the addresses of the 8 rows (16 bytes each) of matrix q, which lands
in destination register q: thread `lane` receives row lane / 4, columns 2 * (lane % 4) + {0, 1} (transposed:
rows 2 * (lane % 4) + {0, 1}, column lane / 4).

The dot: for every m-block, n-block and 16-wide K step one `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`
(f16 alike), accumulating in place in fresh registers that start from the accumulator operand's; the result stays
in the mma layout (a loop-carried accumulator never leaves registers), and converts to other layouts through
codegen/layout_moves.py like any blocked tile.

tf32 (f32 operands, input_precision "tf32", kWidth 1): `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`, A 16 x 8
(a0..a3 at (g + 8 * (j & 1), t + 4 * (j >> 1))), B 8 x 8 (b0, b1 at (t + 4 * j, g)); the operands are staged
K-contiguous (ldmatrix transposes 16-bit elements only; a b16 8 x 8 matrix is 8 rows of 4 f32, so lane l still
receives row l / 4, f32 column l % 4) and each element is rounded with `TF32_ROUND` (`cvt.rn.tf32.f32`, to
nearest even, as the interpreter rounds) before the mma: once per element by its owner before it is staged (a
replicated operand, e.g. A of a [16, K] dot on warps [1, 8], is loaded by every warp but rounded once), or per
fragment when the operand needed no shared memory (a register renaming).

Block-structured dots (`mt.dot(..., block_structure=...)`, ir/block_structure.py; the operands arrive masked):
an (m-block, n-block, K step) whose every product meets a zero block is skipped, per warp. Which warps need it
is known at compile time (tile rows and columns are fixed per (warp_m, warp_n)), so each mma.sync runs under a
warp-uniform predicate `(MASK >> warp) & 1` (one prologue predicate per distinct warp set), accumulating in
place from a copy of the accumulator, and the operand fragments (ldmatrix, kPairs loads) that no active mma
of any consumer reads are predicated off the same way. A 4 x 4-block diagonal [64, 64] product on warps [4, 2]
then issues 4 of its 32 mma.sync a warp.
"""
from __future__ import annotations

from minitriton.ir import Operation
from minitriton.ir.block_structure import active, structure_of
from minitriton.ir.layouts import ThreadMap, log2, vector_groups
from minitriton.ir.mma_layouts import k_pairs, tf32_a_column, warps_of
from minitriton.ir.types import ScalarType

from .context import KernelContext
from .layout_moves import bind_renamed, identity, pack

PAD_BYTES = 16  # padding per shared-memory row of a staged operand


# ------------------------------------------------------------------------------------------- fragments


def a_fragment(lane: int, j: int, k_width: int = 2) -> tuple[int, int]:
    """(row, col) in the 16 x 16 A tile of element a_j (0..7) held by `lane`; k_width 1: the 16 x 8 tf32 tile of
    m16n8k8, a_j (0..3)."""
    g, t = lane >> 2, lane & 3
    if k_width == 1:
        return g + 8 * (j & 1), t + 4 * (j >> 1)
    return g + 8 * ((j >> 1) & 1), 2 * t + (j & 1) + 8 * (j >> 2)


def b_fragment(lane: int, j: int, k_width: int = 2) -> tuple[int, int]:
    """(k, n) in the 16 x 8 B tile of element b_j (0..3) held by `lane`; k_width 1: the 8 x 8 tf32 tile, b_j (0, 1)."""
    g, t = lane >> 2, lane & 3
    if k_width == 1:
        return t + 4 * j, g
    return 2 * t + (j & 1) + 8 * (j >> 1), g


def c_fragment(lane: int, j: int) -> tuple[int, int]:
    """(row, col) in the 16 x 8 C / D tile of element c_j (0..3) held by `lane`."""
    g, t = lane >> 2, lane & 3
    return g + 8 * (j >> 1), 2 * t + (j & 1)


def ldmatrix_element(lane: int, half: int, trans: bool) -> tuple[int, int]:
    """(row, col) in an 8 x 8 matrix (rows as stored in shared memory) of the 16-bit value `half` (0 low, 1 high)
    that `lane` receives in the matrix's destination register."""
    if trans:
        return 2 * (lane & 3) + half, lane >> 2
    return lane >> 2, 2 * (lane & 3) + half


def logical_row(frag_row: int, warp_m: int, rep_m: int, wm: int) -> int:
    """The tile row that row `frag_row` (0..15) of m-block `rep_m` of warp-row `warp_m` computes."""
    return frag_row % 8 + 8 * warp_m + 8 * wm * (2 * rep_m + frag_row // 8)


def logical_col(frag_col: int, warp_n: int, rep_n: int, wn: int) -> int:
    """The tile column that column `frag_col` (0..7) of n-block `rep_n` of warp-column `warp_n` computes."""
    return frag_col + 8 * warp_n + 8 * wn * rep_n


def register_index(tmap: ThreadMap) -> dict[tuple[int, ...], int]:
    """Register of each of thread 0's elements (thread 0's base is the origin, so these are the offsets)."""
    return {tmap.element(0, r): r for r in range(tmap.num_regs)}


def a_registers(tmap: ThreadMap, wm: int, rep_m: int, kk: int, k_width: int = 2, pairs: bool = False) -> list[int]:
    """The registers of a dot_op A value holding a0..a7 (tf32: a0..a3) of m-block rep_m, K step kk; `pairs`: the
    layout has kPairs = 1 (fragment K column c is tile column tf32_a_column(c))."""
    index = register_index(tmap)
    out = []
    for j in range(4 * k_width):
        row, col = a_fragment(0, j, k_width)
        out.append(index[(logical_row(row, 0, rep_m, wm), 8 * k_width * kk + (tf32_a_column(col) if pairs else col))])
    return out


def b_registers(tmap: ThreadMap, wn: int, rep_n: int, kk: int, k_width: int = 2, pairs: bool = False) -> list[int]:
    """The registers of a dot_op B value holding b0..b3 (tf32: b0, b1) of n-block rep_n, K step kk (`pairs` as for
    a_registers)."""
    index = register_index(tmap)
    out = []
    for j in range(2 * k_width):
        k, n = b_fragment(0, j, k_width)
        out.append(index[(8 * k_width * kk + (tf32_a_column(k) if pairs else k), logical_col(n, 0, rep_n, wn))])
    return out


def c_registers(tmap: ThreadMap, wm: int, wn: int, rep_m: int, rep_n: int) -> list[int]:
    """The registers of an mma accumulator holding c0..c3 of block (rep_m, rep_n)."""
    index = register_index(tmap)
    out = []
    for j in range(4):
        row, col = c_fragment(0, j)
        out.append(index[(logical_row(row, 0, rep_m, wm), logical_col(col, 0, rep_n, wn))])
    return out


# ------------------------------------------------------------------------------------------- operands


def lower_to_dot_operand(ctx: KernelContext, op: Operation) -> None:
    """mt.convert_layout into `#mt.dot_op`: renaming registers when possible, else shared memory + ldmatrix."""
    if bind_renamed(ctx, op, identity):
        return
    src_v, dst_v = op.operands[0], op.result
    src, dst = ctx.tmap(src_v), ctx.tmap(dst_v)
    regs = ctx.get(src_v)
    enc = dst_v.type.encoding
    op_idx, k_width = enc.get("opIdx"), enc.get("kWidth")
    t: ScalarType = src_v.type.scalar  # type: ignore[assignment]
    if t.bits != 32 // k_width:
        raise ctx.error(f"a kWidth {k_width} operand holds {32 // k_width}-bit elements, got {t}")
    k_dim = 1 if op_idx == 0 else 0
    # ldmatrix transposes 16-bit elements only: tf32 operands are always stored K-contiguous
    contiguous = staging_dim(src, k_dim, t.bytes) if k_width == 2 else k_dim
    rounded = k_width == 1 and dst_v not in _split_operands(ctx)
    if rounded:
        # round each element to tf32 once, as its owner stages it, not in every warp that loads it (a tf32x3 dot
        # splits the whole f32 value in lower_dot instead)
        regs = [_round_tf32(ctx, r) for r in regs]
    need = _fragment_warps(ctx, dst_v, op_idx)
    if k_pairs(enc):
        pitch, base = stage_padded(ctx, regs, src, contiguous, t.bytes, pad=pair_pad(src.shape[k_dim]))
        words = _load_pairs(ctx, dst, enc, pitch, base, need)
        if rounded:  # loaded as staged: tf32 words the mma takes as they are
            for w in words:
                ctx._cache[("tf32_word", w)] = w
        ctx.bind(dst_v, words)
        return
    pitch, base = stage_padded(ctx, regs, src, contiguous, t.bytes)
    trans = contiguous != k_dim
    load = _ldmatrix_a if op_idx == 0 else _ldmatrix_b
    ctx.bind(dst_v, load(ctx, dst, enc, pitch, trans, k_width, base, need))


def pair_pad(k: int) -> int:
    """Padding (elements) of a kPairs operand's K-contiguous rows: a pitch of 8 mod 16 words, so the 8-byte loads of
    a half-warp (rows g .. g + 3, words 2t, 2t + 1) hit 32 distinct banks."""
    return (8 - k) % 16


Warps = frozenset  # warp indices warp_m * WN + warp_n of an mma layout's [WM, WN] grid
Need = dict  # (m- or n-block, K step) -> Warps: the warps that read an operand fragment (None: every warp)


def _mma_activity(ctx: KernelContext, op: Operation) -> dict[tuple[int, int, int], Warps] | None:
    """(m-block, n-block, K step) -> the warps whose mma.sync there can meet a nonzero product of a
    block-structured dot (None for a dense one): fixed at compile time by the tile rows and columns each
    (warp_m, warp_n) computes (`logical_row`, `logical_col`)."""
    structure = structure_of(op.attrs)
    enc = op.result.type.encoding
    if structure is None or enc is None or enc.kind != "mma" or enc.get("version") != 2:
        return None
    key = ("mma_activity", id(op))
    if key not in ctx._cache:
        wm, wn = warps_of(enc)
        a = op.operands[0].type
        step = 8 if a.scalar.name == "f32" else 16  # type: ignore[union-attr]
        (m, k), n = a.shape, op.operands[1].type.shape[1]
        act = {}
        for rep_m in range(m // (16 * wm)):
            for rep_n in range(n // (8 * wn)):
                for kk in range(k // step):
                    ks = range(step * kk, step * (kk + 1))
                    act[(rep_m, rep_n, kk)] = frozenset(
                        w_m * wn + w_n for w_m in range(wm) for w_n in range(wn)
                        if active(structure, [logical_row(r, w_m, rep_m, wm) for r in range(16)], ks,
                                  [logical_col(c, w_n, rep_n, wn) for c in range(8)]))
        ctx._cache[key] = act  # type: ignore[assignment]
    return ctx._cache[key]  # type: ignore[return-value]


def _fragment_warps(ctx: KernelContext, value, op_idx: int) -> Need | None:  # type: ignore[no-untyped-def]
    """For a dot operand consumed only by block-structured mma.sync dots: (m-block for A / n-block for B, K step)
    -> the warps whose active mma reads that fragment; None when some consumer is dense (every fragment, every
    warp)."""
    users_key = ("dot_users",)
    if users_key not in ctx._cache:
        users: dict = {}
        for op in ctx.func.walk():
            if op.name == "mt.dot":
                for v in op.operands[:2]:
                    users.setdefault(v, []).append(op)
        ctx._cache[users_key] = users  # type: ignore[assignment]
    need: Need = {}
    for op in ctx._cache[users_key].get(value, []):  # type: ignore[union-attr]
        act = _mma_activity(ctx, op)
        if act is None:
            return None
        for (rep_m, rep_n, kk), warps in act.items():
            frag = (rep_m if op_idx == 0 else rep_n, kk)
            need[frag] = need.get(frag, frozenset()) | warps
    return need


def _warp_guard(ctx: KernelContext, wm: int, wn: int, warps: Warps) -> str | None:
    """The guard of an instruction that only the warps `warps` of the [WM, WN] grid run: "" for all of them, None
    for none, else "@%p " with %p = (MASK >> (warp % (WM WN))) & 1, computed once in the prologue (warp-uniform,
    as mma.sync and ldmatrix's .aligned require)."""
    total = wm * wn
    if len(warps) == total:
        return ""
    if not warps:
        return None
    mask = sum(1 << w for w in warps)
    index = ctx._pro(("warp_index", total), "b32", f"and.b32 {{d}}, {ctx.warp}, {total - 1};")
    bit = ctx._pro(("warp_bit", total, mask), "b32", f"bfe.u32 {{d}}, {ctx.const(str(mask), 'b32')}, {index}, 1;")
    return "@" + ctx._pro(("warp_pred", total, mask), "pred", f"setp.ne.u32 {{d}}, {bit}, 0;") + " "


def _fragment_guard(ctx: KernelContext, wm: int, wn: int, need: Need | None,
                    frags: list[tuple[int, int]]) -> str | None:
    """The guard of a load of the operand fragments `frags` (see _fragment_warps)."""
    if need is None:
        return ""
    return _warp_guard(ctx, wm, wn, frozenset().union(*(need.get(f, frozenset()) for f in frags)))


def _split_operands(ctx: KernelContext) -> set:  # type: ignore[type-arg]
    """The operand values of the kernel's tf32x3 dots (their elements are staged as full f32 values)."""
    key = ("tf32x3_operands",)
    if key not in ctx._cache:
        ctx._cache[key] = {v for op in ctx.func.walk() if op.name == "mt.dot"  # type: ignore[assignment]
                           and op.attrs.get("input_precision") == "tf32x3" for v in op.operands[:2]}
    return ctx._cache[key]  # type: ignore[return-value]


def store_width(tmap: ThreadMap, dim: int, elem_bytes: int = 2) -> int:
    """Elements per vector store (at most 16 bytes) along `dim` that the registers allow: runs of consecutive
    registers, each starting at a multiple of the width in every thread."""
    for width in (8, 4, 2):
        if width * elem_bytes > 16:
            continue
        try:
            groups = vector_groups(tmap, dim, width)
        except ValueError:
            continue
        dm = tmap.dims[dim]
        base_aligned = dm.tpw * dm.wpc == 1 or dm.spt % width == 0
        if base_aligned and all(tmap.reg_offsets[g[0]][dim] % width == 0 for g in groups):
            return width
    return 1


def staging_dim(tmap: ThreadMap, k_dim: int, elem_bytes: int = 2) -> int:
    """The dim to make contiguous in shared memory: the one the source's registers run along (K on a tie)."""
    other = 1 - k_dim
    return other if store_width(tmap, other, elem_bytes) > store_width(tmap, k_dim, elem_bytes) else k_dim


def stage_padded(ctx: KernelContext, regs: list[str], tmap: ThreadMap, contiguous: int, elem_bytes: int = 2,
                 pad: int | None = None) -> tuple[int, int]:
    """Write a 2-D tile of 16- or 32-bit elements to shared memory with dim `contiguous` contiguous and rows padded
    by 16 bytes (`pad` elements when given); returns (the row pitch in elements, the byte offset of the tile in the
    scratch buffer). Ends with the barrier that makes it readable; a staging right after another exchange writes
    the other scratch region and needs no barrier before its writes (KernelContext.scratch_for_exchange)."""
    rows, cols = tmap.shape[1 - contiguous], tmap.shape[contiguous]
    pitch = cols + (PAD_BYTES // elem_bytes if pad is None else pad)
    strides = [0, 0]
    strides[1 - contiguous], strides[contiguous] = pitch, 1
    nbytes = rows * pitch * elem_bytes
    width = store_width(tmap, contiguous, elem_bytes)
    groups = vector_groups(tmap, contiguous, width) if width > 1 else [[r] for r in range(tmap.num_regs)]
    owner = ctx.owner_pred(tmap)
    base = ctx.scratch_for_exchange(nbytes)
    addr = ctx.smem_addr(tmap, strides, elem_bytes, base)
    store = store_shared_b16 if elem_bytes == 2 else store_shared_b32
    for group in groups:
        off = tmap.reg_offsets[group[0]]
        store(ctx, f"{addr}+{elem_bytes * (off[0] * strides[0] + off[1] * strides[1])}", [regs[r] for r in group],
              owner)
    ctx.exchange_published(base, nbytes)
    return pitch, base


def store_shared_b16(ctx: KernelContext, addr: str, vals: list[str], pred: str | None) -> None:
    """st.shared of 1, 2, 4 or 8 consecutive 16-bit values (pairs packed into 32-bit words)."""
    if len(vals) == 1:
        ctx.emit(f"{_guard(pred)}st.shared.b16 [{addr}], {vals[0]};")
        return
    store_shared_b32(ctx, addr, [pack(ctx, vals[i], vals[i + 1]) for i in range(0, len(vals), 2)], pred)


def store_shared_b32(ctx: KernelContext, addr: str, words: list[str], pred: str | None) -> None:
    """st.shared of 1, 2 or 4 consecutive 32-bit registers."""
    vec = "" if len(words) == 1 else f".v{len(words)}"
    body = words[0] if len(words) == 1 else "{" + ", ".join(words) + "}"
    ctx.emit(f"{_guard(pred)}st.shared{vec}.b32 [{addr}], {body};")


def _guard(pred: str | None) -> str:
    return f"@{pred} " if pred else ""


# f32 -> tf32, to nearest even. sm_90's cvt.rn.tf32.f32 is one SASS instruction (F2FP); cvt.rna.tf32.f32 (ties
# away, the only form sm_80 has) is four (tools/tf32_round_probe.py, H200, 2026-12-02). The interpreter's
# round_tf32 rounds the same way, bit for bit (tests/test_tf32_staging.py, on the PTX simulator and the GPU).
TF32_ROUND = "cvt.rn.tf32.f32"


def emit_tf32_round(ctx: KernelContext, dst: str, src: str) -> None:
    ctx.emit(f"{TF32_ROUND} {dst}, {src};")


def _round_tf32(ctx: KernelContext, r: str) -> str:
    """`r` rounded to tf32 (`TF32_ROUND`, as the interpreter rounds), in a b32 register that `_words_tf32` then
    passes to the mma as is."""
    w = ctx.new("b32")
    emit_tf32_round(ctx, w, r)
    ctx._cache[("tf32_word", w)] = w
    return w


def _unpack(ctx: KernelContext, r: str, k_width: int, guard: str = "") -> list[str]:
    """The elements an ldmatrix register holds: two 16-bit halves (kWidth 2) or one tf32 word (kWidth 1: staged
    already rounded by lower_to_dot_operand, so the mma takes the register as it is)."""
    if k_width == 1:
        ctx._cache[("tf32_word", r)] = r
        return [r]
    lo, hi = ctx.new("b16"), ctx.new("b16")
    ctx.emit(f"{guard}mov.b32 {{{lo}, {hi}}}, {r};")
    ctx._cache[("packed", lo, hi)] = r
    return [lo, hi]


def _lane_address(ctx: KernelContext, pitch: int, elem_bytes: int, row_terms: list[tuple[str, int]],
                  col_terms: list[tuple[str, int]]) -> str:
    """smem + elem_bytes * (pitch * sum(row_terms) + sum(col_terms)), each term (register, multiplier): the per-lane
    part of an ldmatrix address (computed once, in the prologue)."""
    key = ("ldmatrix_addr", pitch, elem_bytes, tuple(row_terms), tuple(col_terms))

    def linear(terms: list[tuple[str, int]], scale: int, acc: str) -> str:
        for reg, mul in terms:
            if mul:
                acc = ctx._pro(("mad", reg, mul * scale, acc), "b32", f"mad.lo.u32 {{d}}, {reg}, {mul * scale}, {acc};")
        return acc

    lin = linear(col_terms, elem_bytes, linear(row_terms, elem_bytes * pitch, ctx.smem))
    return ctx._pro(key, "b32", f"mov.u32 {{d}}, {lin};")


def _lane_bits(ctx: KernelContext) -> tuple[str, str, str]:
    """(r, q & 1, q >> 1) with r = lane % 8 (the row an ldmatrix lane addresses) and q = lane / 8 (its matrix)."""
    lane = ctx.lane
    r = ctx._pro("ldm_r", "b32", f"and.b32 {{d}}, {lane}, 7;")
    qlo = ctx._pro("ldm_qlo", "b32", f"bfe.u32 {{d}}, {lane}, 3, 1;")
    qhi = ctx._pro("ldm_qhi", "b32", f"bfe.u32 {{d}}, {lane}, 4, 1;")
    return r, qlo, qhi


def _warp_coords(ctx: KernelContext, wm: int, wn: int) -> tuple[str, str]:
    """(warp_m, warp_n): the warp's position in warpsPerCTA [WM, WN] (warp_n varies fastest)."""
    warp = ctx.warp
    zero = ctx.const("0", "b32")
    warp_n = zero if wn == 1 else ctx._pro(("warp_n", wn), "b32", f"and.b32 {{d}}, {warp}, {wn - 1};")
    warp_m = zero if wm == 1 else ctx._pro(("warp_m", wm, wn), "b32",
                                           f"bfe.u32 {{d}}, {warp}, {log2(wn)}, {log2(wm)};")
    return warp_m, warp_n


def _ldmatrix(ctx: KernelContext, count: int, trans: bool, addr: str, guard: str = "") -> list[str]:
    dst = [ctx.new("b32") for _ in range(count)]
    ctx.emit(f"{guard}ldmatrix.sync.aligned.m8n8.x{count}{'.trans' if trans else ''}.shared.b16 "
             f"{{{', '.join(dst)}}}, [{addr}];")
    return dst


def _ldmatrix_a(ctx: KernelContext, tmap: ThreadMap, enc, pitch: int, trans: bool,  # type: ignore[no-untyped-def]
                k_width: int, base: int = 0, need: Need | None = None) -> list[str]:
    """A fragments: matrix q of (m-block, K step) covers fragment rows 8 * (q & 1) .. + 7 and K columns
    kb * (q >> 1) .. + kb - 1, kb = 4 * kWidth (16 bytes): registers a0a1, a2a3, a4a5, a6a7 (tf32: a0 .. a3).
    `need` (block-structured consumers): a fragment no warp needs is not loaded, one some warps need is loaded
    by those only."""
    wm, wn = warps_of(enc)
    m, k = tmap.shape
    kb, step, eb = 4 * k_width, 8 * k_width, 4 // k_width
    r, qlo, qhi = _lane_bits(ctx)
    warp_m, _ = _warp_coords(ctx, wm, wn)
    # the lane's matrix row: tile row r + 8 * warp_m + 8 * WM * (q & 1) (m-block 0), K column kb * (q >> 1)
    if trans:  # shared memory holds A^T (rows k): the lane addresses K row kb * (q >> 1) + r at column m
        addr = _lane_address(ctx, pitch, eb, [(r, 1), (qhi, kb)], [(warp_m, 8), (qlo, 8 * wm)])
    else:
        addr = _lane_address(ctx, pitch, eb, [(r, 1), (warp_m, 8), (qlo, 8 * wm)], [(qhi, kb)])
    out = [""] * tmap.num_regs
    for rep_m in range(m // (16 * wm)):
        for kk in range(k // step):
            const = (step * kk * pitch + 16 * wm * rep_m) if trans else (16 * wm * rep_m * pitch + step * kk)
            targets = a_registers(tmap, wm, rep_m, kk, k_width)
            guard = _fragment_guard(ctx, wm, wn, need, [(rep_m, kk)])
            if guard is None:
                _zero_fill(ctx, out, targets, k_width)
                continue
            words = _ldmatrix(ctx, 4, trans, f"{addr}+{base + eb * const}", guard)
            for q, w in enumerate(words):
                for e, reg in enumerate(_unpack(ctx, w, k_width, guard)):
                    out[targets[k_width * q + e]] = reg
    return out


def _zero_fill(ctx: KernelContext, out: list[str], targets: list[int], k_width: int) -> None:
    """Registers of fragments no mma reads (block-structured dots): a zero constant, so the value is complete."""
    zero = ctx.const("0", "b32" if k_width == 1 else "b16")
    for i in targets:
        out[i] = zero


def _ldmatrix_b(ctx: KernelContext, tmap: ThreadMap, enc, pitch: int, trans: bool,  # type: ignore[no-untyped-def]
                k_width: int, base: int = 0, need: Need | None = None) -> list[str]:
    """B fragments: per K step, x4 covers two n-blocks (matrix q: n-block 2p + (q >> 1), K columns
    kb * (q & 1) ..), x2 one n-block (matrices q = 0, 1); registers b0b1, b2b3 of each n-block (tf32: b0, b1).
    `need` as for _ldmatrix_a."""
    wm, wn = warps_of(enc)
    k, n = tmap.shape
    kb, step, eb = 4 * k_width, 8 * k_width, 4 // k_width
    blocks = n // (8 * wn)
    r, qlo, qhi = _lane_bits(ctx)
    _, warp_n = _warp_coords(ctx, wm, wn)
    if trans:  # shared memory holds B (rows k): the lane addresses K row kb * (q & 1) + r at column n
        addr = _lane_address(ctx, pitch, eb, [(r, 1), (qlo, kb)], [(warp_n, 8), (qhi, 8 * wn)])
    else:  # shared memory holds B^T (rows n): the lane addresses n row r + 8 * warp_n + 8 * WN * (q >> 1)
        addr = _lane_address(ctx, pitch, eb, [(r, 1), (warp_n, 8), (qhi, 8 * wn)], [(qlo, kb)])
    out = [""] * tmap.num_regs
    pair = 2 if blocks % 2 == 0 else 1
    for first in range(0, blocks, pair):
        for kk in range(k // step):
            n0 = 8 * wn * first
            const = (step * kk * pitch + n0) if trans else (n0 * pitch + step * kk)
            guard = _fragment_guard(ctx, wm, wn, need, [(first + p, kk) for p in range(pair)])
            if guard is None:
                for p in range(pair):
                    _zero_fill(ctx, out, b_registers(tmap, wn, first + p, kk, k_width), k_width)
                continue
            words = _ldmatrix(ctx, 2 * pair, trans, f"{addr}+{base + eb * const}", guard)
            for q, w in enumerate(words):
                targets = b_registers(tmap, wn, first + (q >> 1), kk, k_width)
                for e, reg in enumerate(_unpack(ctx, w, k_width, guard)):
                    out[targets[k_width * (q & 1) + e]] = reg
    return out


def _load_pairs(ctx: KernelContext, tmap: ThreadMap, enc, pitch: int,  # type: ignore[no-untyped-def]
                base: int, need: Need | None = None) -> list[str]:
    """kPairs fragments from a K-contiguous staging (rows: A's M rows, or B's N columns; `pitch` words): lane
    (g, t) reads tile K columns 8 * kk + 2t, 2t + 1 of its rows with one ld.shared.v2.b32 per row: the A rows
    g + 8 * warp_m + 8 * WM * (2 * rep_m + i) give (a_i, a_i+2), B's column g + 8 * warp_n + 8 * WN * rep_n gives
    (b0, b1). `need` as for _ldmatrix_a."""
    wm, wn = warps_of(enc)
    op_idx = enc.get("opIdx")
    rows, k = (tmap.shape[0], tmap.shape[1]) if op_idx == 0 else (tmap.shape[1], tmap.shape[0])
    lane = ctx.lane
    g = ctx._pro("pair_g", "b32", f"shr.u32 {{d}}, {lane}, 2;")
    t = ctx._pro("pair_t", "b32", f"and.b32 {{d}}, {lane}, 3;")
    warp_m, warp_n = _warp_coords(ctx, wm, wn)
    warp_row = warp_m if op_idx == 0 else warp_n
    addr = _lane_address(ctx, pitch, 4, [(g, 1), (warp_row, 8)], [(t, 2)])
    out = [""] * tmap.num_regs
    for kk in range(k // 8):
        if op_idx == 0:
            for rep_m in range(rows // (16 * wm)):
                targets = a_registers(tmap, wm, rep_m, kk, 1, pairs=True)
                guard = _fragment_guard(ctx, wm, wn, need, [(rep_m, kk)])
                if guard is None:
                    _zero_fill(ctx, out, targets, 1)
                    continue
                for i in range(2):
                    row = 8 * wm * (2 * rep_m + i)
                    lo, hi = _ld_shared_v2(ctx, f"{addr}+{base + 4 * (row * pitch + 8 * kk)}", guard)
                    out[targets[i]], out[targets[i + 2]] = lo, hi
        else:
            for rep_n in range(rows // (8 * wn)):
                targets = b_registers(tmap, wn, rep_n, kk, 1, pairs=True)
                guard = _fragment_guard(ctx, wm, wn, need, [(rep_n, kk)])
                if guard is None:
                    _zero_fill(ctx, out, targets, 1)
                    continue
                lo, hi = _ld_shared_v2(ctx, f"{addr}+{base + 4 * (8 * wn * rep_n * pitch + 8 * kk)}", guard)
                out[targets[0]], out[targets[1]] = lo, hi
    return out


def _ld_shared_v2(ctx: KernelContext, addr: str, guard: str = "") -> tuple[str, str]:
    """Two adjacent 32-bit words, as .b32 registers (what mma.sync takes; f32 instructions accept them too)."""
    lo, hi = ctx.new("b32"), ctx.new("b32")
    ctx.emit(f"{guard}ld.shared.v2.b32 {{{lo}, {hi}}}, [{addr}];")
    return lo, hi


# ------------------------------------------------------------------------------------------------ dot


def lower_dot(ctx: KernelContext, op: Operation) -> None:
    """mt.dot with an `#mt.mma` version 2 result: one mma.sync per (m-block, n-block, K step); three for tf32x3
    (a_lo b_hi, a_hi b_lo, then a_hi b_hi, the small products first)."""
    a_v, b_v, c_v = op.operands
    enc = op.result.type.encoding
    wm, wn = warps_of(enc)
    a_enc = a_v.type.encoding
    k_width, pairs = a_enc.get("kWidth"), k_pairs(a_enc)
    (m, k), n = a_v.type.shape, b_v.type.shape[1]
    t = "tf32" if k_width == 1 else a_v.type.scalar.name  # type: ignore[union-attr]
    shape = "m16n8k8" if k_width == 1 else "m16n8k16"
    split = k_width == 1 and op.attrs.get("input_precision") == "tf32x3"
    a_map, b_map, c_map = ctx.tmap(a_v), ctx.tmap(b_v), ctx.tmap(op.result)
    a_regs, b_regs, c_regs = ctx.get(a_v), ctx.get(b_v), ctx.get(c_v)
    words = _words_split if split else _words_tf32 if k_width == 1 else _words_16
    out = [""] * c_map.num_regs
    a_words: dict[tuple[int, int], list[list[str]]] = {}
    b_words: dict[tuple[int, int], list[list[str]]] = {}
    activity = _mma_activity(ctx, op)
    steps = k // (8 * k_width)
    for rep_m in range(m // (16 * wm)):
        for rep_n in range(n // (8 * wn)):
            c_idx = c_registers(c_map, wm, wn, rep_m, rep_n)
            acc = [c_regs[i] for i in c_idx]
            guards = ([_warp_guard(ctx, wm, wn, activity[(rep_m, rep_n, kk)]) for kk in range(steps)]
                      if activity is not None else [""] * steps)
            if all(g is None for g in guards):  # every product of the block meets a zero block: acc as it is
                for i, reg in zip(c_idx, acc):
                    out[i] = reg
                continue
            chains = _chains(op, steps) if activity is None else 1
            # the block's products accumulate in place in d (chain c: the K steps kk = c mod chains)
            ds = [[ctx.new("f32") for _ in range(4)] for _ in range(chains)]
            accs = [acc] + [[ctx.const("0f00000000", "f32")] * 4] * (chains - 1)
            if any(g != "" for g in guards):  # some steps skipped or predicated: start d as a copy of acc
                for x, y in zip(ds[0], acc):
                    ctx.emit(f"mov.f32 {x}, {y};")
                accs[0] = ds[0]
            for kk in range(steps):
                if guards[kk] is None:
                    continue
                d, acc = ds[kk % chains], accs[kk % chains]
                if (rep_m, kk) not in a_words:
                    a_words[(rep_m, kk)] = words(ctx, [a_regs[i] for i in a_registers(a_map, wm, rep_m, kk, k_width,
                                                                                       pairs)])
                if (rep_n, kk) not in b_words:
                    b_words[(rep_n, kk)] = words(ctx, [b_regs[i] for i in b_registers(b_map, wn, rep_n, kk, k_width,
                                                                                       pairs)])
                terms = ([(1, 0), (0, 1), (0, 0)] if split else [(0, 0)])  # (a part, b part): 0 hi, 1 lo
                for pa, pb in terms:
                    ctx.emit(f"{guards[kk]}mma.sync.aligned.{shape}.row.col.f32.{t}.{t}.f32 {{{', '.join(d)}}}, "
                             f"{{{', '.join(a_words[(rep_m, kk)][pa])}}}, {{{', '.join(b_words[(rep_n, kk)][pb])}}}, "
                             f"{{{', '.join(acc)}}};")
                    acc = d
                accs[kk % chains] = acc
            for i, reg in zip(c_idx, _sum_chains(ctx, accs)):
                out[i] = reg
    ctx.bind(op.result, out)


def _chains(op: Operation, steps: int) -> int:
    """The accumulation chains of a dot's tiles: its `k_chains` attr, at most one per K step."""
    return max(1, min(int(op.attrs.get("k_chains", 1)), steps))


def _sum_chains(ctx: KernelContext, accs: list[list[str]]) -> list[str]:
    """The chains' accumulators added up (chain 0 holds the dot's accumulator operand)."""
    total = accs[0]
    for other in accs[1:]:
        summed = [ctx.new("f32") for _ in range(4)]
        for s, x, y in zip(summed, total, other):
            ctx.emit(f"add.f32 {s}, {x}, {y};")
        total = summed
    return total


def _words_16(ctx: KernelContext, elements: list[str]) -> list[list[str]]:
    """A fragment's 16-bit elements packed in pairs into the 32-bit registers mma.sync takes."""
    return [[pack(ctx, elements[i], elements[i + 1]) for i in range(0, len(elements), 2)]]


def _words_tf32(ctx: KernelContext, elements: list[str]) -> list[list[str]]:
    """A fragment's f32 elements rounded to tf32 (`TF32_ROUND`, as the interpreter rounds); elements
    that went through shared memory were rounded once when staged (`_round_tf32`) and are used as they are (only
    an operand that needed no data movement, a register renaming, is rounded here, per fragment)."""
    out = []
    for e in elements:
        if ("tf32_word", e) in ctx._cache:
            out.append(e)
            continue
        r = ctx.new("b32")
        emit_tf32_round(ctx, r, e)
        out.append(r)
    return [out]


def _words_split(ctx: KernelContext, elements: list[str]) -> list[list[str]]:
    """tf32x3: each f32 element x as hi = x with its low 13 mantissa bits cleared and lo = x - hi (exact in f32),
    which the mma reads as tf32 by ignoring lo's own low 13 bits: x = hi + lo to about 2^-21 relative, so that
    a_hi b_hi + a_hi b_lo + a_lo b_hi carries fp32-level products through tf32 tensor cores. Two instructions an
    element (and.b32, sub.f32); a rounding cvt would add one and make the split no more exact."""
    hi, lo = [], []
    for e in elements:
        h, rest = ctx.new("b32"), ctx.new("b32")  # .b32: what mma takes; sub.f32 accepts bit-size registers
        ctx.emit(f"and.b32 {h}, {e}, 0xFFFFE000;")
        ctx.emit(f"sub.f32 {rest}, {e}, {h};")
        hi.append(h)
        lo.append(rest)
    return [hi, lo]
