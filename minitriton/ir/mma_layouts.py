"""Tensor-core layout encodings: what `#mt.mma`, `#mt.dot_op` and `#mt.shared` mean (pure functions on ints).

  #mt.mma<{version = 2 | 3, warpsPerCTA = [WM, WN], instrShape = [..]}>      an mt.dot accumulator / result
  #mt.dot_op<{opIdx = 0 | 1, parent = #mt.mma<...>, kWidth = 2}>             an mma.sync register operand
  #mt.shared<{swizzle = 128 | 64 | 32, order = [..]}>                        a tile in shared memory (wgmma)

Accumulator (#mt.mma). version 2 is `mma.sync.m16n8k16` (instrShape [16, 8]: one warp computes a 16 x 8 tile per
instruction), version 3 is `wgmma.mma_async.m64nNk16` (instrShape [16, N, 16]: one warp of a warpgroup computes 16
rows x N columns of the warpgroup's 64 x N tile; WN = 1 then). A thread holds, per instruction, two rows (the
hardware's g and g + 8, g = lane / 4) and two adjacent columns per 8-column block (2 * (lane % 4) + {0, 1}).

MiniTriton chooses *which tile rows* a warp's instruction computes: the operand A is staged through shared memory
(ldmatrix addresses / wgmma tiles are written by our own code), so any row permutation of A is free, and C's rows
follow A's. The permutation is chosen so that the accumulator layout is exactly the blocked layout

    sizePerThread = [1, 2], threadsPerWarp = [8, 4], warpsPerCTA = [WM, WN], order = [1, 0]

that is, thread (lane, warp) holds rows g + 8 * warp_m + 8 * WM * a (a = 0, 1, ...) and columns 2 * (lane % 4) +
8 * warp_n + 8 * WN * b + {0, 1}. Hardware row g + 8 * i of the instruction for m-block r is tile row
g + 8 * warp_m + 8 * WM * (2 * r + i) (mma.sync); for wgmma, hardware row 16 * w + 8 * i + g of the warpgroup's
m-block r is tile row g + 8 * warp + 8 * W * (2 * r + i) (warp = 4 * warpgroup + w). codegen/mma.py and
codegen/wgmma.py apply this map when they address A; every other lowering (elementwise, reductions,
convert_layout, stores) sees an ordinary blocked thread map. Shapes must have M a multiple of 16 * WM and N of
8 * WN (no wrap-around: every thread holds whole instruction fragments).

mma.sync operand (#mt.dot_op, parent version 2; kWidth = 2 for 16-bit elements: two K-adjacent elements per
32-bit register, instruction m16n8k16; kWidth = 1 for tf32, m16n8k8). A (opIdx 0, M x K): thread holds rows
g + 8 * warp_m + 8 * WM * a (the accumulator's rows) and K columns kWidth * (lane % 4) + 4 * kWidth * c + s
(s < kWidth); the WN warps along N hold copies. B (opIdx 1, K x N): those K rows, columns g + 8 * warp_n +
8 * WN * b; the WM warps along M hold copies. Registers are numbered in fragment order: A per (m-block r, K step
kk) the elements a0..a7 (a0..a3 for tf32) of `mma.sync`'s A fragment, B per (n-block b, kk) b0..b3 (b0, b1) —
see codegen/mma.py for the fragments.

wgmma operand in registers (#mt.dot_op, opIdx 0, parent version 3, kWidth 2): wgmma.mma_async may take A from
registers, four 32-bit words a thread per m-block and K step, in exactly mma.sync m16n8k16's A fragment (warp w of
a warpgroup holds the warpgroup's hardware rows 16 w .. 16 w + 15). With A's rows permuted as above (warp = 4 *
warpgroup + w), the thread map is the one of an mma.sync A operand on warps [W, 1], and it equals the
accumulator's with K = N: an accumulator rounded to 16 bits is the next wgmma's A by register renaming (the
FlashAttention-3 arrangement: a recurrent state or softmax P never goes through shared memory).

`kPairs = 1` (tf32 only) permutes K inside each 8-column block for both operands of a dot: fragment K column
t + 4 * c holds tile column 2 * t + c (`tf32_a_column`), so a lane holds the adjacent pair 2t, 2t + 1. A dot
sums over K, so the permutation changes nothing as long as A and B share it. What it buys: the A operand
[M, K] with WN = 1 then has exactly the accumulator's thread map (rows g + 8 * i, columns 2t + {0, 1}), so
an accumulator, or a tile loaded in the accumulator's blocked layout, is an A operand by register renaming.
A recurrent state can then stay in registers between tensor-core products (KDA decode's chunk step).

Shared (#mt.shared): `order` lists the dims fastest first (the contiguous one, K for wgmma operands: "K-major"),
`swizzle` the byte width S of the swizzle atom: 8 rows of S bytes, in which byte address bits 4 .. 4 + log2(S / 16)
(the 16-byte chunk) are XORed with bits 7 .. (so with 128-byte rows, chunk j of row r is stored at j ^ (r % 8)),
as the hardware's wgmma descriptors and TMA expect (codegen/wgmma.py). Not a distributed layout: no thread map.
With `operand = 0 | 1` (pipeline ring slots a wgmma reads in place, passes/pipeline.py) the tile is laid out as that
wgmma operand: 0 = A (M x K, order [1, 0]: K-major, rows permuted as above), 1 = B (K x N, order [1, 0]: N-major,
column atoms of S / 2 values; the wgmma takes it with imm-trans-b = 1); `stages` on a ring's encoding counts slots.
"""
from __future__ import annotations

