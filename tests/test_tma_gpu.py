"""Tensor descriptors on the H200: TMA loads (zero fill past the edges, 128B swizzle undone), TMA stores (clipped),
a loop reusing one mbarrier phase after phase, a rank-3 box, and the TMA-fed GEMM example against torch and against
the interpreter on the same inputs. The CPU side of the same kernels is in test_tma.py."""
from __future__ import annotations

import os

import pytest
import torch

import minitriton as mt
from tma_kernels import (box_reference, pointers_to_tma, random_tensor, store_reference, tma_3d_to_pointers,
                         tma_block_sums, tma_copy_scaled, tma_to_pointers)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the H200)")]

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "i8": torch.int8}


@pytest.fixture(autouse=True)
def compiled_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MINITRITON_INTERPRET", raising=False)


def interpreted(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    """Run `fn` (which launches kernels) through the interpreter."""
    os.environ["MINITRITON_INTERPRET"] = "1"
    try:
        return fn(*args, **kwargs)
    finally:
        del os.environ["MINITRITON_INTERPRET"]


# Every case here passed on the H200 on 2026-11-29, each in its own process (tools/tma_isolated.sh). Coordinates the
# TMA unit faults on (innermost coordinate not a multiple of 16 bytes; a store box starting before the tensor) are
# rejected by the interpreter instead (test_tma.py); docs/tma.md has the measurements.


@pytest.mark.parametrize("dtype,block", [("bf16", (64, 64)), ("f32", (32, 32)), ("bf16", (64, 32)),
                                         ("f16", (8, 128)), ("i8", (32, 128))])
@pytest.mark.parametrize("coords", [(0, 0), (8, 16), (-3, 96), (40, -64), (49, 176)])
def test_tma_load(dtype: str, block: tuple[int, int], coords: tuple[int, int]) -> None:
    src = random_tensor((50, 192), DTYPES[dtype], "cuda")
    out = random_tensor(block, DTYPES[dtype], "cuda")
    tma_to_pointers[(1,)](mt.TensorDescriptor.from_tensor(src, list(block)), out, *coords, block[1],
                          BM=block[0], BN=block[1])
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), box_reference(src.cpu(), coords, block))


@pytest.mark.parametrize("dtype,block", [("bf16", (64, 64)), ("f32", (16, 32)), ("i8", (32, 128))])
@pytest.mark.parametrize("coords", [(5, 16), (45, 160), (30, 144), (0, 0)])
def test_tma_store_clips(dtype: str, block: tuple[int, int], coords: tuple[int, int]) -> None:
    tile = random_tensor(block, DTYPES[dtype], "cuda")
    dst = random_tensor((50, 192), DTYPES[dtype], "cuda")
    before = dst.cpu()
    pointers_to_tma[(1,)](tile, mt.TensorDescriptor.from_tensor(dst, list(block)), *coords, block[1],
                          BM=block[0], BN=block[1])
    torch.cuda.synchronize()
    assert torch.equal(dst.cpu(), store_reference(before, tile.cpu(), coords))


@pytest.mark.parametrize("shape", [(64, 64), (300, 200), (1000, 8)])
def test_tma_copy_of_views(shape: tuple[int, int]) -> None:
    big = random_tensor((shape[0] + 10, shape[1] + 24), torch.bfloat16, "cuda")
    view = big[3:3 + shape[0], 8:8 + shape[1]]
    dst_big = torch.zeros_like(big)
    dst = dst_big[5:5 + shape[0], 16:16 + shape[1]]
    grid = (mt.cdiv(shape[0], 64), mt.cdiv(shape[1], 64))
    tma_copy_scaled[grid](mt.TensorDescriptor.from_tensor(view, [64, 64]),
                          mt.TensorDescriptor.from_tensor(dst, [64, 64]), BM=64, BN=64)
    torch.cuda.synchronize()
    assert torch.equal(dst.cpu(), (view * 2).cpu())
    dst.zero_()
    assert not dst_big.any()  # nothing was written outside the described view


@pytest.mark.parametrize("K", [64, 200, 4096 + 8])
def test_tma_loop_reuses_the_barrier(K: int) -> None:
    src = random_tensor((128, K), torch.bfloat16, "cuda")
    out = torch.full((128, 64), float("nan"), device="cuda")
    tma_block_sums[(4,)](mt.TensorDescriptor.from_tensor(src, [32, 64]), out, K, BM=32, BK=64)
    torch.cuda.synchronize()
    padded = torch.nn.functional.pad(src.double(), (0, -K % 64))
    want = padded.reshape(128, -1, 64).sum(1)
    assert torch.allclose(out.double(), want, rtol=1e-5, atol=1e-3)
    cpu = torch.empty(128, 64)
    interpreted(lambda: tma_block_sums[(4,)](mt.TensorDescriptor.from_tensor(src.cpu(), [32, 64]), cpu, K,
                                             BM=32, BK=64))
    assert torch.allclose(out.cpu(), cpu, rtol=1e-6, atol=1e-4)  # f32 sums of the same values in one order


def test_tma_rank3_box() -> None:
    src = random_tensor((3, 10, 24), torch.float32, "cuda")
    out = torch.full((2, 4, 16), 7.0, device="cuda")
    tma_3d_to_pointers[(1,)](mt.TensorDescriptor.from_tensor(src, [2, 4, 16]), out, 2, -1, 12, B0=2, B1=4, B2=16)
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), box_reference(src.cpu(), (2, -1, 12), (2, 4, 16)))


@pytest.mark.parametrize("M,N,K", [(64, 64, 64), (100, 72, 136), (256, 512, 1024), (1000, 8, 8)])
@pytest.mark.parametrize("epilogue", ["none", "bias_gelu"])
def test_tma_matmul_example(M: int, N: int, K: int, epilogue: str) -> None:
    from minitriton.kernels.examples import matmul_tma

    a, b = random_tensor((M, K), torch.bfloat16, "cuda"), random_tensor((K, N), torch.bfloat16, "cuda")
    bias = random_tensor((N,), torch.bfloat16, "cuda") if epilogue == "bias_gelu" else None
    act = "gelu" if bias is not None else "none"
    c = matmul_tma.matmul(a, b, bias, act)
    torch.cuda.synchronize()
    want = matmul_tma.reference(a, b, bias, act).double().cpu()
    got = c.double().cpu()
    assert torch.isfinite(got).all()
    assert ((got - want).norm() / want.norm()).item() < 4e-3  # bf16 output rounding, f32 accumulation
    if M * N * K <= 100 * 72 * 136:
        cpu = interpreted(matmul_tma.matmul, a.cpu(), b.cpu(), bias.cpu() if bias is not None else None, act)
        assert torch.allclose(got.float(), cpu.float(), rtol=2**-7, atol=1e-3)
