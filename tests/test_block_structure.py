"""Block-structured dots: `mt.dot(a, b, acc, block_structure=(S, a_kind, b_kind))` (minitriton/ir/block_structure.py).

1. The frontend masks each operand outside its allowed blocks (so the value is acc + mask(a) @ mask(b) for any
   inputs) and records the structure as dot attrs; bad structures are clear errors at the kernel's line.
2. The activity rule (`active`) against brute force over every product.
3. PTX in the simulator (tests/ptx_sim.py, whose ldmatrix / mma.sync accept warp-uniform guards only) against
   the interpreter and against the masked product in float64, on fresh random operands that are nonzero
   everywhere (an unmasked or wrongly skipped product shows up as a wrong number); the structured PTX issues
   fewer mma.sync and ldmatrix than the dense dot of the same shape; ptxas accepts it.
"""
from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import minitriton as mt
from minitriton.codegen import ptxas_path
from minitriton.errors import CompilationError
from minitriton.frontend import compile_to_ir
from minitriton.ir import Module, print_module
from minitriton.ir.block_structure import KINDS, active, allowed
from minitriton.ir.types import SCALAR_TYPES, PointerType
from minitriton.passes import run_passes
from ptx_helpers import lower, rel_err, run_interpreted, run_simulated
from test_ptx import assemble

bf16, f32 = SCALAR_TYPES["bf16"], SCALAR_TYPES["f32"]
P = PointerType


@mt.kernel
def structured_dot_kernel(a_ptr, b_ptr, c_ptr, o_ptr, M: mt.constexpr, N: mt.constexpr, K: mt.constexpr,
                          STRUCTURE: mt.constexpr, PRECISION: mt.constexpr):
    """o = c + a @ b with block_structure=STRUCTURE (None: the dense dot)."""
    m = mt.arange(0, M)
    n = mt.arange(0, N)
    k = mt.arange(0, K)
    a = mt.load(a_ptr + m[:, None] * K + k[None, :])
    b = mt.load(b_ptr + k[:, None] * N + n[None, :])
    c = mt.load(c_ptr + m[:, None] * N + n[None, :])
    mt.store(o_ptr + m[:, None] * N + n[None, :], mt.dot(a, b, c, input_precision=PRECISION, block_structure=STRUCTURE))


def maker(m: int, n: int, k: int, t: Any, warps: int, structure: tuple[int, str, str] | None):
    def make() -> Module:
        shape = {"M": m, "N": n, "K": k, "STRUCTURE": structure, "PRECISION": "tf32" if t == f32 else "ieee"}
        module = compile_to_ir(structured_dot_kernel, {"a_ptr": P(t), "b_ptr": P(t), "c_ptr": P(f32),
                                                       "o_ptr": P(f32)}, shape,
                               divisibility={p: 16 for p in ("a_ptr", "b_ptr", "c_ptr", "o_ptr")}, num_warps=warps)
        module.functions[0].attrs["dot_instruction"] = "mma"  # mma.sync: wgmma takes the structure as masks only
        return run_passes(module, ["canonicalize"])

    return make


def masked(x: torch.Tensor, size: int, kind: str) -> torch.Tensor:
    i = torch.arange(x.shape[0])[:, None] // size
    j = torch.arange(x.shape[1])[None, :] // size
    keep = torch.tensor([[allowed(kind, int(r), int(c)) for c in j[0]] for r in i[:, 0]])
    return torch.where(keep, x, torch.zeros_like(x))


# ------------------------------------------------------------------------------------ 1. frontend


def test_frontend_masks_operands_and_records_the_structure() -> None:
    text = print_module(maker(64, 64, 64, f32, 8, (16, "diag", "strict_lower"))())
    dot = next(line for line in text.splitlines() if "mt.dot" in line)
    assert 'a_blocks = "diag"' in dot and 'b_blocks = "strict_lower"' in dot and "block = 16" in dot
    assert text.count("mt.select") == 2  # one mask per structured operand
    dense = print_module(maker(64, 64, 64, f32, 8, (16, "full", "full"))())
    assert "mt.select" not in dense  # "full" needs no mask


@pytest.mark.parametrize("structure, message", [
    ((16, "upper", "full"), "a's kind must be one of"),
    ((16, "full", 3), "b's kind must be one of"),
    ((24, "diag", "diag"), "must divide the dot's M, K and N"),
    ((16, "diag"), "must be a tuple (block size, a kind, b kind)"),
])
def test_bad_structures_are_clear_errors(structure: Any, message: str) -> None:
    @mt.kernel
    def bad(a_ptr, o_ptr):
        r = mt.arange(0, 64)
        a = mt.load(a_ptr + r[:, None] * 64 + r[None, :])
        mt.store(o_ptr + r[:, None] * 64 + r[None, :], mt.dot(a, a, block_structure=structure))

    with pytest.raises(CompilationError, match=re.escape(message)) as info:
        compile_to_ir(bad, {"a_ptr": P(f32), "o_ptr": P(f32)}, {})
    assert "test_block_structure.py" in str(info.value)


