"""tf32 dot operands are rounded once per element when staged, not once per fragment load (codegen/mma.py).

An f32 operand that reaches mma.sync through shared memory is rounded with `cvt.rn.tf32.f32` by the thread that
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
    cvts = ptx.count("cvt.rn.tf32.f32")
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
    broken = re.sub(r"cvt\.rn\.tf32\.f32 (%\w+), (%\w+);", r"mov.b32 \1, \2;", ptx)
    assert broken != ptx
    x = args(gen, 16, 64, 32)
    want = run_interpreted(make, (1, 1, 1), x)
    got = run_simulated(make, (1, 1, 1), x, broken)
    assert rel_err(got[2], want[2]) > 10 * BOUND


# ------------------------------------------------------------------------ the rounding itself, bit for bit


def tie_heavy_values(gen: torch.Generator, shape: tuple[int, int]) -> torch.Tensor:
    """f32 values whose 13 cut bits are exactly half (ties, odd and even kept parts alike), a hair below or above
    half, or random, with normal and subnormal exponents (none near overflow: the kernel's second dot scales them):
    where ties-to-even and ties-away differ."""
    n = shape[0] * shape[1]
    sign = torch.randint(0, 2, (n,), generator=gen, dtype=torch.int64) << 31
    exponent = torch.randint(1, 220, (n,), generator=gen, dtype=torch.int64)
    exponent[::9] = 0  # subnormals
    kept = torch.randint(0, 1 << 10, (n,), generator=gen, dtype=torch.int64)
    low = torch.randint(0, 1 << 13, (n,), generator=gen, dtype=torch.int64)
    low[0::4], low[1::4], low[2::8] = 0x1000, 0x0FFF, 0x1001
    bits = sign | (exponent << 23) | (kept << 13) | low
    return torch.tensor(bits.numpy().astype(np.uint32).view(np.float32)).reshape(shape)


def test_round_tf32_is_nearest_even() -> None:
    from minitriton.interpreter.values import round_tf32

    cases = {  # input bits -> rounded bits
        0x3F800000: 0x3F800000,  # exact
        0x3F801000: 0x3F800000,  # a tie, even kept part: down
        0x3F803000: 0x3F804000,  # a tie, odd kept part: up
        0xBF803000: 0xBF804000,  # the same, negative
        0x3F801001: 0x3F802000,  # over half: up
        0x3F800FFF: 0x3F800000,  # under half: down
        0x7F7FFFFF: 0x7F800000,  # over the largest tf32: infinity
        0x00001000: 0x00000000,  # a subnormal tie, even: to zero
        0x7F800000: 0x7F800000,  # infinity stays
    }
    got = round_tf32(np.array(list(cases), dtype=np.uint32).view(np.float32)).view(np.uint32)
    assert [hex(int(g)) for g in got] == [hex(v) for v in cases.values()]
    assert np.isnan(round_tf32(np.array([np.nan], dtype=np.float32)))[0]
    assert np.isnan(round_tf32(np.array([0x7FFFFFFF], dtype=np.uint32).view(np.float32)))[0]


def identity_args(gen: torch.Generator, m: int, n: int, k: int) -> list[torch.Tensor]:
    """a of tie-heavy values times a 0/1 identity: c[:, :k] is tf32(a) exactly (one nonzero product per sum)."""
    b = torch.zeros(k, n)
    b[torch.arange(k), torch.arange(k)] = 1.0
    return [tie_heavy_values(gen, (m, k)), b, torch.full((m, n), float("nan")), torch.full((m, n), float("nan"))]


def assert_rounded_like_the_interpreter(got: torch.Tensor, a: torch.Tensor) -> None:
    from minitriton.interpreter.values import round_tf32

    k = a.shape[1]
    want = round_tf32(a.numpy()).view(np.uint32)
    have = got[:, :k].contiguous().numpy().view(np.uint32)
    wrong = np.argwhere(have != want)
    assert wrong.size == 0, (f"{len(wrong)} of {want.size} roundings differ, e.g. "
                             + ", ".join(f"{int(a.numpy().view(np.uint32)[i, j]):#010x} -> {int(have[i, j]):#010x} "
                                         f"(want {int(want[i, j]):#010x})" for i, j in wrong[:3]))


def test_compiled_rounding_matches_the_interpreter_bit_for_bit(gen: torch.Generator) -> None:
    make = maker(16, 64, 32, 8)
    x = identity_args(gen, 16, 64, 32)
    got = run_simulated(make, (1, 1, 1), x, lower(make)[0])
    assert_rounded_like_the_interpreter(got[2], x[0])
    ties_away = run_simulated(make, (1, 1, 1), x, lower(make)[0].replace("cvt.rn.tf32", "cvt.rna.tf32"))
    with pytest.raises(AssertionError, match="roundings differ"):  # the test sees the rounding mode
        assert_rounded_like_the_interpreter(ties_away[2], x[0])
    assert_rounded_like_the_interpreter(torch.as_tensor(run_interpreted(make, (1, 1, 1), x)[2]), x[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_rounding_matches_the_interpreter_bit_for_bit(gen: torch.Generator) -> None:
    """The hardware's cvt.rn.tf32.f32 (and the mma reading its words) against the interpreter's round_tf32."""
    from ptx_helpers import launch_on_gpu

    make = maker(16, 64, 32, 8)
    ptx, name, threads = lower(make)
    x = identity_args(gen, 16, 64, 32)
    got = launch_on_gpu(ptx, name, (1, 1, 1), x, threads)
    assert_rounded_like_the_interpreter(got[2], x[0])
