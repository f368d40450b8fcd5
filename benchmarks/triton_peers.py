"""The Triton versions of the benchmark kernels (imported only when triton is installed).

Triton's JIT reads a kernel's globals to resolve names, so these live at module level in their own file."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def empty():
    pass


@triton.jit
def add3(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)


# ------------------------------------------------------------------ memory-bound kernels (benchmarks/bandwidth.py)
# The Triton tutorial kernels, written the way the tutorials write them: one program per BLOCK elements (vector
# add) or per row (softmax, RMSNorm), the whole row in registers, BLOCK = next power of two of the columns.


@triton.jit
def vector_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    y = e / tl.sum(e, axis=0)
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    offs = row * n_cols + cols
    h = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    h += tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(res_out_ptr + offs, h.to(res_out_ptr.dtype.element_ty), mask=mask)
    rstd = tl.rsqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, (h * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def vector_add(x, y, block: int = 1024):
    """x + y (contiguous, one shape and dtype)."""
    out = torch.empty_like(x)
    n = x.numel()
    vector_add_kernel[(triton.cdiv(n, block),)](x, y, out, n, BLOCK=block)
    return out


def _row_launch_options(cols: int) -> tuple[int, int]:
    block = triton.next_power_of_2(cols)
    return block, (8 if block >= 4096 else 4)


def softmax(x):
    """Softmax over the last dim of a 2-D tensor with contiguous rows, one program per row."""
    rows, cols = x.shape
    out = torch.empty_like(x)
    block, num_warps = _row_launch_options(cols)
    softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=block, num_warps=num_warps)
    return out


def rmsnorm(x, weight, residual, eps: float = 1e-6):
    """(normalized, new residual) of contiguous 2-D x + residual, one program per row."""
    rows, cols = x.shape
    out, res_out = torch.empty_like(x), torch.empty_like(x)
    block, num_warps = _row_launch_options(cols)
    rmsnorm_kernel[(rows,)](x, residual, weight, out, res_out, cols, eps, BLOCK=block, num_warps=num_warps)
    return out, res_out
