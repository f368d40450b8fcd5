"""The "warp-specialize" pass (passes/warp_specialize.py): its IR, the PTX ptxas makes of it (setmaxnreg honoured,
no spills), and the warp-specialized TMA-ring matmul run through the multi-program-counter PTX simulator
(tests/ptx_sim_ws.py) at ragged sizes against float64 torch, with broken variants the simulator must reject."""
from __future__ import annotations

import re
import shutil
from typing import Any, Callable

import pytest
import torch

from gemm_checks import check_interpreted, check_on_gpu
from minitriton.codegen import emit_ptx
from minitriton.codegen.ptxas import run_ptxas
from minitriton.compiler import PIPELINE
from minitriton.ir import Module, parse_module, print_module, verify
from minitriton.kernels.examples import matmul
from minitriton.passes import run_passes
from minitriton.passes.warp_specialize import (CONSUMER_REGISTERS, PRODUCER_REGISTERS, PRODUCER_WARPS,
                                               REGISTER_FILE, consumer_registers)
from ptx_helpers import clone_args
from ptx_sim import SimError
from ptx_sim_ws import run_ws_ptx
from test_pipeline import _without_waits, make_tiled, make_tma_ring, ptx_of, tma_ring_args

needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on PATH")


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(20261130)


def make_ws(block: tuple[int, int, int], warps: int, stages: int, group_m: int = 0, paired_a: bool = False) -> Module:
    """matmul_tma_ring_kernel through the pipeline pass, then warp-specialized."""
    module = make_tma_ring(block, warps, stages, group_m=group_m, paired_a=paired_a)
    module.functions[0].attrs["warp_specialize"] = True
    module = run_passes(module, ["warp-specialize"])
    verify(module)
    return module


# ------------------------------------------------------------------------------------------------ IR


def test_pass_is_registered_after_pipeline_and_off_by_default() -> None:
    assert PIPELINE[PIPELINE.index("pipeline") + 1] == "warp-specialize"
    plain = make_tma_ring((64, 128, 64), 4, 3)
    before = print_module(plain)
    assert print_module(run_passes(plain, ["warp-specialize"])) == before  # no func attr: unchanged
    cp_async = make_tiled((64, 128, 64), 4, 3)  # a cp.async ring is not specialized even when asked
    cp_async.functions[0].attrs["warp_specialize"] = True
    before = print_module(cp_async)
    assert print_module(run_passes(cp_async, ["warp-specialize"])) == before


@pytest.mark.parametrize("stages", [3, 4])
def test_pass_splits_producer_and_consumers(stages: int) -> None:
    """A split into two partitions (mt.warp_specialize): the consumers (partition 0, the kernel's 8 warps, 232
    registers) wait for full slots without a block barrier, retire the previous dot and release its slot; the
    producer warpgroup (partition 1, 40 registers) waits for empty slots and issues every fill (always valid: its
    loop runs exactly the iterations); nothing is filled before the split; the func attrs count the producer."""
    module = make_ws((128, 128, 64), 8, stages)
    func = module.functions[0]
    text = print_module(module)
    assert func.attrs["num_warps"] == 12 and func.attrs["consumer_warps"] == 8
    assert func.attrs["min_blocks_per_sm"] == 1
    assert text.count(f'{{warps = [8, 4], registers = [232, {PRODUCER_REGISTERS}]}}') == 1
    top = func.regions[0].block
    split = next(op for op in top.ops if op.name == "mt.warp_specialize")
    assert not [op for op in top.ops[:top.ops.index(split)] if op.name == "mt.async_copy"]
    assert [op.name for op in top.ops[top.ops.index(split) + 1:]] == ["mt.return"]
    consumer, producer = (r.block for r in split.regions)
    rings = [op for op in top.ops if op.name == "mt.alloc_ring"]
    assert len(rings) == 2 and all(r.attrs["empty_arrivals"] == 2 and r.attrs["tma_barriers"] for r in rings)

    (p_loop,) = [op for op in producer.ops if op.name == "scf.for"]
    p_body = p_loop.regions[0].block
    waits = [op for op in p_body.ops if op.name == "mt.async_wait"]
    assert len(waits) == 2 and all(w.attrs == {"empty": True} for w in waits)
    copies = [op for op in p_body.ops if op.name == "mt.async_copy"]
    assert len(copies) == 2 and all(c.operands[5].defining_op.attrs["value"] is True for c in copies)
    assert p_body.ops.index(waits[-1]) < p_body.ops.index(copies[0])

    (c_loop,) = [op for op in consumer.ops if op.name == "scf.for"]
    c_body = c_loop.regions[0].block
    names = [op.name for op in c_body.ops]
    assert "mt.async_copy" not in names
    assert all(not op.attrs for op in c_body.ops if op.name == "mt.async_wait")  # no block barrier
    (dot,) = [op for op in c_body.ops if op.name == "mt.dot"]
    assert dot.attrs["deferred_wait"] and dot.attrs["async_groups"] == 1
    after = c_body.ops[c_body.ops.index(dot) + 1]
    assert after.name == "mt.dot_wait" and after.attrs["pending"] == 1
    releases = [op for op in c_body.ops if op.name == "mt.ring_release"]
    assert len(releases) == 2 and all(c_body.ops.index(r) > c_body.ops.index(after) for r in releases)
    assert consumer.ops[consumer.ops.index(c_loop) + 1].attrs == {"pending": 0}  # then the epilogue


