"""Explicit warp specialization (`with mt.warp_specialize(): with mt.partition(...):` and `mt.ring`;
frontend/partitions.py, passes/warp_specialize.py, passes/async_dots.py, codegen/ptx.py lower_warp_specialize):
the frontend's rules and their messages; the interpreter's partitions (threads) and ring barriers against
references, with the protocol errors and deadlocks it reports; the persistent GEMM (examples/matmul.py
matmul_persistent_kernel) and a ring of register tiles through ptxas and the multi-program-counter PTX simulator
against torch, with broken protocols the simulator must reject; the persistent GEMM on the GPU."""
from __future__ import annotations

import re
import shutil

import pytest
import torch

import minitriton as mt
from gemm_checks import check_on_gpu
from minitriton.codegen.ptxas import run_ptxas
from minitriton.compiler import PIPELINE
from minitriton.errors import CompilationError, InterpreterError
from minitriton.frontend import compile_to_ir
from minitriton.interpreter import interpret
from minitriton.ir import Module, verify
from minitriton.ir.types import PointerType, TensorDescType, TensorType, bf16, f32, i32
from minitriton.kernels.examples import matmul
from minitriton.passes import run_passes
from ptx_sim import SimError
from ptx_sim_ws import run_ws_ptx
from test_pipeline import ptx_of

needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on PATH")


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(20261201)


# ------------------------------------------------------------------------------------------------ kernels


@mt.kernel
def ring_scale_kernel(x_ptr, y_ptr, n_tiles, BLOCK: mt.constexpr, STAGES: mt.constexpr, RELEASE: mt.constexpr = True):
    """A producer partition loads tiles of x into a ring of register-filled slots; the consumer scales each by 2
    and stores it (the slots go through shared memory: ring.put(i, tile) / ring.get(i))."""
    ring = mt.ring((BLOCK, BLOCK), mt.float32, STAGES)
    with mt.warp_specialize():
        with mt.partition():
            rows = mt.arange(0, BLOCK)
            for t in range(0, n_tiles):
                x = ring.get(t)
                if RELEASE:
                    ring.release(t)
                mt.store(y_ptr + t * BLOCK * BLOCK + rows[:, None] * BLOCK + rows[None, :], x * 2.0)
        with mt.partition(warps=4):
            rows = mt.arange(0, BLOCK)
            for t in range(0, n_tiles):
                ring.put(t, mt.load(x_ptr + t * BLOCK * BLOCK + rows[:, None] * BLOCK + rows[None, :]))


RING_TYPES = {"x_ptr": PointerType(f32), "y_ptr": PointerType(f32), "n_tiles": i32}


def ring_module(block: int = 32, stages: int = 2, passes: list[str] | None = None, **constexprs) -> Module:
    module = compile_to_ir(ring_scale_kernel, RING_TYPES, {"BLOCK": block, "STAGES": stages, **constexprs},
                           num_warps=4, divisibility={"x_ptr": 16, "y_ptr": 16})
    module = run_passes(module, PIPELINE if passes is None else passes)
    verify(module)
    return module


def persistent_module(block: tuple[int, int, int], warps: int, stages: int, tma_store: bool = False,
                      a_type: TensorDescType | None = None) -> Module:
    """matmul_persistent_kernel as the JIT specializes it (aligned C, unit column stride; with tma_store C as a
    descriptor of [BLOCK_M, 64] boxes; `a_type`: A's descriptor type, default the rank-2 [8, BLOCK_K] boxes),
    through the passes."""
    bm, bn, bk = block
    c_type = TensorDescType(TensorType((bm, matmul.C_BOX_COLUMNS), bf16)) if tma_store else PointerType(bf16)
    types = {"a_tma": a_type or TensorDescType(TensorType((8, bk), bf16)),
             "b_tma": TensorDescType(TensorType((bk, matmul.TMA_RING_B_COLUMNS), bf16)),
             "c_out": c_type, "bias_ptr": PointerType(bf16), "M": i32, "N": i32, "K": i32,
             "stride_cm": i32, "stride_cn": i32}
    module = compile_to_ir(matmul.matmul_persistent_kernel, types,
                           {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": stages, "GROUP_M": 2,
                            "TMA_STORE": tma_store},
                           num_warps=warps, divisibility={"c_out": 16, "bias_ptr": 16, "stride_cm": 16},
                           equal_to_one={"stride_cn"})
    module = run_passes(module, PIPELINE)
    verify(module)
    return module


