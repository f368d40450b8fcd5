"""Tensor cores: the dot-lowering pass (passes/dot_lowering.py), the layouts (minitriton/ir/mma_layouts.py) and the
mma.sync / wgmma codegen (codegen/mma.py, codegen/wgmma.py).

1. Fragment maps against CUTLASS's CuTe layouts (SM80_16x8x16_F32BF16BF16F32_TN, GMMA CLayout_64xN): a second,
   independent statement of the hardware's (lane, register) -> (row, col) maps, checked on every lane and register;
   ldmatrix's quadrant order against the A / B fragments; the wgmma descriptor and swizzle against hopper_ptx.md.
2. Thread maps: every register the codegen feeds to an instruction holds, in every thread, the element the hardware
   fragment (and the row permutation of mma_layouts.py) says — for several warp tilings; coverage and owners.
3. The pass's choice of instruction per shape / warps / dtype (IR-text tests: tests/passes/dot_lowering.mtir).
4. PTX: ptxas accepts the example matmul (64 x 64 x 32 bf16, with and without bias + gelu) and attention for each
   instruction, and the instructions are there.
5. The PTX runs in the simulator (tests/ptx_sim.py + ptx_sim_mma.py, which executes ldmatrix / mma.sync / wgmma from
   the PTX ISA's descriptions) and must match the interpreter on fresh random inputs: bf16 outputs within 8e-3
   relative (one bf16 rounding of values the two compute with different f32 summation orders), f32 outputs within
   1e-5. The simulator's own checks (missing proxy fence, wait, wgmma.fence) are tested to fire.
6. On a GPU (`-m gpu`): matmul shapes 64^3, 100 x 70 x 90 and 512 x 384 x 640 and attention, per instruction, against
   the interpreter and torch; and through the runtime (`matmul.matmul`, `attention.attention`).
"""
from __future__ import annotations

import itertools
import math
import re
from types import SimpleNamespace
from typing import Any, Callable

import pytest
import torch

import minitriton as mt
from minitriton.codegen import mma as mma_codegen
from minitriton.codegen import ptxas_path, wgmma as wgmma_codegen
from minitriton.frontend import compile_to_ir
from minitriton.interpreter import interpret
from minitriton.ir import Module, parse_module, print_module
from minitriton.codegen.layout_moves import identity, register_permutation
from minitriton.ir.layouts import WARP_SIZE, blocked, merge_layout, split_layout, thread_map
from minitriton.ir.mma_layouts import dot_operand_layout, mma_layout
from minitriton.ir.types import SCALAR_TYPES, PointerType, tensor
from minitriton.kernels.examples import attention, matmul
from minitriton.passes import run_passes
from minitriton.passes import dot_lowering
from minitriton.passes.dot_lowering import choose, mma_v2_warps
from ptx_helpers import clone_args, launch_on_gpu, lower, rel_err, run_interpreted, run_simulated
from ptx_sim import SimError, run_ptx
from test_ptx import assemble, nan_like

bf16, f16, f32, i32 = (SCALAR_TYPES[n] for n in ("bf16", "f16", "f32", "i32"))
P = PointerType
needs_ptxas = pytest.mark.skipif(ptxas_path() is None, reason="ptxas is not on PATH")


@pytest.fixture
def gen() -> torch.Generator:
    seed = int(torch.randint(0, 2**62, (1,)).item())
    print(f"seed = {seed}")
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------ 1. fragment maps


def cute(shape: Any, stride: Any, coord: int) -> int:
    """CuTe's layout function: `coord` split colexicographically over the (nested) shape, dotted with the strides."""
    if isinstance(shape, int):
        return coord * stride
    total = 0
    for s, d in zip(shape, stride):
        size = math.prod(_flatten(s))
        total += cute(s, d, coord % size)
        coord //= size
    return total


def _flatten(s: Any) -> list[int]:
    return [s] if isinstance(s, int) else [x for y in s for x in _flatten(y)]


def cute_tv(layout: tuple[Any, Any], thread: int, value: int, rows: int) -> tuple[int, int]:
    """(row, col) of (thread, value) in a TV layout over a column-major `rows` x cols tile."""
    (t_shape, v_shape), (t_stride, v_stride) = layout
    idx = cute(t_shape, t_stride, thread) + cute(v_shape, v_stride, value)
    return idx % rows, idx // rows


# CUTLASS include/cute/atom/mma_traits_sm80.hpp (SM80_16x8x16_F32BF16BF16F32_TN) and mma_traits_sm90_gmma.hpp
SM80_A = (((4, 8), (2, 2, 2)), ((32, 1), (16, 8, 128)))  # (M 16, K 16)
SM80_B = (((4, 8), (2, 2)), ((16, 1), (8, 64)))  # (N 8, K 16)
SM80_C = (((4, 8), (2, 2)), ((32, 1), (16, 8)))  # (M 16, N 8)
SM80_TF32_A = (((4, 8), (2, 2)), ((16, 1), (8, 64)))  # SM80_16x8x8_F32TF32TF32F32_TN: (M 16, K 8)
SM80_TF32_B = (((4, 8), 2), ((8, 1), 32))  # (N 8, K 8)


