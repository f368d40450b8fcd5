"""`mt.dot(..., k_chains=n)`: each warp's accumulator tiles in n independent mma.sync chains over alternating K
steps, added at the end (codegen/mma.py). The PTX on the simulator must match the interpreter on fresh random
operands (f32 sums in another order: 1e-5 relative), keep the dense dot's mma.sync count, and add the chains'
partial sums (3 adds an f32 register for 4 chains); bad values are clear errors."""
from __future__ import annotations

import re
from typing import Any

import pytest
import torch

import minitriton as mt
from minitriton.codegen import ptxas_path
from minitriton.errors import CompilationError
from minitriton.frontend import compile_to_ir
from minitriton.ir import Module
from minitriton.ir.types import SCALAR_TYPES, PointerType
from minitriton.passes import run_passes
from ptx_helpers import lower, rel_err, run_interpreted, run_simulated
from test_ptx import assemble

bf16, f32 = SCALAR_TYPES["bf16"], SCALAR_TYPES["f32"]
P = PointerType


@mt.kernel
def chained_dot_kernel(a_ptr, b_ptr, c_ptr, o_ptr, M: mt.constexpr, N: mt.constexpr, K: mt.constexpr,
                       CHAINS: mt.constexpr, PRECISION: mt.constexpr):
    m = mt.arange(0, M)
    n = mt.arange(0, N)
    k = mt.arange(0, K)
    a = mt.load(a_ptr + m[:, None] * K + k[None, :])
    b = mt.load(b_ptr + k[:, None] * N + n[None, :])
    c = mt.load(c_ptr + m[:, None] * N + n[None, :])
    mt.store(o_ptr + m[:, None] * N + n[None, :], mt.dot(a, b, c, input_precision=PRECISION, k_chains=CHAINS))


def maker(m: int, n: int, k: int, t: Any, warps: int, chains: int):
    def make() -> Module:
        module = compile_to_ir(chained_dot_kernel, {"a_ptr": P(t), "b_ptr": P(t), "c_ptr": P(f32), "o_ptr": P(f32)},
                               {"M": m, "N": n, "K": k, "CHAINS": chains, "PRECISION": "tf32" if t == f32 else "ieee"},
                               divisibility={p: 16 for p in ("a_ptr", "b_ptr", "c_ptr", "o_ptr")}, num_warps=warps)
        module.functions[0].attrs["dot_instruction"] = "mma"
        return run_passes(module, ["canonicalize"])

    return make


@pytest.mark.parametrize("m, n, k, t, warps, chains", [
    (16, 64, 128, f32, 8, 2),  # FlashKDA's score rows: one [16, 8] tile a warp, 16 tf32 K steps
    (16, 64, 128, f32, 8, 4),
    (32, 32, 64, bf16, 4, 2),
    (16, 16, 32, bf16, 2, 3),  # more chains than fit evenly: K steps 0, 1 -> chains 0, 1
])
def test_chained_dot_matches_the_interpreter(m: int, n: int, k: int, t: Any, warps: int, chains: int) -> None:
    gen = torch.Generator().manual_seed(m * 1000 + n * 10 + chains)
    torch_t = torch.float32 if t == f32 else torch.bfloat16
    args = [torch.randn(m, k, generator=gen).to(torch_t), torch.randn(k, n, generator=gen).to(torch_t),
            torch.randn(m, n, generator=gen), torch.full((m, n), float("nan"))]
    make = maker(m, n, k, t, warps, chains)
    ptx, _, _ = lower(make)
    want = run_interpreted(make, (1,), args)[3]
    got = run_simulated(make, (1,), args, ptx)[3]
    assert rel_err(got, want) <= 1e-5
    single, _, _ = lower(maker(m, n, k, t, warps, 1))
    count = lambda text, pattern: len(re.findall(pattern, text))  # noqa: E731
    assert count(ptx, r"mma\.sync") == count(single, r"mma\.sync")
    steps = k // (8 if t == f32 else 16)
    used = min(chains, steps)
    tiles = count(single, r"mma\.sync") // steps  # accumulator tiles per warp
    assert count(ptx, r"add\.f32") - count(single, r"add\.f32") == 4 * tiles * (used - 1)
    if ptxas_path() is not None:
        assemble(ptx)


