"""KDA decode step with speculative-decoding replay: one kernel per layer and step, one program per (request, head).

Host API (`minitriton.kernels.kda_decode`):

    weights = KDADecodeWeights(conv_weight, a_log, dt_bias, o_norm_weight)   # one KDA layer's parameters
    cache = KDADecodeCache.allocate(num_slots, heads, head_k_dim, head_v_dim, max_drafts, dtype, device)
    o = kda_decode_step(q, k, v, f, beta, gate, weights, cache, state_indices, num_accepted)

Per step every batch row b verifies T = 1 + k tokens: the bonus token (sampled by the target model at the previous
step, so certain) followed by k draft tokens. `state_indices[b]` is the request's slot in the state pool (-1: a
padding row, skipped). `num_accepted[b]` is how many of THIS REQUEST's drafts of the previous step were accepted
(0..k; vLLM's `num_accepted_tokens` counts the bonus too: pass that minus one). Both are device tensors read by the
kernel, so a step is capturable in a CUDA graph (no `.item()`, fixed shapes).

Per (request, head) the program
  1. reads the committed recurrent state S (the state after the previous step's bonus token) and the conv window once;
  2. replays the previous step's `num_accepted[b]` accepted drafts from the draft cache (their raw projections):
     conv + SiLU, L2 norm of k, gate, beta, delta-rule update; no outputs (they were emitted last step);
  3. runs the T new tokens: conv + SiLU, L2 norm of q and k, gate, beta, the KDA recurrence, then the output norm
     (head-wise RMSNorm * weight * sigmoid(output gate)) -> o[b, t];
  4. writes S and the conv window back once, right after the bonus token (the last certain token);
  5. stores the k new drafts' raw projections into the draft cache for the next step's replay.

Contract: a slot appears in at most one row per step; after prefill (state and conv window = after the prompt) the
first step passes num_accepted = 0; every row carries the same k (rows with fewer real drafts pad them and never
accept the padding). The output-gate input of drafts is not cached: replayed tokens produce no outputs. No GVA
(value heads = q/k heads, as in Kimi K3).

Layouts (all contiguous; C = 2*H*K + H*V conv channels, ordered q | k | v as vLLM's fused qkv projection):
  inputs   q, k, f [B, T, H, K]; v, gate [B, T, H, V]; beta [B, T, H] (logits)   activation dtype (bf16 / fp32)
  output   o [B, T, H, V]                                                         q.dtype
  cache.state       [P, H, V, K] fp32: V-first (fla `state_v_first=True`, FlashKDA, SGLang, vLLM)
  cache.conv_state  [P, 3, C]    activation dtype: the last 3 conv inputs, oldest first
  cache.draft_proj  [P, MAX_DRAFTS, H, 3K+V] activation dtype: per draft row q | k | v | f (raw, pre-conv)
  cache.draft_beta  [P, MAX_DRAFTS, H]       activation dtype: beta logits of the drafts
  cache.draft_delta [P, MAX_DRAFTS, H, V+2K] fp32, only with allocate(..., replay_deltas=True): the replay
                    factors the opt-in `deltas` variants write and replay (None otherwise)
  weights.conv_weight [C, 4] fp32 (tap 3 multiplies the current token), a_log [>=H] fp32, dt_bias [H*K] fp32,
  o_norm_weight [V] fp32. Gate (Kimi K3 form): g = lower_bound * sigmoid(exp(a_log[h]) * (f + dt_bias[h]))

Numerics: everything after the loads is fp32; the state stays fp32. Per token, with decay a = exp(g) and the state as
rows S[v, :] (V-first):  u = beta * (v - S (a*k));  o = S (a*q) + u (k.q);  S <- S*a + u k^T.  This is the fla
recurrence (decay, delta rule on the decayed state, o = S^T q) regrouped so S is read once for both matvecs; the
L2 norms of q and k are applied to the matvecs' [V] results rather than to the K vectors. The decay is deferred: the
kernel keeps S_true = S * D[None, :] with a running column scale D (E = 1/D), so a token costs one fma per state
element for the update (S += u (E'*k)^T) instead of a multiply and an fma; D is folded back into S after each run
of `renorm_every` = 40 / |lower_bound| tokens (D >= e^-40) and after the bonus token, whose state is stored.

Register tile: the state is held as [KJ, V, KL, KV] (k = (j*KL + l)*KV + v; KV = 4 fp32 = one 16-byte vector,
KL = 8 lanes per row, `state_k_split`). Only the last axis is contiguous, so the coalesced layout puts a state row in
8 lanes of one warp: reductions over K are in-thread fmas plus 3 shuffles, with no shared memory. The K vectors that
meet the state (Dn*k, En*k, Dn*q, En*q) are in its slice layout, so the L2 norms and k.q are taken from them
(k.k = (Dn*k).(En*k)); u is formed in the state's [1, V, 1, 1] slice and feeds the update without a move.

Speed: `min_blocks_per_sm=2` (ptxas fits 8 warps in 128 registers; the inner token loops only reload a few
loop-invariant values from local memory, no spill stores), so one program's state loads and stores overlap another's
token loop; every token's raw rows are loaded one token
ahead (software pipelining) and the conv taps once, so no token waits on global memory.

k = 0 (T = 1) runs its own kernel, `kda_decode_t1_kernel`: the state rows evolve independently given the token's K
vectors, so it streams the state in V chunks (32 rows = 16 registers per thread at K = V = 128, 8 warps), the next
chunk's load in flight while the current one is updated and stored; the chunks' outputs are joined (`mt.cat`) for the
RMSNorm. 128 registers, no spills: two programs per SM. Accepted drafts of a previous step (possible, if rare, at
k = 0) are replayed chunk by chunk in a pass of their own before the token's pass.

T > 1 can also stream (variants `stream_scratch`, `stream_scratch_vc64`: `kda_decode_scratch_kernel`, off by
default): a persistent grid whose programs first compute every token's state-independent K vectors (replayed drafts
and new tokens together, as [TP, K] tiles) into a per-program fp32 scratch (L2-resident), mt.barrier(), then stream
the state in V chunks, running the token loop on each chunk with the token's columns loaded from the scratch in the
state's layout; the outputs' RMSNorm runs after the chunks, from the scratch.

T > 1 with the whole state in registers and no barrier in the token loops (variant `staged`:
`kda_decode_staged_kernel`, off by default until timed): a persistent grid whose programs stage every token's
state-independent vectors (conv, norms, gate, beta, the deferred decay's columns) in a per-program scratch in one
prologue ([2 TH, K] tiles), then run the token loop on the [KJ, V, KL, KV] state with each token's columns loaded from
the scratch straight in the state's layout and the outputs stored from the registers that computed them.

Variants (`VARIANTS`, `kda_decode_step(..., variant=NAME)`, default `DEFAULT_VARIANT`) choose the kernels, warps, the
T = 1 kernel's lanes per state row and prefetch depth, and the register caps, for A/B runs (tools/kda_decode_ab.py).
See docs/kernels/kda_decode.md.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import minitriton as mt

CONV_WIDTH = 4  # short causal conv taps; the conv window state keeps CONV_WIDTH - 1 = 3 past inputs
QK_NORM_EPS = 1e-6  # fla l2norm: x / sqrt(sum(x^2) + 1e-6)
# Lanes of a warp that share one state row (the rest of the row is in registers): a reduction over K then costs
# log2(8) = 3 shuffles per row held, and 4 lanes x 8 warps cover 32 rows per register run (docs/kernels/kda_decode.md)
STATE_K_LANES = 8
# The deferred decay's column scale D may fall to e^-40 before it is folded back into the state: 1 / D <= 2.4e17
# keeps the stored state far from the fp32 range, and D far from the subnormals that ex2.approx.ftz flushes.
MAX_DEFERRED_LOG_DECAY = 40.0
# Resident programs per SM of the persistent T > 1 kernel `kda_decode_scratch_kernel` (its `.minnctapersm`)
SCRATCH_PROGRAMS_PER_SM = 2


# ---------------------------------------------------------------------------------------------- kernel pieces


@mt.func
def _sigmoid(x):
    """1 / (1 + e^-x) as rsqrt(1 + e^-x)^2: two MUFU-class instructions and a multiply (relative error ~2^-22),
    where mt.sigmoid's IEEE rcp.rn costs a slow-path call site per element. e^-x = inf gives 0, as it should."""
    r = mt.rsqrt(1.0 + mt.exp(-x))
    return r * r


@mt.func
def _load_taps(taps):
    """The 4 conv taps of the channels `taps` points at (tap 3 multiplies the current input)."""
    return mt.load(taps + 0), mt.load(taps + 1), mt.load(taps + 2), mt.load(taps + 3)


@mt.func
def _conv_silu_taps(c0, c1, c2, x, w0, w1, w2, w3):
    """Depthwise causal conv over the window (c0, c1, c2 oldest first, x the current input) with the channels' taps
    w0..w3 (w3 multiplies the current input), then SiLU."""
    y = w0 * c0 + w1 * c1 + w2 * c2 + w3 * x
    return y * _sigmoid(y)


@mt.func
def _log_decay(f, dt_bias, a_coef, lower_bound):
    """The floored gate g = lower_bound * sigmoid(exp(A_log) * (f + dt_bias)), in (lower_bound, 0): decay = e^g."""
    return lower_bound * _sigmoid(a_coef * (f + dt_bias))


@mt.func
def _state_cols(x, KJ: mt.constexpr, KL: mt.constexpr, KV: mt.constexpr):
    """A [K] vector as the K axes of the state tile: [KJ, 1, KL, KV] with k = (j * KL + l) * KV + v."""
    return mt.expand_dims(x.reshape((KJ, KL, KV)), 1)


@mt.func
def _sum_k(x):
    """Sum over the K axes (0, 2, 3) of a [KJ, R, KL, KV] tile: registers first, then lanes -> [R]."""
    return mt.sum(mt.sum(mt.sum(x, axis=3), axis=0), axis=1)


@mt.func
def _sum_cols(x):
    """The sum of a [KJ, 1, KL, KV] K vector, a scalar (in-thread adds, then shuffles within one warp)."""
    return mt.sum(_sum_k(x), axis=0)


@mt.func
def _inv_norm_dot(x_scaled, x_unscaled):
    """1 / sqrt(x.x + eps) (fla's l2norm is x times this) from the [KJ, 1, KL, KV] columns Dn*x and En*x, whose
    dot product is x.x because Dn*En = 1. The columns of Dn*x and En*x multiply the state, so they are in the
    state's slice layout and the sum is in-thread fmas plus 3 shuffles; a separate column tile of x would get a
    layout of its own with K over warps (a cross-warp reduction: 2 barriers) and cost one more shared-memory move."""
    return mt.rsqrt(_sum_cols(x_scaled * x_unscaled) + QK_NORM_EPS)


@mt.func
def _delta_update(S, D, E, k, v, g, beta, KJ: mt.constexpr, KL: mt.constexpr, KV: mt.constexpr):
    """One token of the recurrence on the state in deferred-decay form (see `kda_decode_step_kernel`): the true
    state is S * D[None, :] (D a running column scale, E = 1 / D). With Dn = D e^g, En = E e^-g:
    u = beta (v - S (Dn*k)) = beta (v - S_true (decay*k)) and S_true' = S_true*decay + u k^T is S' = S + u (En*k)^T
    under the scale Dn, one fma per state element instead of a multiply and an fma. k comes un-normalized: 1/|k|
    is applied to the [V] results. u is computed in the state's [1, V, 1, 1] slice (v moves there; it does not
    depend on the state, so its move is off the critical path) and feeds the update without another move.
    S is [KJ, V, KL, KV]; D, E, k, g are [K]; v is [V]. Returns (S', Dn, En)."""
    dn = D * mt.exp(g)
    en = E * mt.exp(-g)
    dk = _state_cols(dn * k, KJ, KL, KV)
    sk = _sum_k(S * dk)[None, :, None, None]
    ek = _state_cols(en * k, KJ, KL, KV)
    rk = _inv_norm_dot(dk, ek)
    u = beta * (v[None, :, None, None] - rk * sk)
    return S + (u * rk) * ek, dn, en


@mt.func
def _delta_update_with_output(S, D, E, q, k, v, g, beta, KJ: mt.constexpr, KL: mt.constexpr,
                              KV: mt.constexpr):
    """The update of `_delta_update` plus o = S_true' q^ (q^ = q / |q|; the caller applies the scale), computed
    from the old state in the same pass: o = S_true (decay*q^) + u (k^.q^) = S (Dn*q) / |q| + u (k^.q^). The norms
    and k.q come from the Dn- and En-scaled columns (`_inv_norm_dot`). o is returned as a [V] vector. Also
    returned, for the draft cache's replay deltas, the update's two factors: delta ([1, V, 1, 1], u / |k|) and
    En*k (compact [K]), so that S' = S + delta (En*k)^T."""
    dn = D * mt.exp(g)
    en = E * mt.exp(-g)
    # the order keeps at most three column tiles (48 registers) live next to the state
    dq = _state_cols(dn * q, KJ, KL, KV)
    eq = _state_cols(en * q, KJ, KL, KV)
    rq = _inv_norm_dot(dq, eq)
    sq = _sum_k(S * dq)[None, :, None, None]
    dk = _state_cols(dn * k, KJ, KL, KV)
    kq = _sum_cols(dk * eq)
    sk = _sum_k(S * dk)[None, :, None, None]
    enk = en * k
    ek = _state_cols(enk, KJ, KL, KV)
    rk = _inv_norm_dot(dk, ek)
    u = beta * (v[None, :, None, None] - rk * sk)
    o = rq * sq + u * (rk * rq * kq)
    delta = u * rk
    return S + delta * ek, dn, en, o.reshape(v.shape), delta, enk


@mt.func
def _gated_rms_norm(o, gate, weight, eps, V):
    """Head-wise RMSNorm over the V values of o, times the norm weight, times sigmoid(output gate)."""
    return o * mt.rsqrt(mt.sum(o * o, axis=0) / V + eps) * weight * _sigmoid(gate)


@mt.func
def _renormalize(S, D, KJ: mt.constexpr, KL: mt.constexpr, KV: mt.constexpr):
    """Fold the deferred decay's column scale into the state: (S * D[None, :], D = 1, E = 1)."""
    ones = mt.full(D.shape, 1.0, mt.float32)
    return S * _state_cols(D, KJ, KL, KV), ones, ones


@mt.func
def _load_token(q_ptr, k_ptr, v_ptr, f_ptr, beta_ptr, tok, offs_k, offs_v, K: mt.constexpr, V: mt.constexpr):
    """The raw q, k, v, f rows and beta logit of new token-head `tok` (row of the [B*T*H] token-heads)."""
    return (mt.load(q_ptr + tok * K + offs_k), mt.load(k_ptr + tok * K + offs_k), mt.load(v_ptr + tok * V + offs_v),
            mt.load(f_ptr + tok * K + offs_k), mt.load(beta_ptr + tok))


@mt.func
def _load_draft(draft_proj_ptr, draft_beta_ptr, draft, offs_k, offs_v, K: mt.constexpr, V: mt.constexpr):
    """The cached raw q, k, v, f rows and beta logit of draft-cache row `draft` (= (slot * MAX_DRAFTS + j) * H + h)."""
    row = draft_proj_ptr + draft * (3 * K + V)
    return (mt.load(row + offs_k), mt.load(row + K + offs_k), mt.load(row + 2 * K + offs_v),
            mt.load(row + 2 * K + V + offs_k), mt.load(draft_beta_ptr + draft))


@mt.func
def _prefetch_rows_l1(base_ptr, row0, row_step, lo, hi, ROW_ELEMS: mt.constexpr, LINE_ELEMS: mt.constexpr,
                      PR: mt.constexpr, PL: mt.constexpr):
    """Into this SM's L1, without waiting: every 128-byte line of the rows row0 + j * row_step (j in [lo, hi)) of
    `base_ptr`, each ROW_ELEMS elements long (LINE_ELEMS of them a line). PR >= hi and PL >= the lines a row spans,
    powers of two: one prefetch a thread covers a [PR, PL] tile. Why: the rows' loads sit in loops whose every
    iteration waits for its own loads (nothing else in flight), so each would pay a full memory latency."""
    j = mt.arange(0, PR)[:, None]
    line = mt.arange(0, PL)[None, :] * LINE_ELEMS
    mt.prefetch(base_ptr + (row0 + j * row_step) * ROW_ELEMS + line,
                mask=(j >= lo) & (j < hi) & (line < ROW_ELEMS))


@mt.func
def _new_token(raw_q, raw_k, raw_v, raw_f, raw_b, gate_ptr, o_ptr, tok, S, D, E,
               cq0, cq1, cq2, ck0, ck1, ck2, cv0, cv1, cv2, wq0, wq1, wq2, wq3, wk0, wk1, wk2, wk3,
               wv0, wv1, wv2, wv3, offs_v, dt_bias, a_coef, norm_w,
               scale, lower_bound, norm_eps, V: mt.constexpr, KJ: mt.constexpr, KL: mt.constexpr,
               KV: mt.constexpr):
    """One new token (row `tok` of the [B*T*H] token-heads; its raw inputs already loaded): conv, gate, recurrence,
    gated RMSNorm -> o[tok]. w*: the conv taps of the q, k, v channels. Returns the state and the shifted conv
    windows, then the token's replay delta (delta and En*k of `_delta_update_with_output`)."""
    xq = raw_q.to(mt.float32)
    xk = raw_k.to(mt.float32)
    xv = raw_v.to(mt.float32)
    qq = _conv_silu_taps(cq0, cq1, cq2, xq, wq0, wq1, wq2, wq3)
    kk = _conv_silu_taps(ck0, ck1, ck2, xk, wk0, wk1, wk2, wk3)
    vv = _conv_silu_taps(cv0, cv1, cv2, xv, wv0, wv1, wv2, wv3)
    g = _log_decay(raw_f.to(mt.float32), dt_bias, a_coef, lower_bound)
    S, D, E, o, delta, enk = _delta_update_with_output(S, D, E, qq, kk, vv, g, _sigmoid(raw_b.to(mt.float32)), KJ,
                                                       KL, KV)
    gate = mt.load(gate_ptr + tok * V + offs_v).to(mt.float32)
    mt.store(o_ptr + tok * V + offs_v, _gated_rms_norm(o * scale, gate, norm_w, norm_eps, V))
    return S, D, E, cq1, cq2, xq, ck1, ck2, xk, cv1, cv2, xv, delta, enk


