"""Causal attention forward (one head per program column): O = softmax(Q K^T * scale, causal) V with an online
softmax over K/V blocks, so the T x T score matrix never exists. Q, K, V, O are [B*H, T, D] contiguous."""
from __future__ import annotations

import math

import torch

import minitriton as mt


@mt.kernel
def attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, seq_len, sm_scale,
                     HEAD_DIM: mt.constexpr, BLOCK_M: mt.constexpr, BLOCK_N: mt.constexpr):
    start_m = mt.program_id(0)
    head = mt.program_id(1)
    base = head * seq_len * HEAD_DIM
    offs_m = start_m * BLOCK_M + mt.arange(0, BLOCK_M)
    offs_d = mt.arange(0, HEAD_DIM)
    q = mt.load(q_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=offs_m[:, None] < seq_len,
                other=0.0)
    m_i = mt.full((BLOCK_M,), float("-inf"), mt.float32)
    l_i = mt.zeros((BLOCK_M,), mt.float32)
    acc = mt.zeros((BLOCK_M, HEAD_DIM), mt.float32)
    end = min((start_m + 1) * BLOCK_M, seq_len)  # causal: keys past the block's last query are never needed
    for start_n in range(0, end, BLOCK_N):
        offs_n = start_n + mt.arange(0, BLOCK_N)
        kt = mt.load(k_ptr + base + offs_n[None, :] * HEAD_DIM + offs_d[:, None], mask=offs_n[None, :] < seq_len,
                     other=0.0)
        s = mt.dot(q, kt) * sm_scale
        visible = (offs_m[:, None] >= offs_n[None, :]) & (offs_n[None, :] < seq_len)
        s = mt.where(visible, s, float("-inf"))
        m_new = mt.maximum(m_i, mt.max(s, axis=1))
        p = mt.exp(s - m_new[:, None])
        alpha = mt.exp(m_i - m_new)
        l_i = l_i * alpha + mt.sum(p, axis=1)
        v = mt.load(v_ptr + base + offs_n[:, None] * HEAD_DIM + offs_d[None, :], mask=offs_n[:, None] < seq_len,
                    other=0.0)
        acc = acc * alpha[:, None] + mt.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    mt.store(o_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], out, mask=offs_m[:, None] < seq_len)


attention_kernel.specialize(signature="q_ptr:*bf16,k_ptr:*bf16,v_ptr:*bf16,o_ptr:*bf16,seq_len:i32,sm_scale:fp32",
                            HEAD_DIM=64, BLOCK_M=64, BLOCK_N=32)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_m: int = 64, block_n: int = 32
              ) -> torch.Tensor:
    """Causal attention for q, k, v of shape [BH, T, D] (contiguous, one dtype, D a power of two)."""
    if q.shape != k.shape or q.shape != v.shape or q.dim() != 3:
        raise ValueError("attention takes q, k, v of one shape [BH, T, D]")
    bh, t, d = q.shape
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o = torch.empty_like(q)
    attention_kernel[(mt.cdiv(t, block_m), bh)](q, k, v, o, t, 1.0 / math.sqrt(d), HEAD_DIM=d, BLOCK_M=block_m,
                                               BLOCK_N=block_n)
    return o


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    t, d = q.shape[1], q.shape[2]
    s = q.double() @ k.double().transpose(1, 2) / math.sqrt(d)
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return (torch.softmax(s, -1) @ v.double()).to(q.dtype)
