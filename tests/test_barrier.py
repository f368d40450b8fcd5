"""mt.barrier(): a program-wide barrier that orders memory accesses between the program's threads.

The kernel below writes a tile through pointers and reads it back shifted by one element, so elements are read by a
thread other than the one that wrote them (a transposed read would not do: the tiling pass gives the load the layout
in which every thread reads back what it wrote). Checked: the IR op, the interpreter against torch, and the compiled PTX replayed
on tests/ptx_sim.py, whose global-memory race detector must pass with the barrier and flag the kernel without it
(the test can fail); the barrier lowers to bar.sync between the stores and the loads.
"""
from __future__ import annotations

import pytest
import torch

import minitriton as mt
from minitriton.ir.types import SCALAR_TYPES, PointerType
from ptx_helpers import dsl, lower, run_interpreted, run_simulated
from ptx_sim import SimError

F32_PTR = PointerType(SCALAR_TYPES["f32"])


@mt.kernel
def shift_through_memory(x_ptr, scratch_ptr, out_ptr, N: mt.constexpr, BARRIER: mt.constexpr):
    r = mt.arange(0, N)
    mt.store(scratch_ptr + r, mt.load(x_ptr + r) * 2.0)
    if BARRIER:
        mt.barrier()
    y = mt.load(scratch_ptr + (r + 1) % N)
    mt.store(out_ptr + r, y + 1.0)


def make(barrier: bool, n: int = 256):
    types = {name: F32_PTR for name in ("x_ptr", "scratch_ptr", "out_ptr")}
    return dsl(shift_through_memory, types, {"N": n, "BARRIER": barrier})


def args(n: int = 256) -> list[torch.Tensor]:
    return [torch.randn(n, dtype=torch.float32), torch.full((n,), float("nan")), torch.full((n,), float("nan"))]


def expected(x: torch.Tensor) -> torch.Tensor:
    return torch.roll(x * 2, -1) + 1


def test_barrier_is_an_op_with_no_operands() -> None:
    text = str(make(True)())
    assert '"mt.barrier"() : () -> ()' in text
    assert "mt.barrier" not in str(make(False)())


def test_interpreter_reads_the_shifted_scratch() -> None:
    a = args()
    out = run_interpreted(make(True), (1, 1, 1), a)[2]
    torch.testing.assert_close(out, expected(a[0]), rtol=0, atol=0)


def test_ptx_orders_the_stores_before_the_loads() -> None:
    ptx, _, _ = lower(make(True))
    body = ptx[ptx.index("st.global"):]
    assert "bar.sync" in body and body.index("bar.sync") < body.index("ld.global")
    a = args()
    out = run_simulated(make(True), (1, 1, 1), a)[2]
    torch.testing.assert_close(out, expected(a[0]), rtol=0, atol=0)


def test_simulator_flags_the_missing_barrier() -> None:
    with pytest.raises(SimError, match="global-memory race"):
        run_simulated(make(False), (1, 1, 1), args())


def test_barrier_outside_a_kernel_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="mt.barrier can only be called inside"):
        mt.barrier()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the H200)")
@pytest.mark.parametrize("n", [256, 1024])
def test_gpu_barrier_orders_the_scratch(n: int) -> None:
    x = torch.randn(n, device="cuda")
    scratch, out = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    for _ in range(20):  # a missing barrier would show as a stale NaN now and then
        scratch.fill_(float("nan"))
        shift_through_memory[(1,)](x, scratch, out, N=n, BARRIER=True, num_warps=4)
        torch.testing.assert_close(out.cpu(), expected(x.cpu()), rtol=0, atol=0)


def test_barrier_sites_tool_attributes_each_barrier_to_an_op() -> None:
    """tools/barrier_sites.py (no GPU) counts the bar.sync of a kernel's PTX by op and source line: the softmax
    example's cross-warp reductions (max and sum over a row spread over the warps) each emit theirs, attributed to
    softmax.py; the counts add up to the bar.sync in the PTX."""
    import importlib.util
    from pathlib import Path

    from minitriton.kernels.examples import softmax

    path = Path(__file__).resolve().parents[1] / "tools" / "barrier_sites.py"
    spec = importlib.util.spec_from_file_location("barrier_sites", path)
    tool = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(tool)  # type: ignore[union-attr]
    counts = tool.barrier_sites(softmax.softmax_kernel, 0)
    assert counts and all(loc.startswith("softmax.py:") and loop == "-" for _, loc, loop in counts)
    assert any(op == "mt.reduce" for op, _, _ in counts)
    ptx = softmax.softmax_kernel.specializations[0].compile(target="ptx").ptx
    assert sum(counts.values()) == ptx.count("bar.sync")


def test_back_to_back_exchanges_skip_their_leading_barrier() -> None:
    """codegen/context.py `scratch_for_exchange`: a conversion right after another (no other shared-memory user, no
    label between) writes the other scratch region and needs only its middle bar.sync. The KDA decode step's
    replay loop converts three per-token vectors (the conv output and two state column tiles): 1 + 3 = 4 barriers
    a token instead of 6 (the PTX simulator's race check, in tests/test_kda_decode.py, replays it against the
    interpreter)."""
    import collections
    import importlib.util
    from pathlib import Path

    from minitriton.kernels import kda_decode

    path = Path(__file__).resolve().parents[1] / "tools" / "barrier_sites.py"
    spec = importlib.util.spec_from_file_location("barrier_sites", path)
    tool = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(tool)  # type: ignore[union-attr]
    per_loop: collections.Counter = collections.Counter()
    for (_, _, loop), n in tool.barrier_sites(kda_decode.kda_decode_step_kernel).items():
        per_loop[loop] += n
    lines = Path(kda_decode.__file__).read_text().splitlines()
    replay_loop, = (loop for loop in per_loop if loop != "-"
                    and lines[int(loop.split(":")[1]) - 1].strip().startswith("for j in range(j0"))
    assert per_loop[replay_loop] == 4, per_loop
