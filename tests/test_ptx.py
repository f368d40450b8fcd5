"""PTX codegen: kernels go through tiling + emit_ptx, then

1. `ptxas -arch=sm_90a -v` must accept them with zero spills, and the instructions that matter must be in the text
   (16-byte vector loads for aligned f32 / bf16, warp shuffles in reductions and scans, bar.sync around shared
   memory, ex2.approx for exp, `.loc` lines pointing at the kernel source);
2. the PTX *runs* on the CPU in tests/ptx_sim.py (every thread of a CTA in lockstep, branches checked uniform,
   shared memory checked race-free, global accesses bounds-checked) and must match the interpreter on fresh random
   inputs: bit-exact for data movement, integer ops and casts, within stated bounds where only the order of float
   additions differs (reductions, dots: relative error 1e-5 for f32) or where the codegen approximates (the
   simulator evaluates ex2.approx & co. exactly, so the bound is the formula's own error, 1e-5 relative);
3. on a machine with a GPU (`-m gpu`), the same kernels run through the driver (cuda-bindings) and must match the
   interpreter, with the hardware's approximate math allowed for (bounds per case).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch

import minitriton as mt
from minitriton.codegen import PtxasError, ptxas_path, run_ptxas
from minitriton.codegen import context as codegen_context
from minitriton.ir.types import SCALAR_TYPES, PointerType, ScalarType
from minitriton.kernels.examples import attention, cumsum, matmul, rmsnorm, softmax, vector_add
from ptx_helpers import (dsl, elementwise_kernel, launch_on_gpu, lower, rel_err, run_interpreted, run_simulated)
from ptx_sim import SimError, run_ptx

T = SCALAR_TYPES
f32, bf16, f16, i32 = T["f32"], T["bf16"], T["f16"], T["i32"]
P = PointerType
TORCH = {"i1": torch.bool, "i8": torch.int8, "ui8": torch.uint8, "i16": torch.int16, "ui16": torch.uint16,
         "i32": torch.int32, "ui32": torch.uint32, "i64": torch.int64, "ui64": torch.uint64, "f16": torch.float16,
         "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64}
INTS = ["i8", "ui8", "i16", "ui16", "i32", "ui32", "i64", "ui64"]
FLOATS = ["f16", "bf16", "f32", "f64"]

needs_ptxas = pytest.mark.skipif(ptxas_path() is None, reason="ptxas is not on PATH: PTX is not assembled")


@pytest.fixture
def gen() -> torch.Generator:
    seed = int(np.random.SeedSequence().entropy % (2**63))
    print(f"seed = {seed}")  # shown on failure
    return torch.Generator().manual_seed(seed)


def assemble(ptx: str) -> Any:
    """ptxas -v must accept the PTX with no spills (skipped without ptxas)."""
    if ptxas_path() is None:
        return None
    report = run_ptxas(ptx)
    assert report.spill_stores == 0 and report.spill_loads == 0, report.log
    return report


def nan_like(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Output buffers start poisoned, so an element the kernel fails to write shows up."""
    t = torch.empty(shape, dtype=dtype)
    return t.fill_(float("nan")) if dtype.is_floating_point else t.fill_(-123 if dtype != torch.bool else True)


# --------------------------------------------------------------------------------------------- kernels


@mt.kernel
def row_softmax(x_ptr, out_ptr, stride, R: mt.constexpr, C: mt.constexpr):
    r = mt.arange(0, R)
    c = mt.arange(0, C)
    x = mt.load(x_ptr + r[:, None] * stride + c[None, :])
    e = mt.exp(x - mt.max(x, axis=1)[:, None])
    mt.store(out_ptr + r[:, None] * stride + c[None, :], e / mt.sum(e, axis=1)[:, None])


@mt.kernel
def broadcast_2d(x_ptr, bias_ptr, out_ptr, n_rows, stride, R: mt.constexpr, C: mt.constexpr):
    r = mt.program_id(0) * R + mt.arange(0, R)
    c = mt.arange(0, C)
    mask = r[:, None] < n_rows
    x = mt.load(x_ptr + r[:, None] * stride + c[None, :], mask=mask, other=0.0)
    y = x * 2.0 + mt.load(bias_ptr + c)[None, :]
    mt.store(out_ptr + r[:, None] * stride + c[None, :], y, mask=mask)


@mt.kernel
def scan_2d(x_ptr, out0_ptr, out1_ptr, R: mt.constexpr, C: mt.constexpr):
    r = mt.arange(0, R)
    c = mt.arange(0, C)
    x = mt.load(x_ptr + r[:, None] * C + c[None, :])
    mt.store(out0_ptr + r[:, None] * C + c[None, :], mt.cumsum(x, axis=0))
    mt.store(out1_ptr + r[:, None] * C + c[None, :], mt.cumsum(x, axis=1))


@mt.kernel
def reduce_all(x_ptr, sum0_ptr, max1_ptr, min_ptr, R: mt.constexpr, C: mt.constexpr):
    r = mt.arange(0, R)
    c = mt.arange(0, C)
    x = mt.load(x_ptr + r[:, None] * C + c[None, :])
    mt.store(sum0_ptr + c, mt.sum(x, axis=0))
    m1 = mt.max(x, axis=1)
    mt.store(max1_ptr + r, m1)
    mt.store(min_ptr, mt.min(m1, axis=0))


@mt.kernel
def dot_tile(a_ptr, b_ptr, c_ptr, M: mt.constexpr, N: mt.constexpr, K: mt.constexpr, PRECISION: mt.constexpr):
    m = mt.arange(0, M)
    n = mt.arange(0, N)
    k = mt.arange(0, K)
    a = mt.load(a_ptr + m[:, None] * K + k[None, :])
    b = mt.load(b_ptr + k[:, None] * N + n[None, :])
    mt.store(c_ptr + m[:, None] * N + n[None, :], mt.dot(a, b, input_precision=PRECISION))


@mt.kernel
def branchy(x_ptr, out_ptr, n, flag, BLOCK: mt.constexpr):
    offs = mt.arange(0, BLOCK)
    acc = mt.zeros((BLOCK,), mt.float32)
    i = 0
    while i < n:
        x = mt.load(x_ptr + i * BLOCK + offs)
        if flag > 0:
            acc = acc + x
        else:
            acc = acc - x * 2.0
        i += 1
    total = 0.0
    for j in range(0, n, 2):
        total += mt.sum(mt.load(x_ptr + j * BLOCK + offs), axis=0)
    mt.store(out_ptr + offs, acc + total)


@mt.kernel
def nested_loops(x_ptr, out_ptr, n, m, BLOCK: mt.constexpr):
    offs = mt.arange(0, BLOCK)
    acc = mt.zeros((BLOCK,), mt.float32)
    for i in range(0, n):
        inner = mt.zeros((BLOCK,), mt.float32)
        for j in range(0, m):
            inner = inner + mt.load(x_ptr + (i * m + j) * BLOCK + offs)
        acc = mt.maximum(acc, inner) + mt.sum(inner, axis=0) * 0.001
    s = mt.sum(acc, axis=0)
    while s > 1.0:  # a loop condition from a reduction: uniform across the CTA
        acc = acc * 0.5
        s = mt.sum(acc, axis=0)
    mt.store(out_ptr + offs, acc)