def gmma_c(n: int) -> tuple[Any, Any]:  # CLayout_64xN: (M 64, N)
    return ((4, 8, 4), (2, 2, n // 8)), ((128, 1, 16), (64, 8, 512))


def test_mma_sync_fragments_match_cutlass() -> None:
    for lane in range(32):
        for j in range(8):
            assert mma_codegen.a_fragment(lane, j) == cute_tv(SM80_A, lane, j, 16)
        for j in range(4):
            n, k = cute_tv(SM80_B, lane, j, 8)
            assert mma_codegen.b_fragment(lane, j) == (k, n)
            assert mma_codegen.c_fragment(lane, j) == cute_tv(SM80_C, lane, j, 16)


def test_mma_sync_tf32_fragments_match_cutlass() -> None:
    for lane in range(32):
        for j in range(4):
            assert mma_codegen.a_fragment(lane, j, k_width=1) == cute_tv(SM80_TF32_A, lane, j, 16)
        for j in range(2):
            n, k = cute_tv(SM80_TF32_B, lane, j, 8)
            assert mma_codegen.b_fragment(lane, j, k_width=1) == (k, n)


@pytest.mark.parametrize("n", [8, 16, 32, 64, 128, 256])
def test_wgmma_accumulator_fragment_matches_cutlass(n: int) -> None:
    for thread in range(128):
        for j in range(n // 2):
            assert wgmma_codegen.d_fragment(thread, j) == cute_tv(gmma_c(n), thread, j, 64)


def test_ldmatrix_quadrants_give_the_operand_fragments() -> None:
    """The matrix order the codegen addresses: A x4 = row halves then K halves (a0a1 .. a6a7), B = K halves of an
    n-block; non-transposed from K-contiguous rows, .trans from rows along K."""
    for lane, q, half in itertools.product(range(32), range(4), range(2)):
        r, c = mma_codegen.ldmatrix_element(lane, half, trans=False)
        assert (8 * (q & 1) + r, 8 * (q >> 1) + c) == mma_codegen.a_fragment(lane, 2 * q + half)  # A rows m
        rt, ct = mma_codegen.ldmatrix_element(lane, half, trans=True)
        assert (8 * (q & 1) + ct, 8 * (q >> 1) + rt) == mma_codegen.a_fragment(lane, 2 * q + half)  # A^T rows k
        if q < 2:  # B, one n-block: matrix q covers K rows 8q ..
            assert (8 * q + c, r) == mma_codegen.b_fragment(lane, 2 * q + half)  # B^T rows n
            assert (8 * q + rt, ct) == mma_codegen.b_fragment(lane, 2 * q + half)  # B rows k


@pytest.mark.parametrize("swizzle, constant", [(128, 0x4000004000010000), (64, 0x8000002000010000),
                                               (32, 0xC000001000010000)])
def test_wgmma_descriptor(swizzle: int, constant: int) -> None:
    """hopper_ptx.md 2.4: constant | ((addr & 0x3FFFF) >> 4) for K-major tiles (LBO field 1, SBO 8 rows)."""
    for addr in (0, 1024, 4096 + 32, 0x2F000, 0x3FFF0, 0x40000 + 2048):
        assert wgmma_codegen.make_descriptor(addr, swizzle) == constant | ((addr & 0x3FFFF) >> 4)


def test_swizzle_matches_the_measured_tma_pattern() -> None:
    """hopper_ptx.md 2.5 (measured on the H200): with 128B swizzle, 16-byte chunk j of row r holds chunk j ^ (r % 8);
    64B: chunk j (of 4) of row r at j ^ ((r // 2) % 4); 32B: chunk j (of 2) at j ^ ((r // 4) % 2)."""
    for r, j in itertools.product(range(16), range(8)):
        assert wgmma_codegen.swizzled(128 * r + 16 * j, 128) == 128 * r + 16 * (j ^ (r % 8))
        if j < 4:
            assert wgmma_codegen.swizzled(64 * r + 16 * j, 64) == 64 * r + 16 * (j ^ ((r // 2) % 4))
        if j < 2:
            assert wgmma_codegen.swizzled(32 * r + 16 * j, 32) == 32 * r + 16 * (j ^ ((r // 4) % 2))


@pytest.mark.parametrize("swizzle, k", [(128, 64), (128, 128), (64, 32), (32, 16)])
def test_staged_offsets_are_linear_and_one_to_one(swizzle: int, k: int) -> None:
    """The codegen computes a store address as f(base) ^ f(offset) (wgmma.py): f must be GF(2)-linear in the
    coordinate bits, and no two elements may share a byte."""
    num_warps = 8
    rows = 16 * num_warps * 2

    def f(row: int, kk: int) -> int:
        tile, hw_row = wgmma_codegen.a_tile_row(row, num_warps)
        return wgmma_codegen.tile_offset(tile, hw_row, kk, 64, k, swizzle)

    seen = {f(r, c) for r in range(rows) for c in range(k)}
    assert len(seen) == rows * k and max(seen) < rows * k * 2
    for r, c in itertools.product(range(rows), range(k)):
        rb = [1 << b for b in range(rows.bit_length()) if r >> b & 1]
        cb = [1 << b for b in range(k.bit_length()) if c >> b & 1]
        acc = 0
        for bit in rb:
            acc ^= f(bit, 0)
        for bit in cb:
            acc ^= f(0, bit)
        assert acc == f(r, c)


def test_wgmma_row_permutation_round_trips() -> None:
    for num_warps in (4, 8, 16):
        for rep, wg, hw_row in itertools.product(range(2), range(num_warps // 4), range(64)):
            row = wgmma_codegen.logical_row(hw_row, wg, rep, num_warps)
            assert wgmma_codegen.a_tile_row(row, num_warps) == (rep * (num_warps // 4) + wg, hw_row)


# ------------------------------------------------------------------------------------------ 2. thread maps

WARP_TILINGS = [(1, 1), (2, 2), (4, 1), (1, 4), (2, 4), (8, 1)]


def _warp_mn(tid: int, wm: int, wn: int) -> tuple[int, int]:
    warp = tid // WARP_SIZE
    return warp // wn, warp % wn


@pytest.mark.parametrize("wm, wn", WARP_TILINGS)
def test_mma_sync_registers_hold_the_fragments(wm: int, wn: int) -> None:
    m, n, k = 32 * wm, 16 * wn, 32
    acc = mma_layout(2, [wm, wn], [16, 8])
    assert thread_map(acc, (m, n)) == thread_map(blocked([1, 2], [8, 4], [wm, wn], [1, 0]), (m, n))
    a_map, b_map = thread_map(dot_operand_layout(0, acc, 2), (m, k)), thread_map(dot_operand_layout(1, acc, 2), (k, n))
    c_map = thread_map(acc, (m, n))
    for tid in range(wm * wn * WARP_SIZE):
        lane, (warp_m, warp_n) = tid % WARP_SIZE, _warp_mn(tid, wm, wn)
        for rep_m, kk in itertools.product(range(m // (16 * wm)), range(k // 16)):
            for j, reg in enumerate(mma_codegen.a_registers(a_map, wm, rep_m, kk)):
                row, col = mma_codegen.a_fragment(lane, j)
                assert a_map.element(tid, reg) == (mma_codegen.logical_row(row, warp_m, rep_m, wm), 16 * kk + col)
        for rep_n, kk in itertools.product(range(n // (8 * wn)), range(k // 16)):
            for j, reg in enumerate(mma_codegen.b_registers(b_map, wn, rep_n, kk)):
                kr, col = mma_codegen.b_fragment(lane, j)
                assert b_map.element(tid, reg) == (16 * kk + kr, mma_codegen.logical_col(col, warp_n, rep_n, wn))
        for rep_m, rep_n in itertools.product(range(m // (16 * wm)), range(n // (8 * wn))):
            for j, reg in enumerate(mma_codegen.c_registers(c_map, wm, wn, rep_m, rep_n)):
                row, col = mma_codegen.c_fragment(lane, j)
                assert c_map.element(tid, reg) == (mma_codegen.logical_row(row, warp_m, rep_m, wm),
                                                   mma_codegen.logical_col(col, warp_n, rep_n, wn))


@pytest.mark.parametrize("wm, wn", WARP_TILINGS)
def test_dot_operand_maps_cover_every_element_with_one_owner(wm: int, wn: int) -> None:
    acc = mma_layout(2, [wm, wn], [16, 8])
    for op_idx, shape in ((0, (32 * wm, 32)), (1, (32, 16 * wn))):
        tmap = thread_map(dot_operand_layout(op_idx, acc, 2), shape)
        holders: dict[tuple[int, ...], int] = {}
        owners: dict[tuple[int, ...], int] = {}
        for tid in range(tmap.num_threads):
            elements = tmap.elements(tid)
            assert len(set(elements)) == len(elements)
            for e in elements:
                holders[e] = holders.get(e, 0) + 1
                owners[e] = owners.get(e, 0) + tmap.is_owner(tid)
        assert len(holders) == shape[0] * shape[1]
        copies = wn if op_idx == 0 else wm  # the warps along the other dim hold copies
        assert set(holders.values()) == {copies} and set(owners.values()) == {1}


@pytest.mark.parametrize("wm, wn", WARP_TILINGS)
@pytest.mark.parametrize("k_width", [2, 1])
def test_fragment_blocked_holds_each_fragment_in_its_thread(wm: int, wn: int, k_width: int) -> None:
    """dot-lowering's register-operand anchor: the blocked layout it gives a reshape feeding an mma.sync operand
    puts every element in the thread whose fragment holds it (so the convert to #mt.dot_op is a register rename,
    which register_permutation finds), and exists exactly when the warps along the other dim are 1."""
    acc = mma_layout(2, [wm, wn], [16, 8])
    for op_idx, shape in ((0, (32 * wm, 32)), (1, (32, 16 * wn))):
        enc = dot_operand_layout(op_idx, acc, k_width)
        frag = dot_lowering.fragment_blocked(enc, shape)
        assert (frag is None) == ((wn if op_idx == 0 else wm) > 1)
        if frag is not None:
            perm = register_permutation(thread_map(frag, shape), thread_map(enc, shape), identity)
            assert perm is not None and sorted(perm) == list(range(len(perm)))


def test_split_layout_keeps_elements_in_their_threads() -> None:
    """tiling's forward rule for reshapes that split dims (minitriton/ir/layouts.py split_layout): the result
    layout is blocked and a register rename of the operand's (the row-major reshape moves no element between
    threads), or None where no blocked layout is one."""
    cases = [
        (blocked([1, 1, 1, 16], [1, 8, 4, 1], [1, 1, 1, 1], [3, 2, 1, 0]), (2, 16, 4, 16), (2, 16, 4, 8, 2)),
        (blocked([1, 1, 1, 8], [2, 2, 4, 2], [1, 1, 1, 1], [3, 2, 1, 0]), (8, 2, 4, 16), (8, 2, 4, 8, 2)),
        (blocked([4, 1], [8, 4], [2, 2], [0, 1]), (64, 16), (2, 32, 16)),
        (blocked([1, 4], [4, 8], [4, 1], [1, 0]), (16, 128), (16, 4, 32)),
    ]
    for enc, src, dst in cases:
        out = split_layout(enc, src, dst)
        assert out is not None and out.kind == "blocked"

        def index(c: tuple[int, ...], src: tuple[int, ...] = src, dst: tuple[int, ...] = dst) -> tuple[int, ...]:
            lin = sum(x * math.prod(dst[i + 1:]) for i, x in enumerate(c))
            return tuple((lin // math.prod(src[i + 1:])) % s for i, s in enumerate(src))

        assert register_permutation(thread_map(enc, src), thread_map(out, dst), index) is not None
    assert split_layout(blocked([1, 2], [8, 4], [1, 1], [1, 0]), (16, 16), (256,)) is None  # a merge
    assert split_layout(blocked([1, 2], [8, 4], [1, 1], [1, 0]), (16, 16), (8, 2, 16)) is not None
    assert split_layout(blocked([1, 2], [8, 4], [1, 1], [1, 0]), (16, 16), (4, 8, 8)) is None  # 16 -> 4 x 8 + ?


def test_merge_layout_keeps_elements_in_their_threads() -> None:
    """tiling's forward rule for reshapes that merge dims (merge_layout): FlashKDA's wg phase 1 views [64, K] as
    [4, 16, K] (a warp per sub-chunk) and back; the merged layout is the split's source, and a merge whose outer
    dim lives below its inner dim's lanes or warps (not a blocked layout) is refused."""
    for enc2, shape3 in [(blocked([8, 8], [2, 16], [4, 1], [1, 0]), (4, 16, 128)),
                         (blocked([2, 8], [8, 4], [4, 1], [1, 0]), (4, 16, 32)),
                         (blocked([1, 4], [4, 8], [4, 1], [1, 0]), (16, 4, 32))]:
        shape2 = (shape3[0] * shape3[1], shape3[2])
        enc3 = split_layout(enc2, shape2, shape3)
        assert enc3 is not None
        merged = merge_layout(enc3, shape3, shape2)
        assert merged is not None and thread_map(merged, shape2).num_regs == thread_map(enc2, shape2).num_regs

        def index(c: tuple[int, ...], shape3: tuple[int, ...] = shape3) -> tuple[int, ...]:
            return (c[0] // shape3[1], c[0] % shape3[1], c[1])

        assert register_permutation(thread_map(enc3, shape3), thread_map(merged, shape2), index) is not None
    # the outer dim's registers above the inner dim's warps: the merged index is not blocked
    assert merge_layout(blocked([2, 1, 4], [2, 4, 4], [1, 4, 1], [2, 1, 0]), (4, 16, 16), (64, 16)) is None
    assert merge_layout(blocked([1, 2], [8, 4], [1, 1], [1, 0]), (16, 16), (8, 2, 16)) is None  # a split


@pytest.mark.parametrize("num_warps, n_instr, n", [(4, 64, 64), (8, 32, 64), (4, 256, 512)])
def test_wgmma_registers_hold_the_fragments(num_warps: int, n_instr: int, n: int) -> None:
    m = 32 * num_warps
    acc = mma_layout(3, [num_warps, 1], [16, n_instr, 16])
    tmap = thread_map(acc, (m, n))
    for rep, nb in itertools.product(range(m // (16 * num_warps)), range(n // n_instr)):
        regs = wgmma_codegen.d_registers(tmap, num_warps, n_instr, rep, nb)
        for tid in range(num_warps * WARP_SIZE):
            wg = tid // 128
            for j, reg in enumerate(regs):
                row, col = wgmma_codegen.d_fragment(tid % 128, j)
                assert tmap.element(tid, reg) == (wgmma_codegen.logical_row(row, wg, rep, num_warps),
                                                  nb * n_instr + col)


# ---------------------------------------------------------------------------------------------- 3. choice


def _dot(m: int, n: int, k: int, t: Any, precision: str) -> Any:
    """Just enough of an mt.dot for `choose`: its operands' types and its attributes."""
    return SimpleNamespace(operands=[SimpleNamespace(type=tensor([m, k], t)), SimpleNamespace(type=tensor([k, n], t))],
                           attrs={"input_precision": precision})


@pytest.mark.parametrize("m, n, k, t, warps, prefer, want", [
    (64, 64, 32, bf16, 4, "auto", ("wgmma", [4, 1])),
    (64, 64, 32, bf16, 4, "mma", ("mma", [4, 1])),
    (64, 64, 32, bf16, 4, "fma", None),
    (64, 64, 32, f32, 4, "auto", None),  # f32 stays exact on CUDA cores
    (64, 64, 8, f32, 4, "tf32", ("mma", [4, 1])),  # ... unless tf32 is asked for: mma.sync m16n8k8
    (64, 64, 32, f32, 4, "wgmma tf32", None),  # wgmma on tf32 is not implemented
    (128, 128, 64, f16, 8, "auto", ("wgmma", [8, 1])),
    (64, 128, 64, bf16, 8, "auto", ("mma", [4, 2])),  # 64 rows cannot feed 2 warpgroups
    (32, 32, 32, bf16, 4, "auto", ("mma", [2, 2])),
    (32, 16, 32, bf16, 4, "wgmma", None),
    (16, 16, 16, bf16, 4, "auto", None),  # 4 warps need 16 rows or 8 columns each
    (16, 64, 16, bf16, 2, "auto", ("mma", [1, 2])),
    (64, 64, 8, bf16, 4, "auto", None),  # K < 16
    (256, 256, 64, bf16, 4, "auto", ("mma", [4, 1])),  # wgmma's operands would exceed 48 KB together
])
def test_choice(m: int, n: int, k: int, t: Any, warps: int, prefer: str, want: Any) -> None:
    precision = "tf32" if prefer.endswith("tf32") else "ieee"
    prefer = {"tf32": "auto", "wgmma tf32": "wgmma"}.get(prefer, prefer)
    choice = choose(_dot(m, n, k, t, precision), warps, prefer)
    got = None if choice is None else (choice.instruction, list(choice.accumulator.get("warpsPerCTA")))
    assert got == want
    if want is not None and want[0] == "mma":
        k_width = 1 if precision == "tf32" else 2
        assert mma_v2_warps(m, n, k, warps, k_width) == want[1]
        assert choice is not None and choice.a.get("kWidth") == choice.b.get("kWidth") == k_width


# ----------------------------------------------------------------------------------------------- kernels

MM = "a_ptr,b_ptr,c_ptr,bias_ptr,M,N,K,stride_am,stride_ak,stride_bk,stride_bn,stride_cm,stride_cn".split(",")
Maker = Callable[[], Module]


def with_choice(make: Maker, instruction: str) -> Maker:
    def wrapped() -> Module:
        module = make()
        module.functions[0].attrs["dot_instruction"] = instruction
        return module

    return wrapped


def matmul_maker(block: tuple[int, int, int] = (64, 64, 32), activation: str = "none", num_warps: int = 4,
                 instruction: str = "auto", aligned: bool = True) -> Maker:
    """The example matmul as the runtime specializes it for contiguous tensors: unit strides known to be 1, the
    pointers multiples of 16, and (aligned) M, N, K and the other strides too (then the loads and stores vectorize:
    their masks are constant over 16 elements)."""
    bm, bn, bk = block
    sixteen = {"M", "N", "K", "stride_am", "stride_bk", "stride_cm"} if aligned else set()

    def make() -> Module:
        types = {a: P(bf16) if a.endswith("ptr") else i32 for a in MM}
        module = compile_to_ir(matmul.matmul_kernel, types,
                               {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "HAS_BIAS": activation != "none",
                                "ACTIVATION": activation},
                               divisibility={a: 16 for a in MM if a.endswith("ptr") or a in sixteen},
                               equal_to_one={"stride_ak", "stride_bn", "stride_cn"}, num_warps=num_warps)
        return run_passes(module, ["canonicalize"])

    return with_choice(make, instruction)


def matmul_args(g: torch.Generator, m: int, n: int, k: int) -> list[Any]:
    a, b = torch.randn(m, k, generator=g).bfloat16(), torch.randn(k, n, generator=g).bfloat16()
    return [a, b, nan_like((m, n), torch.bfloat16), torch.randn(n, generator=g).bfloat16(), m, n, k, k, 1, n, 1, n, 1]


def attention_maker(head_dim: int = 64, block_m: int = 64, block_n: int = 32, num_warps: int = 4,
                    instruction: str = "auto") -> Maker:
    def make() -> Module:
        types = {"q_ptr": P(bf16), "k_ptr": P(bf16), "v_ptr": P(bf16), "o_ptr": P(bf16), "seq_len": i32,
                 "sm_scale": f32}
        module = compile_to_ir(attention.attention_kernel, types,
                               {"HEAD_DIM": head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n},
                               divisibility={"q_ptr": 16, "k_ptr": 16, "v_ptr": 16, "o_ptr": 16}, num_warps=num_warps)
        return run_passes(module, ["canonicalize"])

    return with_choice(make, instruction)


def attention_args(g: torch.Generator, heads: int, t: int, d: int) -> list[Any]:
    q, k, v = (torch.randn(heads, t, d, generator=g).bfloat16() for _ in range(3))
    return [q, k, v, nan_like((heads, t, d), torch.bfloat16), t, d ** -0.5]


@mt.kernel
def dot_kernel(a_ptr, b_ptr, c_ptr, M: mt.constexpr, N: mt.constexpr, K: mt.constexpr, A_T: mt.constexpr,
               B_T: mt.constexpr, PRECISION: mt.constexpr):
    """c = a @ b for one block; A_T / B_T: a / b stored transposed (contiguous along M / along K)."""
    m = mt.arange(0, M)
    n = mt.arange(0, N)
    k = mt.arange(0, K)
    if A_T:
        a = mt.load(a_ptr + m[:, None] + k[None, :] * M)
    else:
        a = mt.load(a_ptr + m[:, None] * K + k[None, :])
    if B_T:
        b = mt.load(b_ptr + k[:, None] + n[None, :] * K)
    else:
        b = mt.load(b_ptr + k[:, None] * N + n[None, :])
    mt.store(c_ptr + m[:, None] * N + n[None, :], mt.dot(a, b, input_precision=PRECISION))


def dot_maker(m: int, n: int, k: int, t: Any = bf16, a_t: bool = False, b_t: bool = False, num_warps: int = 4,
              instruction: str = "auto") -> Maker:
    def make() -> Module:
        module = compile_to_ir(dot_kernel, {"a_ptr": P(t), "b_ptr": P(t), "c_ptr": P(f32)},
                               {"M": m, "N": n, "K": k, "A_T": a_t, "B_T": b_t,
                                "PRECISION": "tf32" if t == f32 else "ieee"},
                               divisibility={"a_ptr": 16, "b_ptr": 16, "c_ptr": 16}, num_warps=num_warps)
        return run_passes(module, ["canonicalize"])

    return with_choice(make, instruction)


def dot_args(g: torch.Generator, m: int, n: int, k: int, t: torch.dtype, a_t: bool, b_t: bool) -> list[Any]:
    a, b = torch.randn(m, k, generator=g).to(t), torch.randn(k, n, generator=g).to(t)
    return [a.t().contiguous() if a_t else a, b.t().contiguous() if b_t else b, nan_like((m, n), torch.float32)]


@pytest.mark.parametrize("instruction", ["auto", "mma"])
def test_lowered_ir_prints_parses_and_interprets(instruction: str, gen: torch.Generator) -> None:
    """The tensor-core IR round-trips through text, still runs in the interpreter (local_alloc and convert_layout
    are identities there) with the untiled kernel's exact results, and is refused a second dot-lowering."""
    make = attention_maker(instruction=instruction)
    module = run_passes(make(), ["tiling", "dot-lowering"])
    text = print_module(module)
    assert print_module(parse_module(text)) == text
    assert ("mt.local_alloc" in text) == (instruction == "auto") and "#mt.mma" in text
    args = attention_args(gen, 1, 70, 64)
    want = run_interpreted(make, (2, 1), args)
    got = clone_args(args)
    interpret(module.functions[0], (2, 1), got)
    assert torch.equal(got[3], want[3])
    with pytest.raises(ValueError, match="already went through dot-lowering"):
        run_passes(module, ["dot-lowering"])


# -------------------------------------------------------------------------------------------------- 4. PTX

MMA_SYNC = r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32 \{%f\d+, %f\d+, %f\d+, %f\d+\}"
LDMATRIX = r"ldmatrix\.sync\.aligned\.m8n8\.x4(\.trans)?\.shared\.b16 \{%r\d+, %r\d+, %r\d+, %r\d+\}, \[%r\d+\+\d+\]"
WGMMA_IN_PLACE = [r"\.shared \.align 1024 \.b8 mt_ring0", r"cp\.async\.wait_group \d+;\n  fence\.proxy\.async\.shared::cta;",
                  r"wgmma\.fence\.sync\.aligned", r"wgmma\.commit_group\.sync\.aligned",
                  r"wgmma\.wait_group\.sync\.aligned 1;\n  bar\.sync 0;", r"wgmma\.wait_group\.sync\.aligned 0"]


@needs_ptxas
@pytest.mark.parametrize("activation", ["none", "gelu"])
@pytest.mark.parametrize("instruction", ["auto", "mma"])
def test_example_matmul_assembles(activation: str, instruction: str) -> None:
    ptx, _, _ = lower(matmul_maker(activation=activation, instruction=instruction))
    assemble(ptx)
    if instruction == "mma":
        assert len(re.findall(MMA_SYNC, ptx)) == 8 * 2  # per warp (warps [4, 1]): 1 x 8 blocks of 16 x 8, 2 K steps
        assert re.search(LDMATRIX, ptx) and re.search(LDMATRIX.replace(r"(\.trans)?", r"\.trans"), ptx)
        assert "wgmma" not in ptx and "ld.shared.f32" not in ptx  # no CUDA-core dot
    else:  # the K loop is pipelined: the wgmma reads the ring slots in place (B N-major: imm-trans-b 1), async
        assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16 \{(%f\d+, ){31}%f\d+\}, "
                              r"%rd\d+, %rd\d+, 1, 1, 1, 0, 1;", ptx)) == 2  # K = 32: two K steps
        assert all(re.search(p, ptx) for p in WGMMA_IN_PLACE) and "mma.sync" not in ptx


@needs_ptxas
@pytest.mark.parametrize("instruction", ["auto", "mma"])
def test_example_attention_assembles(instruction: str) -> None:
    ptx, _, _ = lower(attention_maker(instruction=instruction))
    assemble(ptx)
    if instruction == "mma":
        # S = Q K^T: 4 warps x (1 m-block x 4 n-blocks x 4 K steps); O += P V: 8 n-blocks x 2 K steps
        assert len(re.findall(MMA_SYNC, ptx)) == 16 + 16
        # Q once (4 K steps), K^T and V per iteration (2 x 4 and 4 x 2); P reaches its dot by register renaming
        assert ptx.count("ldmatrix") == 4 + 8 + 8
    else:
        assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n32k16", ptx)) == 4
        assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16", ptx)) == 2


@needs_ptxas
def test_two_warpgroups_assemble() -> None:
    ptx, _, threads = lower(matmul_maker((128, 128, 64), num_warps=8))
    assert threads == 256
    report = assemble(ptx)
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16", ptx)) == 4
    assert report is None or report.smem <= 48 * 1024


# ------------------------------------------------------------------------------------------- 5. simulated


def _compare(make: Maker, grid: tuple[int, ...], args: list[Any], outputs: list[int], bound: float) -> str:
    ptx, _, _ = lower(make)
    want = run_interpreted(make, grid, args)
    got = run_simulated(make, grid, args, ptx)
    for i in outputs:
        err = rel_err(got[i], want[i])
        assert err <= bound, f"output {i}: relative error {err}"
    return ptx


@pytest.mark.parametrize("instruction", ["mma", "wgmma"])
@pytest.mark.parametrize("mnk", [(64, 64, 64), (100, 70, 90)])
def test_simulated_matmul_matches_the_interpreter(instruction: str, mnk: tuple[int, int, int],
                                                  gen: torch.Generator) -> None:
    m, n, k = mnk
    aligned = m % 16 == n % 16 == k % 16 == 0
    ptx = _compare(matmul_maker(instruction=instruction, aligned=aligned), (math.ceil(m / 64), math.ceil(n / 64)),
                   matmul_args(gen, m, n, k), [2], 8e-3)
    assert ("wgmma.mma_async" in ptx) == (instruction == "wgmma") and ("mma.sync" in ptx) == (instruction == "mma")


@pytest.mark.parametrize("instruction", ["mma", "wgmma"])
def test_simulated_matmul_epilogue_matches_the_interpreter(instruction: str, gen: torch.Generator) -> None:
    _compare(matmul_maker(activation="gelu", instruction=instruction), (2, 1), matmul_args(gen, 96, 64, 48), [2],
             8e-3)


@pytest.mark.parametrize("instruction", ["mma", "wgmma"])
def test_simulated_attention_matches_the_interpreter(instruction: str, gen: torch.Generator) -> None:
    _compare(attention_maker(instruction=instruction), (2, 1), attention_args(gen, 1, 100, 64), [3], 8e-3)


@pytest.mark.parametrize("m, n, k, t, a_t, b_t, warps, instruction, expect", [
    (32, 32, 32, bf16, False, False, 4, "auto", "mma.sync"),  # [2, 2] warps, B with ldmatrix.trans
    (32, 16, 32, bf16, True, True, 4, "auto", "mma.sync"),  # A^T (.trans), B^T, one n-block per warp (x2)
    (16, 64, 32, f16, False, True, 2, "auto", "mma.sync.aligned.m16n8k16.row.col.f32.f16"),
    (64, 32, 64, bf16, True, True, 4, "wgmma", "wgmma.mma_async"),  # operands stored against K: 2-byte stores
    (128, 32, 32, f16, False, False, 8, "wgmma", "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16"),
    (64, 32, 128, bf16, False, False, 4, "wgmma", "wgmma.mma_async"),  # K = 128: two 128B-swizzle chunks
    (32, 32, 32, bf16, False, False, 4, "fma", "fma.rn.f32"),  # the CUDA-core fallback, forced
    (16, 16, 16, bf16, False, False, 4, "auto", "fma.rn.f32"),  # ... and where the shape needs it
    (32, 32, 16, f32, False, False, 4, "auto", "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),  # tf32
    (64, 16, 32, f32, True, True, 2, "auto", "cvt.rn.tf32.f32"),  # tf32 operands stored against K
])
def test_simulated_dots_match_the_interpreter(m: int, n: int, k: int, t: Any, a_t: bool, b_t: bool, warps: int,
                                              instruction: str, expect: str, gen: torch.Generator) -> None:
    torch_t = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[t.name]
    ptx = _compare(dot_maker(m, n, k, t, a_t, b_t, warps, instruction), (1,),
                   dot_args(gen, m, n, k, torch_t, a_t, b_t), [2], 1e-5)
    assert expect in ptx
    assemble(ptx)


@pytest.mark.parametrize("m, n, k, warps", [(64, 16, 64, 4), (64, 32, 32, 4), (64, 64, 128, 4), (128, 128, 64, 8)])
def test_wgmma_stages_a_row_major_b_mn_major(m: int, n: int, k: int, warps: int, gen: torch.Generator) -> None:
    """A B loaded row-major (registers along N) is staged MN-major in 4- to 16-byte vectors and read with
    imm-trans-b = 1 (32-, 64- and 128-byte swizzles by n-block width), not stored K-major 2 bytes at a time; the
    simulator reads it through the MN-major descriptor and gets the interpreter's product. B^T (registers along K)
    stays K-major (trans-b 0)."""
    ptx = _compare(dot_maker(m, n, k, bf16, False, False, warps, "wgmma"), (1,),
                   dot_args(gen, m, n, k, torch.bfloat16, False, False), [2], 1e-5)
    wgmmas = re.findall(r"wgmma\.mma_async[^;]*, 1, 1, 1, 0, (\d);", ptx)
    assert wgmmas and set(wgmmas) == {"1"}
    assert "st.shared.b16" not in ptx
    transposed = lower(dot_maker(m, n, k, bf16, False, True, warps, "wgmma"))[0]
    assert set(re.findall(r"wgmma\.mma_async[^;]*, 1, 1, 1, 0, (\d);", transposed)) == {"0"}


def _matmul_ptx(instruction: str) -> tuple[str, str, list[Any]]:
    ptx, name, _ = lower(matmul_maker(instruction=instruction))
    return ptx, name, matmul_args(torch.Generator().manual_seed(1), 64, 64, 32)


@pytest.mark.parametrize("edit, message", [
    (lambda p: p.replace("fence.proxy.async.shared::cta;", ""), "fence.proxy.async"),
    (lambda p: p.replace("wgmma.wait_group.sync.aligned 0;", ""), "before wgmma.wait_group"),
    (lambda p: p.replace("wgmma.fence.sync.aligned;", "", 1), "since the warpgroup's last wgmma.fence"),
    (lambda p: re.sub(r"(wgmma\.mma_async[^;]*), 1, 1, 1, 0, (\d);", r"\1, 1, 1, 1, 1, \2;", p, count=1), "K-major"),
])
def test_the_simulator_catches_broken_wgmma_code(edit: Callable[[str], str], message: str) -> None:
    ptx, name, args = _matmul_ptx("wgmma")
    broken = edit(ptx)
    assert broken != ptx
    with pytest.raises(SimError, match=message):
        run_ptx(broken, name, (1, 1), clone_args(args), 128)


def test_the_simulator_catches_a_wrong_ldmatrix_address() -> None:
    """Point every A ldmatrix one row down: the simulator reads real addresses, so the results change, or (the B
    operand is staged right after A, in the other scratch region, with no barrier between) the shifted read lands
    in bytes B's staging then overwrites, which the race checker flags."""
    make = dot_maker(32, 32, 32)
    ptx, name, _ = lower(make)
    pitch = 2 * (32 + 8)
    broken = re.sub(r"(ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16 \{[^}]*\}, \[%r\d+)\+(\d+)\]",
                    lambda mt_: f"{mt_.group(1)}+{int(mt_.group(2)) + pitch}]", ptx, count=2)
    assert broken != ptx
    args = dot_args(torch.Generator().manual_seed(2), 32, 32, 32, torch.bfloat16, False, False)
    want = run_interpreted(make, (1,), args)
    got = clone_args(args)
    try:
        run_ptx(broken, name, (1,), got, 128)
    except SimError as e:
        assert "race" in str(e)
        return
    assert rel_err(got[2], want[2]) > 0.1


# ------------------------------------------------------------------------------------------------ 6. GPU


def _cuda() -> bool:
    return torch.cuda.is_available()


@pytest.mark.parametrize("instruction", ["mma", "wgmma", "fma"])
@pytest.mark.parametrize("mnk", [(64, 64, 64), (100, 70, 90), (512, 384, 640)])
@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
def test_gpu_matmul(instruction: str, mnk: tuple[int, int, int], gen: torch.Generator) -> None:
    """Against the interpreter (same bf16 inputs; bf16 output within 8e-3) and torch in float64 (within 1e-2)."""
    m, n, k = mnk
    make = matmul_maker(instruction=instruction, aligned=m % 16 == n % 16 == k % 16 == 0)
    ptx, name, threads = lower(make)
    args = matmul_args(gen, m, n, k)
    grid = (math.ceil(m / 64), math.ceil(n / 64))
    got = launch_on_gpu(ptx, name, grid, args, threads)
    want = run_interpreted(make, grid, args)
    assert rel_err(got[2], want[2]) <= 8e-3
    reference = (args[0].double() @ args[1].double())
    assert rel_err(got[2], reference) <= 1e-2


@pytest.mark.parametrize("instruction", ["mma", "wgmma"])
@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
def test_gpu_matmul_epilogue(instruction: str, gen: torch.Generator) -> None:
    make = matmul_maker(activation="gelu", instruction=instruction, aligned=False)
    ptx, name, threads = lower(make)
    args = matmul_args(gen, 200, 130, 96)
    got = launch_on_gpu(ptx, name, (4, 3), args, threads)
    want = run_interpreted(make, (4, 3), args)
    assert rel_err(got[2], want[2]) <= 8e-3


@pytest.mark.parametrize("instruction", ["mma", "wgmma"])
@pytest.mark.parametrize("t", [100, 256])
@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
def test_gpu_attention(instruction: str, t: int, gen: torch.Generator) -> None:
    make = attention_maker(instruction=instruction)
    ptx, name, threads = lower(make)
    args = attention_args(gen, 2, t, 64)
    grid = (math.ceil(t / 64), 2)
    got = launch_on_gpu(ptx, name, grid, args, threads)
    want = run_interpreted(make, grid, args)
    assert rel_err(got[3], want[3]) <= 8e-3
    assert rel_err(got[3], attention.reference(args[0], args[1], args[2]).float()) <= 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
def test_gpu_examples_through_the_runtime(gen: torch.Generator) -> None:
    """The default pipeline (wgmma for these blocks) through @mt.kernel's launcher."""
    for m, n, k in [(64, 64, 64), (100, 70, 90), (512, 384, 640)]:
        a = torch.randn(m, k, generator=gen).bfloat16().cuda()
        b = torch.randn(k, n, generator=gen).bfloat16().cuda()
        got = matmul.matmul(a, b)
        assert rel_err(got.cpu(), matmul.reference(a, b).cpu()) <= 1e-2
    q, k_, v = (torch.randn(3, 200, 64, generator=gen).bfloat16().cuda() for _ in range(3))
    assert rel_err(attention.attention(q, k_, v).cpu(), attention.reference(q, k_, v).cpu()) <= 1e-2