def test_specialized_ir_round_trips() -> None:
    text = print_module(make_ws((64, 128, 64), 4, 3))
    again = parse_module(text)
    verify(again)
    assert print_module(again) == text


def test_register_budget_fits_the_register_file() -> None:
    """setmaxnreg counts are multiples of 8 in 24..256 and the register file holds both roles."""
    for consumers in (4, 8):
        inc = consumer_registers(consumers)
        assert inc % 8 == 0 and 24 <= inc <= CONSUMER_REGISTERS and PRODUCER_REGISTERS % 8 == 0
        assert 32 * consumers * inc + 32 * PRODUCER_WARPS * PRODUCER_REGISTERS <= REGISTER_FILE
    assert consumer_registers(8) == 232
    assert consumer_registers(12) == 152  # 384 consumers + 128 at 40: (65536 - 5120) / 384 = 157 -> 152


def test_jit_compiles_the_specialized_kernel_for_its_block_size() -> None:
    """matmul_tma_ws_kernel (@mt.kernel(warp_specialize=True)): metadata num_warps (the launcher's block size) and
    .maxntid count the producer warpgroup."""
    (spec,) = matmul.matmul_tma_ws_kernel.specializations
    compiled = spec.compile(target="ptx")
    assert compiled.metadata["num_warps"] == 12
    assert ".maxntid 384, 1, 1" in compiled.ptx and ".minnctapersm 1" in compiled.ptx
    (plain,) = matmul.matmul_tma_ring_kernel.specializations
    assert plain.compile(target="ptx").metadata["num_warps"] == 8
    assert matmul.matmul_tma_ws_kernel.cache_key({}, {}, 8, 4) != matmul.matmul_tma_ring_kernel.cache_key({}, {}, 8, 4)


# ------------------------------------------------------------------------------------------------ ptxas


@needs_ptxas
@pytest.mark.parametrize("block,warps,stages,paired_a", [
    ((128, 256, 64), 8, 4, False), ((128, 256, 64), 8, 3, False), ((128, 128, 64), 8, 5, False),
    ((128, 128, 64), 8, 4, False), ((256, 128, 64), 8, 3, False), ((64, 128, 64), 4, 3, False),
    ((128, 256, 64), 8, 3, True), ((256, 128, 64), 8, 3, True)])
