"""wgmma with A from registers (codegen/wgmma.py, dot-lowering's `#mt.dot_op` of a version 3 accumulator).

An A operand that is an accumulator-layout tile (an earlier dot's result rounded to bf16, or a loop-carried state
updated by a dot) is passed to `wgmma.mma_async` as four 32-bit words a thread instead of being staged through
shared memory. The PTX on the simulator must match the interpreter on fresh random operands (bf16 products, f32
sums in another order: 1e-5 relative), the second dot must use the register form and stage only B, and the PTX
must assemble."""
from __future__ import annotations

import re

import pytest
import torch

import minitriton as mt
from minitriton.codegen import ptxas_path
from minitriton.ir.types import SCALAR_TYPES, PointerType
from minitriton.passes import run_passes
from minitriton.compiler import PIPELINE
from ptx_helpers import dsl, lower, rel_err, run_interpreted, run_simulated
from test_ptx import assemble

bf16, f32 = SCALAR_TYPES["bf16"], SCALAR_TYPES["f32"]
P = PointerType
REGISTER_FORM = re.compile(r"wgmma\.mma_async\S* \{[^}]*\}, \{%r[^}]*\}, %rd\d+, 1, 1, 1, [01];")
SHARED_FORM = re.compile(r"wgmma\.mma_async\S* \{[^}]*\}, %rd\d+, %rd\d+, 1, 1, 1, 0, [01];")


@mt.kernel
def two_dots_kernel(a_ptr, b_ptr, c_ptr, o_ptr, M: mt.constexpr, K: mt.constexpr, N1: mt.constexpr,
                    N2: mt.constexpr):
    m, k, n1, n2 = mt.arange(0, M), mt.arange(0, K), mt.arange(0, N1), mt.arange(0, N2)
    a = mt.load(a_ptr + m[:, None] * K + k[None, :])
    b = mt.load(b_ptr + k[:, None] * N1 + n1[None, :])
    c = mt.load(c_ptr + n1[:, None] * N2 + n2[None, :])
    p = mt.dot(a, b)  # [M, N1] f32 accumulator
    mt.store(o_ptr + m[:, None] * N2 + n2[None, :], mt.dot(p.to(mt.bfloat16), c))  # A = p: by register renaming


@mt.kernel
def residual_kernel(a_ptr, b_ptr, c_ptr, u_ptr, o_ptr):
    r = mt.arange(0, 64)
    at = r[:, None] * 64 + r[None, :]
    p = mt.load(u_ptr + at).to(mt.float32) - mt.dot(mt.load(a_ptr + at), mt.load(b_ptr + at))  # KDA's u - w S
    mt.store(o_ptr + at, mt.dot(p.to(mt.bfloat16), mt.load(c_ptr + at)))


@mt.kernel
def recurrent_state_kernel(s0_ptr, x_ptr, o_ptr, M: mt.constexpr, N: mt.constexpr, STEPS: mt.constexpr):
    m, n = mt.arange(0, M), mt.arange(0, N)
    state = mt.load(s0_ptr + m[:, None] * N + n[None, :])
    for i in range(STEPS):
        x = mt.load(x_ptr + i * N * N + n[:, None] * N + n[None, :])
        state = mt.dot(state.to(mt.bfloat16), x, state * 0.5)  # the loop-carried state is the next A
    mt.store(o_ptr + m[:, None] * N + n[None, :], state)


def two_dots(m: int, k: int, n1: int, n2: int, warps: int):
    return dsl(two_dots_kernel, {"a_ptr": P(bf16), "b_ptr": P(bf16), "c_ptr": P(bf16), "o_ptr": P(f32)},
               {"M": m, "K": k, "N1": n1, "N2": n2}, divisibility={p: 16 for p in ("a_ptr", "b_ptr", "c_ptr", "o_ptr")},
               num_warps=warps)


