"""Software pipelining (passes/pipeline.py; the IR-text tests are tests/passes/pipeline.mtir).

1. The pipelined example matmul (after tiling, dot-lowering, pipeline) interprets exactly like the frontend's tile
   IR, for num_stages 2, 3 and 4 (clamped to 3 by the shared-memory budget), on 64^3 and on 100 x 70 x 90 (ragged edges: masked copies, a partial last K
   block; rows padded to multiples of 16 elements so they stay 16-byte aligned); also when the pass runs on tile IR
   without layouts.
2. Its PTX (BLOCK 64 x 64 x 32 bf16, 4 warps, mma.sync and wgmma) assembles with ptxas -arch=sm_90a, uses
   `cp.async.cg.shared.global` / `cp.async.wait_group`, and the PTX simulator (tests/ptx_sim_async.py: groups and
   waits checked) gives exactly the interpreter's bf16 output on both shapes (same products, same f32 summation
   order).
3. The simulator catches a read of a slot whose group was not waited for, and a read before the bar.sync that
   publishes other threads' copies.
4. The Hopper in-place wgmma ring (cp.async) and its epilogue (see the tests' docstrings).
5. The TMA-fed ring (docs/kernels/gemm.md v2): the TMA boxes lay a slot out exactly as wgmma reads it, the host
   encodes pointer tensor maps once, the pass rewrites the copies (and only with descriptors in the ring's boxes),
   the simulator runs it against torch at ragged sizes and catches three broken variants, ptxas assembles the
   GEMM configs without spills, and the kernel interprets.
"""
from __future__ import annotations

import re
import shutil
from typing import Any

import pytest
import torch

from minitriton.compiler import PIPELINE
from minitriton.codegen import emit_ptx
from minitriton.codegen.ptxas import run_ptxas
from minitriton.frontend import compile_to_ir
import minitriton as mt
from minitriton.interpreter import interpret
from minitriton.ir import Module
from minitriton.ir.types import PointerType, bf16, f32, i32
from minitriton.kernels.examples import matmul
from minitriton.passes import run_passes
from gemm_checks import check_interpreted, check_on_gpu
from ptx_helpers import clone_args
from ptx_sim import SimError, run_ptx
from test_ptx import assemble, nan_like

MM = "a_ptr,b_ptr,c_ptr,bias_ptr,M,N,K,stride_am,stride_ak,stride_bk,stride_bn,stride_cm,stride_cn".split(",")
PITCHES = ("stride_am", "stride_bk", "stride_cm")  # row pitches, multiples of PAD
PAD = 16  # row pitch multiple (elements): 32-byte aligned bf16 rows
LOWERING = ["tiling", "dot-lowering", "pipeline"]
needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on PATH")


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(20261129)


def make_matmul(num_stages: int = 3, instruction: str = "auto") -> Module:
    """The example matmul specialized for row-major operands with 16-aligned pointers and row pitches (M, N, K
    arbitrary), canonicalized."""
    types = {a: PointerType(bf16) if a.endswith("ptr") else i32 for a in MM}
    module = compile_to_ir(matmul.matmul_kernel, types, {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32},
                           divisibility={a: 16 for a in MM if a.endswith("ptr") or a in PITCHES},
                           equal_to_one={"stride_ak", "stride_bn", "stride_cn"}, num_warps=4)
    func = module.functions[0]
    func.attrs["num_stages"] = num_stages
    func.attrs["dot_instruction"] = instruction
    return run_passes(module, ["canonicalize"])


