"""tf32 dot operands are rounded once per element when staged, not once per fragment load (codegen/mma.py).

An f32 operand that reaches mma.sync through shared memory is rounded with `cvt.rna.tf32.f32` by the thread that
owns the element, before `st.shared`; the warps that load it (every warp, for A of a [16, K] dot on warps [1, 8])
pass the loaded words to the mma as they are. The tests count the conversions in the PTX, replay it on
tests/ptx_sim.py against the interpreter (which rounds every tf32 operand), and show that the replay can fail:
without the rounding the products differ by far more than the bound.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import minitriton as mt
from minitriton.ir.types import SCALAR_TYPES, PointerType
from ptx_helpers import dsl, lower, rel_err, run_interpreted, run_simulated

f32 = SCALAR_TYPES["f32"]
BOUND = 1e-5  # f32 accumulation order (mma vs the interpreter's float64 sums); unrounded inputs are ~1e-4 off


@mt.kernel
def two_dots(a_ptr, b_ptr, c_ptr, d_ptr, M: mt.constexpr, N: mt.constexpr, K: mt.constexpr):
    """c = a b and d = a (2 b + 1), both tf32: A is staged once and feeds both dots."""
    rm, rn, rk = mt.arange(0, M), mt.arange(0, N), mt.arange(0, K)
    a = mt.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = mt.load(b_ptr + rk[:, None] * N + rn[None, :])
    mt.store(c_ptr + rm[:, None] * N + rn[None, :], mt.dot(a, b, input_precision="tf32"))
    mt.store(d_ptr + rm[:, None] * N + rn[None, :], mt.dot(a, b * 2.0 + 1.0, input_precision="tf32"))


@pytest.fixture
def gen() -> torch.Generator:
    seed = int(np.random.SeedSequence().entropy % (2**63))
    print(f"seed = {seed}")
    return torch.Generator().manual_seed(seed)


def maker(m: int, n: int, k: int, warps: int):  # type: ignore[no-untyped-def]
    names = ("a_ptr", "b_ptr", "c_ptr", "d_ptr")
    return dsl(two_dots, {p: PointerType(f32) for p in names}, dict(M=m, N=n, K=k), {p: 16 for p in names},
               num_warps=warps)


def args(gen: torch.Generator, m: int, n: int, k: int) -> list[torch.Tensor]:
    # full 24-bit mantissas: rounding to tf32 changes nearly every input
    a, b = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
    return [a, b, torch.full((m, n), float("nan")), torch.full((m, n), float("nan"))]


@pytest.mark.parametrize("m, n, k, warps", [(16, 64, 32, 8), (64, 64, 32, 8), (32, 32, 16, 4)])
def test_operands_are_rounded_once_per_element(m: int, n: int, k: int, warps: int, gen: torch.Generator) -> None:
    make = maker(m, n, k, warps)
    ptx, _, threads = lower(make)
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in ptx
    cvts = ptx.count("cvt.rna.tf32.f32")
    # a, b and 2b + 1 staged once each: one conversion per element and thread at most (the loads' layouts may
    # replicate a small tile); per fragment it would be the mma count times 6 (4 A + 2 B words per m16n8k8)
    staged = (m * k + 2 * k * n) // threads
    assert cvts <= max(staged, 3 * 4), (cvts, staged)
    assert cvts < 6 * ptx.count("mma.sync")
    x = args(gen, m, n, k)
    want = run_interpreted(make, (1, 1, 1), x)
    got = run_simulated(make, (1, 1, 1), x, ptx)
    for i in (2, 3):
        assert rel_err(got[i], want[i]) <= BOUND


def test_the_replay_detects_missing_rounding(gen: torch.Generator) -> None:
    """The same PTX with the conversions replaced by plain moves is caught: the bound is tight enough to see
    unrounded tf32 inputs."""
    make = maker(16, 64, 32, 8)
    ptx, _, _ = lower(make)
    broken = re.sub(r"cvt\.rna\.tf32\.f32 (%\w+), (%\w+);", r"mov.b32 \1, \2;", ptx)
    assert broken != ptx
    x = args(gen, 16, 64, 32)
    want = run_interpreted(make, (1, 1, 1), x)
    got = run_simulated(make, (1, 1, 1), x, broken)
    assert rel_err(got[2], want[2]) > 10 * BOUND
