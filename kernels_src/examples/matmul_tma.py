"""Tiled GEMM fed by TMA: C = act(A @ B + bias), the A and B blocks loaded through tensor descriptors.

Same computation as matmul.py, but each K step reads its A (BLOCK_M x BLOCK_K) and B (BLOCK_K x BLOCK_N) blocks with
`desc.load([row, col])`: one TMA copy per block into shared memory, completed through an mbarrier. The descriptors
are built on the host (`mt.TensorDescriptor.from_tensor`); TMA fills rows and columns past the matrix edges with
zeros, so the K loop needs no masks. TMA needs 16-byte aligned rows: K and N multiples of 8 for bf16.
"""
from __future__ import annotations

import torch

import minitriton as mt

from minitriton.kernels.examples.matmul import problem_size, reference, store_epilogue  # noqa: F401  (reference: as matmul.py)


@mt.kernel
def matmul_tma_kernel(a_desc, b_desc, c_ptr, bias_ptr, M, N, K, stride_cm, stride_cn,
                      BLOCK_M: mt.constexpr, BLOCK_N: mt.constexpr, BLOCK_K: mt.constexpr,
                      HAS_BIAS: mt.constexpr = False, ACTIVATION: mt.constexpr = "none"):
    pid_m = mt.program_id(0)
    pid_n = mt.program_id(1)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc = mt.zeros((BLOCK_M, BLOCK_N), mt.float32)
    for k in range(0, K, BLOCK_K):
        a = a_desc.load([off_m, k])
        b = b_desc.load([k, off_n])
        acc = mt.dot(a, b, acc)
    rm = off_m + mt.arange(0, BLOCK_M)
    rn = off_n + mt.arange(0, BLOCK_N)
    store_epilogue(acc, rm, rn, c_ptr, bias_ptr, M, N, stride_cm, stride_cn, HAS_BIAS, ACTIVATION)


_SIG = ("a_desc:tensordesc<bf16[64,64]>,b_desc:tensordesc<bf16[64,64]>,c_ptr:*bf16,bias_ptr:*bf16,M:i32,N:i32,"
        "K:i32,stride_cm:i32,stride_cn:i32")
matmul_tma_kernel.specialize(signature=_SIG, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64)
matmul_tma_kernel.specialize(signature=_SIG, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, HAS_BIAS=True, ACTIVATION="gelu")


def matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, activation: str = "none",
           block: tuple[int, int, int] = (64, 64, 64)) -> torch.Tensor:
    """act(a @ b + bias) in a's dtype, accumulated in fp32; a and b must suit TMA (16-byte aligned rows)."""
    M, N, K = problem_size(a, b)
    bm, bn, bk = block
    a_desc = mt.TensorDescriptor.from_tensor(a, [bm, bk])
    b_desc = mt.TensorDescriptor.from_tensor(b, [bk, bn])
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    grid = (mt.cdiv(M, bm), mt.cdiv(N, bn))
    matmul_tma_kernel[grid](a_desc, b_desc, c, bias if bias is not None else c, M, N, K, c.stride(0), c.stride(1),
                            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, HAS_BIAS=bias is not None, ACTIVATION=activation)
    return c
