"""FlashKDA: chunked KDA (Kimi Delta Attention) prefill in the MiniTriton DSL, with fla's `chunk_kda` semantics.

`chunk_kda(q, k, v, g, beta, A_log=..., dt_bias=...)` equals fla 0.6.0 `chunk_kda(..., use_qk_l2norm_in_kernel=True,
use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=lb)` (kda_ref.py states the
math). Chunk 64, sub-chunks of 16. Two phases, scheduled independently (docs/kernels/flash_kda.md gives the byte
counts behind the split):

1. `kda_intra_chunk_kernel`, token-parallel, one program per (64-token chunk, head): q/k L2 norm, beta sigmoid, the
   floored gate and its in-chunk cumsum (log2 units), the causal score matrix Aqk and
   L = StrictTril(Diag(beta) K Gamma K^T) as [64, 64] tiles (one gate reference per 16-row sub-chunk), the UT
   inverse (I + L)^-1 (Neumann doubling on the 16x16 diagonal blocks, block merges below), and the WY factors w, u
   plus the gated kg, qg. It writes them once, in bf16. Three forms (INTRA_VARIANT, or chunk_kda's
   intra_variant keyword): "sliced" (`kda_intra_chunk_sliced_kernel`, the default: [16, K] x [K, 64] score rows
   joined with mt.cat), "chunk64" (`kda_intra_chunk_kernel`: whole-chunk score dots, 3/4 of their rows dropped)
   and "sub16" (`kda_intra_chunk_sub16_kernel`: tuples of 16-row tiles), the last two kept for A/B timing, and
   "wg" (`kda_intra_chunk_wg_kernel`: one warpgroup a chunk-head, every product a bf16 wgmma; opt-in, untimed).
2. `kda_recurrence_kernel`, sequential over the chunks of a segment, parallel over (column block, segment, head):
   v_new = u - w S;  o = qg S + Aqk v_new;  S <- Diag(2^G_last) S + kg^T v_new.  The same kernel with
   TRANSITION=True runs the recurrence on the augmented state [M | E] (identity / zero start, u = 0 on the M part) to
   get each segment's affine map S -> M S + E without knowing S.

Context parallelism (kda.md §6): when (sequences x heads x column blocks) cannot fill the SMs and the sequences are
long, each sequence is cut into segments (multiples of 64 tokens, so phase 1 is shared), the maps of all but the last
segment are computed in parallel, `kda_merge_kernel` composes them into every segment's true incoming state, and
phase 2 reruns all segments from those states. `context_parallel=None` decides, True/False forces.

With MINITRITON_INTERPRET=1 the kernels run through the interpreter on CPU tensors (the CI tests).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

import minitriton as mt
from minitriton.runtime.jit import interpreting

RCP_LN2 = 1.4426950408889634  # log2(e): the gate cumsum is kept in log2 units, every decay is an exp2
CHUNK = 64  # tokens per chunk (fla's BT)
SUB = 16  # tokens per sub-chunk (fla's BC); a 16x16 tile is the unit of the intra-chunk matrices
NEUMANN_STEPS = 3  # (I+N)(I+N^2)(I+N^4)(I+N^8) = (I-N)^-1 for a 16x16 nilpotent N: three squarings
L2_EPS = 1e-6
MIN_SEGMENT = 1024  # auto context parallelism never cuts a sequence into segments shorter than this
MAX_SPLITS = 32  # fla's cap on the merge-chain depth (precision of the fp32 composition)
STATE_BLOCK = 64  # state columns per phase-2 program ([K, 64] f32 state tile)
INTRA_WARPS = 8
# Programs of the sliced phase 1 that ptxas must fit on an SM (`.minnctapersm`): 1 leaves it 255 registers at 8
# warps (one program an SM, 28 B of spills at K3); 2 caps it at 128 (1.4 KB of spills at 8 warps, 796 B at 4).
# Timed on an H100 (2026-12-06 19:40 UTC, BENCHMARKS.md): 2 is +34% / +30% on phase 1 at T8192 H12 / T32768 H16
# (the spills and the register cap cost more than a second program's overlap gives), 4 warps +57% / +67%, 16 warps
# +203%. Phase 1 is bound by its shared-memory traffic (layout conversions, mt.cat, dot staging), not occupancy.
INTRA_BLOCKS_PER_SM = 1
# Phase 1: "sliced" (score rows per 16-row sub-chunk, joined with mt.cat; every dot on mma.sync), "chunk64"
# (whole-chunk score dots) or "sub16" (16-row sub-chunk tiles). Measured on the H200 (2026-11-29 22:19 UTC,
# tools/flash_kda_variants.py, phase-1 kernel alone): sliced 2.56 ms, sub16 4.97 ms, chunk64 5.64 ms at B1 T32768
# H16; sliced 0.49 ms, sub16 0.97 ms at B1 T8192 H12 (docs/kernels/flash_kda.md).
INTRA_VARIANT = "sliced"
# The sliced phase 1's gate loaded in a scan-friendly layout (kda_intra_chunk_sliced_kernel SCAN_LAYOUT): at K3 its
# PTX 7062 -> 5920 instructions, ld.shared 327 -> 83, st.shared 430 -> 439, bar.sync 80 -> 81, spills 40 -> 28 B
# (docs/kernels/flash_kda.md). Measured (H100, 2026-12-06, tools/flash_kda_variants.py, same run): phase 1 456.4 ->
# 356.0 us at B1 T8192 H12, 2419.0 -> 1841.5 us at B1 T32768 H16 (-22% / -24%). On.
INTRA_SCAN_LAYOUT = True
# The sliced phase 1 stores w, u and the Aqk rows, and the recurrence its o, from their mma accumulators' layouts
# (the kernels' ACC_STORES) instead of converting each to the coalesced layout through shared memory. Built
# 2026-12-06, not timed.
ACC_STORES = False
# The sliced phase 1's UT inverse as block-structured dots (kda_intra_chunk_sliced_kernel STRUCTURED,
# `mt.dot(..., block_structure=...)`): the tensor-core work and operand loads off its zero 16x16 blocks skipped
# (per warp at K3: mma.sync 576 -> 264-312, ldmatrix 464 -> 308-344). Measured (H100, 2026-12-07 01:2x UTC, same
# run): phase 1 353.4 -> 364.5 us at B1 T8192 H12, 1840.1 -> 1887.0 us at B1 T32768 H16 (+3%): the inverse's
# lines hold ~5% of phase 1's stall samples (tools/ncu_lines.py); its masks and guards cost more than the skipped
# mma.sync saved. Off.
STRUCTURED_SOLVE = False
# The sliced phase 1 prefetches its chunk's k, q and v rows into L1 at the start (kernel PREFETCH): Nsight Compute
# put 25% of its stall samples on those loads' long scoreboard (2026-12-07). Predicted phase 1 -8% to -15%; measured
# (H100, 2026-12-07 08:0x UTC) phase 1 -7.1% at T8192 H12 (353.1 -> 328.1 us), -9.9% at T32768 H16 (1851.7 -> 1668.1).
INTRA_PREFETCH = True
# Accumulation chains of the sliced phase 1's score dots (kernel CHAINS): ncu put ~5% of phase 1's stall samples
# on their fixed-latency waits (one [16, 8] tile a warp, 16 dependent tf32 mma.sync). Predicted phase 1 -2% to -5%
# at 2; measured (H100, 2026-12-07, with INTRA_PREFETCH) -1.0% at T8192 H12 (328.1 -> 324.8 us), -0.5% at T32768 H16
# (1668.1 -> 1659.5): small, the same sign at both shapes.
SCORE_CHAINS = 2
# Measured slower and removed (2026-12-07, H100; docs/kernels/flash_kda.md): the next wave's rows into L2
# (INTRA_PREFETCH_NEXT, +7% over INTRA_PREFETCH) and phase 1 as a persistent grid (INTRA_PERSISTENT, +22%).
INTRA_VARIANTS = ("sliced", "chunk64", "sub16", "wg")
SLICED_MAX_K = 128  # above it "sliced" and "wg" run as "sub16" (intra_variant_for)
# The "wg" phase 1 (kda_intra_chunk_wg_kernel): how many bf16 parts each product's operands get (_split_dot: 1, 2
# or 3), and ptxas's resident-program target.
WG_SCORE_SPLIT = 1
WG_SOLVE_PRECISION = "bf16x1"  # the UT inverse's products (_solve_dot): bf16 operands
WG_WY_SPLIT = 2
WG_BLOCKS_PER_SM = 2
RECURRENCE_WARPS = None  # phase 2: 4 or 8 warps; None: recurrence_warps's choice (4, measured)
# Phase 2's dot operands through carried pointers, so the pipeline pass rings them (kda_recurrence_kernel CARRIED).
# Off: measured slower (H100, 2026-12-07: the recurrence 339.5 against 316.6 us at T8192 H12, +7%). At K3 the output
# recurrence then has cp.async rings 3 deep (124 KB of dynamic shared memory) and 548 B of spills (480 without).
RECURRENCE_CARRIED = False
# Phase 2 prefetches chunk t + 1's operands (w, kg, u, qg, Aqk, decay: ~64 KB at K3) into L1 while chunk t runs
# (kda_recurrence_kernel PREFETCH, one `prefetch.global.L1` per 128-byte line). Measured on the H200 (2026-12-01
# 23:00 UTC, tools/flash_kda_variants.py --prefetch=yes): the recurrence 534.8 -> 502.6 us at B1 T8192 H12, 2586.6 ->
# 2413.6 us at B1 T32768 H16 (-6%), errors unchanged.
RECURRENCE_PREFETCH = True
# Phase 2 with the state held transposed, S^T [BV, K], so that it is the A operand of its products by register
# renaming and never staged through shared memory (kda_recurrence_kernel TRANSPOSED). Off: measured slower on the
# H200 (2026-12-02 19:27 UTC, tools/flash_kda_variants.py --transposed=yes): the recurrence 500.7 -> 540.2 us at B1
# T8192 H12, 2403.7 -> 2586.6 us at B1 T32768 H16 (docs/kernels/flash_kda.md).
RECURRENCE_TRANSPOSED = False
# Phase 2's output pass computes w S and qg S as one [w; qg] S dot (kda_recurrence_kernel FUSED_WQ: the state staged
# once a chunk, not twice). Measured (H100, 2026-12-06, same run): the recurrence 480.2 -> 461.2 us at B1 T8192 H12,
# 2354.6 -> 2187.5 us at B1 T32768 H16 (-4% / -7%). On.
RECURRENCE_FUSED_WQ = True
# The recurrence's [w; qg] S and state-update dots on wgmma (kernel BIG_DOTS "auto") instead of mma.sync: possible
# since dot-lowering counts their staging exactly (2026-12-07). Off: measured +81% (H100, 2026-12-07: the recurrence
# 574.5 against 316.6 us at T8192 H12; each dot stages its operands through shared memory on the serial chain).
RECURRENCE_WGMMA = False
# The bf16x2 state update as two dots on one kg^T operand (kda_recurrence_kernel SPLIT_UPDATE) instead of one dot on
# [kg^T kg^T]: 16 KB less staged through shared memory a chunk and half the kg^T fragment loads. Measured (H100,
# 2026-12-07 11:2x UTC, same run): the recurrence 318.2 -> 281.6 us at B1 T8192 H12, 1520.6 -> 1326.3 us at B1
# T32768 H16 (-11.5% / -12.8%), errors unchanged. On.
RECURRENCE_SPLIT_UPDATE = True
# Phase 2 as a warp-specialized kernel (kda_recurrence_ws_kernel): a TMA producer warpgroup streams each chunk's w,
# kg, qg and Aqk tiles into shared-memory rings while the consumer warpgroups hold the state transposed as wgmma
# register A and read every token tile in place (no staging through registers). Measured (H100, 2026-12-07 15:58
# UTC, tools/flash_kda_ws_ab.py, same inputs): the recurrence 283.3 -> 213.2 us at B1 T8192 H12, 1327.9 -> 676.7 at
# B1 T32768 H16, 1332.1 -> 681.5 at B1 T131072 H4, 1747.4 -> 714.0 at B8 T4096 H32 (-25% to -59%). On.
RECURRENCE_WS = True
WS_STATE_BLOCK = 128  # state columns a warp-specialized program holds (16 rows of S^T a consumer warp: BV // 16 warps)
WS_STAGES = 2  # chunks in flight in the rings (56 KB a stage at K = V = 128)
WS_CONSUMER_REGISTERS = 232  # setmaxnreg of the consumer warpgroups (the producer warpgroup keeps 40)
WS_PRODUCER_REGISTERS = 40
# The automatic context-parallel split counts the WS recurrence's programs (WS_STATE_BLOCK columns each: half as many
# a head as the mma.sync kernel's, so about twice the segments); False: that kernel's count. Same run: the whole
# call 586.9 -> 603.9 us at T8192 H12 (the merge's longer chain: 34.4 -> 60.7), 2538.7 -> 2411.4 at T32768 H16,
# 2554.5 both at T131072 H4. On.
WS_CP_PROGRAMS = True
# The merge asks each next map into L1 while composing the current one (kda_merge_kernel PREFETCH). Built
# 2026-12-07 (16:4x UTC), not timed: off. The merge is one chain a (sequence, head, column block): 259 us for 31 steps
# at B1 T131072 H4 on 8 programs (H100), ~8 us a step for 2 x 3 tf32 [64, 128] x [128, 64] products.
MERGE_PREFETCH = False
MERGE_WARPS = 8  # kda_merge_kernel: at 4 warps it spills 2.4 KB (8 warps: 0.1 KB); it runs once per CP call
# The merge's [K, K] x [K, BV] compositions: "ieee" (CUDA-core FMAs; 69.8 us at B1 T8192 H12 for 24 programs of 4
# serial steps, 2026-12-02) or "tf32x3" (tensor cores at ~fp32 accuracy: ~2^-21 a product). Measured (H100,
# 2026-12-06, same run): 69.7 -> 35.0 us at B1 T8192 H12, 53.3 -> 27.3 us at B1 T32768 H16. tf32x3.
MERGE_PRECISION = "tf32x3"
DEFAULT_NUM_SMS = 132  # H200; used when no CUDA device tells us
STATE_PRECISION = "bf16x2"  # of the state update kg^T v_new: "bf16x2" (v_new as bf16 hi + lo: tf32's accuracy,
# measured -28% to -31% on the recurrence against "tf32"), "tf32", or "bf16" (over the state bound with no decay)
EXP2_CAP = 120.0  # log2 cap of the dropped score columns' factor: finite, never selected
POISON_BUFFERS = False  # fill outputs and intermediates with NaN before the kernels run (tests: every read is written)


# ------------------------------------------------------------------------------------------------ phase 1


@mt.func
def _load_rows(ptr, base, row_h, valid, COLS: mt.constexpr):
    """Rows base + row_h of a [tokens, H, COLS] tensor as f32 (base = first token * H + head, a scalar i64;
    row_h = in-chunk token * H, i32: 64-bit math once per chunk, not per element); invalid rows read 0."""
    cols = mt.arange(0, COLS)
    return mt.load(ptr + base * COLS + (row_h[:, None] * COLS + cols[None, :]), mask=valid[:, None],
                   other=0.0).to(mt.float32)


@mt.func
def _store_rows(ptr, base, row_h, valid, x, COLS: mt.constexpr):
    cols = mt.arange(0, COLS)
    mt.store(ptr + base * COLS + (row_h[:, None] * COLS + cols[None, :]), x, mask=valid[:, None])


@mt.func
def _load_rows_in(ptr, base, row_h, valid, COLS: mt.constexpr, LAYOUT: mt.constexpr):
    """_load_rows in register layout LAYOUT."""
    cols = mt.arange(0, COLS)
    return mt.load(ptr + base * COLS + (row_h[:, None] * COLS + cols[None, :]), mask=valid[:, None], other=0.0,
                   layout=LAYOUT).to(mt.float32)


@mt.func
def _chunk_rows(chunk, h, chunk_ptr, H, BT: mt.constexpr):
    """A chunk-head's token range from the chunk table: (start, end, in-chunk rows 0..BT, which of them are
    tokens, the first row's offset start * H + h (i64), the rows' offsets row * H (i32))."""
    start = mt.load(chunk_ptr + 2 * chunk)
    end = mt.load(chunk_ptr + 2 * chunk + 1)
    rt = mt.arange(0, BT)
    return start, end, rt, start + rt < end, start.to(mt.int64) * H + h, rt * H


@mt.func
def _floored_gate(graw, valid, gate_scale, gate_bias, lower_bound):
    """The lower-bounded gate lb * sigmoid(exp(A_log) (g + dt_bias)) of the chunk's raw rows (0 past its end)."""
    return mt.where(valid[:, None], lower_bound * _sigmoid_fast(gate_scale * (graw + gate_bias[None, :])), 0.0)


