"""Small kernels using tensor descriptors, shared by test_tma.py (CPU: interpreter, PTX simulator, ptxas) and
test_tma_gpu.py (the H200), with the torch references they are checked against."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

import minitriton as mt


@mt.kernel
def tma_to_pointers(src, out, row, col, stride_o, BM: mt.constexpr, BN: mt.constexpr):
    """The box of `src` at (row, col), loaded through the descriptor, stored with plain pointers (tests the load)."""
    tile = src.load([row, col])
    r = mt.arange(0, BM)
    c = mt.arange(0, BN)
    mt.store(out + r[:, None] * stride_o + c[None, :], tile)


@mt.kernel
def pointers_to_tma(x, dst, row, col, stride_x, BM: mt.constexpr, BN: mt.constexpr):
    """A BM x BN tile read with plain pointers, stored through the descriptor at (row, col) (tests the store)."""
    r = mt.arange(0, BM)
    c = mt.arange(0, BN)
    dst.store([row, col], mt.load(x + r[:, None] * stride_x + c[None, :]))


@mt.kernel
def tma_copy_scaled(src, dst, BM: mt.constexpr, BN: mt.constexpr):
    """dst = 2 * src block by block, both through descriptors (one program per block, edges clipped)."""
    m = mt.program_id(0) * BM
    n = mt.program_id(1) * BN
    dst.store([m, n], src.load([m, n]) * 2)


@mt.kernel
def tma_store_whole_boxes(x_ptr, dst, M, N, TILE_M: mt.constexpr, TILE_N: mt.constexpr):
    """dst = 2 * x (x through pointers, row-major M x N) in TILE_M x TILE_N tiles, each one descriptor store of a
    tile of whole [BM, BN] boxes of dst's (codegen/tma.py: rounds of boxes, one TMA store each; edges clipped)."""
    rows = mt.program_id(0) * TILE_M + mt.arange(0, TILE_M)
    cols = mt.program_id(1) * TILE_N + mt.arange(0, TILE_N)
    x = mt.load(x_ptr + rows[:, None] * N + cols[None, :], mask=(rows[:, None] < M) & (cols[None, :] < N), other=0.0)
    dst.store([mt.program_id(0) * TILE_M, mt.program_id(1) * TILE_N], x * 2)


@mt.kernel
def tma_block_sums(src, out, K, BM: mt.constexpr, BK: mt.constexpr):
    """out[i, j] = sum over k-blocks of src[i, kb * BK + j] (one barrier reused every iteration: phase tracking)."""
    m = mt.program_id(0) * BM
    acc = mt.zeros((BM, BK), mt.float32)
    for k in range(0, K, BK):
        acc += src.load([m, k]).to(mt.float32)
    r = m + mt.arange(0, BM)
    c = mt.arange(0, BK)
    mt.store(out + r[:, None] * BK + c[None, :], acc)


@mt.kernel
def tma_3d_to_pointers(src, out, a, b, c, B0: mt.constexpr, B1: mt.constexpr, B2: mt.constexpr):
    """A rank-3 box (cp.async.bulk.tensor.3d) stored contiguously with pointers."""
    tile = src.load([a, b, c])
    i = mt.arange(0, B0)[:, None, None]
    j = mt.arange(0, B1)[None, :, None]
    k = mt.arange(0, B2)[None, None, :]
    mt.store(out + i * (B1 * B2) + j * B2 + k, tile)


# ------------------------------------------------------------------------------------------ references


def box_reference(t: torch.Tensor, coords: Sequence[int], block: Sequence[int]) -> torch.Tensor:
    """The box of `t` at `coords` with zeros outside `t` (what a TMA load returns)."""
    pad: list[int] = []
    for c, b, n in reversed(list(zip(coords, block, t.shape))):
        pad += [max(0, -c), max(0, c + b - n)]  # F.pad lists the last dim first
    padded = F.pad(t, pad)
    return padded[tuple(slice(max(c, 0), max(c, 0) + b) for c, b in zip(coords, block))]


def store_reference(t: torch.Tensor, tile: torch.Tensor, coords: Sequence[int]) -> torch.Tensor:
    """`t` with the parts of `tile` that fall inside it written at `coords` (what a TMA store does)."""
    out = t.clone()
    src, dst = [], []
    for c, b, n in zip(coords, tile.shape, t.shape):
        lo, hi = max(c, 0), min(c + b, n)
        if lo >= hi:
            return out
        dst.append(slice(lo, hi))
        src.append(slice(lo - c, hi - c))
    out[tuple(dst)] = tile[tuple(src)]
    return out


def random_tensor(shape: Sequence[int], dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(*shape, device=device).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000) + 1, tuple(shape), device=device).to(dtype)
