"""A bare `return` ending a runtime `if` branch (frontend/early_return.py moves the statements after the if into
its other branch). Checked on the interpreter against torch (padding rows stay poisoned), on the PTX simulator
against the interpreter, through an elif chain, nested ifs, an @mt.func helper, and the syntax-tree rewrite itself;
a return inside a runtime loop is still a CompilationError at its line.
"""
from __future__ import annotations

import ast
import textwrap

import pytest
import torch

import minitriton as mt
from minitriton.errors import CompilationError
from minitriton.frontend.early_return import fold_early_returns
from minitriton.ir.types import SCALAR_TYPES, PointerType
from ptx_helpers import dsl, run_interpreted, run_simulated

F32_PTR, I32_PTR = PointerType(SCALAR_TYPES["f32"]), PointerType(SCALAR_TYPES["i32"])


@mt.func
def scaled_copy_unless_negative(x_ptr, out_ptr, row, slot, N: mt.constexpr):
    if slot < 0:
        return
    r = mt.arange(0, N)
    mt.store(out_ptr + row * N + r, mt.load(x_ptr + slot * N + r) * 2.0)


@mt.kernel
def gather_rows(x_ptr, idx_ptr, out_ptr, N: mt.constexpr, HELPER: mt.constexpr):
    row = mt.program_id(0)
    slot = mt.load(idx_ptr + row)
    if HELPER:
        scaled_copy_unless_negative(x_ptr, out_ptr, row, slot, N)
        return
    if slot < 0:
        return
    elif slot == 0:
        mt.store(out_ptr + row * N + mt.arange(0, N), mt.full((N,), 7.0, mt.float32))
        return
    r = mt.arange(0, N)
    x = mt.load(x_ptr + slot * N + r)
    if slot > 2:
        x = x + 1.0
        if slot > 3:
            return  # nested: rows with slot > 3 are left poisoned
    mt.store(out_ptr + row * N + r, x * 2.0)


def expected(x: torch.Tensor, idx: torch.Tensor, out: torch.Tensor, helper: bool) -> torch.Tensor:
    want = out.clone()
    for row, slot in enumerate(idx.tolist()):
        if slot < 0 or (not helper and slot > 3):
            continue
        if helper:
            want[row] = x[slot] * 2
        elif slot == 0:
            want[row] = 7.0
        else:
            want[row] = (x[slot] + (1.0 if slot > 2 else 0.0)) * 2
    return want


def problem(n: int = 32):
    x = torch.randn(6, n)
    idx = torch.tensor([2, -1, 0, 3, 5, -7, 1, 4], dtype=torch.int32)
    return [x, idx, torch.full((len(idx), n), float("nan"))]


@pytest.mark.parametrize("helper", [False, True])
def test_interpreter_and_ptx_skip_the_rest_after_return(helper: bool) -> None:
    make = dsl(gather_rows, {"x_ptr": F32_PTR, "idx_ptr": I32_PTR, "out_ptr": F32_PTR}, {"N": 32, "HELPER": helper})
    args = problem()
    want = expected(*args, helper=helper)
    got = run_interpreted(make, (8, 1, 1), args)[2]
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    sim = run_simulated(make, (8, 1, 1), args)[2]
    torch.testing.assert_close(sim, want, rtol=0, atol=0, equal_nan=True)


def test_rewrite_moves_the_rest_into_the_other_branch() -> None:
    src = textwrap.dedent("""
        a()
        if c:
            b()
            return
        elif d:
            return
        e()
        """)
    folded = ast.unparse(ast.Module(body=fold_early_returns(ast.parse(src).body), type_ignores=[]))
    assert folded == textwrap.dedent("""\
        a()
        if c:
            b()
        elif d:
            pass
        else:
            e()""")


def test_value_returns_and_loops_are_left_alone() -> None:
    src = "if c:\n    return x\ny = 1\nfor i in r:\n    if c:\n        return\n"
    body = ast.parse(src).body
    assert ast.dump(ast.Module(body=fold_early_returns(body), type_ignores=[])) == ast.dump(ast.parse(src))


@mt.kernel
def return_in_loop(x_ptr, n):
    for i in range(n):
        if i > 2:
            return
        mt.store(x_ptr + i, 1.0)


def test_return_in_a_runtime_loop_is_an_error_at_its_line() -> None:
    with pytest.raises(CompilationError, match="inside a runtime for/while loop") as e:
        dsl(return_in_loop, {"x_ptr": F32_PTR, "n": SCALAR_TYPES["i32"]})()
    assert "test_early_return.py" in str(e.value) and "return" in str(e.value)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the H200)")
@pytest.mark.parametrize("helper", [False, True])
def test_gpu_matches_the_reference(helper: bool) -> None:
    x, idx, out = problem()
    want = expected(x, idx, out, helper=helper)
    x, idx, out = x.cuda(), idx.cuda(), out.cuda()
    gather_rows[(len(idx),)](x, idx, out, N=32, HELPER=helper)
    torch.testing.assert_close(out.cpu(), want, rtol=0, atol=0, equal_nan=True)