def test_specialized_configs_assemble(block: tuple[int, int, int], warps: int, stages: int, paired_a: bool) -> None:
    """As the JIT specializes 8192^3: wgmma, TMA, mbarriers and setmaxnreg present, named consumer barriers, 0 spills,
    no C7508 (setmaxnreg ignored) / C7514 (wgmma serialized) warnings; ptxas reports the entry register count
    (65536 / threads, rounded down to 8: 168 at 384 threads). paired_a: A in rank-4 boxes (.4d copies)."""
    module = make_ws(block, warps, stages, group_m=8, paired_a=paired_a)
    ptx = emit_ptx(module, module.functions[0].attrs["sym_name"])
    assert ("cp.async.bulk.tensor.4d" in ptx) == paired_a
    threads = 32 * (warps + PRODUCER_WARPS)
    assert f".maxntid {threads}, 1, 1" in ptx and ".minnctapersm 1" in ptx
    assert ptx.count("setmaxnreg.dec.sync.aligned.u32 40;") == 1
    assert ptx.count(f"setmaxnreg.inc.sync.aligned.u32 {consumer_registers(warps)};") == 1
    assert "cp.async.bulk.tensor.2d" in ptx and "wgmma.mma_async" in ptx and "mbarrier.arrive.shared::cta.b64" in ptx
    assert f"bar.sync 1, {32 * warps};" in ptx and ptx.count("bar.sync 0;") == 2  # only the barrier inits
    report = run_ptxas(ptx)
    assert report.spill_stores == 0 and report.spill_loads == 0, report.log
    assert "C7508" not in report.log and "C7514" not in report.log and "warning" not in report.log.lower()
    assert report.registers == min(232, REGISTER_FILE // threads // 8 * 8)


# ------------------------------------------------------------------------------------------- simulator


@pytest.mark.parametrize("block,warps,stages,shape", [
    ((64, 128, 64), 4, 3, (70, 200, 300)),     # one consumer warpgroup; 5 K steps over 3 slots; K ragged
    ((128, 128, 64), 8, 4, (130, 140, 300)),   # two consumer warpgroups (2 arrivals per empty phase)
    ((128, 256, 64), 8, 4, (150, 270, 200)),   # m64n256; the epilogue's exchange on the named barrier
    ((256, 128, 64), 8, 3, (260, 140, 200)),   # two m-blocks per consumer warpgroup (tools/gemm_ab.py's 256 x 128)
])
@pytest.mark.parametrize("policy", ["round_robin", "greedy"])
def test_simulated_warp_specialized_matmul_matches_torch(block: tuple[int, int, int], warps: int, stages: int,
                                                         shape: tuple[int, int, int], policy: str,
                                                         gen: torch.Generator) -> None:
    """Producer and consumers on separate program counters (both schedules), every TMA / mbarrier / wgmma /
    race check of the simulator on, against float64 torch (bf16 output: 2e-2 of the largest |value|); C's padding
    columns untouched."""
    m, n, k = shape
    args = tma_ring_args(gen, m, n, k, block[2])
    ptx, name = ptx_of(make_ws(block, warps, stages))
    got = clone_args(args)
    run_ws_ptx(ptx, name, (-(-m // block[0]), -(-n // block[1]), 1), got, 32 * warps, policy=policy)
    ref = args[0][:, :k].double() @ args[1][:, :n].double()
    assert (got[2][:, :n].double() - ref).abs().max() <= 2e-2 * ref.abs().max()
    assert torch.isnan(got[2][:, n:]).all()


@pytest.mark.parametrize("block,shape", [((128, 256, 64), (192, 270, 200)), ((256, 128, 64), (256, 140, 200))])
def test_simulated_warp_specialized_matmul_with_paired_a_boxes(block: tuple[int, int, int],
                                                               shape: tuple[int, int, int],
                                                               gen: torch.Generator) -> None:
    """The producer issuing A in rank-4 boxes of two row groups (half the A boxes: 8 a stage at 128 rows, 16 at
    256), against float64 torch on separate program counters."""
    m, n, k = shape
    args = tma_ring_args(gen, m, n, k, block[2], paired_a=True)
    ptx, name = ptx_of(make_ws(block, 8, 3, paired_a=True))
    assert "cp.async.bulk.tensor.4d" in ptx
    got = clone_args(args)
    run_ws_ptx(ptx, name, (-(-m // block[0]), -(-n // block[1]), 1), got, 256, policy="greedy")
    ref = args[0][:, :k].double() @ args[1][:, :n].double()
    assert (got[2][:, :n].double() - ref).abs().max() <= 2e-2 * ref.abs().max()
    assert torch.isnan(got[2][:, n:]).all()


def _in_producer(mutate: Callable[[str], str]) -> Callable[[str], str]:
    """The mutation applied to the producer's code only: partition 1, after the consumers' (partition 0)."""
    def apply(ptx: str) -> str:
        start = ptx.index("setmaxnreg.dec")
        return ptx[:start] + mutate(ptx[start:])

    return apply


def _in_consumers(ptx: str, mutate: Callable[[str], str]) -> str:
    start, end = ptx.index("setmaxnreg.inc"), ptx.index("setmaxnreg.dec")
    return ptx[:start] + mutate(ptx[start:end]) + ptx[end:]


BROKEN: list[tuple[str, Callable[[str], str], str]] = [
    ("consumer never releases a slot",
     lambda p: re.sub(r"@%p\d+ mbarrier.arrive.shared::cta.b64 _, \[%r\d+\];\n", "", p), "deadlock"),
    ("producer refills without waiting for the empty slot", _in_producer(_without_waits),
     "TMA load (overwrites shared memory threads accessed|into shared memory whose previous TMA fill)"),
    ("consumer releases before its dot retired",
     lambda p: p.replace("wgmma.wait_group.sync.aligned 1;", ""), "in-flight wgmma"),
    ("epilogue barrier waits for the exited producer",
     lambda p: p.replace("bar.sync 1, 128;", "bar.sync 0;"), "deadlock"),
    ("consumer reads a slot before its fill landed", lambda p: _in_consumers(p, _without_waits),
     # per schedule: the read races the fill, or (greedy: the consumers finish first) the producer is stranded
     "before waiting on its mbarrier|TMA load overwrites shared memory threads accessed|deadlock"),
]


@pytest.mark.parametrize("what,mutation,error", BROKEN, ids=[b[0] for b in BROKEN])
@pytest.mark.parametrize("policy", ["round_robin", "greedy"])
def test_simulator_catches_broken_specializations(what: str, mutation: Any, error: str, policy: str,
                                                  gen: torch.Generator) -> None:
    ptx, name = ptx_of(make_ws((64, 128, 64), 4, 3))
    broken = mutation(ptx)
    assert broken != ptx, what
    with pytest.raises(SimError, match=error):
        run_ws_ptx(broken, name, (1, 1, 1), tma_ring_args(gen, 64, 128, 320, 64), 128, policy=policy)


def test_simulator_checks_the_launch_and_setmaxnreg(gen: torch.Generator) -> None:
    ptx, name = ptx_of(make_ws((64, 128, 64), 4, 3))
    args = tma_ring_args(gen, 64, 128, 128, 64)
    with pytest.raises(SimError, match="maxntid"):
        run_ws_ptx(ptx, name, (1, 1, 1), clone_args(args), 128, producer_threads=64)
    leader = re.search(r"setp.eq.u32 (%p\d+), %r\d+, 128;", ptx).group(1)  # the producer's elected thread
    partial = ptx.replace("setmaxnreg.dec.sync.aligned.u32 40;", f"@{leader} setmaxnreg.dec.sync.aligned.u32 40;")
    with pytest.raises(SimError, match="part of a warpgroup"):
        run_ws_ptx(partial, name, (1, 1, 1), clone_args(args), 128)


def test_warp_specialized_matmul_interprets(monkeypatch: pytest.MonkeyPatch, gen: torch.Generator) -> None:
    """Under MINITRITON_INTERPRET=1 the option changes nothing (the interpreter runs the tile IR, before passes)."""
    monkeypatch.setenv("MINITRITON_INTERPRET", "1")
    check_interpreted("matmul_tma_ws", 3, gen)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the H200)")
@pytest.mark.parametrize("config_index", [0, 1, 2, 3])
def test_gpu_warp_specialized_matmul_matches_torch(config_index: int) -> None:
    """matmul_tma_ws at each 128-row MATMUL_CONFIG on ragged and tiny shapes against torch (relative error <= 1e-2),
    each config in a process of its own (a fault or a hang loses the process's CUDA context)."""
    check_on_gpu("matmul_tma_ws", config_index)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the H200)")
@pytest.mark.parametrize("config_index", [0, 1])
def test_gpu_warp_specialized_matmul_with_paired_a_boxes(config_index: int) -> None:
    """matmul_tma_ws(paired_a=True) at the 128x256 configs: the rank-4 A descriptor where M is a multiple of 64
    (M = 64, 256, 192 of the checked shapes; the others keep the rank-2 boxes), against torch on the H200."""
    check_on_gpu("matmul_tma_ws", config_index, "paired_a")