@mt.kernel
def transposes(x_ptr, t_ptr, r_ptr, c_ptr, R: mt.constexpr, C: mt.constexpr):
    r = mt.arange(0, R)
    c = mt.arange(0, C)
    x = mt.load(x_ptr + r[:, None] * C + c[None, :])
    mt.store(t_ptr + c[:, None] * R + r[None, :], mt.trans(x))  # trans, then a coalesced store
    mt.store(r_ptr + c[:, None] * R + r[None, :], mt.reshape(x, (C, R)) + 1.0)
    mt.store(c_ptr + r[:, None] + c[None, :] * R, x)  # a store contiguous along the other dim: convert_layout


@mt.kernel
def atomics(x_ptr, acc_ptr, old_ptr, n, BLOCK: mt.constexpr):
    offs = mt.program_id(0) * BLOCK + mt.arange(0, BLOCK)
    mask = offs < n
    x = mt.load(x_ptr + offs, mask=mask)
    old = mt.atomic_add(acc_ptr + offs % 7, x, mask=mask)
    mt.store(old_ptr + offs, old, mask=mask)
    mt.atomic_add(acc_ptr + 7, mt.sum(mt.where(mask, x, 0.0), axis=0))


@mt.kernel
def scalars(x_ptr, out_ptr, n):
    v = mt.load(x_ptr + 3)
    s = v * 2
    if n > 5:
        s = s + 1
    mt.store(out_ptr + mt.program_id(0), s)


@mt.kernel
def copy_other(x_ptr, out_ptr, n, BLOCK: mt.constexpr, OTHER: mt.constexpr):
    offs = mt.program_id(0) * BLOCK + mt.arange(0, BLOCK)
    mt.store(out_ptr + offs, mt.load(x_ptr + offs, mask=offs < n, other=OTHER))


@mt.kernel
def column_sums(x_ptr, out_ptr, K: mt.constexpr, V: mt.constexpr):
    """An explicit layout (mt.load(layout=...)): each thread loads a whole column of the [K, V] tile, so the sum
    over axis 0 is a chain inside the thread (no shuffle, no shared memory)."""
    k = mt.arange(0, K)
    v = mt.arange(0, V)
    s = mt.load(x_ptr + k[:, None] * V + v[None, :], layout=mt.blocked([K, 1], [1, 32], [1, 4], [0, 1]))
    mt.store(out_ptr + v, mt.sum(s * s, axis=0))


@mt.kernel
def ordered_programs(x_ptr, part_ptr, sync_ptr, out_ptr, n, BLOCK: mt.constexpr):
    """Programs publishing to each other (what WarpDecode's one-launch kernel does): each sums its block into part,
    then waits for its ticket (program p until p programs went before it: a poll, then an acquire fence), records
    the order it ran in, and passes the ticket on (barrier, release fence, +1). The last to pass it sums every
    part (acquire, .cg reads) and zeroes the sync words. out[0]: the total; out[1 + p]: p's turn (p, whatever
    order the GPU starts the programs in)."""
    pid = mt.program_id(0)
    offs = pid * BLOCK + mt.arange(0, BLOCK)
    mt.store(part_ptr + pid, mt.sum(mt.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0))
    while mt.atomic_add(sync_ptr, 0) < pid:
        pass
    mt.fence("acquire")
    turn = mt.atomic_add(sync_ptr + 1, 1)
    mt.store(out_ptr + 1 + pid, turn.to(mt.float32))
    mt.barrier()
    mt.fence("release")
    mt.atomic_add(sync_ptr, 1)
    if turn == mt.num_programs(0) - 1:
        mt.fence("acquire")
        p = mt.arange(0, 16)
        parts = mt.load(part_ptr + p, mask=p < mt.num_programs(0), other=0.0, cache_modifier=".cg")
        mt.store(out_ptr, mt.sum(parts, axis=0))
        mt.store(sync_ptr + mt.arange(0, 2), mt.zeros((2,), mt.int32))