@mt.func
def _load_cols(ptr, base, row_h, valid, COLS: mt.constexpr, C0: mt.constexpr, CW: mt.constexpr):
    """Columns C0..C0+CW of the rows base + row_h of a [tokens, H, COLS] tensor as f32 (as _load_rows)."""
    cols = C0 + mt.arange(0, CW)
    return mt.load(ptr + base * COLS + (row_h[:, None] * COLS + cols[None, :]), mask=valid[:, None],
                   other=0.0).to(mt.float32)


@mt.func
def _store_cols(ptr, base, row_h, valid, x, COLS: mt.constexpr, C0: mt.constexpr, CW: mt.constexpr):
    cols = C0 + mt.arange(0, CW)
    mt.store(ptr + base * COLS + (row_h[:, None] * COLS + cols[None, :]), x, mask=valid[:, None])


@mt.func
def _store_block(ptr, base, start, end, H, x, COLS: mt.constexpr, R0: mt.constexpr, R: mt.constexpr,
                 C0: mt.constexpr, CW: mt.constexpr, LAYOUT: mt.constexpr):
    """x ([R, CW]) into rows R0..R0+R and columns C0..C0+CW of the chunk's rows of a [tokens, H, COLS] tensor,
    stored from register layout LAYOUT (an accumulator's thread map: no conversion through shared memory). The row
    indices and mask are fresh index math, so they are made in LAYOUT rather than converted into it."""
    ri = R0 + mt.arange(0, R)
    cols = C0 + mt.arange(0, CW)
    mt.store(ptr + base * COLS + ((ri * H)[:, None] * COLS + cols[None, :]), x, mask=(start + ri < end)[:, None],
             layout=LAYOUT)


@mt.func
def _accumulator_layout(WM: mt.constexpr, WN: mt.constexpr):
    """The blocked layout an mma.sync accumulator on warps [WM, WN] is a register renaming of."""
    return mt.blocked([1, 2], [8, 4], [WM, WN], [1, 0])


@mt.func
def _prefetch_rows(ptr, base, row_h, valid, COLS: mt.constexpr, C0, LINES: mt.constexpr, LINE: mt.constexpr,
                   LEVEL: mt.constexpr):
    """Into cache LEVEL ("L1" or "L2"): the LINES 128-byte lines (LINE elements each) from column C0 of the rows
    base + row_h of a [tokens, H, COLS] tensor (as _load_rows); one pointer per line, so each line is asked for
    once."""
    starts = C0 + mt.arange(0, LINES) * LINE
    mt.prefetch(ptr + base * COLS + (row_h[:, None] * COLS + starts[None, :]), mask=valid[:, None], level=LEVEL)