from typing import Sequence

from .layouts import DimMap, ThreadMap, blocked, log2, register_permutation, thread_map
from .types import LayoutAttr, layout

MMA_VERSIONS = (2, 3)
SWIZZLES = (32, 64, 128)


# --------------------------------------------------------------------------------------------- builders


def mma_layout(version: int, warps_per_cta: Sequence[int], instr_shape: Sequence[int]) -> LayoutAttr:
    """`#mt.mma<{version, warpsPerCTA, instrShape}>` (checked)."""
    enc = layout("mma", version=version, warpsPerCTA=list(warps_per_cta), instrShape=list(instr_shape))
    check_mma(enc)
    return enc


def dot_operand_layout(op_idx: int, parent: LayoutAttr, k_width: int, k_pairs: bool = False) -> LayoutAttr:
    """`#mt.dot_op<{opIdx, parent, kWidth}>`: operand a (0) or b (1) of a dot whose result has layout `parent`;
    `k_pairs` (tf32 only) adds `kPairs = 1`: K permuted within each 8-column block (see the module docstring)."""
    params = {"opIdx": op_idx, "parent": parent, "kWidth": k_width}
    if k_pairs:
        params["kPairs"] = 1
    enc = layout("dot_op", **params)
    check_dot_operand(enc)
    return enc


def shared_layout(swizzle: int, order: Sequence[int]) -> LayoutAttr:
    """`#mt.shared<{swizzle, order}>`: a shared-memory tile, dims `order` fastest first, `swizzle`-byte atoms."""
    enc = layout("shared", swizzle=swizzle, order=list(order))
    check_shared(enc)
    return enc


def is_mma(enc: LayoutAttr | None) -> bool:
    return enc is not None and enc.kind == "mma"


def is_dot_operand(enc: LayoutAttr | None) -> bool:
    return enc is not None and enc.kind == "dot_op"


def is_shared(enc: LayoutAttr | None) -> bool:
    return enc is not None and enc.kind == "shared"


def check_mma(enc: LayoutAttr) -> None:
    version, warps, instr = enc.get("version"), tuple(enc.get("warpsPerCTA", ())), tuple(enc.get("instrShape", ()))
    if version not in MMA_VERSIONS or len(warps) != 2:
        raise ValueError(f"malformed mma layout {enc}")
    for w in warps:
        log2(w)
    if version == 2 and instr != (16, 8):
        raise ValueError(f"mma version 2 has instrShape [16, 8], got {enc}")
    if version == 3:
        if len(instr) != 3 or instr[0] != 16 or instr[2] != 16 or instr[1] % 8 or not 8 <= instr[1] <= 256:
            raise ValueError(f"mma version 3 has instrShape [16, N, 16] with N in 8..256 step 8, got {enc}")
        if warps[1] != 1 or warps[0] % 4:
            raise ValueError(f"mma version 3 needs warpsPerCTA [4k, 1] (whole warpgroups along M), got {enc}")


