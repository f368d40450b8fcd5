"""Every example kernel, run through the interpreter (MINITRITON_INTERPRET=1) on CPU tensors, against a float64
torch reference on fresh random inputs, including sizes that are not multiples of the block size."""
from __future__ import annotations

import pytest
import torch

from minitriton.kernels.examples import attention, cumsum, matmul, rmsnorm, softmax, vector_add


@pytest.fixture(autouse=True)
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINITRITON_INTERPRET", "1")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64."""
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "output has NaN/inf (a poisoned element was never written?)"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def poison(t: torch.Tensor) -> torch.Tensor:
    return t.fill_(float("nan")) if t.is_floating_point() else t.fill_(85)


@pytest.fixture(autouse=True)
def poisoned_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs the wrappers allocate start as NaN, so an element the kernel fails to write shows up."""
    real_empty, real_empty_like = torch.empty, torch.empty_like
    monkeypatch.setattr(torch, "empty", lambda *a, **k: poison(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: poison(real_empty_like(*a, **k)))


@pytest.mark.parametrize("n", [1, 1000, 4096 + 17])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vector_add(n: int, dtype: torch.dtype) -> None:
    x, y = torch.randn(n).to(dtype), torch.randn(n).to(dtype)
    out = vector_add.add(x, y)
    # f32: exact; bf16: the sum of two bf16 values rounds once, like the reference
    assert rel_err(out, vector_add.reference(x, y)) <= (1e-7 if dtype == torch.float32 else 4e-3)


@pytest.mark.parametrize("rows,cols,block", [(3, 100, None), (5, 1000, 256), (2, 4096, None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax(rows: int, cols: int, block: int | None, dtype: torch.dtype) -> None:
    x = (torch.randn(rows, cols) * 3).to(dtype)
    out = softmax.softmax(x, block=block)
    assert rel_err(out, softmax.reference(x)) <= (1e-5 if dtype == torch.float32 else 1e-2)


def test_softmax_strided_rows() -> None:
    base = torch.randn(4, 300)
    x = base[:, :200]  # rows of a wider tensor: stride 300
    assert rel_err(softmax.softmax(x, block=64), softmax.reference(x)) <= 1e-5


@pytest.mark.parametrize("rows,cols", [(3, 100), (2, 1024)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_rmsnorm(rows: int, cols: int, with_residual: bool) -> None:
    x = torch.randn(rows, cols).to(torch.bfloat16)
    w = (torch.rand(cols) + 0.5).to(torch.bfloat16)
    res = torch.randn(rows, cols).to(torch.bfloat16) if with_residual else None
    out, res_out = rmsnorm.rmsnorm(x, w, res)
    ref, ref_res = rmsnorm.reference(x, w, res)
    assert rel_err(out, ref) <= 1e-2
    if with_residual:
        assert rel_err(res_out, ref_res) <= 4e-3


@pytest.mark.parametrize("m,n,k", [(64, 64, 64), (50, 70, 90), (1, 33, 17)])
@pytest.mark.parametrize("activation,bias", [("none", False), ("gelu", True), ("relu", True), ("silu", False)])
def test_matmul(m: int, n: int, k: int, activation: str, bias: bool) -> None:
    a = torch.randn(m, k).to(torch.bfloat16)
    b = torch.randn(k, n).to(torch.bfloat16)
    bias_t = torch.randn(n).to(torch.bfloat16) if bias else None
    out = matmul.matmul(a, b, bias_t, activation, block=(32, 32, 32))
    assert rel_err(out, matmul.reference(a, b, bias_t, activation)) <= 1e-2


def test_matmul_transposed_operand() -> None:
    a = torch.randn(40, 48).to(torch.bfloat16)
    b = torch.randn(56, 48).to(torch.bfloat16).t()  # a strided (column-major) view
    assert rel_err(matmul.matmul(a, b, block=(32, 32, 16)), matmul.reference(a, b)) <= 1e-2


@pytest.mark.parametrize("bh,t,d", [(2, 50, 32), (1, 64, 16), (1, 1, 16)])
def test_attention(bh: int, t: int, d: int) -> None:
    q, k, v = (torch.randn(bh, t, d).to(torch.bfloat16) for _ in range(3))
    out = attention.attention(q, k, v, block_m=16, block_n=16)
    assert rel_err(out, attention.reference(q, k, v)) <= 1e-2


@pytest.mark.parametrize("rows,cols,block", [(2, 100, 32), (3, 1000, 256), (1, 1, 16)])
def test_cumsum(rows: int, cols: int, block: int) -> None:
    x = torch.randn(rows, cols)
    assert rel_err(cumsum.cumsum(x, block=block), cumsum.reference(x)) <= 1e-5
