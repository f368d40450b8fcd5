"""Every example kernel on the GPU: against a float64 torch reference at several shapes (odd sizes included), and
against the interpreter on the same inputs (differential testing: the PTX path and the numpy oracle must agree)."""
from __future__ import annotations

import os

import pytest
import torch

from minitriton.kernels.examples import attention, cumsum, matmul, rmsnorm, softmax, vector_add

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the H200)")]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    assert torch.isfinite(out).all(), "output has NaN/inf (an element was never written?)"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def interpreted(fn, *args, **kwargs):
    """Run a host wrapper through the interpreter on CPU copies of the inputs."""
    cpu = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
    os.environ["MINITRITON_INTERPRET"] = "1"
    try:
        return fn(*cpu, **kwargs)
    finally:
        del os.environ["MINITRITON_INTERPRET"]


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def poison(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: poison(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: poison(real_empty_like(*a, **k)))


def randn(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(*shape, device="cuda").to(dtype)


@pytest.mark.parametrize("n", [1, 1000, 1 << 20, (1 << 22) + 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vector_add(n: int, dtype: torch.dtype) -> None:
    x, y = randn(n, dtype=dtype), randn(n, dtype=dtype)
    out = vector_add.add(x, y)
    assert rel_err(out, vector_add.reference(x, y)) <= (1e-7 if dtype == torch.float32 else 4e-3)
    if n <= 1000:
        assert torch.equal(out.cpu(), interpreted(vector_add.add, x, y))


@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 100), (64, 1000), (300, 4096), (16, 8192), (5, 20000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax(rows: int, cols: int, dtype: torch.dtype) -> None:
    x = (randn(rows, cols, dtype=torch.float32) * 3).to(dtype)
    out = softmax.softmax(x)
    assert rel_err(out, softmax.reference(x)) <= (1e-5 if dtype == torch.float32 else 1e-2)
    if rows * cols <= 64_000:
        assert rel_err(out, interpreted(softmax.softmax, x)) <= (1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("rows,cols", [(3, 100), (64, 1024), (128, 8192), (9, 5000)])
def test_rmsnorm(rows: int, cols: int) -> None:
    x, r, w = randn(rows, cols), randn(rows, cols), (torch.rand(cols, device="cuda") + 0.5).to(torch.bfloat16)
    out, res = rmsnorm.rmsnorm(x, w, r)
    ref, ref_res = rmsnorm.reference(x, w, r)
    assert rel_err(out, ref) <= 1e-2 and rel_err(res, ref_res) <= 4e-3
    if rows * cols <= 64_000:
        assert rel_err(out, interpreted(rmsnorm.rmsnorm, x, w, r)[0]) <= 1e-2


@pytest.mark.parametrize("m,n,k", [(64, 64, 64), (100, 70, 90), (1, 33, 17), (512, 384, 640)])
@pytest.mark.parametrize("activation,bias", [("none", False), ("gelu", True)])
def test_matmul(m: int, n: int, k: int, activation: str, bias: bool) -> None:
    a, b = randn(m, k), randn(k, n)
    bias_t = randn(n) if bias else None
    out = matmul.matmul(a, b, bias_t, activation)
    assert rel_err(out, matmul.reference(a, b, bias_t, activation)) <= 1e-2
    if m * n * k <= 1_000_000:
        assert rel_err(out, interpreted(matmul.matmul, a, b, bias_t, activation)) <= 1e-2


@pytest.mark.parametrize("bh,t,d", [(2, 50, 32), (4, 256, 64), (1, 1, 16), (3, 1000, 64)])
def test_attention(bh: int, t: int, d: int) -> None:
    q, k, v = randn(bh, t, d), randn(bh, t, d), randn(bh, t, d)
    out = attention.attention(q, k, v)
    assert rel_err(out, attention.reference(q, k, v)) <= 1e-2
    if bh * t <= 200:
        assert rel_err(out, interpreted(attention.attention, q, k, v)) <= 1e-2


@pytest.mark.parametrize("rows,cols", [(2, 100), (3, 5000), (1, 1)])
def test_cumsum(rows: int, cols: int) -> None:
    x = randn(rows, cols, dtype=torch.float32)
    out = cumsum.cumsum(x)
    assert rel_err(out, cumsum.reference(x)) <= 1e-5
    assert rel_err(out, interpreted(cumsum.cumsum, x)) <= 1e-5