def check_dot_operand(enc: LayoutAttr) -> None:
    parent = enc.get("parent")
    if enc.get("opIdx") not in (0, 1) or not isinstance(parent, LayoutAttr) or parent.kind != "mma":
        raise ValueError(f"malformed dot_op layout {enc}")
    check_mma(parent)
    if parent.get("version") == 3:
        if enc.get("opIdx") != 0 or enc.get("kWidth") != 2 or enc.get("kPairs"):
            raise ValueError(f"a version 3 (wgmma) dot_op layout is a 16-bit A operand in registers (opIdx 0, "
                             f"kWidth 2), got {enc}")
    elif parent.get("version") != 2 or enc.get("kWidth") not in (1, 2):
        raise ValueError(f"dot_op layouts are mma.sync register operands (version 2 parent, kWidth 2 for 16-bit "
                         f"elements, 1 for tf32), got {enc}")
    if enc.get("kPairs") not in (None, 1) or (enc.get("kPairs") and enc.get("kWidth") != 1):
        raise ValueError(f"kPairs = 1 is a tf32 (kWidth 1) operand's K order, got {enc}")


def k_pairs(enc: LayoutAttr) -> bool:
    """Whether a dot_op layout holds K pairs (`kPairs = 1`)."""
    return bool(enc.get("kPairs"))


def check_shared(enc: LayoutAttr) -> None:
    order = list(enc.get("order", ()))
    if enc.get("swizzle") not in SWIZZLES or sorted(order) != list(range(len(order))):
        raise ValueError(f"malformed shared layout {enc}")


# ------------------------------------------------------------------------------------------- thread maps


def accumulator_blocked(enc: LayoutAttr) -> LayoutAttr:
    """The blocked layout whose thread map an `#mt.mma` accumulator has (see the module docstring)."""
    return blocked([1, 2], [8, 4], enc.get("warpsPerCTA"), [1, 0])


def is_accumulator_blocked(enc: LayoutAttr) -> bool:
    """Whether a blocked layout is an mma.sync accumulator's (`accumulator_blocked` of warps [W, 1]): a tile loaded or
    stored in it is an accumulator, or (kPairs) a tf32 A operand, without conversion."""
    if enc.kind != "blocked":
        return False
    wm, wn = enc.get("warpsPerCTA")
    return wn == 1 and enc == accumulator_blocked(mma_layout(2, [wm, 1], [16, 8]))


def warps_of(enc: LayoutAttr) -> tuple[int, int]:
    """(WM, WN) of an mma layout or of a dot_op's parent."""
    if enc.kind == "dot_op":
        enc = enc.get("parent")
    wm, wn = enc.get("warpsPerCTA")
    return wm, wn


def mma_thread_map(enc: LayoutAttr, shape: tuple[int, ...]) -> ThreadMap:
    """The accumulator's thread map: the blocked one, for any shape (a `#mt.slice` of an mma layout maps a size-1
    dim, whose lanes and warps then hold copies, like any blocked layout's). A dot needs M a multiple of
    16 * WM and N of 8 * WN (`tiles_accumulator`)."""
    return thread_map(accumulator_blocked(enc), shape)


def tiles_accumulator(enc: LayoutAttr, shape: tuple[int, ...]) -> bool:
    """Whether every thread holds whole instruction fragments of an M x N accumulator in layout `enc`."""
    wm, wn = warps_of(enc)
    return len(shape) == 2 and shape[0] % (16 * wm) == 0 and shape[1] % (8 * wn) == 0


