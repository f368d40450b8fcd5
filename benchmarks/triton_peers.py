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


# ----------------------------------------------------------------------------- GEMM (benchmarks/gemm.py)
# The Triton tutorial matmul (03-matrix-multiplication): grouped program order, masked K tail, fp32 accumulation,
# autotuned over Hopper configs (Triton's pipeliner turns the K loop into async copies + asynchronous wgmma).

GEMM_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=3, num_warps=8),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=4, num_warps=8),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=4, num_warps=4),
]


@triton.autotune(configs=GEMM_CONFIGS, key=["M", "N", "K"])
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


def matmul(a, b):
    """a @ b (2-D, same 16-bit dtype) with fp32 accumulation, autotuned per (M, N, K)."""
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                        c.stride(1))
    return c


def matmul_config(a, b) -> str:
    """The config the autotuner picked for these operands' (M, N, K) (after a matmul(a, b) call)."""
    key = (a.shape[0], b.shape[1], a.shape[1])
    for k, cfg in getattr(matmul_kernel, "cache", {}).items():
        if tuple(k[:3]) == key:
            return str(cfg)
    return "?"


# ------------------------------------------------------------------ the TMA persistent matmul (Triton's tutorial 09 form)
# Host tensor descriptors (triton.tools.tensor_descriptor), one program per SM looping over C tiles in grouped
# order, TMA loads of A [BM, BK] and B [BK, BN] boxes, the C tile stored through a descriptor. tools/gemm_ab.py
# times it per config (its TRITON_TMA_CONFIGS) like our kernels and reports the best, as Triton's autotuner would.


@triton.jit
def matmul_tma_persistent_kernel(a_desc, b_desc, c_desc, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                 BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
                                 WARP_SPECIALIZE: tl.constexpr):
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    in_group = GROUP_M * num_pid_n
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=True, warp_specialize=WARP_SPECIALIZE):
        first_m = (tile_id // in_group) * GROUP_M
        group_rows = min(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + (tile_id % in_group) % group_rows
        pid_n = (tile_id % in_group) // group_rows
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            b = b_desc.load([ki * BLOCK_K, pid_n * BLOCK_N])
            acc = tl.dot(a, b, acc)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(tl.bfloat16))


def matmul_tma_persistent(a, b, config):
    """a @ b (bf16, row-major, fp32 accumulation) with matmul_tma_persistent_kernel at `config` = (BLOCK_M, BLOCK_N,
    BLOCK_K, stages, warps, warp_specialize), one program per SM."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk, stages, warps, ws = config
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(b, [bk, bn])
    c_desc = TensorDescriptor.from_tensor(c, [bm, bn])
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    matmul_tma_persistent_kernel[(min(sms, tiles),)](a_desc, b_desc, c_desc, M, N, K, BLOCK_M=bm, BLOCK_N=bn,
                                                     BLOCK_K=bk, GROUP_M=8, NUM_SMS=sms, WARP_SPECIALIZE=ws,
                                                     num_stages=stages, num_warps=warps)
    return c