def persistent_args(gen: torch.Generator, m: int, n: int, k: int, block: tuple[int, int, int],
                    paired_a: bool = False, tma_store: bool = False) -> tuple[list, torch.Tensor, torch.Tensor]:
    """The kernel's arguments, C and the float64 product; C has 8 padding columns nothing may write (with tma_store
    the descriptor describes the unpadded view)."""
    a = torch.randn(m, k, generator=gen).bfloat16()
    b = torch.randn(k, n, generator=gen).bfloat16()
    c = torch.full((m, n + 8), float("nan")).bfloat16()
    a_tma, b_tma = matmul.tma_ring_descriptors(a, b, block[2], paired_a=paired_a)
    c_out = mt.TensorDescriptor.from_tensor(c[:, :n], [block[0], matmul.C_BOX_COLUMNS]) if tma_store else c
    bias = torch.zeros(n + 8).bfloat16()  # unread (HAS_BIAS off); a tensor of its own: the simulator writes each back
    return [a_tma, b_tma, c_out, bias, m, n, k, c.stride(0), 1], c, a.double() @ b.double()


# --------------------------------------------------------------------------------------------- frontend


def _compile(src_fn, **constexprs) -> None:  # type: ignore[no-untyped-def]
    compile_to_ir(src_fn, {"x_ptr": PointerType(f32), "n": i32}, constexprs, num_warps=4)


@mt.kernel
def loop_around_block(x_ptr, n):
    r = mt.ring((16, 16), mt.float32, 2)
    for i in range(0, n):
        with mt.warp_specialize():
            with mt.partition():
                mt.store(x_ptr + i, 1.0)
            with mt.partition(warps=4):
                pass


@mt.kernel
def statement_in_block(x_ptr, n):
    with mt.warp_specialize():
        mt.store(x_ptr, 1.0)
        with mt.partition():
            pass
        with mt.partition(warps=4):
            pass


@mt.kernel
def tile_crosses_in(x_ptr, n):
    offs = mt.arange(0, 16)
    with mt.warp_specialize():
        with mt.partition():
            mt.store(x_ptr + offs, 1.0)
        with mt.partition(warps=4):
            pass


@mt.kernel
def code_after_block(x_ptr, n):
    with mt.warp_specialize():
        with mt.partition():
            mt.store(x_ptr, 1.0)
        with mt.partition(warps=4):
            pass
    mt.store(x_ptr, 2.0)


@mt.kernel
def default_partition_resized(x_ptr, n):
    with mt.warp_specialize():
        with mt.partition(warps=8):
            mt.store(x_ptr, 1.0)
        with mt.partition(warps=4):
            pass


@mt.kernel
def too_many_registers(x_ptr, n):
    with mt.warp_specialize():
        with mt.partition(registers=256):
            mt.store(x_ptr, 1.0)
        with mt.partition(warps=8, registers=256):
            pass


@mt.kernel
def ring_without_partitions(x_ptr, n):
    r = mt.ring((16, 16), mt.float32, 2)
    mt.store(x_ptr, 1.0)


@mt.kernel
def stray_partition(x_ptr, n):
    with mt.partition():
        mt.store(x_ptr, 1.0)


@mt.kernel
def ring_in_partition(x_ptr, n):
    with mt.warp_specialize():
        with mt.partition():
            r = mt.ring((16, 16), mt.float32, 2)
        with mt.partition(warps=4):
            pass


@pytest.mark.parametrize("kernel,message", [
    (loop_around_block, "must be at the kernel's top level"),
    (statement_in_block, "holds only `with mt.partition"),
    (tile_crosses_in, "computed outside the partition"),
    (code_after_block, "nothing may follow"),
    (default_partition_resized, "the first partition is the default partition"),
    (too_many_registers, "exceed the register file"),
    (ring_without_partitions, "connect the partitions"),
    (stray_partition, "go directly inside"),
    (ring_in_partition, "allocate mt.ring buffers before"),
])
def test_frontend_rules_name_the_problem_and_the_line(kernel, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CompilationError, match=re.escape(message)) as info:
        _compile(kernel)
    assert info.value.loc is not None and info.value.loc.file.endswith("test_partitions.py")


