"""Float64 references for KDA (Kimi Delta Attention) prefill with fla's `chunk_kda` semantics.

Semantics (fla 0.6.0 `chunk_kda(..., use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=lb)`), per sequence and head:

    q, k  <- x / sqrt(sum(x^2) + 1e-6)                     (L2 norm over the head dim)
    g     =  lb * sigmoid(exp(A_log[h]) * (g_raw + dt_bias[h*K:(h+1)*K]))    (natural-log decay in (lb, 0))
    beta  =  sigmoid(beta_raw)
    S_t   =  (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1} + beta_t k_t v_t^T          S in R^{K x V}
    o_t   =  S_t^T (scale * q_t)                                                    scale = K^-0.5 by default

Three references, all float64:
- `kda_recurrent_reference`: the recurrence above token by token (the oracle the tests trust).
- `kda_chunked_reference`: the chunked WY/UT form of kda.md §1.4 with an exact triangular inverse; it checks the
  algebra the kernel implements and is fast enough for long sequences.
- `segment_transitions` / `compose_transitions`: the affine segment maps S -> M S + E of kda.md §6 (context
  parallelism), used to check that composing segment maps reproduces the unsplit final state.

States are [N, H, K, V] (or [N, H, V, K] with state_v_first), N = number of sequences (B, or len(cu_seqlens) - 1).
"""
from __future__ import annotations

from typing import Iterator

import torch

F64 = torch.float64


