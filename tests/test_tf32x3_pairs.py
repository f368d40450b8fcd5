"""tf32x3 dots and the kPairs operand order (passes/dot_lowering.py `with_k_pairs`, codegen/mma.py).

A recurrent state S [M, K] held in the mma accumulator's blocked layout feeds `P = S @ B` as the A operand by
register renaming (kPairs: no shared memory for S), and `S' = S + P @ C` takes the product P, an accumulator,
as its A operand the same way. With input_precision "tf32x3" the products keep fp32-level accuracy. The PTX is
replayed on tests/ptx_sim.py against the interpreter (which emulates the hi / lo split) and against float64; the
last test shows that the float64 bound is tight enough to catch plain tf32.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import minitriton as mt
from minitriton.ir.types import SCALAR_TYPES, PointerType
from minitriton.passes import run_passes
from minitriton.compiler import PIPELINE
from ptx_helpers import dsl, lower, rel_err, run_interpreted, run_simulated

f32 = SCALAR_TYPES["f32"]
SIM_BOUND = 2e-6  # the simulator against the interpreter: f32 accumulation order of the same split products
X3_BOUND = 1e-5  # tf32x3 against float64 (plain tf32 is ~1e-3 off; see the last test)


@mt.kernel
def state_products(s_ptr, b_ptr, c_ptr, p_ptr, out_ptr, M: mt.constexpr, N: mt.constexpr, K: mt.constexpr,
                   WM: mt.constexpr, PRECISION: mt.constexpr):
    """P = S B and S' = S + P C, with S loaded in the accumulator's layout of an mma.sync on warps [WM, 1]."""
    rm, rn, rk = mt.arange(0, M), mt.arange(0, N), mt.arange(0, K)
    acc_layout = mt.blocked([1, 2], [8, 4], [WM, 1], [1, 0])
    s = mt.load(s_ptr + rm[:, None] * K + rk[None, :], layout=acc_layout)
    b = mt.load(b_ptr + rk[:, None] * N + rn[None, :])
    c = mt.load(c_ptr + rn[:, None] * K + rk[None, :])
    p = mt.dot(s, b, input_precision=PRECISION)
    mt.store(p_ptr + rm[:, None] * N + rn[None, :], p)
    mt.store(out_ptr + rm[:, None] * K + rk[None, :], mt.dot(p, c, s, input_precision=PRECISION),
             layout=acc_layout)


def maker(m: int, n: int, k: int, warps: int, precision: str = "tf32x3"):  # type: ignore[no-untyped-def]
    names = ("s_ptr", "b_ptr", "c_ptr", "p_ptr", "out_ptr")
    return dsl(state_products, {p: PointerType(f32) for p in names},
               dict(M=m, N=n, K=k, WM=warps, PRECISION=precision), {p: 16 for p in names}, num_warps=warps)


@pytest.fixture
def gen() -> torch.Generator:
    seed = int(np.random.SeedSequence().entropy % (2**63))
    print(f"seed = {seed}")
    return torch.Generator().manual_seed(seed)


def args(gen: torch.Generator, m: int, n: int, k: int) -> list[torch.Tensor]:
    return [torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen), torch.randn(n, k, generator=gen),
            torch.full((m, n), float("nan")), torch.full((m, k), float("nan"))]


def reference(x: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    s, b, c = (t.double() for t in x[:3])
    p = s @ b
    return p, s + p @ c


def lowered_ir(make) -> str:  # type: ignore[no-untyped-def]
    passes = PIPELINE[PIPELINE.index("tiling"):PIPELINE.index("dot-lowering") + 1]
    return str(run_passes(make(), passes))


SHAPES = [(64, 16, 32, 4), (128, 8, 64, 8), (32, 16, 16, 2)]


@pytest.mark.parametrize("m, n, k, warps", SHAPES)
def test_both_dots_take_k_pairs_operands(m: int, n: int, k: int, warps: int) -> None:
    ir = lowered_ir(maker(m, n, k, warps))
    assert ir.count("kPairs = 1") >= 4, ir  # the A and B layouts of both dots
    ptx, _, _ = lower(maker(m, n, k, warps))
    # S and P are A operands by renaming: only B and C are staged (8-byte pair loads, no ldmatrix)
    assert "ldmatrix" not in ptx
    mmas = ptx.count("mma.sync.aligned.m16n8k8")
    per_warp = (m // (16 * warps)) * ((n // 8) * (k // 8) + (k // 8) * (n // 8))
    assert mmas == 3 * per_warp, (mmas, per_warp)


@pytest.mark.parametrize("m, n, k, warps", SHAPES)
def test_tf32x3_replay_matches_interpreter_and_float64(m: int, n: int, k: int, warps: int,
                                                       gen: torch.Generator) -> None:
    make = maker(m, n, k, warps)
    x = args(gen, m, n, k)
    want = run_interpreted(make, (1, 1, 1), x)
    got = run_simulated(make, (1, 1, 1), x)
    p64, s64 = reference(x)
    for i, ref in ((3, p64), (4, s64)):
        assert rel_err(got[i], want[i]) <= SIM_BOUND
        assert rel_err(got[i].double(), ref) <= X3_BOUND
        assert rel_err(want[i].double(), ref) <= X3_BOUND


def test_plain_tf32_misses_the_float64_bound(gen: torch.Generator) -> None:
    """The same kernel with input_precision "tf32" (kPairs too) is about 1e-3 off: the bound above can fail."""
    make = maker(64, 16, 32, 4, precision="tf32")
    assert lowered_ir(make).count("kPairs = 1") >= 4
    x = args(gen, 64, 16, 32)
    got = run_simulated(make, (1, 1, 1), x)
    p64, _ = reference(x)
    assert rel_err(got[3].double(), p64) > 10 * X3_BOUND
    assert rel_err(got[3], run_interpreted(make, (1, 1, 1), x)[3]) <= SIM_BOUND


def test_a_renamed_from_an_accumulator_is_not_staged_and_wn_above_one_still_tiles() -> None:
    """mma_v2_warps: a [128, 128] f32 A that is renamed (a_staged=False) does not count against the shared-memory
    budget; when the warps need WN > 1 (no renaming then) A is charged again and the dot still goes on tensor
    cores when it fits (FlashKDA's chained tf32 dots, which a first version of this rule sent to CUDA cores)."""
    from minitriton.passes.dot_lowering import mma_v2_warps

    assert mma_v2_warps(128, 8, 128, 8, 1) is None  # staged: 132 x 128 x 4 bytes > 48 KB
    assert mma_v2_warps(128, 8, 128, 8, 1, a_staged=False) == [8, 1]
    assert mma_v2_warps(32, 64, 64, 8, 1, a_staged=False) == mma_v2_warps(32, 64, 64, 8, 1) == [2, 4]


@mt.kernel
def transposed_state_product(st_ptr, x_ptr, out_ptr, V: mt.constexpr, K: mt.constexpr, M: mt.constexpr,
                             W: mt.constexpr):
    """out = x S with the state held transposed, S^T [V, K], in the accumulator layout of warps [W, 1]."""
    rv, rk, rm = mt.arange(0, V), mt.arange(0, K), mt.arange(0, M)
    st = mt.load(st_ptr + rv[:, None] * K + rk[None, :], layout=mt.blocked([1, 2], [8, 4], [W, 1], [1, 0]))
    x = mt.load(x_ptr + rm[:, None] * K + rk[None, :])
    mt.store(out_ptr + rm[:, None] * V + rv[None, :], mt.dot(x, mt.trans(st), input_precision="tf32x3"))


def test_a_transposed_state_is_the_b_operand_in_place(gen: torch.Generator) -> None:
    """x [16, K] @ S with S^T [V, K] held as an accumulator: the dot runs on warps [1, W] and takes S^T's registers
    as its B operand (kPairs; no shared-memory staging of S); the replay matches the interpreter and float64."""
    v, k, m, w = 64, 32, 16, 4
    names = ("st_ptr", "x_ptr", "out_ptr")
    make = dsl(transposed_state_product, {p: PointerType(f32) for p in names}, dict(V=v, K=k, M=m, W=w),
               {p: 16 for p in names}, num_warps=w)
    assert lowered_ir(make).count("kPairs = 1") >= 2
    ptx, _, _ = lower(make)
    # x's 4 elements a thread (one vector store) and the result's exchange; S^T staged would add 4 vector stores,
    # and the plain order an ldmatrix
    assert "ldmatrix" not in ptx and ptx.count("st.shared") <= 6, ptx.count("st.shared")
    x = [torch.randn(v, k, generator=gen), torch.randn(m, k, generator=gen), torch.full((m, v), float("nan"))]
    want = run_interpreted(make, (1, 1, 1), x)
    got = run_simulated(make, (1, 1, 1), x)
    ref = x[1].double() @ x[0].double().T
    assert rel_err(got[2], want[2]) <= SIM_BOUND
    assert rel_err(got[2].double(), ref) <= X3_BOUND