@pytest.mark.parametrize("chains, message", [(0, "k_chains must be at least 1"),
                                             (1.5, "k_chains must be a compile-time integer")])
def test_bad_chain_counts_are_clear_errors(chains: Any, message: str) -> None:
    @mt.kernel
    def bad(a_ptr, o_ptr):
        r = mt.arange(0, 64)
        a = mt.load(a_ptr + r[:, None] * 64 + r[None, :])
        mt.store(o_ptr + r[:, None] * 64 + r[None, :], mt.dot(a, a, k_chains=chains))

    with pytest.raises(CompilationError, match=re.escape(message)) as info:
        compile_to_ir(bad, {"a_ptr": P(f32), "o_ptr": P(f32)}, {})
    assert "test_dot_chains.py" in str(info.value)


# ------------------------------------------------------------------ mt.dot(..., instruction=)


@mt.kernel
def chosen_dot_kernel(a_ptr, b_ptr, o_ptr, INSTRUCTION: mt.constexpr):
    r = mt.arange(0, 64)
    a = mt.load(a_ptr + r[:, None] * 64 + r[None, :])
    b = mt.load(b_ptr + r[:, None] * 64 + r[None, :])
    mt.store(o_ptr + r[:, None] * 64 + r[None, :], mt.dot(a, b, instruction=INSTRUCTION))


@pytest.mark.parametrize("instruction, present, absent", [("auto", "wgmma.mma_async", "mma.sync"),
                                                         ("mma", "mma.sync", "wgmma"), ("fma", "fma.rn.f32", "mma")])
def test_a_dot_picks_its_instruction(instruction: str, present: str, absent: str) -> None:
    """A 64^3 bf16 dot on 4 warps is wgmma by default; `instruction=` moves it, and the result still matches."""
    def make() -> Module:
        module = compile_to_ir(chosen_dot_kernel, {"a_ptr": P(bf16), "b_ptr": P(bf16), "o_ptr": P(f32)},
                               {"INSTRUCTION": instruction}, divisibility={p: 16 for p in ("a_ptr", "b_ptr", "o_ptr")},
                               num_warps=4)
        return run_passes(module, ["canonicalize"])

    ptx, _, _ = lower(make)
    assert present in ptx and absent not in ptx
    gen = torch.Generator().manual_seed(7)
    args = [torch.randn(64, 64, generator=gen).bfloat16(), torch.randn(64, 64, generator=gen).bfloat16(),
            torch.full((64, 64), float("nan"))]
    assert rel_err(run_simulated(make, (1,), args, ptx)[2], run_interpreted(make, (1,), args)[2]) <= 1e-5


def test_a_bad_instruction_is_a_clear_error() -> None:
    with pytest.raises(CompilationError, match="instruction must be one of") as info:
        compile_to_ir(chosen_dot_kernel, {"a_ptr": P(bf16), "b_ptr": P(bf16), "o_ptr": P(f32)}, {"INSTRUCTION": "hmma"})
    assert "test_dot_chains.py" in str(info.value)


def test_wgmma_fit_counts_the_staging_exactly() -> None:
    """codegen/wgmma.py stages A, then B at the next 1024 bytes: [128, 128] x [128, 64] bf16 needs 32768 + 16384 =
    49152 B, exactly the static budget (FlashKDA's recurrence dots); one more 8-column block of B does not fit.
    (M is a multiple of 64 and K of 16 for wgmma, so A always ends on a 1024-byte boundary.)"""
    from minitriton.passes.dot_lowering import fits_wgmma

    assert fits_wgmma(128, 64, 128, 4)
    assert not fits_wgmma(128, 72, 128, 4)
