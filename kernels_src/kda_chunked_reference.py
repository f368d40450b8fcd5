"""The KDA speculative decode step in chunked (WY) form, float64 torch: the algebra a chunked decode kernel follows.

`spec_decode_step_chunked` has the API and cache updates of `kda_reference.spec_decode_step_torch`, but instead of
running the delta rule token by token it processes the replayed drafts and the new tokens as two chunks. Per head,
with the state S [V, K] (V-first, as the cache), a chunk of n tokens (q_i, k_i, v_i, beta_i, log-decay g_i [K])
starting from S_0, and Gamma_i = g_1 + ... + g_i (per channel):

    token by token:  S~ = S_{i-1} diag(e^{g_i});  d_i = beta_i (v_i - S~ k_i);  S_i = S~ + d_i k_i^T;  o_i = S_i q_i
    closed form:     S_i = S_0 diag(e^{Gamma_i}) + sum_{j <= i} d_j (k_j * e^{Gamma_i - Gamma_j})^T
    deltas:          (I + diag(beta) tril(A, -1)) D = diag(beta) (V - K^ S_0^T),    A[i, j] = <k_i, k_j e^{Gamma_i - Gamma_j}>
    outputs:         O = Q^ S_0^T + tril(B) D,                                          B[i, j] = <q_i, k_j e^{Gamma_i - Gamma_j}>
    with K^ / Q^ the rows k_i * e^{Gamma_i} / q_i * e^{Gamma_i} (rows of D, V, O are tokens).

So a step reads S_0 once, does two [n, K] x [K, V] products against it (K^ S_0^T, Q^ S_0^T), one n x n triangular
solve and a rank-n update, instead of n sequential passes over the state each with a reduction over K. Every
exponent is <= 0 (g <= 0; j <= i), so nothing overflows. The conv, L2 norms, gate and output norm are the per-token
ops of `reference_token_step`, applied to all of a step's tokens at once (they do not depend on the state).
"""
from __future__ import annotations

import torch

from .kda_decode import CONV_WIDTH, KDADecodeCache, KDADecodeWeights
from .kda_reference import conv_qkv, gated_rms_norm, kda_gate


