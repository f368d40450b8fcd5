"""WarpDecode MXFP4 MoE decode: two DSL kernels per MoE layer, output-centric ("one warp per output neuron").

    w13 = prepare_experts(gate_up_blocks, gate_up_scales)   # offline: [E, 2I, D/2] + [E, 2I, D/32] -> stream layout
    w2 = prepare_experts(down_blocks, down_scales)          # offline: [E, D, I/2] + [E, D, I/32]
    y = moe_decode(x, topk_ids, topk_weights, w13, w2)      # x [B, D] bf16 -> y [B, D] bf16

For token b with routed experts e_j and weights w_j:
    h_bj = silu(W13[e_j, :I] @ x_b) * (W13[e_j, I:] @ x_b)          kernel 1 (gate_up_kernel), h in fp32
    y_b  = sum_j w_j * (W2[e_j] @ h_bj)                             kernel 2 (down_kernel), weighted combine fused

Work decomposition (docs/kernels/warp_decode.md has the full story):
- A program owns ROWS weight rows (output neurons; ROWS = num_warps on the CUDA-core path, so each warp owns one
  row) and loops over *work items*. A work item is one expert together with up to NT (token, slot) pairs routed to
  it, so the expert's rows are streamed from HBM once for all of those tokens. With B = 1 the items are simply the
  k pairs (no preparation at all: two kernel launches per layer); for B > 1 `make_routing` groups the pairs by
  expert with a stable torch.sort of the ids and one single-program DSL kernel (route_items_kernel) that finds the
  item boundaries: no host sync, CUDA-graph capturable.
- Lane teams: the [ROWS, TEAMS, BLOCKS, 16] byte tile gives each row TEAMS items at once; a team of 32/TEAMS lanes
  covers BLOCKS MX blocks (16 bytes = 32 weights = one scale per lane) of its item's row and reduces over its
  lanes; the down kernel then sums the teams' weighted results per token (the reduction over the team axis).
  Short rows, and row lengths that are not a multiple of 32 blocks, keep every lane busy this way.
- Dequantization is integer bit work in the DSL: an E2M1 nibble's E E M bits go to f32 bits 24..22 and its sign
  to bit 31; multiplying by 2**126 gives the exact value (codes 0/1 become f32 subnormals first, so the compiler must
  not flush denormals). The E8M0 byte becomes 2**(s - 127) from bits (s << 23), 0x00 -> 2**-127 (subnormal), and
  0xFF -> NaN as the OCP spec says. The CUDA-core path applies each scale once per 32-weight block to the fp32
  partial sum; the tensor-core path (mt.dot, batch >= 2) builds the weights directly in bf16 and scales them there
  (exact), two weights per instruction (the codegen packs bf16 pairs: HMUL2).
- The v6 layout (prepare_experts(layout="v6"), the v6 variants): the code bits of each word are scattered offline so
  that its four bf16 pairs come out with one and, or a rotate and an and (one pair: and, multiply, and): 8
  instructions per 8 weights instead of 13; pairs of adjacent elements, so the vector operand is used as loaded;
  scale bytes stored as s + 126 (one multiply makes the bf16 scale pair). K loop: 404 -> 272 SASS per step.
- Two weights per 32-bit word (the v4 / v5 variants, DOT_VARIANTS): the nibbles of two weights are placed in the two
  16-bit halves of one word by one and / multiply / and, and `mt.bitcast_split` (a width-changing bitcast) hands
  the word to the mma as a bf16 pair; the 2**126 bias rides on the scale when every scale byte allows it; v5 reads
  int32 words and orders K by the nibble positions in each word, so no byte permute is needed at all.
- Tensor-core operands from registers: the mt.dot path loads a step's bytes as [H, R, 4, 16] (lane (g, t) = row
  g and g + 8, block t of each group of 4), the lane order of the m16n8k16 A fragments, and the vectors likewise
  (lane (g, t) = vector g, block t); `fragment_a` / `fragment_b` relabel K (reshape + trans, register renames), so
  the dequantized weights feed mma.sync without shared memory (dot-lowering anchors the operand's reshape to the
  fragment layout; tiling carries layouts through dim-splitting reshapes).
- Latency hiding: both paths prefetch the next step's weight bytes into registers, and an *item split* (grid axis
  1) spreads the work items over enough programs to fill the GPU (the mt.dot path has one warp per 16 rows); the
  down kernel's splits write fp32 partials that the host sums in a fixed order.
- prepare_experts pads each row to whole 32-element blocks (16-byte aligned rows) and permutes the nibbles inside
  every block so byte j holds elements j (low nibble) and j + 16 (high nibble): unpacking the low nibbles of a
  lane's 16 bytes gives 16 consecutive weights and the high nibbles the next 16, which match two contiguous
  16-element slices of the activation row.

0xFF scales: NaN (spec semantics), in the kernels and in `mxfp4.dequantize`; outputs touched by such a block are NaN.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

import minitriton as mt

from . import mxfp4

BLOCK_BYTES = 16  # one MX block of 32 E2M1 values
# From this batch on the inner products go through mt.dot (tensor cores, operands from registers). Measured on the H200
# (2026-11-29 19:0x UTC, `python -m benchmarks.run warp_decode`): at B = 1 the mt.dot path takes 243.8 us against
# 370.4 us on CUDA cores, so every batch uses it.
DOT_MIN_BATCH = 1
# The mt.dot path's variants: KernelConfig fields for (gate_up, down), selectable per call (moe_decode(variant=...))
# so tools/warp_decode_ab.py can time them side by side (docs/kernels/warp_decode.md, "Version 4 / 5"). SASS per
# weight of the K loop (ptxas 13.0, K3 AOT specializations; `tools/warp_decode_ab.py --sass`) and registers,
# gate_up / down:
#   v3           one weight per register, bias and scale two packed multiplies              6.28 / 6.68   155 / 172
#   v4           two weights per 32-bit word (e2m1_pairs_to_bf16, mt.bitcast_split), no      4.20 / 4.58   104 / 140
#                load masks on whole steps
#   v4_fold      v4 with the 2**126 bias folded into the scale (when the scales allow)       3.67 / 4.04   106 / 140
#   v4_words     v4_fold reading the weights as int32 words (4 registers per carried 16 B)   3.84 / 4.30   112 / 188
#   v4_words_p2  v4_words with two steps prefetched (twice the bytes in flight per warp)     4.09 / 4.51   134 / 168
#                (down spills 36 B)
#   v4_mixed     gate_up as v4_words_p2, down as v4_fold                                      4.09 / 4.04   134 / 140
#   v5           words, K in the words' nibble order: pairs without byte permutes, 4 dots    3.27 / 3.86   108 / 177
#   v5_p2        v5 with two steps prefetched                                                3.47 / 4.03   128 / 170
#   v5_mixed     gate_up as v5_p2, down as v4_fold                                            3.47 / 4.04   128 / 140
# and per K step as moe_decode launches them (`tools/warp_decode_ab.py --sass --variants ...`, down at BT 16):
#   v5_p2_lb_h16_u3c  the default                                                  404.3 / 416.7 SASS  128 / 128
#   v6_u3c            the same kernels on the v6 layout (prepare_experts(layout="v6"))  271.7 / 273.0  128 / 128
_V4 = dict(pairs=True)
_V4_WORDS_P2 = dict(pairs=True, words=True, prefetch=2)
_V5 = dict(pairs=True, words=True, word_order=True)
_V5_P2 = dict(pairs=True, words=True, word_order=True, prefetch=2)
_V6_P2 = dict(pairs=True, words=True, prefetch=2, layout="v6")
_V7 = dict(pairs=True, words=True, prefetch=2, layout="v7", h_bf16=True, unroll=True, min_blocks=16, routing="dsl")
DOT_VARIANTS: dict[str, tuple[dict, dict]] = {
    "v3": (dict(pairs=False), dict(pairs=False)),
    "v4": (dict(pairs=True, fold_bias=False), dict(pairs=True, fold_bias=False)),
    "v4_fold": (_V4, _V4),
    "v4_words": (dict(pairs=True, words=True), dict(pairs=True, words=True)),
    "v4_words_p2": (_V4_WORDS_P2, _V4_WORDS_P2),
    "v4_mixed": (_V4_WORDS_P2, _V4),
    "v5": (_V5, _V5),
    "v5_p2": (_V5_P2, _V5_P2),
    "v5_mixed": (_V5_P2, _V4),
    "v5_p2_lb": (_V5_P2, dict(_V5_P2, min_blocks=16)),
    "v5_p2_vm": (dict(_V5_P2, v_masked=True), dict(_V5_P2, v_masked=True)),
    "v5_p2_lb_vm": (dict(_V5_P2, v_masked=True), dict(_V5_P2, min_blocks=16, v_masked=True)),
    # h in one bf16 part, the intermediate precision of triton_kernels and the usual MoE stacks: half the down
    # kernel's MMAs and h loads; opt-in (H16_BOUND, not the default's fp32-level BOUND)
    "v5_p2_h16": (dict(_V5_P2, h_bf16=True), _V5_P2),
    "v5_p2_lb_h16": (dict(_V5_P2, h_bf16=True), dict(_V5_P2, min_blocks=16)),
    # the default with the K loop unrolled by 3 (no step-buffer rotation: -32 IMAD.MOV of 444 SASS per step)
    "v5_p2_lb_h16_u3": (dict(_V5_P2, h_bf16=True, unroll=True), dict(_V5_P2, min_blocks=16, unroll=True)),
    # and gate_up capped at 128 registers too (168 unrolled, 12 resident warps per SM instead of 16)
    "v5_p2_lb_h16_u3c": (dict(_V5_P2, h_bf16=True, unroll=True, min_blocks=16),
                         dict(_V5_P2, min_blocks=16, unroll=True)),
    # v6 (2026-12-01): the default's kernels on the v6 weight layout (prepare_experts(layout="v6")): 8 instead of 13
    # instructions per word to place the nibbles, adjacent elements in a pair (no PRMT on the vector operand), the
    # scale bytes stored biased (one shift each); docs/kernels/warp_decode.md "Session of 2026-12-01"
    "v6_u3c": (dict(_V6_P2, h_bf16=True, unroll=True, min_blocks=16), dict(_V6_P2, min_blocks=16, unroll=True)),
    "v6_u3": (dict(_V6_P2, h_bf16=True, unroll=True), dict(_V6_P2, min_blocks=16, unroll=True)),
    "v6_lb_h16": (dict(_V6_P2, h_bf16=True), dict(_V6_P2, min_blocks=16)),
    # h as two bf16 parts (h_precision="fp32") on the v6 layout
    "v6_u3c_fp32h": (dict(_V6_P2, unroll=True, min_blocks=16), dict(_V6_P2, min_blocks=16, unroll=True)),
    # v7 (2026-12-01 late; prepare_experts(layout="v7")): the v6 step with the scale words carried two steps ahead
    # with the weights, gate / up of a neuron in one thread, down writing per-pair contributions (no BT
    # accumulator), the routing in one DSL launch (B = 1: none at all); docs "Session of 2026-12-01 (late)"
    "v7_u3c": (_V7, _V7),
    "v7_u3c_ts": (dict(_V7, routing="torch"), dict(_V7, routing="torch")),  # v7 kernels, the torch.sort routing
    "v7_u3c_cg": (dict(_V7, wcache=".cg"), dict(_V7, wcache=".cg")),  # weights not kept in L1 (x, h, scales are)
    "v7_u3c_vpf": (dict(_V7, vpf=True), dict(_V7, vpf=True)),  # the next step's vector lines prefetched into L1
    "v7_u3c_cg_vpf": (dict(_V7, wcache=".cg", vpf=True), dict(_V7, wcache=".cg", vpf=True)),
    "v7_u3": (dict(_V7, min_blocks=None), _V7),  # gate_up uncapped
    # the next item's tables and first three steps loaded during the current item (no per-item prologue wait)
    "v7_u3c_x": (dict(_V7, xitem=True), dict(_V7, xitem=True)),
    "v7_u3c_x_cg_vpf": (dict(_V7, xitem=True, wcache=".cg", vpf=True), dict(_V7, xitem=True, wcache=".cg", vpf=True)),
    # the same without the 128-register cap (no spills; gate_up 128 registers at B > 1, 158 at B = 1 (12 resident
    # warps per SM); down 161: 12 warps per SM), and with only down uncapped (gate_up capped: 16 warps at B = 1)
    "v7_x_cg_vpf": (dict(_V7, xitem=True, wcache=".cg", vpf=True, min_blocks=None),
                    dict(_V7, xitem=True, wcache=".cg", vpf=True, min_blocks=None)),
    "v7_xd_cg_vpf": (dict(_V7, xitem=True, wcache=".cg", vpf=True),
                     dict(_V7, xitem=True, wcache=".cg", vpf=True, min_blocks=None)),
    # 2026-12-02: the L2 fetches 256 bytes on a weight / scale-word miss (the row's next step with it: twice the
    # DRAM bytes in flight per load), and the flat grid (every resident program slot busy to the end: at B = 1
    # gate_up's split grid held 1536 of 2112 slots for 4 items each, the flat one deals 6144 units over 2112)
    "v7_u3c_l2": (dict(_V7, l2pf=256), dict(_V7, l2pf=256)),
    "v7_u3c_f": (dict(_V7, flat=True), dict(_V7, flat=True)),
    "v7_u3c_fl2": (dict(_V7, flat=True, l2pf=256), dict(_V7, flat=True, l2pf=256)),
    "v7_u3c_cg_fl2": (dict(_V7, flat=True, l2pf=256, wcache=".cg"), dict(_V7, flat=True, l2pf=256, wcache=".cg")),
    # the v7 kernels' items as one launch (moe_fused_kernel_v7: pairs as items, units claimed in order, the slot
    # sum done by the last arriver), for B <= FUSED_MAX_BATCH
    "v7_fused": (dict(_V7, fused=True), dict(_V7, fused=True)),
    # v7_u3c whose down kernel adds the slots itself where the pairs are the items (B = 1): two launches
    "v7_u3c_s": (_V7, dict(_V7, sums=True)),
    # programmatic dependent launch: down's programs start during gate_up's tail and load their first weights,
    # the slot sum starts during down's; each waits (griddepcontrol.wait) before reading the previous one's output
    "v7_u3c_pdl": (dict(_V7, pdl=True), dict(_V7, pdl=True)),
    "v7_u3c_fl2_pdl": (dict(_V7, flat=True, l2pf=256, pdl=True), dict(_V7, flat=True, l2pf=256, pdl=True)),
    # the flat grid and the L2 fetch for down only: at B = 4 they took down from 129.7 to 117.5 us but gate_up from
    # 214.7 to 222.4 (2026-12-02, per kernel); gate_up keeps its split grid
    "v7_u3c_dfl2": (_V7, dict(_V7, flat=True, l2pf=256)),
    "v7_u3c_dcgfl2": (_V7, dict(_V7, flat=True, l2pf=256, wcache=".cg")),
}
FUSED_VARIANTS = frozenset(v for v, (up, _) in DOT_VARIANTS.items() if up.get("fused"))
FUSED_MAX_BATCH = 4  # pairs as items: without the routing's deduplication a shared expert is read once per pair
H16_VARIANTS = frozenset(v for v, (up, _) in DOT_VARIANTS.items() if up.get("h_bf16"))
# The weight layout (PreparedExperts.layout) each variant reads: prepare_experts(..., layout=variant_layout(name)).
V6_VARIANTS = frozenset(v for v, (up, _) in DOT_VARIANTS.items() if up.get("layout") == "v6")
V7_VARIANTS = frozenset(v for v, (up, _) in DOT_VARIANTS.items() if up.get("layout") == "v7")
# The fp32-h reference configuration (h as two bf16 parts, BOUND_DOT-level agreement with float64), also what
# pick_config uses when no variant is named. Measured 2026-11-29 22:17 UTC: v5_p2 210.8 / 767.9 / 3126.6 / 8480.5 us
# at B = 1 / 4 / 16 / 64 (v3: 245.8 / 939.2 / 3531.8 / 10014.5).
DEFAULT_DOT_VARIANT = "v5_p2"
# With h_precision="fp32", from B = 16 the down kernel at 16 resident warps per SM (v5_p2_lb) measured faster, below
# it slower (22:48 UTC, same run: B = 1 / 4 / 16 / 64 at 174.0 / 585.7 / 2064.5 / 5914.0 us against v5_p2's
# 171.9 / 563.2 / 2290.8 / 6190.8).
LARGE_BATCH, LARGE_BATCH_VARIANT = 16, "v5_p2_lb"
# moe_decode's default (h_precision="bf16"): h rounded once to bf16, the intermediate precision of triton_kernels,
# within the issue's 5e-3 bound (tests: H16_BOUND = 4e-3 against float64), both kernels capped at 128 registers and
# their K loops unrolled by 3. Fastest at every batch in the 2026-11-30 01:13 UTC run (tools/warp_decode_ab.py, H200,
# same run): 138.8 / 481.6 / 1652.9 / 4980.6 us at B = 1 / 4 / 16 / 64 against v5_p2_lb_h16's 168.5 / 489.1 /
# 1682.9 / 5256.0 (which at 00:56 measured 140.3 / 488.4 / 1670.6 / 5245.1 against v5_p2's 173.2 / 558.8 / 2273.1 /
# 6140.5).
BF16_H_VARIANT = "v5_p2_lb_h16_u3c"
H_PRECISIONS = ("bf16", "fp32")


# On experts in the v6 layout (prepare_experts(layout="v6")): the same kernels as BF16_H_VARIANT / the fp32-h
# default on it. Not measured on the GPU yet (2026-12-01: the K loop is 404 -> 262 SASS per step, see the notes).
V6_BF16_H_VARIANT, V6_FP32_H_VARIANT = "v6_u3c", "v6_u3c_fp32h"
# On experts in the v7 layout: the v7 kernels (h in bf16; with h_precision="fp32" the v6 fp32-h kernels, which read
# v7 experts as v6). prepare_experts(layout="auto") gives v7. Measured on the H200 (2026-12-01 23:04 and 23:27 UTC,
# tools/warp_decode_ab.py, same runs; BENCHMARKS.md): v7_u3c 119.8 / 374.8 / 1212.9 / 3432.2 and 120.3 / 375.2 /
# 1277.5 / 3605.8 us at B = 1 / 4 / 16 / 64 against v6_u3c's 177.3 / 444.1 / 1458.9 / 3889.9 and 126.2 / 447.1 /
# 1466.2 / 4151.1; the fastest v7 variant or within 4% at every batch. The notes' predicted best, v7_u3c_x_cg_vpf,
# measured the slowest v7 (172.1 / 472.8 / 1519.3 / 4405.0). The per-item scalar bases (f2378ba: -2 SASS a step)
# and the host fast path came after those runs: CPU-verified (interpreter, PTX simulator), not yet re-timed.
# From B = 16 (LARGE_BATCH) the flat grid with the L2's 256-byte fetch (v7_u3c_fl2) is the default: measured on the
# H200 2026-12-02 (tools/warp_decode_ab.py, same runs) at 1183.4 / 1163.0 us at B = 16 against v7_u3c's 1254.0 /
# 1223.1, and 3461.6 / 3440.9 at B = 64 against 3551.4 / 3445.1; below 16 it gains nothing (B = 1: 114.5 against
# 110.5, B = 4: 360.9 against 361.9).
V7_BF16_H_VARIANT, V7_LARGE_BATCH_VARIANT = "v7_u3c", "v7_u3c_fl2"
# From B = 4 (MID_BATCH) to LARGE_BATCH: gate_up on its split grid, down on the flat grid with the 256-byte L2 fetch
# and .cg weight loads (v7_u3c_dcgfl2). Measured on the H200 2026-12-02 12:58 UTC (tools/warp_decode_ab.py, same
# run): 350.0 us eager / 349.5 graph at B = 4 against v7_u3c's 362.5 / 362.3 and v7_u3c_fl2's 358.8 / 357.3; at
# B = 1 it loses (112.5 graph against 107.5), at B = 16 v7_u3c_fl2 stays faster (1161.0 against 1226.8).
MID_BATCH, V7_MID_BATCH_VARIANT = 4, "v7_u3c_dcgfl2"
AUTO_LAYOUT = "v7"


def v7_default_variant(batch: int) -> str:
    """The v7 variant moe_decode runs on v7 experts with h in bf16 when none is named, by batch, as measured."""
    if batch >= LARGE_BATCH:
        return V7_LARGE_BATCH_VARIANT
    return V7_MID_BATCH_VARIANT if batch >= MID_BATCH else V7_BF16_H_VARIANT


def variant_layout(variant: str) -> str:
    """The PreparedExperts layout a DOT_VARIANTS entry reads ("v5" or "v6")."""
    return DOT_VARIANTS[variant][0].get("layout", "v5")


def default_variant(batch: int, h_precision: str = "bf16", layout: str = "v5") -> str:
    """The mt.dot variant moe_decode runs when none is named: by the experts' layout, then h rounded to bf16 (the
    default) or kept at fp32 level (two bf16 parts), then by batch size, as measured."""
    if layout == "v7" and h_precision in H_PRECISIONS:
        return v7_default_variant(batch) if h_precision == "bf16" else V6_FP32_H_VARIANT
    if layout == "v6" and h_precision in H_PRECISIONS:
        return V6_BF16_H_VARIANT if h_precision == "bf16" else V6_FP32_H_VARIANT
    if h_precision == "bf16":
        return BF16_H_VARIANT
    if h_precision == "fp32":
        return LARGE_BATCH_VARIANT if batch >= LARGE_BATCH else DEFAULT_DOT_VARIANT
    raise ValueError(f"h_precision must be one of {H_PRECISIONS}, got {h_precision!r}")


# Folding the 2**126 bias into the scale needs 2**(s - 1) in bf16 range: s <= 128 (block scales up to 2, weights up to
# 12 in magnitude; real checkpoints sit far below). Experts with a larger finite scale keep the two multiplies.
FOLD_MAX_SCALE = 128
MAX_BATCH = 256  # the down kernel keeps a [ROWS, next_pow2(B)] fp32 accumulator per program


# ------------------------------------------------------------------------------------------ weight layout


@dataclass(frozen=True)
class PreparedExperts:
    """MXFP4 expert weights in the layout the kernels stream (from `prepare_experts`).

    blocks: uint8 [E, N, row_blocks * 16]; row n of expert e is `row_blocks` MX blocks of 16 bytes; in each block
            byte j holds element j (low nibble) and element j + 16 (high nibble); elements >= k are 0.
    scales: uint8 [E, N, row_blocks]; the E8M0 scale of each block (unchanged from the input).
    k:      the logical row length (the reduction length K).
    max_finite_scale: the largest scale byte other than 0xFF (NaN), when known (prepare_experts measures it once):
            with every finite scale <= FOLD_MAX_SCALE the mt.dot pairs path folds the dequant's 2**126 bias into
            the scale (one packed multiply per weight pair instead of two, still exact).
    layout: "v5" as above (every kernel variant reads it), or "v6" (the mt.dot variants of the v6 family only,
            LAYOUT_VARIANTS): each 4-byte word of a block holds elements 8 w .. 8 w + 7 with their code bits
            scattered so that the four bf16 pairs (8 w + 2 o, 8 w + 2 o + 1) come out of the word with one
            rotate and one and (`e2m1_v6_word_to_bf16_pairs`, V6_SOURCE_BITS), and the scale bytes are stored
            biased, s + 126 (0xFF stays 0xFF: the block's codes are zeroed, so inf * 0 makes it NaN).
            "v7": the v6 blocks and scales (v6 variants read it as v6) plus `scale_words`, the scales re-tiled for
            the v7 kernels: one int32 per lane and K step of a program's 16-row tile (V7 notes at `_scale_words`),
            loaded with the weights two steps ahead instead of four byte loads in the step.
    """

    blocks: torch.Tensor
    scales: torch.Tensor
    k: int
    max_finite_scale: int | None = None
    layout: str = "v5"
    scale_words: torch.Tensor | None = None  # layout "v7" only: int32 [E, tiles, steps, 32] (`_scale_words`)
    words: torch.Tensor | None = None  # layout "v7": blocks.view(torch.int32), made once (not per launch)

    @property
    def num_experts(self) -> int:
        return self.blocks.shape[0]

    @property
    def rows(self) -> int:
        return self.blocks.shape[1]

    @property
    def row_blocks(self) -> int:
        return self.scales.shape[2]

    @property
    def folds_bias(self) -> bool:
        """2**126 * 2**(s - 127) = 2**(s - 1) is a bf16 number for every finite scale byte s of these experts."""
        return self.max_finite_scale is not None and self.max_finite_scale <= FOLD_MAX_SCALE

    def expert_bytes(self) -> int:
        """Bytes of one expert (weights + scales): what the kernels read from HBM per distinct expert."""
        return self.rows * self.row_blocks * (BLOCK_BYTES + 1)


def prepare_experts(blocks: torch.Tensor, scales: torch.Tensor, k: int | None = None,
                    experts_per_chunk: int = 16, layout: str = "auto") -> PreparedExperts:
    """Permute MXFP4 experts (HF / compressed-tensors layout) into the kernels' stream layout (offline, one time).

    blocks: uint8 [E, N, ceil(K/2)] packed pairs, low nibble = even element; also accepted as [E, N, K/32, 16].
    scales: uint8 [E, N, ceil(K/32)] E8M0.
    k:      the row length K (default: 2 * blocks.shape[-1]).
    layout: "v5" (every variant) or "v6" (the v6 mt.dot variants; needs every finite scale byte <= FOLD_MAX_SCALE,
            raises otherwise: such experts keep "v5"), or "auto" (the default): "v6" where the scales allow it, else
            "v5" (AUTO_LAYOUT: "v6"). v6 measured faster at every batch on the H200 (2026-12-01: -11% / -21% at
            B = 16 / 64).
            "v7": v6 plus the scales re-tiled for the v7 kernels (`with_scale_words`; 1/16 more memory).
            See PreparedExperts; moe_decode picks its default variant by the layout.
    Works on whatever device the tensors are on, `experts_per_chunk` experts at a time to bound temporary memory.
    """
    if layout == "auto":
        finite = scales.masked_fill(scales == mxfp4.E8M0_NAN, 0)
        layout = AUTO_LAYOUT if not finite.numel() or int(finite.amax()) <= FOLD_MAX_SCALE else "v5"
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS} or 'auto', got {layout!r}")
    if layout == "v7":  # the v6 layout plus the re-tiled scales
        return with_scale_words(prepare_experts(blocks, scales, k, experts_per_chunk, "v6"), experts_per_chunk)
    if blocks.dim() == 4:
        blocks = blocks.reshape(blocks.shape[0], blocks.shape[1], -1)
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise TypeError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}")
    if blocks.dim() != 3 or scales.dim() != 3 or blocks.shape[:2] != scales.shape[:2]:
        raise ValueError(f"expected blocks [E, N, K/2] and scales [E, N, K/32], got {tuple(blocks.shape)} and "
                         f"{tuple(scales.shape)}")
    k = 2 * blocks.shape[2] if k is None else k
    if not 2 * blocks.shape[2] - 1 <= k <= 2 * blocks.shape[2] or k < 1:
        raise ValueError(f"k={k} does not fit {blocks.shape[2]} packed bytes per row")
    nb = -(-k // mxfp4.BLOCK)
    if scales.shape[2] != nb:
        raise ValueError(f"scales have {scales.shape[2]} blocks per row; K={k} needs {nb}")
    E, N, _ = blocks.shape
    out = torch.empty((E, N, nb * BLOCK_BYTES), dtype=torch.uint8, device=blocks.device)
    max_finite = torch.zeros((), dtype=torch.uint8, device=scales.device)
    for e0 in range(0, E, experts_per_chunk):
        chunk = scales[e0:e0 + experts_per_chunk]
        finite = chunk.masked_fill(chunk == mxfp4.E8M0_NAN, 0)  # 0xFF is NaN, not a large scale
        max_finite = torch.maximum(max_finite, finite.amax()) if finite.numel() else max_finite
        if layout == "v6":
            out[e0:e0 + experts_per_chunk] = _pack_blocks_v6(blocks[e0:e0 + experts_per_chunk], nb,
                                                             chunk == mxfp4.E8M0_NAN)
        else:
            out[e0:e0 + experts_per_chunk] = _permute_blocks(blocks[e0:e0 + experts_per_chunk], nb)
    max_finite = int(max_finite)  # one host sync, offline
    if layout == "v6":
        if max_finite > FOLD_MAX_SCALE:
            raise ValueError(f"layout 'v6' stores the scales biased by 126 (bf16 2**(s - 1)), which needs every "
                             f"finite scale byte <= {FOLD_MAX_SCALE}; these experts have {max_finite}: use 'v5'")
        biased = torch.where(scales == mxfp4.E8M0_NAN, scales, scales + V6_SCALE_BIAS)
        return PreparedExperts(out, biased.contiguous(), k, max_finite, "v6")
    return PreparedExperts(out, scales.contiguous(), k, max_finite)


def _permute_blocks(blocks: torch.Tensor, nb: int) -> torch.Tensor:
    """[e, N, bytes] natural packing -> [e, N, nb * 16] with byte j of a block = element j | element j + 16 << 4."""
    pad = nb * BLOCK_BYTES - blocks.shape[2]
    b = torch.nn.functional.pad(blocks, (0, pad)).reshape(*blocks.shape[:2], nb, 2, BLOCK_BYTES // 2)
    # b[..., h, i] holds elements 16h + 2i (low nibble) and 16h + 2i + 1 (high nibble): unpack each half in order.
    halves = torch.stack([b & 0x0F, b >> 4], dim=-1).reshape(*blocks.shape[:2], nb, 2, BLOCK_BYTES)
    return (halves[..., 0, :] | (halves[..., 1, :] << 4)).reshape(*blocks.shape[:2], nb * BLOCK_BYTES)


# The v6 layout (PreparedExperts.layout): where each code bit of a block's elements lives in its 4-byte words.
# Word w of a block holds four bf16 pairs o = 0..3, pair o = elements 8 o + 2 w + h (h = 0 in the low 16 bits of
# the pair, h = 1 in the high): V6_SOURCE_BITS[o][h][c] is the word bit of code bit c (0 = M, 1, 2 = the exponent
# E, 3 = the sign) of element 8 o + 2 w + h. So pair o of the block's 4 words is the o-th 16 bytes of the vector's
# 32 elements, in register order: one mma takes words 2 m, 2 m + 1 against vector registers 2 m, 2 m + 1 of one
# 16-byte load, an aligned register pair (no moves). The kernel extracts pair o as (e2m1_v6_word_to_bf16_pairs)
#   o = 0: x & V6_MASK                     o = 1: rotl(x, 10) & V6_MASK            o = 2: rotl(x, 13) & V6_MASK
#   o = 3: ((x & 0x001B001B) * 0x1084) & V6_MASK   (one multiply shifts the bits by 2, 7 and 12 at once)
# i.e. each bf16 gets E E M at bits 8..6 and the sign at 15 (value * 2**-126, as e2m1_word_pairs_to_bf16 builds
# it): 8 instructions for 8 weights instead of the v5 layout's 13. The three bit sets of o = 0..2 are translates of
# the bf16 pattern {6, 7, 8, 15} (mod 16); they cannot tile all 16 bits (no 4 translates do), so o = 3 takes the
# rest, {0, 1, 3, 4}, by the multiply (checked over every code in tests). Adjacent elements in a pair let the
# vector operand use its loaded bf16 pairs as they are (no PRMT), and each pair's K columns follow the weights'.
V6_MASK = 0x81C081C0
V6_SCALE_BIAS = 126  # v6 scale bytes hold s + 126: bf16 bits (b << 7) = 2**(s - 1), the scale with the 2**126 bias
_BF16_BITS = (6, 7, 8, 15)  # where code bits M, E0, E1, S go in a bf16 (E2M1 value * 2**-126)
_V6_O3_BITS = (4, 0, 1, 3)  # o = 3: code bits M, E0, E1, S at these bits of each half (shifted by 2, 7, 7, 12)
_V6_ROTATE = (0, 10, 13)  # o = 0, 1, 2: the pair is rotl(x, r) & V6_MASK
V6_SOURCE_BITS = tuple(
    tuple(tuple((16 * h + _BF16_BITS[c] - _V6_ROTATE[o]) % 32 if o < 3 else 16 * h + _V6_O3_BITS[c]
                for c in range(4)) for h in range(2)) for o in range(4))
LAYOUTS = ("v5", "v6", "v7")
# The layouts a kernel config of each layout can read: v7 experts carry the v6 blocks and scales unchanged.
READABLE_LAYOUTS = {"v5": ("v5",), "v6": ("v6", "v7"), "v7": ("v7",)}

# The v7 scale words (PreparedExperts.scale_words). A v7 program owns a tile of 16 rows of an [E, N, K] matrix: rows
# 8 p + g (r = g < 8) and half + 8 p + g (r = 8 + g), half = ceil(N / 2), so for W13 (N = 2 I) the gate row and the
# up row of neuron 8 p + g, and for W2 two rows half a matrix apart. The mma fragments put rows g and g + 8 in lane
# (g, t), so one thread holds both. Its K step is 8 blocks (h, t) = 4 h + t; the lane's four scale bytes of a step,
# (h, rr) = block 8 s + 4 h + t of row rr * half + 8 p + g, are byte 2 h + rr of word [e, p, s, 4 g + t]: one
# coalesced 128-byte load per step and warp, loop-carried with the weights (two steps ahead), where the v6 step
# loads four bytes from 8 rows each (32 L1 wavefronts) inside the step and waits for them (a DRAM miss at a new
# sector every 2-4 steps). Bytes of rows >= N (or past half) and of blocks past the row are 0.
V7_GROUP = 8  # rows of each half of a tile (the mma's g)
V7_STEP = 8  # blocks per K step (BLOCKS of the mt.dot path)


def v7_half(rows: int) -> int:
    """Where the second row group of a v7 tile starts: ceil(N / 2) (I for W13's 2 I rows)."""
    return (rows + 1) // 2


def _scale_words(scales: torch.Tensor) -> torch.Tensor:
    """v6 scale bytes [e, N, nb] -> the v7 scale words int32 [e, tiles, steps, 32] (see V7_GROUP)."""
    e, n, nb = scales.shape
    half = v7_half(n)
    tiles, steps = -(-half // V7_GROUP), -(-nb // V7_STEP)
    dev = scales.device
    local = (V7_GROUP * torch.arange(tiles, device=dev)[:, None, None]
             + torch.arange(V7_GROUP, device=dev)[None, None, :])  # [p, 1, g]
    row = torch.arange(2, device=dev)[None, :, None] * half + local  # [p, rr, g]
    row = torch.where((local < half) & (row < n), row, n)  # n: the zero row appended below
    blk = (V7_STEP * torch.arange(steps, device=dev)[:, None, None] + 4 * torch.arange(2, device=dev)[None, :, None]
           + torch.arange(4, device=dev)[None, None, :])  # [s, h, t]
    blk = torch.where(blk < nb, blk, nb)
    padded = torch.nn.functional.pad(scales, (0, 1, 0, 1))  # [e, n + 1, nb + 1], zeros past the ends
    b = padded[:, row.reshape(-1)][:, :, blk.reshape(-1)].reshape(e, tiles, 2, V7_GROUP, steps, 2, 4)
    b = b.permute(0, 1, 4, 3, 6, 5, 2).contiguous()  # [e, p, s, g, t, h, rr]: byte 2 h + rr of word 4 g + t
    return b.reshape(e, tiles, steps, 32, 4).view(torch.int32).reshape(e, tiles, steps, 32)


def with_scale_words(w: PreparedExperts, experts_per_chunk: int = 16) -> PreparedExperts:
    """v6 (or v7) experts -> v7 experts sharing their blocks and scales, plus the scale words (one offline pass)."""
    if w.layout not in ("v6", "v7"):
        raise ValueError(f"the v7 layout extends v6 experts, got layout {w.layout!r}")
    words = torch.cat([_scale_words(w.scales[e0:e0 + experts_per_chunk])
                       for e0 in range(0, w.num_experts, experts_per_chunk)])
    return PreparedExperts(w.blocks, w.scales, w.k, w.max_finite_scale, "v7", words, w.blocks.view(torch.int32))


def _pack_blocks_v6(blocks: torch.Tensor, nb: int, nan_blocks: torch.Tensor) -> torch.Tensor:
    """[e, N, bytes] natural packing -> [e, N, nb * 16] in the v6 layout (V6_SOURCE_BITS), the codes of blocks with
    a NaN scale set to 0 (the kernel's inf scale times +0 gives the spec's NaN for every element of the block)."""
    pad = nb * BLOCK_BYTES - blocks.shape[2]
    b = torch.nn.functional.pad(blocks, (0, pad)).reshape(*blocks.shape[:2], nb, BLOCK_BYTES)
    codes = torch.stack([b & 0x0F, b >> 4], dim=-1).reshape(*blocks.shape[:2], nb, 4, 4, 2)  # [.., o, w, h]
    codes = codes.masked_fill(nan_blocks[..., None, None, None], 0).to(torch.int64).transpose(-3, -2)  # [.., w, o, h]
    words = torch.zeros(codes.shape[:-2], dtype=torch.int64, device=blocks.device)  # [e, N, nb, 4]
    for o in range(4):
        for h in range(2):
            for c in range(4):
                words |= ((codes[..., o, h] >> c) & 1) << V6_SOURCE_BITS[o][h][c]
    out = torch.stack([(words >> (8 * i)) & 0xFF for i in range(4)], dim=-1).to(torch.uint8)  # little endian
    return out.reshape(*blocks.shape[:2], nb * BLOCK_BYTES)


def _unpack_blocks_v6(blocks: torch.Tensor) -> torch.Tensor:
    """The codes [..., nb * 32] (natural order) of v6-layout blocks [..., nb * 16] (the inverse of _pack_blocks_v6
    on blocks whose scale is not NaN)."""
    b = blocks.reshape(*blocks.shape[:-1], -1, 4, 4).to(torch.int64)  # [.., nb, w, byte]
    words = sum(b[..., i] << (8 * i) for i in range(4))  # [.., nb, w]
    codes = torch.zeros((*words.shape, 4, 2), dtype=torch.int64, device=blocks.device)
    for o in range(4):
        for h in range(2):
            for c in range(4):
                codes[..., o, h] |= ((words >> V6_SOURCE_BITS[o][h][c]) & 1) << c
    return codes.transpose(-3, -2).reshape(*blocks.shape[:-1], -1).to(torch.uint8)  # [.., nb, o, w, h]


def dequantize_prepared(w: PreparedExperts, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The exact weights [E, N, K] a PreparedExperts holds (the inverse of prepare_experts, for tests)."""
    if w.layout in ("v6", "v7"):
        codes = _unpack_blocks_v6(w.blocks)[..., :w.k]
        scales = torch.where(w.scales == mxfp4.E8M0_NAN, w.scales, w.scales - V6_SCALE_BIAS)
        return mxfp4.dequantize(mxfp4.pack_codes(codes), scales, w.k, dtype)
    b = w.blocks.reshape(w.num_experts, w.rows, w.row_blocks, BLOCK_BYTES)
    codes = torch.cat([b & 0x0F, b >> 4], dim=-1).reshape(w.num_experts, w.rows, -1)[..., :w.k]
    return mxfp4.dequantize(mxfp4.pack_codes(codes), w.scales, w.k, dtype)


# ------------------------------------------------------------------------------------------ DSL helpers


@mt.func
def e2m1_to_f32(q):
    """Packed bytes (uint8 tile) -> (low-nibble values, high-nibble values) as exact f32.

    The nibble's E E M bits land on f32 bits 24..22 (exponent low bits, mantissa top bit) and its sign on bit 31:
    that f32 is value * 2**-126 (codes 0 and 1, i.e. 0 and 0.5, as subnormals), so one multiply by 2**126 makes it
    exact. Needs denormal support (no .ftz). The placement is one multiply: nibble * (2**22 + 2**28) writes the
    nibble at bits 22..25 and again at 28..31 (no overlap, so no carries), and the mask 0x81C00000 keeps E E M from
    the first copy and the sign from the second (and + IMAD + and in SASS, versus two shifts and an or)."""
    b = q.to(mt.uint32)
    lo = (((b & 0x0F) * 0x10400000) & 0x81C00000).to(mt.float32, bitcast=True)
    hi = (((b & 0xF0) * 0x01040000) & 0x81C00000).to(mt.float32, bitcast=True)
    return lo * 8.507059173023462e37, hi * 8.507059173023462e37  # 2**126


@mt.func
def e2m1_to_bf16(q):
    """Packed bytes (uint8 tile) -> (low-nibble values, high-nibble values) as exact bf16: the bf16 form of
    e2m1_to_f32's trick (E E M at bf16 bits 8..6, sign at 15, i.e. value * 2**-126 with codes 0 / 1 subnormal, then
    one exact multiply by 2**126). Adjacent elements of a bf16 tile run as packed pairs (HMUL2.BF16), so the bias
    costs half an instruction per weight instead of one FMUL."""
    b = q.to(mt.uint32)
    lo = (((b & 0x0F) * 0x1040) & 0x81C0).to(mt.uint16).to(mt.bfloat16, bitcast=True)
    hi = (((b & 0xF0) * 0x0104) & 0x81C0).to(mt.uint16).to(mt.bfloat16, bitcast=True)
    bias = mt.full(lo.shape, 8.507059173023462e37, mt.bfloat16)  # 2**126, exact in bf16
    return lo * bias, hi * bias


@mt.func
def e2m1_pairs_to_bf16(b, BIASED):
    """Packed bytes [H, R, 4, 4, 2, 2] (b[..., w, k, p]: byte 4 w + 2 k + p of a block) -> (low-nibble values,
    high-nibble values) as exact bf16 of the same shape: e2m1_to_bf16's bits built two at a time. An in-thread sum
    of the shifted bytes puts bytes 2 k and 2 k + 1 in the two 16-bit halves of one word (one PRMT per pair in
    SASS); one and / multiply / and then places both nibbles at once (n * 0x1040 < 2**16: no carry between the
    halves), and `mt.bitcast_split` hands the halves on as a pair of bf16 without an instruction. The pair is two
    adjacent K columns (2 t, 2 t + 1) of an m16n8k16 A fragment, so it stays one register down to the mma: 1.75
    instructions per weight for the bits (e2m1_to_bf16: 3, plus a PRMT to pair them), then the packed bias. With
    BIASED the values are left as value * 2**-126 (exact bf16, codes 0 / 1 subnormal) for a scale that carries
    the 2**126 (`e8m0_to_bf16_times_2_126`): one packed multiply per pair instead of two."""
    shift = (16 * mt.arange(0, 2)).to(mt.uint32)[None, None, None, None, None, :]
    word = mt.sum(b.to(mt.uint32) << shift, axis=5)  # byte 2k in bits 0..7, byte 2k + 1 in bits 16..23
    return e2m1_word_pairs_to_bf16(word, BIASED)


@mt.func
def e8m0_to_bf16_times_2_126(s):
    """E8M0 scale bytes -> bf16 2**126 * 2**(s - 127) = 2**(s - 1): bits (s + 126) << 7, exact for s <= 128 (the
    caller checks: FOLD_MAX_SCALE), 0x00 -> 0.5 (no subnormal case left), 0xFF -> NaN. Times value * 2**-126 this
    is value * 2**(s - 127) exactly (2 significant bits, subnormals included)."""
    e = s.to(mt.uint32)
    bits = mt.where(e == 255, 0x7FC0, (e + 126) << 7)
    return bits.to(mt.uint16).to(mt.bfloat16, bitcast=True)


@mt.func
def e2m1_word_pairs_to_bf16(x, BIASED):
    """Packed words [..., n] (uint32: bytes 4 w .. 4 w + 3 of a block, byte j = element j | element j + 16 << 4)
    -> the bf16 pairs of nibbles 0 and 2 (elements (j, j + 2) of the low nibbles, byte 0 and byte 2) and of
    nibbles 1 and 3 (the high nibbles: elements (j + 16, j + 18)), each [..., n, 2]: the two nibbles of a pair sit
    16 bits apart in the word already, so one and / multiply / and builds both bf16 (no byte permute at all; the
    caller orders K to match: see stream_rows_dot's WORD_ORDER). x >> 8 gives the pairs of bytes 1 and 3."""
    lo = ((x & 0x000F000F) * 0x1040) & 0x81C081C0
    hi = ((x & 0x00F000F0) * 0x0104) & 0x81C081C0
    w_lo = mt.bitcast_split(lo, mt.bfloat16)
    w_hi = mt.bitcast_split(hi, mt.bfloat16)
    if not BIASED:
        bias = mt.full(w_lo.shape, 8.507059173023462e37, mt.bfloat16)  # 2**126, exact in bf16
        w_lo = w_lo * bias
        w_hi = w_hi * bias
    return w_lo, w_hi


@mt.func
def e2m1_v6_word_to_bf16_pairs(x):
    """v6-layout words [..., n] (uint32; PreparedExperts.layout "v6", V6_SOURCE_BITS) -> the bf16 pairs o = 0..3,
    each [..., n, 2] = elements (8 o + 2 w, 8 o + 2 w + 1) of word w as value * 2**-126 (exact bf16, codes 0 / 1
    subnormal: the folded scale carries the 2**126). 8 instructions per word: and; rotate (SHF) + and, twice; and,
    multiply, and (the multiply moves the last pair's bits by 2, 7 and 12 at once, without carries)."""
    p0 = x & 0x81C081C0
    p1 = ((x << 10) | (x >> 22)) & 0x81C081C0
    p2 = ((x << 13) | (x >> 19)) & 0x81C081C0
    p3 = ((x & 0x001B001B) * 0x1084) & 0x81C081C0
    return (mt.bitcast_split(p0, mt.bfloat16), mt.bitcast_split(p1, mt.bfloat16),
            mt.bitcast_split(p2, mt.bfloat16), mt.bitcast_split(p3, mt.bfloat16))


@mt.func
def e8m0_v6_to_bf16_pair(b):
    """v6 scale bytes (s + 126; 0xFF for NaN) [...] -> bf16 pairs [..., 2] of 2**(s - 1) twice: bits b << 7 in both
    halves of a word, one multiply (b * (2**7 + 2**23)), a pair operand of the packed multiply as it is. 0xFF gives
    +inf: the layout zeroes that block's codes, so inf * 0 = NaN for each of its weights (the spec's NaN block)."""
    return mt.bitcast_split(b.to(mt.uint32) * 0x00800080, mt.bfloat16)


@mt.func
def fragment_b_v6(v, NT, H):
    """The B operand [32 H, NT] for pair o of the v6 words, from the o-th 16 bytes of each block's 32 vector
    elements, loaded as [H, NT, 4, 8] (element 8 o + e of block (h, t) of vector n, one 16-byte load per lane and
    h): element 8 o + 2 w + p at column 32 h + 8 w + 2 t + p, the K order of fragment_a_words. A rename: mma m
    takes loaded registers 2 m and 2 m + 1."""
    return mt.trans(v.reshape((H, NT, 4, 4, 2)), 0, 3, 2, 4, 1).reshape((H * 32, NT))


@mt.func
def dot_v6(acc, a0, a1, a2, a3, v0, v1, v2, v3, NT, H):
    """The four dots of a v6 step: pair o of every word against the o-th 16 bytes of the vector's blocks."""
    acc = mt.dot(a0, fragment_b_v6(v0, NT, H), acc)
    acc = mt.dot(a1, fragment_b_v6(v1, NT, H), acc)
    acc = mt.dot(a2, fragment_b_v6(v2, NT, H), acc)
    acc = mt.dot(a3, fragment_b_v6(v3, NT, H), acc)
    return acc


@mt.func
def load_vector_v6(v_at, v_ok, k, K, FULL_STEPS, V_UNMASKED):
    """The four 16-byte slices o = 0..3 ([H, NT, 4, 8] each: elements 8 o .. 8 o + 7 of each block) at v_at + 8 o
    (separate loads: the constant offsets fold into the load instructions' immediates)."""
    if FULL_STEPS:
        v0 = load_masked(v_at, v_ok, V_UNMASKED)
        v1 = load_masked(v_at + 8, v_ok, V_UNMASKED)
        v2 = load_masked(v_at + 16, v_ok, V_UNMASKED)
        v3 = load_masked(v_at + 24, v_ok, V_UNMASKED)
    else:
        v0 = mt.load(v_at, mask=v_ok & (k < K), other=0)
        v1 = mt.load(v_at + 8, mask=v_ok & (k + 8 < K), other=0)
        v2 = mt.load(v_at + 16, mask=v_ok & (k + 16 < K), other=0)
        v3 = mt.load(v_at + 24, mask=v_ok & (k + 24 < K), other=0)
    return v0, v1, v2, v3


@mt.func
def _dot_step_v6(acc, q, blk, live1, row_blocks, s_row, ws_ptr, v_ptr, v_row, v_ok, K, part_stride, ROWS, NT, H,
                 VMODE, FULL_STEPS, UNMASKED, V_UNMASKED):
    """One K step of stream_rows_dot on the v6 layout (words, bias folded into the biased scale bytes): the words
    q [H, R, 4, 4] of blocks blk ([H, 4]) give four bf16 pair tiles (e2m1_v6_word_to_bf16_pairs), each scaled and
    fed as an A operand; the vectors are loaded as four [H, NT, 4, 8] slices (load_vector_v6) and used in place.
    VMODE 0: bf16 vector; 1: f32 (split into bf16 hi + lo here); 2: bf16 hi and lo parts (part_stride)."""
    s_ok = live1[None, :, None] & (blk < row_blocks)[:, None, :]
    s_bytes = load_masked(ws_ptr + s_row[None, :, None] + blk[:, None, :], s_ok, UNMASKED)
    scale = e8m0_v6_to_bf16_pair(s_bytes)[:, :, :, None, :]
    w0, w1, w2, w3 = e2m1_v6_word_to_bf16_pairs(q.to(mt.uint32, bitcast=True))
    a0 = fragment_a_words(w0 * scale, ROWS, H)
    a1 = fragment_a_words(w1 * scale, ROWS, H)
    a2 = fragment_a_words(w2 * scale, ROWS, H)
    a3 = fragment_a_words(w3 * scale, ROWS, H)
    k = (blk * 32)[:, None, :, None] + mt.arange(0, 8)[None, None, None, :]  # [H, 1, 4, 8]
    v_at = v_ptr + v_row[None, :, None, None] + k
    ok = v_ok[None, :, None, None]
    v0, v1, v2, v3 = load_vector_v6(v_at, ok, k, K, FULL_STEPS, V_UNMASKED)
    if VMODE == 1:  # f32 vector: bf16 hi part + bf16 rest, split here
        t0, t1, t2, t3 = v0.to(mt.bfloat16), v1.to(mt.bfloat16), v2.to(mt.bfloat16), v3.to(mt.bfloat16)
        acc = dot_v6(acc, a0, a1, a2, a3, t0, t1, t2, t3, NT, H)
        acc = dot_v6(acc, a0, a1, a2, a3, (v0 - t0.to(mt.float32)).to(mt.bfloat16),
                     (v1 - t1.to(mt.float32)).to(mt.bfloat16), (v2 - t2.to(mt.float32)).to(mt.bfloat16),
                     (v3 - t3.to(mt.float32)).to(mt.bfloat16), NT, H)
    else:
        acc = dot_v6(acc, a0, a1, a2, a3, v0, v1, v2, v3, NT, H)
    if VMODE == 2:  # the lo part of an f32 vector split once by its producer
        v0, v1, v2, v3 = load_vector_v6(v_at + part_stride, ok, k, K, FULL_STEPS, V_UNMASKED)
        acc = dot_v6(acc, a0, a1, a2, a3, v0, v1, v2, v3, NT, H)
    return acc


@mt.func
def fragment_a_words(w, ROWS, H):
    """Weights [H, R, 4, 4, 2] (w[h, r, t, w, p]: pair p of word w of block (h, t)) -> an A operand [R, 32 H], column
    32 h + 8 w + 2 t + p: each register pair of the m16n8k16 fragment (columns 2 t, 2 t + 1) is one word's pair."""
    return mt.trans(w, 1, 0, 3, 2, 4).reshape((ROWS, H * 32))


@mt.func
def fragment_b_words(v, r, NT, H, JH, JL):
    """The B operand [32 H, NT] matching fragment_a_words for the elements 4 w + 2 p + r of vectors loaded as
    [JH, H, NT, 4, JL] (element JL * jh + jl of block (h, t), 16 bytes per lane): the even (r = 0) or odd (r = 1)
    elements, column 32 h + 8 w + 2 t + p. A static slice and renames; the bf16 of a B register come from two
    loaded registers (ptxas pairs them with one PRMT)."""
    A = JL // 4
    picked = v.reshape((JH, H, NT, 4, A, 2, 2))[:, :, :, :, :, :, r:r + 1]  # keeps its size-1 dim: a rename
    return mt.trans(picked, 1, 0, 4, 3, 5, 6, 2).reshape((H * 32, NT))


@mt.func
def dot_words(acc, a0, a1, a16, a17, v_lo, v_hi, NT, H, JH, JL):
    """The four dots of a WORD_ORDER step: weights of elements (4 w + 2 p + r) and (16 + ...) for r = 0, 1 against
    the matching vector elements (v_lo: elements 0..15 of each block, v_hi: 16..31)."""
    acc = mt.dot(a0, fragment_b_words(v_lo, 0, NT, H, JH, JL), acc)
    acc = mt.dot(a1, fragment_b_words(v_lo, 1, NT, H, JH, JL), acc)
    acc = mt.dot(a16, fragment_b_words(v_hi, 0, NT, H, JH, JL), acc)
    acc = mt.dot(a17, fragment_b_words(v_hi, 1, NT, H, JH, JL), acc)
    return acc


@mt.func
def block_bytes(q, ROWS, H, WORDS):
    """The step's packed weights as bytes [H, R, 4, 4, 2, 2] in memory order (byte 4 w + 2 k + p of each block):
    from the loaded byte tile [H, R, 4, 16] (a reshape: a register rename), or from the int32 word tile
    [H, R, 4, 4] (WORDS) by splitting each word into its 4 bytes (mt.bitcast_split twice: bit-field extracts)."""
    if WORDS:
        b = mt.bitcast_split(mt.bitcast_split(q.to(mt.uint32, bitcast=True), mt.uint16), mt.uint8)
    else:
        b = q.reshape((H, ROWS, 4, 4, 2, 2))
    return b


@mt.func
def e8m0_to_bf16(s):
    """E8M0 scale bytes -> bf16 2**(s - 127): bits s << 7, 0x00 -> 2**-127 (the bf16 subnormal 0x0040), 0xFF -> NaN."""
    e = s.to(mt.uint32)
    bits = mt.where(e == 0, 0x0040, e << 7)
    bits = mt.where(e == 255, 0x7FC0, bits)
    return bits.to(mt.uint16).to(mt.bfloat16, bitcast=True)


@mt.func
def e8m0_to_f32(s):
    """E8M0 scale bytes -> f32 2**(s - 127): bits s << 23 for 1..254, 0x00 -> 2**-127 (the subnormal 0x00400000),
    0xFF -> NaN (OCP MX spec; the fast paths of other libraries give +inf here)."""
    e = s.to(mt.uint32)
    bits = mt.where(e == 0, 0x00400000, e << 23)
    bits = mt.where(e == 255, 0x7FC00000, bits)
    return bits.to(mt.float32, bitcast=True)


@mt.func
def load_items(it0, n_items, ids_ptr, pairs_ptr, first_ptr, TEAMS, NT, DEDUP):
    """The TEAMS work items it0 .. it0 + TEAMS - 1: (item_ok [T], pair [T, NT], pair_ok [T, NT], expert [T]).

    With DEDUP item i is the run pairs_ptr[first[i] .. first[i + 1]) of at most NT pairs routed to one expert
    (first[n_items] is the number of pairs); without it item i is pair i alone (NT == 1)."""
    item = it0 + mt.arange(0, TEAMS)
    item_ok = item < n_items
    s = mt.arange(0, NT)
    if DEDUP:
        first = mt.load(first_ptr + item, mask=item_ok, other=0)
        count = mt.load(first_ptr + item + 1, mask=item_ok, other=0) - first
        pair_ok = s[None, :] < count[:, None]
        pair = mt.load(pairs_ptr + first[:, None] + s[None, :], mask=pair_ok, other=0)
    else:
        pair_ok = item_ok[:, None] & (s[None, :] == 0)
        pair = mt.broadcast_to(item[:, None], (TEAMS, NT))
    expert = mt.max(mt.load(ids_ptr + pair, mask=pair_ok, other=0), axis=1)  # one expert per item
    return item_ok, pair, pair_ok, expert


@mt.func
def load_weight_step(wq_ptr, ws_ptr, q_row, s_row, live, kb, lane_block, j, row_blocks):
    """The packed bytes [R, T, BLOCKS, 16] and scale bytes [R, T, BLOCKS] of blocks kb .. kb + BLOCKS - 1 of the
    rows at byte offsets q_row / block offsets s_row (i64 [R, T]) where `live`; blocks past the row's end read 0."""
    blk = kb + lane_block
    m = live[:, :, None] & (blk < row_blocks)[None, None, :]
    q = mt.load(wq_ptr + q_row[:, :, None, None] + (blk * 16)[None, None, :, None] + j[None, None, None, :],
                mask=m[:, :, :, None], other=0)
    return q, mt.load(ws_ptr + s_row[:, :, None] + blk[None, None, :], mask=m, other=0)


@mt.func
def stream_rows(wq_ptr, ws_ptr, row, live, v_ptr, v_index, v_stride, v_live, K, row_blocks, part_stride,
                ROWS, TEAMS, NT, BLOCKS, USE_DOT, VMODE, FULL_STEPS, PAIRS=False, PREFETCH=1,
                WORDS=False, FOLD_BIAS=False, WORD_ORDER=False, V_MASKED=False, UNROLL_TAIL=-1, LAYOUT6=False):
    """acc[r, t, s] = sum_{k < K} W[row[r, t], k] * v[v_index[t, s] * v_stride + k] for the weight rows `row` (i64
    [R, T], rows of `row_blocks` MX blocks) where `live`, and the vector rows `v_index` (i32 [T, NT]) where `v_live`.
    v_stride (a multiple of 16 in the AOT signatures) multiplies the row index *after* any per-slot pick, so the
    compiler's alignment analysis sees 16-element-aligned vector rows and vectorizes the activation loads.

    USE_DOT (TEAMS == 1): tensor cores (`stream_rows_dot`); else CUDA cores (`stream_rows_fma`). VMODE (the
    vector's form): 0 as is (bf16 on the mt.dot path), 1 f32 (the mt.dot path splits it into bf16 hi + lo parts),
    2 already split (mt.dot only): bf16 parts v = hi and v + part_stride = lo. FULL_STEPS: K == 32 * row_blocks
    and row_blocks is a multiple of BLOCKS (no partial block, no step past the row's end). PAIRS (mt.dot only):
    dequantize two weights per 32-bit word (`e2m1_pairs_to_bf16`) rather than one per register. PREFETCH (mt.dot
    only): weight steps loaded ahead, 1 or 2. WORDS (PAIRS only): wq_ptr points at the packed weights as int32
    words (a carried step is 4 registers per 16 bytes instead of one per byte, which a 2-deep prefetch needs).
    FOLD_BIAS (PAIRS only): every finite scale byte is <= FOLD_MAX_SCALE, so the 2**126 bias rides on the scale.
    WORD_ORDER (WORDS only): K ordered by the nibble positions inside each word (e2m1_word_pairs_to_bf16), four
    dots per step, no byte permutes on the weights. V_MASKED (mt.dot only): the vector loads keep their per-slot
    masks on whole steps too, so dead slots (most of NT = 8 at K3 batches up to 64: about 1.1 pairs per item) read
    nothing, at the price of predicated loads into zeroed registers. UNROLL_TAIL (mt.dot, PREFETCH 2, FULL_STEPS;
    -1: off): the K loop unrolled by 3 with (row_blocks / BLOCKS) % 3 = UNROLL_TAIL steps after it. LAYOUT6 (mt.dot,
    WORDS): the weights and scales are in the v6 layout (`_dot_step_v6`; the bias is folded by the layout)."""
    if USE_DOT:
        result = stream_rows_dot(wq_ptr, ws_ptr, row, live, v_ptr, v_index, v_stride, v_live, K, row_blocks,
                                 part_stride, ROWS, NT, BLOCKS, VMODE, FULL_STEPS, PAIRS, PREFETCH,
                                 WORDS, FOLD_BIAS, WORD_ORDER, V_MASKED, UNROLL_TAIL, LAYOUT6).reshape((ROWS, 1, NT))
    else:
        result = stream_rows_fma(wq_ptr, ws_ptr, row, live, v_ptr, v_index, v_stride, v_live, K, row_blocks,
                                 ROWS, TEAMS, NT, BLOCKS, FULL_STEPS)
    return result


@mt.func
def stream_rows_fma(wq_ptr, ws_ptr, row, live, v_ptr, v_index, v_stride, v_live, K, row_blocks,
                    ROWS, TEAMS, NT, BLOCKS, FULL_STEPS):
    """stream_rows on CUDA cores: acc [R, T, NT].

    Each step reads, per row and team, BLOCKS blocks: a [ROWS, TEAMS, BLOCKS, 16] byte tile (16 bytes per lane in
    the row-per-warp layout) and [ROWS, TEAMS, BLOCKS] scale bytes. FULL_STEPS lets the activations load without a
    mask: v_index must then name a real vector row for every slot (dead slots point at row 0; their products are
    discarded by the caller), which saves zeroing 32 registers per step for the masked loads."""
    lane_block = mt.arange(0, BLOCKS)
    j = mt.arange(0, 16)
    slot = mt.arange(0, NT)
    q_row = row * (row_blocks * 16)
    s_row = row * row_blocks
    acc = mt.zeros((ROWS, TEAMS, NT), mt.float32)
    # Register prefetch: the weight and scale bytes of step kb + BLOCKS are loaded before step kb is computed, so
    # every warp keeps a step of HBM loads in flight during its ALU work. Without it the loop is latency-bound (one
    # 16-byte load per lane, then a long dependent chain). Loads past the row's end are masked off. Two steps deep
    # measured worse: the codegen holds the byte tile as 16 registers per lane (one per byte), and rotating two
    # buffers cost ~30 register moves per step.
    q_next, s_next = load_weight_step(wq_ptr, ws_ptr, q_row, s_row, live, 0, lane_block, j, row_blocks)
    for kb in range(0, row_blocks, BLOCKS):
        blk = kb + lane_block
        q, s_bytes = q_next, s_next
        q_next, s_next = load_weight_step(wq_ptr, ws_ptr, q_row, s_row, live, kb + BLOCKS, lane_block, j,
                                          row_blocks)
        k_lo = blk[:, None] * 32 + j[None, :]  # a block's low nibbles are its elements 0..15, high ones 16..31
        scale = e8m0_to_f32(s_bytes)
        w_lo, w_hi = e2m1_to_f32(q)
        # One vector (pair slot s of every team) at a time keeps the product tile in the weights' 4-D layout.
        for s in mt.static_range(NT):
            pick = (slot == s)[None, :]
            v_row_s = mt.sum(mt.where(pick, v_index, 0), axis=1) * v_stride  # stride after the pick: aligned
            v_live_s = mt.sum((pick & v_live).to(mt.int32), axis=1) > 0
            v_at = v_ptr + v_row_s[:, None, None] + k_lo[None, :, :]
            if FULL_STEPS:
                v_lo = mt.load(v_at)
                v_hi = mt.load(v_at + 16)
            else:
                v_lo = mt.load(v_at, mask=v_live_s[:, None, None] & (k_lo < K)[None, :, :], other=0)
                v_hi = mt.load(v_at + 16, mask=v_live_s[:, None, None] & (k_lo + 16 < K)[None, :, :], other=0)
            x_lo = v_lo.to(mt.float32)[None, :, :, :]
            x_hi = v_hi.to(mt.float32)[None, :, :, :]
            # Two in-thread sums of plain products: each becomes one fma chain (1 FMUL + 15 FFMA) once ptxas
            # contracts the f32 multiplies into the chained adds of the reduction.
            part = mt.sum(w_lo * x_lo, axis=3) + mt.sum(w_hi * x_hi, axis=3)
            part = mt.sum(part * scale, axis=2)  # the block scale once per 32 weights
            acc += mt.where(pick[None, :, :], part[:, :, None], 0.0)
    return acc


@mt.func
def fragment_a(w, ROWS, H):
    """Weights [H, R, 4, 16] (w[h, r, t, j]: byte j of block (h, t) of row r) -> the A operand [R, 64 H], column
    64 h + 8 m + 2 t + p = w[h, r, t, 2 m + p]. Every element stays in its thread when the bytes were loaded with
    lane (g, t) holding rows g and g + 8, blocks (., t): exactly the m16n8k16 A fragments (columns 2 t, 2 t + 1
    of every 8), so the dot reads the dequantized weights from registers (no shared memory)."""
    return mt.trans(w.reshape((H, ROWS, 4, 8, 2)), 1, 0, 3, 2, 4).reshape((ROWS, H * 64))


@mt.func
def fragment_a_pairs(w, ROWS, H):
    """fragment_a for weights dequantized from words, [H, R, 4, 4, 2, 2] (w[h, r, t, w, k, p]: byte 4 w + 2 k + p
    of block (h, t) of row r): the same A operand [R, 64 H], column 64 h + 8 m + 2 t + p with m = 2 w + k."""
    return mt.trans(w, 1, 0, 3, 4, 2, 5).reshape((ROWS, H * 64))


@mt.func
def fragment_b(v, NT, H, JH, JL):
    """Vectors [JH, H, NT, 4, JL] (v[jh, h, n, t, jl]: element JL * jh + jl of block (h, t) of vector n; JL
    elements are 16 bytes) -> the B operand [64 H, NT] in fragment_a's K order. Loaded with lane (g, t) = (vector,
    block within 4), every element already sits in the thread of its m16n8k16 B fragment (K pairs 2 t, 2 t + 1 of
    every 8, column g): a register rename too."""
    return mt.trans(v.reshape((JH, H, NT, 4, JL // 2, 2)), 1, 0, 4, 3, 5, 2).reshape((H * 64, NT))


@mt.func
def load_fragment_bytes(wq_ptr, q_row, live, blk, j, row_blocks, FULL_STEPS, UNIT, UNMASKED=False):
    """The packed bytes [H, R, 4, UNIT] of blocks blk (i32 [H, 4]) of the rows at offsets q_row (i64 [R]) where
    `live`, j = arange(UNIT): 16 bytes per block, or 4 words when wq_ptr points at the blocks as int32 (the v4
    path: a loop-carried word tile is 4 registers per 16 bytes, a byte tile 16); blocks past the row's end read 0
    (FULL_STEPS: the caller keeps blk inside the row). UNMASKED: no mask at all (the caller points dead rows at a
    real row and discards their results), which saves zeroing the destination registers before every load."""
    at = wq_ptr + q_row[None, :, None, None] + (blk * UNIT)[:, None, :, None] + j[None, None, None, :]
    if UNMASKED:
        return mt.load(at)
    if FULL_STEPS:
        ok = live[None, :, None, None] & (j >= 0)[None, None, None, :]
    else:
        ok = live[None, :, None, None] & (blk < row_blocks)[:, None, :, None]
    return mt.load(at, mask=ok, other=0)


@mt.func
def load_masked(at, ok, UNMASKED):
    """mt.load(at, mask=ok, other=0), or without the mask when UNMASKED (every address is valid and the values
    behind a false `ok` are discarded by the caller)."""
    if UNMASKED:
        v = mt.load(at)
    else:
        v = mt.load(at, mask=ok, other=0)
    return v


@mt.func
def _dot_step(acc, q, blk, live1, row_blocks, s_row, ws_ptr, v_ptr, v_row, v_ok, K, part_stride, jh, jl, ROWS, NT, H,
              JH, JL, VMODE, FULL_STEPS, PAIRS, WORDS, FOLD_BIAS, WORD_ORDER, UNMASKED, V_UNMASKED, LAYOUT6):
    """One K step of stream_rows_dot: the weight words / bytes q of blocks blk ([H, 4]) dequantized with their
    scales (loaded here), the vector slices loaded, the dots accumulated into acc [ROWS, NT]. LAYOUT6: the words
    are in the v6 layout (`_dot_step_v6`), else the v5 one (`_dot_step_v5`)."""
    if LAYOUT6:
        acc = _dot_step_v6(acc, q, blk, live1, row_blocks, s_row, ws_ptr, v_ptr, v_row, v_ok, K, part_stride, ROWS,
                           NT, H, VMODE, FULL_STEPS, UNMASKED, V_UNMASKED)
    else:
        acc = _dot_step_v5(acc, q, blk, live1, row_blocks, s_row, ws_ptr, v_ptr, v_row, v_ok, K, part_stride, jh,
                           jl, ROWS, NT, H, JH, JL, VMODE, FULL_STEPS, PAIRS, WORDS, FOLD_BIAS, WORD_ORDER,
                           UNMASKED, V_UNMASKED)
    return acc


@mt.func
def _dot_step_v5(acc, q, blk, live1, row_blocks, s_row, ws_ptr, v_ptr, v_row, v_ok, K, part_stride, jh, jl, ROWS, NT,
                 H, JH, JL, VMODE, FULL_STEPS, PAIRS, WORDS, FOLD_BIAS, WORD_ORDER, UNMASKED, V_UNMASKED):
    """_dot_step on the v5 layout (and the v3 / v4 forms of it)."""
    s_ok = live1[None, :, None] & (blk < row_blocks)[:, None, :]
    s_bytes = load_masked(ws_ptr + s_row[None, :, None] + blk[:, None, :], s_ok, UNMASKED)
    if WORD_ORDER:  # pairs straight from the nibble positions of each word: 4 dots in the words' K order
        if FOLD_BIAS:
            scale = e8m0_to_bf16_times_2_126(s_bytes)[:, :, :, None, None]
        else:
            scale = e8m0_to_bf16(s_bytes)[:, :, :, None, None]
        x = q.to(mt.uint32, bitcast=True)
        w0, w16 = e2m1_word_pairs_to_bf16(x, FOLD_BIAS)
        w1, w17 = e2m1_word_pairs_to_bf16(x >> 8, FOLD_BIAS)
        a_lo = fragment_a_words(w0 * scale, ROWS, H)
        a_hi = fragment_a_words(w16 * scale, ROWS, H)
        a_lo1 = fragment_a_words(w1 * scale, ROWS, H)
        a_hi1 = fragment_a_words(w17 * scale, ROWS, H)
    elif PAIRS:  # two weights per 32-bit word down to the mma (bitcast_split)
        if FOLD_BIAS:  # the 2**126 rides on the scale: one packed multiply per pair
            scale = e8m0_to_bf16_times_2_126(s_bytes)[:, :, :, None, None, None]
        else:
            scale = e8m0_to_bf16(s_bytes)[:, :, :, None, None, None]
        w_lo, w_hi = e2m1_pairs_to_bf16(block_bytes(q, ROWS, H, WORDS), FOLD_BIAS)
        a_lo = fragment_a_pairs(w_lo * scale, ROWS, H)
        a_hi = fragment_a_pairs(w_hi * scale, ROWS, H)
    else:
        scale = e8m0_to_bf16(s_bytes)[:, :, :, None]
        w_lo, w_hi = e2m1_to_bf16(q)
        a_lo = fragment_a(w_lo * scale, ROWS, H)
        a_hi = fragment_a(w_hi * scale, ROWS, H)
    # The vectors as [JH, H, NT, 4, JL]: 16 bytes per lane, lanes (vector, block within 4) like the weights'.
    k_lo = (JL * jh)[:, None, None, None, None] + (blk * 32)[None, :, None, :, None] + jl[None, None, None, None, :]
    v_at = v_ptr + v_row[None, None, :, None, None] + k_lo
    if FULL_STEPS:
        v_lo = load_masked(v_at, v_ok[None, None, :, None, None], V_UNMASKED)
        v_hi = load_masked(v_at + 16, v_ok[None, None, :, None, None], V_UNMASKED)
    else:
        v_lo = mt.load(v_at, mask=v_ok[None, None, :, None, None] & (k_lo < K), other=0)
        v_hi = mt.load(v_at + 16, mask=v_ok[None, None, :, None, None] & (k_lo + 16 < K), other=0)
    if VMODE == 2 and WORD_ORDER:
        acc = dot_words(acc, a_lo, a_lo1, a_hi, a_hi1, v_lo, v_hi, NT, H, JH, JL)
    elif VMODE == 2:  # bf16 hi and lo parts of an f32 vector, split once by the producer
        acc = mt.dot(a_lo, fragment_b(v_lo, NT, H, JH, JL), acc)
        acc = mt.dot(a_hi, fragment_b(v_hi, NT, H, JH, JL), acc)
    if VMODE == 2:
        if FULL_STEPS:
            v_lo = load_masked(v_at + part_stride, v_ok[None, None, :, None, None], V_UNMASKED)
            v_hi = load_masked(v_at + part_stride + 16, v_ok[None, None, :, None, None], V_UNMASKED)
        else:
            v_lo = mt.load(v_at + part_stride, mask=v_ok[None, None, :, None, None] & (k_lo < K), other=0)
            v_hi = mt.load(v_at + part_stride + 16, mask=v_ok[None, None, :, None, None] & (k_lo + 16 < K),
                           other=0)
        if WORD_ORDER:
            acc = dot_words(acc, a_lo, a_lo1, a_hi, a_hi1, v_lo, v_hi, NT, H, JH, JL)
        else:
            acc = mt.dot(a_lo, fragment_b(v_lo, NT, H, JH, JL), acc)
            acc = mt.dot(a_hi, fragment_b(v_hi, NT, H, JH, JL), acc)
    elif VMODE == 1 and WORD_ORDER:
        v_lo_top = v_lo.to(mt.bfloat16)
        v_hi_top = v_hi.to(mt.bfloat16)
        acc = dot_words(acc, a_lo, a_lo1, a_hi, a_hi1, v_lo_top, v_hi_top, NT, H, JH, JL)
        acc = dot_words(acc, a_lo, a_lo1, a_hi, a_hi1, (v_lo - v_lo_top.to(mt.float32)).to(mt.bfloat16),
                        (v_hi - v_hi_top.to(mt.float32)).to(mt.bfloat16), NT, H, JH, JL)
    elif VMODE == 1:  # f32 vector: bf16 hi part + bf16 rest, two dots each (about 16 mantissa bits)
        v_lo_top = v_lo.to(mt.bfloat16)
        v_hi_top = v_hi.to(mt.bfloat16)
        acc = mt.dot(a_lo, fragment_b(v_lo_top, NT, H, JH, JL), acc)
        acc = mt.dot(a_hi, fragment_b(v_hi_top, NT, H, JH, JL), acc)
        acc = mt.dot(a_lo, fragment_b((v_lo - v_lo_top.to(mt.float32)).to(mt.bfloat16), NT, H, JH, JL), acc)
        acc = mt.dot(a_hi, fragment_b((v_hi - v_hi_top.to(mt.float32)).to(mt.bfloat16), NT, H, JH, JL), acc)
    elif WORD_ORDER:
        acc = dot_words(acc, a_lo, a_lo1, a_hi, a_hi1, v_lo, v_hi, NT, H, JH, JL)
    else:
        acc = mt.dot(a_lo, fragment_b(v_lo, NT, H, JH, JL), acc)
        acc = mt.dot(a_hi, fragment_b(v_hi, NT, H, JH, JL), acc)
    return acc


@mt.func
def stream_rows_dot(wq_ptr, ws_ptr, row, live, v_ptr, v_index, v_stride, v_live, K, row_blocks,
                    part_stride, ROWS, NT, BLOCKS, VMODE, FULL_STEPS, PAIRS, PREFETCH,
                    WORDS, FOLD_BIAS, WORD_ORDER, V_MASKED, UNROLL_TAIL=-1, LAYOUT6=False):
    """stream_rows on tensor cores (TEAMS == 1, ROWS a multiple of 16, BLOCKS of 4): acc [R, NT] with mt.dot.

    Each step reads BLOCKS blocks of every row as a [H, R, 4, 16] byte tile, H = BLOCKS / 4: byte j of block
    (h, t) = kb + 4 h + t. The tiling pass gives it 16 bytes per lane with lanes (g, t) = (row, block within 4),
    which is the lane order of the m16n8k16 A fragments, so `fragment_a` is a register rename and the dot takes
    the dequantized bf16 weights straight from registers. A lane holds whole blocks: one scale per 16 bytes. The
    weights are dequantized directly in bf16 in packed pairs: bias and scale are exact power-of-two multiplies
    (w * 2**(s - 127) has 2 significant bits: exact in bf16, subnormals included). The vectors are loaded the same
    way (lanes (vector, block within 4); NT == 8) and permuted by `fragment_b`, a register rename as well: no
    shared memory at all. FULL_STEPS drops the K bound from the vector loads' mask."""
    H = BLOCKS // 4
    row1 = mt.sum(row, axis=1)  # [R]: one item (TEAMS == 1)
    live1 = mt.sum(live.to(mt.int32), axis=1) > 0
    # v4 on whole steps: no load masks at all. Dead rows read row 0 and dead pair slots vector row 0 (the callers
    # point them there), and their products land in accumulator rows / columns that are never stored (masked
    # stores, the combine's `where`): no registers zeroed before each predicated load, no predicates.
    UNMASKED = FULL_STEPS and PAIRS
    V_UNMASKED = UNMASKED and not V_MASKED  # the vector loads' form (V_MASKED: dead slots read nothing)
    if UNMASKED:
        row1 = mt.where(live1, row1, 0)
    v_row = mt.sum(v_index, axis=0) * v_stride  # [NT]; the stride after the sum keeps the rows 16-aligned
    v_ok = mt.sum(v_live.to(mt.int32), axis=0) > 0
    UNIT = 4 if WORDS else 16  # the weights as int32 words or bytes
    if WORDS:  # not arange(0, 4)[None, :]: CSE would merge it with the word index j = arange(0, 4), one value
        blk_ht = mt.arange(0, 4 * H).reshape((H, 4))  # for two roles, and the tiling would mix their dims up
    else:
        blk_ht = 4 * mt.arange(0, H)[:, None] + mt.arange(0, 4)[None, :]  # [H, 4]: block of (h, t) in the step
    j = mt.arange(0, UNIT)
    JL = 4 if VMODE == 1 else 8  # vector elements per 16 bytes (f32 / bf16)
    JH = 16 // JL
    jh = mt.arange(0, JH)
    jl = mt.arange(0, JL)
    q_row = row1 * (row_blocks * UNIT)
    s_row = row1 * row_blocks
    acc = mt.zeros((ROWS, NT), mt.float32)
    # Register prefetch of the weight bytes, as on CUDA cores: step kb + BLOCKS's are in flight while step kb is
    # computed (the fragment layouts left the registers for it). The scale bytes (1/16 of the bytes) are loaded in
    # the step itself: not loop-carried, the tiling pass reads them straight in the weights' lanes (4 bytes per
    # lane), whereas a carried scale tile gets its own coalesced layout and a shared-memory conversion right
    # after its load, which would wait for it. Their latency hides behind the nibble decoding that precedes the
    # scale multiply, and a row's scales share sectors across steps (L2 hits).
    # PREFETCH = 2 keeps two steps in flight (q_next, q_next2: 16 more registers per lane), for more bytes in flight
    # per SM than one step per warp gives.
    q_next = load_fragment_bytes(wq_ptr, q_row, live1, blk_ht, j, row_blocks, FULL_STEPS, UNIT,
                                 UNMASKED)
    if PREFETCH == 2:
        if FULL_STEPS:
            kb_second = mt.minimum(BLOCKS, row_blocks - BLOCKS)
        else:
            kb_second = BLOCKS
        q_next2 = load_fragment_bytes(wq_ptr, q_row, live1, kb_second + blk_ht, j, row_blocks, FULL_STEPS, UNIT,
                                      UNMASKED)
    if UNROLL_TAIL >= 0:
        # PREFETCH 2 on whole steps, the loop unrolled by 3: three step buffers, each refilled right after its step
        # is computed, so two steps stay in flight as in the rotating form below, but no register moves between
        # iterations (the rotation costs 32 IMAD.MOV per step). UNROLL_TAIL = steps % 3 steps run after the loop.
        q_a, q_b = q_next, q_next2
        q_c = load_fragment_bytes(wq_ptr, q_row, live1, mt.minimum(2 * BLOCKS, row_blocks - BLOCKS) + blk_ht, j,
                                  row_blocks, FULL_STEPS, UNIT, UNMASKED)
        last = row_blocks - BLOCKS
        for kb in range(0, row_blocks - UNROLL_TAIL * BLOCKS, 3 * BLOCKS):
            acc = _dot_step(acc, q_a, kb + blk_ht, live1, row_blocks, s_row, ws_ptr, v_ptr, v_row, v_ok, K,
                            part_stride, jh, jl, ROWS, NT, H, JH, JL, VMODE, FULL_STEPS, PAIRS, WORDS, FOLD_BIAS,
                            WORD_ORDER, UNMASKED, V_UNMASKED, LAYOUT6)
            q_a = load_fragment_bytes(wq_ptr, q_row, live1, mt.minimum(kb + 3 * BLOCKS, last) + blk_ht, j,
                                      row_blocks, FULL_STEPS, UNIT, UNMASKED)
            acc = _dot_step(acc, q_b, kb + BLOCKS + blk_ht, live1, row_blocks, s_row, ws_ptr, v_ptr, v_row, v_ok,
                            K, part_stride, jh, jl, ROWS, NT, H, JH, JL, VMODE, FULL_STEPS, PAIRS, WORDS,
                            FOLD_BIAS, WORD_ORDER, UNMASKED, V_UNMASKED, LAYOUT6)
            q_b = load_fragment_bytes(wq_ptr, q_row, live1, mt.minimum(kb + 4 * BLOCKS, last) + blk_ht, j,
                                      row_blocks, FULL_STEPS, UNIT, UNMASKED)
            acc = _dot_step(acc, q_c, kb + 2 * BLOCKS + blk_ht, live1, row_blocks, s_row, ws_ptr, v_ptr, v_row,
                            v_ok, K, part_stride, jh, jl, ROWS, NT, H, JH, JL, VMODE, FULL_STEPS, PAIRS, WORDS,
                            FOLD_BIAS, WORD_ORDER, UNMASKED, V_UNMASKED, LAYOUT6)
            q_c = load_fragment_bytes(wq_ptr, q_row, live1, mt.minimum(kb + 5 * BLOCKS, last) + blk_ht, j,
                                      row_blocks, FULL_STEPS, UNIT, UNMASKED)
        tail = row_blocks - UNROLL_TAIL * BLOCKS
        if UNROLL_TAIL >= 1:
            acc = _dot_step(acc, q_a, tail + blk_ht, live1, row_blocks, s_row, ws_ptr, v_ptr, v_row, v_ok, K,
                            part_stride, jh, jl, ROWS, NT, H, JH, JL, VMODE, FULL_STEPS, PAIRS, WORDS, FOLD_BIAS,
                            WORD_ORDER, UNMASKED, V_UNMASKED, LAYOUT6)
        if UNROLL_TAIL == 2:
            acc = _dot_step(acc, q_b, tail + BLOCKS + blk_ht, live1, row_blocks, s_row, ws_ptr, v_ptr, v_row, v_ok,
                            K, part_stride, jh, jl, ROWS, NT, H, JH, JL, VMODE, FULL_STEPS, PAIRS, WORDS,
                            FOLD_BIAS, WORD_ORDER, UNMASKED, V_UNMASKED, LAYOUT6)
        return acc
    for kb in range(0, row_blocks, BLOCKS):
        q = q_next
        if FULL_STEPS:  # the last steps prefetch the last one again (an L2 hit) rather than reading past the row
            kb_next = mt.minimum(kb + PREFETCH * BLOCKS, row_blocks - BLOCKS)
        else:
            kb_next = kb + PREFETCH * BLOCKS
        if PREFETCH == 2:
            q_next = q_next2
            q_next2 = load_fragment_bytes(wq_ptr, q_row, live1, kb_next + blk_ht, j, row_blocks, FULL_STEPS, UNIT,
                                          UNMASKED)
        else:
            q_next = load_fragment_bytes(wq_ptr, q_row, live1, kb_next + blk_ht, j, row_blocks, FULL_STEPS, UNIT,
                                         UNMASKED)
        acc = _dot_step(acc, q, kb + blk_ht, live1, row_blocks, s_row, ws_ptr, v_ptr, v_row, v_ok, K, part_stride,
                        jh, jl, ROWS, NT, H, JH, JL, VMODE, FULL_STEPS, PAIRS, WORDS, FOLD_BIAS, WORD_ORDER,
                        UNMASKED, V_UNMASKED, LAYOUT6)
    return acc


# ------------------------------------------------------------------------------------------ kernels


@mt.func
def item_count(n_items_ptr, n_pairs, DEDUP: mt.constexpr):
    """How many work items the kernels stream: the deduplicated (expert, token group) count the routing wrote on the
    device, or one item per routed pair without deduplication."""
    n = n_pairs
    if DEDUP:
        n = mt.load(n_items_ptr)
    return n


@mt.kernel
def gate_up_kernel(x_ptr, ids_ptr, pairs_ptr, first_ptr, n_items_ptr, wq_ptr, ws_ptr, h_ptr,
                   n_pairs, topk, D, I, row_blocks,
                   ROWS: mt.constexpr, TEAMS: mt.constexpr, BLOCKS: mt.constexpr, NT: mt.constexpr,
                   DEDUP: mt.constexpr, USE_DOT: mt.constexpr, FULL_STEPS: mt.constexpr,
                   H_PARTS: mt.constexpr = False, PAIRS: mt.constexpr = False,
                   PREFETCH: mt.constexpr = 1, WORDS: mt.constexpr = False, FOLD_BIAS: mt.constexpr = False,
                   WORD_ORDER: mt.constexpr = False, V_MASKED: mt.constexpr = False,
                   H_BF16: mt.constexpr = False, UNROLL_TAIL: mt.constexpr = -1, LAYOUT6: mt.constexpr = False):
    """h[p, i] = silu(gate_i . x) * (up_i . x) for every routed pair p = b * topk + j, in fp32; with H_PARTS as
    bf16 parts instead, h_ptr[0, p, i] = bf16(h) and h_ptr[1, p, i] = bf16(h - bf16(h)) (what the mt.dot down
    kernel feeds its tensor cores: split once here rather than by each of its programs).

    The program owns ROWS weight rows: neurons pid * ROWS/2 + r // 2, the gate row (r even, row i of W13) and the
    up row (r odd, row I + i), and loops over every num_programs(1)-th group of TEAMS work items, starting at group
    program_id(1) (the item split: more programs when there are few rows per program, as on the mt.dot path)."""
    HALF = ROWS // 2
    r = mt.arange(0, ROWS)
    neuron = mt.program_id(0) * HALF + r // 2
    row_ok = neuron < I
    w_row = (r % 2) * I + neuron
    out_neuron = mt.program_id(0) * HALF + mt.arange(0, HALF)
    is_gate = (mt.arange(0, 2) == 0)[None, :, None, None]
    n_items = item_count(n_items_ptr, n_pairs, DEDUP)
    for it0 in range(mt.program_id(1) * TEAMS, n_items, TEAMS * mt.num_programs(1)):
        item_ok, pair, pair_ok, expert = load_items(it0, n_items, ids_ptr, pairs_ptr, first_ptr, TEAMS, NT,
                                                    DEDUP)
        row = expert.to(mt.int64)[None, :] * (2 * I) + w_row[:, None]
        acc = stream_rows(wq_ptr, ws_ptr, row, row_ok[:, None] & item_ok[None, :], x_ptr,
                          mt.where(pair_ok, pair, 0) // topk, D, pair_ok, D, row_blocks, 0, ROWS, TEAMS, NT,
                          BLOCKS, USE_DOT, 0, FULL_STEPS, PAIRS, PREFETCH, WORDS, FOLD_BIAS,
                          WORD_ORDER, V_MASKED, UNROLL_TAIL, LAYOUT6)
        acc = acc.reshape((HALF, 2, TEAMS, NT))
        gate = mt.sum(mt.where(is_gate, acc, 0.0), axis=1)
        up = mt.sum(mt.where(is_gate, 0.0, acc), axis=1)
        h = gate * mt.sigmoid(gate) * up
        h_at = h_ptr + pair[None, :, :] * I + out_neuron[:, None, None]
        h_ok = (out_neuron < I)[:, None, None] & pair_ok[None, :, :]
        if H_PARTS:
            top = h.to(mt.bfloat16)
            mt.store(h_at, top, mask=h_ok)
            mt.store(h_at + n_pairs * I, (h - top.to(mt.float32)).to(mt.bfloat16), mask=h_ok)
        elif H_BF16:  # one bf16 part (h_ptr bf16 [pairs, I])
            mt.store(h_at, h.to(mt.bfloat16), mask=h_ok)
        else:
            mt.store(h_at, h, mask=h_ok)


@mt.kernel
def down_kernel(h_ptr, ids_ptr, wts_ptr, pairs_ptr, first_ptr, n_items_ptr, wq_ptr, ws_ptr, out_ptr,
                n_pairs, topk, batch, D, I, row_blocks,
                ROWS: mt.constexpr, TEAMS: mt.constexpr, BLOCKS: mt.constexpr, NT: mt.constexpr, BT: mt.constexpr,
                DEDUP: mt.constexpr, USE_DOT: mt.constexpr, FULL_STEPS: mt.constexpr,
                H_PARTS: mt.constexpr = False, PAIRS: mt.constexpr = False,
                   PREFETCH: mt.constexpr = 1, WORDS: mt.constexpr = False, FOLD_BIAS: mt.constexpr = False,
                   WORD_ORDER: mt.constexpr = False, V_MASKED: mt.constexpr = False,
                   H_BF16: mt.constexpr = False, UNROLL_TAIL: mt.constexpr = -1, LAYOUT6: mt.constexpr = False):
    """out[b, d] = sum_j w[b, j] * (W2[e_bj, d] . h[b * topk + j]) with the weighted combine fused (h fp32, or with
    H_PARTS (mt.dot only) gate_up's bf16 parts [2, pairs, I]): the program keeps
    a [ROWS, BT] fp32 accumulator (rows x tokens) over its work items and writes each output once. With an item
    split (num_programs(1) > 1) program (i, s) takes every num_programs(1)-th group of items from group s and writes
    its partial sums to out[s] of an fp32 [splits, batch, D] buffer, which the host sums (deterministically)."""
    d = mt.program_id(0) * ROWS + mt.arange(0, ROWS)
    row_ok = d < D
    token = mt.arange(0, BT)
    out = mt.zeros((ROWS, BT), mt.float32)
    n_items = item_count(n_items_ptr, n_pairs, DEDUP)
    for it0 in range(mt.program_id(1) * TEAMS, n_items, TEAMS * mt.num_programs(1)):
        item_ok, pair, pair_ok, expert = load_items(it0, n_items, ids_ptr, pairs_ptr, first_ptr, TEAMS, NT,
                                                    DEDUP)
        row = expert.to(mt.int64)[None, :] * D + d[:, None]
        acc = stream_rows(wq_ptr, ws_ptr, row, row_ok[:, None] & item_ok[None, :], h_ptr,
                          mt.where(pair_ok, pair, 0), I, pair_ok, I, row_blocks, n_pairs * I, ROWS, TEAMS, NT,
                          BLOCKS, USE_DOT, 0 if H_BF16 else (2 if H_PARTS else 1), FULL_STEPS, PAIRS, PREFETCH, WORDS,
                          FOLD_BIAS, WORD_ORDER, V_MASKED, UNROLL_TAIL, LAYOUT6)
        weight = mt.load(wts_ptr + pair, mask=pair_ok, other=0.0)
        mine = ((pair // topk)[:, :, None] == token[None, None, :]) & pair_ok[:, :, None]  # [T, NT, BT]
        contrib = mt.where(mine[None, :, :, :], (acc * weight[None, :, :])[:, :, :, None], 0.0)
        out += mt.sum(mt.sum(contrib, axis=2), axis=1)
    split_at = out_ptr + mt.program_id(1).to(mt.int64) * (batch * D)
    mt.store(split_at + token[None, :] * D + d[:, None], out, mask=row_ok[:, None] & (token < batch)[None, :])


def _signature(kind: str, pairs: str, h: str = "fp32", wq: str = "u8") -> str:
    """AOT signature of gate_up_kernel / down_kernel; `pairs` is i32 without dedup (the ids stand in), i64 with it
    (torch.sort's indices); `h` is fp32, or bf16 for the H_PARTS form of h; `wq` the packed weights as bytes (u8)
    or, on the PAIRS path, int32 words (i32)."""
    common = (f"ids_ptr:*i32:16,pairs_ptr:*{pairs}:16,first_ptr:*i32:16,n_items_ptr:*i32:16,wq_ptr:*{wq}:16,"
              "ws_ptr:*u8:16")
    if kind == "gate_up":
        return (f"x_ptr:*bf16:16,{common},h_ptr:*{h}:16,n_pairs:i32:16,topk:i32:16,D:i32:16,I:i32:16,"
                "row_blocks:i32:16")
    return (f"h_ptr:*{h}:16,ids_ptr:*i32:16,wts_ptr:*fp32:16,pairs_ptr:*{pairs}:16,first_ptr:*i32:16,"
            f"n_items_ptr:*i32:16,wq_ptr:*{wq}:16,ws_ptr:*u8:16,out_ptr:*bf16:16,n_pairs:i32:16,topk:i32:16,batch:i32,"
            "D:i32:16,I:i32:16,row_blocks:i32:16")


# The down kernel at 16 resident one-warp programs per SM (128 registers; ptxas spills about 100-200 B) instead of
# 12 at its natural 168-170 (ncu, 2026-11-29: 14% achieved occupancy, long-scoreboard stalls first): KernelConfig
# min_blocks=16 selects it (variant v5_p2_lb).
down_kernel_16 = mt.kernel(min_blocks_per_sm=16)(down_kernel.fn)
# The same cap for gate_up (its K loop unrolled by 3 takes 168 registers uncapped, v5_p2_lb_h16_u3).
gate_up_kernel_16 = mt.kernel(min_blocks_per_sm=16)(gate_up_kernel.fn)


@mt.kernel
def sum_splits_kernel(part_ptr, out_ptr, n, splits, BLOCK: mt.constexpr):
    """out[i] = sum over s of part[s * n + i], in s order (deterministic), stored in out's dtype: the down kernel's
    fp32 split partials combined and rounded in one launch (torch's sum then cast took two, ~8 us at B = 1)."""
    i = mt.program_id(0) * BLOCK + mt.arange(0, BLOCK)
    ok = i < n
    total = mt.zeros((BLOCK,), mt.float32)
    for s in range(0, splits):
        total += mt.load(part_ptr + s * n + i, mask=ok, other=0.0)
    mt.store(out_ptr + i, total, mask=ok)


# K3 (D=3584, I=3072, top-16): B = 1 on CUDA cores (2 lane teams for the 112-block rows of W13), B = 16 on mt.dot
# (h passed as bf16 parts, as moe_decode does).
gate_up_kernel.specialize(signature=_signature("gate_up", "i32"), ROWS=8, TEAMS=2, BLOCKS=16, NT=1, DEDUP=False,
                          USE_DOT=False, FULL_STEPS=True, num_warps=8)
down_kernel.specialize(signature=_signature("down", "i32"), ROWS=8, TEAMS=1, BLOCKS=32, NT=1, BT=1, DEDUP=False,
                       USE_DOT=False, FULL_STEPS=True, num_warps=8)
gate_up_kernel.specialize(signature=_signature("gate_up", "i64", "bf16"), ROWS=16, TEAMS=1, BLOCKS=8, NT=8,
                          DEDUP=True, USE_DOT=True, FULL_STEPS=True, H_PARTS=True, num_warps=1)
down_kernel.specialize(signature=_signature("down", "i64", "bf16"), ROWS=16, TEAMS=1, BLOCKS=8, NT=8, BT=16,
                       DEDUP=True, USE_DOT=True, FULL_STEPS=True, H_PARTS=True, num_warps=1)
# v4 (docs/kernels/warp_decode.md): weights dequantized in pairs (bitcast_split), the bias folded or not, read as
# bytes or as int32 words, one or two steps prefetched.
for _words, _prefetch, _fold, _order in ((False, 1, False, False), (False, 1, True, False), (True, 1, True, False),
                                         (True, 2, True, False), (True, 1, True, True), (True, 2, True, True)):
    _wq = "i32" if _words else "u8"
    gate_up_kernel.specialize(signature=_signature("gate_up", "i64", "bf16", _wq), ROWS=16, TEAMS=1, BLOCKS=8, NT=8,
                              DEDUP=True, USE_DOT=True, FULL_STEPS=True, H_PARTS=True, PAIRS=True,
                              PREFETCH=_prefetch, WORDS=_words, FOLD_BIAS=_fold, WORD_ORDER=_order, num_warps=1)
    down_kernel.specialize(signature=_signature("down", "i64", "bf16", _wq), ROWS=16, TEAMS=1, BLOCKS=8, NT=8,
                           BT=16, DEDUP=True, USE_DOT=True, FULL_STEPS=True, H_PARTS=True, PAIRS=True,
                           PREFETCH=_prefetch, WORDS=_words, FOLD_BIAS=_fold, WORD_ORDER=_order, num_warps=1)


# ------------------------------------------------------------------------------------------ v7 kernels
#
# The v6 K step on the v7 layout, with the launch-side changes of 2026-12-01 (late) (docs/kernels/warp_decode.md):
# - the step's scale bytes come as one int32 word per lane (PreparedExperts.scale_words), loaded and carried with
#   the weights two steps ahead (v6: four byte loads in the step, from 8 rows each, waited on in the step);
# - a program's 16 rows are 8 p + g and half + 8 p + g (V7_GROUP): rows g and g + 8 of the mma fragments, one
#   thread. gate_up pairs gate and up of a neuron in-thread (no shared memory, no barrier in its epilogue);
# - down writes each routed pair's weighted contribution once to an fp32 [topk, B, D] buffer (every element written
#   exactly once: each pair is in one item, each item in one split), and sum_slots_kernel adds the topk slots in
#   order: no [ROWS, BT] accumulator, no one-hot combine over BT per item (the BT = 16 / 64 spills), any split;
# - per item a scalar base (its expert's words, its tile's scale words) and item-invariant i32 row offsets;
# - options: the weight loads' cache operator (WCACHE, e.g. ".cg": weights do not evict x / h / scale lines from
#   L1), each item's vector rows prefetched into L1 at its start (VPF: mt.prefetch, no registers), and XITEM: the
#   next item's tables loaded at an item's start and its first three steps by this item's last refills
#   (kloop_x_v7), so items after a program's first never wait for their tables or first weights.


@mt.func
def scale_pairs_v7(sw, ROWS, H):
    """A step's scale words [8, 4] (int32; lane (g, t): byte 2 h + rr = the biased scale of block 4 h + t of tile
    rows g + 8 rr) -> bf16 scale pairs [H, ROWS, 4, 2] (e8m0_v6_to_bf16_pair of each byte): two bit-field splits,
    one multiply per byte, then renames (every element stays in its thread: rows g, g + 8 are the lane's)."""
    b = mt.bitcast_split(mt.bitcast_split(sw.to(mt.uint32, bitcast=True), mt.uint16), mt.uint8)  # [8, 4, h, rr]
    pair = mt.bitcast_split(b.to(mt.uint32) * 0x00800080, mt.bfloat16)  # [8, 4, 2, 2, 2]
    return mt.trans(pair, 2, 3, 0, 1, 4).reshape((H, ROWS, 4, 2))


@mt.func
def load_step_v7(wq_e, q_off, live1, sw_e, lane, kb, blk_ht, j, row_blocks, FULL_STEPS, WCACHE, L2PF):
    """The weight words [H, R, 4, 4] of blocks kb + blk_ht and the step's scale words [8, 4] (kb a multiple of
    V7_STEP; FULL_STEPS: the callers keep kb inside the row, else steps past the row's end read zeros). wq_e /
    sw_e: the item's expert (its words, its tile's scale words), scalars; q_off (i32 [R]): the tile rows' word
    offsets in an expert, the same for every item (a scalar base per item instead of 64-bit row pointers)."""
    at = wq_e + (q_off[None, :, None, None] + ((kb + blk_ht) * 4)[:, None, :, None] + j[None, None, None, :])
    if FULL_STEPS:
        q = mt.load(at, cache_modifier=WCACHE, l2_prefetch=L2PF)
        sw = mt.load(sw_e + (lane + kb * 4), l2_prefetch=L2PF)
    else:
        ok = live1[None, :, None, None] & ((kb + blk_ht) < row_blocks)[:, None, :, None]
        q = mt.load(at, mask=ok, other=0, cache_modifier=WCACHE, l2_prefetch=L2PF)
        sw = mt.load(sw_e + (lane + kb * 4), mask=(lane >= 0) & (kb < row_blocks), other=0, l2_prefetch=L2PF)
    return q, sw


V7_PREFETCH_LINES = 64  # VPF: the first 64 lines of 128 bytes (4096 bf16) of each live slot's vector row


@mt.func
def prefetch_vector_v7(v_ptr, v_row, v_ok, K):
    """VPF: mt.prefetch into L1 of the item's vector rows (its live slots'; up to V7_PREFETCH_LINES lines each), at
    the item's start: one pointer per 128-byte line, converted to the prefetch's layout once per item (a per-step
    prefetch's pointer tile went through shared memory every step)."""
    line = mt.arange(0, V7_PREFETCH_LINES)
    mt.prefetch(v_ptr + v_row[:, None] + 64 * line[None, :], mask=v_ok[:, None] & (64 * line < K)[None, :],
                level="L1")


@mt.func
def load_vector_v7(vb, vk, kb, k_ht, K, FULL_STEPS):
    """The step's vector slices o = 0..3 ([H, NT, 4, 8] each) from the slots' rows vb ([1, NT, 1, 1]) at blocks
    kb + (h, t) (k_ht [H, 1, 4, 8]: elements 0..7 of each block of a step at kb = 0)."""
    k = kb * 32 + k_ht
    return load_vector_v6(vb + k, vk, k, K, FULL_STEPS, FULL_STEPS)


@mt.func
def _dot_step_v7(acc, q, sw, v0, v1, v2, v3, ROWS, NT, H):
    """One v7 K step: the v6 dequant of the words q with the carried scale words sw, four dots against the vector
    slices v0..v3 ([H, NT, 4, 8] each, used as loaded)."""
    scale = scale_pairs_v7(sw, ROWS, H)[:, :, :, None, :]
    w0, w1, w2, w3 = e2m1_v6_word_to_bf16_pairs(q.to(mt.uint32, bitcast=True))
    a0 = fragment_a_words(w0 * scale, ROWS, H)
    a1 = fragment_a_words(w1 * scale, ROWS, H)
    a2 = fragment_a_words(w2 * scale, ROWS, H)
    a3 = fragment_a_words(w3 * scale, ROWS, H)
    return dot_v6(acc, a0, a1, a2, a3, v0, v1, v2, v3, NT, H)


@mt.func
def step_v7(acc, q, sw, vb, vk, kb, k_ht, K, ROWS, NT, H, FULL_STEPS):
    """A v7 step, its vector loaded in the step."""
    v0, v1, v2, v3 = load_vector_v7(vb, vk, kb, k_ht, K, FULL_STEPS)
    return _dot_step_v7(acc, q, sw, v0, v1, v2, v3, ROWS, NT, H)


@mt.func
def stream_rows_v7(wq_e, q_off, live1, sw_e, lane, blk_ht, v_ptr, v_row, v_ok, K, row_blocks, ROWS, NT,
                   FULL_STEPS, UNROLL_TAIL, WCACHE, L2PF, VPF, GDC=False):
    """acc [ROWS, NT] = W[rows] . v[v_row + k] over the row's K (v7: words in the v6 layout from wq_e + q_off,
    scale words sw_e + 32 per step; see load_step_v7): two steps of weights and scale words in flight, the K loop
    unrolled by 3 on whole steps (UNROLL_TAIL = steps % 3 after it), else a rotating loop (masked steps). The
    vector's row pointers and masks are expanded here, once per item, so their layout conversions stay out of
    the K loop."""
    H = 2
    B = 8  # blocks per step
    j = mt.arange(0, 4)
    vb = v_ptr + v_row[None, :, None, None]
    vk = v_ok[None, :, None, None]
    k_ht = (blk_ht * 32)[:, None, :, None] + mt.arange(0, 8)[None, None, None, :]
    if VPF:
        prefetch_vector_v7(v_ptr, v_row, v_ok, K)
    acc = mt.zeros((ROWS, NT), mt.float32)
    if UNROLL_TAIL >= 0:
        last = row_blocks - B
        q_a, s_a = load_step_v7(wq_e, q_off, live1, sw_e, lane, 0, blk_ht, j, row_blocks, FULL_STEPS, WCACHE, L2PF)
        q_b, s_b = load_step_v7(wq_e, q_off, live1, sw_e, lane, mt.minimum(B, last), blk_ht, j, row_blocks,
                                FULL_STEPS, WCACHE, L2PF)
        q_c, s_c = load_step_v7(wq_e, q_off, live1, sw_e, lane, mt.minimum(2 * B, last), blk_ht, j, row_blocks,
                                FULL_STEPS, WCACHE, L2PF)
        if GDC:
            wait_then_release()
        for kb in range(0, row_blocks - UNROLL_TAIL * B, 3 * B):
            acc = step_v7(acc, q_a, s_a, vb, vk, kb, k_ht, K, ROWS, NT, H, FULL_STEPS)
            q_a, s_a = load_step_v7(wq_e, q_off, live1, sw_e, lane, mt.minimum(kb + 3 * B, last), blk_ht, j,
                                    row_blocks, FULL_STEPS, WCACHE, L2PF)
            acc = step_v7(acc, q_b, s_b, vb, vk, kb + B, k_ht, K, ROWS, NT, H, FULL_STEPS)
            q_b, s_b = load_step_v7(wq_e, q_off, live1, sw_e, lane, mt.minimum(kb + 4 * B, last), blk_ht, j,
                                    row_blocks, FULL_STEPS, WCACHE, L2PF)
            acc = step_v7(acc, q_c, s_c, vb, vk, kb + 2 * B, k_ht, K, ROWS, NT, H, FULL_STEPS)
            q_c, s_c = load_step_v7(wq_e, q_off, live1, sw_e, lane, mt.minimum(kb + 5 * B, last), blk_ht, j,
                                    row_blocks, FULL_STEPS, WCACHE, L2PF)
        tail = row_blocks - UNROLL_TAIL * B
        if UNROLL_TAIL >= 1:
            acc = step_v7(acc, q_a, s_a, vb, vk, tail, k_ht, K, ROWS, NT, H, FULL_STEPS)
        if UNROLL_TAIL == 2:
            acc = step_v7(acc, q_b, s_b, vb, vk, tail + B, k_ht, K, ROWS, NT, H, FULL_STEPS)
        return acc
    q_next, s_next = load_step_v7(wq_e, q_off, live1, sw_e, lane, 0, blk_ht, j, row_blocks, FULL_STEPS, WCACHE, L2PF)
    q_next2, s_next2 = load_step_v7(wq_e, q_off, live1, sw_e, lane, B, blk_ht, j, row_blocks, FULL_STEPS,
                                    WCACHE, L2PF)
    if GDC:
        wait_then_release()
    for kb in range(0, row_blocks, B):
        q, s = q_next, s_next
        q_next, s_next = q_next2, s_next2
        q_next2, s_next2 = load_step_v7(wq_e, q_off, live1, sw_e, lane, kb + 2 * B, blk_ht, j, row_blocks,
                                        FULL_STEPS, WCACHE, L2PF)
        acc = step_v7(acc, q, s, vb, vk, kb, k_ht, K, ROWS, NT, H, FULL_STEPS)
    return acc


@mt.func
def wait_then_release():
    """GDC (programmatic dependent launch): wait for the previous kernel in the stream (its writes visible), then let
    the next one start. stream_rows_v7 waits after an item's first weight loads, so they overlap the previous
    kernel's tail; what came before (the routing tables, the experts' bases) was written by kernels that finished
    before the previous one started."""
    mt.grid_dependency_wait()
    mt.launch_dependents()


@mt.func
def item_v7(it0, n_items, ids_ptr, pairs_ptr, first_ptr, NT, DEDUP):
    """One work item (TEAMS = 1): (pair [NT], pair_ok [NT], expert (i64 scalar))."""
    item_ok, pair, pair_ok, expert = load_items(it0, n_items, ids_ptr, pairs_ptr, first_ptr, 1, NT, DEDUP)
    return mt.sum(pair, axis=0), mt.sum(pair_ok.to(mt.int32), axis=0) > 0, mt.sum(expert, axis=0).to(mt.int64)


@mt.func
def kloop_x_v7(q_a, s_a, q_b, s_b, q_c, s_c, q_off, wq_e, sw_e, wq_n, sw_n, lane, blk_ht, vb, vk, K, row_blocks,
               ROWS, NT, UNROLL_TAIL, WCACHE, L2PF):
    """The K loop of XITEM (whole steps, >= 3 of them): q_a .. s_c hold this item's first three steps (loaded by
    the previous item); the loop is unrolled by 3 with its last iteration peeled, so only the peeled iteration and
    the tail refill from the next item (its expert's words wq_n / scale words sw_n, its steps 0, 1, 2), nine or
    more steps after the item's start: the next item's tables, loaded then, are waited for only there. Without a
    next item the caller passes this item's bases (those refills read its first steps again: L2 hits). Returns
    the accumulator and the next item's first three steps in order (the buffers rotate by steps % 3)."""
    H = 2
    B = 8
    j = mt.arange(0, 4)
    k_ht = (blk_ht * 32)[:, None, :, None] + mt.arange(0, 8)[None, None, None, :]
    acc = mt.zeros((ROWS, NT), mt.float32)
    peel = row_blocks - UNROLL_TAIL * B - 3 * B  # the last unrolled iteration's first block
    for kb in range(0, peel, 3 * B):
        acc = step_v7(acc, q_a, s_a, vb, vk, kb, k_ht, K, ROWS, NT, H, True)
        q_a, s_a = load_step_v7(wq_e, q_off, lane, sw_e, lane, kb + 3 * B, blk_ht, j, row_blocks, True, WCACHE, L2PF)
        acc = step_v7(acc, q_b, s_b, vb, vk, kb + B, k_ht, K, ROWS, NT, H, True)
        q_b, s_b = load_step_v7(wq_e, q_off, lane, sw_e, lane, kb + 4 * B, blk_ht, j, row_blocks, True, WCACHE, L2PF)
        acc = step_v7(acc, q_c, s_c, vb, vk, kb + 2 * B, k_ht, K, ROWS, NT, H, True)
        q_c, s_c = load_step_v7(wq_e, q_off, lane, sw_e, lane, kb + 5 * B, blk_ht, j, row_blocks, True, WCACHE, L2PF)
    # the peeled iteration: refill i loads stream step (steps - UNROLL_TAIL + i): this item's while i < UNROLL_TAIL,
    # else the next item's step i - UNROLL_TAIL
    acc = step_v7(acc, q_a, s_a, vb, vk, peel, k_ht, K, ROWS, NT, H, True)
    if UNROLL_TAIL >= 1:
        q_a, s_a = load_step_v7(wq_e, q_off, lane, sw_e, lane, peel + 3 * B, blk_ht, j, row_blocks, True, WCACHE, L2PF)
    else:
        q_a, s_a = load_step_v7(wq_n, q_off, lane, sw_n, lane, 0, blk_ht, j, row_blocks, True, WCACHE, L2PF)
    acc = step_v7(acc, q_b, s_b, vb, vk, peel + B, k_ht, K, ROWS, NT, H, True)
    if UNROLL_TAIL == 2:
        q_b, s_b = load_step_v7(wq_e, q_off, lane, sw_e, lane, peel + 4 * B, blk_ht, j, row_blocks, True, WCACHE, L2PF)
    else:
        q_b, s_b = load_step_v7(wq_n, q_off, lane, sw_n, lane, (1 - UNROLL_TAIL) * B, blk_ht, j, row_blocks,
                                True, WCACHE, L2PF)
    acc = step_v7(acc, q_c, s_c, vb, vk, peel + 2 * B, k_ht, K, ROWS, NT, H, True)
    q_c, s_c = load_step_v7(wq_n, q_off, lane, sw_n, lane, (2 - UNROLL_TAIL) * B, blk_ht, j, row_blocks,
                            True, WCACHE, L2PF)
    tail = row_blocks - UNROLL_TAIL * B
    if UNROLL_TAIL >= 1:
        acc = step_v7(acc, q_a, s_a, vb, vk, tail, k_ht, K, ROWS, NT, H, True)
        q_a, s_a = load_step_v7(wq_n, q_off, lane, sw_n, lane, (3 - UNROLL_TAIL) * B, blk_ht, j, row_blocks,
                                True, WCACHE, L2PF)
    if UNROLL_TAIL == 2:
        acc = step_v7(acc, q_b, s_b, vb, vk, tail + B, k_ht, K, ROWS, NT, H, True)
        q_b, s_b = load_step_v7(wq_n, q_off, lane, sw_n, lane, 2 * B, blk_ht, j, row_blocks, True, WCACHE, L2PF)
    if UNROLL_TAIL == 1:
        q_a, s_a, q_b, s_b, q_c, s_c = q_b, s_b, q_c, s_c, q_a, s_a
    if UNROLL_TAIL == 2:
        q_a, s_a, q_b, s_b, q_c, s_c = q_c, s_c, q_a, s_a, q_b, s_b
    return acc, q_a, s_a, q_b, s_b, q_c, s_c


@mt.func
def first_steps_v7(wq_e, q_off, sw_e, lane, blk_ht, row_blocks, WCACHE, L2PF):
    """XITEM: the first item's steps 0, 1, 2 (before the item loop)."""
    j = mt.arange(0, 4)
    q_a, s_a = load_step_v7(wq_e, q_off, lane, sw_e, lane, 0, blk_ht, j, row_blocks, True, WCACHE, L2PF)
    q_b, s_b = load_step_v7(wq_e, q_off, lane, sw_e, lane, 8, blk_ht, j, row_blocks, True, WCACHE, L2PF)
    q_c, s_c = load_step_v7(wq_e, q_off, lane, sw_e, lane, 16, blk_ht, j, row_blocks, True, WCACHE, L2PF)
    return q_a, s_a, q_b, s_b, q_c, s_c


@mt.func
def store_h_v7(acc, h_ptr, pair, pair_ok, neuron, I):
    """gate_up's epilogue: acc [16, NT] (tile rows g: gate, g + 8: up of neuron[g]) -> bf16 h[pair, neuron]. Rows g
    and g + 8 sit in one thread; this form of the pairing (a size-1 dim kept, a 3-D store) is the one ptxas fits
    in 128 registers ([2, 8, NT] with 2-D sums spilled 148 B; the reshape of the mma accumulator goes through
    shared memory either way: tiling's split_layout takes blocked layouts only)."""
    acc = acc.reshape((2, 8, 1, acc.shape[1]))
    is_gate = (mt.arange(0, 2) == 0)[:, None, None, None]
    gate = mt.sum(mt.where(is_gate, acc, 0.0), axis=0)
    up = mt.sum(mt.where(is_gate, 0.0, acc), axis=0)
    h = gate * mt.sigmoid(gate) * up
    mt.store(h_ptr + pair[None, None, :] * I + neuron[:, None, None], h.to(mt.bfloat16),
             mask=(neuron < I)[:, None, None] & pair_ok[None, None, :])


@mt.func
def store_part_v7(acc, part_ptr, wts_ptr, pair, pair_ok, d, row_ok, topk, batch, D):
    """down's epilogue: each live pair's weighted contribution, part[pair % topk, pair // topk, d] (written once)."""
    weight = mt.load(wts_ptr + pair, mask=pair_ok, other=0.0)
    slot_row = ((pair % topk).to(mt.int64) * batch + pair // topk) * D
    mt.store(part_ptr + slot_row[None, :] + d[:, None], acc * weight[None, :], mask=row_ok[:, None] & pair_ok[None, :])


@mt.func
def bases_v7(expert, wq_ptr, sw_ptr, expert_rows, row_blocks, tile_words, steps, tile):
    """An item's scalar bases: its expert's weight words, and the scale words of row tile `tile` of it."""
    return (wq_ptr + expert * (expert_rows * row_blocks * 4),
            sw_ptr + (expert * tile_words + tile * (steps * 32)))


@mt.func
def gate_up_tile_v7(tile, I, row_blocks):
    """Row tile `tile` of W13 (V7_GROUP neurons): (row_ok [16], q_off [16] word offsets in an expert (dead rows: row
    0), neuron [8]); tile rows g: gate, g + 8: up of neuron 8 tile + g."""
    r = mt.arange(0, 16)
    local = tile * 8 + r % 8
    row_ok = local < I
    return row_ok, mt.where(row_ok, (r // 8) * I + local, 0) * (row_blocks * 4), tile * 8 + mt.arange(0, 8)


@mt.func
def down_tile_v7(tile, D, row_blocks):
    """Row tile `tile` of W2: (d [16] the output rows 8 tile + g and half + 8 tile + g, row_ok [16], q_off [16])."""
    half = (D + 1) // 2
    r = mt.arange(0, 16)
    local = tile * 8 + r % 8
    d = (r // 8) * half + local
    row_ok = (local < half) & (d < D)
    return d, row_ok, mt.where(row_ok, d, 0) * (row_blocks * 4)


@mt.func
def unit_v7(u, tiles, FLAT):
    """Work unit u of a program's loop -> (row tile, item). FLAT: the (tile, item) units in one sequence, tiles
    fastest, dealt round-robin over a grid of resident programs (grid axis 0); else program (tile, s) takes every
    num_programs(1)-th item from s."""
    return (u % tiles, u // tiles) if FLAT else (mt.program_id(0), u)


@mt.kernel
def gate_up_kernel_v7(x_ptr, ids_ptr, pairs_ptr, first_ptr, n_items_ptr, wq_ptr, sw_ptr, h_ptr,
                      n_pairs, topk, D, I, row_blocks,
                      NT: mt.constexpr, DEDUP: mt.constexpr, FULL_STEPS: mt.constexpr,
                      UNROLL_TAIL: mt.constexpr = -1, WCACHE: mt.constexpr = "", L2PF: mt.constexpr = 0,
                      VPF: mt.constexpr = False, XITEM: mt.constexpr = False, FLAT: mt.constexpr = False,
                      GDC: mt.constexpr = False):
    """h[p, i] = bf16(silu(gate_i . x_b) * (up_i . x_b)), b = p // topk, on the v7 layout: program (i, s) owns
    neurons 8 i .. 8 i + 7 (tile rows g: gate, g + 8: up; V7_GROUP) and every num_programs(1)-th work item from
    item s. XITEM (whole steps, >= 3 of them): the next item's tables are loaded at an item's start and its first
    three steps by the item's last refills (kloop_x_v7), so no item waits for its tables and first weights. FLAT
    (not with XITEM): a 1-D grid of resident programs deals the (tile, item) units round-robin (unit_v7), so every
    program slot stays busy to the end whatever the item count. L2PF: the L2's fetch size of the weight loads.
    GDC (programmatic dependent launch): wait for the previous kernel first (x and the routing come from it), then
    let the down kernel's programs start (they wait for this one after their first weight loads)."""
    if GDC:
        wait_then_release()
    row_ok, q_off, neuron = gate_up_tile_v7(mt.program_id(0), I, row_blocks)
    tiles = (I + 7) // 8
    steps = (row_blocks + 7) // 8
    tile_words = tiles * steps * 32  # scale words of one expert
    lane = mt.arange(0, 32).reshape((8, 4))
    blk_ht = mt.arange(0, 8).reshape((2, 4))  # block (h, t) = 4 h + t of a step (not an arange(0, 4) pair: CSE)
    n_items = item_count(n_items_ptr, n_pairs, DEDUP)
    if XITEM:
        pair, pair_ok, expert = item_v7(mt.minimum(n_items - 1, mt.program_id(1)), n_items, ids_ptr, pairs_ptr,
                                        first_ptr, NT, DEDUP)
        wq_e, sw_e = bases_v7(expert, wq_ptr, sw_ptr, 2 * I, row_blocks, tile_words, steps, mt.program_id(0))
        q_a, s_a, q_b, s_b, q_c, s_c = first_steps_v7(wq_e, q_off, sw_e, lane, blk_ht, row_blocks, WCACHE, L2PF)
        if VPF:
            prefetch_vector_v7(x_ptr, (mt.where(pair_ok, pair, 0) // topk) * D, pair_ok, D)
        for it in range(mt.program_id(1), n_items, mt.num_programs(1)):
            nxt = it + mt.num_programs(1)
            pair_n, ok_n, expert_n = item_v7(mt.minimum(n_items - 1, nxt), n_items, ids_ptr, pairs_ptr, first_ptr,
                                             NT, DEDUP)
            if VPF:
                prefetch_vector_v7(x_ptr, (mt.where(ok_n, pair_n, 0) // topk) * D, ok_n & (nxt < n_items), D)
            wq_n, sw_n = bases_v7(mt.where(nxt < n_items, expert_n, expert), wq_ptr, sw_ptr, 2 * I, row_blocks,
                                  tile_words, steps, mt.program_id(0))
            v_row = (mt.where(pair_ok, pair, 0) // topk) * D
            acc, q_a, s_a, q_b, s_b, q_c, s_c = kloop_x_v7(
                q_a, s_a, q_b, s_b, q_c, s_c, q_off, wq_e, sw_e, wq_n, sw_n, lane, blk_ht,
                x_ptr + v_row[None, :, None, None], pair_ok[None, :, None, None], D, row_blocks, 16, NT, UNROLL_TAIL,
                WCACHE, L2PF)
            store_h_v7(acc, h_ptr, pair, pair_ok, neuron, I)
            pair, pair_ok, expert, wq_e, sw_e = pair_n, ok_n, expert_n, wq_n, sw_n
    else:
        for u in range(mt.program_id(0) if FLAT else mt.program_id(1), tiles * n_items if FLAT else n_items,
                       mt.num_programs(0) if FLAT else mt.num_programs(1)):
            tile, it = unit_v7(u, tiles, FLAT)
            if FLAT:
                row_ok, q_off, neuron = gate_up_tile_v7(tile, I, row_blocks)
            pair, pair_ok, expert = item_v7(it, n_items, ids_ptr, pairs_ptr, first_ptr, NT, DEDUP)
            wq_e, sw_e = bases_v7(expert, wq_ptr, sw_ptr, 2 * I, row_blocks, tile_words, steps, tile)
            v_row = (mt.where(pair_ok, pair, 0) // topk) * D
            acc = stream_rows_v7(wq_e, q_off, row_ok, sw_e, lane, blk_ht, x_ptr, v_row, pair_ok, D, row_blocks, 16,
                                 NT, FULL_STEPS, UNROLL_TAIL, WCACHE, L2PF, VPF)
            store_h_v7(acc, h_ptr, pair, pair_ok, neuron, I)


@mt.kernel
def down_kernel_v7(h_ptr, ids_ptr, wts_ptr, pairs_ptr, first_ptr, n_items_ptr, wq_ptr, sw_ptr, part_ptr, out_ptr,
                   flag_ptr, n_pairs, topk, batch, D, I, row_blocks,
                   NT: mt.constexpr, DEDUP: mt.constexpr, FULL_STEPS: mt.constexpr,
                   UNROLL_TAIL: mt.constexpr = -1, WCACHE: mt.constexpr = "", L2PF: mt.constexpr = 0,
                   VPF: mt.constexpr = False, XITEM: mt.constexpr = False, FLAT: mt.constexpr = False,
                   SUMS: mt.constexpr = False, TOPK: mt.constexpr = 1, GDC: mt.constexpr = False):
    """part[j, b, d] = w[b, j] * (W2[e_bj, d] . h[b * topk + j]) (fp32 [topk, batch, D]) for every routed pair,
    on the v7 layout (program (i, s): rows d = 8 i + g and half + 8 i + g, every num_programs(1)-th item from s);
    sum_slots_kernel then adds the topk slots of each token in order. XITEM, FLAT, L2PF: as gate_up_kernel_v7's.
    SUMS (pairs as items, not with XITEM): no sum_slots_kernel; the last of a token's pairs to finish a row tile
    adds the tile's slots into out (bf16 or fp32 [batch, D]) itself, counted on flag_ptr[b * tiles + tile]
    (int32, zero before the launch and zeroed again by that last pair; TOPK: topk rounded up to a power of two).
    GDC (not with XITEM): each item waits for gate_up after loading its first weight steps (stream_rows_v7), so a
    launch started early by gate_up's launch_dependents streams weights during gate_up's tail."""
    d, row_ok, q_off = down_tile_v7(mt.program_id(0), D, row_blocks)
    tiles = ((D + 1) // 2 + 7) // 8
    steps = (row_blocks + 7) // 8
    tile_words = tiles * steps * 32
    lane = mt.arange(0, 32).reshape((8, 4))
    blk_ht = mt.arange(0, 8).reshape((2, 4))
    n_items = item_count(n_items_ptr, n_pairs, DEDUP)
    if XITEM:
        pair, pair_ok, expert = item_v7(mt.minimum(n_items - 1, mt.program_id(1)), n_items, ids_ptr, pairs_ptr,
                                        first_ptr, NT, DEDUP)
        wq_e, sw_e = bases_v7(expert, wq_ptr, sw_ptr, D, row_blocks, tile_words, steps, mt.program_id(0))
        q_a, s_a, q_b, s_b, q_c, s_c = first_steps_v7(wq_e, q_off, sw_e, lane, blk_ht, row_blocks, WCACHE, L2PF)
        if VPF:
            prefetch_vector_v7(h_ptr, mt.where(pair_ok, pair, 0) * I, pair_ok, I)
        for it in range(mt.program_id(1), n_items, mt.num_programs(1)):
            nxt = it + mt.num_programs(1)
            pair_n, ok_n, expert_n = item_v7(mt.minimum(n_items - 1, nxt), n_items, ids_ptr, pairs_ptr, first_ptr,
                                             NT, DEDUP)
            if VPF:
                prefetch_vector_v7(h_ptr, mt.where(ok_n, pair_n, 0) * I, ok_n & (nxt < n_items), I)
            wq_n, sw_n = bases_v7(mt.where(nxt < n_items, expert_n, expert), wq_ptr, sw_ptr, D, row_blocks,
                                  tile_words, steps, mt.program_id(0))
            acc, q_a, s_a, q_b, s_b, q_c, s_c = kloop_x_v7(
                q_a, s_a, q_b, s_b, q_c, s_c, q_off, wq_e, sw_e, wq_n, sw_n, lane, blk_ht,
                h_ptr + (mt.where(pair_ok, pair, 0) * I)[None, :, None, None], pair_ok[None, :, None, None], I,
                row_blocks, 16, NT, UNROLL_TAIL, WCACHE, L2PF)
            store_part_v7(acc, part_ptr, wts_ptr, pair, pair_ok, d, row_ok, topk, batch, D)
            pair, pair_ok, expert, wq_e, sw_e = pair_n, ok_n, expert_n, wq_n, sw_n
    else:
        for u in range(mt.program_id(0) if FLAT else mt.program_id(1), tiles * n_items if FLAT else n_items,
                       mt.num_programs(0) if FLAT else mt.num_programs(1)):
            tile, it = unit_v7(u, tiles, FLAT)
            if FLAT:
                d, row_ok, q_off = down_tile_v7(tile, D, row_blocks)
            pair, pair_ok, expert = item_v7(it, n_items, ids_ptr, pairs_ptr, first_ptr, NT, DEDUP)
            wq_e, sw_e = bases_v7(expert, wq_ptr, sw_ptr, D, row_blocks, tile_words, steps, tile)
            acc = stream_rows_v7(wq_e, q_off, row_ok, sw_e, lane, blk_ht, h_ptr, mt.where(pair_ok, pair, 0) * I,
                                 pair_ok, I, row_blocks, 16, NT, FULL_STEPS, UNROLL_TAIL, WCACHE, L2PF, VPF, GDC)
            store_part_v7(acc, part_ptr, wts_ptr, pair, pair_ok, d, row_ok, topk, batch, D)
            if SUMS:
                b = it // topk
                flag = flag_ptr + b * tiles + tile
                if signal(flag) == topk - 1:
                    add_token_slots(part_ptr, out_ptr, b, d, row_ok, topk, batch, D, TOPK)
                    mt.store(flag, 0)


@mt.kernel
def sum_slots_kernel(part_ptr, out_ptr, n, SLOTS: mt.constexpr, BLOCK: mt.constexpr, GDC: mt.constexpr = False):
    """out[i] = sum over s < SLOTS of part[s * n + i], in s order, in out's dtype (the v7 down kernel's per-pair
    contributions, [topk, B, D] -> [B, D]); SLOTS unrolled: every load in flight at once. GDC: launched early
    (programmatic dependent launch), it waits for the down kernel first."""
    if GDC:
        mt.grid_dependency_wait()
    i = mt.program_id(0) * BLOCK + mt.arange(0, BLOCK)
    ok = i < n
    total = mt.zeros((BLOCK,), mt.float32)
    for s in mt.static_range(SLOTS):
        total += mt.load(part_ptr + s * n + i, mask=ok, other=0.0)
    mt.store(out_ptr + i, total, mask=ok)


# ------------------------------------------------------------------------------------------ one launch (fused)

FUSED_SYNC_HEAD = 2  # the fused kernel's sync words: [0] the next unit to claim, [1] programs that have exited;
# then ready[pair] (gate_up tiles of the pair's h written) and done[token, down tile] (pairs' parts written)


@mt.func
def claim_then_signal(sync_ptr, flag_ptr):
    """At a unit's end: claim the program's next unit, then signal flag_ptr. The claim goes first so that its
    round trip overlaps the release fence's wait for the unit's stores. Returns (next unit, the flag's old
    value)."""
    nxt = mt.atomic_add(sync_ptr, 1)
    return nxt, signal(flag_ptr)


@mt.func
def signal(flag_ptr):
    """Publish every write of this program to the programs that poll flag_ptr: the writes done (barrier), ordered
    before the signal (fence), then +1 on the flag. Returns the flag's old value."""
    mt.barrier()
    mt.fence("release")  # no L1 invalidation (an acq_rel fence is also a CCTL.IVALL of the SM's L1)
    return mt.atomic_add(flag_ptr, 1)


@mt.func
def wait_for(flag_ptr, target):
    """Poll the flag until it reaches target, then order this program's later reads after what was published."""
    while mt.atomic_add(flag_ptr, 0) < target:
        pass
    mt.fence("acquire")


@mt.func
def fused_gate_up_unit(u, tiles, x_ptr, ids_ptr, wq_ptr, sw_ptr, h_ptr, sync_ptr, ready_ptr, n_pairs, topk, D, I,
                       row_blocks, NT, FULL_STEPS, UNROLL_TAIL, WCACHE, L2PF):
    """gate_up unit u = (pair u // tiles, row tile u % tiles): gate_up_kernel_v7's item, then the next claim and
    ready[pair] += 1. Returns the next unit."""
    pair = u // tiles
    tile = u % tiles
    row_ok, q_off, neuron = gate_up_tile_v7(tile, I, row_blocks)
    pairs, pair_ok, expert = item_v7(pair, n_pairs, ids_ptr, ids_ptr, ids_ptr, NT, False)
    steps = (row_blocks + 7) // 8
    wq_e, sw_e = bases_v7(expert, wq_ptr, sw_ptr, 2 * I, row_blocks, tiles * steps * 32, steps, tile)
    lane = mt.arange(0, 32).reshape((8, 4))
    blk_ht = mt.arange(0, 8).reshape((2, 4))
    acc = stream_rows_v7(wq_e, q_off, row_ok, sw_e, lane, blk_ht, x_ptr, (mt.where(pair_ok, pairs, 0) // topk) * D,
                         pair_ok, D, row_blocks, 16, NT, FULL_STEPS, UNROLL_TAIL, WCACHE, L2PF, False)
    store_h_v7(acc, h_ptr, pairs, pair_ok, neuron, I)
    nxt, _ = claim_then_signal(sync_ptr, ready_ptr + pair)
    return nxt


@mt.func
def fused_down_unit(w, tiles, tiles_up, h_ptr, ids_ptr, wts_ptr, wq_ptr, sw_ptr, part_ptr, out_ptr, sync_ptr,
                    ready_ptr, done_ptr, n_pairs, topk, batch, D, I, row_blocks, NT, TOPK, FULL_STEPS, UNROLL_TAIL,
                    WCACHE, L2PF):
    """down unit w = (pair w // tiles, row tile w % tiles), once the pair's h is whole (ready[pair] == tiles_up):
    down_kernel_v7's item; the last of a token's topk pairs to finish a tile adds the tile's topk slots (in one
    tree, the same for every run) into out. Returns the program's next unit (claimed before the signal)."""
    pair = w // tiles
    tile = w % tiles
    d, row_ok, q_off = down_tile_v7(tile, D, row_blocks)
    pairs, pair_ok, expert = item_v7(pair, n_pairs, ids_ptr, ids_ptr, ids_ptr, NT, False)
    steps = (row_blocks + 7) // 8
    wq_e, sw_e = bases_v7(expert, wq_ptr, sw_ptr, D, row_blocks, tiles * steps * 32, steps, tile)
    lane = mt.arange(0, 32).reshape((8, 4))
    blk_ht = mt.arange(0, 8).reshape((2, 4))
    wait_for(ready_ptr + pair, tiles_up)
    acc = stream_rows_v7(wq_e, q_off, row_ok, sw_e, lane, blk_ht, h_ptr, mt.where(pair_ok, pairs, 0) * I, pair_ok, I,
                         row_blocks, 16, NT, FULL_STEPS, UNROLL_TAIL, WCACHE, L2PF, False)
    store_part_v7(acc, part_ptr, wts_ptr, pairs, pair_ok, d, row_ok, topk, batch, D)
    b = pair // topk
    nxt, arrived = claim_then_signal(sync_ptr, done_ptr + b * tiles + tile)
    if arrived == topk - 1:
        add_token_slots(part_ptr, out_ptr, b, d, row_ok, topk, batch, D, TOPK)
    return nxt


@mt.func
def add_token_slots(part_ptr, out_ptr, b, d, row_ok, topk, batch, D, TOPK):
    """out[b, d] = the sum of token b's topk slots part[j, b, d] (one tree, the same every run), by the program whose
    signal completed them: an acquire fence, then the slots from L2."""
    mt.fence("acquire")
    j = mt.arange(0, TOPK)
    slots = mt.load(part_ptr + ((j.to(mt.int64) * batch + b) * D)[:, None] + d[None, :],
                    mask=(j < topk)[:, None] & row_ok[None, :], other=0.0, cache_modifier=".cg")
    mt.store(out_ptr + b * D + d, mt.sum(slots, axis=0), mask=row_ok)


@mt.kernel(min_blocks_per_sm=16)
def moe_fused_kernel_v7(x_ptr, ids_ptr, wts_ptr, w13_ptr, sw13_ptr, w2_ptr, sw2_ptr, h_ptr, part_ptr, out_ptr,
                        sync_ptr, n_pairs, topk, batch, D, I, rb13, rb2,
                        NT: mt.constexpr, TOPK: mt.constexpr, FULL13: mt.constexpr, TAIL13: mt.constexpr,
                        FULL2: mt.constexpr, TAIL2: mt.constexpr, WCACHE: mt.constexpr = "",
                        L2PF: mt.constexpr = 0):
    """The whole MoE layer in one launch (pairs as items: no routing tables; for small batches): every program
    claims units in order from one counter, first the gate_up units (pair-major: pair 0's tiles first), then the
    down units. A down unit waits until its pair's h is whole; it only ever waits for units claimed before it, by
    programs that are running, so the grid may be any size. The last down unit of a (token, tile) sums the
    token's slots (no third launch), and the last program to exit zeroes the sync words for the next launch. What
    it removes against the three launches of _v7_decode: a kernel's ramp and tail (~10 us each for the K3 gate_up
    stream at B = 1, tools/stream_pattern.py), the gaps between launches, and the slot-sum kernel."""
    tiles_up = (I + 7) // 8
    tiles_dn = ((D + 1) // 2 + 7) // 8
    n_up = tiles_up * n_pairs
    total = n_up + tiles_dn * n_pairs
    ready_ptr = sync_ptr + FUSED_SYNC_HEAD
    done_ptr = ready_ptr + n_pairs
    u = mt.atomic_add(sync_ptr, 1)
    while u < total:
        if u < n_up:
            u = fused_gate_up_unit(u, tiles_up, x_ptr, ids_ptr, w13_ptr, sw13_ptr, h_ptr, sync_ptr, ready_ptr,
                                   n_pairs, topk, D, I, rb13, NT, FULL13, TAIL13, WCACHE, L2PF)
        else:
            u = fused_down_unit(u - n_up, tiles_dn, tiles_up, h_ptr, ids_ptr, wts_ptr, w2_ptr, sw2_ptr, part_ptr,
                                out_ptr, sync_ptr, ready_ptr, done_ptr, n_pairs, topk, batch, D, I, rb2, NT, TOPK,
                                FULL2, TAIL2, WCACHE, L2PF)
    if mt.atomic_add(sync_ptr + 1, 1) == mt.num_programs(0) - 1:  # every other program has left: reset
        n_sync = FUSED_SYNC_HEAD + n_pairs + batch * tiles_dn
        for i in range(0, n_sync, 128):
            offs = i + mt.arange(0, 128)
            mt.store(sync_ptr + offs, mt.zeros((128,), mt.int32), mask=offs < n_sync)


# The same kernels capped at 128 registers (16 resident one-warp programs per SM), as the v6 defaults are.
gate_up_kernel_v7_16 = mt.kernel(min_blocks_per_sm=16)(gate_up_kernel_v7.fn)
down_kernel_v7_16 = mt.kernel(min_blocks_per_sm=16)(down_kernel_v7.fn)
# K3 down at B > 1 as V7_BF16_H_VARIANT launches it (int32 pairs from route_sort_kernel, 12 steps): the AOT form
# (tests/test_examples_ir.py round-trips its IR; gate_up's, 11 s more of CI, adds only its epilogue and tail).
_V7_TABLES = "ids_ptr:*i32:16,pairs_ptr:*i32:16,first_ptr:*i32:16,n_items_ptr:*i32:16,wq_ptr:*i32:16,sw_ptr:*i32:16"
down_kernel_v7.specialize(
    signature=f"h_ptr:*bf16:16,{_V7_TABLES.replace('pairs_ptr', 'wts_ptr:*fp32:16,pairs_ptr')},part_ptr:*fp32:16,"
              "out_ptr:*bf16:16,flag_ptr:*i32:16,"
              "n_pairs:i32:16,topk:i32:16,batch:i32:16,D:i32:16,I:i32:16,row_blocks:i32:16", NT=8, DEDUP=True,
    FULL_STEPS=True, UNROLL_TAIL=0, WCACHE=".cg", VPF=True, XITEM=True, num_warps=1)
sum_slots_kernel.specialize(signature="part_ptr:*fp32:16,out_ptr:*bf16:16,n:i32:16", SLOTS=16, BLOCK=256,
                            num_warps=2)


# ------------------------------------------------------------------------------------------ routing


MAX_PAIRS = 4096  # routed pairs B * k the one-program routing kernel handles (its tile)


@mt.kernel
def route_items_kernel(grouped_ptr, first_ptr, n_items_ptr, n_pairs, GROUP: mt.constexpr, BLOCK: mt.constexpr):
    """Work items from the expert ids of the pairs sorted by expert (grouped_ptr, n_pairs of them), in one program:
    a pair starts an item when its rank within its expert's run is a multiple of GROUP; first[i] is the sorted
    position where item i starts, first[n_items] = n_pairs closes the last one, n_items_ptr[0] = n_items."""
    q = mt.arange(0, BLOCK)
    ok = q < n_pairs
    expert = mt.load(grouped_ptr + q, mask=ok, other=-1)
    before = mt.load(grouped_ptr + q - 1, mask=ok & (q > 0), other=-1)  # ids are >= 0: position 0 starts a run
    run_start = mt.cummax(mt.where(ok & (expert != before), q, 0), axis=0)
    starts = ok & ((q - run_start) % GROUP == 0)
    item = mt.cumsum(starts.to(mt.int32), axis=0) - 1
    mt.store(first_ptr + item, q, mask=starts)
    n_items = mt.sum(starts.to(mt.int32), axis=0)
    mt.store(first_ptr + n_items, n_pairs)
    mt.store(n_items_ptr, n_items)


route_items_kernel.specialize(signature="grouped_ptr:*i32:16,first_ptr:*i32:16,n_items_ptr:*i32:16,n_pairs:i32",
                              GROUP=8, BLOCK=1024, num_warps=4)


@mt.kernel
def route_sort_kernel(ids_ptr, scratch_ptr, pairs_ptr, first_ptr, n_items_ptr, n_pairs, n_experts,
                      GROUP: mt.constexpr, BLOCK: mt.constexpr, EBLOCK: mt.constexpr):
    """The whole B > 1 routing in one program, no torch.sort: the pairs sorted by expert, stably (pairs_ptr[pos] =
    q, as torch.sort(stable=True) orders them), and the work items of up to GROUP pairs (first_ptr[item], the
    sentinel first_ptr[n_items] = n_pairs, n_items_ptr[0]), the same tables as make_routing's sort +
    route_items_kernel. scratch_ptr: int32 [3 * EBLOCK + BLOCK].
    1. counts = 0; each pair takes a rank among its expert's pairs by an atomic add (in whatever order the
       atomics land); 2. counts -> each expert's first position (exclusive cumsum) and first item (cumsum of
       ceil(count / GROUP)), and each pair is written at its expert's start + that rank (an unstable grouping);
    3. the stable rank of a pair is the number of its expert's pairs with a smaller index, counted over that
       group (at most the largest count iterations: about 2 at K3 routing), which places it and its item."""
    q = mt.arange(0, BLOCK)
    ok = q < n_pairs
    e_all = mt.arange(0, EBLOCK)
    e_ok = e_all < n_experts
    mt.store(scratch_ptr + e_all, mt.zeros((EBLOCK,), mt.int32), mask=e_ok)
    mt.barrier()
    expert = mt.load(ids_ptr + q, mask=ok, other=0)
    ok = ok & (expert >= 0) & (expert < n_experts)  # stray ids touch no memory (their items are garbage)
    rank_any = mt.atomic_add(scratch_ptr + expert, mt.full((BLOCK,), 1, mt.int32), mask=ok)
    mt.barrier()
    counts = mt.load(scratch_ptr + e_all, mask=e_ok, other=0, cache_modifier=".cg")  # the scratch: from L2
    start = mt.cumsum(counts, axis=0) - counts
    items = (counts + (GROUP - 1)) // GROUP
    item_start = mt.cumsum(items, axis=0) - items
    n_items = mt.sum(items, axis=0)
    longest = mt.max(counts, axis=0)
    mt.store(scratch_ptr + EBLOCK + e_all, start, mask=e_ok)
    mt.store(scratch_ptr + 2 * EBLOCK + e_all, item_start, mask=e_ok)
    mt.barrier()
    my_start = mt.load(scratch_ptr + EBLOCK + expert, mask=ok, other=0, cache_modifier=".cg")
    mt.store(scratch_ptr + 3 * EBLOCK + my_start + rank_any, q, mask=ok)
    mt.barrier()
    my_count = mt.load(scratch_ptr + expert, mask=ok, other=0, cache_modifier=".cg")
    rank = mt.zeros((BLOCK,), mt.int32)
    for i in range(0, longest):
        other = mt.load(scratch_ptr + 3 * EBLOCK + my_start + i, mask=ok & (i < my_count), other=BLOCK,
                        cache_modifier=".cg")
        rank += (other < q).to(mt.int32)
    pos = my_start + rank
    mt.store(pairs_ptr + pos, q, mask=ok)
    item = mt.load(scratch_ptr + 2 * EBLOCK + expert, mask=ok, other=0, cache_modifier=".cg") + rank // GROUP
    mt.store(first_ptr + item, pos, mask=ok & (rank % GROUP == 0))
    mt.store(first_ptr + n_items, n_pairs)
    mt.store(n_items_ptr, n_items)


route_sort_kernel.specialize(signature="ids_ptr:*i32:16,scratch_ptr:*i32:16,pairs_ptr:*i32:16,first_ptr:*i32:16,"
                             "n_items_ptr:*i32:16,n_pairs:i32,n_experts:i32", GROUP=8, BLOCK=1024, EBLOCK=1024,
                             num_warps=8)


@dataclass(frozen=True)
class Routing:
    """Routed (token, slot) pairs p = b * topk + j and the work items the kernels loop over.

    ids, weights: int32 / fp32 [P] (P = batch * topk), flattened topk_ids / topk_weights.
    With dedup: pairs int64 [P] is the pair indices sorted by expert (stable); item i is pairs[first[i] : first[i+1]]
    (at most `group` pairs, one expert); first int32 [P + 1] (entries past n_items unused); n_items int32 [1], a
    device value (no host sync).
    Without dedup (batch 1): item i is pair i; pairs / first / n_items are unused (they alias ids).
    """

    ids: torch.Tensor
    weights: torch.Tensor
    pairs: torch.Tensor
    first: torch.Tensor
    n_items: torch.Tensor
    batch: int
    topk: int
    group: int
    dedup: bool

    @property
    def n_pairs(self) -> int:
        return self.batch * self.topk


def make_routing(topk_ids: torch.Tensor, topk_weights: torch.Tensor, group: int, dedup: bool) -> Routing:
    """Group the routed pairs into work items of up to `group` pairs sharing an expert (see Routing).

    Two device steps, no host synchronisation (CUDA-graph capturable): a stable torch.sort of the expert ids, then
    route_items_kernel (one program) for the item boundaries."""
    if topk_ids.dim() != 2 or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_ids and topk_weights must both be [B, k], got {tuple(topk_ids.shape)} and "
                         f"{tuple(topk_weights.shape)}")
    if group < 1 or (not dedup and group != 1):
        raise ValueError(f"group must be >= 1, and 1 without dedup; got group={group}, dedup={dedup}")
    batch, topk = topk_ids.shape
    n = batch * topk
    if n > MAX_PAIRS:
        raise ValueError(f"{batch} x {topk} = {n} routed pairs; the decode routing handles up to {MAX_PAIRS}")
    ids, weights = _flat_pairs(topk_ids, topk_weights)
    if not dedup:
        return Routing(ids, weights, ids, ids, ids, batch, topk, 1, False)
    grouped, pairs = torch.sort(ids, stable=True)
    first = torch.empty(n + 1, dtype=torch.int32, device=ids.device)
    n_items = torch.empty(1, dtype=torch.int32, device=ids.device)
    route_items_kernel[(1,)](grouped, first, n_items, n, GROUP=group, BLOCK=max(16, 1 << (n - 1).bit_length()),
                             num_warps=4)
    return Routing(ids, weights, pairs, first, n_items, batch, topk, group, True)


def dsl_routing(ids: torch.Tensor, weights: torch.Tensor, batch: int, topk: int, group: int, num_experts: int
                ) -> Routing:
    """make_routing's tables (pairs grouped by expert, stably; items of up to `group` pairs) from one launch of
    route_sort_kernel (torch.sort measured 24 us at B = 16 under ncu, 2026-12-01, plus arange and route_items:
    about 29 us of 1455). ids / weights: the flattened pairs (_flat_pairs); pairs comes out int32."""
    n = batch * topk
    if n > MAX_PAIRS:
        raise ValueError(f"{batch} x {topk} = {n} routed pairs; the decode routing handles up to {MAX_PAIRS}")
    block = max(16, 1 << (n - 1).bit_length())
    eblock = max(16, 1 << (num_experts - 1).bit_length())
    scratch = torch.empty(3 * eblock + block, dtype=torch.int32, device=ids.device)
    pairs = torch.empty(n, dtype=torch.int32, device=ids.device)
    first = torch.empty(n + 1, dtype=torch.int32, device=ids.device)
    n_items = torch.empty(1, dtype=torch.int32, device=ids.device)
    route_sort_kernel[(1,)](ids, scratch, pairs, first, n_items, n, num_experts, GROUP=group, BLOCK=block,
                            EBLOCK=eblock, num_warps=min(16, max(4, max(block, eblock) // 128)))
    return Routing(ids, weights, pairs, first, n_items, batch, topk, group, True)


def _flat_pairs(topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The pairs' expert ids (int32) and weights (fp32), flattened to [B * topk]."""
    return (topk_ids.reshape(-1).to(torch.int32).contiguous(),
            topk_weights.reshape(-1).to(torch.float32).contiguous())


_SINGLE_TOKEN_ITEMS: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _single_token_items(topk: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pairs, first, n_items) of a one-token routing: item i is pair i. A token's top-k experts are distinct, so
    sorting would group nothing; at B = 1 the sort and route_items_kernel were 3 launches (about 11 us with ncu,
    2026-11-29) of a 66 us floor. (Repeated ids in one token, which top-k routing never makes, stay correct, only
    unshared.)"""
    key = (topk, device)
    if key not in _SINGLE_TOKEN_ITEMS:
        _SINGLE_TOKEN_ITEMS[key] = (torch.arange(topk, dtype=torch.int64, device=device),
                                    torch.arange(topk + 1, dtype=torch.int32, device=device),
                                    torch.tensor([topk], dtype=torch.int32, device=device))
    return _SINGLE_TOKEN_ITEMS[key]


# ------------------------------------------------------------------------------------------ configuration


@dataclass(frozen=True)
class KernelConfig:
    """Tile parameters of one kernel launch: ROWS weight rows per program, TEAMS items at once, BLOCKS MX blocks
    per team and step (16 bytes each), mt.dot or CUDA cores, and num_warps. splits: the item split (programs along
    grid axis 1, each taking every splits-th group of items); None picks it from the grid size (`pick_splits`)."""

    use_dot: bool
    rows: int
    teams: int
    blocks: int
    num_warps: int
    splits: int | None = None
    pairs: bool = False  # mt.dot only: dequantize two weights per 32-bit word (e2m1_pairs_to_bf16, bitcast_split)
    prefetch: int = 1  # mt.dot only: weight steps loaded ahead into registers (1 or 2)
    words: bool = False  # pairs only: read the packed weights as int32 words (small carried tiles, for prefetch 2)
    fold_bias: bool | None = None  # pairs only: the 2**126 bias on the scale; None: when the experts allow it
    word_order: bool = False  # words only: K in the words' nibble order, pairs without byte permutes (4 dots/step)
    min_blocks: int | None = None  # 16 launches down_kernel_16 / gate_up_kernel_16 (at most 128 registers)
    v_masked: bool = False  # mt.dot only: dead vector slots read nothing (masked loads; stream_rows V_MASKED)
    h_bf16: bool = False  # gate_up, mt.dot only: h as one bf16 part [P, I] (peers' precision), not hi + lo parts
    unroll: bool = False  # prefetch 2 on whole steps: the K loop unrolled by 3, no step-buffer rotation (UNROLL_TAIL)
    layout: str = "v5"  # the PreparedExperts layout it reads; "v6": words, bias folded by the layout (LAYOUT6)
    # "v7": gate_up_kernel_v7 / down_kernel_v7 (scale words, h in bf16)
    wcache: str = ""  # v7: the weight loads' cache operator (mt.load cache_modifier), e.g. ".cg" (not kept in L1)
    vpf: bool = False  # v7: each item's vector rows prefetched into L1 (mt.prefetch) at its start
    xitem: bool = False  # v7, whole steps (>= 3): the next item's tables and first 3 steps loaded during this item
    flat: bool = False  # v7, not with xitem: a 1-D grid of resident programs deals the (tile, item) units round-robin
    # (splits, when set, is then the grid size)
    l2pf: int = 0  # v7: the L2's fetch size on a weight / scale-word load's miss (mt.load l2_prefetch: 64, 128, 256)
    fused: bool = False  # v7, moe_decode only, B <= FUSED_MAX_BATCH: the whole layer in one launch (moe_fused_kernel_v7)
    pdl: bool = False  # v7, not with xitem: programmatic dependent launch (GDC): down and the slot sum start early
    sums: bool = False  # v7 down, not with xitem: where the pairs are the items (B = 1), the last pair to finish a
    # token's row tile adds its slots into out (no sum_slots_kernel launch)
    routing: str = "torch"  # moe_decode's routing for this variant: "torch" (torch.sort + route_items_kernel; B = 1
    # tables of one pair per item) or "dsl" (route_sort_kernel, one launch; B = 1: items are the pairs, no tables)


def pick_teams(row_blocks: int, items_hint: int) -> int:
    """Lane teams for the CUDA-core path: the split of a warp's 32 lanes (one block each) into teams that wastes the
    fewest lane-steps on the row tail and on idle teams; ties go to fewer teams (fewer, longer streams)."""
    best, best_eff = 1, -1.0
    for teams in (1, 2, 4, 8):
        lanes = 32 // teams
        row_eff = row_blocks / (math.ceil(row_blocks / lanes) * lanes)
        item_eff = items_hint / (math.ceil(items_hint / teams) * teams)
        if row_eff * item_eff > best_eff + 1e-9:
            best, best_eff = teams, row_eff * item_eff
    return best


def pick_config(row_blocks: int, items_hint: int, use_dot: bool, variant: str | None = None,
                kernel: str = "gate_up") -> KernelConfig:
    """Default tiles: CUDA cores with ROWS = num_warps = 8 (a warp per row) and lane teams; or mt.dot with one warp
    per 16 rows (the m16n8k16 A operand), 8 blocks (256 weights) per step, dequantized as `variant` says for
    `kernel` ("gate_up" or "down"; variant: a key of DOT_VARIANTS, default DEFAULT_DOT_VARIANT)."""
    if use_dot:
        options = DOT_VARIANTS[variant or DEFAULT_DOT_VARIANT][0 if kernel == "gate_up" else 1]
        return KernelConfig(True, rows=16, teams=1, blocks=8, num_warps=1, **options)
    teams = pick_teams(row_blocks, items_hint)
    return KernelConfig(False, rows=8, teams=teams, blocks=32 // teams, num_warps=8)


SUM_BLOCK = 512  # outputs per program of sum_splits_kernel
SPLIT_SLACK = 1.05  # pick_splits takes the fewest splits within 5% of the least modelled time


def pick_splits(config: KernelConfig, programs: int, items_hint: int, resident: int | None) -> int:
    """The item split S (grid axis 1) that the wave model says finishes first. A program's time is its item groups,
    ceil(groups / S); the grid runs in ceil(programs * S / resident) waves (resident: the programs the GPU runs at
    once, `Kernel.resident_programs`), so the launch takes their product. A grid of 1.09 waves costs about as much
    as 2: the K3 gate_up at (384, 6) on 2112 resident one-warp programs measured 1.55 TB/s (ncu, 2026-11-29). Of the
    splits within SPLIT_SLACK of the least time, the fewest (fewer fp32 partials for the down kernel to write and
    sum). items_hint bounds the items (e.g. the pairs); resident None (off the GPU: the interpreter runs programs
    one after another) gives 1."""
    if config.splits is not None:
        return config.splits
    if resident is None:
        return 1
    groups = max(1, -(-items_hint // config.teams))
    cost = {s: -(-groups // s) * -(-(programs * s) // resident) for s in range(1, groups + 1)}
    best = min(cost.values())
    return min(s for s, c in cost.items() if c <= best * SPLIT_SLACK)


_SPLITS: dict[tuple, int] = {}  # (Kernel, launch shape) -> pick_splits' choice (one driver query per shape)


def _splits(kernel: mt.Kernel, config: KernelConfig, programs: int, routing: Routing, device: torch.device,
            make_args: Callable[[], tuple], meta: dict) -> int:
    """pick_splits for a launch of `kernel` with make_args() and meta, cached per launch shape: the driver is asked
    once, and the wave model's search (about 0.3 ms in Python over 1024 item groups) stays off the launch path."""
    if config.splits is not None or device.type != "cuda":
        return pick_splits(config, programs, routing.n_pairs, None)
    # keyed on the Kernel object: down_kernel and down_kernel_16 share a name and constexprs, not their occupancy;
    # meta is built in a fixed order, so its values identify the variant
    key = (kernel, config, programs, routing.batch, routing.topk, device, tuple(meta.values()))
    splits = _SPLITS.get(key)
    if splits is None:
        splits = _SPLITS[key] = pick_splits(config, programs, routing.n_pairs,
                                            kernel.resident_programs(*make_args(), **meta))
    return splits


def _v7_grid(kernel: mt.Kernel, config: KernelConfig, programs: int, routing: Routing, device: torch.device,
             make_args: Callable[[], tuple], meta: dict) -> tuple[int, int]:
    """The launch grid of a v7 kernel over `programs` row tiles: (programs, item split), or with config.flat
    (resident programs, 1): as many programs as the GPU holds at once (config.splits if set; off the GPU the tile
    count), at most one per (tile, item) unit (the items are at most the pairs)."""
    if not config.flat:
        return programs, _splits(kernel, config, programs, routing, device, make_args, meta)
    units = programs * routing.n_pairs
    if config.splits is not None:
        return min(units, config.splits), 1
    if device.type != "cuda":
        return programs, 1
    key = ("flat", kernel, programs, routing.n_pairs, device, tuple(meta.values()))
    resident = _SPLITS.get(key)
    if resident is None:
        resident = _SPLITS[key] = kernel.resident_programs(*make_args(), **meta)
    return min(units, resident), 1


def _check_config(config: KernelConfig) -> None:
    for name in ("rows", "teams", "blocks"):
        v = getattr(config, name)
        if v < 1 or v & (v - 1):
            raise ValueError(f"config.{name} must be a power of two, got {v}")
    if config.rows < 2:
        raise ValueError("config.rows must be at least 2 (gate and up rows of a neuron share a program)")
    if config.use_dot and (config.teams != 1 or config.rows % 16 or config.blocks % 4):
        raise ValueError("the mt.dot path takes teams=1, rows a multiple of 16 and blocks a multiple of 4")
    if config.prefetch not in (1, 2) or (config.prefetch != 1 and not config.use_dot):
        raise ValueError(f"config.prefetch must be 1 or 2 (2 on the mt.dot path only), got {config.prefetch}")
    if config.pairs and not config.use_dot:
        raise ValueError("config.pairs (two weights per 32-bit word) is for the mt.dot path")
    if config.fold_bias and not config.pairs:
        raise ValueError("config.fold_bias goes with config.pairs")
    if config.word_order and not config.words:
        raise ValueError("config.word_order goes with config.words")
    if config.words and not config.pairs:
        raise ValueError("config.words (weights read as int32 words) goes with config.pairs")
    if config.min_blocks not in (None, 16) or (config.min_blocks and (not config.use_dot or config.num_warps != 1)):
        raise ValueError(f"config.min_blocks must be None or 16 (one-warp mt.dot programs), got {config.min_blocks}")
    if config.unroll and config.prefetch != 2:
        raise ValueError("config.unroll goes with config.prefetch = 2")
    if (config.v_masked or config.h_bf16) and not config.use_dot:
        raise ValueError("config.v_masked and config.h_bf16 are for the mt.dot path")
    if config.splits is not None and config.splits < 1:
        raise ValueError(f"config.splits must be at least 1, got {config.splits}")
    if config.layout not in LAYOUTS:
        raise ValueError(f"config.layout must be one of {LAYOUTS}, got {config.layout!r}")
    if config.layout == "v6" and not (config.use_dot and config.words and not config.word_order
                                      and config.fold_bias is not False):
        raise ValueError("config.layout 'v6' is for the mt.dot path with words (its own K order, bias folded)")
    if config.layout == "v7" and not (config.use_dot and config.words and not config.word_order and config.h_bf16
                                      and config.rows == 16 and config.blocks == V7_STEP and config.prefetch == 2
                                      and not config.v_masked and config.fold_bias is not False):
        raise ValueError("config.layout 'v7' is the v7 kernels' (mt.dot, words, 16 rows, 8 blocks a step, two "
                         "steps prefetched, h in bf16)")
    if (config.wcache or config.vpf or config.xitem or config.flat or config.l2pf) and config.layout != "v7":
        raise ValueError("config.wcache, config.vpf, config.xitem, config.flat and config.l2pf are options of the v7 "
                         "kernels")
    if config.pdl and (config.layout != "v7" or config.xitem):
        raise ValueError("config.pdl is an option of the v7 kernels without xitem")
    if config.sums and (config.layout != "v7" or config.xitem):
        raise ValueError("config.sums is an option of the v7 down kernel without xitem")
    if config.fused and (config.layout != "v7" or config.xitem or config.flat):
        raise ValueError("config.fused is the one-launch form of the v7 kernels (not with xitem or flat)")
    if config.flat and config.xitem:
        raise ValueError("config.flat and config.xitem exclude each other (XITEM carries a program's next item)")
    if config.l2pf not in (0, 64, 128, 256):
        raise ValueError(f"config.l2pf must be 0, 64, 128 or 256 (bytes), got {config.l2pf}")
    if config.routing not in ("torch", "dsl"):
        raise ValueError(f"config.routing must be 'torch' or 'dsl', got {config.routing!r}")


# ------------------------------------------------------------------------------------------ host API


def _full_steps(w: PreparedExperts, config: KernelConfig) -> bool:
    """Every K step of every lane lies inside the row (no partial block, no lane past the row's end)."""
    return w.k == w.row_blocks * mxfp4.BLOCK and w.row_blocks % config.blocks == 0


def _unroll_tail(w: PreparedExperts, config: KernelConfig) -> int:
    """UNROLL_TAIL: the steps left after the K loop unrolled by 3 ((row_blocks / blocks) % 3), or -1 (the rotating
    loop) unless config.unroll applies (whole steps)."""
    if not (config.unroll and config.use_dot and _full_steps(w, config)):
        return -1
    return (w.row_blocks // config.blocks) % 3


def _weight_operand(w: PreparedExperts, config: KernelConfig) -> torch.Tensor:
    """The packed weights as the kernel reads them: bytes, or (config.words) the same memory as int32 words (rows
    are whole 16-byte blocks, so every row is whole words)."""
    if not config.words:
        return w.blocks
    return w.words if w.words is not None else w.blocks.view(torch.int32)


def _fold_bias(w: PreparedExperts, config: KernelConfig) -> bool:
    """Whether this launch folds the dequant bias into the scale (pairs path; see FOLD_MAX_SCALE). The v6 layout
    always does (its scale bytes are stored biased)."""
    if w.layout not in READABLE_LAYOUTS[config.layout]:
        raise ValueError(f"the experts are in layout {w.layout!r}, the kernel config reads {config.layout!r} "
                         f"(prepare_experts(..., layout={config.layout!r}), or a variant of layout {w.layout!r})")
    if config.layout in ("v6", "v7"):
        return True
    if not config.pairs or config.fold_bias is False:
        return False
    if config.fold_bias and not w.folds_bias:
        raise ValueError(f"fold_bias needs every finite scale byte <= {FOLD_MAX_SCALE}; these experts have "
                         f"{w.max_finite_scale} (None: not measured, use prepare_experts)")
    return w.folds_bias


def _layout_variant(w: PreparedExperts) -> str | None:
    """The mt.dot variant gate_up / down take without a config: the default (h at fp32 level) for the experts'
    layout (None: DEFAULT_DOT_VARIANT, which reads v5)."""
    return None if w.layout == "v5" else V6_FP32_H_VARIANT


def _check_experts(w: PreparedExperts, name: str) -> None:
    if not isinstance(w, PreparedExperts):
        raise TypeError(f"{name} must come from prepare_experts(), got {type(w).__name__}")


def _dot_meta(w: PreparedExperts, config: KernelConfig) -> dict:
    """The constexprs of the inner-product form, shared by both kernels."""
    return dict(ROWS=config.rows, TEAMS=config.teams, BLOCKS=config.blocks, USE_DOT=config.use_dot,
                FULL_STEPS=_full_steps(w, config), PAIRS=config.pairs, PREFETCH=config.prefetch,
                WORDS=config.words, FOLD_BIAS=_fold_bias(w, config), WORD_ORDER=config.word_order,
                V_MASKED=config.v_masked, UNROLL_TAIL=_unroll_tail(w, config), LAYOUT6=config.layout == "v6")


def _v7_meta(w: PreparedExperts, config: KernelConfig, group: int, dedup: bool) -> dict:
    _fold_bias(w, config)  # the layout check
    tail = _unroll_tail(w, config)
    xitem = config.xitem and tail >= 0 and w.row_blocks >= 3 * config.blocks
    return dict(NT=group, DEDUP=dedup, FULL_STEPS=_full_steps(w, config), UNROLL_TAIL=tail, WCACHE=config.wcache,
                L2PF=config.l2pf, VPF=config.vpf, XITEM=xitem, FLAT=config.flat, GDC=config.pdl, num_warps=1)


def gate_up_launch(w13: PreparedExperts, config: KernelConfig, group: int, dedup: bool, parts: bool
                   ) -> tuple[mt.Kernel, dict]:
    """The kernel object and constexprs (with num_warps) `gate_up` launches for these experts and config (also what
    tools/warp_decode_ab.py --sass compiles)."""
    if config.layout == "v7":
        return (gate_up_kernel_v7_16 if config.min_blocks == 16 else gate_up_kernel_v7), _v7_meta(w13, config, group,
                                                                                                  dedup)
    meta = dict(_dot_meta(w13, config), NT=group, DEDUP=dedup, H_PARTS=parts and not config.h_bf16,
                H_BF16=config.h_bf16, num_warps=config.num_warps)
    return (gate_up_kernel_16 if config.min_blocks == 16 else gate_up_kernel), meta


def down_launch(w2: PreparedExperts, config: KernelConfig, group: int, dedup: bool, batch: int, parts: bool,
                h_bf16: bool) -> tuple[mt.Kernel, dict]:
    """The kernel object and constexprs (with num_warps) `down` launches: h as bf16 parts, one bf16 part or fp32."""
    if config.layout == "v7":  # SUMS where the pairs are the items (no dedup); the caller adds TOPK
        return ((down_kernel_v7_16 if config.min_blocks == 16 else down_kernel_v7),
                dict(_v7_meta(w2, config, group, dedup), SUMS=config.sums and not dedup))
    meta = dict(_dot_meta(w2, config), NT=group, BT=1 << (batch - 1).bit_length(), DEDUP=dedup, H_PARTS=parts,
                H_BF16=h_bf16, num_warps=config.num_warps)
    return (down_kernel_16 if config.min_blocks == 16 else down_kernel), meta


def gate_up(x: torch.Tensor, routing: Routing, w13: PreparedExperts, config: KernelConfig | None = None,
            parts: bool = False) -> torch.Tensor:
    """Kernel 1: the fp32 intermediate h [B * topk, I], h[b * topk + j] = silu(gate) * up for expert ids[b, j].
    parts: return it instead as bf16 [2, B * topk, I], hi = bf16(h) and lo = bf16(h - hi), the form the mt.dot
    down kernel takes (split once here rather than in each of its programs; the same bytes as fp32 h)."""
    _check_experts(w13, "w13")
    B, D = x.shape
    if w13.k != D or w13.rows % 2:
        raise ValueError(f"w13 must be [E, 2I, D={D}], got rows={w13.rows}, K={w13.k}")
    I = w13.rows // 2
    if config is None:
        config = pick_config(w13.row_blocks, routing.n_pairs, routing.batch >= DOT_MIN_BATCH, _layout_variant(w13))
    _check_config(config)
    if config.h_bf16:
        h = torch.empty((routing.n_pairs, I), dtype=torch.bfloat16, device=x.device)
        parts = False
    elif parts:
        h = torch.empty((2, routing.n_pairs, I), dtype=torch.bfloat16, device=x.device)
    else:
        h = torch.empty((routing.n_pairs, I), dtype=torch.float32, device=x.device)
    programs = mt.cdiv(I, config.rows // 2)
    scales = w13.scale_words if config.layout == "v7" else w13.scales
    args = (x, routing.ids, routing.pairs, routing.first, routing.n_items, _weight_operand(w13, config), scales,
            h, routing.n_pairs, routing.topk, D, I, w13.row_blocks)
    kernel, meta = gate_up_launch(w13, config, routing.group, routing.dedup, parts)
    if config.layout == "v7":
        grid = _v7_grid(kernel, config, programs, routing, x.device, lambda: args, meta)
    else:
        grid = (programs, _splits(kernel, config, programs, routing, x.device, lambda: args, meta))
    kernel[grid](*args, **_one_item_no_xitem(meta, routing, grid[1]))
    return h


def _one_item_no_xitem(meta: dict, routing: Routing, splits: int) -> dict:
    """XITEM only where a program can have two items (at B = 1 gate_up runs one item a program: the next item's
    prefetch would only re-read its own first steps)."""
    if meta.get("XITEM") and routing.n_pairs <= splits:
        return dict(meta, XITEM=False)
    return meta


def down(h: torch.Tensor, routing: Routing, w2: PreparedExperts, out_dtype: torch.dtype = torch.bfloat16,
         config: KernelConfig | None = None) -> torch.Tensor:
    """Kernel 2: out [B, D] = sum_j weights[b, j] * W2[ids[b, j]] @ h[b * topk + j], accumulated in fp32. h is fp32
    [B * topk, I]; on the mt.dot path also `gate_up(..., parts=True)`'s bf16 [2, B * topk, I], or one bf16 part
    [B * topk, I] (a gate_up config with h_bf16)."""
    _check_experts(w2, "w2")
    parts = h.dim() == 3
    h_bf16 = h.dim() == 2 and h.dtype == torch.bfloat16
    P, I = h.shape[-2:]
    if (P != routing.n_pairs or w2.k != I or (parts and (h.dtype != torch.bfloat16 or h.shape[0] != 2))
            or (not parts and h.dtype not in (torch.float32, torch.bfloat16))):
        raise ValueError(f"h must be fp32 or bf16 [B*k={routing.n_pairs}, I={w2.k}], or bf16 [2, B*k, I] parts, "
                         f"got {h.dtype} {tuple(h.shape)}")
    if routing.batch > MAX_BATCH:
        raise ValueError(f"moe decode handles batches up to {MAX_BATCH}, got {routing.batch}")
    D = w2.rows
    if config is None:
        config = pick_config(w2.row_blocks, routing.n_pairs, routing.batch >= DOT_MIN_BATCH, _layout_variant(w2),
                             "down")
    _check_config(config)
    if (parts or h_bf16) and not config.use_dot:
        raise ValueError("h in bf16 (parts or one part) is for the mt.dot path (the CUDA-core path takes fp32 h)")
    if config.layout == "v7":
        return _down_v7(h, routing, w2, out_dtype, config)
    programs = mt.cdiv(D, config.rows)
    kernel, meta = down_launch(w2, config, routing.group, routing.dedup, routing.batch, parts, h_bf16)

    def args_with(out: torch.Tensor) -> tuple:
        return (h, routing.ids, routing.weights, routing.pairs, routing.first, routing.n_items,
                _weight_operand(w2, config), w2.scales, out, routing.n_pairs, routing.topk, routing.batch, D, I,
                w2.row_blocks)

    # The split is sized on the fp32-partials variant (a single split writes out_dtype: the same kernel otherwise).
    probe = lambda: args_with(torch.empty((1, routing.batch, D), dtype=torch.float32, device=h.device))
    splits = _splits(kernel, config, programs, routing, h.device, probe, meta)
    out = torch.empty((routing.batch, D), dtype=out_dtype, device=h.device)
    if splits == 1:  # each output written once, straight in out_dtype
        kernel[(programs, 1)](*args_with(out), **meta)
        return out
    parts = torch.empty((splits, routing.batch, D), dtype=torch.float32, device=h.device)  # fp32 partial sums
    kernel[(programs, splits)](*args_with(parts), **meta)
    n = routing.batch * D
    sum_splits_kernel[(mt.cdiv(n, SUM_BLOCK),)](parts, out, n, splits, BLOCK=SUM_BLOCK, num_warps=4)
    return out


_V7_PLANS: dict[tuple, tuple] = {}  # moe_decode's v7 launch plans, per call shape (see _v7_decode)


def _call_shape(variant: str, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                w13: PreparedExperts, w2: PreparedExperts, out_dtype: torch.dtype) -> tuple:
    """What a host fast path's launch plan depends on (shapes, strides, dtypes, device, layouts, variant): no
    tensor, so a plan is replayed for every call of that shape."""
    return (variant, x.device, tuple(x.shape), x.dtype, x.stride(), tuple(topk_ids.shape), topk_ids.dtype,
            topk_ids.stride(), topk_weights.dtype, topk_weights.stride(), out_dtype, w13.layout, w2.layout,
            w13.num_experts, w13.rows, w13.k, w13.row_blocks, w2.num_experts, w2.rows, w2.k, w2.row_blocks)


def _check_v7_layout(variant: str, w13: PreparedExperts, w2: PreparedExperts) -> None:
    if w13.layout != "v7" or w2.layout != "v7":
        raise ValueError(f"variant {variant!r} reads layout 'v7'; the experts are in {w13.layout!r} "
                         f"(prepare_experts(..., layout='v7'))")


def _v7_decode(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13: PreparedExperts,
               w2: PreparedExperts, variant: str, out_dtype: torch.dtype) -> torch.Tensor:
    """moe_decode on a v7 variant with the DSL routing, with a host path of a routing, three allocations and four
    launches at most: the checks, configs, constexprs and item splits are worked out once per call shape (the
    key holds every property they depend on, no tensor) and replayed. The generic path spent ~90-180 us of Python
    per call on the CPU machine (launches stubbed), more than the predicted GPU time at B = 1."""
    B, k = topk_ids.shape
    key = _call_shape(variant, x, topk_ids, topk_weights, w13, w2, out_dtype)
    plan = _V7_PLANS.get(key)
    if plan is None or x.device.type == "cpu":  # CPU: the id-range check of _check_inputs runs every call
        _check_inputs(x, topk_ids, topk_weights, w13, w2)
    routing, _ = plan_routing(topk_ids, topk_weights, True, None, "dsl", w13.num_experts)
    I, D = w13.rows // 2, w2.rows
    h = torch.empty((routing.n_pairs, I), dtype=torch.bfloat16, device=x.device)
    part = torch.empty((k, B, D), dtype=torch.float32, device=x.device)
    out = torch.empty((B, D), dtype=out_dtype, device=x.device)
    # down's SUMS counters (pairs as items only; zero between launches); unused otherwise
    sums = DOT_VARIANTS[variant][1].get("sums") and not routing.dedup
    flags = _sync_words(B * mt.cdiv(v7_half(D), V7_GROUP), x.device) if sums else part
    args13 = (x, routing.ids, routing.pairs, routing.first, routing.n_items, w13.words, w13.scale_words, h,
              routing.n_pairs, k, D, I, w13.row_blocks)
    args2 = (h, routing.ids, routing.weights, routing.pairs, routing.first, routing.n_items, w2.words,
             w2.scale_words, part, out, flags, routing.n_pairs, k, B, D, I, w2.row_blocks)
    if plan is None:
        _check_v7_layout(variant, w13, w2)
        launches = []
        for w, kind, programs, args in ((w13, "gate_up", mt.cdiv(I, V7_GROUP), args13),
                                        (w2, "down", mt.cdiv(v7_half(D), V7_GROUP), args2)):
            config = pick_config(w.row_blocks, routing.n_pairs, True, variant, kind)
            _check_config(config)
            kernel, meta = (gate_up_launch(w, config, routing.group, routing.dedup, False) if kind == "gate_up"
                            else down_launch(w, config, routing.group, routing.dedup, B, False, True))
            if meta.get("SUMS"):
                meta["TOPK"] = 1 << (k - 1).bit_length()
            grid = _v7_grid(kernel, config, programs, routing, x.device, lambda args=args: args, meta)
            launches.append((kernel[grid], _one_item_no_xitem(meta, routing, grid[1])))
        plan = _V7_PLANS[key] = tuple(launches)
    (up, up_meta), (dn, dn_meta) = plan
    up(*args13, **up_meta)
    dn(*args2, **dn_meta)
    if not dn_meta.get("SUMS"):
        n = B * D
        sum_slots_kernel[(mt.cdiv(n, SLOTS_BLOCK),)](part, out, n, SLOTS=k, BLOCK=SLOTS_BLOCK, GDC=dn_meta["GDC"],
                                                     num_warps=2)
    return out


_FUSED_PLANS: dict[tuple, tuple] = {}  # _fused_decode's launch (grid, constexprs) per call shape
_SYNC_WORDS: dict[tuple, torch.Tensor] = {}  # zeroed counters per (device, stream), zero between launches
FUSED_INTERPRET_PROGRAMS = 3  # the grid under the interpreter (its programs run one after another)


def _sync_words(words: int, device: torch.device) -> torch.Tensor:
    """Zeroed int32 counters for the kernels that count between programs (moe_fused_kernel_v7's sync words, the
    SUMS flags of down_kernel_v7) on this device and stream: each launch leaves them zero, and one buffer per
    stream keeps launches on different streams from sharing counters."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device, stream)
    sync = _SYNC_WORDS.get(key)
    if sync is None or sync.numel() < words:
        sync = _SYNC_WORDS[key] = torch.zeros(max(words, 1024), dtype=torch.int32, device=device)
    return sync


def _fused_decode(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13: PreparedExperts,
                  w2: PreparedExperts, variant: str, out_dtype: torch.dtype) -> torch.Tensor:
    """moe_decode in one launch of moe_fused_kernel_v7 (variant in FUSED_VARIANTS, B <= FUSED_MAX_BATCH): no
    routing (the pairs are the items), h and the per-pair parts in scratch tensors, the sync words zeroed by the
    kernel itself. The grid is the GPU's resident programs (any size is correct: a unit only waits for units
    claimed before it)."""
    B, k = topk_ids.shape
    key = _call_shape(variant, x, topk_ids, topk_weights, w13, w2, out_dtype)
    plan = _FUSED_PLANS.get(key)
    if plan is None or x.device.type == "cpu":
        _check_inputs(x, topk_ids, topk_weights, w13, w2)
    if B > FUSED_MAX_BATCH:
        raise ValueError(f"variant {variant!r} handles batches up to {FUSED_MAX_BATCH} (pairs as items), got {B}")
    ids, weights = _flat_pairs(topk_ids, topk_weights)
    P, I, D = B * k, w13.rows // 2, w2.rows
    h = torch.empty((P, I), dtype=torch.bfloat16, device=x.device)
    part = torch.empty((k, B, D), dtype=torch.float32, device=x.device)
    out = torch.empty((B, D), dtype=out_dtype, device=x.device)
    sync = _sync_words(FUSED_SYNC_HEAD + P + B * mt.cdiv(v7_half(D), V7_GROUP), x.device)
    args = (x, ids, weights, w13.words, w13.scale_words, w2.words, w2.scale_words, h, part, out, sync, P, k, B, D, I,
            w13.row_blocks, w2.row_blocks)
    if plan is None:
        _check_v7_layout(variant, w13, w2)
        c13, c2 = (pick_config(w.row_blocks, P, True, variant, kind) for w, kind in ((w13, "gate_up"), (w2, "down")))
        _check_config(c13)
        m13, m2 = _v7_meta(w13, c13, V7_GROUP, False), _v7_meta(w2, c2, V7_GROUP, False)
        meta = dict(NT=V7_GROUP, TOPK=1 << (k - 1).bit_length(), FULL13=m13["FULL_STEPS"], TAIL13=m13["UNROLL_TAIL"],
                    FULL2=m2["FULL_STEPS"], TAIL2=m2["UNROLL_TAIL"], WCACHE=c13.wcache, L2PF=c13.l2pf, num_warps=1)
        programs = (moe_fused_kernel_v7.resident_programs(*args, **meta) if x.device.type == "cuda"
                    else FUSED_INTERPRET_PROGRAMS)
        plan = _FUSED_PLANS[key] = (moe_fused_kernel_v7[(programs,)], meta)
    launch, meta = plan
    launch(*args, **meta)
    return out


def _down_v7(h: torch.Tensor, routing: Routing, w2: PreparedExperts, out_dtype: torch.dtype,
             config: KernelConfig) -> torch.Tensor:
    """down on the v7 kernels: per-pair weighted contributions into fp32 [topk, B, D], then the topk slots of each
    token added in slot order (sum_slots_kernel) in out_dtype. Deterministic for any item split."""
    if h.dim() != 2 or h.dtype != torch.bfloat16:
        raise ValueError(f"the v7 down kernel reads h as one bf16 part [B*k, I], got {h.dtype} {tuple(h.shape)}")
    D, I = w2.rows, w2.k
    programs = mt.cdiv(v7_half(D), V7_GROUP)
    kernel, meta = down_launch(w2, config, routing.group, routing.dedup, routing.batch, False, True)
    if meta["SUMS"]:
        meta["TOPK"] = 1 << (routing.topk - 1).bit_length()
    part = torch.empty((routing.topk, routing.batch, D), dtype=torch.float32, device=h.device)
    out = torch.empty((routing.batch, D), dtype=out_dtype, device=h.device)
    flags = _sync_words(routing.batch * programs, h.device) if meta["SUMS"] else part
    args = (h, routing.ids, routing.weights, routing.pairs, routing.first, routing.n_items,
            _weight_operand(w2, config), w2.scale_words, part, out, flags, routing.n_pairs, routing.topk,
            routing.batch, D, I, w2.row_blocks)
    grid = _v7_grid(kernel, config, programs, routing, h.device, lambda: args, meta)
    kernel[grid](*args, **_one_item_no_xitem(meta, routing, grid[1]))
    if meta["SUMS"]:
        return out
    n = routing.batch * D
    sum_slots_kernel[(mt.cdiv(n, SLOTS_BLOCK),)](part, out, n, SLOTS=routing.topk, BLOCK=SLOTS_BLOCK, GDC=meta["GDC"],
                                                 num_warps=2)
    return out


SLOTS_BLOCK = 256  # outputs per program of sum_slots_kernel (2 warps, 4 outputs a thread)


def plan_routing(topk_ids: torch.Tensor, topk_weights: torch.Tensor, use_dot: bool | None = None,
                 dedup: bool | None = None, method: str = "torch", num_experts: int | None = None
                 ) -> tuple[Routing, bool]:
    """The default routing for a batch: pairs grouped by expert, 8 per item on the mt.dot path (the n8 of
    m16n8k16: with fewer slots the dot would not go to the tensor cores) and 2 on CUDA cores; no grouping on CUDA
    cores at B = 1 (a token's experts are distinct: no preparation at all). method (KernelConfig.routing) "dsl":
    route_sort_kernel instead of torch.sort + route_items_kernel, and at B = 1 on the mt.dot path items that are
    the pairs themselves (DEDUP off: the kernels read no item tables, one load fewer in each item's prologue);
    it needs num_experts (the ids' range), else the torch routing is used."""
    batch = topk_ids.shape[0]
    use_dot = batch >= DOT_MIN_BATCH if use_dot is None else use_dot
    dedup = (batch > 1 or use_dot) if dedup is None else dedup
    group = (8 if use_dot else 2) if dedup else 1
    if method == "dsl" and dedup and use_dot and num_experts is not None:
        ids, weights = _flat_pairs(topk_ids, topk_weights)
        if batch == 1:  # item i = pair i, read straight from the ids (pairs / first / n_items unused)
            return Routing(ids, weights, ids, ids, ids, 1, ids.numel(), group, False), use_dot
        return dsl_routing(ids, weights, batch, topk_ids.shape[1], group, num_experts), use_dot
    if dedup and batch == 1:  # one token: each pair its own item, in slot order (no sort, no kernel)
        ids, weights = _flat_pairs(topk_ids, topk_weights)
        return Routing(ids, weights, *_single_token_items(ids.numel(), ids.device), 1, ids.numel(), group,
                       True), use_dot
    return make_routing(topk_ids, topk_weights, group, dedup), use_dot


def moe_decode(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13: PreparedExperts,
               w2: PreparedExperts, *, out_dtype: torch.dtype = torch.bfloat16, use_dot: bool | None = None,
               dedup: bool | None = None, variant: str | None = None, h_precision: str = "bf16") -> torch.Tensor:
    """The routed-expert part of an MXFP4 MoE layer for a decode batch.

    x:            bf16 [B, D] (B <= 256), contiguous.
    topk_ids:     int32 [B, k] expert ids in [0, E) (int64 is converted).
    topk_weights: fp32 [B, k] routing weights (applied to each expert's down-projection output).
    w13:          prepare_experts of gate+up [E, 2I, D] (rows [0, I) gate, [I, 2I) up).
    w2:           prepare_experts of down [E, D, I].
    out_dtype:    bf16 (default), or fp32 to see the result before the output rounding.
    use_dot:      force the mt.dot (True) or CUDA-core (False) inner products; default: mt.dot from B = 2.
    dedup:        group pairs by expert so shared experts are read once; default: when B > 1 or on mt.dot.
    variant:      the mt.dot path's variant, a key of DOT_VARIANTS (default `default_variant(B, h_precision,
                  w13.layout)`); a named variant decides the intermediate precision itself, and must read the
                  experts' layout (variant_layout; w13 and w2 prepared with the same layout).
    h_precision:  the intermediate h = silu(gate) * up between the two kernels on the mt.dot path: "bf16"
                  (default; rounded once, relative error ~1e-3 against float64, as triton_kernels) or "fp32"
                  (two bf16 parts, ~1e-5; about 10-20% slower). The CUDA-core path keeps h in fp32 either way.
    Returns out_dtype [B, D] = sum_j w[b, j] * W2[e] @ (silu(W13[e, :I] @ x_b) * (W13[e, I:] @ x_b)), e = ids[b, j].
    """
    if use_dot is not False and dedup is None and isinstance(w13, PreparedExperts):  # the v7 host fast path
        v7 = (v7_default_variant(x.shape[0]) if variant is None and h_precision == "bf16" and w13.layout == "v7"
              else variant)
        if v7 in FUSED_VARIANTS:
            return _fused_decode(x, topk_ids, topk_weights, w13, w2, v7, out_dtype)
        if v7 in V7_VARIANTS and h_precision in H_PRECISIONS and DOT_VARIANTS[v7][0].get("routing") == "dsl":
            return _v7_decode(x, topk_ids, topk_weights, w13, w2, v7, out_dtype)
    _check_inputs(x, topk_ids, topk_weights, w13, w2)
    if variant is not None and variant not in DOT_VARIANTS:
        raise ValueError(f"variant must be one of {sorted(DOT_VARIANTS)}, got {variant!r}")
    default = default_variant(x.shape[0], h_precision, w13.layout)  # checks h_precision even when one is named
    variant = variant or default
    method = DOT_VARIANTS[variant][0].get("routing", "torch") if use_dot is not False else "torch"
    routing, use_dot = plan_routing(topk_ids, topk_weights, use_dot, dedup, method, w13.num_experts)
    if not use_dot and w13.layout != "v5":
        raise ValueError(f"use_dot=False (the CUDA-core path) reads layout 'v5'; the experts are in {w13.layout!r} "
                         f"(prepare_experts(..., layout='v5'))")
    if use_dot and w13.layout not in READABLE_LAYOUTS[variant_layout(variant)]:
        raise ValueError(f"variant {variant!r} reads layout {variant_layout(variant)!r}; the experts are in "
                         f"{w13.layout!r} (prepare_experts(..., layout=...))")
    c13 = pick_config(w13.row_blocks, routing.n_pairs, use_dot, variant)
    c2 = pick_config(w2.row_blocks, routing.n_pairs, use_dot, variant, "down")
    h = gate_up(x, routing, w13, c13, parts=use_dot)
    return down(h, routing, w2, out_dtype, c2)


def _check_inputs(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13: PreparedExperts,
                  w2: PreparedExperts) -> None:
    _check_experts(w13, "w13")
    _check_experts(w2, "w2")
    if x.dim() != 2 or x.dtype != torch.bfloat16 or not x.is_contiguous():
        raise ValueError(f"x must be a contiguous bf16 [B, D] tensor, got {x.dtype} {tuple(x.shape)}")
    B, D = x.shape
    if topk_ids.dim() != 2 or topk_ids.shape[0] != B or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_ids/topk_weights must be [B={B}, k], got {tuple(topk_ids.shape)} and "
                         f"{tuple(topk_weights.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64) or not topk_weights.is_floating_point():
        raise TypeError(f"topk_ids must be int32 (or int64), topk_weights floating; got {topk_ids.dtype}, "
                        f"{topk_weights.dtype}")
    E = w13.num_experts
    if w2.num_experts != E or w13.k != D or w2.rows != D or w13.rows != 2 * w2.k:
        raise ValueError(f"expert shapes do not fit x [B, {D}]: w13 [E={w13.num_experts}, {w13.rows}, {w13.k}], "
                         f"w2 [E={w2.num_experts}, {w2.rows}, {w2.k}] (need [E, 2I, D] and [E, D, I])")
    if not 1 <= B <= MAX_BATCH:
        raise ValueError(f"batch must be in [1, {MAX_BATCH}], got {B}")
    if w13.layout != w2.layout:
        raise ValueError(f"w13 and w2 must share a layout, got {w13.layout!r} and {w2.layout!r}")
    if x.device.type == "cpu" and topk_ids.numel() and (int(topk_ids.min()) < 0 or int(topk_ids.max()) >= E):
        raise ValueError(f"topk_ids must lie in [0, {E})")  # checked only on CPU: on the GPU it would sync


# ------------------------------------------------------------------------------------------ reference


def reference(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
              w13: tuple[torch.Tensor, torch.Tensor], w2: tuple[torch.Tensor, torch.Tensor],
              return_intermediate: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """float64 MoE with exactly dequantized MXFP4 experts (mxfp4.dequantize: 0xFF scales are NaN).

    w13 = (blocks [E, 2I, D/2], scales [E, 2I, D/32]), w2 = (blocks [E, D, I/2], scales [E, D, I/32]) in the
    natural (un-prepared) layout. Returns out float64 [B, D], and with return_intermediate also h float64
    [B * k, I] (what gate_up computes in fp32). Each distinct expert is dequantized once, on the tensors' device."""
    B, D = x.shape
    k = topk_ids.shape[1]
    I = w13[0].shape[1] // 2
    ids = topk_ids.reshape(-1).long()
    token = torch.arange(B * k, device=x.device) // k
    xd = x.double()
    h = torch.empty((B * k, I), dtype=torch.float64, device=x.device)
    out = torch.zeros((B, D), dtype=torch.float64, device=x.device)
    weights = topk_weights.reshape(-1).double()
    for e in ids.unique().tolist():
        pairs = (ids == e).nonzero().reshape(-1)
        gate_up = xd[token[pairs]] @ mxfp4.dequantize(w13[0][e], w13[1][e], D).T
        h[pairs] = torch.nn.functional.silu(gate_up[:, :I]) * gate_up[:, I:]
        down = h[pairs] @ mxfp4.dequantize(w2[0][e], w2[1][e], I).T
        out.index_add_(0, token[pairs], weights[pairs, None] * down)
    return (out, h) if return_intermediate else out
