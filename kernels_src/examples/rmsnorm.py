"""RMSNorm with a fused residual add: h = x + residual (written back as the new residual), then
out = h / sqrt(mean(h^2) + eps) * weight. One program per row; the row lives in registers."""
from __future__ import annotations

import torch

import minitriton as mt


@mt.kernel
def rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, n_cols, eps,
                   BLOCK: mt.constexpr, HAS_RESIDUAL: mt.constexpr):
    row = mt.program_id(0)
    cols = mt.arange(0, BLOCK)
    mask = cols < n_cols
    offs = row * n_cols + cols
    h = mt.load(x_ptr + offs, mask=mask, other=0.0).to(mt.float32)
    if HAS_RESIDUAL:
        h += mt.load(res_ptr + offs, mask=mask, other=0.0).to(mt.float32)
        mt.store(res_out_ptr + offs, h, mask=mask)
    rstd = mt.rsqrt(mt.sum(h * h, axis=0) / n_cols + eps)
    w = mt.load(w_ptr + cols, mask=mask, other=0.0).to(mt.float32)
    mt.store(out_ptr + offs, h * rstd * w, mask=mask)


rmsnorm_kernel.specialize(
    signature="x_ptr:*bf16:16,res_ptr:*bf16:16,w_ptr:*bf16:16,out_ptr:*bf16:16,res_out_ptr:*bf16:16,n_cols:i32:16,eps:fp32",
    BLOCK=8192, HAS_RESIDUAL=True, num_warps=8)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None, eps: float = 1e-6
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Returns (normalized, new residual) for a contiguous 2-D x; new residual is None without a residual."""
    if x.dim() != 2 or not x.is_contiguous():
        raise ValueError("rmsnorm takes a contiguous 2-D tensor")
    rows, cols = x.shape
    block = 1 << max(cols - 1, 1).bit_length()
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else None
    res_in = residual if residual is not None else x
    rmsnorm_kernel[(rows,)](x, res_in, weight, out, res_out if res_out is not None else out, cols, eps,
                            BLOCK=block, HAS_RESIDUAL=residual is not None, num_warps=8 if block >= 4096 else 4)
    return out, res_out


def reference(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None, eps: float = 1e-6
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
    h = x.double() + (residual.double() if residual is not None else 0)
    out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.double()
    return out.to(x.dtype), (h.to(x.dtype) if residual is not None else None)