@mt.func
def _prefetch_chunk_rows(g_ptr, k_ptr, q_ptr, v_ptr, base, row_h, valid, K: mt.constexpr, V: mt.constexpr,
                         LEVEL: mt.constexpr):
    """Phase 1's input rows (g, k, q, v) of one chunk-head into cache LEVEL."""
    _prefetch_rows(g_ptr, base, row_h, valid, K, 0, max(K // 64, 1), min(K, 64), LEVEL)
    _prefetch_rows(k_ptr, base, row_h, valid, K, 0, max(K // 64, 1), min(K, 64), LEVEL)
    _prefetch_rows(q_ptr, base, row_h, valid, K, 0, max(K // 64, 1), min(K, 64), LEVEL)
    _prefetch_rows(v_ptr, base, row_h, valid, V, 0, max(V // 64, 1), min(V, 64), LEVEL)


@mt.func
def _l2_normalize(x):
    return x / mt.sqrt(mt.sum(x * x, axis=1) + L2_EPS)[:, None]


@mt.func
def _l2_normalize_fast(x):
    """_l2_normalize with rsqrt.approx (relative error ~2^-23, far below the tf32 / bf16 roundings that follow)
    instead of sqrt.rn and a div.rn per element (~20 instructions each)."""
    return x * mt.rsqrt(mt.sum(x * x, axis=1) + L2_EPS)[:, None]


@mt.func
def _sigmoid_fast(x):
    """sigmoid(x) = rsqrt(1 + 2^(-x log2 e))^2: two MUFU ops (relative error ~2^-22) instead of mt.sigmoid's
    rcp.rn sequence; x -> -inf gives rsqrt(inf)^2 = 0, x -> +inf gives 1."""
    r = mt.rsqrt(1.0 + mt.exp2(-x * RCP_LN2))
    return r * r


@mt.func
def _blocks(STRUCTURED: mt.constexpr, A_KIND: mt.constexpr, B_KIND: mt.constexpr):
    """A dot's block_structure over SUB x SUB blocks when STRUCTURED (STRUCTURED_SOLVE), else None (dense)."""
    return (SUB, A_KIND, B_KIND) if STRUCTURED else None


@mt.func
def _solve_dot(a, b, PRECISION: mt.constexpr, STRUCTURE: mt.constexpr):
    """A product of the UT inverse: an f32 dot in PRECISION ("tf32", "tf32x3", "ieee") with block_structure
    STRUCTURE, or, for PRECISION "bf16x1" / "bf16x2" / "bf16x3", bf16 wgmma-friendly dots on split operands
    (`_split_dot`; STRUCTURE is then None)."""
    if PRECISION == "bf16x1":
        return _split_dot(a, b, 1)
    if PRECISION == "bf16x2":
        return _split_dot(a, b, 2)
    if PRECISION == "bf16x3":
        return _split_dot(a, b, 3)
    return mt.dot(a, b, input_precision=PRECISION, block_structure=STRUCTURE)


@mt.func
def _unit_lower_inverse(n_mat, eye, PRECISION: mt.constexpr, STRUCTURED: mt.constexpr):
    """(I - N)^-1 for N strictly lower triangular within SUBxSUB diagonal blocks (one block, or a block-diagonal
    tile of several: N^16 = 0 either way): prod_i (I + N^(2^i)), all on mt.dot. STRUCTURED: the products are
    block-diagonal dots (block_structure), which skip the tensor-core work off the diagonal blocks."""
    power = n_mat
    inv = eye + n_mat
    diagonal = _blocks(STRUCTURED, "diag", "diag")
    for _ in mt.static_range(NEUMANN_STEPS):
        power = _solve_dot(power, power, PRECISION, diagonal)
        inv = inv + _solve_dot(inv, power, PRECISION, diagonal)
    return inv


@mt.func
def _ut_inverse(lmat, ci, cj, SOLVE_PRECISION: mt.constexpr, STRUCTURED: mt.constexpr):
    """(I + L)^-1 for a strictly lower [BT, BT] L = (I + M)^-1 (I + D)^-1, D its 16x16 diagonal blocks and
    M = (I + D)^-1 F, F = L - D: (I + D)^-1 by Neumann doubling (exact: D^16 = 0, the same products as per 16x16
    block); M is strictly block-lower with 4 blocks, so M^4 = 0 and (I + M)^-1 = (I + M^2)(I - M) (fla's block
    merges).

    STRUCTURED (STRUCTURED_SOLVE): every product says which of its 16x16 blocks can be nonzero (d_inv diagonal;
    F, M and M^2 strictly lower; the result lower), so the tensor cores skip the rest: at K3 the inverse's
    mma.sync per warp fall from 320 to about 60 (docs/kernels/flash_kda.md, "Block-structured solve")."""
    eye = (ci == cj).to(mt.float32)
    same_block = (ci // SUB) == (cj // SUB)
    d_inv = _unit_lower_inverse(mt.where(same_block, -lmat, 0.0), eye, SOLVE_PRECISION, STRUCTURED)
    # F = L off its diagonal blocks: the structured dot's strict_lower mask makes it (L has no upper blocks)
    f = lmat if STRUCTURED else mt.where(same_block, 0.0, lmat)
    m = _solve_dot(d_inv, f, SOLVE_PRECISION, _blocks(STRUCTURED, "diag", "strict_lower"))
    m2 = _solve_dot(m, m, SOLVE_PRECISION, _blocks(STRUCTURED, "strict_lower", "strict_lower"))
    step = d_inv - _solve_dot(m, d_inv, SOLVE_PRECISION, _blocks(STRUCTURED, "strict_lower", "diag"))
    return step + _solve_dot(m2, step, SOLVE_PRECISION, _blocks(STRUCTURED, "strict_lower", "lower"))


@mt.kernel(min_blocks_per_sm=1)
def kda_intra_chunk_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, chunk_ptr,
                           w_ptr, u_ptr, kg_ptr, qg_ptr, aqk_ptr, decay_ptr, H, scale, lower_bound,
                           K: mt.constexpr, V: mt.constexpr, BT: mt.constexpr, SOLVE_PRECISION: mt.constexpr):
    """One (chunk, head): everything about the chunk that does not depend on the incoming state.

    Writes per token row: w = Ainv (beta k 2^G), u = Ainv (beta v), kg = k 2^(G_last - G), qg = scale q 2^G
    ([tokens, H, K or V], bf16), the chunk's row of Aqk = scale Tril(q 2^G (k 2^-G)^T) with zeros above the
    diagonal ([tokens, H, BT], bf16), and decay = 2^G_last per (chunk, head) ([chunks, H, K], f32).

    Every tile is a whole chunk ([BT, K], [BT, BT]) so that every mt.dot is BT rows tall (tensor cores: mma.sync
    with 8 warps); the 16-row sub-chunks exist only as row masks and per-row gate references.
    """
    chunk = mt.program_id(0)
    h = mt.program_id(1)
    start = mt.load(chunk_ptr + 2 * chunk)
    end = mt.load(chunk_ptr + 2 * chunk + 1)
    NS = BT // SUB
    rt = mt.arange(0, BT)
    block = rt // SUB  # the sub-chunk of each row
    ci = rt[:, None]
    cj = rt[None, :]
    rows = start + rt
    valid = rows < end
    base = start.to(mt.int64) * H + h
    row_h = rt * H
    gate_scale = mt.exp(mt.load(a_log_ptr + h))
    gate_bias = mt.load(dt_bias_ptr + h * K + mt.arange(0, K))

    # Activations and the log2 gate cumsum G. g of rows past the chunk end is 0, so G_last is right for a partial
    # chunk; q, k and beta of those rows are 0.
    q = _l2_normalize(_load_rows(q_ptr, base, row_h, valid, K))
    kk = _l2_normalize(_load_rows(k_ptr, base, row_h, valid, K))
    graw = _load_rows(g_ptr, base, row_h, valid, K)
    gate = mt.where(valid[:, None], lower_bound * mt.sigmoid(gate_scale * (graw + gate_bias[None, :])), 0.0)
    b = mt.where(valid, mt.sigmoid(mt.load(beta_ptr + base + row_h, mask=valid, other=0.0).to(mt.float32)), 0.0)
    gcum = mt.cumsum(gate, axis=0) * RCP_LN2
    g_last = mt.sum(gate, axis=0) * RCP_LN2

    # G_start[s] (G just before sub-chunk s, the exclusive prefix: kda.md §1.5) and, per row, its own sub-chunk's
    # G_start: the reference of the row factors, rel = 2^(G - G_start) in [2^-115, 1] with the -5 floor.
    gstart = (mt.zeros((K,), mt.float32),)
    gref = mt.zeros((BT, K), mt.float32)
    for s in mt.static_range(1, NS):
        gs = mt.sum(mt.where((rt < s * SUB)[:, None], gate, 0.0), axis=0) * RCP_LN2
        gstart = gstart + (gs,)
        gref = mt.where((block == s)[:, None], gs[None, :], gref)
    rel = mt.exp2(gcum - gref)
    from_start = mt.exp2(gcum)  # 2^G <= 1 (a tiny true value may flush to 0)
    _store_rows(qg_ptr, base, row_h, valid, q * from_start * scale, K)
    _store_rows(kg_ptr, base, row_h, valid, kk * mt.exp2(g_last[None, :] - gcum), K)
    q_rel = q * rel
    k_rel_lo = (kk * rel).to(mt.bfloat16)

    # Score rows of sub-chunk s: (q 2^(G - G_start[s])) . (k 2^(G_start[s] - G))^T for the columns up to the end
    # of sub-chunk s. The column factor is <= 2^115 on sub-chunk s and <= 1 before it (flushing to 0 only where
    # the true product is below 2^-126); later columns are zeroed (their exponent is capped so nothing overflows).
    # One full-height dot per sub-chunk and matrix keeps the dots on tensor cores; the rows of the other
    # sub-chunks are computed and dropped (4x the MACs of the causal blocks; 16x16 output tiles would go to CUDA
    # cores at 8 warps, and a [16, 64] row block cannot be placed into a [64, 64] tile without slicing).
    aqk = mt.zeros((BT, BT), mt.float32)
    lmat = mt.zeros((BT, BT), mt.float32)
    for s in mt.static_range(NS):
        col_on = (rt < (s + 1) * SUB)[:, None]
        k_col_t = mt.trans(mt.where(col_on, kk * mt.exp2(mt.minimum(gstart[s][None, :] - gcum, EXP2_CAP)), 0.0))
        in_s = (block == s)[:, None]
        # Aqk in tf32; L with bf16 operands: measured, the errors do not move (notes), and it halves its MMAs
        aqk = mt.where(in_s, mt.dot(q_rel, k_col_t, input_precision="tf32"), aqk)
        lmat = mt.where(in_s, mt.dot(k_rel_lo, k_col_t.to(mt.bfloat16)), lmat)
    aqk = mt.where(ci >= cj, aqk * scale, 0.0)
    lmat = mt.where(ci > cj, lmat * b[:, None], 0.0)
    mt.store(aqk_ptr + base * BT + (row_h[:, None] * BT + cj), aqk, mask=valid[:, None])

    ainv = _ut_inverse(lmat, ci, cj, SOLVE_PRECISION, False)

    # WY factors, tf32 on f32 operands (not bf16: these products carry the UT solve into w and u).
    w = mt.dot(ainv, kk * from_start * b[:, None], input_precision="tf32")
    _store_rows(w_ptr, base, row_h, valid, w, K)
    vb = _load_rows(v_ptr, base, row_h, valid, V) * b[:, None]
    _store_rows(u_ptr, base, row_h, valid, mt.dot(ainv, vb, input_precision="tf32"), V)
    mt.store(decay_ptr + (chunk.to(mt.int64) * H + h) * K + mt.arange(0, K), mt.exp2(g_last))


@mt.func
def _scan_layout(BT: mt.constexpr, WARPS: mt.constexpr):
    """[BT, K] with rows fastest in the thread: BT / 8 lanes of 8 rows each hold a column's BT rows in one warp."""
    return mt.blocked([8, 1], [BT // 8, 256 // BT], [1, WARPS], [0, 1])


@mt.func
def _sliced_chunk(chunk, h, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, chunk_ptr, w_ptr, u_ptr,
                  kg_ptr, qg_ptr, aqk_ptr, decay_ptr, H, scale, lower_bound, K: mt.constexpr, V: mt.constexpr,
                  BT: mt.constexpr, SOLVE_PRECISION: mt.constexpr, SCAN_LAYOUT: mt.constexpr, WARPS: mt.constexpr,
                  ACC_STORES: mt.constexpr, STRUCTURED: mt.constexpr, PREFETCH: mt.constexpr,
                  CHAINS: mt.constexpr):
    """One chunk-head of the sliced phase 1 (the body of kda_intra_chunk_sliced_kernel, whose docstring says what
    it computes and what each constexpr does)."""
    start, end, rt, valid, base, row_h = _chunk_rows(chunk, h, chunk_ptr, H, BT)
    NS = BT // SUB
    sub = mt.arange(0, SUB)
    cj = rt[None, :]
    ci = rt[:, None]
    gate_scale = mt.exp(mt.load(a_log_ptr + h))
    gate_bias = mt.load(dt_bias_ptr + h * K + mt.arange(0, K))

    # The gate first, then k (for k_end), and q and k again per sub-chunk in the score loop: fewer [BT, K] tiles
    # live at once (a whole-chunk q and k held across the cumsum spilled).
    if PREFETCH:
        _prefetch_chunk_rows(g_ptr, k_ptr, q_ptr, v_ptr, base, row_h, valid, K, V, "L1")
    if SCAN_LAYOUT:
        graw = _load_rows_in(g_ptr, base, row_h, valid, K, _scan_layout(BT, WARPS))
    else:
        graw = _load_rows(g_ptr, base, row_h, valid, K)
    gate = _floored_gate(graw, valid, gate_scale, gate_bias, lower_bound)
    b = mt.where(valid, mt.sigmoid(mt.load(beta_ptr + base + row_h, mask=valid, other=0.0).to(mt.float32)), 0.0)
    gcum = mt.cumsum(gate, axis=0) * RCP_LN2

    # Sub-chunk boundaries in log2 units: bound[s] = G just before sub-chunk s (kda.md §1.5), bound[NS] = G_last
    # (rows past the chunk end have g = 0, so the last cumsum row is G_last also in a partial chunk).
    bound = (mt.zeros((K,), mt.float32),)
    for s in mt.static_range(1, NS + 1):
        bound = bound + (mt.sum(gcum[s * SUB - 1:s * SUB, :], axis=0),)
    g_last = bound[NS]

    # Per sub-chunk t (rows 16t..16t+15): k_end = k 2^(bound[t+1] - G) in [2^-115, 1] (floor -5, 16 rows), the
    # column side of every score block; the row sides q 2^(G - bound[s]), k 2^(G - bound[s]) are made per s below.
    # kg, qg and w's right factor (beta k 2^G) are these times [K]-vector factors.
    kk = _l2_normalize_fast(_load_rows(k_ptr, base, row_h, valid, K))
    k_end = ()
    kg = ()
    for t in mt.static_range(NS):
        rows = gcum[t * SUB:(t + 1) * SUB, :]
        ke = kk[t * SUB:(t + 1) * SUB, :] * mt.exp2(bound[t + 1][None, :] - rows)
        k_end = k_end + (ke,)
        kg = kg + (ke * mt.exp2(g_last - bound[t + 1])[None, :],)
    _store_rows(kg_ptr, base, row_h, valid, mt.cat(kg, 0), K)

    # Score row block s: (q 2^(G - bound[s])) . (k 2^(bound[s] - G))^T over the columns up to the end of
    # sub-chunk s. Column block t <= s is k_end[t] 2^(bound[s] - bound[t+1]): a factor <= 1 for t < s (it flushes
    # to 0 only where the true product is below 2^-126) and in [1, 2^115] on the diagonal block; later column
    # blocks are zero.
    lmat = ()
    k_wy = ()
    for s in mt.static_range(NS):
        # this sub-chunk's row indices from fresh index math (cheap to recompute in any layout; a slice of row_h
        # would tie the qg store's pointers to the Aqk store's mma layout and convert them through shared memory)
        ri = s * SUB + sub
        rows_h = ri * H
        valid_s = start + ri < end
        rel = mt.exp2(gcum[s * SUB:(s + 1) * SUB, :] - bound[s][None, :])
        q_rel = _l2_normalize_fast(_load_rows(q_ptr, base, rows_h, valid_s, K)) * rel
        k_rel = _l2_normalize_fast(_load_rows(k_ptr, base, rows_h, valid_s, K)) * rel
        from_start = mt.exp2(bound[s])
        _store_rows(qg_ptr, base, rows_h, valid_s, q_rel * (from_start * scale)[None, :], K)
        b_s = b[s * SUB:(s + 1) * SUB]
        k_wy = k_wy + (k_rel * from_start[None, :] * b_s[:, None],)
        cols = ()
        for t in mt.static_range(NS):
            if t <= s:
                cols = cols + (k_end[t] * mt.exp2(bound[s] - bound[t + 1])[None, :],)
            else:
                cols = cols + (mt.zeros((SUB, K), mt.float32),)
        col_t = mt.trans(mt.cat(cols, 0))
        a_s = mt.dot(q_rel, col_t, input_precision="tf32", k_chains=CHAINS)
        if ACC_STORES:
            _store_block(aqk_ptr, base, start, end, H, mt.where(ri[:, None] >= cj, a_s * scale, 0.0), BT, s * SUB,
                         SUB, 0, BT, _accumulator_layout(1, WARPS))
        else:
            mt.store(aqk_ptr + base * BT + (rows_h[:, None] * BT + cj),
                     mt.where(ri[:, None] >= cj, a_s * scale, 0.0), mask=valid_s[:, None])
        # L = Diag(beta) K Gamma K^T (beta on the row side: the dot's mma layout then stays out of the [16, K]
        # tiles), tf32 like Aqk: both dots then share one staging of col_t as the B operand
        l_s = mt.dot(k_rel * b_s[:, None], col_t, input_precision="tf32", k_chains=CHAINS)
        lmat = lmat + (mt.where(ri[:, None] > cj, l_s, 0.0),)
    lmat = mt.cat(lmat, 0)

    ainv = _ut_inverse(lmat, ci, cj, SOLVE_PRECISION, STRUCTURED)
    # WY factors in column blocks of at most BT: a [BT, BT] x [BT, 64] B operand is 64 registers per thread
    # (warps [4, 2]), a [BT, 128] one 128.
    k_wy = mt.cat(k_wy, 0)
    WK = min(K, BT)
    for c in mt.static_range(K // WK):
        # structured: ainv is block-lower, a row block's K steps past its diagonal block are skipped
        w = mt.dot(ainv, k_wy[:, c * WK:(c + 1) * WK], input_precision="tf32",
                   block_structure=_blocks(STRUCTURED, "lower", "full"))
        if ACC_STORES:
            _store_block(w_ptr, base, start, end, H, w, K, 0, BT, c * WK, WK, _accumulator_layout(4, WARPS // 4))
        else:
            _store_cols(w_ptr, base, row_h, valid, w, K, c * WK, WK)
    WV = min(V, BT)
    for c in mt.static_range(V // WV):
        vb = _load_cols(v_ptr, base, row_h, valid, V, c * WV, WV) * b[:, None]
        u = mt.dot(ainv, vb, input_precision="tf32", block_structure=_blocks(STRUCTURED, "lower", "full"))
        if ACC_STORES:
            _store_block(u_ptr, base, start, end, H, u, V, 0, BT, c * WV, WV, _accumulator_layout(4, WARPS // 4))
        else:
            _store_cols(u_ptr, base, row_h, valid, u, V, c * WV, WV)
    mt.store(decay_ptr + (chunk.to(mt.int64) * H + h) * K + mt.arange(0, K), mt.exp2(g_last))


@mt.kernel(min_blocks_per_sm=1)
def kda_intra_chunk_sliced_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, chunk_ptr,
                                  w_ptr, u_ptr, kg_ptr, qg_ptr, aqk_ptr, decay_ptr, H, scale, lower_bound,
                                  K: mt.constexpr, V: mt.constexpr, BT: mt.constexpr,
                                  SOLVE_PRECISION: mt.constexpr, SCAN_LAYOUT: mt.constexpr = False,
                                  WARPS: mt.constexpr = 8, ACC_STORES: mt.constexpr = False,
                                  STRUCTURED: mt.constexpr = False, PREFETCH: mt.constexpr = False,
                                  CHAINS: mt.constexpr = 1):
    """kda_intra_chunk_kernel with the score rows built per 16-row sub-chunk (INTRA_VARIANT "sliced"): static
    slices `x[16*s:16*s+16, :]` and `mt.cat` let each score row block be a [16, K] x [K, BT] dot (mma.sync with
    warps [1, 8]) placed into the [BT, BT] tile, so no score row is computed and dropped; every gate factor is
    one exp2 per element plus [K]-vector factors per (row block, column block). The same outputs as
    kda_intra_chunk_kernel up to rounding (L here is tf32 with beta on its row side; chunk64's is bf16).
    docs/kernels/flash_kda.md, version 3, has the instruction counts and the register-pressure choices.

    SCAN_LAYOUT (INTRA_SCAN_LAYOUT): the gate is loaded with each thread holding 8 consecutive rows of a column
    and a warp all BT = 64 rows (`_scan_layout`), so its cumsum is 8 adds in the thread and 3 shuffle rounds,
    with no cross-warp exchange; otherwise it is loaded coalesced and the scan crosses the 8 warps through
    shared memory (22% of the kernel's PTX at K3).
    
    STRUCTURED (STRUCTURED_SOLVE): the UT inverse's products are block-structured dots (`_ut_inverse`).

    PREFETCH (INTRA_PREFETCH): the chunk's k, q and v rows are asked into L1 before the gate is loaded, so their
    loads later in the program hit L1 instead of each waiting out a DRAM round trip with nothing else in flight
    (one program an SM: Nsight Compute put 25% of the stall samples on these loads' long scoreboard).

    CHAINS (SCORE_CHAINS): the score dots (Aqk and L rows, [16, K] x [K, BT], one accumulator tile a warp and K / 8
    tf32 K steps in one dependent chain) accumulate in CHAINS independent chains (`mt.dot(..., k_chains=)`).

    ACC_STORES (ACC_STORES): w, u and the Aqk rows are stored from their mma accumulators' layouts
    (`_store_block`), 4-byte pairs straight from the registers, instead of each going to the coalesced layout through
    shared memory first. At K3: bar.sync 81 -> 57, spills 28 -> 0 B, st.global 21 -> 49 (narrower stores).
    """
    _sliced_chunk(mt.program_id(0), mt.program_id(1), q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr,
                  chunk_ptr, w_ptr, u_ptr, kg_ptr, qg_ptr, aqk_ptr, decay_ptr, H, scale, lower_bound, K, V, BT,
                  SOLVE_PRECISION, SCAN_LAYOUT, WARPS, ACC_STORES, STRUCTURED, PREFETCH, CHAINS)


# ------------------------------------------------------------------------------------------------ phase 1 on wgmma
# (INTRA_VARIANT "wg"): one warpgroup a chunk-head, every product a bf16 wgmma, f32 accuracy bought back by
# splitting an operand into bf16 hi + lo parts where it matters (WG_SPLIT_*). docs/kernels/flash_kda.md,
# "Phase 1 on one warpgroup".


@mt.func
def _wg_layout(BT: mt.constexpr, K: mt.constexpr):
    """[BT, K] on one warpgroup: a warp per 16-row sub-chunk, 8 consecutive columns a thread (16-byte loads,
    stores and operand staging), so a row's sums are a warp's shuffles and a sub-chunk's scans stay in the warp
    (8 x 8 elements a thread at K = 128). Split as [BT // SUB, SUB, K] (`_wg_sub`) it keeps every element in its
    thread."""
    CPT = min(8, K)
    LC = min(16, K // CPT)  # lanes along the columns
    LR = 32 // LC
    return mt.blocked([SUB // LR, CPT], [LR, LC], [BT // SUB, 1], [1, 0])


@mt.func
def _wg_sub(x, BT: mt.constexpr, K: mt.constexpr):
    """[BT, K] -> [sub-chunk, row in it, K]: per-sub-chunk quantities are then [BT // SUB, K] tiles broadcast
    along axis 1 (a thread's rows all lie in one sub-chunk: no per-element select of its reference)."""
    return x.reshape((BT // SUB, SUB, K))


@mt.func
def _bf16_split(x):
    """x = hi + lo with hi = bf16(x) and lo = bf16(x - hi): 16 significant bits of x in two bf16 tiles."""
    hi = x.to(mt.bfloat16)
    return hi, (x - hi.to(mt.float32)).to(mt.bfloat16)


@mt.func
def _split_dot(a, b, SPLIT: mt.constexpr):
    """a @ b (f32 tiles) on bf16 tensor cores: SPLIT 1 rounds both operands to bf16 (8 bits); 2 splits a into hi + lo
    (a exact to 16 bits, b to 8); 3 splits both and sums hi.hi + lo.hi + hi.lo (about 16 bits each: tf32's accuracy
    and more, at 3 products)."""
    if SPLIT == 1:  # (an operand already in bf16 converts to itself)
        return mt.dot(a.to(mt.bfloat16), b.to(mt.bfloat16))
    a_hi, a_lo = _bf16_split(a)
    if SPLIT == 2:
        b16 = b.to(mt.bfloat16)
        return mt.dot(a_lo, b16, mt.dot(a_hi, b16))
    b_hi, b_lo = _bf16_split(b)
    return mt.dot(a_hi, b_lo, mt.dot(a_lo, b_hi, mt.dot(a_hi, b_hi)))


@mt.func
def _wg_scores(rows, k_end, bstart, bend, SPLIT: mt.constexpr, BT: mt.constexpr, K: mt.constexpr):
    """[BT, BT] scores rows . cols^T, unmasked: row block s (rows 16s..16s+15, each row side scaled to its own
    sub-chunk's reference) against the columns up to the end of sub-chunk s, whose column block t <= s is k_end[t]
    2^(bound[s] - bound[t+1]) (<= 1; 1 on the diagonal block) and later blocks 0. Whole-chunk dots (wgmma is 64
    rows a warpgroup), each keeping the rows of its sub-chunk."""
    NS = BT // SUB
    rb = mt.arange(0, BT)[:, None] // SUB
    sub_t = mt.arange(0, NS)[:, None]
    scores = mt.zeros((BT, BT), mt.float32)
    for s in mt.static_range(NS):
        bs = mt.sum(mt.where(sub_t == s, bstart, 0.0), axis=0)
        factor = mt.where(sub_t <= s, mt.exp2(bs[None, :] - bend), 0.0)
        col_t = mt.trans((k_end * factor[:, None, :].to(mt.bfloat16)).reshape((BT, K)))
        scores = mt.where(rb == s, _split_dot(rows, col_t, SPLIT), scores)
    return scores


@mt.func
def _wg_chunk(chunk, h, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, chunk_ptr, w_ptr, u_ptr,
              kg_ptr, qg_ptr, aqk_ptr, decay_ptr, H, scale, lower_bound, K: mt.constexpr, V: mt.constexpr,
              BT: mt.constexpr, SCORE_SPLIT: mt.constexpr, SOLVE_PRECISION: mt.constexpr, WY_SPLIT: mt.constexpr,
              PREFETCH: mt.constexpr):
    """One chunk-head of phase 1 on one warpgroup (the body of kda_intra_chunk_wg_kernel). Gate quantities are
    kept per sub-chunk: gl = G - bound[s] (the in-sub-chunk cumsum, log2 units), tot[s] = the sub-chunk's sum,
    bstart[s] / bend[s] = G just before / at the end of sub-chunk s ([NS, K] tiles)."""
    start, end, rt, valid, base, row_h = _chunk_rows(chunk, h, chunk_ptr, H, BT)
    NS = BT // SUB
    cj = rt[None, :]
    ci = rt[:, None]
    EL = _wg_layout(BT, K)
    if PREFETCH:
        _prefetch_chunk_rows(g_ptr, k_ptr, q_ptr, v_ptr, base, row_h, valid, K, V, "L1")
    gate_scale = mt.exp(mt.load(a_log_ptr + h))
    gate_bias = mt.load(dt_bias_ptr + h * K + mt.arange(0, K))
    gate = _floored_gate(_load_rows_in(g_ptr, base, row_h, valid, K, EL), valid, gate_scale, gate_bias, lower_bound)
    gate3 = _wg_sub(gate * RCP_LN2, BT, K)
    gl = mt.cumsum(gate3, axis=1)  # G - bound[s]: <= 0, >= -115.4 (16 rows at the -5 floor)
    tot = mt.sum(gate3, axis=1)
    bend = mt.cumsum(tot, axis=0)
    bstart = bend - tot
    g_last = mt.sum(tot, axis=0)
    b = mt.where(valid, mt.sigmoid(mt.load(beta_ptr + base + row_h, mask=valid, other=0.0).to(mt.float32)), 0.0)

    # rel = 2^(G - bound[s]) and k_end = k 2^(bound[s+1] - G), both in [2^-115, 1]; kg, qg and w's right factor
    # (beta k 2^G) are these times per-sub-chunk factors.
    # (in this order, so that at most three [BT, K] f32 tiles are live: registers)
    kk = _wg_sub(_l2_normalize_fast(_load_rows_in(k_ptr, base, row_h, valid, K, EL)), BT, K)
    k_end = kk * mt.exp2(tot[:, None, :] - gl)
    _store_rows(kg_ptr, base, row_h, valid, (k_end * mt.exp2(g_last[None, :] - bend)[:, None, :]).reshape((BT, K)), K)
    k_end = k_end.to(mt.bfloat16)
    rel = mt.exp2(gl)
    kb_rel = (kk * rel).reshape((BT, K)) * b[:, None]
    if SCORE_SPLIT == 1:
        kb_rel = kb_rel.to(mt.bfloat16)
    q_rel = _wg_sub(_l2_normalize_fast(_load_rows_in(q_ptr, base, row_h, valid, K, EL)), BT, K) * rel
    from_start = mt.exp2(bstart)[:, None, :]
    _store_rows(qg_ptr, base, row_h, valid, (q_rel * (from_start * scale)).reshape((BT, K)), K)
    q_rel = q_rel.reshape((BT, K))
    if SCORE_SPLIT == 1:  # the score dots' A operands in bf16 once (the dots round them anyway): half the registers
        q_rel = q_rel.to(mt.bfloat16)

    # Aqk first and stored, then L: q_rel and the Aqk rows are dead before L's tiles live (registers).
    aqk = _wg_scores(q_rel, k_end, bstart, bend, SCORE_SPLIT, BT, K)
    mt.store(aqk_ptr + base * BT + (row_h[:, None] * BT + cj), mt.where(ci >= cj, aqk * scale, 0.0),
             mask=valid[:, None])
    lmat = _wg_scores(kb_rel, k_end, bstart, bend, SCORE_SPLIT, BT, K)
    ainv = _ut_inverse(mt.where(ci > cj, lmat, 0.0), ci, cj, SOLVE_PRECISION, False)

    k_wy = (_wg_sub(kb_rel.to(mt.float32), BT, K) * from_start).reshape((BT, K))
    _store_rows(w_ptr, base, row_h, valid, _split_dot(ainv, k_wy, WY_SPLIT), K)
    vb = _load_rows_in(v_ptr, base, row_h, valid, V, _wg_layout(BT, V)) * b[:, None]
    _store_rows(u_ptr, base, row_h, valid, _split_dot(ainv, vb, WY_SPLIT), V)
    mt.store(decay_ptr + (chunk.to(mt.int64) * H + h) * K + mt.arange(0, K), mt.exp2(g_last))


@mt.kernel(num_warps=4, min_blocks_per_sm=2)
def kda_intra_chunk_wg_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, chunk_ptr,
                              w_ptr, u_ptr, kg_ptr, qg_ptr, aqk_ptr, decay_ptr, H, scale, lower_bound,
                              K: mt.constexpr, V: mt.constexpr, BT: mt.constexpr, SCORE_SPLIT: mt.constexpr = 2,
                              SOLVE_PRECISION: mt.constexpr = "bf16x1", WY_SPLIT: mt.constexpr = 2,
                              PREFETCH: mt.constexpr = True):
    """Phase 1 on one warpgroup (INTRA_VARIANT "wg"): the sliced kernel's math with every product a bf16 wgmma
    (m64nNk16: the whole 64-row chunk on four warps), so no operand goes through mma.sync's ldmatrix fragments and
    no tile is split across two warpgroups. The score rows of sub-chunk s come from a whole-chunk dot whose other
    rows are dropped (4x the score MACs, which are cheap on wgmma). The f32 accuracy of the tf32 dots is kept by
    splitting operands into bf16 hi + lo (`_split_dot`; 1: bf16 operands, 2: the left one split, 3: both):
    SCORE_SPLIT for the Aqk / L scores, SOLVE_PRECISION ("bf16x1" / "bf16x2" / "bf16x3", `_solve_dot`) for the UT
    inverse's ten products, WY_SPLIT for w and u.
    PREFETCH: the chunk's rows into L1 first (as the sliced kernel's)."""
    _wg_chunk(mt.program_id(0), mt.program_id(1), q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr,
              chunk_ptr, w_ptr, u_ptr, kg_ptr, qg_ptr, aqk_ptr, decay_ptr, H, scale, lower_bound, K, V, BT,
              SCORE_SPLIT, SOLVE_PRECISION, WY_SPLIT, PREFETCH)


@mt.func
def _load_rows_i64(ptr, row_off, valid, COLS: mt.constexpr):
    """Rows `row_off` (token*H + head, i64) of a [tokens, H, COLS] tensor as f32; invalid rows read 0."""
    cols = mt.arange(0, COLS)
    return mt.load(ptr + row_off[:, None] * COLS + cols[None, :], mask=valid[:, None], other=0.0).to(mt.float32)


@mt.func
def _store_rows_i64(ptr, row_off, valid, x, COLS: mt.constexpr):
    cols = mt.arange(0, COLS)
    mt.store(ptr + row_off[:, None] * COLS + cols[None, :], x, mask=valid[:, None])


@mt.kernel(min_blocks_per_sm=1)
def kda_intra_chunk_sub16_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, chunk_ptr,
                           w_ptr, u_ptr, kg_ptr, qg_ptr, aqk_ptr, decay_ptr,
                           H, scale, lower_bound, diag_up, diag_down,
                           K: mt.constexpr, V: mt.constexpr, BT: mt.constexpr, SOLVE_PRECISION: mt.constexpr):
    """kda_intra_chunk_kernel's earlier form (INTRA_VARIANT "sub16"), kept for GPU A/B timing: the same outputs
    from 16-row sub-chunk tiles. Its 16x16 dots cannot use mma.sync with 8 warps (CUDA-core FMAs), and its
    tuples of [16, K] tiles cost ~300 layout-conversion barriers (docs/kernels/flash_kda.md).

    Writes per token row: w = Ainv (beta k 2^G), u = Ainv (beta v), kg = k 2^(G_last - G), qg = scale q 2^G
    ([tokens, H, K or V], bf16), the chunk's row of Aqk = scale Tril(q 2^G (k 2^-G)^T) with zeros above the
    diagonal ([tokens, H, BT], bf16), and decay = 2^G_last per (chunk, head) ([chunks, H, K], f32).
    """
    chunk = mt.program_id(0)
    h = mt.program_id(1)
    start = mt.load(chunk_ptr + 2 * chunk)
    end = mt.load(chunk_ptr + 2 * chunk + 1)
    NS = BT // SUB
    sub = mt.arange(0, SUB)
    ci = sub[:, None]
    cj = sub[None, :]
    gate_scale = mt.exp(mt.load(a_log_ptr + h))
    gate_bias = mt.load(dt_bias_ptr + h * K + mt.arange(0, K))

    # Activations of the NS sub-chunks (compile-time tuples of tiles) and the log2 gate cumsum. g of rows past the
    # chunk end is 0, so the last cumsum row is G_last also for a partial chunk.
    qn = ()
    kn = ()
    vb = ()
    beta = ()
    gcum = ()
    gstart = ()  # G just before each sub-chunk (the exclusive prefix): the reference of its off-diagonal tiles
    row_offs = ()  # token * H + head of each row, i64
    valids = ()
    carry = mt.zeros((K,), mt.float32)
    for s in mt.static_range(NS):
        rows = start + s * SUB + sub
        valid = rows < end
        row_off = rows.to(mt.int64) * H + h
        row_offs = row_offs + (row_off,)
        valids = valids + (valid,)
        q = _l2_normalize(_load_rows_i64(q_ptr, row_off, valid, K))
        kk = _l2_normalize(_load_rows_i64(k_ptr, row_off, valid, K))
        graw = _load_rows_i64(g_ptr, row_off, valid, K)
        gate = mt.where(valid[:, None], lower_bound * mt.sigmoid(gate_scale * (graw + gate_bias[None, :])), 0.0)
        b = mt.sigmoid(mt.load(beta_ptr + row_off, mask=valid, other=0.0).to(mt.float32))
        b = mt.where(valid, b, 0.0)
        qn = qn + (q,)
        kn = kn + (kk,)
        beta = beta + (b,)
        vb = vb + (_load_rows_i64(v_ptr, row_off, valid, V) * b[:, None],)
        gstart = gstart + (carry,)
        gcum = gcum + (mt.cumsum(gate, axis=0) * RCP_LN2 + carry[None, :],)
        carry = carry + mt.sum(gate, axis=0) * RCP_LN2
    g_last = carry
    gstart = gstart + (g_last,)  # gstart[s + 1] is the end of sub-chunk s

    # Gated factors. rel = 2^(G - G_start) in [2^-115, 1] (floor -5, 16 rows), inv = 1/rel. The diagonal tiles use
    # the reference G_start - SHIFT (diag_up = 2^SHIFT, an exact power of two), which centres both factors.
    q_off = ()  # q 2^(G - G_start): row side of the off-diagonal tiles
    k_off = ()
    k_end = ()  # k 2^(G_end - G) <= 1: column side, rescaled per later sub-chunk by 2^(G_start[s] - G_end[t])
    k_wy = ()  # beta k 2^G: the right factor of w
    a_diag = ()
    l_diag = ()
    for s in mt.static_range(NS):
        rel = mt.exp2(gcum[s] - gstart[s][None, :])
        inv = mt.exp2(gstart[s][None, :] - gcum[s])
        q_off = q_off + (qn[s] * rel,)
        k_off = k_off + (kn[s] * rel,)
        k_end = k_end + (kn[s] * mt.exp2(gstart[s + 1][None, :] - gcum[s]),)
        from_start = mt.exp2(gstart[s])[None, :]
        k_wy = k_wy + (kn[s] * rel * from_start * beta[s][:, None],)
        _store_rows_i64(qg_ptr, row_offs[s], valids[s], qn[s] * rel * from_start * scale, K)
        _store_rows_i64(kg_ptr, row_offs[s], valids[s], k_end[s] * mt.exp2(g_last - gstart[s + 1])[None, :], K)
        col = mt.trans((kn[s] * inv) * diag_down)
        qk = mt.dot((qn[s] * diag_up) * rel, col, input_precision="tf32")
        kk2 = mt.dot((kn[s] * diag_up) * rel, col, input_precision="tf32")
        a_diag = a_diag + (mt.where(ci >= cj, qk * scale, 0.0),)
        l_diag = l_diag + (mt.where(ci > cj, kk2 * beta[s][:, None], 0.0),)

    # Off-diagonal tiles (t < s) and the blocked UT inverse: Ai_ss by Neumann doubling, then
    # Ai_st = -Ai_ss * sum_{t <= m < s} L_sm Ai_mt (rows in order, so every Ai_mt is ready).
    eye = (ci == cj).to(mt.float32)
    a_rows = ()
    ainv = ()
    for s in mt.static_range(NS):
        a_row = ()
        l_row = ()
        for t in mt.static_range(NS):
            if t < s:
                col = mt.trans(k_end[t] * mt.exp2(gstart[s] - gstart[t + 1])[None, :])
                a_row = a_row + (mt.dot(q_off[s], col, input_precision="tf32") * scale,)
                l_row = l_row + (mt.dot(k_off[s], col, input_precision="tf32") * beta[s][:, None],)
            elif t == s:
                a_row = a_row + (a_diag[s],)
                l_row = l_row + (l_diag[s],)
        a_rows = a_rows + (a_row,)
        diag_inv = _unit_lower_inverse(-l_diag[s], eye, SOLVE_PRECISION, False)
        inv_row = ()
        for t in mt.static_range(NS):
            if t < s:
                acc = mt.zeros((SUB, SUB), mt.float32)
                for m in mt.static_range(t, s):
                    acc = mt.dot(l_row[m], ainv[m][t], acc, input_precision=SOLVE_PRECISION)
                inv_row = inv_row + (-mt.dot(diag_inv, acc, input_precision=SOLVE_PRECISION),)
            elif t == s:
                inv_row = inv_row + (diag_inv,)
        ainv = ainv + (inv_row,)

    # WY factors and the stores of w, u and the Aqk rows (zeros above the diagonal blocks).
    for s in mt.static_range(NS):
        row_off = row_offs[s]
        valid = valids[s]
        w = mt.zeros((SUB, K), mt.float32)
        u = mt.zeros((SUB, V), mt.float32)
        for t in mt.static_range(s + 1):  # tf32, not bf16: these products carry the UT solve into w and u
            w = mt.dot(ainv[s][t], k_wy[t], w, input_precision="tf32")
            u = mt.dot(ainv[s][t], vb[t], u, input_precision="tf32")
        _store_rows_i64(w_ptr, row_off, valid, w, K)
        _store_rows_i64(u_ptr, row_off, valid, u, V)
        for t in mt.static_range(NS):
            block = a_rows[s][t] if t <= s else mt.zeros((SUB, SUB), mt.float32)
            mt.store(aqk_ptr + row_off[:, None] * BT + (t * SUB + sub)[None, :], block, mask=valid[:, None])
    mt.store(decay_ptr + (chunk.to(mt.int64) * H + h) * K + mt.arange(0, K), mt.exp2(g_last))


# ------------------------------------------------------------------------------------------------ phase 2


@mt.func
def _oriented(x, TRANSPOSED: mt.constexpr):
    """x, or x^T when the recurrence holds its state transposed."""
    if TRANSPOSED:
        return mt.trans(x)
    else:
        return x


@mt.func
def _segment_program(pid, seg_ptr, H, NVB: mt.constexpr):
    """A recurrence program's (column block, segment, head) from its 1-D id (column blocks fastest), and its
    segment row (token start, token end, first chunk, final-state slot)."""
    vb = pid % NVB
    ph = pid // NVB
    p = ph // H
    start = mt.load(seg_ptr + 4 * p)
    end = mt.load(seg_ptr + 4 * p + 1)
    chunk0 = mt.load(seg_ptr + 4 * p + 2)
    slot = mt.load(seg_ptr + 4 * p + 3)
    return vb, p, ph % H, start, end, chunk0, slot


@mt.kernel(min_blocks_per_sm=1)  # without it ptxas picks 40 registers and spills 6 KB (8 warps)
def kda_recurrence_kernel(w_ptr, u_ptr, kg_ptr, qg_ptr, aqk_ptr, decay_ptr, o_ptr, h0_ptr, ht_ptr, seg_ptr,
                          H, h0_sn, h0_sh, h0_sk, h0_sv, ht_sn, ht_sh, ht_sk, ht_sv,
                          K: mt.constexpr, V: mt.constexpr, BT: mt.constexpr, BV: mt.constexpr,
                          TRANSITION: mt.constexpr, HAS_H0: mt.constexpr, STORE_HT: mt.constexpr,
                          STATE_PRECISION: mt.constexpr, CARRIED: mt.constexpr = False,
                          PREFETCH: mt.constexpr = False, LINES_K: mt.constexpr = 1, LINES_V: mt.constexpr = 1,
                          LINES_T: mt.constexpr = 1, TRANSPOSED: mt.constexpr = False,
                          FUSED_WQ: mt.constexpr = False, ACC_STORES: mt.constexpr = False,
                          WARPS: mt.constexpr = 4, BIG_DOTS: mt.constexpr = "mma",
                          SPLIT_UPDATE: mt.constexpr = False):
    """One (column block, segment, head): the serial chunk recurrence over the segment's tokens.

    CARRIED (RECURRENCE_CARRIED): the dot operands w, qg, Aqk are read through carried pointer tiles advanced a chunk
    per iteration, which the pipeline pass streams through cp.async rings num_stages deep (in dynamic shared
    memory at K3); otherwise each chunk indexes them from its row (the form measured on 2026-11-29).

    w S and qg S take the state rounded to bf16, Aqk v_new takes v_new in bf16; the state update kg^T v_new runs
    in STATE_PRECISION ("bf16x2": v_new as bf16 hi + lo halves, one K = 2 BT dot on [kg^T kg^T]; "tf32": f32 v_new,
    half the tensor-core rate; "bf16": v_new rounded to bf16).

    seg_ptr holds int32 rows (token start, token end, first chunk index, final-state slot or -1). Output mode
    writes o and (STORE_HT) the final state into slot `final-state slot` of ht. TRANSITION mode runs the columns
    `col` of the augmented state X = [M | E] ([K, K+V]): X starts as [I | 0], u is taken as 0 on the M columns,
    and X is written to ht slot = segment; no o.

    PREFETCH (RECURRENCE_PREFETCH): at the top of each chunk, the next chunk's operand lines are prefetched into L1
    (LINES_K / LINES_V / LINES_T lines per K / BV / BT row of bf16), so its loads hit L1 instead of waiting out an
    L2 or DRAM round trip each chunk: the serial chain's loads are otherwise issued with nothing in flight behind.

    FUSED_WQ (RECURRENCE_FUSED_WQ; output mode, state not carried): `w S` and `qg S` are one [w; qg] S dot
    ([2 BT, K] x [K, BV]), so the state is staged as a B operand once a chunk instead of twice, and o = Aqk v_new +
    (its lower half). Transposed: S^T [w; qg]^T ([BV, K] x [K, 2 BT]), its column halves.

    BIG_DOTS (RECURRENCE_WGMMA: "auto", else "mma"): the instruction of the two [2 BT, K] x [K, BV] dots, [w; qg] S
    and the bf16x2 state update; "auto" lets dot-lowering put them on wgmma (their two staged tiles fill the 48 KB
    of static shared memory exactly). With TRANSPOSED, every 16-bit dot: S^T and v_new^T are then the wgmmas' A
    operands straight from their accumulator registers, and only the token tiles (w^T, qg^T, Aqk^T, kg) are
    staged; the bf16x2 update is two dots on kg (hi, then lo).

    SPLIT_UPDATE (RECURRENCE_SPLIT_UPDATE; bf16x2, state not transposed): the update as two dots kg^T v_lo and
    kg^T v_rest sharing one converted kg^T (staged and ldmatrix-read once a chunk) instead of one K = 2 BT dot on
    the concatenation [kg^T kg^T] (32 KB staged).

    ACC_STORES (ACC_STORES; state not transposed): o is stored from its accumulator's layout on WARPS (the
    program's warps) rather than converted to the coalesced one through shared memory: 2 bar.sync a chunk fewer.

    TRANSPOSED (RECURRENCE_TRANSPOSED): the state is held as S^T [BV, K] and every product is transposed with it
    (v_new^T = u^T - S^T w^T, o^T = S^T qg^T + v_new^T Aqk^T, S^T = S^T diag(decay) + v_new^T kg). S^T and v_new^T
    are accumulators on warps [W, 1] and the A operands of the next products by register renaming (bf16: the
    accumulator is the m16n8k16 A fragment; tf32: kPairs), so the state never goes through shared memory; only
    the token tiles w, qg, Aqk, kg are staged (mma_layouts.transposed_accumulator_as_b gives the same fact for B).
    """
    NVB = (K + V) // BV if TRANSITION else V // BV
    pid = mt.program_id(0)  # 1-D grid, column blocks fastest: the blocks of one head run side by side (L2 reuse)
    vb, p, h, start, end, chunk0, slot = _segment_program(pid, seg_ptr, H, NVB)
    rk = mt.arange(0, K)
    rt = mt.arange(0, BT)
    cols = vb * BV + mt.arange(0, BV)
    if TRANSITION:
        state = _oriented((rk[:, None] == cols[None, :]).to(mt.float32), TRANSPOSED)
        u_cols = mt.where(cols >= K, cols - K, 0)
        u_on = cols >= K
    else:
        u_cols = cols
        u_on = cols < V
        if HAS_H0:
            if TRANSPOSED:
                state = mt.load(h0_ptr + p.to(mt.int64) * h0_sn + h * h0_sh + cols[:, None] * h0_sv
                                + rk[None, :] * h0_sk)
            else:
                state = mt.load(h0_ptr + p.to(mt.int64) * h0_sn + h * h0_sh + rk[:, None] * h0_sk
                                + cols[None, :] * h0_sv)
        elif TRANSPOSED:
            state = mt.zeros((BV, K), mt.float32)
        else:
            state = mt.zeros((K, BV), mt.float32)
    u_col0 = vb * BV  # first u column of this block (transition: negative on the M columns, which read no u)
    if TRANSITION:
        u_col0 = vb * BV - K
    if CARRIED:
        rt_h0 = rt * H
        base0 = start.to(mt.int64) * H + h
        row_k = rt_h0[:, None] * K + mt.arange(0, K)[None, :]
        w_ptrs = w_ptr + base0 * K + row_k
        if not TRANSITION:
            qg_ptrs = qg_ptr + base0 * K + row_k
            aqk_ptrs = aqk_ptr + base0 * BT + (rt_h0[:, None] * BT + rt[None, :])
    for t0 in range(start, end, BT):
        valid = t0 + rt < end
        # 64-bit only in the chunk's scalar base row; in-chunk offsets are i32 (fewer registers per element)
        base = t0.to(mt.int64) * H + h
        rt_h = rt * H
        if PREFETCH:
            ahead = t0 + BT + rt < end
            base_n = base + BT * H
            _prefetch_rows(w_ptr, base_n, rt_h, ahead, K, 0, LINES_K, 64, "L1")
            _prefetch_rows(kg_ptr, base_n, rt_h, ahead, K, 0, LINES_K, 64, "L1")
            if u_col0 >= 0:
                _prefetch_rows(u_ptr, base_n, rt_h, ahead, V, u_col0, LINES_V, 64, "L1")
            if not TRANSITION:
                _prefetch_rows(qg_ptr, base_n, rt_h, ahead, K, 0, LINES_K, 64, "L1")
                _prefetch_rows(aqk_ptr, base_n, rt_h, ahead, BT, 0, LINES_T, 64, "L1")
        if CARRIED:
            w = mt.load(w_ptrs, mask=valid[:, None], other=0.0)
            w_ptrs += BT * H * K
        else:
            w = mt.load(w_ptr + base * K + (rt_h[:, None] * K + rk[None, :]), mask=valid[:, None], other=0.0)
        if TRANSPOSED:
            kg = mt.load(kg_ptr + base * K + (rt_h[:, None] * K + rk[None, :]), mask=valid[:, None], other=0.0)
            u_t = mt.load(u_ptr + base * V + (rt_h[None, :] * V + u_cols[:, None]),
                          mask=valid[None, :] & u_on[:, None], other=0.0).to(mt.float32)
        else:
            kg_t = mt.load(kg_ptr + base * K + (rt_h[None, :] * K + rk[:, None]), mask=valid[None, :], other=0.0)
            u = mt.load(u_ptr + base * V + (rt_h[:, None] * V + u_cols[None, :]),
                        mask=valid[:, None] & u_on[None, :], other=0.0).to(mt.float32)
        chunk = chunk0 + (t0 - start) // BT
        decay = mt.load(decay_ptr + (chunk.to(mt.int64) * H + h) * K + rk)
        state_lo = state.to(mt.bfloat16)
        if FUSED_WQ:
            qg = mt.load(qg_ptr + base * K + (rt_h[:, None] * K + rk[None, :]), mask=valid[:, None], other=0.0)
            aqk = mt.load(aqk_ptr + base * BT + (rt_h[:, None] * BT + rt[None, :]), mask=valid[:, None], other=0.0)
        if FUSED_WQ and TRANSPOSED:  # S^T [w; qg]^T: [BV, 2 BT], v_new^T from its left half, o^T from its right
            sq = mt.dot(state_lo, mt.trans(mt.cat((w, qg), 0)), instruction=BIG_DOTS)
            v_t = u_t - sq[:, 0:BT]
            v_t_lo = v_t.to(mt.bfloat16)
            o_t = mt.dot(v_t_lo, mt.trans(aqk), sq[:, BT:2 * BT], instruction=BIG_DOTS)
            mt.store(o_ptr + base * V + (rt_h[None, :] * V + cols[:, None]), o_t, mask=valid[None, :])
        elif FUSED_WQ:
            wq_s = mt.dot(mt.cat((w, qg), 0), state_lo, instruction=BIG_DOTS)
            v_new = u - wq_s[0:BT, :]
            v_lo = v_new.to(mt.bfloat16)
            o = mt.dot(aqk, v_lo, wq_s[BT:2 * BT, :])
            if ACC_STORES:  # o's dot: [BT, BV] on warps [min(WARPS, BT / 16), rest] (mma.sync or wgmma alike)
                _store_block(o_ptr, base, t0, end, H, o, V, 0, BT, vb * BV, BV,
                             _accumulator_layout(min(WARPS, BT // 16), WARPS // min(WARPS, BT // 16)))
            else:
                mt.store(o_ptr + base * V + (rt_h[:, None] * V + cols[None, :]), o, mask=valid[:, None])
        elif TRANSPOSED:
            v_t = u_t - mt.dot(state_lo, mt.trans(w), instruction=BIG_DOTS)
            v_t_lo = v_t.to(mt.bfloat16)
        else:
            v_new = u - mt.dot(w, state_lo)
            v_lo = v_new.to(mt.bfloat16)
        if not TRANSITION and not FUSED_WQ:
            if CARRIED:
                qg = mt.load(qg_ptrs, mask=valid[:, None], other=0.0)
                aqk = mt.load(aqk_ptrs, mask=valid[:, None], other=0.0)
                qg_ptrs += BT * H * K
                aqk_ptrs += BT * H * BT
            else:
                qg = mt.load(qg_ptr + base * K + (rt_h[:, None] * K + rk[None, :]), mask=valid[:, None], other=0.0)
                aqk = mt.load(aqk_ptr + base * BT + (rt_h[:, None] * BT + rt[None, :]), mask=valid[:, None],
                              other=0.0)
            if TRANSPOSED:
                o_t = mt.dot(v_t_lo, mt.trans(aqk), mt.dot(state_lo, mt.trans(qg), instruction=BIG_DOTS),
                             instruction=BIG_DOTS)
                mt.store(o_ptr + base * V + (rt_h[None, :] * V + cols[:, None]), o_t, mask=valid[None, :])
            else:
                o = mt.dot(aqk, v_lo, mt.dot(qg, state_lo))
                mt.store(o_ptr + base * V + (rt_h[:, None] * V + cols[None, :]), o, mask=valid[:, None])
        if TRANSPOSED:
            if STATE_PRECISION == "tf32":
                state = state * decay[None, :] + mt.dot(v_t, kg.to(mt.float32), input_precision="tf32")
            elif STATE_PRECISION == "bf16x2":  # v_new^T = hi + lo: two dots on the same kg, the state accumulating
                v_t_rest = (v_t - v_t_lo.to(mt.float32)).to(mt.bfloat16)
                state = mt.dot(v_t_rest, kg, mt.dot(v_t_lo, kg, state * decay[None, :], instruction=BIG_DOTS),
                               instruction=BIG_DOTS)
            else:
                state = mt.dot(v_t_lo, kg, state * decay[None, :], instruction=BIG_DOTS)
        elif STATE_PRECISION == "tf32":  # v_new keeps 11 bits instead of 8 in the state it accumulates into
            state = state * decay[:, None] + mt.dot(kg_t.to(mt.float32), v_new, input_precision="tf32")
        elif STATE_PRECISION == "bf16x2":  # v_new = hi + lo in bf16 (16 bits; kg is bf16 already): one dot, K = 2 BT
            v_rest = (v_new - v_lo.to(mt.float32)).to(mt.bfloat16)
            if SPLIT_UPDATE:  # two dots on one kg^T operand: staged and read once, not as [kg^T kg^T]
                state = mt.dot(kg_t, v_rest, mt.dot(kg_t, v_lo, state * decay[:, None], instruction=BIG_DOTS),
                               instruction=BIG_DOTS)
            else:
                state = mt.dot(mt.cat((kg_t, kg_t), 1), mt.cat((v_lo, v_rest), 0), state * decay[:, None],
                               instruction=BIG_DOTS)
        else:
            state = state * decay[:, None] + mt.dot(kg_t, v_lo)
    if TRANSPOSED:
        at_kv = cols[:, None] * ht_sv + rk[None, :] * ht_sk  # the block's offsets in ht, as the state is held
        if TRANSITION:
            mt.store(ht_ptr + p.to(mt.int64) * ht_sn + h * ht_sh + at_kv, state)
        elif STORE_HT:
            if slot >= 0:
                mt.store(ht_ptr + slot.to(mt.int64) * ht_sn + h * ht_sh + at_kv, state)
    elif TRANSITION:
        mt.store(ht_ptr + p.to(mt.int64) * ht_sn + h * ht_sh + rk[:, None] * ht_sk + cols[None, :] * ht_sv, state)
    elif STORE_HT:
        if slot >= 0:
            mt.store(ht_ptr + slot.to(mt.int64) * ht_sn + h * ht_sh + rk[:, None] * ht_sk + cols[None, :] * ht_sv,
                     state)


@mt.kernel
def kda_recurrence_ws_kernel(w_tma, kg_tma, qg_tma, aqk_tma, u_ptr, decay_ptr, o_ptr, h0_ptr, ht_ptr, seg_ptr,
                             H, h0_sn, h0_sh, h0_sk, h0_sv, ht_sn, ht_sh, ht_sk, ht_sv,
                             K: mt.constexpr, V: mt.constexpr, BT: mt.constexpr, BV: mt.constexpr,
                             TRANSITION: mt.constexpr, HAS_H0: mt.constexpr, STORE_HT: mt.constexpr,
                             STAGES: mt.constexpr = 2, CONSUMER_REGISTERS: mt.constexpr = 232,
                             PRODUCER_REGISTERS: mt.constexpr = 40):
    """kda_recurrence_kernel's transposed bf16x2 recurrence, warp-specialized (RECURRENCE_WS): one (column block,
    segment, head) a program, its state held as S^T [BV, K] f32 wgmma accumulators on the kernel's BV / 16 consumer
    warps, and a producer warpgroup that TMA-loads each chunk's token tiles into rings STAGES chunks ahead.

    Per chunk, every product is a wgmma whose A is in registers (S^T, v_new^T rounded to bf16) and whose B is read
    in place from a ring slot:
        v_new^T = u^T - S^T w^T               B = w^T: the [BT, K] slot of w read K-major (B^T slot)
        o^T     = S^T qg^T + v_lo^T Aqk^T      (output mode) qg^T, Aqk^T likewise
        S^T     = S^T diag(decay) + v_lo^T kg + v_rest^T kg     kg: the [BT, K] slot as is (MN-major B)
    v_new^T = v_lo + v_rest in bf16 (STATE_PRECISION "bf16x2"). Tokens past the segment's end are zeroed in
    v_new^T (the TMA boxes read whatever rows follow: the next sequence's, or zeros past the tensor), so they add
    nothing to the state. u^T and decay are read by the consumers from global memory. The descriptors view the
    [tokens, H, C] intermediates as [tokens, H * C] in [BT, 64] boxes (`_ws_descriptors`).

    Modes, segment rows, transition columns and state strides as kda_recurrence_kernel's (TRANSPOSED)."""
    NVB = (K + V) // BV if TRANSITION else V // BV
    pid = mt.program_id(0)  # column blocks fastest, as kda_recurrence_kernel
    vb, p, h, start, end, chunk0, slot = _segment_program(pid, seg_ptr, H, NVB)
    w_ring = mt.ring((BT, K), mt.bfloat16, STAGES)
    kg_ring = mt.ring((BT, K), mt.bfloat16, STAGES)
    if not TRANSITION:  # the output pass's tiles
        qg_ring = mt.ring((BT, K), mt.bfloat16, STAGES)
        aqk_ring = mt.ring((BT, BT), mt.bfloat16, STAGES)
    decay_ring = mt.ring((1, K), mt.float32, STAGES)  # filled from the producer's registers
    with mt.warp_specialize():
        with mt.partition(registers=CONSUMER_REGISTERS):  # the consumers: the state and every product
            rk = mt.arange(0, K)
            rt = mt.arange(0, BT)
            cols = vb * BV + mt.arange(0, BV)
            if TRANSITION:
                state = (cols[:, None] == rk[None, :]).to(mt.float32)
                u_cols = mt.where(cols >= K, cols - K, 0)
                u_on = cols >= K
            else:
                u_cols = cols
                u_on = cols < V
                if HAS_H0:
                    state = mt.load(h0_ptr + p.to(mt.int64) * h0_sn + h * h0_sh + cols[:, None] * h0_sv
                                    + rk[None, :] * h0_sk)
                else:
                    state = mt.zeros((BV, K), mt.float32)
            u_col0 = vb * BV - K if TRANSITION else vb * BV  # first u column of the block (< 0: M columns, no u)
            fill = 0
            for t0 in range(start, end, BT):
                valid = t0 + rt < end
                base = t0.to(mt.int64) * H + h
                rt_h = rt * H
                if u_col0 >= 0:  # the next chunk's u rows into L1: the one global load on the chain
                    _prefetch_rows(u_ptr, base + BT * H, rt_h, t0 + BT + rt < end, V, u_col0, BV // 64, 64, "L1")
                # u^T straight into the accumulator's thread map (no exchange through shared memory)
                u_t = mt.load(u_ptr + base * V + (rt_h[None, :] * V + u_cols[:, None]),
                              mask=valid[None, :] & u_on[:, None], other=0.0,
                              layout=_accumulator_layout(BV // 16, 1)).to(mt.float32)
                state_lo = state.to(mt.bfloat16)
                # v_new^T = -(S^T w^T - u^T): u^T is the dot's accumulator (no registers of its own past it)
                sw = mt.dot(state_lo, mt.trans(w_ring.get(fill)), -u_t)
                if not TRANSITION:  # issued right behind S^T w^T: the two run together (defer-dot-waits)
                    o_t = mt.dot(state_lo, mt.trans(qg_ring.get(fill)))
                v_t = mt.where(valid[None, :], -sw, 0.0)
                v_lo = v_t.to(mt.bfloat16)
                v_rest = (v_t - v_lo.to(mt.float32)).to(mt.bfloat16)
                if not TRANSITION:
                    o_t = mt.dot(v_lo, mt.trans(aqk_ring.get(fill)), o_t)
                kg = kg_ring.get(fill)
                decay = decay_ring.get(fill)  # [1, K]: read from shared memory where it is used
                state = mt.dot(v_rest, kg, mt.dot(v_lo, kg, state * decay))
                if not TRANSITION:  # stored after the update dots issue: they run while o^T goes out
                    mt.store(o_ptr + base * V + (rt_h[None, :] * V + cols[:, None]), o_t, mask=valid[None, :],
                             layout=_accumulator_layout(BV // 16, 1))
                    qg_ring.release(fill)
                    aqk_ring.release(fill)
                w_ring.release(fill)
                kg_ring.release(fill)
                decay_ring.release(fill)
                fill += 1
            at_kv = cols[:, None] * ht_sv + rk[None, :] * ht_sk  # the block's offsets in ht, as the state is held
            if TRANSITION:
                mt.store(ht_ptr + p.to(mt.int64) * ht_sn + h * ht_sh + at_kv, state)
            elif STORE_HT:
                if slot >= 0:
                    mt.store(ht_ptr + slot.to(mt.int64) * ht_sn + h * ht_sh + at_kv, state)
        with mt.partition(warps=4, registers=PRODUCER_REGISTERS):  # the producer: a chunk's tiles by TMA
            rk_p = mt.arange(0, K)
            fill = 0
            for t0 in range(start, end, BT):
                chunk = chunk0 + (t0 - start) // BT
                decay_ring.put(fill, mt.load(decay_ptr + (chunk.to(mt.int64) * H + h) * K + rk_p)[None, :])
                w_ring.put(fill, w_tma, [t0, h * K])
                kg_ring.put(fill, kg_tma, [t0, h * K])
                if not TRANSITION:
                    qg_ring.put(fill, qg_tma, [t0, h * K])
                    aqk_ring.put(fill, aqk_tma, [t0, h * BT])
                fill += 1


@mt.kernel(min_blocks_per_sm=1)
def kda_merge_kernel(maps_ptr, h0_ptr, s_in_ptr, seq_ptr, H, h0_sn, h0_sh, h0_sk, h0_sv,
                     K: mt.constexpr, V: mt.constexpr, BV: mt.constexpr, HAS_H0: mt.constexpr,
                     PRECISION: mt.constexpr = "ieee", MB: mt.constexpr = 64, PREFETCH: mt.constexpr = False):
    """One (column block, sequence, head): the incoming state of each of the sequence's segments,
    S_0 = h0, S_{j+1} = M_j S_j + E_j, composed in f32 (PRECISION "ieee": CUDA-core FMAs; "tf32x3": three tf32
    mma.sync per K step, ~2^-21 relative per product). seq_ptr rows: (first segment, segments, first map).
    maps are [maps, H, K, K+V] f32 ([M | E]); s_in is [segments, H, K, V] f32.

    PREFETCH (MERGE_PREFETCH; K and BV multiples of 32): each step first asks the next map's M rows and E columns
    into L1, so that the chain's next loads (64 KB of M at K = 128) do not start only after this step's dot."""
    NVB = V // BV
    pid = mt.program_id(0)
    vb = pid % NVB
    nh = pid // NVB
    n = nh // H
    h = nh % H
    first = mt.load(seq_ptr + 3 * n)
    count = mt.load(seq_ptr + 3 * n + 1)
    map0 = mt.load(seq_ptr + 3 * n + 2)
    rk = mt.arange(0, K)
    cols = vb * BV + mt.arange(0, BV)
    if HAS_H0:
        state = mt.load(h0_ptr + n.to(mt.int64) * h0_sn + h * h0_sh + rk[:, None] * h0_sk + cols[None, :] * h0_sv)
    else:
        state = mt.zeros((K, BV), mt.float32)
    mt.store(s_in_ptr + ((first.to(mt.int64) * H + h) * K + rk[:, None]) * V + cols[None, :], state)
    for j in range(0, count - 1):
        base = ((map0 + j).to(mt.int64) * H + h) * K * (K + V)
        if PREFETCH:
            ahead = base + H * K * (K + V)  # map j + 1 of this head, when there is one
            more = (rk[:, None] * 0 + j + 1) < count - 1
            m_lines = mt.arange(0, K // 32) * 32  # one pointer per 128-byte line of f32
            e_lines = K + vb * BV + mt.arange(0, BV // 32) * 32
            mt.prefetch(maps_ptr + ahead + rk[:, None] * (K + V) + m_lines[None, :], mask=more, level="L1")
            mt.prefetch(maps_ptr + ahead + rk[:, None] * (K + V) + e_lines[None, :], mask=more, level="L1")
        if PRECISION == "ieee":
            m = mt.load(maps_ptr + base + rk[:, None] * (K + V) + rk[None, :])
            e = mt.load(maps_ptr + base + rk[:, None] * (K + V) + K + cols[None, :])
            state = mt.dot(m, state, e)
        else:  # in row blocks of MB: a [K, K] f32 A operand would not fit the shared-memory budget
            parts = ()
            for r in mt.static_range(K // MB):
                rows = r * MB + mt.arange(0, MB)
                m = mt.load(maps_ptr + base + rows[:, None] * (K + V) + rk[None, :])
                e = mt.load(maps_ptr + base + rows[:, None] * (K + V) + K + cols[None, :])
                parts = parts + (mt.dot(m, state, e, input_precision=PRECISION),)
            state = mt.cat(parts, 0)
        mt.store(s_in_ptr + (((first + j + 1).to(mt.int64) * H + h) * K + rk[:, None]) * V + cols[None, :], state)


# ------------------------------------------------------------------------------------------------ host side


@dataclass
class Plan:
    """How the tokens are cut: sequences (start, end), chunks (start, end) and segments per sequence."""

    sequences: list[tuple[int, int]]
    chunks: list[tuple[int, int]]
    first_chunk: list[int]  # per sequence
    segments: list[list[tuple[int, int]]]  # per sequence: (start, end) token ranges, multiples of CHUNK long

    @property
    def split(self) -> bool:
        return any(len(s) > 1 for s in self.segments)

    def segment_rows(self, n: int, final_slot: int) -> list[tuple[int, int, int, int]]:
        """Phase-2 table rows (start, end, first chunk, final-state slot) of sequence n's segments; only the last
        segment stores a final state (into slot `final_slot`), the others have -1."""
        seq_start = self.sequences[n][0]
        segs = self.segments[n]
        return [(s, e, self.first_chunk[n] + (s - seq_start) // CHUNK, final_slot if j == len(segs) - 1 else -1)
                for j, (s, e) in enumerate(segs)]


def plan(sequences: list[tuple[int, int]], seg_len: int | None) -> Plan:
    """Chunks of every sequence (the last may be partial) and, with seg_len, its segments of seg_len tokens."""
    chunks, first, segments = [], [], []
    for start, end in sequences:
        first.append(len(chunks))
        chunks += [(c, min(c + CHUNK, end)) for c in range(start, end, CHUNK)]
        if seg_len is None or end - start <= seg_len:
            segments.append([(start, end)])
        else:
            segments.append([(s, min(s + seg_len, end)) for s in range(start, end, seg_len)])
    return Plan(list(sequences), chunks, first, segments)


def segment_length(lengths: list[int], programs: int, num_sms: int, force: bool | None,
                   segment_len: int | None) -> int | None:
    """The context-parallel segment length in tokens, or None for no split.

    Automatic (force None): split only when the recurrence's programs (sequences x heads x column blocks) leave
    the SMs idle: splits = SMs // programs (at most MAX_SPLITS) must be >= 3 and the longest sequence >= 3
    MIN_SEGMENT tokens; segments are >= MIN_SEGMENT. force=True splits the longest sequence in at least 2;
    segment_len (a multiple of 64) overrides the length whenever splitting is not forced off."""
    if force is False or not lengths:
        return None
    if segment_len is not None:
        if segment_len <= 0 or segment_len % CHUNK:
            raise ValueError(f"cp_segment_len must be a positive multiple of {CHUNK}, got {segment_len}")
        return segment_len
    longest = max(lengths)
    splits = min(MAX_SPLITS, num_sms // max(programs, 1))
    if force is None:
        if splits < 3 or longest < 3 * MIN_SEGMENT:
            return None
        return max(MIN_SEGMENT, CHUNK * math.ceil(longest / splits / CHUNK))
    return max(CHUNK, CHUNK * math.ceil(longest / max(splits, 2) / CHUNK))


@dataclass
class Tables:
    """The int32 tables the kernels read, built once per (sequence bounds, segment length, device)."""

    plan: Plan
    chunks: torch.Tensor  # [chunks, 2]: token start, end
    segments: torch.Tensor  # [segments, 4]: phase-2 rows over every segment (final slot = sequence, last only)
    maps: torch.Tensor  # [maps, 4]: the segments whose transition maps are needed (all but each sequence's last)
    sequences: torch.Tensor  # [sequences, 3]: first segment, number of segments, first map


@functools.lru_cache(maxsize=64)
def launch_tables(sequences: tuple[tuple[int, int], ...], seg_len: int | None, device: str) -> Tables:
    p = plan(list(sequences), seg_len)
    segments, maps, seqs = [], [], []
    for n in range(len(p.sequences)):
        rows = p.segment_rows(n, final_slot=n)
        seqs.append((len(segments), len(rows), len(maps)))
        segments += rows
        maps += [(s, e, c, -1) for s, e, c, _ in rows[:-1]]  # the last segment's map is never needed
    dev = torch.device(device)
    return Tables(p, _table(p.chunks, 2, dev), _table(segments, 4, dev), _table(maps, 4, dev), _table(seqs, 3, dev))


def _table(rows: list[tuple[int, ...]], width: int, device: torch.device) -> torch.Tensor:
    t = torch.tensor(rows, dtype=torch.int32) if rows else torch.zeros((0, width), dtype=torch.int32)
    return t.reshape(-1, width).contiguous().to(device)


def _launch(kernel, grid: tuple[int, ...], args: tuple, **constexprs) -> None:
    """Every launch goes through here (one seam: tests record the launches to replay them elsewhere)."""
    kernel[grid](*args, **constexprs)


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if POISON_BUFFERS:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def _pow2(x: int) -> bool:
    return x >= 1 and x & (x - 1) == 0


def _check_inputs(q, k, v, g, beta, A_log, dt_bias, lower_bound, initial_state, cu, state_v_first) -> None:
    """ValueError naming the problem; `cu` is cu_seqlens as a Python list (or None)."""
    if q.dim() != 4 or k.shape != q.shape or g.shape != q.shape:
        raise ValueError(f"q, k and g must share one shape [B, T, H, K]; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, g {tuple(g.shape)}")
    B, T, H, K = q.shape
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be [B, T, H, V] with q's B, T, H (no grouped value heads); got {tuple(v.shape)}")
    V = v.shape[-1]
    if beta.shape != q.shape[:3]:
        raise ValueError(f"beta must be [B, T, H] = {tuple(q.shape[:3])}, got {tuple(beta.shape)}")
    for name, d in (("K", K), ("V", V)):
        if not _pow2(d) or d < 16 or d > 256:
            raise ValueError(f"head dim {name} = {d} is not supported: it must be a power of two in [16, 256]")
    if not -5.0 <= lower_bound < 0.0:
        raise ValueError(f"lower_bound must be in [-5, 0) (safe gate: the 16-token decay span must fit the f32 "
                         f"exponent range), got {lower_bound}")
    if A_log is not None and A_log.numel() != H:
        raise ValueError(f"A_log must have H = {H} elements, got {A_log.numel()}")
    if dt_bias is not None and dt_bias.numel() != H * K:
        raise ValueError(f"dt_bias must have H*K = {H * K} elements, got {dt_bias.numel()}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"{name} must be bf16, f16 or f32, got {x.dtype}")
    if cu is not None:
        if B != 1:
            raise ValueError(f"with cu_seqlens the batch size must be 1 (packed sequences), got B = {B}")
        if len(cu) < 2 or cu[0] != 0 or cu[-1] != T or any(b < a for a, b in zip(cu, cu[1:])):
            raise ValueError(f"cu_seqlens must be a non-decreasing 1-D tensor from 0 to T = {T}, got {cu}")
    N = B if cu is None else len(cu) - 1
    if initial_state is not None:
        want = (N, H, V, K) if state_v_first else (N, H, K, V)
        if tuple(initial_state.shape) != want:
            raise ValueError(f"initial_state must be {list(want)} ({'[N,H,V,K]' if state_v_first else '[N,H,K,V]'}"
                             f"), got {list(initial_state.shape)}")
        if initial_state.dtype != torch.float32:
            raise ValueError(f"initial_state must be float32, got {initial_state.dtype}")
    if q.device.type == "cpu" and not interpreting():
        raise ValueError("chunk_kda got CPU tensors: run on CUDA tensors, or set MINITRITON_INTERPRET=1 to run the "
                         "kernels through the interpreter")


@functools.lru_cache(maxsize=16)
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_NUM_SMS


def _state_strides(x: torch.Tensor, v_first: bool) -> tuple[int, int, int, int]:
    """(n, h, k, v) element strides of a state tensor stored [N,H,K,V] or, V-first, [N,H,V,K]."""
    sn, sh, s2, s3 = x.stride()
    return (sn, sh, s3, s2) if v_first else (sn, sh, s2, s3)


def chunk_kda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
              A_log: torch.Tensor | None, dt_bias: torch.Tensor | None, lower_bound: float = -5.0,
              scale: float | None = None, initial_state: torch.Tensor | None = None,
              output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None,
              state_v_first: bool = False, context_parallel: bool | None = None,
              cp_segment_len: int | None = None,
              intra_variant: str | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """KDA prefill with fla `chunk_kda` semantics (L2 norm, gate, beta sigmoid in kernel; safe floored gate).

    q, k [B,T,H,K], v [B,T,H,V] (bf16; f16/f32 also accepted), g the raw gate input [B,T,H,K], beta raw logits
    [B,T,H], A_log [H] f32, dt_bias [H*K] f32 (None: no bias / exp(A_log) = 1). States are f32 [N,H,K,V]
    ([N,H,V,K] with state_v_first); N = B, or len(cu_seqlens) - 1 for packed varlen input (B == 1; cu_seqlens is
    read on the host). K and V: powers of two in [16, 256]; any T.
    context_parallel: None decides from the shapes, True / False force segment splitting on / off;
    cp_segment_len (a multiple of 64) fixes the segment length when splitting.
    intra_variant: the phase-1 kernel (one of INTRA_VARIANTS; None: the module's INTRA_VARIANT).
    Returns (o [B,T,H,V] in q.dtype, final state f32 or None).
    """
    cu = None if cu_seqlens is None else [int(x) for x in cu_seqlens.reshape(-1).tolist()]
    _check_inputs(q, k, v, g, beta, A_log, dt_bias, lower_bound, initial_state, cu, state_v_first)
    B, T, H, K = q.shape
    V = v.shape[-1]
    dev = q.device
    scale = K ** -0.5 if scale is None else float(scale)
    bounds = tuple((b * T, b * T + T) for b in range(B)) if cu is None else tuple(zip(cu[:-1], cu[1:]))
    N = len(bounds)
    bv = min(V, STATE_BLOCK)
    seg_len = segment_length([e - s for s, e in bounds], N * H * (V // _planned_block(K, V, bv)), _num_sms(dev),
                             context_parallel, cp_segment_len)
    tables = launch_tables(bounds, seg_len, str(dev))

    factors = _intra_chunk(q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, tables,
                           INTRA_VARIANT if intra_variant is None else intra_variant)
    o = _empty((B * T, H, V), q.dtype, dev)
    final = None
    if output_final_state:
        final = _empty((N, H, V, K) if state_v_first else (N, H, K, V), torch.float32, dev)
    h0 = initial_state.contiguous() if initial_state is not None else None
    h0_v_first = state_v_first
    if tables.plan.split:  # every segment starts from its true incoming state; the last one ends the sequence
        h0, h0_v_first = _segment_states(factors, tables, h0, state_v_first, H, K, V), False
    _recurrence(factors, o, h0, h0_v_first, final, state_v_first, tables.segments, H, K, V, bv, transition=False)
    return o.reshape(B, T, H, V), final


def _planned_block(K: int, V: int, bv: int) -> int:
    """The state columns a recurrence program holds, as the context-parallel planner counts programs."""
    if RECURRENCE_WS and WS_CP_PROGRAMS and ws_recurrence_fits(K, V):
        return ws_state_block(K, V)
    return bv


def _intra_chunk(q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, tables: Tables,
                 variant: str) -> dict[str, torch.Tensor]:
    """Phase 1 over every chunk: the bf16 intermediates of the recurrence."""
    B, T, H, K = q.shape
    variant = intra_variant_for(variant, K)
    V = v.shape[-1]
    dev = q.device
    tokens, n_chunks = B * T, tables.chunks.shape[0]
    out = {
        "w": _empty((tokens, H, K), torch.bfloat16, dev), "u": _empty((tokens, H, V), torch.bfloat16, dev),
        "kg": _empty((tokens, H, K), torch.bfloat16, dev), "qg": _empty((tokens, H, K), torch.bfloat16, dev),
        "aqk": _empty((tokens, H, CHUNK), torch.bfloat16, dev),
        "decay": _empty((max(n_chunks, 1), H, K), torch.float32, dev),
    }
    if n_chunks == 0:
        return out
    a_log = torch.zeros(H, device=dev) if A_log is None else A_log.reshape(H).float().contiguous()
    bias = torch.zeros(H * K, device=dev) if dt_bias is None else dt_bias.reshape(H * K).float().contiguous()
    args = (q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(), a_log, bias,
            tables.chunks, out["w"], out["u"], out["kg"], out["qg"], out["aqk"], out["decay"],
            H, scale, float(lower_bound))
    scan: dict = {}  # the sliced kernel's gate layout (INTRA_SCAN_LAYOUT)
    if variant == "sub16":
        shift = round(SUB * abs(lower_bound) / 2 * RCP_LN2)  # half the worst 16-row decay span, in log2 units
        kernel, args = kda_intra_chunk_sub16_kernel, args + (float(2.0 ** shift), float(2.0 ** -shift))
    elif variant == "chunk64":
        kernel = kda_intra_chunk_kernel
    elif variant == "wg":
        _launch(_with_blocks_per_sm(kda_intra_chunk_wg_kernel, WG_BLOCKS_PER_SM, "WG_BLOCKS_PER_SM"), (n_chunks, H), args, K=K, V=V, BT=CHUNK,
                SCORE_SPLIT=WG_SCORE_SPLIT, SOLVE_PRECISION=WG_SOLVE_PRECISION, WY_SPLIT=WG_WY_SPLIT,
                PREFETCH=INTRA_PREFETCH, num_warps=4)
        return out
    else:
        kernel = _with_blocks_per_sm(kda_intra_chunk_sliced_kernel, INTRA_BLOCKS_PER_SM, "INTRA_BLOCKS_PER_SM")
        if INTRA_SCAN_LAYOUT or ACC_STORES or STRUCTURED_SOLVE or INTRA_PREFETCH or SCORE_CHAINS != 1:
            scan = dict(SCAN_LAYOUT=INTRA_SCAN_LAYOUT, WARPS=INTRA_WARPS, ACC_STORES=ACC_STORES,
                        STRUCTURED=STRUCTURED_SOLVE, PREFETCH=INTRA_PREFETCH, CHAINS=SCORE_CHAINS)
    _launch(kernel, (n_chunks, H), args, K=K, V=V, BT=CHUNK, SOLVE_PRECISION="tf32", num_warps=INTRA_WARPS, **scan)
    return out


_BY_BLOCKS: dict[tuple[str, int], object] = {}


def _with_blocks_per_sm(kernel, blocks_per_sm: int, knob: str):
    """`kernel` compiled for `blocks_per_sm` resident programs an SM (ptxas's .minnctapersm), as module constant
    `knob` (INTRA_BLOCKS_PER_SM, WG_BLOCKS_PER_SM) asks: the kernel itself when that is its own, else a copy."""
    if not isinstance(blocks_per_sm, int) or not 1 <= blocks_per_sm <= 4:
        raise ValueError(f"flash_kda.{knob} must be 1, 2, 3 or 4, got {blocks_per_sm!r}")
    if blocks_per_sm == kernel.min_blocks_per_sm:
        return kernel
    key = (kernel.__name__, blocks_per_sm)
    if key not in _BY_BLOCKS:
        _BY_BLOCKS[key] = mt.kernel(**kernel.options, min_blocks_per_sm=blocks_per_sm)(kernel.fn)
    return _BY_BLOCKS[key]


def intra_variant_for(variant: str, K: int) -> str:
    """The phase-1 kernel that runs for `variant` at head dim K: "sliced" above SLICED_MAX_K runs "sub16" (its
    [64, K] gate cumsum needs 64 KB of shared memory at K = 256, over the 48 KB static budget)."""
    if variant not in INTRA_VARIANTS:
        raise ValueError(f"the phase-1 variant must be one of {INTRA_VARIANTS}, got {variant!r}")
    return "sub16" if variant in ("sliced", "wg") and K > SLICED_MAX_K else variant


def _recurrence(f: dict[str, torch.Tensor], o: torch.Tensor | None, h0: torch.Tensor | None, h0_v_first: bool,
                ht: torch.Tensor | None, ht_v_first: bool, segments: torch.Tensor, H: int, K: int, V: int, bv: int,
                transition: bool) -> None:
    """Phase 2 over the rows of `segments` (start, end, first chunk, final-state slot). Unused pointer arguments
    get a harmless tensor (never read: the constexpr flags remove those accesses)."""
    if segments.shape[0] == 0:
        return
    if STATE_PRECISION not in ("tf32", "bf16", "bf16x2"):
        raise ValueError(f"flash_kda.STATE_PRECISION = {STATE_PRECISION!r}: expected 'bf16x2', 'tf32' or 'bf16'")
    precision = STATE_PRECISION
    spare = f["decay"]
    h0_strides = _state_strides(h0, h0_v_first) if h0 is not None else (0, 0, 0, 0)
    ht_strides = _state_strides(ht, ht_v_first) if ht is not None else (0, 0, 0, 0)
    width = K + V if transition else V
    if RECURRENCE_WS and ws_recurrence_fits(K, V):
        _recurrence_ws(f, o, h0, h0_v_first, ht, ht_v_first, segments, H, K, V, transition)
        return
    programs = width // bv * segments.shape[0] * H
    warps = recurrence_warps(programs, _num_sms(segments.device))
    _launch(kda_recurrence_kernel, (programs,), (
        f["w"], f["u"], f["kg"], f["qg"], f["aqk"], f["decay"], o if o is not None else f["u"],
        h0 if h0 is not None else spare, ht if ht is not None else spare, segments,
        H, *h0_strides, *ht_strides), K=K, V=V, BT=CHUNK, BV=bv, TRANSITION=transition, HAS_H0=h0 is not None,
        STORE_HT=ht is not None, STATE_PRECISION=precision, CARRIED=RECURRENCE_CARRIED,
        PREFETCH=RECURRENCE_PREFETCH, LINES_K=_lines(K), LINES_V=_lines(bv), LINES_T=_lines(CHUNK),
        TRANSPOSED=RECURRENCE_TRANSPOSED, FUSED_WQ=RECURRENCE_FUSED_WQ and not (transition or RECURRENCE_CARRIED),
        ACC_STORES=ACC_STORES, WARPS=warps, BIG_DOTS="auto" if RECURRENCE_WGMMA else "mma",
        SPLIT_UPDATE=RECURRENCE_SPLIT_UPDATE, num_warps=warps)


WS_BOX_COLUMNS = 64  # TMA boxes of the warp-specialized recurrence: [BT, 64] bf16, one 128-byte swizzle row each


def _ws_descriptors(f: dict[str, torch.Tensor], H: int) -> tuple[mt.TensorDescriptor, ...]:
    """w, kg, qg and Aqk ([tokens, H, C] bf16) viewed as [tokens, H * C] in [CHUNK, 64] boxes: head h's chunk at
    token t0 is the box row t0, columns h * C onwards."""
    out = []
    for name in ("w", "kg", "qg", "aqk"):
        x = f[name]
        flat = x.reshape(x.shape[0], H * x.shape[2])
        out.append(mt.TensorDescriptor.from_tensor(flat, [CHUNK, WS_BOX_COLUMNS]))
    return tuple(out)


def ws_recurrence_fits(K: int, V: int) -> bool:
    """Whether kda_recurrence_ws_kernel takes heads of K x V (its TMA boxes are 64 columns wide, its state block a
    multiple of one warpgroup's 64 rows); other heads run kda_recurrence_kernel (with the bf16x2 update, which the
    warp-specialized kernel always uses)."""
    return K % WS_BOX_COLUMNS == 0 and ws_state_block(K, V) % 64 == 0 and STATE_PRECISION == "bf16x2"


def ws_state_block(K: int, V: int) -> int:
    """The state columns one kda_recurrence_ws_kernel program holds (its BV)."""
    return min(WS_STATE_BLOCK, V, K)


def _recurrence_ws(f: dict[str, torch.Tensor], o: torch.Tensor | None, h0: torch.Tensor | None, h0_v_first: bool,
                   ht: torch.Tensor | None, ht_v_first: bool, segments: torch.Tensor, H: int, K: int, V: int,
                   transition: bool) -> None:
    """_recurrence with kda_recurrence_ws_kernel (RECURRENCE_WS): WS_STATE_BLOCK columns a program."""
    bv = ws_state_block(K, V)
    spare = f["decay"]
    h0_strides = _state_strides(h0, h0_v_first) if h0 is not None else (0, 0, 0, 0)
    ht_strides = _state_strides(ht, ht_v_first) if ht is not None else (0, 0, 0, 0)
    programs = (K + V if transition else V) // bv * segments.shape[0] * H
    _launch(kda_recurrence_ws_kernel, (programs,), (
        *_ws_descriptors(f, H), f["u"], f["decay"], o if o is not None else f["u"],
        h0 if h0 is not None else spare, ht if ht is not None else spare, segments,
        H, *h0_strides, *ht_strides), K=K, V=V, BT=CHUNK, BV=bv, TRANSITION=transition, HAS_H0=h0 is not None,
        STORE_HT=ht is not None, STAGES=WS_STAGES, CONSUMER_REGISTERS=WS_CONSUMER_REGISTERS,
        PRODUCER_REGISTERS=WS_PRODUCER_REGISTERS, num_warps=bv // 16)


def _lines(elements: int, itemsize: int = 2) -> int:
    """128-byte lines a row of `elements` bf16 spans (at least 1: a short row is one line's piece)."""
    return max(1, elements * itemsize // 128)


def recurrence_warps(programs: int, num_sms: int) -> int:
    """Phase-2 warps per program: RECURRENCE_WARPS when set, else 4.

    Two 4-warp programs share an SM (8-warp ones fill its registers: 255 x 256 threads), so a launch of more
    programs than SMs (H = 96: 192) runs in one wave with one program's stalls behind the other's: 12% faster than
    8 warps (2026-11-29). Where the programs fit one per SM anyway, 8 warps were kept on the theory that they halve
    each program's serial instruction stream; measured, 4 warps were still faster (B1 T8192 H12, output pass 120
    programs: recurrence 475.8 us against 486.5 with 8 there, 2026-12-02 20:00 UTC), as the chunk chain is
    latency-bound, not issue-bound. `programs` and `num_sms` are kept for a rule the measurements may yet need."""
    if RECURRENCE_WARPS is not None:
        return RECURRENCE_WARPS
    return 4


def _segment_states(f: dict[str, torch.Tensor], tables: Tables, h0: torch.Tensor | None, h0_v_first: bool,
                    H: int, K: int, V: int) -> torch.Tensor:
    """Context parallelism: the maps [M | E] of every segment but each sequence's last (in parallel), then their
    composition into every segment's true incoming state, [segments, H, K, V] f32 (K-first)."""
    dev = tables.segments.device
    maps = _empty((max(tables.maps.shape[0], 1), H, K, K + V), torch.float32, dev)
    _recurrence(f, None, None, False, maps, False, tables.maps, H, K, V, min(K, V, STATE_BLOCK), transition=True)
    s_in = _empty((tables.segments.shape[0], H, K, V), torch.float32, dev)
    bv = min(V, STATE_BLOCK)
    h0_strides = _state_strides(h0, h0_v_first) if h0 is not None else (0, 0, 0, 0)
    _launch(kda_merge_kernel, (V // bv * tables.sequences.shape[0] * H,), (
        maps, h0 if h0 is not None else s_in, s_in, tables.sequences, H, *h0_strides),
        K=K, V=V, BV=bv, HAS_H0=h0 is not None, PRECISION=MERGE_PRECISION, MB=min(K, 64),
        PREFETCH=MERGE_PREFETCH and K % 32 == 0 and bv % 32 == 0, num_warps=MERGE_WARPS)
    return s_in


__all__ = ["chunk_kda", "kda_intra_chunk_kernel", "kda_intra_chunk_sub16_kernel", "kda_intra_chunk_sliced_kernel",
           "kda_recurrence_kernel", "kda_recurrence_ws_kernel", "INTRA_VARIANTS", "intra_variant_for",
           "kda_merge_kernel", "segment_length", "recurrence_warps",
           "plan", "Plan", "launch_tables", "CHUNK"]