def test_ring_filled_from_two_partitions_is_an_error() -> None:
    @mt.kernel
    def two_fillers(x_ptr, n):
        r = mt.ring((16, 16), mt.float32, 2)
        with mt.warp_specialize():
            with mt.partition():
                r.put(0, mt.full((16, 16), 1.0, mt.float32))
            with mt.partition(warps=4):
                r.put(1, mt.full((16, 16), 2.0, mt.float32))

    module = compile_to_ir(two_fillers, {"x_ptr": PointerType(f32), "n": i32}, {}, num_warps=4)
    with pytest.raises(CompilationError, match="filled by one partition only"):
        run_passes(module, PIPELINE)


def test_block_is_one_op_with_a_region_per_partition() -> None:
    module = ring_module(passes=[])
    top = module.functions[0].regions[0].block
    assert [op.name for op in top.ops] == ["mt.alloc_ring", "mt.warp_specialize", "mt.return"]
    split = top.ops[1]
    assert split.attrs == {"warps": [4, 4], "registers": [0, 0]} and len(split.regions) == 2
    consumer, producer = ([op for top_op in r.block.ops for op in top_op.walk()] for r in split.regions)
    assert [op.attrs.get("empty") for op in producer if op.name == "mt.async_wait"] == [True]
    assert any(op.name == "mt.ring_store" for op in producer)
    assert [op.name for op in consumer if op.name.startswith("mt.ring") or op.name == "mt.local_load"] \
        == ["mt.local_load", "mt.ring_release"]


def test_passes_complete_the_ring_protocol() -> None:
    """Filled from registers by partition 1 (128 threads arrive on each full barrier), read into registers and
    released by partition 0 (each of its 128 threads arrives: ld.shared, not wgmma); the block has 8 warps."""
    func = ring_module().functions[0]
    (alloc,) = [op for op in func.walk() if op.name == "mt.alloc_ring"]
    assert alloc.attrs["full_arrivals"] == 128 and alloc.attrs["empty_arrivals"] == 128
    assert alloc.attrs["dynamic_offset"] == 0 and func.attrs["dynamic_shared_memory"] == 2 * 32 * 32 * 4 + 1024
    assert [op.attrs["arrive"] for op in func.walk() if op.name == "mt.ring_release"] == ["thread"]
    assert func.attrs["num_warps"] == 8 and func.attrs["consumer_warps"] == 4
    assert "min_blocks_per_sm" not in func.attrs  # no register budgets: no setmaxnreg


# ------------------------------------------------------------------------------------------ interpreter


def test_interpreted_ring_of_register_tiles(gen: torch.Generator) -> None:
    x = torch.randn(5 * 32 * 32, generator=gen)
    y = torch.full_like(x, float("nan"))
    interpret(ring_module(passes=["canonicalize"]).functions[0], (1,), [x, y, 5])
    assert torch.equal(y, 2 * x)


def test_interpreter_reports_a_consumer_that_never_releases() -> None:
    """5 fills of 2 slots with no release: the producer waits for slot 0 forever, the consumer for fill 2."""
    func = ring_module(passes=["canonicalize"], RELEASE=False).functions[0]
    x = torch.randn(5 * 32 * 32)
    with pytest.raises(InterpreterError, match="deadlock: every partition waits"):
        interpret(func, (1,), [x, torch.empty_like(x), 5])


def test_interpreter_reports_a_fill_over_an_unreleased_slot() -> None:
    """Without the producer's empty-slot wait, fill 2 lands in slot 0 before the consumer released fill 0 (or the
    consumer releases first and all is well: the threads race, so only the error's wording is checked)."""
    func = ring_module(passes=["canonicalize"]).functions[0]
    for op in list(func.walk()):
        if op.name == "mt.async_wait" and op.attrs.get("empty"):
            op.erase()
    x = torch.randn(40 * 32 * 32)
    try:
        interpret(func, (1,), [x, torch.empty_like(x), 40])
    except InterpreterError as e:
        assert "filled again before its previous fill was released" in str(e)