@mt.kernel
def prefetched_copy(x_ptr, out_ptr, n, BLOCK: mt.constexpr):
    """Prefetches (contiguous runs, one pointer per line, a scalar; L1 and L2) then L2-only loads with the L2's
    256-byte fetch: the values are those of a plain copy."""
    offs = mt.program_id(0) * BLOCK + mt.arange(0, BLOCK)
    mt.prefetch(x_ptr + offs, mask=offs < n)
    lines = mt.program_id(0) * BLOCK + mt.arange(0, BLOCK // 32) * 32
    mt.prefetch(x_ptr + lines, mask=lines < n, level="L2")
    mt.prefetch(x_ptr)
    mt.store(out_ptr + offs, mt.load(x_ptr + offs, mask=offs < n, other=0.0, cache_modifier=".cg", l2_prefetch=256))


# ----------------------------------------------------------------------------------------------- cases


@dataclass
class Case:
    """One kernel: how to make it, its grid, fresh inputs, which arguments are outputs and how close they must be
    to the interpreter's (simulated PTX; on the GPU), and PTX patterns that must appear."""

    make: Callable[[], Any]
    grid: tuple[int, ...]
    args: Callable[[torch.Generator], list[Any]]
    outputs: list[int]
    bound: float = 0.0
    gpu_bound: float = 1e-5
    expect: list[str] = field(default_factory=list)


def _randn(g: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def _names(text: str) -> list[str]:
    return text.split(",")


MM = _names("a_ptr,b_ptr,c_ptr,bias_ptr,M,N,K,stride_am,stride_ak,stride_bk,stride_bn,stride_cm,stride_cn")


def _matmul_case(dtype: ScalarType, tdtype: torch.dtype, blocks: tuple[int, int, int], mnk: tuple[int, int, int],
                 activation: str) -> Case:
    bm, bn, bk = blocks
    m, n, k = mnk
    types = {a: P(dtype) if a.endswith("ptr") else i32 for a in MM}
    make = dsl(matmul.matmul_kernel, types, {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                                             "HAS_BIAS": activation != "none", "ACTIVATION": activation},
               {a: 16 for a in MM if a.endswith("ptr")})
    return Case(make, ((m + bm - 1) // bm, (n + bn - 1) // bn),
                lambda g: [_randn(g, m, k, dtype=tdtype), _randn(g, k, n, dtype=tdtype), nan_like((m, n), tdtype),
                           _randn(g, n, dtype=tdtype), m, n, k, k, 1, n, 1, n, 1],
                [2], bound=1e-5 if dtype == f32 else 8e-3, gpu_bound=1e-4 if dtype == f32 else 8e-3,
                expect=[r"fma\.rn\.f32" if dtype == f32 else r"mma\.sync\.aligned\.m16n8k16", r"bar\.sync 0",
                        r"\$L_for_head", r"@%p\d+ bra"])


def _vadd(dtype: ScalarType, tdtype: torch.dtype, n: int, n_div: int, expect: list[str]) -> Case:
    types = {"x_ptr": P(dtype), "y_ptr": P(dtype), "out_ptr": P(dtype), "n": i32}
    make = dsl(vector_add.add_kernel, types, {"BLOCK": 1024}, {"x_ptr": 16, "y_ptr": 16, "out_ptr": 16, "n": n_div})
    return Case(make, ((n + 1023) // 1024,), lambda g: [_randn(g, n, dtype=tdtype), _randn(g, n, dtype=tdtype),
                                                        nan_like((n,), tdtype), n], [2], expect=expect)


CASES: dict[str, Case] = {
    "vadd_f32_aligned": _vadd(f32, torch.float32, 4096, 16, [r"@%p\d+ ld\.global\.v4\.b32", r"st\.global\.v4\.b32",
                                                             r"add\.f32", r"mad\.wide\.s32"]),
    "vadd_f32_masked_tail": _vadd(f32, torch.float32, 1000, 1, [r"@%p\d+ ld\.global\.b32", r"@%p\d+ st\.global\.b32"]),
    "vadd_bf16": _vadd(bf16, torch.bfloat16, 4096, 16, [r"ld\.global\.v4\.b32", r"mov\.b32 \{%h\d+, %h\d+\}, %r\d+",
                                                        r"add\.rn\.bf16x2",  # packed pairs (HADD2.BF16)
                                                        r"mov\.b32 %r\d+, \{%h\d+, %h\d+\}", r"st\.global\.v4\.b32"]),
    "row_softmax": Case(dsl(row_softmax, {"x_ptr": P(f32), "out_ptr": P(f32), "stride": i32}, {"R": 16, "C": 128},
                            {"x_ptr": 16, "out_ptr": 16, "stride": 16}),
                        (1,), lambda g: [_randn(g, 16, 128, scale=3), nan_like((16, 128), torch.float32), 128], [1],
                        bound=1e-5, gpu_bound=1e-5,
                        expect=[r"ld\.global\.v4\.b32", r"shfl\.sync\.bfly\.b32", r"max\.f32", r"ex2\.approx\.ftz\.f32",
                                r"div\.rn\.f32"]),
    "broadcast_2d": Case(dsl(broadcast_2d, {"x_ptr": P(f32), "bias_ptr": P(f32), "out_ptr": P(f32), "n_rows": i32,
                                            "stride": i32}, {"R": 8, "C": 64},
                             {"x_ptr": 16, "bias_ptr": 16, "out_ptr": 16, "stride": 16}),
                         (3,), lambda g: [_randn(g, 20, 64), _randn(g, 64), nan_like((20, 64), torch.float32), 20, 64],
                         [2], expect=[r"ld\.global\.v4\.b32", r"st\.global\.v4\.b32"]),
    "scan_2d": Case(dsl(scan_2d, {"x_ptr": P(f32), "out0_ptr": P(f32), "out1_ptr": P(f32)}, {"R": 32, "C": 64},
                        {"x_ptr": 16, "out0_ptr": 16, "out1_ptr": 16}),
                    (1,), lambda g: [_randn(g, 32, 64), nan_like((32, 64), torch.float32),
                                     nan_like((32, 64), torch.float32)], [1, 2], bound=1e-5,
                    expect=[r"shfl\.sync\.up\.b32", r"shfl\.sync\.idx\.b32", r"bar\.sync 0", r"st\.shared",
                            r"ld\.shared"]),
    "reduce_all_8_warps": Case(dsl(reduce_all, {"x_ptr": P(f32), "sum0_ptr": P(f32), "max1_ptr": P(f32),
                                                "min_ptr": P(f32)}, {"R": 128, "C": 32}, {"x_ptr": 16}, num_warps=8),
                               (1,), lambda g: [_randn(g, 128, 32), nan_like((32,), torch.float32),
                                                nan_like((128,), torch.float32), nan_like((1,), torch.float32)],
                               [1, 2, 3], bound=1e-5, expect=[r"shfl\.sync\.bfly\.b32", r"bar\.sync 0"]),
    "reduce_replicated": Case(dsl(reduce_all, {"x_ptr": P(f32), "sum0_ptr": P(f32), "max1_ptr": P(f32),
                                               "min_ptr": P(f32)}, {"R": 2, "C": 8}),
                              (1,), lambda g: [_randn(g, 2, 8), nan_like((8,), torch.float32),
                                               nan_like((2,), torch.float32), nan_like((1,), torch.float32)],
                              [1, 2, 3], bound=1e-6),
    "dot_f32": Case(dsl(dot_tile, {"a_ptr": P(f32), "b_ptr": P(f32), "c_ptr": P(f32)},
                        {"M": 32, "N": 32, "K": 32, "PRECISION": "ieee"}, {"a_ptr": 16, "b_ptr": 16, "c_ptr": 16}),
                    (1,), lambda g: [_randn(g, 32, 32), _randn(g, 32, 32), nan_like((32, 32), torch.float32)],
                    [2], bound=1e-5, gpu_bound=1e-5,
                    expect=[r"fma\.rn\.f32", r"ld\.shared\.f32", r"st\.shared\.b32", r"bar\.sync 0"]),
    "dot_bf16": Case(dsl(dot_tile, {"a_ptr": P(bf16), "b_ptr": P(bf16), "c_ptr": P(f32)},
                         {"M": 32, "N": 32, "K": 32, "PRECISION": "ieee"}, {"a_ptr": 16, "b_ptr": 16, "c_ptr": 16}),
                     (1,), lambda g: [_randn(g, 32, 32, dtype=torch.bfloat16), _randn(g, 32, 32, dtype=torch.bfloat16),
                                      nan_like((32, 32), torch.float32)], [2], bound=1e-5, gpu_bound=1e-5,
                     expect=[r"ldmatrix\.sync\.aligned\.m8n8\.x4", r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16"]),
    "dot_tf32": Case(dsl(dot_tile, {"a_ptr": P(f32), "b_ptr": P(f32), "c_ptr": P(f32)},
                         {"M": 16, "N": 64, "K": 16, "PRECISION": "tf32"}, {"a_ptr": 16, "b_ptr": 16, "c_ptr": 16},
                         num_warps=2),
                     (1,), lambda g: [_randn(g, 16, 16), _randn(g, 16, 64), nan_like((16, 64), torch.float32)],
                     [2], bound=1e-5, gpu_bound=1e-5, expect=[r"cvt\.rn\.tf32\.f32"]),
    "matmul_f32_kloop_gelu": _matmul_case(f32, torch.float32, (32, 32, 16), (40, 50, 70), "gelu"),
    "matmul_bf16_kloop": _matmul_case(bf16, torch.bfloat16, (32, 32, 32), (64, 40, 96), "none"),
    "while_if_for": Case(dsl(branchy, {"x_ptr": P(f32), "out_ptr": P(f32), "n": i32, "flag": i32}, {"BLOCK": 128},
                             {"x_ptr": 16, "out_ptr": 16}),
                         (1,), lambda g: [_randn(g, 5, 128), nan_like((128,), torch.float32), 5,
                                          int(torch.randint(0, 2, (1,), generator=g)) * 2 - 1], [1], bound=1e-6,
                         expect=[r"\$L_while_head", r"\$L_else", r"\$L_for_head", r"bra\.uni"]),
    "nested_loops": Case(dsl(nested_loops, {"x_ptr": P(f32), "out_ptr": P(f32), "n": i32, "m": i32}, {"BLOCK": 256},
                             {"x_ptr": 16, "out_ptr": 16}),
                         (1,), lambda g: [torch.rand(12, 256, generator=g) + 0.5, nan_like((256,), torch.float32), 3, 4],
                         [1], bound=1e-6, expect=[r"\$L_while_head"]),
    "transposes": Case(dsl(transposes, {"x_ptr": P(f32), "t_ptr": P(f32), "r_ptr": P(f32), "c_ptr": P(f32)},
                           {"R": 32, "C": 64}, {"x_ptr": 16, "t_ptr": 16, "r_ptr": 16, "c_ptr": 16}),
                       (1,), lambda g: [_randn(g, 32, 64)] + [nan_like((64, 32), torch.float32) for _ in range(3)],
                       [1, 2, 3], expect=[r"st\.shared\.b32", r"ld\.shared\.b32"]),
    "atomics": Case(dsl(atomics, {"x_ptr": P(f32), "acc_ptr": P(f32), "old_ptr": P(f32), "n": i32}, {"BLOCK": 64},
                        {"x_ptr": 16, "acc_ptr": 16, "old_ptr": 16}),
                    (5,), lambda g: [_randn(g, 300), torch.zeros(8), nan_like((300,), torch.float32), 300], [1],
                    bound=1e-5, gpu_bound=1e-5, expect=[r"atom\.global\.add\.f32"]),
    "column_sums": Case(dsl(column_sums, {"x_ptr": P(f32), "out_ptr": P(f32)}, {"K": 16, "V": 128}, {"x_ptr": 16}),
                        (1,), lambda g: [_randn(g, 16 * 128), nan_like((128,), torch.float32)], [1], bound=1e-5,
                        gpu_bound=1e-5, expect=[r"ld\.global\.b32"]),
    "ordered_programs": Case(dsl(ordered_programs, {"x_ptr": P(f32), "part_ptr": P(f32), "sync_ptr": P(i32),
                                                    "out_ptr": P(f32), "n": i32}, {"BLOCK": 128}, {"x_ptr": 16}),
                             (6,), lambda g: [_randn(g, 700), nan_like((6,), torch.float32),
                                              torch.zeros(2, dtype=torch.int32), nan_like((7,), torch.float32), 700],
                             [3, 2], bound=1e-5, gpu_bound=1e-5,
                             expect=[r"fence\.acquire\.gpu;", r"fence\.release\.gpu;", r"atom\.global\.add\.s32"]),
    "prefetch_cg": Case(dsl(prefetched_copy, {"x_ptr": P(f32), "out_ptr": P(f32), "n": i32}, {"BLOCK": 1024},
                            {"x_ptr": 16, "out_ptr": 16, "n": 16}),
                        (3,), lambda g: [_randn(g, 2500), nan_like((3072,), torch.float32), 2496], [1],
                        expect=[r"@%p\d+ prefetch\.global\.L1 \[%rd\d+\];", r"@%p\d+ prefetch\.global\.L2",
                                r"ld\.global\.cg\.L2::256B\.v4\.b32"]),
    "scalars": Case(dsl(scalars, {"x_ptr": P(f32), "out_ptr": P(f32), "n": i32}),
                    (4,), lambda g: [_randn(g, 8), nan_like((4,), torch.float32),
                                     int(torch.randint(0, 10, (1,), generator=g))], [1],
                    expect=[r"%ctaid\.x", r"setp\.eq\.u32 %p\d+, %r\d+, 0"]),
    "softmax_example": Case(dsl(softmax.softmax_kernel, {"x_ptr": P(bf16), "out_ptr": P(bf16), "n_cols": i32,
                                                         "stride_x": i32, "stride_out": i32},
                                {"BLOCK": 256, "ONE_BLOCK": False}, {"x_ptr": 16, "out_ptr": 16}),
                            (3,), lambda g: [_randn(g, 3, 600, dtype=torch.bfloat16, scale=3),
                                             nan_like((3, 600), torch.bfloat16), 600, 600, 600], [1],
                            bound=8e-3, gpu_bound=8e-3),
    "rmsnorm_example": Case(dsl(rmsnorm.rmsnorm_kernel, {"x_ptr": P(bf16), "res_ptr": P(bf16), "w_ptr": P(bf16),
                                                         "out_ptr": P(bf16), "res_out_ptr": P(bf16), "n_cols": i32,
                                                         "eps": f32}, {"BLOCK": 512, "HAS_RESIDUAL": True},
                                {a: 16 for a in ("x_ptr", "res_ptr", "w_ptr", "out_ptr", "res_out_ptr")}),
                            (2,), lambda g: [_randn(g, 2, 500, dtype=torch.bfloat16),
                                             _randn(g, 2, 500, dtype=torch.bfloat16),
                                             _randn(g, 500, dtype=torch.bfloat16),
                                             nan_like((2, 500), torch.bfloat16), nan_like((2, 500), torch.bfloat16),
                                             500, 1e-6], [3, 4], bound=8e-3, gpu_bound=8e-3,
                            expect=[r"rsqrt\.approx\.f32"]),
    "cumsum_example": Case(dsl(cumsum.cumsum_kernel, {"x_ptr": P(f32), "out_ptr": P(f32), "n_cols": i32},
                               {"BLOCK": 256}, {"x_ptr": 16, "out_ptr": 16}),
                           (2,), lambda g: [_randn(g, 2, 700), nan_like((2, 700), torch.float32), 700], [1],
                           bound=1e-5, gpu_bound=1e-5),
    "attention_example": Case(dsl(attention.attention_kernel, {"q_ptr": P(bf16), "k_ptr": P(bf16), "v_ptr": P(bf16),
                                                               "o_ptr": P(bf16), "seq_len": i32, "sm_scale": f32},
                                  {"HEAD_DIM": 32, "BLOCK_M": 32, "BLOCK_N": 16},
                                  {"q_ptr": 16, "k_ptr": 16, "v_ptr": 16, "o_ptr": 16}),
                              (2, 1), lambda g: [_randn(g, 1, 50, 32, dtype=torch.bfloat16) for _ in range(3)]
                              + [nan_like((1, 50, 32), torch.bfloat16), 50, 32 ** -0.5], [3],
                              bound=8e-3, gpu_bound=8e-3),
}
for _t, _other in [("i1", True), ("i8", -3), ("ui8", 200), ("i16", -300), ("i64", -2 ** 40), ("f16", 1.5),
                   ("f64", 0.1)]:
    CASES[f"copy_{_t}"] = Case(
        dsl(copy_other, {"x_ptr": P(T[_t]), "out_ptr": P(T[_t]), "n": i32}, {"BLOCK": 1024, "OTHER": _other},
            {"x_ptr": 16, "out_ptr": 16, "n": 16}),
        (2,), (lambda t: lambda g: [(torch.rand(2000, generator=g) < 0.5) if t == "i1" else
                                    _randn(g, 2000, scale=100).to(TORCH[t]), nan_like((2048,), TORCH[t]), 2000])(_t),
        [1])


@needs_ptxas
@pytest.mark.parametrize("name", list(CASES))
def test_ptxas_accepts_and_the_instructions_are_there(name: str) -> None:
    case = CASES[name]
    ptx, _, _ = lower(case.make)
    assemble(ptx)
    for pattern in case.expect:
        assert re.search(pattern, ptx), f"{pattern!r} not in the PTX of {name}"


@pytest.mark.parametrize("name", list(CASES))
def test_simulated_ptx_matches_the_interpreter(name: str, gen: torch.Generator) -> None:
    case = CASES[name]
    args = case.args(gen)
    want = run_interpreted(case.make, case.grid, args)
    got = run_simulated(case.make, case.grid, args)
    for i in case.outputs:
        if case.bound == 0.0:
            assert torch.equal(got[i], want[i]), f"output {i} differs"
        else:
            assert rel_err(got[i], want[i]) <= case.bound, f"output {i}: rel err {rel_err(got[i], want[i])}"


def test_vector_add_ptx_text() -> None:
    """The whole shape of a small kernel's PTX: header, parameters, .loc into this kernel's source, 16-byte
    vector loads and stores under the mask."""
    ptx, name, threads = lower(CASES["vadd_f32_aligned"].make)
    assert ptx.startswith("// Generated by MiniTriton") and "\n.version 8.0\n.target sm_90a\n.address_size 64\n" in ptx
    assert re.search(r'\.file 1 ".*vector_add\.py"', ptx)
    assert re.search(r"\.visible \.entry add_kernel\(\n  \.param \.u64 add_kernel_param_0,\n"
                     r"  \.param \.u64 add_kernel_param_1,\n  \.param \.u64 add_kernel_param_2,\n"
                     r"  \.param \.u32 add_kernel_param_3\n\)\n\.maxntid 128, 1, 1\n\{", ptx)
    assert "cvta.to.global.u64" in ptx and re.search(r"mov\.u32 %r\d+, %tid\.x;", ptx)
    source = Path(vector_add.__file__).read_text().splitlines()
    locs = {int(n) for n in re.findall(r"\.loc 1 (\d+) \d+", ptx)}
    assert any("mt.load" in source[n - 1] for n in locs) and any("mt.store" in source[n - 1] for n in locs)
    assert len(re.findall(r"ld\.global\.v4\.b32", ptx)) == 4  # 2 inputs x 2 runs of 4 per thread (1024 / 128)
    assert len(re.findall(r"st\.global\.v4\.b32", ptx)) == 2
    assert threads == 128


# ------------------------------------------------------------------------------------ elementwise ops


def random_values(t: ScalarType, n: int, g: torch.Generator) -> torch.Tensor:
    """Values of type t: ordinary and edge values (0, +-1, extremes; floats also inf, NaN, -0.0, huge / tiny)."""
    if t.is_bool:
        return torch.rand(n, generator=g) < 0.5
    if t.is_float:
        x = torch.randn(n, generator=g, dtype=torch.float64) * torch.exp2(
            torch.randint(-6, 10, (n,), generator=g).double())
        x[:10] = torch.tensor([0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan"), 0.5, 2.5, -2.5])
        return x.to(TORCH[t.name])
    info = torch.iinfo(TORCH[t.name])
    lo, hi = max(int(info.min), -2 ** 62), min(int(info.max), 2 ** 62)
    small = torch.randint(-40 if lo < 0 else 0, 40, (n,), generator=g)
    wide = torch.randint(lo, hi, (n,), generator=g)
    x = torch.where(torch.rand(n, generator=g) < 0.5, small, wide)
    x[:4] = torch.tensor([0, 1, hi, lo])
    return x.to(TORCH[t.name])


def run_elementwise(in_types: list[str], ops: list[tuple[str, list[int], str, dict]], g: torch.Generator,
                    inputs: list[torch.Tensor] | None = None, n: int = 256) -> tuple[list[Any], list[Any], str]:
    make = elementwise_kernel([T[t] for t in in_types], [(o, i, T[r], a) for o, i, r, a in ops], n=n)
    ptx, _, _ = lower(make)
    assemble(ptx)
    ins = inputs if inputs is not None else [random_values(T[t], n, g) for t in in_types]
    args = ins + [nan_like((n,), TORCH[r]) for _, _, r, _ in ops]
    return run_interpreted(make, (1,), args)[len(ins):], run_simulated(make, (1,), args)[len(ins):], ptx


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point:
        a, b = a.double(), b.double()
        return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
    return torch.equal(a, b)


CMPS = ["eq", "ne", "lt", "le", "gt", "ge"]


@pytest.mark.parametrize("t", INTS + ["i1"])
def test_integer_ops_match_the_interpreter_exactly(t: str, gen: torch.Generator) -> None:
    names = ["mt.add", "mt.sub", "mt.mul", "mt.maximum", "mt.minimum", "mt.and", "mt.or", "mt.xor", "mt.shl",
             "mt.shr"] + ([] if t == "i1" else ["mt.div", "mt.rem"])
    ops = [(o, [0, 1], t, {}) for o in names] + [(o, [0], t, {}) for o in ("mt.neg", "mt.not", "mt.abs")]
    ops += [("mt.cmp", [0, 1], "i1", {"predicate": p}) for p in CMPS] + [("mt.select", [2, 0, 1], t, {})]
    a, b = random_values(T[t], 256, gen), random_values(T[t], 256, gen)
    if t != "i1":  # no division by zero, nor MIN / -1 (both undefined)
        wide = b.to(torch.int64)  # torch has no where() for uint16/32/64 on the CPU
        b = torch.where((wide == 0) | (wide == -1), torch.full_like(wide, 3), wide).to(b.dtype)
    want, got, ptx = run_elementwise([t, t, "i1"], ops, gen, [a, b, random_values(T["i1"], 256, gen)])
    for (name, _, _, attrs), w, g_ in zip(ops, want, got):
        assert same_values(g_, w), f"{name} {attrs} on {t}"
    if t in ("i32", "ui32"):
        kind = "s" if t == "i32" else "u"
        for instr in (f"div.{kind}32", f"rem.{kind}32", f"shr.{kind}32", "shl.b32", f"setp.lt.{kind}32", "selp.b32"):
            assert instr in ptx


@pytest.mark.parametrize("t", FLOATS)
def test_float_arithmetic_matches_the_interpreter_exactly(t: str, gen: torch.Generator) -> None:
    names = ["mt.add", "mt.sub", "mt.mul", "mt.div", "mt.rem", "mt.maximum", "mt.minimum"]
    ops = [(o, [0, 1], t, {}) for o in names]
    ops += [(o, [0], t, {}) for o in ("mt.neg", "mt.abs", "mt.floor", "mt.ceil", "mt.sqrt")]
    ops += [("mt.cmp", [0, 1], "i1", {"predicate": p}) for p in CMPS] + [("mt.select", [3, 0, 1], t, {})]
    if t != "f64":  # the interpreter's f64 fma rounds twice (documented); PTX fma.rn.f64 is fused
        ops.append(("mt.fma", [0, 1, 2], t, {}))
    want, got, ptx = run_elementwise([t, t, t, "i1"], ops, gen)
    for (name, _, _, attrs), w, g_ in zip(ops, want, got):
        assert same_values(g_, w), f"{name} {attrs} on {t}"
    if t == "f32":
        for instr in ("add.f32", "div.rn.f32", "max.f32", "sqrt.rn.f32", "setp.neu.f32", "cvt.rmi.f32.f32"):
            assert instr in ptx
        # f32 add / sub / mul carry no rounding modifier so ptxas may contract them into fma (codegen/elementwise.py)
        assert "mul.f32" in ptx and "sub.f32" in ptx and "mul.rn.f32" not in ptx
    if t == "f64":  # f64 stays exact: never contracted
        assert "add.rn.f64" in ptx and "mul.rn.f64" in ptx


@pytest.mark.parametrize("t", ["bf16", "f16"])
def test_packed_half_pairs_match_the_interpreter_exactly(t: str, gen: torch.Generator) -> None:
    """add / sub / mul on 16-bit floats run as packed pairs (`mul.rn.bf16x2`, ...): bit-equal to the interpreter's
    f32 route, over ordinary values and the edges: subnormal results, overflow to inf, inf - inf, NaN, -0.0."""
    n = 1024
    tiny, huge = (1e-39, 1e38) if t == "bf16" else (1e-6, 3e4)  # around the subnormal range / the overflow
    x = random_values(T[t], n, gen).double()
    y = random_values(T[t], n, gen).double()
    x[100:300] = torch.randn(200, generator=gen, dtype=torch.float64) * tiny
    y[200:400] = torch.randn(200, generator=gen, dtype=torch.float64) * huge
    x[400:420] = float("inf")
    y[410:420] = float("inf")
    ops = [(o, [0, 1], t, {}) for o in ("mt.add", "mt.sub", "mt.mul")]
    want, got, ptx = run_elementwise([t, t], ops, gen, [x.to(TORCH[t]), y.to(TORCH[t])], n=n)
    for (name, _, _, _), w, g_ in zip(ops, want, got):
        assert same_values(g_, w), f"{name} on {t}"
    for instr in ("add", "sub", "mul"):
        assert f"{instr}.rn.{t}x2" in ptx


@pytest.mark.parametrize("src", INTS + FLOATS + ["i1"])
def test_casts_match_the_interpreter_exactly(src: str, gen: torch.Generator) -> None:
    dsts = INTS + FLOATS + ["i1"]
    x = random_values(T[src], 256, gen)
    if T[src].is_float:  # values around the integer ranges' edges, to check saturation and NaN -> 0
        edges = torch.tensor([127.9, -128.9, 255.5, 256.0, 32767.5, -32768.5, 65535.9, 2.0 ** 31, -2.0 ** 31 - 1e3,
                              2.0 ** 32 + 1e4, 2.0 ** 63, -2.0 ** 64, 1e30, -1e30], dtype=torch.float64)
        x[10:10 + len(edges)] = edges.to(TORCH[src])
    want, got, ptx = run_elementwise([src], [("mt.cast", [0], d, {}) for d in dsts], gen, [x])
    for d, w, g_ in zip(dsts, want, got):
        assert same_values(g_, w), f"cast {src} -> {d}"
    if src == "f32":
        assert "cvt.rzi.s32.f32" in ptx and "cvt.rn.bf16.f32" in ptx and "cvt.rzi.u64.f32" in ptx
    if src == "i32":
        assert "cvt.rn.f32.s32" in ptx and "cvt.s64.s32" in ptx


@pytest.mark.parametrize("t", ["f32", "bf16", "f16"])
def test_math_functions_match_the_interpreter(t: str, gen: torch.Generator) -> None:
    """The simulator evaluates ex2.approx & co. exactly, so what is checked is each formula (exp = ex2(x log2 e),
    sigmoid, erf's polynomial, pow's sign rules, sin / cos range reduction): relative error <= 2e-6 for f32
    (sin / cos: absolute 2e-6), one bf16 / f16 rounding otherwise."""
    n = 256
    x = (torch.randn(n, generator=gen, dtype=torch.float64) * 4).to(TORCH[t])
    pos = (torch.rand(n, generator=gen, dtype=torch.float64) * 20 + 1e-3).to(TORCH[t])
    expo = (torch.randn(n, generator=gen, dtype=torch.float64) * 2).to(TORCH[t])
    expo[:64] = torch.randint(-4, 5, (64,), generator=gen).to(TORCH[t])  # integer powers of negative bases
    base = torch.where(torch.arange(n) % 3 == 0, -pos, pos)
    base[:4] = torch.tensor([0.0, 1.0, -1.0, 2.0]).to(TORCH[t])
    unary = ["mt.exp", "mt.exp2", "mt.sigmoid", "mt.tanh", "mt.sin", "mt.cos", "mt.erf"]
    positive = ["mt.log", "mt.log2", "mt.sqrt", "mt.rsqrt"]
    ops = [(o, [0], t, {}) for o in unary] + [(o, [1], t, {}) for o in positive] + [("mt.pow", [2, 3], t, {})]
    want, got, ptx = run_elementwise([t, t, t, t], ops, gen, [x, pos, base.clamp(-8, 8), expo])
    for (name, _, _, _), w, g_ in zip(ops, want, got):
        w64, g64 = w.double(), g_.double()
        both_special = (torch.isnan(w64) & torch.isnan(g64)) | (torch.isinf(w64) & (w64 == g64))
        scale = torch.ones_like(w64) if name in ("mt.sin", "mt.cos") else w64.abs().clamp_min(1e-30)
        err = (g64 - w64).abs() / scale
        err = torch.where(both_special, torch.zeros_like(err), err)
        bound = 2e-6 if t == "f32" else (2 ** -7 if t == "bf16" else 2 ** -10)
        assert err.max().item() <= bound, f"{name} on {t}: max error {err.max().item()}"
    if t == "f32":
        for instr in ("ex2.approx.ftz.f32", "lg2.approx.f32", "rsqrt.approx.f32", "tanh.approx.f32",
                      "sin.approx.f32", "cos.approx.f32", "rcp.rn.f32", "sqrt.rn.f32"):
            assert instr in ptx, instr


def test_f64_transcendentals_are_refused_clearly() -> None:
    make = elementwise_kernel([T["f64"]], [("mt.exp", [0], T["f64"], {})])
    with pytest.raises(mt.CompilationError, match="mt.exp on f64 is not supported"):
        lower(make)


# -------------------------------------------------------------------------------------- shared memory


@pytest.mark.parametrize("limit", [2048, 4096])
def test_big_tiles_go_through_shared_memory_in_rounds(limit: int, gen: torch.Generator,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With a small shared-memory budget the dot splits K into chunks and transposes go in rounds; the results
    must not change."""
    monkeypatch.setattr(codegen_context, "SMEM_LIMIT", limit)
    for name in ("dot_f32", "transposes"):
        case = CASES[name]
        ptx, _, _ = lower(case.make)
        assert re.search(r"\.shared \.align 16 \.b8 smem\[(\d+)\]", ptx)
        assert int(re.search(r"smem\[(\d+)\]", ptx).group(1)) <= limit  # type: ignore[union-attr]
        assemble(ptx)
        args = case.args(gen)
        want, got = run_interpreted(case.make, case.grid, args), run_simulated(case.make, case.grid, args, ptx)
        for i in case.outputs:
            assert rel_err(got[i], want[i]) <= 1e-5, f"{name} output {i}"


# ------------------------------------------------------------------------------------- ptxas reporting


@needs_ptxas
def test_ptxas_report_and_error_point_at_the_kernel_source() -> None:
    report = run_ptxas(lower(CASES["scan_2d"].make)[0])  # its warps exchange totals through shared memory
    assert report.registers > 0 and report.smem > 0 and report.spill_stores == 0 and len(report.cubin) > 1000
    ptx, _, _ = lower(CASES["row_softmax"].make)
    cubin, log = run_ptxas(ptx)  # the unpacked form minitriton/compiler.py uses
    assert cubin[:4] == b"\x7fELF" and "Used" in log
    broken = ptx.replace("ex2.approx.ftz.f32", "ex2.bogus.f32", 1)
    with pytest.raises(PtxasError) as info:
        run_ptxas(broken)
    err = info.value
    assert "ex2.bogus.f32" in err.ptx_line and "ex2.bogus.f32" in str(err)
    assert err.loc is not None and err.loc.file.endswith("test_ptx.py")
    source = Path(__file__).read_text().splitlines()[err.loc.line - 1]
    assert "mt.exp" in source, f"the error points at {source!r}"


# ---------------------------------------------------------------------------------- the simulator itself


SIM_HEADER = """.version 8.0
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 k_param_0)
{
  .reg .pred %p<4>; .reg .b32 %r<8>; .reg .b64 %rd<4>;
  .shared .align 16 .b8 smem[512];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, smem;
  ld.param.u64 %rd1, [k_param_0];
  cvta.to.global.u64 %rd2, %rd1;
"""


@pytest.mark.parametrize("body, message", [
    ("mad.lo.u32 %r3, %r1, 4, %r2;\n  st.shared.b32 [%r3], %r1;\n  ld.shared.b32 %r4, [%r3+4];",
     "shared-memory race"),  # reads a neighbour's value without bar.sync
    ("mad.lo.u32 %r3, %r1, 4, %r2;\n  st.shared.b32 [%r3], %r1;\n  bar.sync 0;\n  ld.shared.b32 %r4, [%r3+4];\n"
     "  st.shared.b32 [%r3], %r4;", "shared-memory race"),  # overwrites a value a neighbour may not have read yet
    ("setp.lt.u32 %p1, %r1, 5;\n  @%p1 bra $L_x;\n$L_x:", "divergent branch"),
    ("mul.wide.u32 %rd3, %r1, 4;", "mul.wide is not emitted"),
    ("add.u32 %r5, %r6, 1;", "read before any write"),
    ("mad.wide.u32 %rd3, %r1, 4, %rd2;\n  ld.global.b32 %r3, [%rd3+4];", "outside every tensor"),
    ("mad.wide.u32 %rd3, %r1, 2, %rd2;\n  ld.global.b32 %r3, [%rd3];", "misaligned"),
    ("mad.wide.u32 %rd3, %r1, 4, %rd2;\n  prefetch.global.L1 [%rd3+4];", "outside every tensor"),
])
def test_the_simulator_catches_what_the_codegen_must_never_do(body: str, message: str) -> None:
    ptx = SIM_HEADER + "  " + body + "\n  ret;\n}\n"
    with pytest.raises(SimError, match=message):
        run_ptx(ptx, "k", (1,), [torch.zeros(32, dtype=torch.int32)], 32)


# ------------------------------------------------------------------------------------------ on the GPU


def _cuda() -> bool:
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", list(CASES))
def test_gpu_matches_the_interpreter(name: str, gen: torch.Generator) -> None:
    """The PTX launched through the driver (cuModuleLoadData + cuLaunchKernel) against the interpreter."""
    case = CASES[name]
    ptx, kernel_name, threads = lower(case.make)
    args = case.args(gen)
    want = run_interpreted(case.make, case.grid, args)
    got = launch_on_gpu(ptx, kernel_name, case.grid, args, threads)
    for i in case.outputs:
        if case.bound == 0.0:
            assert torch.equal(got[i], want[i]), f"output {i} differs"
        else:
            assert rel_err(got[i], want[i]) <= case.gpu_bound, f"output {i}: rel err {rel_err(got[i], want[i])}"


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("src", INTS + FLOATS + ["i1"])
def test_gpu_casts_and_integer_ops(src: str, gen: torch.Generator) -> None:
    """Casts from `src` to every type, and (for integers) every integer op, on the GPU against the interpreter."""
    dsts = INTS + FLOATS + ["i1"]
    ops = [("mt.cast", [0], d, {}) for d in dsts]
    if src in INTS:
        ops += [(o, [0, 1], src, {}) for o in ("mt.add", "mt.sub", "mt.mul", "mt.div", "mt.rem", "mt.shl", "mt.shr",
                                               "mt.maximum", "mt.minimum", "mt.and", "mt.or", "mt.xor")]
    make = elementwise_kernel([T[src], T[src]], [(o, i, T[r], a) for o, i, r, a in ops])
    a, b = random_values(T[src], 256, gen), random_values(T[src], 256, gen)
    if src in INTS:
        wide = b.to(torch.int64)  # torch has no where() for uint16/32/64 on the CPU
        b = torch.where((wide == 0) | (wide == -1), torch.full_like(wide, 3), wide).to(b.dtype)
    args = [a, b] + [nan_like((256,), TORCH[r]) for _, _, r, _ in ops]
    ptx, kernel_name, threads = lower(make)
    want = run_interpreted(make, (1,), args)
    got = launch_on_gpu(ptx, kernel_name, (1,), args, threads)
    for j, (name, _, r, _) in enumerate(ops):
        assert same_values(got[2 + j], want[2 + j]), f"{name} {src} -> {r}"


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("t", ["f32", "bf16"])
def test_gpu_math_within_the_documented_error(t: str, gen: torch.Generator) -> None:
    """Hardware approximations: ex2 / lg2 / rsqrt about 2 ulp, tanh.approx 2^-11 relative, sin / cos 1e-6
    absolute after range reduction; f32 bounds 2e-6 relative (tanh 1e-3, sin / cos 4e-6 absolute)."""
    n = 256
    x = (torch.randn(n, generator=gen, dtype=torch.float64) * 4).to(TORCH[t])
    pos = (torch.rand(n, generator=gen, dtype=torch.float64) * 20 + 1e-3).to(TORCH[t])
    ops = [(o, [0], T[t], {}) for o in ("mt.exp", "mt.exp2", "mt.sigmoid", "mt.tanh", "mt.sin", "mt.cos", "mt.erf")]
    ops += [(o, [1], T[t], {}) for o in ("mt.log", "mt.log2", "mt.sqrt", "mt.rsqrt")]
    make = elementwise_kernel([T[t], T[t]], ops)
    args = [x, pos] + [nan_like((n,), TORCH[t]) for _ in ops]
    ptx, kernel_name, threads = lower(make)
    want = run_interpreted(make, (1,), args)
    got = launch_on_gpu(ptx, kernel_name, (1,), args, threads)
    for j, (name, _, _, _) in enumerate(ops):
        w, g_ = want[2 + j].double(), got[2 + j].double()
        absolute = name in ("mt.sin", "mt.cos", "mt.log", "mt.log2")
        err = ((g_ - w).abs() / (1.0 if absolute else w.abs().clamp_min(1e-30))).max().item()
        bound = {"mt.tanh": 1e-3, "mt.sin": 4e-6, "mt.cos": 4e-6}.get(name, 2e-6) if t == "f32" else 2 ** -7
        assert err <= bound, f"{name} on {t}: {err}"


# --------------------------------------------------------------------- vector shared-memory exchanges


def test_prefetches_come_one_per_line_of_each_thread_run() -> None:
    """`prefetched_copy` on 4 warps: 1024 contiguous f32 (16-byte aligned) are runs of 32 (one line's worth) in one
    warp's lanes, each prefetched at its first and last element (its start is not known line-aligned, so it may
    touch two lines); 32 pointers one line apart are one per lane; the scalar pointer is one prefetch by thread 0.
    Replicated copies (the other warps) are predicated off by the owner test."""
    ptx, _, _ = lower(dsl(prefetched_copy, {"x_ptr": P(f32), "out_ptr": P(f32), "n": i32}, {"BLOCK": 1024},
                          {"x_ptr": 16, "out_ptr": 16, "n": 16}))
    l1 = re.findall(r"(@%p\d+ )?prefetch\.global\.L1 \[(%rd\d+)\];", ptx)
    l2 = re.findall(r"prefetch\.global\.L2", ptx)
    assert len(l1) == 2 + 1 and len(l2) == 1, ptx
    assert all(pred for pred, _ in l1)  # masked, or owners only


def test_vector_runs_group_consecutive_aligned_registers() -> None:
    """codegen/layout_moves.py `vector_runs`: a thread's registers at consecutive, aligned linear indices go to one
    vector access (at most 16 bytes), the rest stay scalar; predicates never group."""
    from minitriton.codegen.layout_moves import vector_runs
    from minitriton.ir.layouts import blocked, row_major_strides, thread_map

    four = thread_map(blocked([1, 4], [4, 8], [2, 1], [1, 0]), (16, 32))  # 4 consecutive f32 per thread: v4
    strides = tuple(row_major_strides((16, 32)))
    assert [len(run) for run in vector_runs(four, strides, 4)] == [4, 4]
    assert [len(run) for run in vector_runs(four, strides, 8)] == [2, 2, 2, 2]  # 16 bytes at most
    assert [len(run) for run in vector_runs(four, strides, 2)] == [4, 4]  # 8 bytes of b16
    assert [len(run) for run in vector_runs(four, strides, 0)] == [1] * 8  # predicates
    assert [len(run) for run in vector_runs(four, strides, 4, 2)] == [2, 2, 2, 2]  # shifted by 2: 8-aligned only
    assert [len(run) for run in vector_runs(four, strides, 4, 1)] == [1, 2, 1] * 2  # odd: pairs where aligned
    one = thread_map(blocked([1, 1], [1, 32], [2, 1], [1, 0]), (16, 32))  # one element per row per thread
    assert all(len(run) == 1 for run in vector_runs(one, strides, 4))
    runs = vector_runs(four, strides, 4)
    assert sorted(r for run in runs for r in run) == list(range(four.num_regs))  # every register exactly once


def test_vector_exchange_in_the_ptx_runs_on_the_simulator() -> None:
    """The KDA decode step's conversions read their K vectors with ld.shared.v4 (its [4, 8, 4] column tiles hold 4
    consecutive values a thread); the PTX simulator (which faults misaligned vector accesses, as the GPU does)
    replays it against the interpreter in tests/test_kda_decode.py. Here: the vector forms are in the PTX, each
    16-byte access at an offset that is a multiple of 16."""
    from minitriton.kernels import kda_decode

    ptx = kda_decode.kda_decode_step_kernel.specializations[-1].compile(target="ptx").ptx
    vectors = re.findall(r"ld\.shared\.v4\.b32 \{[^}]*\}, \[%r\d+\+(\d+)\];", ptx)
    assert vectors and all(int(off) % 16 == 0 for off in vectors)


def test_simulated_fma_rounds_once() -> None:
    """The simulator's vectorized fma (f64 product, TwoSum, tie nudge) equals exact rational arithmetic rounded
    once, on random operands and on the cases where rounding the f64 sum again would be wrong (the exact value
    just below / above an f32 tie, which fl64(p + c) lands on)."""
    import ptx_sim

    f32 = lambda x: float(np.float32(x))  # noqa: E731
    a = np.array([f32(2**-12 * (1 + 2**-23)), -f32(2**-12 * (1 + 2**-23)), f32(2**-12 * (1 + 2**-23)), 0.0, -0.0])
    b = np.array([f32(2**-12 * (1 - 2**-23)), f32(2**-12 * (1 - 2**-23)), f32(2**-12 * (1 + 2**-23)), -1.0, 0.0])
    c = np.array([f32(1 + 2**-23), -f32(1 + 2**-23), f32(1 + 2**-23), 0.0, -0.0])
    rng = np.random.default_rng(3)
    for t, to in ptx_sim.FAST_FMA_TYPES.items():
        x, y, z = (np.concatenate([v, rng.standard_normal(2000)]).astype(to).astype(np.float64) for v in (a, b, c))
        exact = np.array([ptx_sim._exact_fma(*v, t) for v in zip(x, y, z)])
        got = ptx_sim._fma_f64_exact(x, y, z, t)
        assert np.array_equal(got, exact) and np.array_equal(np.signbit(got), np.signbit(exact)), t
    x, y, z = a[:2], b[:2], c[:2]
    assert not np.array_equal((x * y + z).astype(np.float32), ptx_sim._fma_f64_exact(x, y, z, "f32"))  # the trap


def test_explicit_layout_keeps_the_reduction_in_thread() -> None:
    """mt.load(layout=...) puts a whole column in each thread: the axis-0 sum needs no shuffle and no shared memory;
    a layout whose warps do not match the program's is a compile error at the load."""
    ptx, _, _ = lower(CASES["column_sums"].make)
    assert "shfl" not in ptx and "bar.sync" not in ptx and "st.shared" not in ptx
    with pytest.raises(mt.CompilationError, match=r"load\(layout=...\) places 4 warps .* the program has 8"):
        lower(dsl(column_sums, {"x_ptr": P(f32), "out_ptr": P(f32)}, {"K": 16, "V": 128}, {"x_ptr": 16},
                  num_warps=8))
