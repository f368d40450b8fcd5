"""Static sub-tiles (`x[16:32, :]` -> mt.extract_slice) and concatenation (`mt.cat([a, b], axis)` -> mt.concat).

1. The interpreter against torch on fresh random inputs, 2-D and 3-D, several shapes: bit-exact (data movement).
2. The compiled PTX replayed on tests/ptx_sim.py against the interpreter, bit-exact, over layouts where the slice is
   a register selection (no shared memory) and layouts where it is not (the shared-memory exchange, also in rounds
   when the tile exceeds the shared-memory budget); ptxas must accept the PTX without spills.
3. Frontend diagnostics: a CompilationError naming this file and the exact line for each kind of bad slice / cat.
4. layouts.subtile_registers checked element by element, and the tiled IR round-trips through the parser.
"""
from __future__ import annotations

import inspect
import os

import numpy as np
import pytest
import torch

import minitriton as mt
from minitriton.codegen import context as codegen_context
from minitriton.codegen import ptxas_path, run_ptxas
from minitriton.errors import CompilationError
from minitriton.frontend import compile_to_ir
from minitriton.ir import parse_module
from minitriton.ir.layouts import blocked, subtile_registers, thread_map
from minitriton.ir.types import SCALAR_TYPES, PointerType
from minitriton.passes import run_passes
from ptx_helpers import dsl, lower, run_interpreted, run_simulated

f32, bf16, i32 = SCALAR_TYPES["f32"], SCALAR_TYPES["bf16"], SCALAR_TYPES["i32"]
TORCH = {"f32": torch.float32, "bf16": torch.bfloat16, "i32": torch.int32}


@pytest.fixture
def gen() -> torch.Generator:
    seed = int(np.random.SeedSequence().entropy % (2**63))
    print(f"seed = {seed}")  # shown on failure
    return torch.Generator().manual_seed(seed)


def random(shape: tuple[int, ...], dtype: str, gen: torch.Generator) -> torch.Tensor:
    if dtype == "i32":
        return torch.randint(-2**31, 2**31 - 1, shape, generator=gen, dtype=torch.int32)
    return torch.randn(shape, generator=gen).to(TORCH[dtype])


