"""Row-wise softmax. A row that fits one block is read once (max, exp, sum, divide in registers); a longer row
streams its blocks twice with an online maximum (the running sum is rescaled when the maximum grows)."""
from __future__ import annotations

import torch

import minitriton as mt


@mt.kernel
def softmax_kernel(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK: mt.constexpr, ONE_BLOCK: mt.constexpr):
    row = mt.program_id(0)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    cols = mt.arange(0, BLOCK)
    if ONE_BLOCK:
        mask = cols < n_cols
        x = mt.load(x_row + cols, mask=mask, other=float("-inf")).to(mt.float32)
        e = mt.exp(x - mt.max(x, axis=0))
        mt.store(out_row + cols, e * (1.0 / mt.sum(e, axis=0)), mask=mask)  # one division per row, not per element
    else:
        m = float("-inf")  # running maximum of the row
        total = mt.zeros((BLOCK,), mt.float32)  # per-lane sums of exp(x - m)
        for start in range(0, n_cols, BLOCK):
            mask = start + cols < n_cols
            x = mt.load(x_row + start + cols, mask=mask, other=float("-inf")).to(mt.float32)
            m_new = mt.maximum(m, mt.max(x, axis=0))
            total = total * mt.exp(m - m_new) + mt.exp(x - m_new)
            m = m_new
        inv = 1.0 / mt.sum(total, axis=0)
        for start in range(0, n_cols, BLOCK):
            mask = start + cols < n_cols
            x = mt.load(x_row + start + cols, mask=mask, other=float("-inf")).to(mt.float32)
            mt.store(out_row + start + cols, mt.exp(x - m) * inv, mask=mask)


@mt.kernel
def softmax_rows_kernel(x_ptr, out_ptr, n_rows, n_cols, stride_x, stride_out, BLOCK: mt.constexpr):
    """Rows pid, pid + P, pid + 2P, ... of a grid of P programs, each row in one block. The next row's load is
    issued before this row's two reductions, so every program keeps a row in flight while it computes."""
    cols = mt.arange(0, BLOCK)
    mask = cols < n_cols
    step = mt.num_programs(0)
    first = mt.program_id(0)
    x = mt.load(x_ptr + first * stride_x + cols, mask=mask & (first < n_rows), other=float("-inf"))
    for row in range(first, n_rows, step):
        following = row + step
        x_next = mt.load(x_ptr + following * stride_x + cols, mask=mask & (following < n_rows), other=float("-inf"))
        xf = x.to(mt.float32)
        e = mt.exp(xf - mt.max(xf, axis=0))
        mt.store(out_ptr + row * stride_out + cols, e * (1.0 / mt.sum(e, axis=0)), mask=mask)
        x = x_next


softmax_kernel.specialize(signature="x_ptr:*bf16:16,out_ptr:*bf16:16,n_cols:i32:16,stride_x:i32:16,stride_out:i32:16",
                          BLOCK=8192, ONE_BLOCK=True, num_warps=8)
softmax_kernel.specialize(signature="x_ptr:*fp32:16,out_ptr:*fp32:16,n_cols:i32,stride_x:i32:16,stride_out:i32:16",
                          BLOCK=1024, ONE_BLOCK=False)


def softmax(x: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """Softmax over the last dim of a 2-D tensor (rows may be strided; columns contiguous)."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError("softmax takes a 2-D tensor with contiguous rows")
    rows, cols = x.shape
    out = torch.empty_like(x)
    block = block or min(8192, 1 << max(cols - 1, 1).bit_length())
    num_warps = 8 if block >= 4096 else 4
    softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=block, ONE_BLOCK=block >= cols,
                            num_warps=num_warps)
    return out


def reference(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x.double(), dim=-1).to(x.dtype)
