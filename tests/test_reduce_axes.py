"""mt.sum / mt.max / mt.min over a tuple of axes (frontend: trans + reshape + one mt.reduce), against torch on the
interpreter and on the PTX simulator, with keep_dims; bad axis tuples are CompilationErrors."""
from __future__ import annotations

import pytest
import torch

import minitriton as mt
from minitriton.errors import CompilationError
from minitriton.ir.types import SCALAR_TYPES, PointerType
from ptx_helpers import dsl, run_interpreted, run_simulated

F32_PTR = PointerType(SCALAR_TYPES["f32"])
SHAPE = (4, 8, 2, 4)


@mt.kernel
def reduce_axes(x_ptr, out_ptr, A0: mt.constexpr, A1: mt.constexpr, KIND: mt.constexpr, KEEP: mt.constexpr):
    a = mt.arange(0, 4)[:, None, None, None]
    b = mt.arange(0, 8)[None, :, None, None]
    c = mt.arange(0, 2)[None, None, :, None]
    d = mt.arange(0, 4)[None, None, None, :]
    x = mt.load(x_ptr + ((a * 8 + b) * 2 + c) * 4 + d)
    if KIND == "sum":
        r = mt.sum(x, axis=(A0, A1), keep_dims=KEEP)
    elif KIND == "max":
        r = mt.max(x, axis=(A0, A1), keep_dims=KEEP)
    else:
        r = mt.min(x, axis=(A0, A1), keep_dims=KEEP)
    r = r.reshape(r.numel)
    mt.store(out_ptr + mt.arange(0, r.numel), r)


def reference(x: torch.Tensor, axes: tuple[int, int], kind: str) -> torch.Tensor:
    if kind == "sum":
        return x.double().sum(dim=axes).float()
    return x.amax(dim=axes) if kind == "max" else x.amin(dim=axes)


@pytest.mark.parametrize("axes", [(0, 3), (3, 0), (1, 2), (0, 1), (-1, 1)])
@pytest.mark.parametrize("kind", ["sum", "max", "min"])
def test_reduce_over_two_axes(axes: tuple[int, int], kind: str) -> None:
    x = torch.randn(SHAPE)
    want = reference(x, axes, kind).reshape(-1)
    make = dsl(reduce_axes, {"x_ptr": F32_PTR, "out_ptr": F32_PTR},
               {"A0": axes[0], "A1": axes[1], "KIND": kind, "KEEP": False})
    args = [x, torch.full((want.numel(),), float("nan"))]
    torch.testing.assert_close(run_interpreted(make, (1, 1, 1), args)[1], want, rtol=1e-6, atol=1e-5)
    if axes == (0, 3):
        torch.testing.assert_close(run_simulated(make, (1, 1, 1), args)[1], want, rtol=1e-6, atol=1e-5)


def test_keep_dims_keeps_size_one_axes() -> None:
    x = torch.randn(SHAPE)
    make = dsl(reduce_axes, {"x_ptr": F32_PTR, "out_ptr": F32_PTR}, {"A0": 2, "A1": 0, "KIND": "sum", "KEEP": True})
    assert "tensor<1x8x1x4xf32>" in str(make())
    got = run_interpreted(make, (1, 1, 1), [x, torch.full((32,), float("nan"))])[1]
    torch.testing.assert_close(got, reference(x, (0, 2), "sum").reshape(-1), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("axes, message", [((1, 1), "names an axis twice"), ((0, 4), "axis 4 is out of range")])
def test_bad_axis_tuples_are_compilation_errors(axes: tuple[int, int], message: str) -> None:
    make = dsl(reduce_axes, {"x_ptr": F32_PTR, "out_ptr": F32_PTR},
               {"A0": axes[0], "A1": axes[1], "KIND": "sum", "KEEP": False})
    with pytest.raises(CompilationError, match=message):
        make()