@pytest.mark.parametrize("tma_store", [False, True])
@pytest.mark.parametrize("shape,programs", [((150, 200, 296), 3), ((64, 64, 64), 1), ((130, 264, 136), 2)])
def test_interpreted_persistent_matmul(monkeypatch: pytest.MonkeyPatch, gen: torch.Generator,
                                       shape: tuple[int, int, int], programs: int, tma_store: bool) -> None:
    """matmul_persistent (bias + GELU) through the interpreter: tiles shared out over `programs` programs, the
    ring phases carried across tiles, ragged M, N and K; C through pointers or TMA stores of whole boxes."""
    monkeypatch.setenv("MINITRITON_INTERPRET", "1")
    m, n, k = shape
    a = torch.randn(m, k, generator=gen).bfloat16()
    b = torch.randn(k, n, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16()
    config = mt.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 2}, num_warps=4, num_stages=3)
    c = matmul.matmul_persistent(a, b, config, bias=bias, activation="gelu", programs=programs, tma_store=tma_store)
    ref = matmul.reference(a, b, bias, "gelu").double()
    assert ((c.double() - ref).norm() / ref.norm()).item() <= 1e-2


# ---------------------------------------------------------------------------------------- ptxas, simulator


@needs_ptxas
@pytest.mark.parametrize("block,warps,stages,tma_store", [
    ((128, 256, 64), 8, 3, False), ((128, 256, 64), 8, 4, False), ((128, 128, 64), 8, 4, False),
    ((64, 128, 64), 4, 3, False), ((128, 256, 64), 8, 3, True), ((128, 256, 64), 8, 4, True)])