def kda_gate(g_raw: torch.Tensor, A_log: torch.Tensor | None, dt_bias: torch.Tensor | None,
             lower_bound: float) -> torch.Tensor:
    """The floored KDA gate g = lb * sigmoid(exp(A_log[h]) * (g_raw + dt_bias)) in float64, shape of g_raw
    ([..., H, K]); A_log None means exp(A_log) = 1, dt_bias None means no bias."""
    H, K = g_raw.shape[-2:]
    g = g_raw.to(F64)
    if dt_bias is not None:
        g = g + dt_bias.to(F64).reshape(H, K)
    if A_log is not None:
        g = A_log.to(F64).reshape(H, 1).exp() * g
    return lower_bound * torch.sigmoid(g)


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x^2) + 1e-6) over the last dim, in float64 (fla's l2norm, eps inside the sqrt)."""
    x = x.to(F64)
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def sequence_bounds(batch: int, seq_len: int, cu_seqlens: torch.Tensor | None) -> list[tuple[int, int, int]]:
    """[(b, start, end)] token ranges of the sequences: fixed-length batches, or packed varlen (B == 1)."""
    if cu_seqlens is None:
        return [(b, 0, seq_len) for b in range(batch)]
    cu = [int(x) for x in cu_seqlens.tolist()]
    return [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]


def _prepared(q, k, v, g, beta, A_log, dt_bias, lower_bound, scale):
    """Float64 activations: normalised q (times scale) and k, v, the activated gate and beta."""
    K = q.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    return (l2_normalize(q) * scale, l2_normalize(k), v.to(F64), kda_gate(g, A_log, dt_bias, lower_bound),
            torch.sigmoid(beta.to(F64)))


def _state_in(initial_state: torch.Tensor | None, n: int, H: int, K: int, V: int, v_first: bool,
              device: torch.device) -> torch.Tensor:
    if initial_state is None:
        return torch.zeros(H, K, V, dtype=F64, device=device)
    s = initial_state[n].to(F64)
    return s.transpose(-1, -2).clone() if v_first else s.clone()


def _state_out(states: list[torch.Tensor], v_first: bool) -> torch.Tensor:
    s = torch.stack(states)
    return s.transpose(-1, -2).contiguous() if v_first else s


def kda_recurrent_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                            beta: torch.Tensor, *, A_log: torch.Tensor | None, dt_bias: torch.Tensor | None,
                            lower_bound: float = -5.0, scale: float | None = None,
                            initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                            cu_seqlens: torch.Tensor | None = None, state_v_first: bool = False
                            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-by-token float64 KDA. Returns (o [B,T,H,V] float64, final state float64 or None)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    qs, ks, vs, gs, bs = _prepared(q, k, v, g, beta, A_log, dt_bias, lower_bound, scale)
    o = torch.zeros(B, T, H, V, dtype=F64, device=q.device)
    finals = []
    for n, (b, start, end) in enumerate(sequence_bounds(B, T, cu_seqlens)):
        S = _state_in(initial_state, n, H, K, V, state_v_first, q.device)  # [H, K, V]
        for t in range(start, end):
            S = S * gs[b, t].exp()[:, :, None]  # decay each K row
            pred = torch.einsum("hk,hkv->hv", ks[b, t], S)
            S = S + torch.einsum("hk,hv->hkv", ks[b, t] * bs[b, t][:, None], vs[b, t] - pred)
            o[b, t] = torch.einsum("hk,hkv->hv", qs[b, t], S)
        finals.append(S)
    return o, (_state_out(finals, state_v_first) if output_final_state else None)


# ---------------------------------------------------------------------------------------------- chunked form


def _chunks(start: int, end: int, chunk: int) -> Iterator[tuple[int, int]]:
    for c0 in range(start, end, chunk):
        yield c0, min(c0 + chunk, end)


def chunk_factors(qs: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor, gs: torch.Tensor, bs: torch.Tensor
                  ) -> dict[str, torch.Tensor]:
    """The WY/UT factors of one chunk of one head (kda.md §1.4), float64, natural-log units.

    qs [n,K] (already scaled), ks [n,K], vs [n,V], gs [n,K] (activated gate), bs [n]. Returns w, u, kg, qg, the
    causal score matrix aqk (diagonal kept) and decay = exp(G_last)."""
    G = gs.cumsum(0)  # inclusive in-chunk cumulative log decay
    decay_ij = (G[:, None, :] - G[None, :, :]).clamp(max=0).exp()  # exp(G_i - G_j), exact for j <= i
    L = bs[:, None] * torch.tril(torch.einsum("id,jd,ijd->ij", ks, ks, decay_ij), -1)
    eye = torch.eye(len(bs), dtype=F64, device=qs.device)
    ainv = torch.linalg.solve_triangular(eye + L, eye, upper=False)
    w = ainv @ (bs[:, None] * ks * G.exp())
    u = ainv @ (bs[:, None] * vs)
    aqk = torch.tril(torch.einsum("id,jd,ijd->ij", qs, ks, decay_ij))
    return {"w": w, "u": u, "kg": ks * (G[-1] - G).exp(), "qg": qs * G.exp(), "aqk": aqk, "decay": G[-1].exp()}


def chunk_step(S: torch.Tensor, f: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of the recurrence on a [K, X] state: (output [n, X], state after the chunk)."""
    v_new = f["u"] - f["w"] @ S
    o = f["qg"] @ S + f["aqk"] @ v_new
    return o, f["decay"][:, None] * S + f["kg"].T @ v_new


def kda_chunked_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                          *, A_log: torch.Tensor | None, dt_bias: torch.Tensor | None, lower_bound: float = -5.0,
                          scale: float | None = None, initial_state: torch.Tensor | None = None,
                          output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None,
                          state_v_first: bool = False, chunk_size: int = 64
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chunked (WY/UT) form in float64; equal to `kda_recurrent_reference` up to float64 rounding."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    qs, ks, vs, gs, bs = _prepared(q, k, v, g, beta, A_log, dt_bias, lower_bound, scale)
    o = torch.zeros(B, T, H, V, dtype=F64, device=q.device)
    finals = []
    for n, (b, start, end) in enumerate(sequence_bounds(B, T, cu_seqlens)):
        S = _state_in(initial_state, n, H, K, V, state_v_first, q.device)
        for h in range(H):
            for c0, c1 in _chunks(start, end, chunk_size):
                f = chunk_factors(qs[b, c0:c1, h], ks[b, c0:c1, h], vs[b, c0:c1, h], gs[b, c0:c1, h],
                                  bs[b, c0:c1, h])
                o[b, c0:c1, h], S[h] = chunk_step(S[h], f)
        finals.append(S)
    return o, (_state_out(finals, state_v_first) if output_final_state else None)


def segment_transitions(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                        bounds: list[tuple[int, int]], *, A_log: torch.Tensor | None,
                        dt_bias: torch.Tensor | None, lower_bound: float = -5.0, chunk_size: int = 64
                        ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The affine map S_out = M S_in + E of each token segment [start, end) of batch row 0 (kda.md §6.1):
    M [H,K,K] is the recurrence run on the identity with u = 0, E [H,K,V] the recurrence run from zero."""
    H, K = q.shape[-2:]
    qs, ks, vs, gs, bs = _prepared(q, k, v, g, beta, A_log, dt_bias, lower_bound, None)
    maps = []
    for start, end in bounds:
        M = torch.eye(K, dtype=F64, device=q.device).repeat(H, 1, 1)
        E = torch.zeros(H, K, v.shape[-1], dtype=F64, device=q.device)
        for h in range(H):
            for c0, c1 in _chunks(start, end, chunk_size):
                f = chunk_factors(qs[0, c0:c1, h], ks[0, c0:c1, h], vs[0, c0:c1, h], gs[0, c0:c1, h],
                                  bs[0, c0:c1, h])
                M[h] = chunk_step(M[h], {**f, "u": torch.zeros_like(f["w"])})[1]
                E[h] = chunk_step(E[h], f)[1]
        maps.append((M, E))
    return maps


def compose_transitions(maps: list[tuple[torch.Tensor, torch.Tensor]], S0: torch.Tensor) -> list[torch.Tensor]:
    """The incoming state of every segment, [S0, M0 S0 + E0, M1 (M0 S0 + E0) + E1, ...] (one more than maps)."""
    states = [S0]
    for M, E in maps:
        states.append(M @ states[-1] + E)
    return states


def relative_error(ref: torch.Tensor, out: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| over all elements (float64), the error figure the tests bound."""
    ref, out = ref.to(F64), out.to(F64)
    return float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-300))


__all__ = ["kda_gate", "l2_normalize", "sequence_bounds", "kda_recurrent_reference", "kda_chunked_reference",
           "chunk_factors", "chunk_step", "segment_transitions", "compose_transitions", "relative_error"]