def chunk_deltas(s0: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(D [H, n, V], Gamma [H, n, K]) of a chunk: s0 [H, V, K]; k, g [H, n, K]; v [H, n, V]; beta [H, n]."""
    gamma = g.cumsum(1)
    n = k.shape[1]
    rel = torch.exp(gamma[:, :, None, :] - gamma[:, None, :, :])  # [H, i, j, K]; used for j <= i only
    a = torch.einsum("hik,hjk,hijk->hij", k, k, rel)
    lower = torch.tril(torch.ones(n, n, dtype=torch.bool, device=k.device), -1)
    t = torch.eye(n, dtype=k.dtype, device=k.device) + beta[:, :, None] * torch.where(lower, a, 0.0)
    rhs = beta[:, :, None] * (v - torch.einsum("hnk,hvk->hnv", k * torch.exp(gamma), s0))
    return torch.linalg.solve_triangular(t, rhs, upper=False, unitriangular=True), gamma


def chunk_state(s0: torch.Tensor, k: torch.Tensor, d: torch.Tensor, gamma: torch.Tensor, i: int) -> torch.Tensor:
    """S_i [H, V, K], the state after the chunk's first i tokens (i >= 1)."""
    last = gamma[:, i - 1]
    decayed = k[:, :i] * torch.exp(last[:, None, :] - gamma[:, :i])
    return s0 * torch.exp(last)[:, None, :] + torch.einsum("hjv,hjk->hvk", d[:, :i], decayed)


def chunk_outputs(s0: torch.Tensor, q: torch.Tensor, k: torch.Tensor, d: torch.Tensor, gamma: torch.Tensor
                  ) -> torch.Tensor:
    """O [H, n, V]: o_i = S_i q_i for every token of the chunk."""
    rel = torch.exp(gamma[:, :, None, :] - gamma[:, None, :, :])
    b = torch.tril(torch.einsum("hik,hjk,hijk->hij", q, k, rel))
    return torch.einsum("hnk,hvk->hnv", q * torch.exp(gamma), s0) + torch.einsum("hij,hjv->hiv", b, d)


def _token_vectors(raw: torch.Tensor, f: torch.Tensor, beta: torch.Tensor, conv: torch.Tensor,
                   weights: KDADecodeWeights, h: int, kd: int, vd: int):
    """The per-token vectors of `kda_reference.conv_qkv` for the raw projections [n, C] that follow the committed
    window conv [3, C], as [H, n, *] (q, k, v, beta, g), and the window after each token [n, 3, C]."""
    window = torch.cat([conv, raw], 0)  # [3 + n, C]
    n = raw.shape[0]
    windows = torch.stack([window[i:i + CONV_WIDTH] for i in range(n)])  # [n, 4, C]: each token's taps
    q, k, v = (x.transpose(0, 1) for x in conv_qkv(windows, weights, h, kd, vd))
    return q, k, v, torch.sigmoid(beta.double()).T, kda_gate(f, weights).transpose(0, 1), windows[:, 1:]


def spec_decode_step_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, f: torch.Tensor, beta: torch.Tensor,
                             gate: torch.Tensor, weights: KDADecodeWeights, cache: KDADecodeCache,
                             state_indices: torch.Tensor, num_accepted: torch.Tensor,
                             out: torch.Tensor | None = None) -> torch.Tensor:
    """`spec_decode_step_torch` (same arguments, outputs and cache updates) computed as two chunks per row: the
    accepted drafts (replayed from the cache) and the new tokens (module docstring)."""
    bsz, t, h, kd = q.shape
    vd = v.shape[-1]
    out = torch.empty_like(gate) if out is None else out
    for b in range(bsz):
        slot = int(state_indices[b])
        if slot < 0:
            continue
        a = min(max(int(num_accepted[b]), 0), cache.max_drafts)
        drafts = cache.draft_proj[slot, :a].double()  # [a, H, 3K + V]: q | k | v | f
        new_raw = torch.cat([q[b], k[b], v[b]], -1).double()  # [t, H, 2K + V]
        raw = torch.cat([drafts[..., :2 * kd + vd], new_raw], 0)  # [a + t, H, 2K + V] per head: q | k | v
        # the conv channels are laid out q (all heads) | k | v, not per head
        flat = torch.cat([raw[..., :kd].reshape(a + t, -1), raw[..., kd:2 * kd].reshape(a + t, -1),
                          raw[..., 2 * kd:].reshape(a + t, -1)], -1)
        f_all = torch.cat([drafts[..., 2 * kd + vd:], f[b].double()], 0)
        beta_all = torch.cat([cache.draft_beta[slot, :a].double(), beta[b].double()], 0)
        qs, ks, vs, betas, gs, windows = _token_vectors(flat, f_all, beta_all, cache.conv_state[slot].double(),
                                                        weights, h, kd, vd)
        s = cache.state[slot].double()
        if a:
            d, gamma = chunk_deltas(s, ks[:, :a], vs[:, :a], betas[:, :a], gs[:, :a])
            s = chunk_state(s, ks[:, :a], d, gamma, a)
        d, gamma = chunk_deltas(s, ks[:, a:], vs[:, a:], betas[:, a:], gs[:, a:])
        out[b] = gated_rms_norm(chunk_outputs(s, qs[:, a:], ks[:, a:], d, gamma).transpose(0, 1), gate[b],
                                weights).to(out.dtype)
        cache.state[slot] = chunk_state(s, ks[:, a:], d, gamma, 1).to(cache.state.dtype)
        cache.conv_state[slot] = windows[a].to(cache.conv_state.dtype)
        for i in range(1, t):
            cache.draft_proj[slot, i - 1] = torch.cat([q[b, i], k[b, i], v[b, i], f[b, i]], -1)
            cache.draft_beta[slot, i - 1] = beta[b, i]
    return out