def test_persistent_matmul_assembles(block: tuple[int, int, int], warps: int, stages: int, tma_store: bool) -> None:
    """setmaxnreg honoured (.maxntid and .minnctapersm 1, no C7508), no wgmma serialization (C7514), 0 spills;
    the consumers' named barrier; TMA, wgmma and both setmaxnreg counts present; with tma_store one TMA store per
    [BLOCK_M, 64] box of C."""
    module = persistent_module(block, warps, stages, tma_store)
    ptx, _ = ptx_of(module)
    threads = 32 * (warps + 4)
    assert f".maxntid {threads}, 1, 1" in ptx and ".minnctapersm 1" in ptx
    assert ptx.count("setmaxnreg.inc.sync.aligned.u32 232;") == 1
    assert ptx.count("setmaxnreg.dec.sync.aligned.u32 40;") == 1
    assert "cp.async.bulk.tensor" in ptx and "wgmma.mma_async" in ptx and f"bar.sync 1, {32 * warps};" in ptx
    stores = ptx.count("cp.async.bulk.tensor.2d.global.shared::cta")
    assert stores == (block[1] // matmul.C_BOX_COLUMNS if tma_store else 0)
    report = run_ptxas(ptx)
    assert report.spill_stores == 0 and report.spill_loads == 0, report.log
    assert "C7508" not in report.log and "C7514" not in report.log and "warning" not in report.log.lower()


@pytest.mark.parametrize("block,warps,stages,shape,programs,tma_store", [
    ((64, 128, 64), 4, 3, (70, 200, 192), 2, False),    # 4 tiles over 2 programs: phases carried across tiles
    ((128, 256, 64), 8, 3, (150, 264, 200), 2, False),  # two consumer warpgroups, m64n256; tails in M, N, K
    ((128, 256, 64), 8, 4, (320, 264, 136), 3, False),  # M a multiple of 64: A in rank-4 paired boxes
    ((128, 256, 64), 8, 3, (150, 264, 200), 2, True),   # C by TMA: 4 boxes a tile, 2 rounds, straight from wgmma
    ((64, 128, 64), 4, 3, (70, 200, 192), 3, True),
])
@pytest.mark.parametrize("policy", ["round_robin", "greedy"])
def test_simulated_persistent_matmul_matches_torch(block: tuple[int, int, int], warps: int, stages: int,
                                                   shape: tuple[int, int, int], programs: int, tma_store: bool,
                                                   policy: str, gen: torch.Generator) -> None:
    """The partitions on separate program counters (both schedules) with every TMA / mbarrier / wgmma / race check
    of the simulator, against float64 torch (bf16 output: 2e-2 of the largest |value|); C's padding untouched."""
    m, n, k = shape
    paired = m % 64 == 0
    args, c, ref = persistent_args(gen, m, n, k, block, paired_a=paired, tma_store=tma_store)
    ptx, name = ptx_of(persistent_module(block, warps, stages, tma_store, args[0].type if paired else None))
    run_ws_ptx(ptx, name, (programs, 1, 1), args, 32 * warps, policy=policy)
    assert (c[:, :n].double() - ref).abs().max() <= 2e-2 * ref.abs().max()
    assert torch.isnan(c[:, n:]).all()


@pytest.mark.parametrize("policy", ["round_robin", "greedy"])
def test_simulated_ring_of_register_tiles(policy: str, gen: torch.Generator) -> None:
    ptx, name = ptx_of(ring_module())
    x = torch.randn(5 * 32 * 32, generator=gen)
    y = torch.full_like(x, float("nan"))
    run_ws_ptx(ptx, name, (1, 1, 1), [x, y, 5], 128, policy=policy)
    assert torch.equal(y, 2 * x)


def _in_partition(ptx: str, index: int, mutate) -> str:  # type: ignore[no-untyped-def]
    """The mutation applied to partition `index`'s code only: from the branch its warps take to its skip label."""
    branch = re.search(rf"bra (\$L_partition{index}_skip_\d+);\n", ptx)
    assert branch is not None
    start, end = branch.end(), ptx.index(f"{branch.group(1)}:")
    return ptx[:start] + mutate(ptx[start:end]) + ptx[end:]


_WAIT = re.compile(r"\$L_ring_wait_\d+:\n(\s+\.loc[^\n]*\n)?\s+mbarrier\.try_wait[^\n]*\n\s+@!%p\d+ bra \$L_ring_wait_\d+;\n")


@pytest.mark.parametrize("what,partition,mutate,error", [
    ("the consumer never releases", 0, lambda p: re.sub(r"(@%p\d+ )?mbarrier\.arrive\.shared::cta\.b64 _, \[%r\d+\];\n", "", p),
     "deadlock"),
    ("the consumer reads before the fill landed", 0, lambda p: _WAIT.sub("", p),
     "before waiting on its mbarrier|overwrites shared memory|deadlock"),
    ("the producer refills without waiting", 1, lambda p: _WAIT.sub("", p),
     "overwrites shared memory|previous TMA fill nobody waited for"),
])
@pytest.mark.parametrize("policy", ["round_robin", "greedy"])
def test_simulator_rejects_broken_ring_protocols(what: str, partition: int, mutate, error: str,  # type: ignore
                                                 policy: str, gen: torch.Generator) -> None:
    ptx, name = ptx_of(persistent_module((64, 128, 64), 4, 3))
    broken = _in_partition(ptx, partition, mutate)
    assert broken != ptx, what
    args, _, _ = persistent_args(gen, 64, 128, 320, (64, 128, 64))
    with pytest.raises(SimError, match=error):
        run_ws_ptx(broken, name, (1, 1, 1), args, 128, policy=policy)


# ----------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the H200)")
@pytest.mark.parametrize("config_index", [0, 1, 3])
def test_gpu_persistent_matmul_matches_torch(config_index: int) -> None:
    """matmul_persistent (paired A boxes where M is a multiple of 64) at the 128-row MATMUL_CONFIGS on ragged and
    tiny shapes against torch (relative error <= 1e-2), each config in a process of its own."""
    check_on_gpu("matmul_persistent", config_index)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the H200)")
@pytest.mark.parametrize("config_index", [0, 1])
def test_gpu_persistent_matmul_with_tma_stores(config_index: int) -> None:
    """matmul_persistent(tma_store=True): C written by TMA in [BLOCK_M, 64] boxes (edges clipped by TMA)."""
    check_on_gpu("matmul_persistent", config_index, "tma_store")