def poisoned(shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    t = torch.empty(shape, dtype=TORCH[dtype])
    return t.fill_(-123) if dtype == "i32" else t.fill_(float("nan"))


# --------------------------------------------------------------------------------------------- kernels


@mt.kernel
def slice_2d(x_ptr, out_ptr, R: mt.constexpr, C: mt.constexpr, R0: mt.constexpr, R1: mt.constexpr,
             C0: mt.constexpr, C1: mt.constexpr):
    r = mt.arange(0, R)
    c = mt.arange(0, C)
    x = mt.load(x_ptr + r[:, None] * C + c[None, :])
    y = x[R0:R1, C0:C1]
    ro = mt.arange(0, R1 - R0)
    co = mt.arange(0, C1 - C0)
    mt.store(out_ptr + ro[:, None] * (C1 - C0) + co[None, :], y)


@mt.kernel
def slice_3d(x_ptr, out_ptr, A: mt.constexpr, B: mt.constexpr, C: mt.constexpr, A0: mt.constexpr,
             A1: mt.constexpr, C0: mt.constexpr, C1: mt.constexpr):
    a = mt.arange(0, A)[:, None, None]
    b = mt.arange(0, B)[None, :, None]
    c = mt.arange(0, C)[None, None, :]
    x = mt.load(x_ptr + a * (B * C) + b * C + c)
    y = x[A0:A1, :, C0:C1]
    ao = mt.arange(0, A1 - A0)[:, None, None]
    co = mt.arange(0, C1 - C0)[None, None, :]
    mt.store(out_ptr + ao * (B * (C1 - C0)) + b * (C1 - C0) + co, y)


@mt.kernel
def swap_halves_2d(x_ptr, out_ptr, R: mt.constexpr, C: mt.constexpr, AXIS: mt.constexpr):
    """out = cat([second half, first half], AXIS): the pieces are slices of the loaded tile."""
    r = mt.arange(0, R)
    c = mt.arange(0, C)
    offs = r[:, None] * C + c[None, :]
    x = mt.load(x_ptr + offs)
    if AXIS == 0:
        y = mt.cat([x[R // 2:R, :], x[0:R // 2, :]], 0)
    else:
        y = mt.cat([x[:, C // 2:C], x[:, 0:C // 2]], axis=1)
    mt.store(out_ptr + offs, y)


@mt.kernel
def reorder_rows(x_ptr, out_ptr, C: mt.constexpr, B: mt.constexpr):
    """The FlashKDA pattern: row blocks of a [4B, C] tile taken out and put back in the order 2, 0, 3, 1."""
    r = mt.arange(0, 4 * B)
    c = mt.arange(0, C)
    offs = r[:, None] * C + c[None, :]
    x = mt.load(x_ptr + offs)
    y = mt.cat([x[2 * B:3 * B, :], x[0:B, :], x[3 * B:4 * B, :], x[B:2 * B, :]], 0)
    mt.store(out_ptr + offs, y)


@mt.kernel
def cat_loaded_3d(a_ptr, b_ptr, out_ptr, A: mt.constexpr, B: mt.constexpr, C: mt.constexpr):
    """Two tiles loaded separately, concatenated along the middle dim."""
    a = mt.arange(0, A)[:, None, None]
    b = mt.arange(0, B)[None, :, None]
    c = mt.arange(0, C)[None, None, :]
    offs = a * (B * C) + b * C + c
    x = mt.load(a_ptr + offs)
    y = mt.load(b_ptr + offs)
    b2 = mt.arange(0, 2 * B)[None, :, None]
    mt.store(out_ptr + a * (2 * B * C) + b2 * C + c, mt.cat([x, y], axis=1))


def ptrs(names: str, dtype: str) -> dict:
    return {n: PointerType(SCALAR_TYPES[dtype]) for n in names.split()}


def aligned(names: str, yes: bool) -> dict:
    return {n: 16 if yes else 1 for n in names.split()}


# ----------------------------------------------------------------------------------- interpreter vs torch


SLICE_2D = [  # (R, C, R0, R1, C0, C1)
    (64, 64, 16, 32, 0, 64), (64, 64, 0, 64, 32, 64), (32, 16, 8, 16, 4, 8), (16, 128, 15, 16, 64, 128),
    (64, 64, 0, 2, 0, 64),
]


@pytest.mark.parametrize("dtype", ["f32", "bf16", "i32"])
@pytest.mark.parametrize("case", SLICE_2D)
def test_slice_2d_interpreter_matches_torch(case: tuple, dtype: str, gen: torch.Generator) -> None:
    R, C, R0, R1, C0, C1 = case
    make = dsl(slice_2d, ptrs("x_ptr out_ptr", dtype), dict(R=R, C=C, R0=R0, R1=R1, C0=C0, C1=C1))
    x = random((R, C), dtype, gen)
    out = run_interpreted(make, (1, 1, 1), [x, poisoned((R1 - R0, C1 - C0), dtype)])[1]
    assert torch.equal(out, x[R0:R1, C0:C1])


@pytest.mark.parametrize("case", [(4, 8, 16, 2, 4, 8, 16), (8, 4, 32, 0, 8, 0, 8), (2, 2, 64, 1, 2, 32, 64)])
def test_slice_3d_interpreter_matches_torch(case: tuple, gen: torch.Generator) -> None:
    A, B, C, A0, A1, C0, C1 = case
    make = dsl(slice_3d, ptrs("x_ptr out_ptr", "f32"), dict(A=A, B=B, C=C, A0=A0, A1=A1, C0=C0, C1=C1))
    x = random((A, B, C), "f32", gen)
    out = run_interpreted(make, (1, 1, 1), [x, poisoned((A1 - A0, B, C1 - C0), "f32")])[1]
    assert torch.equal(out, x[A0:A1, :, C0:C1])


@pytest.mark.parametrize("R, C, axis", [(64, 64, 0), (64, 64, 1), (8, 32, 1), (32, 2, 0)])
def test_swap_halves_interpreter_matches_torch(R: int, C: int, axis: int, gen: torch.Generator) -> None:
    make = dsl(swap_halves_2d, ptrs("x_ptr out_ptr", "f32"), dict(R=R, C=C, AXIS=axis))
    x = random((R, C), "f32", gen)
    out = run_interpreted(make, (1, 1, 1), [x, poisoned((R, C), "f32")])[1]
    assert torch.equal(out, torch.cat(list(reversed(x.chunk(2, axis))), axis))


def test_reorder_rows_and_3d_cat_interpreter_match_torch(gen: torch.Generator) -> None:
    x = random((64, 64), "f32", gen)
    out = run_interpreted(dsl(reorder_rows, ptrs("x_ptr out_ptr", "f32"), dict(C=64, B=16)), (1, 1, 1),
                          [x, poisoned((64, 64), "f32")])[1]
    assert torch.equal(out, torch.cat([x[32:48], x[0:16], x[48:64], x[16:32]]))
    a, b = random((2, 4, 8), "f32", gen), random((2, 4, 8), "f32", gen)
    out = run_interpreted(dsl(cat_loaded_3d, ptrs("a_ptr b_ptr out_ptr", "f32"), dict(A=2, B=4, C=8)), (1, 1, 1),
                          [a, b, poisoned((2, 8, 8), "f32")])[2]
    assert torch.equal(out, torch.cat([a, b], 1))


# --------------------------------------------------------------------------------- PTX (simulated) vs interpreter


def check_ptx(make, args: list, ptxas: bool = True) -> str:
    """Runs the kernel on the PTX simulator and in the interpreter: every output bit-identical. Returns the PTX."""
    ptx, _, _ = lower(make)
    want = run_interpreted(make, (1, 1, 1), args)
    got = run_simulated(make, (1, 1, 1), args, ptx)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    if ptxas and ptxas_path() is not None:
        report = run_ptxas(ptx)
        assert report.spill_stores == 0 and report.spill_loads == 0, report.log
    return ptx


@pytest.mark.parametrize("num_warps, vectors", [(4, True), (4, False), (8, True), (1, True)])
def test_reorder_rows_ptx_is_a_register_shuffle(num_warps: int, vectors: bool, gen: torch.Generator) -> None:
    make = dsl(reorder_rows, ptrs("x_ptr out_ptr", "f32"), dict(C=64, B=16), aligned("x_ptr out_ptr", vectors),
               num_warps=num_warps)
    ptx = check_ptx(make, [random((64, 64), "f32", gen), poisoned((64, 64), "f32")])
    assert "st.shared" not in ptx and "bar.sync" not in ptx  # slices and concat moved no data between threads


def test_reorder_small_row_blocks_go_through_shared_memory(gen: torch.Generator) -> None:
    """Row blocks of 2 from a layout whose CTA tile is 8 rows: slices and the 4-piece concat move through shared
    memory, and must still match."""
    make = dsl(reorder_rows, ptrs("x_ptr out_ptr", "f32"), dict(C=64, B=2), aligned("x_ptr out_ptr", True))
    ptx = check_ptx(make, [random((8, 64), "f32", gen), poisoned((8, 64), "f32")])
    assert "st.shared" in ptx


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("case", SLICE_2D)
def test_slice_2d_ptx_matches_interpreter(case: tuple, dtype: str, gen: torch.Generator) -> None:
    R, C, R0, R1, C0, C1 = case
    make = dsl(slice_2d, ptrs("x_ptr out_ptr", dtype), dict(R=R, C=C, R0=R0, R1=R1, C0=C0, C1=C1),
               aligned("x_ptr out_ptr", True))
    check_ptx(make, [random((R, C), dtype, gen), poisoned((R1 - R0, C1 - C0), dtype)])


def test_slice_through_shared_memory_in_rounds(monkeypatch: pytest.MonkeyPatch, gen: torch.Generator) -> None:
    """Rows 0:2 of a tile whose layout spreads 8 rows over threads: the elements move (an exchange), here in rounds
    because the tile is larger than the (shrunk) shared-memory budget."""
    make = dsl(slice_2d, ptrs("x_ptr out_ptr", "f32"), dict(R=64, C=64, R0=2, R1=4, C0=0, C1=64),
               aligned("x_ptr out_ptr", True))
    ptx = check_ptx(make, [random((64, 64), "f32", gen), poisoned((2, 64), "f32")])
    assert "st.shared" in ptx
    monkeypatch.setattr(codegen_context, "SMEM_LIMIT", 4096)
    check_ptx(make, [random((64, 64), "f32", gen), poisoned((2, 64), "f32")], ptxas=False)


@pytest.mark.parametrize("R, C, axis", [(64, 64, 0), (64, 64, 1), (8, 32, 1), (32, 2, 0), (16, 128, 1)])
def test_swap_halves_ptx_matches_interpreter(R: int, C: int, axis: int, gen: torch.Generator) -> None:
    make = dsl(swap_halves_2d, ptrs("x_ptr out_ptr", "f32"), dict(R=R, C=C, AXIS=axis),
               aligned("x_ptr out_ptr", True))
    check_ptx(make, [random((R, C), "f32", gen), poisoned((R, C), "f32")])


def test_3d_slice_and_cat_ptx_match_interpreter(gen: torch.Generator) -> None:
    make = dsl(slice_3d, ptrs("x_ptr out_ptr", "f32"), dict(A=4, B=8, C=16, A0=2, A1=4, C0=8, C1=16),
               aligned("x_ptr out_ptr", True))
    check_ptx(make, [random((4, 8, 16), "f32", gen), poisoned((2, 8, 8), "f32")])
    make = dsl(cat_loaded_3d, ptrs("a_ptr b_ptr out_ptr", "f32"), dict(A=2, B=4, C=8),
               aligned("a_ptr b_ptr out_ptr", True))
    check_ptx(make, [random((2, 4, 8), "f32", gen), random((2, 4, 8), "f32", gen), poisoned((2, 8, 8), "f32")])


# ------------------------------------------------------------------------------------- frontend diagnostics


@mt.kernel
def bad_runtime_bound(x_ptr, n):
    x = mt.load(x_ptr + mt.arange(0, 64))
    mt.store(x_ptr + mt.arange(0, 16), x[n:n + 16])  # ERR


@mt.kernel
def bad_unaligned(x_ptr):
    x = mt.load(x_ptr + mt.arange(0, 64))
    mt.store(x_ptr + mt.arange(0, 16), x[8:24])  # ERR


@mt.kernel
def bad_not_power_of_two(x_ptr):
    x = mt.load(x_ptr + mt.arange(0, 64))
    mt.store(x_ptr + mt.arange(0, 16), x[0:12])  # ERR


@mt.kernel
def bad_out_of_range(x_ptr):
    x = mt.load(x_ptr + mt.arange(0, 64))
    mt.store(x_ptr + mt.arange(0, 64), x[64:128])  # ERR


@mt.kernel
def bad_step(x_ptr):
    x = mt.load(x_ptr + mt.arange(0, 64))
    mt.store(x_ptr + mt.arange(0, 32), x[0:64:2])  # ERR


@mt.kernel
def bad_integer_index(x_ptr):
    x = mt.load(x_ptr + mt.arange(0, 64))
    mt.store(x_ptr, x[3])  # ERR


@mt.kernel
def bad_cat_count(x_ptr):
    x = mt.load(x_ptr + mt.arange(0, 16))
    y = mt.cat([x, x, x], 0)  # ERR
    mt.store(x_ptr + mt.arange(0, 16), y[0:16])


@mt.kernel
def bad_cat_shapes(x_ptr):
    x = mt.load(x_ptr + mt.arange(0, 16))
    y = mt.cat([x, x[0:8]], 0)  # ERR
    mt.store(x_ptr + mt.arange(0, 16), y[0:16])


@mt.kernel
def bad_cat_axis(x_ptr):
    x = mt.load(x_ptr + mt.arange(0, 16))
    mt.store(x_ptr + mt.arange(0, 32), mt.cat([x, x], 1))  # ERR


DIAGNOSTICS = {
    bad_runtime_bound: "a slice bound (dim 0) must be a compile-time integer",
    bad_unaligned: "slice 8:24 of dim 0 must have a power-of-two size and start at a multiple of it",
    bad_not_power_of_two: "slice 0:12 of dim 0 must have a power-of-two size",
    bad_out_of_range: "slice 64:128 is out of range for dim 0 of a tile of shape (64,)",
    bad_step: "tile slices take no step",
    bad_integer_index: "tiles can only be indexed with slices and None",
    bad_cat_count: "cat needs a power-of-two number of tiles",
    bad_cat_shapes: "cat needs tiles of one shape and dtype",
    bad_cat_axis: "cat axis 1 is out of range for shape (16,)",
}


@pytest.mark.parametrize("kernel", list(DIAGNOSTICS), ids=lambda k: k.fn.__name__)
def test_bad_slices_name_file_and_line(kernel) -> None:  # type: ignore[no-untyped-def]
    lines, start = inspect.getsourcelines(kernel.fn)
    marked = [start + i for i, line in enumerate(lines) if line.rstrip().endswith("# ERR")]
    arg_types = {"x_ptr": PointerType(f32), "n": i32}
    params = inspect.signature(kernel.fn).parameters
    with pytest.raises(CompilationError) as info:
        compile_to_ir(kernel.fn, {p: arg_types[p] for p in params}, {})
    err = info.value
    assert err.loc is not None and os.path.realpath(err.loc.file) == os.path.realpath(__file__), str(err)
    assert err.loc.line == marked[0], str(err)
    assert DIAGNOSTICS[kernel] in str(err), str(err)


# ------------------------------------------------------------------------------------ layouts and round trip


@pytest.mark.parametrize("enc, shape, offsets, sizes, free", [
    (blocked([1, 4], [2, 16], [4, 1], [1, 0]), (64, 64), (16, 0), (16, 64), True),
    (blocked([1, 4], [2, 16], [4, 1], [1, 0]), (64, 64), (2, 0), (2, 64), False),
    (blocked([1, 4], [2, 16], [4, 1], [1, 0]), (64, 64), (0, 32), (64, 32), False),
    (blocked([2, 1], [4, 8], [1, 2], [0, 1]), (32, 32), (8, 16), (8, 16), True),
    (blocked([1, 1, 4], [1, 4, 8], [2, 1, 1], [2, 1, 0]), (4, 8, 64), (2, 0, 32), (2, 8, 32), True),
])
def test_subtile_registers_select_the_right_elements(enc, shape, offsets, sizes, free) -> None:  # type: ignore
    regs = subtile_registers(enc, shape, offsets, sizes)
    assert (regs is not None) == free
    if regs is None:
        return
    src, dst = thread_map(enc, shape), thread_map(enc, sizes)
    for tid in range(dst.num_threads):
        for r, s in enumerate(regs):
            want = tuple(c + o for c, o in zip(dst.element(tid, r), offsets))
            assert src.element(tid, s) == want


def test_tiled_slices_round_trip_through_the_parser() -> None:
    make = dsl(reorder_rows, ptrs("x_ptr out_ptr", "f32"), dict(C=64, B=16), aligned("x_ptr out_ptr", True))
    module = run_passes(make(), ["tiling"])
    text = str(module)
    assert '"mt.extract_slice"' in text and '"mt.concat"' in text
    assert str(parse_module(text)) == text


@mt.kernel
def row_slice_of_column_runs(x_ptr, out_ptr, R: mt.constexpr, C: mt.constexpr, R0: mt.constexpr, R1: mt.constexpr):
    """Rows R0:R1 of a [R, C] tile loaded with each thread holding 8 consecutive rows of one column."""
    r = mt.arange(0, R)
    c = mt.arange(0, C)
    x = mt.load(x_ptr + r[:, None] * C + c[None, :], layout=mt.blocked([8, 1], [R // 8, 256 // R], [1, 4], [0, 1]))
    s = mt.arange(R0, R1)
    mt.store(out_ptr + (s[:, None] - R0) * C + c[None, :], x[R0:R1, :])


@pytest.mark.parametrize("R0, R1, writes", [(15, 16, 1), (8, 16, 8), (0, 16, 8), (14, 16, 2)])
def test_slice_exchange_writes_only_the_registers_in_the_slice(R0: int, R1: int, writes: int,
                                                               gen: torch.Generator) -> None:
    """A slice through shared memory stores only the source registers whose element lies in the slice in some
    thread (minitriton/ir/layouts.py registers_in_box): one in eight for a one-row slice of 8-row runs; the replay
    must still match."""
    make = dsl(row_slice_of_column_runs, ptrs("x_ptr out_ptr", "f32"), dict(R=32, C=64, R0=R0, R1=R1),
               aligned("x_ptr out_ptr", True))
    ptx = check_ptx(make, [random((32, 64), "f32", gen), poisoned((R1 - R0, 64), "f32")])
    per_thread = 32 * 64 // 128  # 16 registers: 2 columns x 8 rows
    assert ptx.count("st.shared") == writes * per_thread // 8, ptx.count("st.shared")


@mt.kernel
def two_row_blocks(x_ptr, y_ptr, out_ptr):
    """x[0:16] * y[0:16] + x[16:32] * y[16:32], x loaded with 8 rows per thread (neither slice a selection)."""
    r = mt.arange(0, 32)
    c = mt.arange(0, 64)
    x = mt.load(x_ptr + r[:, None] * 64 + c[None, :], layout=mt.blocked([8, 1], [4, 8], [1, 4], [0, 1]))
    s = mt.arange(0, 16)
    y0 = mt.load(y_ptr + s[:, None] * 64 + c[None, :])
    y1 = mt.load(y_ptr + (s[:, None] + 16) * 64 + c[None, :])
    mt.store(out_ptr + s[:, None] * 64 + c[None, :], x[0:16, :] * y0 + x[16:32, :] * y1)


def test_slices_of_one_tile_share_one_conversion(gen: torch.Generator) -> None:
    """The tiling pass converts x once for both slices (tests/passes/slices.mtir): one exchange of the 16
    registers a thread holds, not two; the replay matches bit for bit."""
    make = dsl(two_row_blocks, ptrs("x_ptr y_ptr out_ptr", "f32"), {}, aligned("x_ptr y_ptr out_ptr", True))
    ptx = check_ptx(make, [random((32, 64), "f32", gen), random((32, 64), "f32", gen), poisoned((16, 64), "f32")])
    assert ptx.count("st.shared") == 16, ptx.count("st.shared")