def dot_operand_thread_map(enc: LayoutAttr, shape: tuple[int, ...]) -> ThreadMap:
    wm, wn = warps_of(enc)
    op_idx, k_width = enc.get("opIdx"), enc.get("kWidth")
    if len(shape) != 2:
        raise ValueError(f"dot_op layouts are 2-D, got shape {shape}")
    rows, k = (shape[0], shape[1]) if op_idx == 0 else (shape[1], shape[0])
    per_block = 16 * wm if op_idx == 0 else 8 * wn
    k_step = 8 * k_width  # m16n8k16 for 16-bit elements, m16n8k8 for tf32
    if rows % per_block or k % k_step:
        raise ValueError(f"dot_op layout {enc} does not tile shape {shape}")
    # lane % 4 picks kWidth adjacent K columns (per 8-wide K block); every warp holds all of K. kPairs: lane t
    # holds columns 2t (fragment column t) and 2t + 1 (fragment column t + 4) of each 8-column block
    pairs = k_pairs(enc)
    k_dim = DimMap(k, 2 if pairs else k_width, 4, 1, 0, 0)

    def k_offset(kk: int, half: int, s: int) -> int:  # K step kk, its half (first / second 4 * kWidth columns)
        return k_step * kk + (half if pairs else 4 * k_width * half + s)

    if op_idx == 0:
        row_dim = DimMap(rows, 1, 8, wm, 2, log2(wn))  # warps are numbered warp_n fastest (order [1, 0])
        copies = DimMap(1, 1, 1, wn, 0, 0)
        # fragment element j: 16-bit a0..a7 = (row half (j >> 1) & 1, K half j >> 2, s = j & 1); tf32 a0..a3 =
        # (row half j & 1, K half j >> 1)
        split = ((lambda j: ((j >> 1) & 1, j >> 2, j & 1)) if k_width == 2 else (lambda j: (j & 1, j >> 1, 0)))
        offsets = [(8 * wm * (2 * r + i), k_offset(kk, h, s))
                   for r in range(rows // per_block) for kk in range(k // k_step) for i, h, s in
                   map(split, range(4 * k_width))]
        return ThreadMap((row_dim, k_dim), (copies,), tuple(offsets), wm * wn)
    col_dim = DimMap(rows, 1, 8, wn, 2, 0)
    copies = DimMap(1, 1, 1, wm, 0, log2(wn))
    # b0..b3 (16-bit) = (K half j >> 1, s = j & 1); tf32 b0, b1 = K half j
    offsets = [(k_offset(kk, j // k_width, j % k_width), 8 * wn * b)
               for b in range(rows // per_block) for kk in range(k // k_step) for j in range(2 * k_width)]
    return ThreadMap((k_dim, col_dim), (copies,), tuple(offsets), wm * wn)


# ------------------------------------------------------------------------------ accumulator as an operand


def tf32_a_column(k: int) -> int:
    """The accumulator column that a tf32 A operand's column k reads when the accumulator is taken in place.

    Within each 8-column block, A column t + 4 * c (t = lane % 4, c < 2) is accumulator column 2 * t + c. The
    m16n8k8 A fragment holds columns {t, t + 4} and the accumulator columns {2t, 2t + 1}, in the same rows, so
    the renaming moves no data. A dot contracting over these columns must read its B operand's K rows through the
    same map. For B's thread (t, g) that means rows 2t and 2t + 1: adjacent, one 8-byte load where B is staged.
    """
    block, r = divmod(k, 8)
    return 8 * block + 2 * (r % 4) + r // 4


def accumulator_as_tf32_a(acc: LayoutAttr, shape: tuple[int, int]) -> list[int] | None:
    """Per register of the tf32 A operand [M, K = N] (mma.sync m16n8k8, the same warps), the register of the
    mma.sync accumulator `acc` ([M, N], version 2) that holds its element when K is permuted by tf32_a_column.
    None when no renaming exists: WN > 1 (the A operand's copies along N are not in the accumulator), or a
    shape the accumulator does not tile.

    This is the fact behind keeping a recurrent state in registers across tensor-core products. KDA's decode
    state S [V, K] is updated as an accumulator (S += D^T K^) and read as the A operand of S K^T in the next
    token chunk, with no pass through shared memory (docs/kernels/kda_decode.md). The identity map has no such
    renaming: the two fragments differ in their column sets."""
    if acc.get("version") != 2 or warps_of(acc)[1] != 1 or not tiles_accumulator(acc, shape):
        return None
    a_map = dot_operand_thread_map(dot_operand_layout(0, acc, 1), shape)
    return register_permutation(mma_thread_map(acc, shape), a_map, lambda c: (c[0], tf32_a_column(c[1])))


def transposed_accumulator_as_b(acc: LayoutAttr, shape: tuple[int, int], k_width: int) -> list[int] | None:
    """Per register of the B operand [K, N] of an mma.sync dot on warps [1, W], the register of the accumulator
    `acc` ([N, K], warps [W, 1]) holding its transposed element, or None. The accumulator's lane holds rows g and
    columns 2t, 2t + 1 of each 8-column block; B's lane holds column g and K rows 2t, 2t + 1 (+ 8 for a 16-wide
    step): for 16-bit operands (k_width 2) in the plain order, for tf32 (k_width 1) in kPairs order. So a state
    kept transposed, S^T [V, K], is the B operand of x @ S without shared memory (FlashKDA's recurrence:
    v_new = u - w S; docs/kernels/flash_kda.md)."""
    wm, wn = warps_of(acc)
    n, k = shape
    if acc.get("version") != 2 or wn != 1 or not tiles_accumulator(acc, shape):
        return None
    dot = mma_layout(2, [1, wm], [16, 8])
    b = dot_operand_layout(1, dot, k_width, k_pairs=k_width == 1)
    try:
        b_map = dot_operand_thread_map(b, (k, n))
    except ValueError:
        return None
    return register_permutation(mma_thread_map(acc, shape), b_map, lambda c: (c[1], c[0]))