@mt.kernel(min_blocks_per_sm=2)
def kda_decode_step_kernel(
        q_ptr, k_ptr, v_ptr, f_ptr, beta_ptr, gate_ptr, o_ptr,
        state_ptr, conv_state_ptr, draft_proj_ptr, draft_beta_ptr, state_idx_ptr, num_accepted_ptr,
        conv_w_ptr, a_log_ptr, dt_bias_ptr, o_norm_w_ptr,
        scale, lower_bound, norm_eps, renorm_every, draft_delta_ptr,
        H: mt.constexpr, K: mt.constexpr, V: mt.constexpr, NUM_DRAFTS: mt.constexpr, MAX_DRAFTS: mt.constexpr,
        KL: mt.constexpr, KV: mt.constexpr, WRITE_DELTAS: mt.constexpr = False, REPLAY_DELTAS: mt.constexpr = False,
        WARPS: mt.constexpr = 8, ROWS_PREFETCH: mt.constexpr = 0, PL: mt.constexpr = 16):
    """The step with the whole [V, K] state in registers, token by token (variants `loop`, `stream*`; the module
    docstring says what a step does).

    WRITE_DELTAS: each new draft's update factors also go to the draft cache's delta rows (`draft_delta_ptr`,
    [P, MAX_DRAFTS, H, V + 2K] fp32: delta | En*k | D, `KDADecodeCache.draft_delta`): the update of draft t is
    S' = S + delta (En*k)^T in the deferred-decay form, D the column scale after it. REPLAY_DELTAS: the accepted
    drafts are replayed from those rows (one fma per state element a token: no conv, norm, gate or matvec), and
    the conv windows advance through the last three accepted drafts' raw inputs only. The replay runs the drafts
    in the runs of `renorm_every` tokens that wrote them, from the same committed state, so each token's En*k is
    the one it was written with and each run ends by folding its last D into S.

    ROWS_PREFETCH (a power of two >= MAX_DRAFTS and >= T, 0: off): before the state is read, the rows the token
    loops will load (the accepted drafts' rows, the new tokens' gate rows) are asked into L1 at once, [ROWS_PREFETCH,
    PL] lines each (PL: a power of two >= a row's lines), so the loops' loads hit L1 instead of each waiting a
    memory latency; the delta replay, with one fma an element a token, has nothing else to hide it behind."""
    h = mt.program_id(0)
    b = mt.program_id(1)
    T = NUM_DRAFTS + 1
    C = 2 * H * K + H * V  # conv channels: q | k | v
    ROW = 3 * K + V  # one draft row in the cache: q | k | v | f
    KJ = K // (KL * KV)  # the state's K axis as [KJ, KL, KV]: registers x lanes x 16-byte vectors
    slot = mt.load(state_idx_ptr + b)
    if slot >= 0:  # -1: a padding row, nothing read or written
        slot64 = slot.to(mt.int64)
        n_replay = _replay_count(num_accepted_ptr, b, MAX_DRAFTS)
        offs_k, offs_v, ch_q, ch_k, ch_v = _head_channels(h, H, K, V)
        draft0 = (slot64 * MAX_DRAFTS) * H + h  # draft-cache row of the slot's draft 0 (drafts are H rows apart)
        DROW = V + 2 * K  # a delta row: delta [V] | En*k [K] | D [K]
        if ROWS_PREFETCH > 0:
            if REPLAY_DELTAS:  # the delta rows, and the raw rows of the conv windows' last three inputs
                _prefetch_rows_l1(draft_delta_ptr, draft0, H, 0, n_replay, DROW, 32, ROWS_PREFETCH, PL)
                _prefetch_rows_l1(draft_proj_ptr, draft0, H, n_replay - (CONV_WIDTH - 1), n_replay, ROW, 64,
                                  ROWS_PREFETCH, PL)
            else:
                _prefetch_rows_l1(draft_proj_ptr, draft0, H, 0, n_replay, ROW, 64, ROWS_PREFETCH, PL)
            _prefetch_rows_l1(gate_ptr, (b * T) * H + h, H, 0, T, V, 64, ROWS_PREFETCH, PL)

        # per-head parameters; the conv-tap vectors are 1 register each in the compact 1-D layout, cheaper than
        # re-reading them from L1 every token (they were 8 + 12 dependent loads per replayed / new token). The q taps
        # are loaded after the replay, which does not use them.
        wk0, wk1, wk2, wk3 = _load_taps(conv_w_ptr + ch_k * 4)
        wv0, wv1, wv2, wv3 = _load_taps(conv_w_ptr + ch_v * 4)
        dt_bias = mt.load(dt_bias_ptr + h * K + offs_k)
        a_coef = mt.exp(mt.load(a_log_ptr + h))
        norm_w = mt.load(o_norm_w_ptr + offs_v)

        # committed state (after the previous step's bonus token): read once, as [KJ, V, KL, KV] so that a row's
        # K values sit in one warp (KL lanes x KJ*KV registers) and move as 16-byte vectors
        offs_k3 = ((mt.arange(0, KJ)[:, None, None] * KL + mt.arange(0, KL)[None, :, None]) * KV
                   + mt.arange(0, KV)[None, None, :])
        state_base = state_ptr + (slot64 * H + h) * (V * K)
        state_offs = offs_v[None, :, None, None] * K + offs_k3[:, None, :, :]
        S = mt.load(state_base + state_offs)
        # deferred decay: the true state is S * D[None, :]; D shrinks by the decay every token, E = 1 / D grows.
        # Folding D back into S (`_renormalize`) after every run of `renorm_every` tokens keeps D >= e^-40 (host:
        # 40 / |lower_bound| tokens), and after the bonus token, whose state is stored. Runs are inner loops rather
        # than an `if` in the token loop so that no branch yields the 64-register state every token.
        D = mt.full((K,), 1.0, mt.float32)
        E = mt.full((K,), 1.0, mt.float32)
        conv_base = conv_state_ptr + slot64 * (3 * C)
        cq0 = mt.load(conv_base + ch_q).to(mt.float32)
        cq1 = mt.load(conv_base + C + ch_q).to(mt.float32)
        cq2 = mt.load(conv_base + 2 * C + ch_q).to(mt.float32)
        ck0 = mt.load(conv_base + ch_k).to(mt.float32)
        ck1 = mt.load(conv_base + C + ch_k).to(mt.float32)
        ck2 = mt.load(conv_base + 2 * C + ch_k).to(mt.float32)
        cv0 = mt.load(conv_base + ch_v).to(mt.float32)
        cv1 = mt.load(conv_base + C + ch_v).to(mt.float32)
        cv2 = mt.load(conv_base + 2 * C + ch_v).to(mt.float32)

        # The raw inputs of the next token are loaded one token ahead (software pipelining): the loads of token j+1
        # are in flight while token j's state math runs, so no token waits a full memory latency for its rows.
        # The bonus token's rows are loaded here, next to the state.
        bonus = (b * T) * H + h
        raw_q, raw_k, raw_v, raw_f, raw_b = _load_token(q_ptr, k_ptr, v_ptr, f_ptr, beta_ptr, bonus, offs_k, offs_v,
                                                        K, V)

        # 1. replay the previous step's accepted drafts (no outputs; q only shifts through its conv window), in
        #    runs of `renorm_every` tokens with the deferred decay folded back into S after each run
        if REPLAY_DELTAS:
            for j0 in range(0, n_replay, renorm_every):
                j1 = mt.minimum(j0 + renorm_every, n_replay)
                for j in range(j0, j1):
                    drow = draft_delta_ptr + (draft0 + j * H) * DROW
                    S = S + mt.load(drow + offs_v)[None, :, None, None] * mt.load(drow + V + offs_k3)[:, None, :, :]
                last = draft_delta_ptr + (draft0 + (j1 - 1) * H) * DROW
                S = S * mt.load(last + V + K + offs_k3)[:, None, :, :]
            for j in range(mt.maximum(n_replay - (CONV_WIDTH - 1), 0), n_replay):  # the conv windows' last inputs
                xq, xk, xv, xf, xb = _load_draft(draft_proj_ptr, draft_beta_ptr, draft0 + j * H, offs_k, offs_v, K, V)
                cq0, cq1, cq2 = cq1, cq2, xq.to(mt.float32)
                ck0, ck1, ck2 = ck1, ck2, xk.to(mt.float32)
                cv0, cv1, cv2 = cv1, cv2, xv.to(mt.float32)
        else:
            xq, xk, xv, xf, xb = _load_draft(draft_proj_ptr, draft_beta_ptr, draft0, offs_k, offs_v, K, V)
            for j0 in range(0, n_replay, renorm_every):
                for j in range(j0, mt.minimum(j0 + renorm_every, n_replay)):
                    # the next accepted draft's rows (the last one reloads its own: clamped, never past the accepted)
                    nq, nk, nv, nf, nb = _load_draft(draft_proj_ptr, draft_beta_ptr,
                                                     draft0 + mt.minimum(j + 1, n_replay - 1) * H, offs_k, offs_v,
                                                     K, V)
                    kk = _conv_silu_taps(ck0, ck1, ck2, xk.to(mt.float32), wk0, wk1, wk2, wk3)
                    vv = _conv_silu_taps(cv0, cv1, cv2, xv.to(mt.float32), wv0, wv1, wv2, wv3)
                    g = _log_decay(xf.to(mt.float32), dt_bias, a_coef, lower_bound)
                    S, D, E = _delta_update(S, D, E, kk, vv, g, _sigmoid(xb.to(mt.float32)), KJ, KL, KV)
                    cq0, cq1, cq2 = cq1, cq2, xq.to(mt.float32)
                    ck0, ck1, ck2 = ck1, ck2, xk.to(mt.float32)
                    cv0, cv1, cv2 = cv1, cv2, xv.to(mt.float32)
                    xq, xk, xv, xf, xb = nq, nk, nv, nf, nb
                S, D, E = _renormalize(S, D, KJ, KL, KV)

        # 2. the bonus token (t = 0, certain): its state is committed (the only state write)
        wq0, wq1, wq2, wq3 = _load_taps(conv_w_ptr + ch_q * 4)
        S, D, E, cq0, cq1, cq2, ck0, ck1, ck2, cv0, cv1, cv2, _, _ = _new_token(
            raw_q, raw_k, raw_v, raw_f, raw_b, gate_ptr, o_ptr, bonus, S, D, E,
            cq0, cq1, cq2, ck0, ck1, ck2, cv0, cv1, cv2, wq0, wq1, wq2, wq3, wk0, wk1, wk2, wk3,
            wv0, wv1, wv2, wv3, offs_v, dt_bias, a_coef, norm_w, scale, lower_bound, norm_eps, V, KJ, KL, KV)
        S, D, E = _renormalize(S, D, KJ, KL, KV)
        mt.store(state_base + state_offs, S)
        mt.store(conv_base + ch_q, cq0)
        mt.store(conv_base + C + ch_q, cq1)
        mt.store(conv_base + 2 * C + ch_q, cq2)
        mt.store(conv_base + ch_k, ck0)
        mt.store(conv_base + C + ch_k, ck1)
        mt.store(conv_base + 2 * C + ch_k, ck2)
        mt.store(conv_base + ch_v, cv0)
        mt.store(conv_base + C + ch_v, cv1)
        mt.store(conv_base + 2 * C + ch_v, cv2)

        # 3. this step's drafts t = 1..NUM_DRAFTS: outputs, and their raw projections kept for the next step's replay
        if NUM_DRAFTS > 0:
            raw_q, raw_k, raw_v, raw_f, raw_b = _load_token(q_ptr, k_ptr, v_ptr, f_ptr, beta_ptr,
                                                            bonus + H, offs_k, offs_v, K, V)
            for t0 in range(1, T, renorm_every):
                for t in range(t0, mt.minimum(t0 + renorm_every, T)):
                    tok = (b * T + t) * H + h
                    # the next draft's rows (the last draft reloads its own)
                    nq, nk, nv, nf, nb = _load_token(q_ptr, k_ptr, v_ptr, f_ptr, beta_ptr,
                                                     tok + mt.minimum(1, T - 1 - t) * H, offs_k, offs_v, K, V)
                    draft = (slot64 * MAX_DRAFTS + t - 1) * H + h
                    row = draft_proj_ptr + draft * ROW
                    mt.store(row + offs_k, raw_q)
                    mt.store(row + K + offs_k, raw_k)
                    mt.store(row + 2 * K + offs_v, raw_v)
                    mt.store(row + 2 * K + V + offs_k, raw_f)
                    mt.store(draft_beta_ptr + draft, raw_b)
                    S, D, E, cq0, cq1, cq2, ck0, ck1, ck2, cv0, cv1, cv2, delta, enk = _new_token(
                        raw_q, raw_k, raw_v, raw_f, raw_b, gate_ptr, o_ptr, tok, S, D, E,
                        cq0, cq1, cq2, ck0, ck1, ck2, cv0, cv1, cv2, wq0, wq1, wq2, wq3, wk0, wk1, wk2, wk3,
                        wv0, wv1, wv2, wv3, offs_v, dt_bias, a_coef, norm_w, scale, lower_bound, norm_eps,
                        V, KJ, KL, KV)
                    if WRITE_DELTAS:
                        drow = draft_delta_ptr + draft * DROW
                        # from the layout delta was computed in (the state's, replicated over the K lanes):
                        # no exchange through shared memory
                        mt.store(drow + offs_v[None, :, None, None], delta,
                                 layout=mt.blocked([1, 1, 1, KV], [1, 32 // KL, KL, 1], [1, WARPS, 1, 1], [3, 2, 1, 0]))
                        mt.store(drow + V + offs_k, enk)
                        mt.store(drow + V + K + offs_k, D)
                    raw_q, raw_k, raw_v, raw_f, raw_b = nq, nk, nv, nf, nb
                S, D, E = _renormalize(S, D, KJ, KL, KV)


# ---------------------------------------------------------------- T = 1 (no drafts): the state streamed in V chunks


@mt.func
def _replay_chunk(S, n_replay, renorm_every, draft_proj_ptr, draft_beta_ptr, draft0, draft_step, conv_base,
                  conv_w_ptr, ch_k, ch_vc, dt_bias_ptr, a_coef, lower_bound, offs_k, offs_vc, v0, h,
                  C: mt.constexpr, K: mt.constexpr, V: mt.constexpr, KJ: mt.constexpr, KL: mt.constexpr,
                  KV: mt.constexpr):
    """Replays the `n_replay` accepted drafts of the previous step on one V chunk of the state (rows v0.. of S,
    [KJ, VC, KL, KV]; ch_vc: the chunk's v channels). Rows evolve independently given the per-token K vectors, so
    each chunk recomputes them from the draft cache (a k = 0 step after a drafting step is rare; the caller skips
    this when n_replay = 0, and nothing it loads stays live in the common path). Returns the chunk's true state
    (deferred decay folded back)."""
    ck0, ck1, ck2 = _conv_window(conv_base, ch_k, C)
    wk0, wk1, wk2, wk3 = _load_taps(conv_w_ptr + ch_k * 4)
    cv0, cv1, cv2 = _conv_window(conv_base, ch_vc, C)
    wv0, wv1, wv2, wv3 = _load_taps(conv_w_ptr + ch_vc * 4)
    dt_bias = mt.load(dt_bias_ptr + h * K + offs_k)
    D = mt.full((K,), 1.0, mt.float32)
    E = mt.full((K,), 1.0, mt.float32)
    ROW = 3 * K + V
    for j0 in range(0, n_replay, renorm_every):
        for j in range(j0, mt.minimum(j0 + renorm_every, n_replay)):
            draft = draft0 + j * draft_step
            row = draft_proj_ptr + draft * ROW
            xk = mt.load(row + K + offs_k).to(mt.float32)
            xv = mt.load(row + 2 * K + v0 + offs_vc).to(mt.float32)
            xf = mt.load(row + 2 * K + V + offs_k).to(mt.float32)
            xb = mt.load(draft_beta_ptr + draft).to(mt.float32)
            kk = _conv_silu_taps(ck0, ck1, ck2, xk, wk0, wk1, wk2, wk3)
            vv = _conv_silu_taps(cv0, cv1, cv2, xv, wv0, wv1, wv2, wv3)
            g = _log_decay(xf, dt_bias, a_coef, lower_bound)
            S, D, E = _delta_update(S, D, E, kk, vv, g, _sigmoid(xb), KJ, KL, KV)
            ck0, ck1, ck2 = ck1, ck2, xk
            cv0, cv1, cv2 = cv1, cv2, xv
        S, D, E = _renormalize(S, D, KJ, KL, KV)
    return S


@mt.func
def _token_chunk(S, a_cols, k_cols, q_cols, v, beta, rk, rq, kq):
    """One token on one V chunk of the true state S ([KJ, VC, KL, KV]), with decay a, un-normalized k and q as
    state columns and rk = 1/|k|, rq = 1/|q|, kq = k.q:  Sa = S*a;  u = beta (v - rk Sa k);
    o = rq Sa q + u rk rq kq;  S' = Sa + (u rk) k^T. Returns (S', o [VC]) (o without the scale)."""
    Sa = S * a_cols
    sk = _sum_k(Sa * k_cols)[None, :, None, None]
    sq = _sum_k(Sa * q_cols)[None, :, None, None]
    u = beta * (v[None, :, None, None] - rk * sk)
    o = rq * sq + u * (rk * rq * kq)
    return Sa + (u * rk) * k_cols, o.reshape(v.shape)


@mt.func
def _head_channels(h, H, K, V):
    """(offs_k, offs_v, q channels, k channels, v channels) of head h in the conv layout q | k | v."""
    offs_k = mt.arange(0, K)
    offs_v = mt.arange(0, V)
    return offs_k, offs_v, h * K + offs_k, H * K + h * K + offs_k, 2 * H * K + h * V + offs_v


@mt.func
def _replay_count(num_accepted_ptr, b, MAX_DRAFTS):
    """How many drafts of the previous step row b replays: its accepted count clamped to [0, MAX_DRAFTS]."""
    return mt.minimum(mt.maximum(mt.load(num_accepted_ptr + b).to(mt.int32), 0), MAX_DRAFTS)


@mt.func
def _conv_window(conv_base, ch, C: mt.constexpr):
    """The committed conv window of the channels `ch`: 3 past inputs, oldest first, as fp32."""
    return (mt.load(conv_base + ch).to(mt.float32), mt.load(conv_base + C + ch).to(mt.float32),
            mt.load(conv_base + 2 * C + ch).to(mt.float32))


@mt.kernel(min_blocks_per_sm=2)
def kda_decode_t1_kernel(
        q_ptr, k_ptr, v_ptr, f_ptr, beta_ptr, gate_ptr, o_ptr,
        state_ptr, conv_state_ptr, draft_proj_ptr, draft_beta_ptr, state_idx_ptr, num_accepted_ptr,
        conv_w_ptr, a_log_ptr, dt_bias_ptr, o_norm_w_ptr,
        scale, lower_bound, norm_eps, renorm_every,
        H: mt.constexpr, K: mt.constexpr, V: mt.constexpr, MAX_DRAFTS: mt.constexpr,
        KL: mt.constexpr, KV: mt.constexpr, VC: mt.constexpr, PREFETCH: mt.constexpr):
    """The T = 1 step (no drafts of its own; `kda_decode_step_kernel` with NUM_DRAFTS = 0 computes the same) with the
    state streamed in V chunks of VC rows: the rows of the state evolve independently given the token's K vectors
    (decay, k, q) and only the output RMSNorm couples them, through sum_v o^2. So the K vectors are computed once and
    the state is loaded, updated and stored one [KJ, VC, KL, KV] chunk at a time, the next chunk's load in flight
    while the current one is computed: a chunk is 16 registers per thread (VC = 4 x num_warps: one row per 8-lane
    group), against 64 for the whole state, and a program's loads overlap its own math and stores."""
    h = mt.program_id(0)
    b = mt.program_id(1)
    C = 2 * H * K + H * V
    ROW = 3 * K + V
    KJ = K // (KL * KV)
    NC = V // VC
    # The token's rows and the head's parameters do not depend on the slot: they are loaded before the slot is
    # known (a padding row's rows are valid memory too), so their latency overlaps the slot load's.
    offs_k = mt.arange(0, K)
    offs_v = mt.arange(0, V)
    tok = b * H + h
    raw_q = mt.load(q_ptr + tok * K + offs_k).to(mt.float32)
    raw_k = mt.load(k_ptr + tok * K + offs_k).to(mt.float32)
    raw_v = mt.load(v_ptr + tok * V + offs_v).to(mt.float32)
    raw_f = mt.load(f_ptr + tok * K + offs_k).to(mt.float32)
    raw_b = mt.load(beta_ptr + tok).to(mt.float32)
    gate = mt.load(gate_ptr + tok * V + offs_v).to(mt.float32)
    ch_q = h * K + offs_k
    ch_k = H * K + h * K + offs_k
    ch_v = 2 * H * K + h * V + offs_v
    wq0, wq1, wq2, wq3 = _load_taps(conv_w_ptr + ch_q * 4)
    wk0, wk1, wk2, wk3 = _load_taps(conv_w_ptr + ch_k * 4)
    wv0, wv1, wv2, wv3 = _load_taps(conv_w_ptr + ch_v * 4)
    dt_bias = mt.load(dt_bias_ptr + h * K + offs_k)
    a_coef = mt.exp(mt.load(a_log_ptr + h))
    norm_w = mt.load(o_norm_w_ptr + offs_v)
    # No branch on the slot: a padding row (slot -1) reads slot 0 (valid memory; the values are dropped), replays
    # nothing and stores nothing. A branch would let ptxas sink the loads above into it, behind the slot's latency.
    slot = mt.load(state_idx_ptr + b)
    live = slot >= 0
    slot64 = mt.maximum(slot, 0).to(mt.int64)
    accepted = mt.load(num_accepted_ptr + b).to(mt.int32)
    n_replay = mt.minimum(mt.maximum(accepted, 0), MAX_DRAFTS) * live.to(mt.int32)
    offs_vc = mt.arange(0, VC)
    offs_k3 = ((mt.arange(0, KJ)[:, None, None] * KL + mt.arange(0, KL)[None, :, None]) * KV
               + mt.arange(0, KV)[None, None, :])
    state_base = state_ptr + (slot64 * H + h) * (V * K)
    chunk_offs = offs_vc[None, :, None, None] * K + offs_k3[:, None, :, :]
    # the first PREFETCH chunks' loads go out first: their latency overlaps the token's vector math; each later
    # chunk is loaded PREFETCH chunks ahead of its use
    S = mt.load(state_base + chunk_offs)
    if PREFETCH > 1:
        S_1 = mt.load(state_base + (VC * K) + chunk_offs)
    conv_base = conv_state_ptr + slot64 * (3 * C)
    cq0, cq1, cq2 = _conv_window(conv_base, ch_q, C)
    ck0, ck1, ck2 = _conv_window(conv_base, ch_k, C)
    cv0, cv1, cv2 = _conv_window(conv_base, ch_v, C)

    # Replay of the previous step's accepted drafts (rare at T = 1: only after a step that drafted), chunk by
    # chunk in a pass of its own that writes the chunks back, so that none of the new token's values are live
    # across it (they would add to its registers); the new token then reloads the first chunk. A chunk is
    # stored by the threads that loaded it, so the reloads see the replayed state.
    draft0 = (slot64 * MAX_DRAFTS) * H + h
    if n_replay > 0:
        for c in range(0, NC):
            offs = state_base + c * (VC * K) + chunk_offs
            S_c = _replay_chunk(mt.load(offs), n_replay, renorm_every, draft_proj_ptr, draft_beta_ptr, draft0, H,
                                conv_base, conv_w_ptr, ch_k, 2 * H * K + h * V + c * VC + offs_vc, dt_bias_ptr,
                                a_coef, lower_bound, offs_k, offs_vc, c * VC, h, C, K, V, KJ, KL, KV)
            mt.store(offs, S_c, mask=live)
        S = mt.load(state_base + chunk_offs)
        if PREFETCH > 1:
            S_1 = mt.load(state_base + (VC * K) + chunk_offs)
    # the conv windows after the replayed drafts: a shift of their raw inputs
    pq0, pq1, pq2, pk0, pk1, pk2, pv0, pv1, pv2 = cq0, cq1, cq2, ck0, ck1, ck2, cv0, cv1, cv2
    for j in range(0, n_replay):
        row = draft_proj_ptr + (draft0 + j * H) * ROW
        pq0, pq1, pq2 = pq1, pq2, mt.load(row + offs_k).to(mt.float32)
        pk0, pk1, pk2 = pk1, pk2, mt.load(row + K + offs_k).to(mt.float32)
        pv0, pv1, pv2 = pv1, pv2, mt.load(row + 2 * K + offs_v).to(mt.float32)

    # the token's K vectors as state columns, and the norms and k.q from them (in-warp reductions)
    qq = _conv_silu_taps(pq0, pq1, pq2, raw_q, wq0, wq1, wq2, wq3)
    kk = _conv_silu_taps(pk0, pk1, pk2, raw_k, wk0, wk1, wk2, wk3)
    vv = _conv_silu_taps(pv0, pv1, pv2, raw_v, wv0, wv1, wv2, wv3)
    g = _log_decay(raw_f, dt_bias, a_coef, lower_bound)
    beta = _sigmoid(raw_b)
    a_cols = _state_cols(mt.exp(g), KJ, KL, KV)
    k_cols = _state_cols(kk, KJ, KL, KV)
    q_cols = _state_cols(qq, KJ, KL, KV)
    rk = _inv_norm_dot(k_cols, k_cols)
    rq = _inv_norm_dot(q_cols, q_cols)
    kq = _sum_cols(k_cols * q_cols)

    pieces = ()
    ahead = (S,)
    if PREFETCH > 1:
        ahead = (S, S_1)
    for c in mt.static_range(NC):
        if c + PREFETCH < NC:
            ahead = ahead + (mt.load(state_base + (c + PREFETCH) * (VC * K) + chunk_offs),)
        S = ahead[0]
        ahead = ahead[1:]
        v_c = vv[c * VC:(c + 1) * VC]
        S, o_c = _token_chunk(S, a_cols, k_cols, q_cols, v_c, beta, rk, rq, kq)
        mt.store(state_base + c * (VC * K) + chunk_offs, S, mask=live)
        pieces = pieces + (o_c,)
        if c == 0:
            # The conv windows move to this token. Every thread's window loads are done: their values fed
            # the column and v moves of this chunk, which went through bar.sync (see "In-place safety" in
            # docs/kernels/kda_decode.md). Stored here rather than at the end so they free their registers.
            mt.store(conv_base + ch_q, pq1, mask=live)
            mt.store(conv_base + C + ch_q, pq2, mask=live)
            mt.store(conv_base + 2 * C + ch_q, raw_q, mask=live)
            mt.store(conv_base + ch_k, pk1, mask=live)
            mt.store(conv_base + C + ch_k, pk2, mask=live)
            mt.store(conv_base + 2 * C + ch_k, raw_k, mask=live)
            mt.store(conv_base + ch_v, pv1, mask=live)
            mt.store(conv_base + C + ch_v, pv2, mask=live)
            mt.store(conv_base + 2 * C + ch_v, raw_v, mask=live)
    o = mt.cat(pieces, 0)
    mt.store(o_ptr + tok * V + offs_v, _gated_rms_norm(o * scale, gate, norm_w, norm_eps, V), mask=live)


# ------------------------------------------- T > 1: per-token K vectors staged in a scratch, the state streamed


def scratch_floats(head_k_dim: int, head_v_dim: int, max_drafts: int, tokens: int) -> int:
    """fp32 values of one program's scratch in `kda_decode_scratch_kernel`: TP rows of `scratch_row_floats` and
    TP + 3 rows of raw q | k | v in sequence order (TP = `scratch_tokens`)."""
    tp = scratch_tokens(max_drafts, tokens)
    return tp * scratch_row_floats(head_k_dim, head_v_dim) + (tp + 3) * (2 * head_k_dim + head_v_dim)


def scratch_programs(device: torch.device, items: int) -> int:
    """Programs of the persistent `kda_decode_scratch_kernel` for `items` (row, head) pairs: the resident ones,
    SCRATCH_PROGRAMS_PER_SM per SM on a GPU (their scratch stays in L2); 2 elsewhere (the interpreter, the PTX
    simulator), so that tests see programs work through several items."""
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return max(1, min(items, SCRATCH_PROGRAMS_PER_SM * sms))
    return max(1, min(items, 2))


def scratch_tokens(max_drafts: int, tokens: int) -> int:
    """TP: the replayed drafts and new tokens of a step, rounded up to a power of two (a tile dimension)."""
    return _pow2_at_least(max_drafts + tokens)


def scratch_row_floats(head_k_dim: int, head_v_dim: int) -> int:
    """fp32 values of one token's scratch row in `kda_decode_scratch_kernel`: D | D k^ | k^ / D | D q^ (K each),
    v | o (V each), beta, k^.q^ and 2 pads (rows stay 16-byte aligned for the vector loads)."""
    return 4 * head_k_dim + 2 * head_v_dim + 4


@mt.func
def _scratch_replay(S, srow, v0, offs_vc, col_offs, K: mt.constexpr, V: mt.constexpr):
    """One replayed token on a V chunk S ([KJ, VC, KL, KV], rows v0..) of the state in deferred-decay form (the
    true state is S D_{t-1}[None, :]), its vectors read from its scratch row, the columns straight in the state's
    layout (no move): u = beta (v - S (D_t k^));  S' = S + u (E_t k^)^T, under the scale D_t."""
    dk = mt.load(srow + K + col_offs)
    ek = mt.load(srow + 2 * K + col_offs)
    v = mt.load(srow + 4 * K + v0 + offs_vc)
    beta = mt.load(srow + 4 * K + 2 * V)
    u = beta * (v[None, :, None, None] - _sum_k(S * dk)[None, :, None, None])
    return S + u * ek


@mt.func
def _scratch_new_token(S, srow, v0, offs_vc, col_offs, K: mt.constexpr, V: mt.constexpr):
    """One new token on a V chunk: the update of `_scratch_replay` plus the un-normalized output
    o = S_true' q^ = S (D_t q^) + u (k^.q^) (q^ carries the scale), stored to the token's scratch row for the norm."""
    dk = mt.load(srow + K + col_offs)
    ek = mt.load(srow + 2 * K + col_offs)
    dq = mt.load(srow + 3 * K + col_offs)
    v = mt.load(srow + 4 * K + v0 + offs_vc)
    beta = mt.load(srow + 4 * K + 2 * V)
    kq = mt.load(srow + 4 * K + 2 * V + 1)
    sq = _sum_k(S * dq)[None, :, None, None]
    u = beta * (v[None, :, None, None] - _sum_k(S * dk)[None, :, None, None])
    mt.store(srow + 4 * K + V + v0 + offs_vc, (sq + u * kq).reshape(v.shape))
    return S + u * ek


@mt.func
def _raw_rows(draft_proj_ptr, src_ptr, drow, trow, is_d, is_t, offs, DRAFT_COL: mt.constexpr,
              WIDTH: mt.constexpr, ROW: mt.constexpr):
    """[TP, WIDTH] raw inputs of one projection for every sequence position (fp32): the draft cache's rows
    (`drow`, where is_d) or the new tokens' rows (`trow`, where is_t), 0 elsewhere."""
    full = offs[None, :] >= 0
    xd = mt.load(draft_proj_ptr + drow[:, None] * ROW + DRAFT_COL + offs[None, :], mask=is_d[:, None] & full,
                 other=0.0)
    xt = mt.load(src_ptr + trow[:, None] * WIDTH + offs[None, :], mask=is_t[:, None] & full, other=0.0)
    return xd.to(mt.float32) + xt.to(mt.float32)


@mt.func
def _conv_rows(seq, rows, col, offs, taps_ptr, RAW: mt.constexpr):
    """Conv + SiLU of every sequence position at once: the 4 taps read the raw inputs of positions s-3..s from the
    sequence area of the scratch (row s + 3 holds position s; rows 0..2 the committed window)."""
    w0, w1, w2, w3 = _load_taps(taps_ptr)
    base = seq + rows[:, None] * RAW + col + offs[None, :]
    y = (w0[None, :] * mt.load(base) + w1[None, :] * mt.load(base + RAW) + w2[None, :] * mt.load(base + 2 * RAW)
         + w3[None, :] * mt.load(base + 3 * RAW))
    return y * _sigmoid(y)


@mt.kernel(min_blocks_per_sm=2)
def kda_decode_scratch_kernel(
        q_ptr, k_ptr, v_ptr, f_ptr, beta_ptr, gate_ptr, o_ptr,
        state_ptr, conv_state_ptr, draft_proj_ptr, draft_beta_ptr, state_idx_ptr, num_accepted_ptr,
        conv_w_ptr, a_log_ptr, dt_bias_ptr, o_norm_w_ptr,
        scale, lower_bound, norm_eps, renorm_every, scratch_ptr, num_items,
        H: mt.constexpr, K: mt.constexpr, V: mt.constexpr, NUM_DRAFTS: mt.constexpr, MAX_DRAFTS: mt.constexpr,
        KL: mt.constexpr, KV: mt.constexpr, VC: mt.constexpr, TP: mt.constexpr, TN: mt.constexpr):
    """The step for any T with the state streamed in V chunks (variants `stream_scratch*`). The rows of the state
    evolve independently given each token's K vectors, so:
      1. prologue: the state-independent vectors of every token (replayed drafts, then the T new tokens: conv,
         SiLU, gate, L2 norms, beta, k^.q^, the deferred-decay columns) are computed once, for all tokens together
         as [TP, K] tiles (TP = MAX_DRAFTS + T rounded up to a power of two; row s = sequence position s: replayed
         draft j at s = j, new token t at s = n + t), and written to this program's scratch rows (fp32, ROW_S
         values each, `scratch_row_floats`). The conv taps of s read the raw inputs of s-3..s: the raw rows are
         first written in sequence order to a second area of the scratch, behind the committed window, and read
         back shifted (an mt.barrier() between);
      2. mt.barrier() (the chunks read them in another layout, so in other threads), then the conv window and the
         new drafts' raw rows are stored: every thread's loads of the window and of the replayed draft rows are
         done (see "In-place safety");
      3. for each [KJ, VC, KL, KV] chunk of the state (the next one's load in flight): the replayed drafts, the
         bonus token, then the chunk is stored (the committed state), then the new drafts; each token's columns
         are loaded from the scratch straight in the state's layout (L1 / L2 hits), and each new token's chunk of
         un-normalized o goes back to its scratch row;
      4. mt.barrier(), then per new token: o from the scratch, RMSNorm * weight * sigmoid(gate) -> o.
    Deferred decay as in `kda_decode_step_kernel`: the chunk is kept as S_true = S D[None, :]; a replayed token
    costs 2 ops per state element, a new token 3. D restarts at each run of `renorm_every` tokens (runs: the
    replayed drafts from 0, the bonus token alone, the new drafts from 1), and each run ends with S *= D (the
    last token's D column, from the scratch)."""
    pid = mt.program_id(0)
    T = NUM_DRAFTS + 1
    C = 2 * H * K + H * V
    ROW = 3 * K + V
    ROW_S = 4 * K + 2 * V + 4
    SCRATCH = TP * ROW_S + (TP + 3) * (2 * K + V)  # fp32 per program: `scratch_floats`
    KJ = K // (KL * KV)
    NC = V // VC
    # persistent: program pid works through items (row b, head h) = divmod(item, H) with its own scratch, which
    # stays L2-resident (num_programs x `scratch_floats`: ~20 MB at 2 x 132 programs)
    scr = scratch_ptr + pid.to(mt.int64) * SCRATCH
    for item in range(pid, num_items, mt.num_programs(0)):
        h = item % H
        b = item // H
        slot = mt.load(state_idx_ptr + b)
        if slot >= 0:  # -1: a padding row, nothing read or written
            slot64 = slot.to(mt.int64)
            n_replay = _replay_count(num_accepted_ptr, b, MAX_DRAFTS)
            offs_k, offs_v, ch_q, ch_k, ch_v = _head_channels(h, H, K, V)
            dt_bias = mt.load(dt_bias_ptr + h * K + offs_k)
            a_coef = mt.exp(mt.load(a_log_ptr + h))
            norm_w = mt.load(o_norm_w_ptr + offs_v)
            conv_base = conv_state_ptr + slot64 * (3 * C)
            offs_vc = mt.arange(0, VC)
            offs_k3 = ((mt.arange(0, KJ)[:, None, None] * KL + mt.arange(0, KL)[None, :, None]) * KV
                       + mt.arange(0, KV)[None, None, :])
            state_base = state_ptr + (slot64 * H + h) * (V * K)
            chunk_offs = offs_vc[None, :, None, None] * K + offs_k3[:, None, :, :]
            # a token's K vectors as [KJ, VC, KL, KV] tiles (stride 0 over the rows): the load gets the state's
            # coalesced layout, so a column arrives in the registers that multiply the chunk, with no move
            col_offs = offs_vc[None, :, None, None] * 0 + offs_k3[:, None, :, :]
            S_next = mt.load(state_base + chunk_offs)  # chunk 0 in flight during the prologue

            # 1. the per-token vectors of every sequence position s (replayed drafts s < n, new token t at s = n + t),
            #    all at once as [TP, K] tiles. The raw inputs go to the scratch's sequence area first (rows 0..2: the
            #    committed window, row s + 3: position s), so that each conv tap is a shifted read of it.
            rows = mt.arange(0, TP)
            n_tok = n_replay + T
            is_d = rows < n_replay
            is_t = (rows >= n_replay) & (rows < n_tok)
            draft0 = (slot64 * MAX_DRAFTS) * H + h
            drow = draft0 + mt.minimum(rows, MAX_DRAFTS - 1) * H
            trow = (b * T + mt.minimum(mt.maximum(rows - n_replay, 0), T - 1)) * H + h
            seq = scr + TP * ROW_S
            RAW = 2 * K + V
            seq_rows = seq + (rows[:, None] + 3) * RAW
            mt.store(seq_rows + offs_k[None, :], _raw_rows(draft_proj_ptr, q_ptr, drow, trow, is_d, is_t, offs_k, 0, K,
                                                          ROW))
            mt.store(seq_rows + K + offs_k[None, :], _raw_rows(draft_proj_ptr, k_ptr, drow, trow, is_d, is_t, offs_k, K,
                                                              K, ROW))
            mt.store(seq_rows + 2 * K + offs_v[None, :], _raw_rows(draft_proj_ptr, v_ptr, drow, trow, is_d, is_t,
                                                                  offs_v, 2 * K, V, ROW))
            for i in mt.static_range(3):
                mt.store(seq + i * RAW + offs_k, mt.load(conv_base + i * C + ch_q).to(mt.float32))
                mt.store(seq + i * RAW + K + offs_k, mt.load(conv_base + i * C + ch_k).to(mt.float32))
                mt.store(seq + i * RAW + 2 * K + offs_v, mt.load(conv_base + i * C + ch_v).to(mt.float32))
            xf = _raw_rows(draft_proj_ptr, f_ptr, drow, trow, is_d, is_t, offs_k, 2 * K + V, K, ROW)
            xb = (mt.load(draft_beta_ptr + drow, mask=is_d, other=0.0).to(mt.float32)
                  + mt.load(beta_ptr + trow, mask=is_t, other=0.0).to(mt.float32))
            valid = rows < n_tok
            # the deferred decay's column scales: D_s = exp(G_s - G_before its run), G the cumulative log decay; runs
            # start at replayed drafts 0, R, 2R, ..., at the bonus token (s = n) and at new drafts 1, 1 + R, ...
            g = mt.where(valid[:, None], _log_decay(xf, dt_bias[None, :], a_coef, lower_bound), 0.0)
            cum = mt.cumsum(g, axis=0)
            run_start = ((is_d & (rows % renorm_every == 0)) | (rows == n_replay)
                         | ((rows > n_replay) & ((rows - n_replay - 1) % renorm_every == 0)))
            base = mt.cummin(mt.where(run_start[:, None], cum - g, 3.0e38), axis=0)  # cum decreases: the latest start
            D = mt.exp(cum - base)
            E = mt.exp(base - cum)
            mt.barrier()  # the sequence area, written in other threads' layouts
            kk = _conv_rows(seq, rows, K, offs_k, conv_w_ptr + ch_k * 4, RAW)
            kh = kk * mt.rsqrt(mt.sum(kk * kk, axis=1) + QK_NORM_EPS)[:, None]
            qq = _conv_rows(seq, rows, 0, offs_k, conv_w_ptr + ch_q * 4, RAW)
            qh = qq * (mt.rsqrt(mt.sum(qq * qq, axis=1) + QK_NORM_EPS) * scale)[:, None]
            vv = _conv_rows(seq, rows, 2 * K, offs_v, conv_w_ptr + ch_v * 4, RAW)
            srows = scr + rows[:, None] * ROW_S
            mask_k = valid[:, None] & (offs_k[None, :] >= 0)
            mt.store(srows + offs_k[None, :], D, mask=mask_k)
            mt.store(srows + K + offs_k[None, :], D * kh, mask=mask_k)
            mt.store(srows + 2 * K + offs_k[None, :], E * kh, mask=mask_k)
            mt.store(srows + 3 * K + offs_k[None, :], D * qh, mask=mask_k)
            mt.store(srows + 4 * K + offs_v[None, :], vv, mask=valid[:, None] & (offs_v[None, :] >= 0))
            mt.store(scr + rows * ROW_S + 4 * K + 2 * V, _sigmoid(xb), mask=valid)
            mt.store(scr + rows * ROW_S + 4 * K + 2 * V + 1, mt.sum(kh * qh, axis=1), mask=valid)

            # 2. the scratch rows are read by other threads below; and every thread's loads of the conv window and of
            #    the replayed draft rows are done before anyone overwrites them (see "In-place safety")
            mt.barrier()
            # the committed conv window: the raw inputs of positions n - 2, n - 1 and n (the bonus token)
            for i in mt.static_range(3):
                src = seq + (n_replay + 1 + i) * RAW
                mt.store(conv_base + i * C + ch_q, mt.load(src + offs_k))
                mt.store(conv_base + i * C + ch_k, mt.load(src + K + offs_k))
                mt.store(conv_base + i * C + ch_v, mt.load(src + 2 * K + offs_v))
            # this step's drafts t = 1..T-1, raw, for the next step's replay
            tt = mt.arange(0, TN)
            new_draft = (tt >= 1) & (tt < T)
            tok_rows = (b * T + mt.minimum(tt, T - 1)) * H + h
            draft_rows = draft_proj_ptr + ((slot64 * MAX_DRAFTS + mt.maximum(tt - 1, 0)) * H + h)[:, None] * ROW
            mk = new_draft[:, None] & (offs_k[None, :] >= 0)
            mt.store(draft_rows + offs_k[None, :], mt.load(q_ptr + tok_rows[:, None] * K + offs_k[None, :], mask=mk),
                     mask=mk)
            mt.store(draft_rows + K + offs_k[None, :], mt.load(k_ptr + tok_rows[:, None] * K + offs_k[None, :],
                                                               mask=mk), mask=mk)
            mv = new_draft[:, None] & (offs_v[None, :] >= 0)
            mt.store(draft_rows + 2 * K + offs_v[None, :], mt.load(v_ptr + tok_rows[:, None] * V + offs_v[None, :],
                                                                   mask=mv), mask=mv)
            mt.store(draft_rows + 2 * K + V + offs_k[None, :], mt.load(f_ptr + tok_rows[:, None] * K + offs_k[None, :],
                                                                       mask=mk), mask=mk)
            mt.store(draft_beta_ptr + (slot64 * MAX_DRAFTS + mt.maximum(tt - 1, 0)) * H + h,
                     mt.load(beta_ptr + tok_rows, mask=new_draft), mask=new_draft)

            # 3. the state, chunk by chunk: a chunk is loaded and stored by the same threads (same tile layout)
            for c in range(0, NC):
                S = S_next
                S_next = mt.load(state_base + mt.minimum(c + 1, NC - 1) * (VC * K) + chunk_offs)
                v0 = c * VC
                for j0 in range(0, n_replay, renorm_every):
                    j1 = mt.minimum(j0 + renorm_every, n_replay)
                    for j in range(j0, j1):
                        S = _scratch_replay(S, scr + j * ROW_S, v0, offs_vc, col_offs, K, V)
                    S = S * mt.load(scr + (j1 - 1) * ROW_S + col_offs)  # fold the run's D into the state
                bonus_row = scr + n_replay * ROW_S
                S = _scratch_new_token(S, bonus_row, v0, offs_vc, col_offs, K, V) * mt.load(bonus_row + col_offs)
                mt.store(state_base + c * (VC * K) + chunk_offs, S)  # the state after the bonus token
                for t0 in range(1, T, renorm_every):
                    t1 = mt.minimum(t0 + renorm_every, T)
                    for t in range(t0, t1):
                        S = _scratch_new_token(S, scr + (n_replay + t) * ROW_S, v0, offs_vc, col_offs, K, V)
                    # fold the run's D in before the next run (unconditionally: a runtime `if` that yields the
                    # chunk costs more register moves than the fold after the last run, whose state is dropped)
                    S = S * mt.load(scr + (n_replay + t1 - 1) * ROW_S + col_offs)

            # 4. the output norm over all V rows, which other threads wrote: every new token at once, [TN, V]
            mt.barrier()
            new_tok = tt < T
            mo = new_tok[:, None] & (offs_v[None, :] >= 0)
            toks = ((b * T + mt.minimum(tt, T - 1)) * H + h)[:, None] * V + offs_v[None, :]
            o = mt.load(scr + (n_replay + mt.minimum(tt, T - 1))[:, None] * ROW_S + 4 * K + V + offs_v[None, :],
                        mask=mo, other=0.0)
            gate = mt.load(gate_ptr + toks, mask=mo, other=0.0).to(mt.float32)
            inv_rms = mt.rsqrt(mt.sum(o * o, axis=1) / V + norm_eps)
            mt.store(o_ptr + toks, o * inv_rms[:, None] * norm_w[None, :] * _sigmoid(gate), mask=mo)
            mt.barrier()  # the next item's prologue overwrites the scratch rows read above


# The same kernels under other register caps, for A/B runs (tools/kda_decode_ab.py): the general kernel uncapped
# (ptxas takes 176-201 registers: one program per SM at 8 warps); the T = 1 kernel at 4 warps with 4 programs per
# SM (128 registers, the same 16 warps per SM as 2 x 8).
kda_decode_step_kernel_uncapped = mt.kernel(kda_decode_step_kernel.fn)
kda_decode_t1_kernel_4w = mt.kernel(min_blocks_per_sm=4)(kda_decode_t1_kernel.fn)



# ------------------------------------------------------------------------------------------- chunked (WY) step


@mt.func
def _raw_at(pos, n_replay, T, conv_base, ch, draft_proj_ptr, draft0, src_ptr, tok0, H, offs, C: mt.constexpr,
            DRAFT_COL: mt.constexpr, WIDTH: mt.constexpr, ROW: mt.constexpr, RW: mt.constexpr = 0):
    """[R, WIDTH] raw inputs (fp32) of one projection at sequence positions `pos` [R]: the committed conv window at
    -3..-1 (its channels `ch`), replayed draft j at j < n_replay (draft cache column DRAFT_COL on), this step's
    token t at n_replay + t (`src_ptr`, rows of WIDTH); 0 past the step's last token. RW > 0: loaded a row per
    warp (RW warps), which the chunk's token math then runs in (no copies in several warps)."""
    full = offs[None, :] >= 0
    t = pos - n_replay
    in_w = (pos < 0)[:, None] & full
    in_d = ((pos >= 0) & (pos < n_replay))[:, None] & full
    in_t = ((t >= 0) & (t < T))[:, None] & full
    at_w = conv_base + (mt.maximum(pos, -3) + 3)[:, None] * C + ch[None, :]
    at_d = draft_proj_ptr + (draft0 + mt.maximum(pos, 0) * H)[:, None] * ROW + DRAFT_COL + offs[None, :]
    at_t = src_ptr + (tok0 + mt.maximum(t, 0) * H)[:, None] * WIDTH + offs[None, :]
    if RW:  # one load from whichever source holds the row (a row is one warp's: the select is uniform in it)
        at = mt.where(in_w, at_w, mt.where(in_d, at_d, at_t))
        x = mt.load(at, mask=in_w | in_d | in_t, other=0.0, layout=mt.blocked([1, 4], [1, 32], [RW, 1], [1, 0]))
        return x.to(mt.float32)
    else:
        xw = mt.load(at_w, mask=in_w, other=0.0)
        xd = mt.load(at_d, mask=in_d, other=0.0)
        xt = mt.load(at_t, mask=in_t, other=0.0)
    return xw.to(mt.float32) + xd.to(mt.float32) + xt.to(mt.float32)


@mt.func
def _conv_at(pos, n_replay, T, conv_base, ch, draft_proj_ptr, draft0, src_ptr, tok0, H, offs, taps_ptr,
             C: mt.constexpr, DRAFT_COL: mt.constexpr, WIDTH: mt.constexpr, ROW: mt.constexpr, RW: mt.constexpr = 0):
    """Conv + SiLU at positions `pos`: taps 0..3 on the raw inputs of pos - 3 .. pos (`_raw_at`)."""
    w0, w1, w2, w3 = _load_taps(taps_ptr)
    y = (w0[None, :] * _raw_at(pos - 3, n_replay, T, conv_base, ch, draft_proj_ptr, draft0, src_ptr, tok0, H, offs,
                               C, DRAFT_COL, WIDTH, ROW, RW)
         + w1[None, :] * _raw_at(pos - 2, n_replay, T, conv_base, ch, draft_proj_ptr, draft0, src_ptr, tok0, H, offs,
                                 C, DRAFT_COL, WIDTH, ROW, RW)
         + w2[None, :] * _raw_at(pos - 1, n_replay, T, conv_base, ch, draft_proj_ptr, draft0, src_ptr, tok0, H, offs,
                                 C, DRAFT_COL, WIDTH, ROW, RW)
         + w3[None, :] * _raw_at(pos, n_replay, T, conv_base, ch, draft_proj_ptr, draft0, src_ptr, tok0, H, offs,
                                 C, DRAFT_COL, WIDTH, ROW, RW))
    return y * _sigmoid(y)


@mt.func
def _token_tile(pos, valid, n_replay, T, conv_base, draft_proj_ptr, draft_beta_ptr, draft0, q_ptr, k_ptr, v_ptr,
                f_ptr, beta_ptr, tok0, H, offs_k, offs_v, ch_q, ch_k, ch_v, conv_w_ptr, dt_bias, a_coef, scale,
                lower_bound, C: mt.constexpr, K: mt.constexpr, V: mt.constexpr, ROW: mt.constexpr, RW: mt.constexpr = 0):
    """The state-independent vectors of the tokens at `pos` [R] (rows where `valid`): q^ (L2-normalized, scaled),
    k^ (L2-normalized), v (conv + SiLU), the log-decay g (0 on invalid rows) and beta (0 on invalid rows)."""
    qq = _conv_at(pos, n_replay, T, conv_base, ch_q, draft_proj_ptr, draft0, q_ptr, tok0, H, offs_k,
                  conv_w_ptr + ch_q * 4, C, 0, K, ROW, RW)
    kk = _conv_at(pos, n_replay, T, conv_base, ch_k, draft_proj_ptr, draft0, k_ptr, tok0, H, offs_k,
                  conv_w_ptr + ch_k * 4, C, K, K, ROW, RW)
    vv = _conv_at(pos, n_replay, T, conv_base, ch_v, draft_proj_ptr, draft0, v_ptr, tok0, H, offs_v,
                  conv_w_ptr + ch_v * 4, C, 2 * K, V, ROW, RW)
    f = _raw_at(pos, n_replay, T, conv_base, ch_k, draft_proj_ptr, draft0, f_ptr, tok0, H, offs_k, C, 2 * K + V, K,
                ROW, RW)
    t = pos - n_replay
    raw_b = (mt.load(draft_beta_ptr + draft0 + mt.maximum(pos, 0) * H, mask=(pos >= 0) & (pos < n_replay),
                     other=0.0).to(mt.float32)
             + mt.load(beta_ptr + tok0 + mt.maximum(t, 0) * H, mask=(t >= 0) & (t < T), other=0.0).to(mt.float32))
    qh = qq * (mt.rsqrt(mt.sum(qq * qq, axis=1) + QK_NORM_EPS) * scale)[:, None]
    kh = kk * mt.rsqrt(mt.sum(kk * kk, axis=1) + QK_NORM_EPS)[:, None]
    g = mt.where(valid[:, None], _log_decay(f, dt_bias[None, :], a_coef, lower_bound), 0.0)
    return qh, kh, vv, g, mt.where(valid, _sigmoid(raw_b), 0.0)


@mt.func
def _chunk_solve(kh, g, beta, valid, DOUBLINGS: mt.constexpr):
    """The WY pieces of one chunk (kda_chunked_reference): (k^ e^Gamma, k^ e^-Gamma, (I + diag(beta) tril(A,-1))^-1,
    Gamma_last). |Gamma| <= rows * |lower_bound| <= CHUNK_MAX_LOG_DECAY (the host checks), so e^-Gamma stays in
    fp32's range."""
    cum = mt.cumsum(g, axis=0)
    kp = kh * mt.exp(cum)
    km = kh * mt.exp(-cum)
    rr = mt.arange(0, kh.shape[0])
    lower = (rr[:, None] > rr[None, :]) & valid[:, None] & valid[None, :]
    amat = mt.where(lower, mt.dot(kp, mt.trans(km)), 0.0)
    eye = (rr[:, None] == rr[None, :]).to(mt.float32)
    n_mat = -(beta[:, None] * amat)  # (I - N)^-1 = (I + diag(beta) tril(A, -1))^-1
    power = n_mat
    inv = eye + n_mat
    for _ in mt.static_range(DOUBLINGS):  # N^R = 0 for R rows: (I + N)(I + N^2)...(I + N^(R/2)), log2(R) - 1 steps
        power = mt.dot(power, power)
        inv = inv + mt.dot(inv, power)
    return kp, km, inv, mt.sum(g, axis=0)


@mt.func
def _chunk_deltas_t(S, kp, vv, beta, tinv, PRECISION: mt.constexpr):
    """D^T [V, R]: the chunk's deltas from the state S [V, K] it starts from."""
    rhs = (mt.trans(vv) - mt.dot(S, mt.trans(kp), input_precision=PRECISION)) * beta[None, :]
    return mt.dot(rhs, mt.trans(tinv), input_precision=PRECISION)


@mt.func
def _replay_update(S, kp_r, vv_r, beta_r, tinv_r, decay_r, kend_r, PRECISION: mt.constexpr):
    """The state [VH, K] after the replayed chunk: decayed, plus the rank-R update of its deltas."""
    return S * decay_r[None, :] + mt.dot(_chunk_deltas_t(S, kp_r, vv_r, beta_r, tinv_r, PRECISION), kend_r,
                                         input_precision=PRECISION)


@mt.func
def _state_half(S, kp_r, vv_r, beta_r, tinv_r, decay_r, kend_r, kp, vv, beta, tinv, qp, bmat_t, first_decay,
                k_first, PRECISION: mt.constexpr):
    """Rows of the state [VH, K] through the step: the replay chunk, then the new-token chunk's outputs [VH, TN]
    and the committed rows (after the first new token). Every row of the state evolves on its own. With the
    state in the mma accumulator's layout and PRECISION "tf32x3" every product here is on tensor cores, S and
    the products derived from it their A operands by register renaming (mma_layouts.py, kPairs)."""
    S = _replay_update(S, kp_r, vv_r, beta_r, tinv_r, decay_r, kend_r, PRECISION)
    d_t = _chunk_deltas_t(S, kp, vv, beta, tinv, PRECISION)
    o_t = mt.dot(S, mt.trans(qp), input_precision=PRECISION) + mt.dot(d_t, bmat_t, input_precision=PRECISION)
    return o_t, S * first_decay[None, :] + _row0(mt.trans(d_t))[:, None] * k_first[None, :]


@mt.func
def _state_whole(S, kp_r, vv_r, beta_r, tinv_r, decay_r, kend_r, kp, vv, beta, tinv, qp, bmat_t, first_decay,
                 k_first, PRECISION: mt.constexpr):
    """_state_half for the whole state on tensor cores: the new chunk's two products with the state, S k^T and
    S q^T, as one [V, K] x [K, 2 TN] product (the state's A fragments split into tf32 parts once, not twice)."""
    S = _replay_update(S, kp_r, vv_r, beta_r, tinv_r, decay_r, kend_r, PRECISION)
    tn = kp.shape[0]
    both = mt.dot(S, mt.trans(mt.cat([kp, qp], 0)), input_precision=PRECISION)
    rhs = (mt.trans(vv) - both[:, 0:tn]) * beta[None, :]
    d_t = mt.dot(rhs, mt.trans(tinv), input_precision=PRECISION)
    o_t = both[:, tn:2 * tn] + mt.dot(d_t, bmat_t, input_precision=PRECISION)
    d_first = mt.sum(mt.where((mt.arange(0, tn) == 0)[None, :], d_t, 0.0), axis=1)  # column 0, in d_t's own layout
    return o_t, S * first_decay[None, :] + d_first[:, None] * k_first[None, :]


@mt.func
def _row0(x):
    """Row 0 of a [R, W] tile, as [W]."""
    rr = mt.arange(0, x.shape[0])
    return mt.sum(mt.where((rr == 0)[:, None], x, 0.0), axis=0)


@mt.kernel(min_blocks_per_sm=1)
def kda_decode_chunked_kernel(
        q_ptr, k_ptr, v_ptr, f_ptr, beta_ptr, gate_ptr, o_ptr,
        state_ptr, conv_state_ptr, draft_proj_ptr, draft_beta_ptr, state_idx_ptr, num_accepted_ptr,
        conv_w_ptr, a_log_ptr, dt_bias_ptr, o_norm_w_ptr,
        scale, lower_bound, norm_eps, renorm_every,
        H: mt.constexpr, K: mt.constexpr, V: mt.constexpr, NUM_DRAFTS: mt.constexpr, MAX_DRAFTS: mt.constexpr,
        TR: mt.constexpr, TN: mt.constexpr, WHOLE: mt.constexpr = False, WARPS: mt.constexpr = 8,
        PRECISION: mt.constexpr = "ieee", DR: mt.constexpr = 3, DN: mt.constexpr = 3):
    """The step for T > 1 in chunked (WY) form (variant `chunked`; the algebra and its float64 statement:
    kda_chunked_reference.py). Program (h, b): the replayed drafts as one chunk of TR rows, then the T new tokens as
    one chunk of TN rows, each: the tokens' vectors as [R, K] tiles (conv straight from the window, draft cache
    and inputs), A = (k^ e^G)(k^ e^-G)^T, the unit-lower inverse by doubling, then against the [V, K] state
    D^T = (v - S k^)^T beta T^-T, the outputs S q^ + D^T tril(B)^T and the rank-R update. The state is read once
    and written once (after the first new token), in two halves of V / 2 rows (every row evolves on its own; half
    the registers: 24 B of spills at K3 instead of 356); no per-token pass over it. renorm_every is unused (the
    chunk form needs no deferred decay).

    WHOLE (variant `chunked_tc`): the whole [V, K] state at once, loaded and stored in the blocked layout of an
    mma.sync accumulator on WARPS warps ([WARPS, 1]), with PRECISION "tf32x3": the state products run on tensor
    cores, the state is their A operand and their accumulator in place (no shared memory for it), TR, TN >= 8."""
    h = mt.program_id(0)
    b = mt.program_id(1)
    T = NUM_DRAFTS + 1
    C = 2 * H * K + H * V
    ROW = 3 * K + V
    slot = mt.load(state_idx_ptr + b)
    if slot >= 0:
        slot64 = slot.to(mt.int64)
        n_replay = _replay_count(num_accepted_ptr, b, MAX_DRAFTS)
        offs_k, offs_v, ch_q, ch_k, ch_v = _head_channels(h, H, K, V)
        dt_bias = mt.load(dt_bias_ptr + h * K + offs_k)
        a_coef = mt.exp(mt.load(a_log_ptr + h))
        conv_base = conv_state_ptr + slot64 * (3 * C)
        draft0 = (slot64 * MAX_DRAFTS) * H + h
        tok0 = (b * T) * H + h
        # the state in two halves of V / 2 rows, one after the other (the chunk algebra is per row of the state)
        head_at = state_ptr + (slot64 * H + h) * (V * K)
        half_at = head_at + mt.arange(0, V // 2)[:, None] * K + offs_k[None, :]

        # the replayed drafts: positions 0 .. n_replay - 1
        pos_r = mt.arange(0, TR)
        ok_r = pos_r < n_replay
        _, kh, vv, g, beta = _token_tile(pos_r, ok_r, n_replay, T, conv_base, draft_proj_ptr, draft_beta_ptr, draft0,
                                         q_ptr, k_ptr, v_ptr, f_ptr, beta_ptr, tok0, H, offs_k, offs_v, ch_q, ch_k,
                                         ch_v, conv_w_ptr, dt_bias, a_coef, scale, lower_bound, C, K, V, ROW,
                                         WARPS if WHOLE else 0)
        kp_r, km_r, tinv_r, last = _chunk_solve(kh, g, beta, ok_r, DR)
        decay_r = mt.exp(last)
        kend_r = km_r * decay_r[None, :]
        vv_r, beta_r = vv, beta

        # the new tokens: positions n_replay .. n_replay + T - 1
        tt = mt.arange(0, TN)
        ok_n = tt < T
        qh, kh, vv, g, beta = _token_tile(n_replay + tt, ok_n, n_replay, T, conv_base, draft_proj_ptr, draft_beta_ptr,
                                          draft0, q_ptr, k_ptr, v_ptr, f_ptr, beta_ptr, tok0, H, offs_k, offs_v,
                                          ch_q, ch_k, ch_v, conv_w_ptr, dt_bias, a_coef, scale, lower_bound, C, K, V,
                                          ROW, WARPS if WHOLE else 0)
        kp, km, tinv, last = _chunk_solve(kh, g, beta, ok_n, DN)
        qp = qh * mt.exp(mt.cumsum(g, axis=0))
        upper = (tt[:, None] >= tt[None, :]) & ok_n[:, None] & ok_n[None, :]
        bmat_t = mt.trans(mt.where(upper, mt.dot(qp, mt.trans(km)), 0.0))
        first_decay = mt.exp(_row0(g))
        k_first = _row0(kh)
        acc_layout = mt.blocked([1, 2], [8, 4], [WARPS, 1], [1, 0])
        if WHOLE:
            state_at = head_at + mt.arange(0, V)[:, None] * K + offs_k[None, :]
            o_t, com = _state_whole(mt.load(state_at, layout=acc_layout), kp_r, vv_r, beta_r, tinv_r, decay_r,
                                    kend_r, kp, vv, beta, tinv, qp, bmat_t, first_decay, k_first, PRECISION)
        else:
            o_lo, com_lo = _state_half(mt.load(half_at), kp_r, vv_r[:, 0:V // 2], beta_r, tinv_r, decay_r, kend_r,
                                       kp, vv[:, 0:V // 2], beta, tinv, qp, bmat_t, first_decay, k_first, PRECISION)
            mt.barrier()  # every thread has loaded its rows of the low half: they may be overwritten
            mt.store(half_at, com_lo)
            o_hi, com_hi = _state_half(mt.load(half_at + (V // 2) * K), kp_r, vv_r[:, V // 2:V], beta_r, tinv_r,
                                       decay_r, kend_r, kp, vv[:, V // 2:V], beta, tinv, qp, bmat_t, first_decay,
                                       k_first, PRECISION)
            o_t = mt.cat([o_lo, o_hi], 0)  # [V, TN]: o of token t in column t

        # gated RMSNorm per token (columns), then o [B, T, H, V]
        o_at = (tok0 + tt * H)[None, :] * V + offs_v[:, None]
        o_ok = ok_n[None, :] & (offs_v[:, None] >= 0)
        gate = mt.load(gate_ptr + o_at, mask=o_ok, other=0.0).to(mt.float32)
        norm_w = mt.load(o_norm_w_ptr + offs_v)
        rms = mt.rsqrt(mt.sum(o_t * o_t, axis=0) / V + norm_eps)
        mt.store(o_ptr + o_at, o_t * rms[None, :] * norm_w[:, None] * _sigmoid(gate), mask=o_ok)

        # the committed conv window (positions n_replay - 2 .. n_replay), read before anyone overwrites the window
        w3 = mt.arange(0, 4)
        win_pos = n_replay - 2 + w3
        win_q = _raw_at(win_pos, n_replay, T, conv_base, ch_q, draft_proj_ptr, draft0, q_ptr, tok0, H, offs_k, C, 0,
                        K, ROW)
        win_k = _raw_at(win_pos, n_replay, T, conv_base, ch_k, draft_proj_ptr, draft0, k_ptr, tok0, H, offs_k, C, K,
                        K, ROW)
        win_v = _raw_at(win_pos, n_replay, T, conv_base, ch_v, draft_proj_ptr, draft0, v_ptr, tok0, H, offs_v, C,
                        2 * K, V, ROW)
        mt.barrier()  # every thread's reads of the window and the draft rows are done before they are overwritten
        if WHOLE:
            mt.store(state_at, com, layout=acc_layout)
        else:
            mt.store(half_at + (V // 2) * K, com_hi)
        w_ok = w3 < 3
        mt.store(conv_base + w3[:, None] * C + ch_q[None, :], win_q, mask=w_ok[:, None] & (offs_k[None, :] >= 0))
        mt.store(conv_base + w3[:, None] * C + ch_k[None, :], win_k, mask=w_ok[:, None] & (offs_k[None, :] >= 0))
        mt.store(conv_base + w3[:, None] * C + ch_v[None, :], win_v, mask=w_ok[:, None] & (offs_v[None, :] >= 0))
        # this step's drafts t = 1 .. T - 1, raw, for the next step's replay
        new_draft = (tt >= 1) & ok_n
        tok_rows = tok0 + mt.minimum(tt, T - 1) * H
        draft_rows = draft_proj_ptr + (draft0 + mt.maximum(tt - 1, 0) * H)[:, None] * ROW
        mk = new_draft[:, None] & (offs_k[None, :] >= 0)
        mv = new_draft[:, None] & (offs_v[None, :] >= 0)
        mt.store(draft_rows + offs_k[None, :], mt.load(q_ptr + tok_rows[:, None] * K + offs_k[None, :], mask=mk),
                 mask=mk)
        mt.store(draft_rows + K + offs_k[None, :], mt.load(k_ptr + tok_rows[:, None] * K + offs_k[None, :], mask=mk),
                 mask=mk)
        mt.store(draft_rows + 2 * K + offs_v[None, :], mt.load(v_ptr + tok_rows[:, None] * V + offs_v[None, :],
                                                               mask=mv), mask=mv)
        mt.store(draft_rows + 2 * K + V + offs_k[None, :], mt.load(f_ptr + tok_rows[:, None] * K + offs_k[None, :],
                                                                   mask=mk), mask=mk)
        mt.store(draft_beta_ptr + draft0 + mt.maximum(tt - 1, 0) * H, mt.load(beta_ptr + tok_rows, mask=new_draft),
                 mask=new_draft)


kda_decode_chunked_kernel_2cta = mt.kernel(min_blocks_per_sm=2)(kda_decode_chunked_kernel.fn)


# ---------------------------------- T > 1: the whole state in registers, the per-token vectors staged up front


def staged_half_rows(max_drafts: int, tokens: int, head_k_dim: int, num_warps: int) -> int:
    """TH of `kda_decode_staged_kernel`: the prologue's tiles are [2 TH, K], the replayed drafts in rows 0..TH-1 and
    the new tokens in rows TH.. (a power of two holding both), and at least so many rows that a [2 TH, K] fp32
    tile is more than one 16-byte vector per thread: the tiling pass then anchors the prologue's layout at its row
    stores (coalesced). Smaller tiles count as "small" accesses and take the state's layout, replicated over its
    rows' lanes and warps: at K3 with 1 or 3 drafts (TH = 2 / 4) ptxas spilled 5-9 KB (TH = 8: 0.3 KB)."""
    anchor = _pow2_at_least(num_warps * 32 * 4 // (2 * head_k_dim) + 1)
    return max(_pow2_at_least(max(max_drafts, tokens)), anchor)


def staged_row_floats(head_k_dim: int, head_v_dim: int) -> int:
    """fp32 values of one token's scratch row in `kda_decode_staged_kernel`: D | D k^ | E k^ | D q^ (K each), v (V),
    beta, k^.q^ and 2 pads (rows stay 16-byte aligned for the column loads)."""
    return 4 * head_k_dim + head_v_dim + 4


def staged_scratch_floats(head_k_dim: int, head_v_dim: int, max_drafts: int, tokens: int, num_warps: int) -> int:
    """fp32 values of one program's scratch in `kda_decode_staged_kernel`: 2 TH token rows (`staged_row_floats`:
    replayed draft j at row j, new token t at row TH + t), TN rows of V outputs, and the sequence area: 2 TH + 3
    rows of raw q | k | v, the committed conv window first, then position s at row s + 3."""
    th = staged_half_rows(max_drafts, tokens, head_k_dim, num_warps)
    return (2 * th * staged_row_floats(head_k_dim, head_v_dim) + _pow2_at_least(tokens) * head_v_dim
            + (2 * th + 3) * (2 * head_k_dim + head_v_dim))


def staged_one_run(max_drafts: int, tokens: int, lower_bound: float) -> bool:
    """ONE_RUN of `kda_decode_staged_kernel`: each half's deferred-decay run (the replayed drafts; the bonus token
    with the drafts) fits `renorm_period`. Then the prologue needs one cumsum and no cummin, and the token loops no
    folds inside them (K3: -5 gives runs of 8: 7 drafts, 8 new tokens)."""
    return renorm_period(lower_bound) >= max(max_drafts, tokens)


def staged_out_rows(head_v_dim: int, num_warps: int, lanes_k: int) -> int:
    """OR: state rows per thread in `kda_decode_staged_kernel`'s [KJ, V, KL, KV] tile (V over 32 / KL lanes and the
    warps, the rest in registers), at most KL: a new token's outputs are stored from the registers that computed
    them, register c from the row's lane c (`_store_outputs_packed`)."""
    return max(1, min(lanes_k, head_v_dim // ((32 // lanes_k) * num_warps)))


@mt.func
def _raw_gather(pos, valid, n_replay, draft_proj_ptr, draft0, src_ptr, tok0, H, offs, DRAFT_COL: mt.constexpr,
                WIDTH: mt.constexpr, ROW: mt.constexpr):
    """[R, WIDTH] raw inputs (fp32) of one projection at sequence positions `pos` >= 0 ([R]), one load: each row's
    pointer picks its source (replayed draft j at j < n_replay, draft-cache column DRAFT_COL on; this step's token
    t at n_replay + t, rows of WIDTH in `src_ptr`); 0 where not `valid`."""
    t = pos - n_replay
    draft = draft_proj_ptr + ((draft0 + mt.minimum(pos, n_replay) * H) * ROW + DRAFT_COL)
    token = src_ptr + (tok0 + mt.maximum(t, 0) * H) * WIDTH
    row = mt.where(t < 0, draft, token)
    return mt.load(row[:, None] + offs[None, :], mask=valid[:, None] & (offs[None, :] >= 0), other=0.0).to(mt.float32)


@mt.func
def _stage_raw(seq, pos, valid, w4, n_replay, conv_base, ch0, draft_proj_ptr, draft0, src_ptr, tok0, H, offs,
               col: mt.constexpr, C: mt.constexpr, DRAFT_COL: mt.constexpr, WIDTH: mt.constexpr, ROW: mt.constexpr,
               RAW: mt.constexpr):
    """One projection's raw inputs (fp32) to the scratch's sequence area at column `col`: the committed conv
    window (its first channel `ch0`) at rows 0..2, valid position s at row s + 3 (the other rows of the token tile
    would collide with valid ones: not stored)."""
    in_win = (w4 < 3)[:, None] & (offs[None, :] >= 0)
    win = mt.load(conv_base + w4[:, None] * C + ch0 + offs[None, :], mask=in_win, other=0.0)
    mt.store(seq + w4[:, None] * RAW + col + offs[None, :], win.to(mt.float32), mask=in_win)
    mt.store(seq + (pos + 3)[:, None] * RAW + col + offs[None, :],
             _raw_gather(pos, valid, n_replay, draft_proj_ptr, draft0, src_ptr, tok0, H, offs, DRAFT_COL, WIDTH, ROW),
             mask=valid[:, None] & (offs[None, :] >= 0))


@mt.func
def _column(at, cols):
    """A K vector at `at` as the state's K axes [KJ, 1, KL, KV], in the state's layout: `cols` = (the lane's
    offsets [1, 1, KL, 1], the registers' offsets [KJ, 1, 1, KV]), added in that order so that each thread's
    address is one base plus compile-time constants (ptxas folds them into the loads' immediate offsets instead
    of building a 64-bit address per 16-byte vector every token)."""
    lane_cols, reg_cols = cols
    return mt.load(at + lane_cols + reg_cols)


@mt.func
def _kvec(at, cols, offs_k, offs_v, column, COLUMN: mt.constexpr):
    """The K vector at `at` in the state's layout: [KJ, 1, KL, KV] (`_column`), or with COLUMN a [K, V] tile in
    the column layout (a V column of the state per thread), every thread reading the whole vector 16 bytes at a
    time from the same addresses as its neighbours (L1 broadcasts; nothing exchanged between threads)."""
    if COLUMN:
        x = mt.load(at + offs_k[:, None] + offs_v[None, :] * 0, layout=column)
    else:
        x = _column(at, cols)
    return x


@mt.func
def _ksum(x, COLUMN: mt.constexpr):
    """The sum over the state's K axes: `_sum_k`, or with COLUMN a chain inside each thread (axis 0) -> [V]."""
    if COLUMN:
        x = mt.sum(x, axis=0)
    else:
        x = _sum_k(x)
    return x


@mt.func
def _per_row(u, COLUMN: mt.constexpr):
    """A [V] vector broadcast over the state's K axes."""
    if COLUMN:
        u = u[None, :]
    else:
        u = u[None, :, None, None]
    return u


@mt.func
def _staged_replay(S, row, cols, offs_k, offs_v, column, K: mt.constexpr, V: mt.constexpr, COLUMN: mt.constexpr):
    """One replayed token on the whole state S ([KJ, V, KL, KV], or [K, V] with COLUMN; deferred decay: the true
    state is S D_{s-1}), its vectors read from its scratch row `row`: u = beta (v - S (D_s k^));
    S' = S + u (E_s k^)^T under D_s. The columns are small loads that the tiling pass gives the state's layout
    (each thread reads the K values its rows need, replicated over the rows' lanes and warps: L1 hits, no shared
    memory; with COLUMN, `_kvec`'s broadcast loads)."""
    dk = _kvec(row + K, cols, offs_k, offs_v, column, COLUMN)
    v = mt.load(row + 4 * K + offs_v)
    beta = mt.load(row + 4 * K + V)
    u = beta * (v - _ksum(S * dk, COLUMN))
    ek = _kvec(row + 2 * K, cols, offs_k, offs_v, column, COLUMN)
    return S + _per_row(u, COLUMN) * ek


@mt.func
def _store_outputs_packed(o_row, o, o_offs, o_lane, OR: mt.constexpr, VW: mt.constexpr):
    """Store o [V] (in the state's row layout: OR rows per thread, v = c * VW + w in register c, each replicated
    over the row's KL lanes) to o_row + w * OR + c, one lane per row writing: for each register c a [VW, KL] tile
    of the rows of register c broadcast over the lanes (a register selection: o[:, None] has the state's layout
    with a size-1 lanes dim), stored where lane == c. The store's coalesced layout (lanes fastest, one element
    per thread: the address does not grow along the lanes, and grows by OR along w) is that same layout, so
    nothing moves through shared memory. o_offs: w * OR as [VW, KL]; o_lane: the lane index [1, KL]."""
    rows = o[:, None]
    for c in mt.static_range(OR):
        mt.store(o_row + o_offs + c, mt.broadcast_to(rows[c * VW:(c + 1) * VW, :], o_offs.shape),
                 mask=(o_offs >= 0) & (o_lane == c))


@mt.func
def _staged_new_token(S, row, o_row, cols, offs_k, offs_v, o_offs, o_lane, column, K: mt.constexpr,
                      V: mt.constexpr, OR: mt.constexpr, VW: mt.constexpr, COLUMN: mt.constexpr,
                      UPDATE: mt.constexpr = True):
    """One new token: the update of `_staged_replay` plus the un-normalized output o = S_true' q^ =
    S (D_s q^) + u (k^.q^) (q^ carries the scale), stored to the token's output row `o_row`: packed from the row
    layout (`_store_outputs_packed`), or with COLUMN in plain order (each thread writes its own column's value).
    UPDATE=False: the output only (the step's last token, whose state is dropped)."""
    dq = _kvec(row + 3 * K, cols, offs_k, offs_v, column, COLUMN)
    dk = _kvec(row + K, cols, offs_k, offs_v, column, COLUMN)
    v = mt.load(row + 4 * K + offs_v)
    beta = mt.load(row + 4 * K + V)
    kq = mt.load(row + 4 * K + V + 1)
    sq = _ksum(S * dq, COLUMN)
    u = beta * (v - _ksum(S * dk, COLUMN))
    if COLUMN:
        mt.store(o_row + offs_v, sq + u * kq)
    else:
        _store_outputs_packed(o_row, sq + u * kq, o_offs, o_lane, OR, VW)
    if UPDATE:
        S = S + _per_row(u, COLUMN) * _kvec(row + 2 * K, cols, offs_k, offs_v, column, COLUMN)
    return S


@mt.func
def _store_state(state_at, S, column, COLUMN: mt.constexpr):
    """The committed state's store, from the registers that hold it (COLUMN: the column layout, no exchange)."""
    if COLUMN:
        mt.store(state_at, S, layout=column)
    else:
        mt.store(state_at, S)


def staged_prefetch_pointers(prefetch: int, pf_floats: int, half_rows: int, row_floats: int) -> int:
    """NPF of `kda_decode_staged_kernel`: the size of its prefetch pointer tile. PREFETCH 1 / 3 (the item's token
    rows at once) point at every `pf_floats` floats of the 2 TH token rows; PREFETCH 2 (one row per token) at every
    `pf_floats` floats of one row, plus its last float (a row need not start on a line). 0: no prefetch (1)."""
    if prefetch in (1, 3):
        return _pow2_at_least(-(-2 * half_rows * row_floats // pf_floats))
    if prefetch == 2:
        return _pow2_at_least(-(-(row_floats - 1) // pf_floats) + 1)
    return 1


@mt.func
def _seq_row(i, n_replay, TH: mt.constexpr):
    """The scratch row of the i-th token the token loops take: replayed draft i at row i, then new token i - n at
    row TH + i - n."""
    return mt.where(i < n_replay, i, TH + i - n_replay)


@mt.func
def _prefetch_area(scr, pf, n_replay, T, PF: mt.constexpr, RS: mt.constexpr, TH: mt.constexpr,
                   TOUCH: mt.constexpr, num_items):
    """Every line of this item's token rows (replays 0..n-1, or row 0 whose D column the fold reads; new tokens
    TH..TH+T-1) into this SM's L1 at once: `pf` [NPF] counts PF-float steps over the rows. TOUCH (a probe, not a
    design): real loads of one float per step instead, consumed by a store that never runs (num_items < 0 is never
    true, but the compilers cannot know), so they allocate in L1 whatever `prefetch.global.L1` does on the GPU."""
    at = pf * PF
    need = (at < mt.maximum(n_replay, 1) * RS) | ((at < (TH + T) * RS) & (at + PF > TH * RS))
    if TOUCH:
        mt.store(scr + at, mt.load(scr + at, mask=need), mask=need & (num_items < 0))
    else:
        mt.prefetch(scr + at, mask=need)


@mt.func
def _prefetch_span(at, n_floats, NP: mt.constexpr, PF: mt.constexpr, TOUCH: mt.constexpr, num_items,
                   LEVEL: mt.constexpr = "L1"):
    """The n_floats floats from `at` into L1 (or LEVEL), NP pointers PF floats apart (TOUCH: touched by loads, as
    in `_prefetch_area`)."""
    offs = mt.arange(0, NP) * PF
    if TOUCH:
        mt.store(at + offs, mt.load(at + offs, mask=offs < n_floats), mask=(offs < n_floats) & (num_items < 0))
    else:
        mt.prefetch(at + offs, mask=offs < n_floats, level=LEVEL)


@mt.func
def _prefetch_row(scr, i, n_replay, T, pf_offs, pf_ok, RS: mt.constexpr, TH: mt.constexpr):
    """The lines of the row of the token loops' i-th token (`_seq_row`) into L1, when there is such a token:
    pf_offs [NPF] are the row's line steps and its last float, pf_ok which of them exist."""
    mt.prefetch(scr + _seq_row(i, n_replay, TH) * RS + pf_offs, mask=pf_ok & (i < n_replay + T))


@mt.kernel(min_blocks_per_sm=2)
def kda_decode_staged_kernel(
        q_ptr, k_ptr, v_ptr, f_ptr, beta_ptr, gate_ptr, o_ptr,
        state_ptr, conv_state_ptr, draft_proj_ptr, draft_beta_ptr, state_idx_ptr, num_accepted_ptr,
        conv_w_ptr, a_log_ptr, dt_bias_ptr, o_norm_w_ptr,
        scale, lower_bound, norm_eps, renorm_every, scratch_ptr, num_items,
        H: mt.constexpr, K: mt.constexpr, V: mt.constexpr, NUM_DRAFTS: mt.constexpr, MAX_DRAFTS: mt.constexpr,
        KL: mt.constexpr, KV: mt.constexpr, TH: mt.constexpr, TN: mt.constexpr, OR: mt.constexpr,
        ONE_RUN: mt.constexpr, PREFETCH: mt.constexpr = 0, PF: mt.constexpr = 32, NPF: mt.constexpr = 1,
        AHEAD: mt.constexpr = 1, NPS: mt.constexpr = 0, STATE_CACHE: mt.constexpr = "",
        LATE_STATE: mt.constexpr = False, COLUMN: mt.constexpr = False):
    """The step for T > 1 with the whole state in registers and no barrier in the token loops (variant `staged`).
    A persistent grid; each program works through (row, head) items with its own scratch (L2/L1-resident):
      1. the raw q | k | v of every sequence position (the committed window, the replayed drafts, the new tokens)
         to the scratch's sequence area in sequence order, one gather per projection; mt.barrier();
      2. the state-independent vectors of every token at once, as [2 TH, K] tiles (replayed draft j in row j, new
         token t in row TH + t): conv (shifted reads of the sequence area), SiLU, L2 norms, gate, beta, k^.q^ and
         the deferred decay's column scales D, E = 1 / D, one cumsum over each half's rows (its decay run) on the
         [2, TH, K] split (a register rename), stored as one scratch row per token: D | D k^ | E k^ | D q^ | v |
         beta, k^.q^. Then the
         committed conv window and this step's drafts are stored (every thread's loads of them were done before
         the barrier: "In-place safety"); mt.barrier();
      3. the token loop on the [KJ, V, KL, KV] state (loaded at the item's start, in flight during the prologue):
         per token the columns come from the scratch straight in the state's layout, the reductions over K are
         in-thread fmas plus 3 shuffles, and a new token's output goes to the scratch from the registers that
         computed it (`_store_outputs_packed`): no block barrier, no layout conversion. The replayed drafts end
         with S *= D (their run's last D); after the bonus token S D_0 is stored (the only state write);
      4. mt.barrier(), then the gated RMSNorm of all new tokens at once ([TN, V]) -> o.
    Runs of the deferred decay are at most `renorm_every` tokens (D >= e^-40): each half from its row 0 in steps
    of R, folded between runs; with ONE_RUN (each half fits one run, K3's case) the prologue's scan is one cumsum
    and the loops have no folds inside.
    The token rows were written by other threads' stores, which Hopper's L1 does not keep: without help each
    token's first column read waits for L2. PREFETCH (variants staged_pf*, docs/kernels/kda_decode.md): 1, after
    the prologue's last barrier every thread prefetches its share of the item's token-row lines into L1 (one
    pointer every PF floats: 32 = a 128-byte line, 8 = a 32-byte sector; NPF pointers); 2, the first AHEAD rows
    then, and each token the row AHEAD tokens later; 3, a probe: the lines of 1 touched by real loads. 0 (the
    default, variant `staged`): none. The same holds for the sequence area that step 2's conv reads back after
    the first barrier: NPS > 0 prefetches it then (NPS pointers PF floats apart; touched with PREFETCH 3), and
    this head's conv taps at the item's start.
    STATE_CACHE: the state load's cache modifier (".cg": read through L2 only, so the 64 KB of state an item
    reads does not evict the rows from L1). LATE_STATE: the state is prefetched into L2 at the item's start and
    loaded after the prologue, whose loads then have its 64 registers.
    COLUMN (variant staged_col; num_warps = V / 32, not with LATE_STATE or PREFETCH 2): the state is a [K, V] tile
    with a whole V column in each thread (mt.load(layout=...)); the token loops' matvecs over K are chains inside
    the thread and the K vectors are [K, V] broadcast loads (`_kvec`): no shuffle, no exchange
    (tools/column_owner_probe.py: 526 SASS a new token at K3)."""
    pid = mt.program_id(0)
    T = NUM_DRAFTS + 1
    C = 2 * H * K + H * V
    ROW = 3 * K + V
    RS = 4 * K + V + 4  # `staged_row_floats`
    RAW = 2 * K + V  # a sequence-area row: raw q | k | v
    SCR = 2 * TH * RS + TN * V + (2 * TH + 3) * RAW  # `staged_scratch_floats`
    KJ = K // (KL * KV)
    VW = V // OR  # rows of the state covered by one register of every thread
    scr = scratch_ptr + pid.to(mt.int64) * SCR
    o_area = scr + 2 * TH * RS
    seq = o_area + TN * V
    offs_k = mt.arange(0, K)
    offs_v = mt.arange(0, V)
    # a K vector as the state's K axes [KJ, 1, KL, KV] (k = (j * KL + l) * KV + v), split into the lane's part and
    # the registers' part (compile-time constants) for the column loads (`_column`), and the state's offsets
    lane_cols = (mt.arange(0, KL) * KV)[None, None, :, None]
    reg_cols = (mt.arange(0, KJ)[:, None] * (KL * KV) + mt.arange(0, KV)[None, :])[:, None, None, :]
    cols = (lane_cols, reg_cols)
    state_offs = offs_v[None, :, None, None] * K + lane_cols + reg_cols
    column = mt.blocked([K, 1], [1, 32], [1, V // 32], [0, 1])  # COLUMN: a V column of the state per thread
    if COLUMN:
        state_offs = offs_k[:, None] + offs_v[None, :] * K
    o_lane = mt.arange(0, KL)[None, :]
    o_offs = mt.arange(0, VW)[:, None] * OR + o_lane * 0
    norm_w = mt.load(o_norm_w_ptr + offs_v)
    rr = mt.arange(0, 2 * TH)  # token rows: replayed draft j at row j, new token t at row TH + t
    hrow = mt.arange(0, TH)[None, :]  # a token row within its half (the halves' decay runs)
    w4 = mt.arange(0, 4)
    tt = mt.arange(0, TN)
    pf = mt.arange(0, NPF)
    pf_offs = mt.minimum(pf * PF, RS - 1)  # PREFETCH 2: a row's line steps, then its last float
    pf_ok = pf * PF < RS - 1 + PF
    for item in range(pid, num_items, mt.num_programs(0)):
        h = item % H
        b = item // H
        slot = mt.load(state_idx_ptr + b)
        if slot >= 0:  # -1: a padding row, nothing read or written
            slot64 = slot.to(mt.int64)
            n_replay = _replay_count(num_accepted_ptr, b, MAX_DRAFTS)
            _, _, ch_q, ch_k, ch_v = _head_channels(h, H, K, V)
            state_at = state_ptr + (slot64 * H + h) * (V * K) + state_offs
            if LATE_STATE:  # into L2 now (one pointer a line), into registers after the prologue (which then has
                # the state's 64 registers for its own loads)
                _prefetch_span(state_ptr + (slot64 * H + h) * (V * K), V * K, V * K // 32, 32, False, num_items,
                               "L2")
                S = mt.zeros(state_at.shape, mt.float32)
            elif COLUMN:
                S = mt.load(state_at, cache_modifier=STATE_CACHE, layout=column)
            else:
                S = mt.load(state_at, cache_modifier=STATE_CACHE)  # the committed state, in flight in the prologue
            dt_bias = mt.load(dt_bias_ptr + h * K + offs_k)
            a_coef = mt.exp(mt.load(a_log_ptr + h))
            conv_base = conv_state_ptr + slot64 * (3 * C)
            draft0 = (slot64 * MAX_DRAFTS) * H + h
            tok0 = (b * T) * H + h
            if NPS > 0:  # this head's conv taps, read after the first barrier (where no load can be hoisted)
                _prefetch_span(conv_w_ptr + h * K * 4, 4 * K, 4 * K // PF, PF, PREFETCH == 3, num_items)
                _prefetch_span(conv_w_ptr + (H + h) * K * 4, 4 * K, 4 * K // PF, PF, PREFETCH == 3, num_items)
                _prefetch_span(conv_w_ptr + (2 * H * K + h * V) * 4, 4 * V, 4 * V // PF, PF, PREFETCH == 3,
                               num_items)

            # 1. raw inputs to the sequence area (row r = position r - 3)
            pos = mt.where(rr < TH, rr, n_replay + rr - TH)  # [2 TH] the token rows' sequence positions
            valid = mt.where(rr < TH, rr < n_replay, rr - TH < T)
            _stage_raw(seq, pos, valid, w4, n_replay, conv_base, h * K, draft_proj_ptr, draft0, q_ptr, tok0, H,
                       offs_k, 0, C, 0, K, ROW, RAW)
            _stage_raw(seq, pos, valid, w4, n_replay, conv_base, (H + h) * K, draft_proj_ptr, draft0, k_ptr, tok0,
                       H, offs_k, K, C, K, K, ROW, RAW)
            _stage_raw(seq, pos, valid, w4, n_replay, conv_base, 2 * H * K + h * V, draft_proj_ptr, draft0, v_ptr,
                       tok0, H, offs_v, 2 * K, C, 2 * K, V, ROW, RAW)
            f = _raw_gather(pos, valid, n_replay, draft_proj_ptr, draft0, f_ptr, tok0, H, offs_k, 2 * K + V, K, ROW)
            t_pos = pos - n_replay
            beta_at = mt.where(t_pos < 0, draft_beta_ptr + (draft0 + mt.minimum(pos, n_replay) * H),
                               beta_ptr + (tok0 + mt.maximum(t_pos, 0) * H))
            beta = _sigmoid(mt.load(beta_at, mask=valid, other=0.0).to(mt.float32))
            # the sequence area was written in other threads' layouts; and every thread's loads of the conv window
            # and of the replayed draft rows are done before they are overwritten below ("In-place safety")
            mt.barrier()
            if NPS > 0:  # the conv's shifted reads below come back to it four times per projection
                _prefetch_span(seq, (2 * TH + 3) * RAW, NPS, PF, PREFETCH == 3, num_items)

            # 2. every token's state-independent vectors, to its scratch row (in an order that keeps few tiles live
            #    next to the state, which is in flight)
            mt.store(scr + rr[:, None] * RS + 4 * K + offs_v[None, :],
                     _conv_rows(seq, pos, 2 * K, offs_v, conv_w_ptr + ch_v * 4, RAW))
            mt.store(scr + rr * RS + 4 * K + V, beta)
            kk = _conv_rows(seq, pos, K, offs_k, conv_w_ptr + ch_k * 4, RAW)
            kh = kk * mt.rsqrt(mt.sum(kk * kk, axis=1) + QK_NORM_EPS)[:, None]
            qq = _conv_rows(seq, pos, 0, offs_k, conv_w_ptr + ch_q * 4, RAW)
            qh = qq * (mt.rsqrt(mt.sum(qq * qq, axis=1) + QK_NORM_EPS) * scale)[:, None]
            mt.store(scr + rr * RS + 4 * K + V + 1, mt.sum(kh * qh, axis=1))
            g = mt.where(valid[:, None], _log_decay(f, dt_bias[None, :], a_coef, lower_bound), 0.0)
            # the deferred decay's log column scale of each token: its cumulative log-decay since its run began
            # (runs: each half from its row 0, in steps of R). The halves split off as [2, TH, K] (a register
            # rename: a thread's two rows are the two halves), so one scan over axis 1 covers both runs.
            g = g.reshape((2, TH, K))
            if ONE_RUN:
                log_d = mt.cumsum(g, axis=1)
            else:
                cum = mt.cumsum(g, axis=1)
                run_start = (hrow % renorm_every == 0)[:, :, None]
                log_d = cum - mt.cummin(mt.where(run_start, cum - g, 3.0e38), axis=1)  # cum decreases: the latest
            D = mt.exp(log_d)
            E = mt.exp(-log_d)
            kh3 = kh.reshape((2, TH, K))
            trow = scr + rr.reshape((2, TH))[:, :, None] * RS + offs_k[None, None, :]
            mt.store(trow, D)
            mt.store(trow + K, D * kh3)
            mt.store(trow + 2 * K, E * kh3)
            mt.store(trow + 3 * K, D * qh.reshape((2, TH, K)))
            # the committed conv window after this step: the raw inputs of positions n - 2 .. n (rows n + 1 ..)
            w_ok = w4 < 3
            win = seq + (n_replay + 1 + w4)[:, None] * RAW
            mk3 = w_ok[:, None] & (offs_k[None, :] >= 0)
            mt.store(conv_base + w4[:, None] * C + ch_q[None, :], mt.load(win + offs_k[None, :], mask=mk3), mask=mk3)
            mt.store(conv_base + w4[:, None] * C + ch_k[None, :], mt.load(win + K + offs_k[None, :], mask=mk3),
                     mask=mk3)
            mv3 = w_ok[:, None] & (offs_v[None, :] >= 0)
            mt.store(conv_base + w4[:, None] * C + ch_v[None, :], mt.load(win + 2 * K + offs_v[None, :], mask=mv3),
                     mask=mv3)
            # this step's drafts t = 1..T-1, raw, for the next step's replay
            new_draft = (tt >= 1) & (tt < T)
            tok_rows = tok0 + mt.minimum(tt, T - 1) * H
            draft_rows = draft_proj_ptr + (draft0 + mt.maximum(tt - 1, 0) * H)[:, None] * ROW
            mk = new_draft[:, None] & (offs_k[None, :] >= 0)
            mv = new_draft[:, None] & (offs_v[None, :] >= 0)
            mt.store(draft_rows + offs_k[None, :], mt.load(q_ptr + tok_rows[:, None] * K + offs_k[None, :], mask=mk),
                     mask=mk)
            mt.store(draft_rows + K + offs_k[None, :],
                     mt.load(k_ptr + tok_rows[:, None] * K + offs_k[None, :], mask=mk), mask=mk)
            mt.store(draft_rows + 2 * K + offs_v[None, :],
                     mt.load(v_ptr + tok_rows[:, None] * V + offs_v[None, :], mask=mv), mask=mv)
            mt.store(draft_rows + 2 * K + V + offs_k[None, :],
                     mt.load(f_ptr + tok_rows[:, None] * K + offs_k[None, :], mask=mk), mask=mk)
            mt.store(draft_beta_ptr + draft0 + mt.maximum(tt - 1, 0) * H, mt.load(beta_ptr + tok_rows, mask=new_draft),
                     mask=new_draft)
            mt.barrier()  # the token rows are read by other threads (in the state's layout) below
            if LATE_STATE:
                S = mt.load(state_at, cache_modifier=STATE_CACHE)
            if PREFETCH == 1 or PREFETCH == 3 or (PREFETCH == 2 and not ONE_RUN):
                _prefetch_area(scr, pf, n_replay, T, PF, RS, TH, PREFETCH == 3, num_items)
            if PREFETCH == 2 and ONE_RUN:
                for i in mt.static_range(AHEAD):
                    _prefetch_row(scr, i, n_replay, T, pf_offs, pf_ok, RS, TH)

            # 3. the token loop: the replayed drafts (rows 0..n-1), then the new tokens (rows TH..TH+T-1). Each
            #    half's runs start at its row 0; the bonus token's true state S D_0 is stored (the only state write).
            R = renorm_every
            bonus_row = scr + TH * RS
            if ONE_RUN:
                for j in range(0, n_replay):
                    if PREFETCH == 2:
                        _prefetch_row(scr, j + AHEAD, n_replay, T, pf_offs, pf_ok, RS, TH)
                    S = _staged_replay(S, scr + j * RS, cols, offs_k, offs_v, column, K, V, COLUMN)
                # the replays' run ends: its last D (no replay: row 0, whose g = 0 makes D = 1)
                S = S * _kvec(scr + mt.maximum(n_replay - 1, 0) * RS, cols, offs_k, offs_v, column, COLUMN)
                if PREFETCH == 2:
                    _prefetch_row(scr, n_replay + AHEAD, n_replay, T, pf_offs, pf_ok, RS, TH)
                S = _staged_new_token(S, bonus_row, o_area, cols, offs_k, offs_v, o_offs, o_lane, column, K, V, OR,
                                      VW, COLUMN)
                _store_state(state_at, S * _kvec(bonus_row, cols, offs_k, offs_v, column, COLUMN), column, COLUMN)
                if NUM_DRAFTS > 0:
                    for t in range(1, T - 1):
                        if PREFETCH == 2:
                            _prefetch_row(scr, n_replay + t + AHEAD, n_replay, T, pf_offs, pf_ok, RS, TH)
                        S = _staged_new_token(S, bonus_row + t * RS, o_area + t * V, cols, offs_k, offs_v, o_offs,
                                              o_lane, column, K, V, OR, VW, COLUMN)
                    # the last draft needs its output only (its state is dropped)
                    _staged_new_token(S, bonus_row + (T - 1) * RS, o_area + (T - 1) * V, cols, offs_k, offs_v,
                                      o_offs, o_lane, column, K, V, OR, VW, COLUMN, False)
            else:
                for j0 in range(0, n_replay, R):
                    j1 = mt.minimum(j0 + R, n_replay)
                    for j in range(j0, j1):
                        S = _staged_replay(S, scr + j * RS, cols, offs_k, offs_v, column, K, V, COLUMN)
                    S = S * _kvec(scr + (j1 - 1) * RS, cols, offs_k, offs_v, column, COLUMN)
                S = _staged_new_token(S, bonus_row, o_area, cols, offs_k, offs_v, o_offs, o_lane, column, K, V, OR,
                                      VW, COLUMN)
                _store_state(state_at, S * _kvec(bonus_row, cols, offs_k, offs_v, column, COLUMN), column, COLUMN)
                # the rest of the bonus token's run (`+ 0 * n_replay`: renorm_every = 1 is specialized to a constant)
                for t in range(1, mt.minimum(R + 0 * n_replay, T)):
                    S = _staged_new_token(S, bonus_row + t * RS, o_area + t * V, cols, offs_k, offs_v, o_offs,
                                          o_lane, column, K, V, OR, VW, COLUMN)
                for t0 in range(R, T, R):  # later runs: fold the previous run's last D first
                    S = S * _kvec(bonus_row + (t0 - 1) * RS, cols, offs_k, offs_v, column, COLUMN)
                    for t in range(t0, mt.minimum(t0 + R, T)):
                        S = _staged_new_token(S, bonus_row + t * RS, o_area + t * V, cols, offs_k, offs_v, o_offs,
                                              o_lane, column, K, V, OR, VW, COLUMN)

            # 4. the output norm over all V rows (written by other threads): every new token at once, [TN, V]. The
            #    next item writes the sequence area and then, past its first barrier, the token rows (read only
            #    before this barrier), and its outputs only past its second: no barrier at the item's end.
            mt.barrier()
            mo = (tt < T)[:, None] & (offs_v[None, :] >= 0)
            ov = offs_v.to(mt.uint32)  # unsigned: % and // by the power of two VW are an and and a shift
            o_at = ((ov % VW) * OR + ov // VW).to(mt.int32)  # where `_store_outputs_packed` put row v
            if COLUMN:
                o_at = offs_v  # each thread stored its own column's output in place
            o = mt.load(o_area + tt[:, None] * V + o_at[None, :], mask=mo, other=0.0)
            toks = tok_rows[:, None] * V + offs_v[None, :]
            gate = mt.load(gate_ptr + toks, mask=mo, other=0.0).to(mt.float32)
            inv_rms = mt.rsqrt(mt.sum(o * o, axis=1) / V + norm_eps)
            mt.store(o_ptr + toks, o * inv_rms[:, None] * norm_w[None, :] * _sigmoid(gate), mask=mo)


@dataclass(frozen=True)
class Variant:
    """Which kernel runs a step, and how (host-selectable for A/B runs: kda_decode_step(..., variant=NAME)).
    Warps apply at K * V >= 128 * 128 (smaller heads use 4); the T = 1 kernel's state K axis is split over
    `t1_lanes` lanes (`state_k_split`), a chunk has `t1_rows` rows per lane group, and it loads `t1_prefetch`
    chunks ahead of their use."""

    t1_kernel: str  # kernel for T = 1 (k = 0): a kda_decode_t1_kernel* (streamed) or a kda_decode_step_kernel*
    t1_warps: int
    t1_lanes: int
    t1_rows: int  # rows of a chunk per lane group (`state_chunk_rows`)
    t1_prefetch: int
    kernel: str  # kernel for T > 1
    warps: int
    rows: int = 1  # kda_decode_scratch_kernel: rows of a chunk per lane group (`state_chunk_rows`)
    # kda_decode_staged_kernel: how the token rows reach L1 (PREFETCH: 0 not at all, 1 the item's rows after the
    # prologue, 2 per token `ahead` tokens early, 3 touched by loads: a probe), one pointer every `pf_floats`
    # floats, and the state load's cache modifier
    prefetch: int = 0
    pf_floats: int = 32
    ahead: int = 1
    seq_prefetch: bool = False  # the sequence area too, after the prologue's first barrier
    state_cache: str = ""
    late_state: bool = False  # the state prefetched into L2 at the item's start, loaded after the prologue
    column: bool = False  # the column-owner state (COLUMN): a V column per thread, V / 32 warps
    tensor_cores: str = ""  # kda_decode_chunked_kernel: the whole state on tensor cores at this input precision
    deltas: bool = False  # kda_decode_step_kernel: drafts written with replay deltas, replayed from them
    rows_prefetch: bool = False  # kda_decode_step_kernel: the token loops' rows asked into L1 up front (ROWS_PREFETCH)

    @property
    def t_gt_1(self) -> tuple:
        """What decides the T > 1 kernel's code (variants equal here time the same k >= 1 kernel)."""
        return (self.kernel, self.warps, self.rows, self.prefetch, self.pf_floats, self.ahead, self.seq_prefetch,
                self.state_cache, self.late_state, self.column, self.tensor_cores, self.deltas, self.rows_prefetch)


VARIANTS: dict[str, Variant] = {
    "stream": Variant("kda_decode_t1_kernel", 8, 8, 1, 1, "kda_decode_step_kernel", 8),
    "stream_l32": Variant("kda_decode_t1_kernel", 8, 32, 4, 1, "kda_decode_step_kernel", 8),
    "stream_l32_pf2": Variant("kda_decode_t1_kernel", 8, 32, 4, 2, "kda_decode_step_kernel", 8),
    "stream_w4": Variant("kda_decode_t1_kernel_4w", 4, 8, 1, 1, "kda_decode_step_kernel", 8),
    "stream_k7nocap": Variant("kda_decode_t1_kernel", 8, 8, 1, 1, "kda_decode_step_kernel_uncapped", 8),
    "stream_scratch": Variant("kda_decode_t1_kernel", 8, 8, 1, 1, "kda_decode_scratch_kernel", 8),
    "stream_scratch_vc64": Variant("kda_decode_t1_kernel", 8, 8, 1, 1, "kda_decode_scratch_kernel", 8, rows=2),
    "loop": Variant("kda_decode_step_kernel", 8, 8, 1, 1, "kda_decode_step_kernel", 8),  # the 18:55 kernel
    # the default's kernels, with the accepted drafts replayed from cached deltas at k >= 1 (2026-12-07): one fma
    # per state element a replayed token instead of a conv, norms, a matvec and the update
    "stream_l32_pf2_delta": Variant("kda_decode_t1_kernel", 8, 32, 4, 2, "kda_decode_step_kernel", 8, deltas=True),
    # measured 2026-12-07 (H100, B256 H12): the delta replay +11% at k7a7 (each replayed token waits a memory latency
    # for its row, with nothing to hide it). _rpf: the replayed rows and the gate rows asked into L1 up front
    # (ROWS_PREFETCH), on the raw replay (the default since: -4.4% at k7a7) and on the delta one (480.0 us: the
    # prefetch takes back most of the +11%, but it stays above the raw replay with it, 464.1)
    "stream_l32_pf2_rpf": Variant("kda_decode_t1_kernel", 8, 32, 4, 2, "kda_decode_step_kernel", 8,
                                  rows_prefetch=True),
    "stream_l32_pf2_delta_rpf": Variant("kda_decode_t1_kernel", 8, 32, 4, 2, "kda_decode_step_kernel", 8,
                                        deltas=True, rows_prefetch=True),
    "loop_nocap": Variant("kda_decode_step_kernel_uncapped", 8, 8, 1, 1,
                          "kda_decode_step_kernel_uncapped", 8),  # the general kernel without the register cap
    # k >= 1 in chunked (WY) form: the state read once, no per-token pass (not yet timed). K3 ptxas: 255 registers
    # and 24 B of spills (one program per SM), or capped at 128 for two per SM (244 B of spills)
    "chunked": Variant("kda_decode_t1_kernel", 8, 32, 4, 2, "kda_decode_chunked_kernel", 8),
    "chunked_2cta": Variant("kda_decode_t1_kernel", 8, 32, 4, 2, "kda_decode_chunked_kernel_2cta", 8),
    # the chunked kernel on tensor cores (2026-12-02): the whole state in an mma.sync accumulator's layout, its
    # products tf32x3 mma.sync with the state as A operand in place (kPairs); chunks of >= 8 rows. Measured
    # 911.4 us at B256 H12 k7a7 (the loop kernel 439.6): correct, latency bound at one program per SM.
    # chunked_tc1: plain tf32 (one product per K step, ~1e-3 relative error per product), to price the split
    "chunked_tc": Variant("kda_decode_t1_kernel", 8, 32, 4, 2, "kda_decode_chunked_kernel", 8, tensor_cores="tf32x3"),
    "chunked_tc1": Variant("kda_decode_t1_kernel", 8, 32, 4, 2, "kda_decode_chunked_kernel", 8, tensor_cores="tf32"),
    # chunked_tc capped at 128 registers for two programs per SM (ptxas at K3: 1.2 KB of spills; not yet timed):
    # the measured chunked_tc is latency bound at one program per SM (docs/kernels/kda_decode.md)
    "chunked_tc_2cta": Variant("kda_decode_t1_kernel", 8, 32, 4, 2, "kda_decode_chunked_kernel_2cta", 8,
                               tensor_cores="tf32x3"),
    # k >= 1 with the whole state in registers and the per-token vectors staged in a per-program scratch up front:
    # no block barrier and no layout conversion in the token loops (2026-12-01; not yet timed). k = 0 as
    # stream_l32_pf2
    "staged": Variant("kda_decode_t1_kernel", 8, 32, 4, 2, "kda_decode_staged_kernel", 8),
    # the staged kernel with what its prologue wrote brought into L1 (2026-12-01 late; not yet timed): the state
    # read through L2 only (staged_cg: that alone, the control, and in all the others), the sequence area after the
    # first barrier and the token rows after the second prefetched in 128-byte lines (staged_pf; the rows only:
    # staged_pf_rows) or 32-byte sectors (staged_pf_sec), or the rows per token 1 / 2 tokens ahead (staged_pf1 /
    # _pf2), or both touched by real loads (staged_touch: a probe of whether L1 residency is what helps, whatever
    # the prefetch instruction does on the GPU)
    **{name: Variant("kda_decode_t1_kernel", 8, 32, 4, 2, "kda_decode_staged_kernel", 8, state_cache=".cg", **kw)
       for name, kw in (("staged_cg", {}), ("staged_pf", dict(prefetch=1, seq_prefetch=True)),
                        ("staged_pf_rows", dict(prefetch=1)),
                        ("staged_pf_sec", dict(prefetch=1, pf_floats=8, seq_prefetch=True)),
                        ("staged_pf1", dict(prefetch=2, seq_prefetch=True)),
                        ("staged_pf2", dict(prefetch=2, ahead=2, seq_prefetch=True)),
                        ("staged_touch", dict(prefetch=3, seq_prefetch=True)),
                        ("staged_pf_late", dict(prefetch=1, seq_prefetch=True, late_state=True)))},
    # the staged kernel on the column-owner state (2026-12-02; not yet timed): each thread a whole V column, the
    # token loops without shuffles or exchanges (tools/column_owner_probe.py), 4 warps at K3
    "staged_col": Variant("kda_decode_t1_kernel", 8, 32, 4, 2, "kda_decode_staged_kernel", 4, column=True),
}
# The chunked kernel factors e^(G_i - G_j) as e^G_i e^-G_j: a chunk's cumulative log-decay must stay inside fp32's
# exponent range (rows x |lower_bound| <= CHUNK_MAX_LOG_DECAY), else the step runs the loop kernel.
CHUNK_MAX_LOG_DECAY = 80.0
# The default is the fastest measured (tools/kda_decode_ab.py, H200, 2026-11-29 22:17 UTC; docs/kernels/kda_decode.md):
# k=0 streamed with 32-lane rows and two V chunks in flight, 112.5 us at B256 H12 (loop 187.6, fla T1 130.7);
# k >= 1 the loop kernel (443.2 us at k=7 a=7; the L2-scratch kernels measured slower: 654.7 / 789.2).
# 2026-12-07 (H100, same run): stream_l32_pf2_rpf, the same kernels with the replayed rows and the gate rows asked
# into L1 up front: k7a7 485.7 -> 464.1 us at B256 H12, 938.4 -> 903.3 at B64 H96 (-4.4% / -3.7%), k0 unchanged.
DEFAULT_VARIANT = "stream_l32_pf2_rpf"


# ------------------------------------------------------------------------------------------------ host side


@dataclass
class KDADecodeWeights:
    """One KDA layer's decode-time parameters (K3 layout; see the module docstring for shapes)."""

    conv_weight: torch.Tensor  # [2*H*K + H*V, 4] fp32, channels q | k | v; a checkpoint's [C, 1, 4] is accepted
    a_log: torch.Tensor  # [>= H] fp32 (K3 pads it to 128; the first H are used)
    dt_bias: torch.Tensor  # [H*K] fp32
    o_norm_weight: torch.Tensor  # [V] fp32
    lower_bound: float = -5.0
    scale: float | None = None  # default K**-0.5
    norm_eps: float = 1e-5


@dataclass
class KDADecodeCache:
    """Per-slot decode state of one KDA layer: recurrent state, conv window and the draft cache for the replay."""

    state: torch.Tensor  # [P, H, V, K] fp32 (V-first)
    conv_state: torch.Tensor  # [P, 3, 2*H*K + H*V] activation dtype, oldest input first
    draft_proj: torch.Tensor  # [P, MAX_DRAFTS, H, 3K+V] activation dtype: q | k | v | f of each draft
    draft_beta: torch.Tensor  # [P, MAX_DRAFTS, H] activation dtype
    # [P, MAX_DRAFTS, H, V + 2K] fp32: each draft's replay delta (delta | En*k | D; `kda_decode_step_kernel`),
    # written by the variants with `deltas`; None: those variants cannot run on this cache
    draft_delta: torch.Tensor | None = None
    # whether every draft in the cache has its delta row (the last step that wrote drafts was a `deltas` variant);
    # kept by kda_decode_step on the host, so the replay form is fixed per step (and per captured CUDA graph)
    drafts_have_deltas: bool = True

    @classmethod
    def allocate(cls, num_slots: int, heads: int, head_k_dim: int, head_v_dim: int, max_drafts: int,
                 dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cuda",
                 replay_deltas: bool = False) -> "KDADecodeCache":
        """Zero state and conv window (a fresh sequence); the draft cache needs no init (read only when accepted).
        replay_deltas: also the fp32 delta rows the `deltas` variants write and replay (opt-in: at K = V = 128 they
        add 16% to the cache, for variants measured slower than the default)."""
        p, h, kd, vd = num_slots, heads, head_k_dim, head_v_dim
        drafts = max(max_drafts, 1)
        delta = torch.zeros(p, drafts, h, vd + 2 * kd, dtype=torch.float32, device=device) if replay_deltas else None
        return cls(state=torch.zeros(p, h, vd, kd, dtype=torch.float32, device=device),
                   conv_state=torch.zeros(p, CONV_WIDTH - 1, 2 * h * kd + h * vd, dtype=dtype, device=device),
                   draft_proj=torch.zeros(p, drafts, h, 3 * kd + vd, dtype=dtype, device=device),
                   draft_beta=torch.zeros(p, drafts, h, dtype=dtype, device=device), draft_delta=delta)

    @property
    def max_drafts(self) -> int:
        return self.draft_proj.shape[1]

    def clone(self) -> "KDADecodeCache":
        """A copy with its own buffers (a reference run's cache, next to the kernel's)."""
        return KDADecodeCache(**{name: value.clone() if isinstance(value, torch.Tensor) else value
                                 for name, value in vars(self).items()})

    def randomize_(self, gen: torch.Generator) -> "KDADecodeCache":
        """Every buffer drawn from N(0, 1) (on the CPU with `gen`, then copied): a state and conv window mid-sequence
        and stale drafts in every slot, as tests and benchmarks want. Random drafts have no true delta rows."""
        for value in vars(self).values():
            if isinstance(value, torch.Tensor):
                value.copy_(torch.randn(value.shape, generator=gen, dtype=torch.float64).to(value.dtype))
        self.drafts_have_deltas = False
        return self


def state_k_split(head_k_dim: int, lanes: int = STATE_K_LANES) -> tuple[int, int]:
    """(KL, KV): how the state's K axis is split in the kernel's [KJ, V, KL, KV] tile. KV = 4 fp32 (one 16-byte
    vector) per run, KL lanes of a warp hold a row's runs, KJ = K / (KL * KV) runs per thread."""
    vec = min(4, head_k_dim)
    return max(1, min(lanes, head_k_dim // vec)), vec


def renorm_period(lower_bound: float) -> int:
    """Tokens between renormalizations of the deferred decay: each token's decay is > e^lower_bound, so after this
    many the column scale D stays above e^-MAX_DEFERRED_LOG_DECAY (and 1 / D below its inverse)."""
    if lower_bound >= 0:
        return 1 << 20
    return max(1, min(1 << 20, int(MAX_DEFERRED_LOG_DECAY / -lower_bound)))


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(f"kda_decode_step: {message}")


def _check_inputs(q, k, v, f, beta, gate, weights, cache, state_indices, num_accepted) -> tuple[int, ...]:
    _check(q.dim() == 4, "q must be [B, T, H, K]")
    b, t, h, kd = q.shape
    vd = v.shape[-1]
    p = cache.state.shape[0]
    expected = {"q": (q, (b, t, h, kd)), "k": (k, (b, t, h, kd)), "v": (v, (b, t, h, vd)), "f": (f, (b, t, h, kd)),
                "beta": (beta, (b, t, h)), "gate": (gate, (b, t, h, vd)),
                "cache.state": (cache.state, (p, h, vd, kd)),
                "cache.conv_state": (cache.conv_state, (p, CONV_WIDTH - 1, 2 * h * kd + h * vd)),
                "cache.draft_proj": (cache.draft_proj, (p, cache.max_drafts, h, 3 * kd + vd)),
                "cache.draft_beta": (cache.draft_beta, (p, cache.max_drafts, h)),
                **({} if cache.draft_delta is None else
                   {"cache.draft_delta": (cache.draft_delta, (p, cache.max_drafts, h, vd + 2 * kd))}),
                "weights.conv_weight": (weights.conv_weight.reshape(weights.conv_weight.shape[0], -1),
                                        (2 * h * kd + h * vd, CONV_WIDTH)),
                "weights.dt_bias": (weights.dt_bias, (h * kd,)),
                "weights.o_norm_weight": (weights.o_norm_weight, (vd,)),
                "state_indices": (state_indices, (b,)), "num_accepted": (num_accepted, (b,))}
    for name, (tensor, shape) in expected.items():
        _check(tuple(tensor.shape) == shape, f"{name} has shape {tuple(tensor.shape)}, expected {shape}")
        _check(tensor.is_contiguous(), f"{name} must be contiguous")
    _check(weights.a_log.dim() == 1 and weights.a_log.numel() >= h, "weights.a_log must be [>= H]")
    _check(t - 1 <= cache.max_drafts, f"{t - 1} drafts do not fit the draft cache ({cache.max_drafts})")
    _check(cache.state.dtype == torch.float32, "cache.state must be fp32")
    _check(cache.draft_delta is None or cache.draft_delta.dtype == torch.float32, "cache.draft_delta must be fp32")
    for name, tensor in (("k", k), ("v", v), ("f", f), ("beta", beta), ("gate", gate),
                         ("cache.conv_state", cache.conv_state), ("cache.draft_proj", cache.draft_proj),
                         ("cache.draft_beta", cache.draft_beta)):
        _check(tensor.dtype == q.dtype, f"{name} is {tensor.dtype}, expected the activation dtype {q.dtype}")
    for name, tensor in (("conv_weight", weights.conv_weight), ("a_log", weights.a_log),
                         ("dt_bias", weights.dt_bias), ("o_norm_weight", weights.o_norm_weight)):
        _check(tensor.dtype == torch.float32, f"weights.{name} must be fp32")
    _check(not state_indices.is_floating_point() and not num_accepted.is_floating_point(),
           "state_indices and num_accepted must be integer tensors")
    for dim, name in ((kd, "K"), (vd, "V")):
        _check(dim >= 1 and dim & (dim - 1) == 0, f"{name} = {dim} must be a power of two")
    return b, t, h, kd, vd


def state_chunk_rows(head_v_dim: int, num_warps: int, lanes_k: int, rows_per_group: int) -> int:
    """VC, the V rows of one chunk of the T = 1 kernel: `rows_per_group` rows for every group of `lanes_k` lanes
    of every warp (at K = 128: 1 row of 8 lanes or 4 rows of 32 lanes, either way 16 registers per thread), at
    most V."""
    return min(head_v_dim, max(1, 32 // lanes_k) * num_warps * rows_per_group)


def kda_decode_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, f: torch.Tensor, beta: torch.Tensor,
                    gate: torch.Tensor, weights: KDADecodeWeights, cache: KDADecodeCache,
                    state_indices: torch.Tensor, num_accepted: torch.Tensor, out: torch.Tensor | None = None,
                    num_warps: int | None = None, variant: str | None = None) -> torch.Tensor:
    """One speculative decode step of a KDA layer; returns o [B, T, H, V] (gated-RMSNorm output, q.dtype).

    q, k, f [B, T, H, K], v, gate [B, T, H, V], beta [B, T, H]: the raw projections (pre-conv q/k/v, gate input f,
    beta logits, output-gate input) of the T = 1 + k tokens of each row: the bonus token, then the k drafts.
    state_indices [B] int: slot of each row in `cache` (-1 = padding: its outputs are left untouched).
    num_accepted [B] int: drafts of the previous step accepted for that request (0 for a fresh sequence); they are
    replayed from `cache.draft_proj` before the new tokens. `cache` is updated in place: state and conv window at the
    bonus token, draft cache with this step's k drafts. Every length lives on the device: graph-capturable.
    variant: which kernel runs (None: `DEFAULT_VARIANT`); see `VARIANTS`. All compute the same step.
    """
    bsz, t, h, kd, vd = _check_inputs(q, k, v, f, beta, gate, weights, cache, state_indices, num_accepted)
    conv_weight = weights.conv_weight.reshape(weights.conv_weight.shape[0], -1)
    if out is None:
        out = torch.empty_like(gate, dtype=q.dtype)
    _check(out.shape == gate.shape and out.is_contiguous(), "out must be a contiguous [B, T, H, V] tensor")
    scale = weights.scale if weights.scale is not None else kd ** -0.5
    chosen = VARIANTS.get(variant or DEFAULT_VARIANT)
    _check(chosen is not None, f"unknown variant {variant!r} (known: {', '.join(VARIANTS)})")
    kernel_name, warps = (chosen.t1_kernel, chosen.t1_warps) if t == 1 else (chosen.kernel, chosen.warps)
    if num_warps is None:
        num_warps = warps if kd * vd >= 128 * 128 else 4
    if chosen.column and t > 1:  # one V column per thread: V / 32 warps
        _check(vd % 32 == 0 and (vd // 32) & (vd // 32 - 1) == 0 and not chosen.late_state and chosen.prefetch != 2,
               f"variant {variant!r} needs V a power of two times 32 (got {vd})")
        num_warps = vd // 32
    _check(weights.lower_bound > -MAX_DEFERRED_LOG_DECAY,
           f"lower_bound = {weights.lower_bound} must be > -{MAX_DEFERRED_LOG_DECAY}")
    if bsz == 0 or cache.state.shape[0] == 0:  # no rows, or no slots (every row is padding)
        return out
    args = (q, k, v, f, beta, gate, out,
            cache.state, cache.conv_state, cache.draft_proj, cache.draft_beta, state_indices, num_accepted,
            conv_weight, weights.a_log, weights.dt_bias, weights.o_norm_weight,
            float(scale), float(weights.lower_bound), float(weights.norm_eps), renorm_period(weights.lower_bound))
    kernel = globals()[kernel_name]  # looked up per call: tests replace the kernels with recorders
    writes_deltas = False
    if kernel_name.startswith("kda_decode_t1"):
        lanes_k, vec_k = state_k_split(kd, chosen.t1_lanes)
        rows = state_chunk_rows(vd, num_warps, lanes_k, chosen.t1_rows)
        kernel[(h, bsz)](*args, H=h, K=kd, V=vd, MAX_DRAFTS=cache.max_drafts, KL=lanes_k, KV=vec_k, VC=rows,
                         PREFETCH=min(chosen.t1_prefetch, vd // rows), num_warps=num_warps)
    elif kernel_name == "kda_decode_scratch_kernel":
        lanes_k, vec_k = state_k_split(kd)
        # a persistent grid, each program with an fp32 scratch for its items' per-token vectors (`scratch_floats`:
        # 78.6 KB per program at K = V = 128, k = 7); from the caching allocator, so graph-safe
        programs = scratch_programs(q.device, bsz * h)
        scratch = torch.empty(programs * scratch_floats(kd, vd, cache.max_drafts, t), dtype=torch.float32,
                              device=q.device)
        kernel[(programs,)](*args, scratch, bsz * h, H=h, K=kd, V=vd, NUM_DRAFTS=t - 1, MAX_DRAFTS=cache.max_drafts,
                         KL=lanes_k, KV=vec_k, VC=state_chunk_rows(vd, num_warps, lanes_k, chosen.rows),
                         TP=scratch_tokens(cache.max_drafts, t), TN=_pow2_at_least(t), num_warps=num_warps)
    elif kernel_name == "kda_decode_staged_kernel":
        lanes_k, vec_k = state_k_split(kd)
        # a persistent grid (the resident programs), each with its own scratch (`staged_scratch_floats`: 74.5 KB
        # per program at K = V = 128, k = 7; 19.7 MB in all: L2-resident), from the caching allocator: graph-safe
        programs = scratch_programs(q.device, bsz * h)
        scratch = torch.empty(programs * staged_scratch_floats(kd, vd, cache.max_drafts, t, num_warps),
                              dtype=torch.float32, device=q.device)
        th = staged_half_rows(cache.max_drafts, t, kd, num_warps)
        kernel[(programs,)](*args, scratch, bsz * h, H=h, K=kd, V=vd, NUM_DRAFTS=t - 1, MAX_DRAFTS=cache.max_drafts,
                            KL=lanes_k, KV=vec_k, TH=th, TN=_pow2_at_least(t),
                            OR=staged_out_rows(vd, num_warps, lanes_k),
                            ONE_RUN=staged_one_run(cache.max_drafts, t, weights.lower_bound), num_warps=num_warps,
                            **_staged_options(chosen, th, staged_row_floats(kd, vd), 2 * kd + vd))
    elif kernel_name.startswith("kda_decode_chunked") and _chunks_fit(cache.max_drafts, t, weights.lower_bound):
        tr, tn = _pow2_at_least(cache.max_drafts), _pow2_at_least(t)
        tc = {}
        if chosen.tensor_cores:  # mma.sync tiles N in blocks of 8: chunks of at least 8 rows (the rest masked)
            tr, tn = max(8, tr), max(8, tn)
            # the unit-lower inverse of R rows needs log2(R) - 1 doublings (the default 3 covers 16)
            tc = dict(WHOLE=True, WARPS=num_warps, PRECISION=chosen.tensor_cores, DR=tr.bit_length() - 2,
                      DN=tn.bit_length() - 2)
        kernel[(h, bsz)](*args, H=h, K=kd, V=vd, NUM_DRAFTS=t - 1, MAX_DRAFTS=cache.max_drafts, TR=tr, TN=tn,
                         num_warps=num_warps, **tc)
    else:
        if kernel_name.startswith("kda_decode_chunked"):  # chunks too long for the factored decay: the loop kernel
            kernel = kda_decode_step_kernel
        lanes_k, vec_k = state_k_split(kd)
        deltas = chosen.deltas and t > 1
        _check(not deltas or cache.draft_delta is not None,
               f"variant {variant!r} writes replay deltas: the cache needs draft_delta "
               f"(KDADecodeCache.allocate(..., replay_deltas=True))")
        # a delta variant replays from the deltas only when the drafts in the cache have them (else, once, from the
        # raw projections); the unused pointer of the other kernels is the state's
        options = dict(WRITE_DELTAS=True, REPLAY_DELTAS=cache.drafts_have_deltas, WARPS=num_warps) if deltas else {}
        if chosen.rows_prefetch:
            options.update(_rows_prefetch_options(kd, vd, cache.max_drafts, t))
        writes_deltas = deltas
        kernel[(h, bsz)](*args, cache.draft_delta if deltas else cache.state, H=h, K=kd, V=vd, NUM_DRAFTS=t - 1,
                         MAX_DRAFTS=cache.max_drafts, KL=lanes_k, KV=vec_k, num_warps=num_warps, **options)
    if t > 1:  # this step's drafts replace the cache's
        cache.drafts_have_deltas = writes_deltas
    return out


def _rows_prefetch_options(head_k_dim: int, head_v_dim: int, max_drafts: int, tokens: int) -> dict:
    """ROWS_PREFETCH and PL of `kda_decode_step_kernel`: the [rows, lines] tile its up-front L1 prefetches cover
    (rows: the drafts replayed or the tokens run; lines: the longest of a delta row (fp32 V + 2K), a raw draft row
    (bf16 3K + V) and a gate row (bf16 V), in 128-byte lines)."""
    lines = max(-(-4 * (head_v_dim + 2 * head_k_dim) // 128), -(-2 * (3 * head_k_dim + head_v_dim) // 128))
    return dict(ROWS_PREFETCH=_pow2_at_least(max(max_drafts, tokens)), PL=_pow2_at_least(lines))


def _staged_options(chosen: Variant, half_rows: int, row_floats: int, raw_floats: int) -> dict:
    """The staged kernel's prefetch constexprs for a variant, only where they differ from the kernel's defaults (so
    variant `staged` compiles and launches exactly as before they existed). raw_floats: a sequence-area row."""
    options: dict = {}
    if chosen.prefetch:
        options.update(PREFETCH=chosen.prefetch, PF=chosen.pf_floats,
                       NPF=staged_prefetch_pointers(chosen.prefetch, chosen.pf_floats, half_rows, row_floats))
        if chosen.prefetch == 2:
            options["AHEAD"] = chosen.ahead
        if chosen.seq_prefetch:
            options["NPS"] = _pow2_at_least(-(-(2 * half_rows + 3) * raw_floats // chosen.pf_floats))
    if chosen.state_cache:
        options["STATE_CACHE"] = chosen.state_cache
    if chosen.late_state:
        options["LATE_STATE"] = True
    if chosen.column:
        options["COLUMN"] = True
    return options


def _pow2_at_least(n: int) -> int:
    """The smallest power of two >= n (a tile dimension; 1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def _chunks_fit(max_drafts: int, tokens: int, lower_bound: float) -> bool:
    """Whether kda_decode_chunked_kernel takes the step: chunks of at most 16 rows (its inverse's three doublings)
    whose cumulative log-decay stays within CHUNK_MAX_LOG_DECAY."""
    rows = max(_pow2_at_least(max_drafts), _pow2_at_least(tokens))
    return rows <= 16 and rows * -lower_bound <= CHUNK_MAX_LOG_DECAY


# K3 layer shapes (96 heads of 128), bf16 activations, pointers 16-byte aligned as at run time
_K3_SIGNATURE = ("q_ptr:*bf16:16,k_ptr:*bf16:16,v_ptr:*bf16:16,f_ptr:*bf16:16,beta_ptr:*bf16:16,gate_ptr:*bf16:16,"
                 "o_ptr:*bf16:16,"
                 "state_ptr:*fp32:16,conv_state_ptr:*bf16:16,draft_proj_ptr:*bf16:16,draft_beta_ptr:*bf16:16,"
                 "state_idx_ptr:*i32:16,num_accepted_ptr:*i32:16,conv_w_ptr:*fp32:16,a_log_ptr:*fp32:16,"
                 "dt_bias_ptr:*fp32:16,o_norm_w_ptr:*fp32:16,scale:fp32,lower_bound:fp32,norm_eps:fp32,"
                 "renorm_every:i32")
_STEP_SIGNATURE = _K3_SIGNATURE + ",draft_delta_ptr:*fp32:16"
kda_decode_step_kernel.specialize(signature=_STEP_SIGNATURE, H=96, K=128, V=128, NUM_DRAFTS=7, MAX_DRAFTS=7, KL=8,
                                  KV=4, WRITE_DELTAS=True, REPLAY_DELTAS=True, WARPS=8,
                                  num_warps=8)  # stream_l32_pf2_delta
kda_decode_step_kernel.specialize(signature=_STEP_SIGNATURE, H=96, K=128, V=128, NUM_DRAFTS=7, MAX_DRAFTS=7, KL=8,
                                  KV=4, **_rows_prefetch_options(128, 128, 7, 8), num_warps=8)  # the default, k = 7
for _drafts in (0, 7):  # no speculation (the general kernel, variant "loop") and 7 drafts (the last specialization)
    kda_decode_step_kernel.specialize(signature=_STEP_SIGNATURE, H=96, K=128, V=128, NUM_DRAFTS=_drafts,
                                      MAX_DRAFTS=7, KL=8, KV=4, num_warps=8)
kda_decode_t1_kernel.specialize(signature=_K3_SIGNATURE, H=96, K=128, V=128, MAX_DRAFTS=7, KL=8, KV=4, VC=32,
                                PREFETCH=1, num_warps=8)
kda_decode_chunked_kernel.specialize(signature=_K3_SIGNATURE, H=96, K=128, V=128, NUM_DRAFTS=7, MAX_DRAFTS=7, TR=8,
                                     TN=8, num_warps=8)  # variant chunked, 7 drafts
kda_decode_chunked_kernel.specialize(signature=_K3_SIGNATURE, H=96, K=128, V=128, NUM_DRAFTS=7, MAX_DRAFTS=7, TR=8,
                                     TN=8, WHOLE=True, WARPS=8, PRECISION="tf32x3", DR=2, DN=2,
                                     num_warps=8)  # chunked_tc


def staged_k3_spec(variant: str = "staged", drafts: int = 7):  # type: ignore[no-untyped-def]
    """The K3-shape specialization (H = 96, K = V = 128, 8 warps, lower_bound -5: ONE_RUN) of a staged variant's
    kernel with the cache holding `drafts` drafts, not registered as an AOT one (for ptxas / SASS checks of the
    variants without compiling them all in `minitriton compile` and the IR round-trip tests). The column-owner
    variant runs V / 32 = 4 warps."""
    warps = 128 // 32 if VARIANTS[variant].column else 8
    th = staged_half_rows(drafts, drafts + 1, 128, warps)
    return kda_decode_staged_kernel.aot_spec(
        _K3_SIGNATURE + ",scratch_ptr:*fp32:16,num_items:i32", warps, None, None, H=96, K=128, V=128,
        NUM_DRAFTS=drafts, MAX_DRAFTS=drafts, KL=8, KV=4, TH=th, TN=_pow2_at_least(drafts + 1), OR=4,
        ONE_RUN=True, **_staged_options(VARIANTS[variant], th, staged_row_floats(128, 128), 3 * 128))


for _drafts in (1, 3, 7):  # variant staged at the benchmark's k (the cache holding k drafts), lower_bound -5
    kda_decode_staged_kernel.specializations.append(staged_k3_spec("staged", _drafts))
for _rows in (1, 2):  # variants stream_scratch (chunks of 32 rows) and stream_scratch_vc64 (64 rows), 7 drafts
    kda_decode_scratch_kernel.specialize(signature=_K3_SIGNATURE + ",scratch_ptr:*fp32:16,num_items:i32", H=96,
                                         K=128, V=128, NUM_DRAFTS=7, MAX_DRAFTS=7, KL=8, KV=4, VC=32 * _rows, TP=16,
                                         TN=8, num_warps=8)