@pytest.mark.parametrize("m, k, n1, n2, warps", [
    (64, 64, 64, 64, 4),
    (64, 32, 128, 32, 4),  # K of the second dot = 128: eight K steps from the accumulator's 16 n8-blocks
    (128, 64, 64, 128, 8),  # two warpgroups, each its own 64 rows
    (128, 64, 32, 64, 4),  # two m-blocks per warpgroup
])
def test_an_accumulator_is_the_next_wgmma_a_in_registers(m: int, k: int, n1: int, n2: int, warps: int) -> None:
    make = two_dots(m, k, n1, n2, warps)
    ptx, _, _ = lower(make)
    m_blocks = m // (16 * warps)  # per warpgroup
    assert len(REGISTER_FORM.findall(ptx)) == m_blocks * (n2 // min(n2, 256)) * (n1 // 16)
    assert len(SHARED_FORM.findall(ptx)) == m_blocks * (n1 // min(n1, 256)) * (k // 16)
    gen = torch.Generator().manual_seed(m + k + n1 + n2 + warps)
    args = [torch.randn(m, k, generator=gen).bfloat16(), torch.randn(k, n1, generator=gen).bfloat16(),
            torch.randn(n1, n2, generator=gen).bfloat16(), torch.full((m, n2), float("nan"))]
    want = run_interpreted(make, (1,), args)[3]
    got = run_simulated(make, (1,), args, ptx)[3]
    assert rel_err(got, want) <= 1e-5
    if ptxas_path() is not None:
        assemble(ptx)


def test_the_dot_lowering_ir_says_a_is_in_registers() -> None:
    module = run_passes(two_dots(64, 64, 64, 64, 4)(), PIPELINE[PIPELINE.index("tiling"):PIPELINE.index("dot-lowering") + 1])
    text = str(module)
    assert re.search(r"\"mt\.convert_layout\".*#mt\.dot_op<\{opIdx = 0, parent = #mt\.mma<\{version = 3", text)
    assert text.count("mt.local_alloc") == 3  # a and b of the first dot, b of the second


def test_a_loop_carried_state_is_the_wgmma_a_in_registers() -> None:
    m, n, steps = 64, 64, 3
    make = dsl(recurrent_state_kernel, {"s0_ptr": P(f32), "x_ptr": P(bf16), "o_ptr": P(f32)},
               {"M": m, "N": n, "STEPS": steps}, divisibility={p: 16 for p in ("s0_ptr", "x_ptr", "o_ptr")})
    ptx, _, _ = lower(make)
    assert REGISTER_FORM.search(ptx) and not SHARED_FORM.search(ptx)
    gen = torch.Generator().manual_seed(11)
    args = [torch.randn(m, n, generator=gen), (torch.randn(steps, n, n, generator=gen) / 8).bfloat16(),
            torch.full((m, n), float("nan"))]
    want = run_interpreted(make, (1,), args)[2]
    got = run_simulated(make, (1,), args, ptx)[2]
    # each step rounds the state to bf16: an f32 sum in another order flips a few roundings (2^-8 each), so the
    # bound is looser than one dot's; a misplaced fragment element is an O(1) error
    assert rel_err(got, want) <= 1e-3
    if ptxas_path() is not None:
        assemble(ptx)


def test_a_loaded_tile_minus_an_accumulator_is_the_next_a_in_registers() -> None:
    """`u - a @ b` (u loaded): the solve puts the difference in the accumulator layout (u converted to it), so the
    second dot still takes it from registers."""
    names = ("a_ptr", "b_ptr", "c_ptr", "u_ptr", "o_ptr")
    make = dsl(residual_kernel, {n: P(f32 if n == "o_ptr" else bf16) for n in names},
               divisibility={n: 16 for n in names})
    ptx, _, _ = lower(make)
    assert len(REGISTER_FORM.findall(ptx)) == 4 and len(SHARED_FORM.findall(ptx)) == 4
    gen = torch.Generator().manual_seed(5)
    args = [torch.randn(64, 64, generator=gen).bfloat16() for _ in range(4)] + [torch.full((64, 64), float("nan"))]
    assert rel_err(run_simulated(make, (1,), args, ptx)[4], run_interpreted(make, (1,), args)[4]) <= 1e-5


def _cuda() -> bool:
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", ["two_dots_8_warps", "recurrent_state"])
def test_gpu_register_a(case: str) -> None:
    """The register form on the GPU (both cases above), against the interpreter."""
    from ptx_helpers import launch_on_gpu

    gen = torch.Generator().manual_seed(3)
    if case == "recurrent_state":
        make = dsl(recurrent_state_kernel, {"s0_ptr": P(f32), "x_ptr": P(bf16), "o_ptr": P(f32)},
                   {"M": 64, "N": 64, "STEPS": 3}, divisibility={p: 16 for p in ("s0_ptr", "x_ptr", "o_ptr")})
        args = [torch.randn(64, 64, generator=gen), (torch.randn(3, 64, 64, generator=gen) / 8).bfloat16(),
                torch.full((64, 64), float("nan"))]
    else:
        make = two_dots(128, 64, 64, 128, 8)
        args = [torch.randn(128, 64, generator=gen).bfloat16(), torch.randn(64, 64, generator=gen).bfloat16(),
                torch.randn(64, 128, generator=gen).bfloat16(), torch.full((128, 128), float("nan"))]
    ptx, name, threads = lower(make)
    got = launch_on_gpu(ptx, name, (1,), args, threads)
    want = run_interpreted(make, (1,), args)
    assert rel_err(got[-1], want[-1]) <= 1e-3


def test_a_register_operand_from_another_layout_goes_through_ldmatrix(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the register A is in some other layout than the accumulator's (here a coalesced load, by forcing the
    choice), its conversion into the version 3 `#mt.dot_op` stages it and loads the fragments with ldmatrix, as
    for mma.sync: same answer."""
    from minitriton.passes import dot_lowering

    monkeypatch.setattr(dot_lowering, "a_in_accumulator_layout", lambda op, through_loops=False: through_loops)
    make = dsl(two_dots_kernel, {"a_ptr": P(bf16), "b_ptr": P(bf16), "c_ptr": P(bf16), "o_ptr": P(f32)},
               {"M": 64, "K": 64, "N1": 64, "N2": 64}, divisibility={p: 16 for p in ("a_ptr", "b_ptr", "c_ptr", "o_ptr")})
    ptx, _, _ = lower(make)
    assert len(REGISTER_FORM.findall(ptx)) == 8 and "ldmatrix" in ptx  # both dots take A from registers
    gen = torch.Generator().manual_seed(21)
    args = [torch.randn(64, 64, generator=gen).bfloat16() for _ in range(3)] + [torch.full((64, 64), float("nan"))]
    assert rel_err(run_simulated(make, (1,), args, ptx)[3], run_interpreted(make, (1,), args)[3]) <= 1e-5