# ------------------------------------------------------------------------------------ 2. the activity rule


@pytest.mark.parametrize("a_kind, b_kind", list(itertools.product(KINDS, KINDS)))
def test_active_matches_brute_force(a_kind: str, b_kind: str) -> None:
    size = 4
    for rows, ks, cols in itertools.product([range(0, 4), range(4, 8), [1, 9]], [range(0, 4), range(8, 12)],
                                            [range(0, 4), range(4, 8), [2, 10]]):
        brute = any(allowed(a_kind, r // size, k // size) and allowed(b_kind, k // size, c // size)
                    for r in rows for k in ks for c in cols)
        assert active((size, a_kind, b_kind), rows, ks, cols) == brute


# ------------------------------------------------------------------------------------ 3. PTX


CASES = [
    (64, 64, 64, f32, 8, (16, "diag", "diag")),  # the Neumann squarings of a chunked solve: warps [4, 2]
    (64, 64, 64, f32, 8, (16, "strict_lower", "lower")),
    (64, 64, 64, f32, 8, (16, "diag", "strict_lower")),
    (64, 64, 64, bf16, 4, (16, "lower", "full")),  # bf16: ldmatrix halves unpacked under the guard
    (32, 32, 64, bf16, 4, (16, "diag", "lower")),
    (64, 64, 32, f32, 4, (8, "strict_lower", "diag")),
]


def _counts(ptx: str) -> tuple[int, int, int]:
    """(mma.sync, operand-fragment loads, those of them under a warp guard) in the PTX text."""
    mma = re.findall(r"(@%p\w+ )?mma\.sync", ptx)
    loads = re.findall(r"(@%p\w+ )?(?:ldmatrix\.|ld\.shared\.v2)", ptx)
    return len(mma), len(loads), sum(1 for g in mma + loads if g)


@pytest.mark.parametrize("m, n, k, t, warps, structure", CASES)
def test_simulated_structured_dot_matches_the_masked_product(m: int, n: int, k: int, t: Any, warps: int,
                                                             structure: tuple[int, str, str]) -> None:
    gen = torch.Generator().manual_seed(hash((m, n, k, structure)) % 2**31)
    torch_t = torch.float32 if t == f32 else torch.bfloat16
    a = torch.randn(m, k, generator=gen).to(torch_t)
    b = torch.randn(k, n, generator=gen).to(torch_t)
    c = torch.randn(m, n, generator=gen)
    poison = torch.full((m, n), float("nan"))
    make = maker(m, n, k, t, warps, structure)
    ptx, _, _ = lower(make)
    args = [a, b, c, poison]
    want = run_interpreted(make, (1,), args)[3]
    got = run_simulated(make, (1,), args, ptx)[3]
    size, a_kind, b_kind = structure
    exact = c.double() + masked(a.double(), size, a_kind) @ masked(b.double(), size, b_kind)
    unmasked = c.double() + a.double() @ b.double()
    bound = 2e-3 if t == f32 else 1e-5  # tf32 rounds the operands (2^-11); bf16 products are exact in f32
    assert rel_err(want, exact) <= bound, "the interpreter's product is not the masked one"
    assert rel_err(got, want) <= 1e-5, "the simulated PTX differs from the interpreter"
    assert rel_err(got, unmasked) > 10 * bound  # the inputs do exercise the masks
    dense_ptx, _, _ = lower(maker(m, n, k, t, warps, None))
    (mma, loads, guarded), (dense_mma, dense_loads, _) = _counts(ptx), _counts(dense_ptx)
    # fewer instructions, or some run by only the warps that need them (warp-uniform guards)
    assert mma <= dense_mma and loads <= dense_loads and (mma < dense_mma or guarded > 0)
    if ptxas_path() is not None:
        assemble(ptx)


def test_diagonal_squaring_issues_an_eighth_of_the_mma() -> None:
    """[64, 64] x [64, 64] tf32 with 16 x 16 diagonal blocks on 8 warps ([2, 4]): m-block r of warp-row w holds
    rows of blocks 2r and 2r + 1, n-block b of warp-column c columns of block 2b + c // 2, so a warp's live
    products are (r, b) = (0, 0) and (1, 1) over the 2 K steps of one block: 4 of its 2 x 2 x 8 = 32 mma.sync.
    Which block depends on c // 2: 8 guarded mma.sync in the code, 4 run by each warp."""
    ptx, _, _ = lower(maker(64, 64, 64, f32, 8, (16, "diag", "diag")))
    guarded = re.findall(r"@%p\w+ mma\.sync", ptx)
    assert len(re.findall(r"\bmma\.sync", ptx)) == len(guarded) == 8
    dense_ptx, _, _ = lower(maker(64, 64, 64, f32, 8, None))
    assert len(re.findall(r"\bmma\.sync", dense_ptx)) == 32
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from flash_kda_ptx import per_warp_counts  # evaluates the warp guards, as the hardware would

    assert [c["mma"] for c in per_warp_counts(ptx, 8)] == [4] * 8
    assert [c["mma"] for c in per_warp_counts(dense_ptx, 8)] == [32] * 8