def padded(g: torch.Generator, rows: int, cols: int) -> torch.Tensor:
    """Random rows x cols values in rows of a multiple of PAD elements; the padding is NaN, so a copy that reads
    past a masked edge (instead of zero-filling) poisons the result."""
    pitch = -(-cols // PAD) * PAD
    t = torch.full((rows, pitch), float("nan")).bfloat16()
    t[:, :cols] = torch.randn(rows, cols, generator=g).bfloat16()
    return t


def matmul_args(g: torch.Generator, m: int, n: int, k: int) -> list[Any]:
    """Arguments with 16-element row pitches (the padding columns hold NaNs the kernel must not use)."""
    a, b = padded(g, m, k), padded(g, k, n)
    c = nan_like((m, b.shape[1]), torch.bfloat16)
    return [a, b, c, torch.randn(n, generator=g).bfloat16(), m, n, k, a.shape[1], 1, b.shape[1], 1, c.shape[1], 1]


def grid(m: int, n: int) -> tuple[int, int, int]:
    return (-(-m // 64), -(-n // 64), 1)


def interpreted(module: Module, m: int, n: int, args: list[Any]) -> torch.Tensor:
    out = clone_args(args)
    interpret(module.functions[0], grid(m, n), out)
    return out[2]


def test_pipeline_is_registered_and_follows_dot_lowering() -> None:
    from minitriton.passes import PASSES

    assert "pipeline" in PASSES and LOWERING.index("pipeline") == LOWERING.index("dot-lowering") + 1
    assert PIPELINE[PIPELINE.index("dot-lowering") + 1] == "pipeline"  # on by default


@pytest.mark.parametrize("num_stages", [2, 3, 4])
@pytest.mark.parametrize("shape", [(64, 64, 64), (100, 70, 90)])
def test_pipelined_matmul_interprets_like_tile_ir(num_stages: int, shape: tuple[int, int, int],
                                                  gen: torch.Generator) -> None:
    m, n, k = shape
    args = matmul_args(gen, m, n, k)
    want = interpreted(make_matmul(num_stages), m, n, args)
    pipelined = run_passes(make_matmul(num_stages), LOWERING)
    text = str(pipelined)
    # the wgmma dot reads the slots in place: every depth fits the 48 KB of static shared memory (4 stages of
    # 8 KB and the accumulator conversion's 16 KB of scratch: exactly 48 KB)
    assert len(re.findall(r'"mt.alloc_ring"\(\) \{stages = %d[,}]' % num_stages, text)) == 2
    assert "dynamic_shared_memory" not in text
    assert '"mt.load"' not in text.split('"scf.for"')[1].split('"mt.async_wait"() {pending = 0}')[0]
    got = interpreted(pipelined, m, n, args)
    assert torch.equal(got[:, :n], want[:, :n])
    ref = args[0][:, :k].double() @ args[1][:, :n].double()
    assert not torch.isnan(got[:, :n]).any()
    assert (got[:, :n].double() - ref).abs().max() <= 2e-2 * ref.abs().max()  # bf16 output rounding
    assert torch.isnan(got[:, n:]).all()  # the padding columns of C are never written


def test_pass_applies_to_tile_ir_without_layouts(gen: torch.Generator) -> None:
    args = matmul_args(gen, 100, 70, 90)
    want = interpreted(make_matmul(3), 100, 70, args)
    pipelined = run_passes(make_matmul(3), ["pipeline"])
    assert str(pipelined).count('"mt.async_copy"') == 6  # 2 operands x (2 prologue stages + the steady state)
    assert torch.equal(interpreted(pipelined, 100, 70, args)[:, :70], want[:, :70])


def test_copy_masks_are_recomputed_not_converted() -> None:
    """The copies want 16-byte runs per thread (a copy layout): pointers are converted once before the loop, the
    per-iteration masks are recomputed in that layout (no i1 tile through shared memory in the loop)."""
    text = str(run_passes(make_matmul(3, "mma"), LOWERING))
    assert not re.search(r'"mt.convert_layout"\([^)]*\) : \(tensor<\w+xi1', text)
    assert len(re.findall(r'"mt.convert_layout"\([^)]*\) : \(tensor<\w+x!mt.ptr', text)) == 2


def test_num_stages_one_leaves_the_loop_alone() -> None:
    assert "mt.async_copy" not in str(run_passes(make_matmul(1), LOWERING))


def lowered_ptx(instruction: str, num_stages: int = 3) -> tuple[str, str]:
    module = run_passes(make_matmul(num_stages, instruction), LOWERING)
    name = module.functions[0].attrs["sym_name"]
    return emit_ptx(module, name), name


@needs_ptxas
@pytest.mark.parametrize("instruction", ["mma", "wgmma"])
def test_pipelined_ptx_assembles(instruction: str) -> None:
    ptx, _ = lowered_ptx(instruction)
    assemble(ptx)
    ahead = 2  # num_stages - 1 (wgmma: reading the slots in place, asynchronously, the copies follow the dot)
    copies = r"cp\.async\.cg\.shared\.global \[%r\d+(\+\d+)?\], \[%rd\d+\], 16, %r\d+;"
    assert len(re.findall(copies, ptx)) == (ahead + 1) * 2 * 2
    assert ptx.count("cp.async.commit_group;") == ahead + 1
    assert f"cp.async.wait_group {ahead - 1};" in ptx and "cp.async.wait_group 0;" in ptx
    assert ("wgmma.mma_async" in ptx) == (instruction == "wgmma")
    assert ("mma.sync.aligned" in ptx) == (instruction == "mma")


@pytest.mark.parametrize("instruction", ["mma", "wgmma"])
@pytest.mark.parametrize("shape", [(64, 64, 64), (100, 70, 90)])
def test_simulated_pipelined_ptx_matches_interpreter(instruction: str, shape: tuple[int, int, int],
                                                     gen: torch.Generator) -> None:
    m, n, k = shape
    args = matmul_args(gen, m, n, k)
    want = interpreted(make_matmul(3, instruction), m, n, args)
    ptx, name = lowered_ptx(instruction)
    got = clone_args(args)
    run_ptx(ptx, name, grid(m, n), got, 128)
    assert torch.equal(got[2][:, :n], want[:, :n])


def test_simulator_flags_a_slot_read_before_its_group_landed(gen: torch.Generator) -> None:
    ptx, name = lowered_ptx("mma")
    early = ptx.replace("cp.async.wait_group 1;", "cp.async.wait_group 2;")
    assert early != ptx
    with pytest.raises(SimError, match="not waited for"):
        run_ptx(early, name, (1, 1, 1), matmul_args(gen, 64, 64, 64), 128)


def test_simulator_flags_a_read_before_the_publishing_barrier(gen: torch.Generator) -> None:
    ptx, name = lowered_ptx("mma")
    unpublished = ptx.replace("cp.async.wait_group 1;\n  bar.sync 0;", "cp.async.wait_group 1;")
    assert unpublished != ptx
    with pytest.raises(SimError, match="not published by a bar.sync"):
        run_ptx(unpublished, name, (1, 1, 1), matmul_args(gen, 64, 64, 64), 128)


# ------------------------------------------------------------------ wgmma reading the ring slots in place


def make_tiled(block: tuple[int, int, int], num_warps: int, num_stages: int) -> Module:
    """The example matmul with other tile sizes (as make_matmul), through tiling, dot-lowering and pipeline."""
    bm, bn, bk = block
    types = {a: PointerType(bf16) if a.endswith("ptr") else i32 for a in MM}
    module = compile_to_ir(matmul.matmul_kernel, types, {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk},
                           divisibility={a: 16 for a in MM if a.endswith("ptr") or a in PITCHES},
                           equal_to_one={"stride_ak", "stride_bn", "stride_cn"}, num_warps=num_warps)
    module.functions[0].attrs["num_stages"] = num_stages
    return run_passes(module, ["canonicalize"] + LOWERING)


@pytest.mark.parametrize("stages", [3, 4])
def test_wgmma_dot_reads_ring_slots_in_place(stages: int) -> None:
    """No mt.local_load / mt.local_alloc is left: the dot takes the slots (A K-major, B MN-major, 128B swizzle),
    asynchronously (async_groups = 1, an mt.dot_wait after the loop), the copies after it: with 3 stages, 2
    iterations ahead into the slot iteration i - 1 read (the dot waits and ends with a barrier); with 4, still 2
    ahead but into the slot iteration i - 2 read (`deferred_wait`: the copies run under the dot, then
    mt.dot_wait {pending = 1}, no second barrier)."""
    text = str(make_tiled((128, 128, 64), 8, stages))
    assert "mt.local_load" not in text and "mt.local_alloc" not in text
    slot = r'"mt.ring_slot"\(%\w+, %\w+\) : \(tensor<{}x{}xbf16, #mt.shared<\{{swizzle = 128, order = \[1, 0\], ' \
           r'operand = {}, stages = {}\}}>>'
    assert re.search(slot.format(stages, "128x64", 0, stages), text)
    assert re.search(slot.format(stages, "64x128", 1, stages), text)
    deferred = ", deferred_wait = true" if stages == 4 else ""
    assert re.search(r'"mt.dot"\(%\w+, %\w+, %\w+\) \{input_precision = "ieee", async_groups = 1' + deferred + r'\}',
                     text)
    assert text.index('"mt.dot_wait"() {pending = 0}') > text.rindex('"scf.yield"')  # after the loop
    # 2 iterations ahead either way: the next iteration's copies may still be in flight
    assert text.count('"mt.async_wait"() {pending = 1}') == 1
    body = text.split('"scf.for"')[1]
    assert body.index('"mt.dot"') < body.index('"mt.async_copy"') < body.index('"scf.yield"')
    assert ('"mt.dot_wait"() {pending = 1}' in body) == (stages == 4)
    if stages == 4:
        assert body.index('"mt.async_commit"') < body.index('"mt.dot_wait"() {pending = 1}')
    # S x (16 + 16) KB + alignment slack: beyond 48 KB
    assert f"dynamic_shared_memory = {stages * 32768 + 1024}" in text


def ptx_of(module: Module) -> tuple[str, str]:
    """The PTX, with the dynamic shared memory (if any) declared at its launch size for the simulator, which lays
    out only sized `.shared` variables (the GPU gets the size from the launch)."""
    func = module.functions[0]
    name = func.attrs["sym_name"]
    ptx = emit_ptx(module, name)
    dynamic = int(func.attrs.get("dynamic_shared_memory", 0))
    if dynamic:
        extern = ".extern .shared .align 1024 .b8 mt_dyn[];"
        assert ptx.count(extern) == 1
        ptx = ptx.replace(extern, "").replace("{\n", "{\n  .shared .align 1024 .b8 mt_dyn[%d];\n" % dynamic, 1)
    return ptx, name


@pytest.mark.parametrize("block,warps,stages,shape", [
    ((64, 128, 64), 4, 3, (70, 200, 100)),      # B: two 64-column atoms per wgmma (LBO), K not a multiple of 64
    ((128, 128, 64), 8, 3, (130, 140, 100)),    # two warpgroups (A's rows permuted across them), 128B A and B
    ((128, 128, 64), 8, 4, (130, 140, 300)),    # deferred wait: slot i - 2 refilled under the running dot
    ((128, 256, 64), 8, 3, (150, 270, 96)),     # m64n256 wgmmas; the epilogue's exchange goes in two rounds of rows
])
def test_simulated_in_place_wgmma_matches_torch(block: tuple[int, int, int], warps: int, stages: int,
                                                shape: tuple[int, int, int], gen: torch.Generator) -> None:
    """The pipelined wgmma matmul at sizes that are not multiples of the tile, through the PTX simulator (which
    checks the cp.async groups, the proxy fence, the wgmma groups and writes into slots an in-flight wgmma reads),
    against float64 torch (bf16 output rounding)."""
    m, n, k = shape
    args = matmul_args(gen, m, n, k)
    ptx, name = ptx_of(make_tiled(block, warps, stages))
    assert "cp.async.wait_group 0;" in ptx and "wgmma.wait_group.sync.aligned 1;" in ptx
    got = clone_args(args)
    grid_mn = (-(-m // block[0]), -(-n // block[1]), 1)
    run_ptx(ptx, name, grid_mn, got, 32 * warps)
    ref = args[0][:, :k].double() @ args[1][:, :n].double()
    assert (got[2][:, :n].double() - ref).abs().max() <= 2e-2 * ref.abs().max()
    assert torch.isnan(got[2][:, n:]).all()


@pytest.mark.parametrize("mutation,error", [
    (("wgmma.wait_group.sync.aligned 1;", ""), "in-flight wgmma"),  # slots rewritten under a running wgmma
    (("  fence.proxy.async.shared::cta;\n", ""), "fence.proxy.async"),  # cp.async data unfenced for wgmma
    (("1, 1, 1, 0, 1;", "1, 1, 1, 0, 0;"), None),  # B read K-major: wrong numbers (or bytes of the next slot)
])
def test_simulator_catches_broken_in_place_pipelines(mutation: tuple[str, str], error: str | None,
                                                     gen: torch.Generator) -> None:
    ptx, name = ptx_of(make_tiled((64, 128, 64), 4, 4))
    broken = ptx.replace(*mutation)
    assert broken != ptx
    args = matmul_args(gen, 64, 128, 256)
    if error is None:
        try:
            run_ptx(broken, name, (1, 1, 1), args, 128)
        except SimError:
            return
        ref = args[0][:, :256].double() @ args[1][:, :128].double()
        assert (args[2][:, :128].double() - ref).abs().max() > 0.1 * ref.abs().max()
        return
    with pytest.raises(SimError, match=error):
        run_ptx(broken, name, (1, 1, 1), args, 128)


@needs_ptxas
@pytest.mark.parametrize("block,warps,stages,max_registers", [
    ((128, 128, 64), 8, 4, 128),
    # 128 x 256: 255 registers and 1.7 KB of spills with the per-element epilogue conversion; 204 with the
    # swizzled vector exchange (codegen/layout_moves.py swizzled_exchange). 232: what a consumer warpgroup gets
    # under setmaxnreg in a warp-specialized kernel.
    ((128, 256, 64), 8, 3, 232),
    ((128, 256, 64), 8, 4, 232),  # 4 x 48 KB of ring + 32 KB of static scratch: 225 KB of the 227
    ((128, 128, 64), 8, 5, 128),
])
def test_matmul_configs_assemble_without_wgmma_serialization(block: tuple[int, int, int], warps: int, stages: int,
                                                             max_registers: int) -> None:
    """The MATMUL_CONFIGS tiles (M, N, K multiples of 16, as the JIT specializes 8192^3): ptxas accepts the PTX,
    warns about nothing and does not serialize the wgmmas (an instruction touching the accumulator registers of
    a wgmma in flight makes ptxas serialize them, said as `info (C7514) Potential Performance Loss: wgmma.mma_async
    instructions are serialized ...`: checked to appear when an add of an accumulator register is slipped in after
    the loop's wgmma.wait_group 1), and neither tile spills or exceeds its register budget."""
    bm, bn, bk = block
    module = make_config(block, warps, stages)
    assert module.functions[0].attrs["dynamic_shared_memory"] == stages * (bm + bn) * bk * 2 + 1024
    ptx, _ = ptx_of(module)
    report = run_ptxas(emit_ptx(module, module.functions[0].attrs["sym_name"]))
    assert not serialized(report.log) and "warning" not in report.log.lower(), report.log
    assert report.spill_stores == 0 and report.registers <= max_registers, report.log
    assert report.smem + module.functions[0].attrs["dynamic_shared_memory"] <= 227 * 1024  # an sm_90 block's most
    accumulator = re.search(r"wgmma\.mma_async[^{]*\{(%f\d+),", ptx).group(1)  # type: ignore[union-attr]
    touched = ptx.replace("wgmma.wait_group.sync.aligned 1;",
                          f"wgmma.wait_group.sync.aligned 1;\n  add.f32 {accumulator}, {accumulator}, 0f3F800000;", 1)
    assert serialized(run_ptxas(touched).log)
    assert ptx.count("wgmma.mma_async") == (bm // 64 // (warps // 4)) * (bk // 16)  # per warpgroup: m64 x N x k16


def make_config(block: tuple[int, int, int], warps: int, stages: int) -> Module:
    """The example matmul as the JIT specializes it for 8192^3 (M, N, K and the pitches multiples of 16, unit inner
    strides, GROUP_M 8), through the compiler's pass pipeline."""
    bm, bn, bk = block
    types = {a: PointerType(bf16) if a.endswith("ptr") else i32 for a in MM}
    module = compile_to_ir(matmul.matmul_kernel, types, {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                           divisibility={a: 16 for a in MM if a.endswith("ptr") or a in PITCHES + ("M", "N", "K")},
                           equal_to_one={"stride_ak", "stride_bn", "stride_cn"}, num_warps=warps)
    module.functions[0].attrs["num_stages"] = stages
    return run_passes(module, PIPELINE)


def serialized(log: str) -> bool:
    return bool(re.search(r"wgmma\.mma_async instructions are serialized", log))


@mt.kernel
def fixed_a_kernel(a_ptr, b_ptr, c_ptr, K, stride_bk, BLOCK_K: mt.constexpr):
    """C = sum over K blocks j of A @ B[j]: A (64 x BLOCK_K) loaded once, before the loop; B's blocks in it."""
    rm = mt.arange(0, 64)
    rk = mt.arange(0, BLOCK_K)
    a = mt.load(a_ptr + rm[:, None] * BLOCK_K + rk[None, :])
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rm[None, :]
    acc = mt.zeros((64, 64), mt.float32)
    for k in range(0, K, BLOCK_K):
        b = mt.load(b_ptrs, mask=k + rk[:, None] < K, other=0.0)
        acc = mt.dot(a, b, acc)
        b_ptrs += BLOCK_K * stride_bk
    mt.store(c_ptr + rm[:, None] * 64 + rm[None, :], acc)


def test_in_place_slot_with_a_staged_operand(gen: torch.Generator) -> None:
    """A loop-invariant A is staged per dot (scratch buffer), B's ring slot is read in place (MN-major): the dot
    stays synchronous (an async one would have the next iteration restage A under the running wgmma), and the PTX
    simulator agrees with float64 torch on a ragged K."""
    types = {"a_ptr": PointerType(bf16), "b_ptr": PointerType(bf16), "c_ptr": PointerType(f32), "K": i32,
             "stride_bk": i32}
    module = compile_to_ir(fixed_a_kernel, types, {"BLOCK_K": 32}, divisibility={"a_ptr": 16, "b_ptr": 16,
                           "c_ptr": 16, "stride_bk": 16}, num_warps=4)
    module.functions[0].attrs["num_stages"] = 3
    module = run_passes(module, ["canonicalize"] + LOWERING)
    text = str(module)
    assert '"mt.local_alloc"' in text and '"mt.ring_slot"' in text and "async_groups" not in text
    k = 100
    a = torch.randn(64, 32, generator=gen).bfloat16()
    b = torch.randn(k, 64, generator=gen).bfloat16()
    c = torch.full((64, 64), float("nan"))
    ptx, name = ptx_of(module)
    args = [a, b, c, k, 64]
    run_ptx(ptx, name, (1, 1, 1), args, 128)
    blocks = torch.zeros(-(-k // 32) * 32, 64, dtype=torch.float64)
    blocks[:k] = b.double()
    want = a.double() @ blocks.reshape(-1, 32, 64).sum(0)
    assert (args[2].double() - want).abs().max() <= 1e-4 * want.abs().max()  # f32 accumulation


# ------------------------------------------------------------------ the epilogue's accumulator -> store exchange


def epilogue_maps(block: tuple[int, int, int], warps: int, stages: int) -> tuple[Any, Any]:
    """(source, destination) ThreadMaps of the GEMM epilogue's convert_layout (wgmma accumulator -> store layout)."""
    from minitriton.ir.layouts import thread_map

    module = make_config(block, warps, stages)
    (convert,) = [op for op in module.functions[0].walk() if op.name == "mt.convert_layout"
                  and op.operands[0].type.encoding.kind == "mma"]
    return (thread_map(convert.operands[0].type.encoding, convert.operands[0].type.shape),
            thread_map(convert.result.type.encoding, convert.result.type.shape))


def bank_conflicts(tmap: Any, offset: Any, width: int, size: int) -> int:
    """The worst number of distinct 4-byte words one bank serves in a single vector access of a warp, over the
    warps and the register groups of `width` elements (1 = conflict-free; 16-byte vectors are served a quarter
    warp at a time)."""
    threads_per_phase = min(32, 128 // (width * size))
    worst = 1
    for warp in range(tmap.num_warps):
        for start in range(0, tmap.num_regs, width):
            for phase in range(0, 32, threads_per_phase):
                words: dict[int, set[int]] = {}
                for lane in range(phase, phase + threads_per_phase):
                    row, col = tmap.element(32 * warp + lane, start)
                    for byte in range(0, width * size, 4):
                        word = (offset(row, col) + byte) // 4
                        words.setdefault(word % 32, set()).add(word)
                worst = max(worst, max(len(w) for w in words.values()))
    return worst


def test_epilogue_exchange_is_bank_conflict_free() -> None:
    """The 128 x 256 accumulator (bf16 after the cast) goes to the store layout through the swizzled buffer: the
    fragment's 4-byte pairs and the store layout's 16-byte reads each touch every bank once per access (the plain
    row-major buffer would serve the pairs 8 ways, which this check must see)."""
    from minitriton.codegen.layout_moves import swizzled_offset, vector_width

    src, dst = epilogue_maps((128, 256, 64), 8, 3)
    rows_per_round, row_bytes = 64, 256 * 2
    assert (vector_width(src, 2), vector_width(dst, 2)) == (2, 8)

    def swizzled(row: int, col: int) -> int:
        return swizzled_offset(row % rows_per_round, col, row_bytes, 2)

    def plain(row: int, col: int) -> int:
        return (row % rows_per_round) * row_bytes + 2 * col

    assert bank_conflicts(src, swizzled, 2, 2) == 1 and bank_conflicts(dst, swizzled, 8, 2) == 1
    assert bank_conflicts(src, plain, 2, 2) == 8


def test_epilogue_exchange_ptx_is_vectorized_in_static_rounds() -> None:
    """The exchange's PTX: bf16 pairs stored as 32-bit words, read back as 16-byte vectors, two rounds of 64 rows
    (32 KB of scratch) with no per-register predicate and no per-element address."""
    ptx, _ = ptx_of(make_config((128, 256, 64), 8, 3))
    epilogue = ptx[ptx.index("wgmma.wait_group.sync.aligned 0;"):]
    assert epilogue.count("st.shared.b32") == 64 and epilogue.count("ld.shared.v4.b32") == 16
    assert "st.shared.b16" not in epilogue and "@%p" not in epilogue.split("st.global")[0].split("ld.shared")[0]
    assert re.search(r"\.shared \.align \d+ \.b8 smem\[32768\];", ptx)


@pytest.mark.parametrize("stages", [3, 4])
def test_simulated_specialized_matmul_with_vector_epilogue(stages: int, gen: torch.Generator) -> None:
    """The 128 x 256 config as the JIT builds it for aligned problems (vector global stores, so the exchange reads
    16-byte vectors and writes bf16 pairs) at M, N, K multiples of 16 but not of the tile, through the PTX
    simulator against float64 torch (bf16 output rounding)."""
    m, n, k = 144, 272, 96 * stages
    args = matmul_args(gen, m, n, k)
    ptx, name = ptx_of(make_config((128, 256, 64), 8, stages))
    assert "ld.shared.v4.b32" in ptx and "st.global.v4.b32" in ptx
    got = clone_args(args)
    tiles = -(-m // 128) * -(-n // 256)
    run_ptx(ptx, name, (tiles, 1, 1), got, 256)
    ref = args[0][:, :k].double() @ args[1][:, :n].double()
    assert (got[2][:, :n].double() - ref).abs().max() <= 2e-2 * ref.abs().max()


# ------------------------------------------------------------------ the TMA ring's layout contract (gemm.md v2)


@pytest.mark.parametrize("operand,shape,warps", [
    (0, (128, 64), 8), (0, (128, 64), 4), (0, (64, 64), 4), (0, (128, 128), 8), (0, (256, 64), 8),
    (1, (64, 256), 8), (1, (64, 128), 8), (1, (128, 64), 4)])
def test_tma_ring_boxes_lay_out_the_wgmma_operand(operand: int, shape: tuple[int, int], warps: int) -> None:
    """Landing with TMA's 128B swizzle (16-byte chunk j of box row r at chunk j ^ (r % 8): the H200 rule, applied
    to address bits, so each box must start 1024-aligned), the boxes of `wgmma_ring_boxes` put every element of
    the tile exactly where the cp.async ring puts it (codegen/wgmma.py operand_offset, what wgmma reads), and
    cover the slot once. A's permuted rows: 8-row boxes (16 for 128 rows at K = 64)."""
    from minitriton.codegen.tma import wgmma_ring_boxes
    from minitriton.codegen.wgmma import operand_offset

    want = operand_offset(operand, shape, 128, warps)
    seen = set()
    boxes = wgmma_ring_boxes(operand, shape, warps)
    for (row0, col0), (rows, cols), dst in boxes:
        assert dst % 1024 == 0 and cols * 2 == 128
        for r in range(rows):
            for c in range(cols):
                chunk, byte = divmod(2 * c, 16)
                landed = dst + 128 * r + 16 * (chunk ^ (r % 8)) + byte
                assert landed == want(row0 + r, col0 + c), (row0 + r, col0 + c)
                seen.add(landed)
    assert seen == set(range(0, 2 * shape[0] * shape[1], 2))
    assert len(boxes) == (shape[0] // 8 * shape[1] // 64 if operand == 0 else shape[1] // 64)


@pytest.mark.parametrize("shape", [(128, 64), (256, 64), (128, 128)])
def test_paired_a_boxes_land_where_the_rank2_boxes_do(shape: tuple[int, int]) -> None:
    """wgmma_ring_boxes(0, ..., rank=4) on 8 warps: each (2, 1, 8, 64) box over A viewed as [M / 64, 8, 8, K]
    (rows row + 64 i + g) lands every element where wgmma reads it (the swizzle row is the flattened box row
    8 i + g, whose row % 8 is g), the slot is covered once, with half the boxes of rank 2."""
    from minitriton.codegen.tma import wgmma_ring_boxes
    from minitriton.codegen.wgmma import operand_offset

    want = operand_offset(0, shape, 128, 8)
    seen = set()
    boxes = wgmma_ring_boxes(0, shape, 8, rank=4)
    for (row0, col0), box, dst in boxes:
        assert box == (2, 1, 8, 64) and dst % 1024 == 0
        for i in range(2):
            for g in range(8):
                r = 8 * i + g  # the box row, flattened
                for c in range(64):
                    chunk, byte = divmod(2 * c, 16)
                    landed = dst + 128 * r + 16 * (chunk ^ (r % 8)) + byte
                    assert landed == want(row0 + 64 * i + g, col0 + c), (row0 + 64 * i + g, col0 + c)
                    seen.add(landed)
    assert seen == set(range(0, 2 * shape[0] * shape[1], 2))
    assert 2 * len(boxes) == len(wgmma_ring_boxes(0, shape, 8))
    with pytest.raises(ValueError, match="rank-4"):
        wgmma_ring_boxes(0, (128, 64), 4, rank=4)  # one warpgroup: its row groups are in order, nothing pairs
    with pytest.raises(ValueError, match="rank-4"):
        wgmma_ring_boxes(1, (64, 256), 8, rank=4)


def test_tma_ring_boxes_reject_what_tma_cannot_fill() -> None:
    from minitriton.codegen.tma import wgmma_ring_boxes

    with pytest.raises(ValueError):
        wgmma_ring_boxes(0, (128, 32), 8)  # 64-byte rows: not the 128B swizzle
    with pytest.raises(ValueError):
        wgmma_ring_boxes(1, (64, 256), 8, elem=4)


def test_pointer_tensor_maps_are_encoded_once_per_argument_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """runtime/tma.py pointer_tensor_map: cuTensorMapEncodeTiled (replaced by a recorder) gets the matrix
    innermost first with the row pitch in bytes and the ring box; equal arguments hit the cache."""
    import ctypes

    from cuda.bindings import driver as cu

    from minitriton.runtime import tma

    calls: list = []

    class FakeMap:
        def __init__(self, data: bytes):
            self.buffer = ctypes.create_string_buffer(data, len(data))

        def getPtr(self) -> int:  # noqa: N802 - cuda-bindings' spelling
            return ctypes.addressof(self.buffer)

    def fake(*args: Any) -> tuple:
        calls.append(args)
        return cu.CUresult.CUDA_SUCCESS, FakeMap(bytes((len(calls) + i) % 256 for i in range(128)))

    monkeypatch.setattr(cu, "cuTensorMapEncodeTiled", fake)
    tma.clear_cache()
    try:
        first = tma.pointer_tensor_map(0x10000, bf16, 1000, 136, 144, (8, 64), 128)
        assert tma.pointer_tensor_map(0x10000, bf16, 1000, 136, 144, (8, 64), 128) == first and len(calls) == 1
        other = tma.pointer_tensor_map(0x10000, bf16, 1000, 136, 144, (64, 64), 128)
        assert other != first and len(calls) == 2
        args = calls[0]
        assert args[1] == 2 and args[2] == 0x10000
        assert [int(d) for d in args[3]] == [136, 1000] and [int(s) for s in args[4]] == [288]
        assert [int(b) for b in args[5]] == [64, 8]
        assert args[8] == cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B
    finally:
        tma.clear_cache()
    with pytest.raises(tma.TensorDescriptorError):
        tma.pointer_map_arguments(0x10008, bf16, 64, 64, 64, (8, 64), 128)  # misaligned base
    with pytest.raises(tma.TensorDescriptorError):
        tma.pointer_map_arguments(0x10000, bf16, 64, 64, 60, (8, 64), 128)  # 120-byte row pitch
    with pytest.raises(tma.TensorDescriptorError):
        tma.pointer_map_arguments(0x10000, bf16, 64, 64, 64, (8, 32), 128)  # box row != swizzle span


# ------------------------------------------------------------------------- TMA-fed rings (gemm.md v2)

TMA_ARGS = ("a_tma", "b_tma")


def make_tma_ring(block: tuple[int, int, int], warps: int, stages: int, group_m: int = 0,
                  a_box: tuple[int, ...] | None = None, passes: list[str] | None = None,
                  paired_a: bool = False) -> Module:
    """matmul_tma_ring_kernel specialized like make_tiled (or, with group_m, like make_config for 8192^3), with
    descriptors in the ring's boxes ([8, BLOCK_K] for A unless `a_box`, or [2, 1, 8, BLOCK_K] with paired_a;
    [BLOCK_K, 64] for B)."""
    from minitriton.runtime.tma import parse_descriptor_code

    bm, bn, bk = block
    a_box = a_box or ((2, 1, 8, bk) if paired_a else (8, bk))
    types: dict[str, Any] = {a: PointerType(bf16) if a.endswith("ptr") else i32 for a in MM}
    types["a_tma"] = parse_descriptor_code(f"tensordesc<bf16[{','.join(map(str, a_box))}]>")
    types["b_tma"] = parse_descriptor_code(f"tensordesc<bf16[{bk},64]>")
    divisible = PITCHES + (("M", "N", "K") if group_m else ())
    constexprs = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, **({"GROUP_M": group_m} if group_m else {})}
    module = compile_to_ir(matmul.matmul_tma_ring_kernel, types, constexprs,
                           divisibility={a: 16 for a in MM if a.endswith("ptr") or a in divisible},
                           equal_to_one={"stride_ak", "stride_bn", "stride_cn"}, num_warps=warps)
    module.functions[0].attrs["num_stages"] = stages
    return run_passes(module, passes or ["canonicalize"] + LOWERING)


def tma_ring_args(g: torch.Generator, m: int, n: int, k: int, block_k: int, paired_a: bool = False) -> list[Any]:
    """matmul_args plus the two descriptors, over the same (unpadded) A and B views."""
    args = matmul_args(g, m, n, k)
    return args + list(matmul.tma_ring_descriptors(args[0][:, :k], args[1][:, :n], block_k, paired_a))


@pytest.mark.parametrize("stages", [3, 4])
def test_tma_ring_replaces_the_cp_async_copies(stages: int) -> None:
    """With `a_tma` / `b_tma` descriptors in the ring's boxes, the in-place wgmma ring is filled by TMA: each
    mt.async_copy takes (ring, slot, descriptor, row, col, valid), the rings have slot barriers, the loop top waits
    on both slots' barriers (one block barrier after the second), nothing is committed or drained, and the copies
    still follow the dot (S = 4: into the slot read two iterations back, then mt.dot_wait {pending = 1})."""
    text = str(make_tma_ring((128, 128, 64), 8, stages))
    assert text.count("tma_barriers = true") == 2
    assert "mt.async_commit" not in text and '"mt.async_wait"() {pending' not in text
    copies = re.findall(r'"mt.async_copy"\(([^)]*)\)', text)
    ahead = stages - 1 if stages < 4 else stages - 2  # prologue fills; the body issues one more
    assert len(copies) == 2 * (ahead + 1) and all(len(c.split(", ")) == 6 for c in copies)
    assert all("!mt.tensordesc" in line for line in text.splitlines() if '"mt.async_copy"' in line)
    body = text.split('"scf.for"')[1]
    waits = re.findall(r'"mt.async_wait"\(%\w+, (%\w+), (%\w+)\)( \{barrier = true\})?', body)
    assert len(waits) == 2 and waits[0][:2] == waits[1][:2] and not waits[0][2] and waits[1][2]
    assert body.index('"mt.async_wait"') < body.index('"mt.ring_slot"') < body.index('"mt.dot"') \
        < body.index('"mt.async_copy"') < body.index('"scf.yield"')
    assert ('"mt.dot_wait"() {pending = 1}' in body) == (stages == 4)
    assert text.index('"mt.dot_wait"() {pending = 0}') > text.rindex('"scf.yield"')


def test_tma_ring_needs_descriptors_in_the_ring_boxes() -> None:
    """The plain kernel, and the TMA kernel given an A descriptor of other boxes, keep the cp.async ring."""
    for module in (make_tiled((128, 128, 64), 8, 4), make_tma_ring((128, 128, 64), 8, 4, a_box=(16, 64))):
        text = str(module)
        assert "tma_barriers" not in text and '"mt.async_wait"() {pending = 1}' in text


@pytest.mark.parametrize("block,warps,stages,shape", [
    ((64, 128, 64), 4, 3, (70, 200, 100)),      # one warpgroup; K not a multiple of 64: TMA zero-fills
    ((128, 128, 64), 8, 3, (130, 140, 100)),    # two warpgroups: A's 8-row boxes land in permuted row groups
    ((128, 128, 64), 8, 4, (130, 140, 300)),    # deferred wait: slot i - 2 refilled under the running dot
    ((128, 256, 64), 8, 4, (150, 270, 96)),     # m64n256, four B column atoms per stage
])
def test_simulated_tma_ring_matches_torch(block: tuple[int, int, int], warps: int, stages: int,
                                          shape: tuple[int, int, int], gen: torch.Generator) -> None:
    """The TMA-fed wgmma matmul at ragged sizes through the PTX simulator (TMA boxes with the 128B swizzle and zero
    fill, mbarrier phases, reads only after the wait, no TMA into bytes an in-flight wgmma reads) against float64
    torch (bf16 output rounding); the C padding stays untouched."""
    m, n, k = shape
    args = tma_ring_args(gen, m, n, k, block[2])
    ptx, name = ptx_of(make_tma_ring(block, warps, stages))
    assert "cp.async.cg" not in ptx and "cp.async.wait_group" not in ptx
    got = clone_args(args)
    run_ptx(ptx, name, (-(-m // block[0]), -(-n // block[1]), 1), got, 32 * warps)
    ref = args[0][:, :k].double() @ args[1][:, :n].double()
    assert (got[2][:, :n].double() - ref).abs().max() <= 2e-2 * ref.abs().max()
    assert torch.isnan(got[2][:, n:]).all()


@pytest.mark.parametrize("block,stages,shape", [
    ((128, 128, 64), 3, (192, 140, 100)),  # M = 192: the second tile's lower row groups are past M (zero fill)
    ((128, 256, 64), 4, (128, 270, 96)),
])
def test_simulated_tma_ring_with_paired_a_boxes(block: tuple[int, int, int], stages: int,
                                                shape: tuple[int, int, int], gen: torch.Generator) -> None:
    """A in rank-4 boxes of two row groups (tma_ring_descriptors(paired_a=True): 8 `cp.async.bulk.tensor.4d` a
    stage for 128 rows instead of 16 of .2d) through the PTX simulator against float64 torch."""
    m, n, k = shape
    args = tma_ring_args(gen, m, n, k, block[2], paired_a=True)
    assert args[-2].block_shape == (2, 1, 8, 64) and args[-2].shape == (m // 64, 8, 8, k)
    ptx, name = ptx_of(make_tma_ring(block, 8, stages, paired_a=True))
    fills = stages - 1 if stages < 4 else stages - 2  # prologue fills; the loop body issues one more
    assert ptx.count("cp.async.bulk.tensor.4d") == (fills + 1) * block[0] // 16
    assert ptx.count("cp.async.bulk.tensor.2d") == (fills + 1) * block[1] // 64  # B's boxes
    got = clone_args(args)
    run_ptx(ptx, name, (-(-m // block[0]), -(-n // block[1]), 1), got, 256)
    ref = args[0][:, :k].double() @ args[1][:, :n].double()
    assert (got[2][:, :n].double() - ref).abs().max() <= 2e-2 * ref.abs().max()
    assert torch.isnan(got[2][:, n:]).all()
    with pytest.raises(ValueError, match="multiple of 64"):
        matmul.tma_ring_descriptors(args[0][:100, :k], args[1][:, :n], 64, paired_a=True)


def _without_waits(ptx: str) -> str:
    return re.sub(r"\$L_ring_wait_\d+:\n\s*mbarrier.try_wait[^\n]*\n\s*@!%p\d+ bra \$L_ring_wait_\d+;\n", "", ptx)


def _fixed_parity(ptx: str) -> str:
    return re.sub(r"(mbarrier.try_wait.parity.shared::cta.b64 %p\d+, \[%r\d+\]), %r\d+;", r"\1, 0;", ptx)


@pytest.mark.parametrize("mutation,error", [
    (_without_waits, "before waiting on its mbarrier"),  # wgmma reads a slot whose TMA load was not waited for
    (_fixed_parity, "deadlock"),  # the phase parity does not flip per lap of the ring
    (lambda p: p.replace("wgmma.wait_group.sync.aligned 1;", ""), "in-flight wgmma"),  # refill under a running dot
])
def test_simulator_catches_broken_tma_rings(mutation: Any, error: str, gen: torch.Generator) -> None:
    ptx, name = ptx_of(make_tma_ring((64, 128, 64), 4, 4))
    broken = mutation(ptx)
    assert broken != ptx
    with pytest.raises(SimError, match=error):
        run_ptx(broken, name, (1, 1, 1), tma_ring_args(gen, 64, 128, 320, 64), 128)


@needs_ptxas
@pytest.mark.parametrize("block,warps,stages,max_registers", [
    ((128, 256, 64), 8, 4, 176), ((128, 256, 64), 8, 3, 176), ((128, 128, 64), 8, 5, 104),
    ((128, 128, 64), 8, 4, 104)])
def test_tma_ring_configs_assemble(block: tuple[int, int, int], warps: int, stages: int,
                                   max_registers: int) -> None:
    """The MATMUL_CONFIGS tiles fed by TMA (as the JIT specializes 8192^3): ptxas accepts them without warnings
    or wgmma serialization, no spills, fewer registers than the cp.async ring (222 / 122: the copies' address math
    is gone), shared memory within an sm_90 block's 227 KB; per stage one expect_tx per ring, BLOCK_M / 8 A boxes
    and BLOCK_N / 64 B boxes."""
    bm, bn, bk = block
    module = make_tma_ring(block, warps, stages, group_m=8, passes=PIPELINE)
    ptx, _ = ptx_of(module)
    report = run_ptxas(emit_ptx(module, module.functions[0].attrs["sym_name"]))
    assert not serialized(report.log) and "warning" not in report.log.lower(), report.log
    assert report.spill_stores == 0 and report.registers <= max_registers, report.log
    assert report.smem + module.functions[0].attrs["dynamic_shared_memory"] <= 227 * 1024
    fills = stages - 1 if stages < 4 else stages - 2  # prologue fills; the loop body issues one more
    assert ptx.count("cp.async.bulk.tensor.2d") == (fills + 1) * (bm // 8 + bn // 64)
    assert ptx.count("mbarrier.arrive.expect_tx") == (fills + 1) * 2
    assert "cp.async.cg" not in ptx and "mbarrier.try_wait.parity" in ptx and "wgmma.mma_async" in ptx


def test_tma_ring_matmul_interprets(monkeypatch: pytest.MonkeyPatch, gen: torch.Generator) -> None:
    """matmul_tma_ring under MINITRITON_INTERPRET=1 at a GEMM config (the interpreter runs the tile IR: the loads
    define the result, the descriptors ride along)."""
    monkeypatch.setenv("MINITRITON_INTERPRET", "1")
    check_interpreted("matmul_tma_ring", 2, gen)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the H200)")
@pytest.mark.parametrize("config_index", [0, 1, 2, 3])
def test_gpu_tma_ring_matmul_matches_torch(config_index: int) -> None:
    """matmul_tma_ring at each 128-row MATMUL_CONFIG on ragged and tiny shapes against torch (relative error
    <= 1e-2), each config in a process of its own."""
    check_on_gpu("matmul_tma_ring", config_index)


def test_gemm_ab_lists_its_variants_and_formats_a_table(capsys: pytest.CaptureFixture,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """tools/gemm_ab.py (GPU-only timing) imports, lists every variant's configs and renders rows without a GPU."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "gemm_ab.py"
    spec = importlib.util.spec_from_file_location("gemm_ab", path)
    gemm_ab = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "gemm_ab", gemm_ab)
    spec.loader.exec_module(gemm_ab)  # type: ignore[union-attr]
    assert gemm_ab.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert all(f"{v}:" in listed for v in ("cp.async-ring", "tma-ring", "tma-unpipelined", "tma-ws",
                                           "tma-ws-paired", "persistent", "persistent-tma-store", "triton",
                                           "triton-tma"))
    assert listed.count("128x256x64 w8 s4") == 7  # every variant with a config list but tma-unpipelined, triton
    table = gemm_ab.format_table([("4096^3", "torch", "cuBLAS", 200.0, 200.0, "ok"),
                                  ("4096^3", "tma-ring", "128x256x64 w8 s4", 210.0, 200.0, "rel err 3e-03"),
                                  ("4096^3", "tma-ring", "128x128x64 w8 s5", None, 200.0, "wrong: relative error")])
    assert "95.2" in table and "654.5" in table and "wrong" in table
    assert gemm_ab.main(["--list", "--variants", "tma-ws", "--configs", "256x128x64_w8_s3"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["    256x128x64 w8 s3 G8"]  # '_' stands for a space
    # --rounds: ours and cuBLAS alternate, medians of each (a fake clock: ours 10, 30, 20 and cuBLAS 9, 7, 8 us)
    import benchmarks.harness as harness

    times = iter([0.030, 0.007, 0.020, 0.008])  # ms: the rounds after the first pair (10 us, 9 us)
    monkeypatch.setattr(harness, "do_bench", lambda fn: next(times))
    ours, theirs, note = gemm_ab.alternate(lambda a, b: None, None, None, 3, (10.0, 9.0))
    assert (ours, theirs) == (20.0, 8.0) and "3 rounds: ours 10-30, cuBLAS 7-9 us" in note
