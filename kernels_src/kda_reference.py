"""Pure-torch references for the KDA decode step (kda_decode.py) and a speculative-decoding simulator.

    reference_token_step   one token of a batch of sequences, float64, in fla's order of operations (conv + SiLU,
                           L2 norm, floored gate, decay then delta rule, o = S^T q, gated RMSNorm): no speculation
    decode_reference       token by token over one sequence's committed tokens
    spec_decode_step_torch the API of `kda_decode_step` (replay + new tokens + draft cache) in torch, float64 math
    simulate_spec_decode   drives a step function for many steps with random drafts, random acceptance (0, all and
                           mixed in one batch), padding rows and a reshuffled batch; then checks the committed tokens'
                           outputs and the final states against `decode_reference`

Shapes and layouts are those of kda_decode.py's module docstring (state V-first [.., H, V, K]).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .kda_decode import CONV_WIDTH, QK_NORM_EPS, KDADecodeCache, KDADecodeWeights

STREAMS = ("q", "k", "v", "f", "beta", "gate")


@dataclass
class TokenInputs:
    """Raw projections of tokens; leading dims [...] shared: q, k, f [..., H, K]; v, gate [..., H, V]; beta [..., H]."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    f: torch.Tensor
    beta: torch.Tensor
    gate: torch.Tensor

    def select(self, index) -> "TokenInputs":
        return TokenInputs(*(getattr(self, s)[index] for s in STREAMS))

    def as_tuple(self) -> tuple[torch.Tensor, ...]:
        return tuple(getattr(self, s) for s in STREAMS)

    @staticmethod
    def cat(items: list["TokenInputs"], dim: int = 0) -> "TokenInputs":
        return TokenInputs(*(torch.cat([getattr(x, s) for x in items], dim) for s in STREAMS))

    @staticmethod
    def random(lead: tuple[int, ...], heads: int, head_k_dim: int, head_v_dim: int, dtype: torch.dtype,
               generator: torch.Generator) -> "TokenInputs":
        """Projections of the magnitude a trained layer produces (unit-ish q/k/v, gate inputs around 0)."""
        def rnd(*shape: int, std: float = 1.0) -> torch.Tensor:
            return (torch.randn(*lead, *shape, generator=generator) * std).to(dtype)
        h, kd, vd = heads, head_k_dim, head_v_dim
        return TokenInputs(q=rnd(h, kd), k=rnd(h, kd), v=rnd(h, vd), f=rnd(h, kd), beta=rnd(h), gate=rnd(h, vd))


def random_weights(heads: int, head_k_dim: int, head_v_dim: int, generator: torch.Generator,
                   lower_bound: float = -5.0) -> KDADecodeWeights:
    """Random layer parameters in the ranges of the K3 checkpoint (A_log ~ log U(1, 16), dt_bias small)."""
    h, kd, vd = heads, head_k_dim, head_v_dim
    channels = 2 * h * kd + h * vd
    return KDADecodeWeights(
        conv_weight=torch.randn(channels, CONV_WIDTH, generator=generator) * 0.5,
        a_log=torch.log(1 + 15 * torch.rand(h, generator=generator)),
        dt_bias=torch.randn(h * kd, generator=generator) * 0.5,
        o_norm_weight=1 + 0.2 * torch.randn(vd, generator=generator),
        lower_bound=lower_bound)


def kda_gate(f: torch.Tensor, weights: KDADecodeWeights) -> torch.Tensor:
    """The floored (K3) log-decay g = lower_bound * sigmoid(exp(A_log[h]) * (f + dt_bias[h])) for f [..., H, K]."""
    h, kd = f.shape[-2:]
    a = torch.exp(weights.a_log[:h].double())[:, None]
    return weights.lower_bound * torch.sigmoid(a * (f.double() + weights.dt_bias.double().view(h, kd)))


def reference_token_step(x: TokenInputs, state: torch.Tensor, conv_state: torch.Tensor, weights: KDADecodeWeights
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token for N sequences: x fields [N, H, *], state [N, H, V, K], conv_state [N, 3, C].
    Returns (o [N, H, V], new state, new conv_state), all float64."""
    n, h, kd = x.q.shape
    vd = x.v.shape[-1]
    raw = torch.cat([x.q.reshape(n, -1), x.k.reshape(n, -1), x.v.reshape(n, -1)], -1).double()  # [N, C]
    window = torch.cat([conv_state.double(), raw[:, None]], 1)  # [N, 4, C], oldest first
    q, k, vc = conv_qkv(window, weights, h, kd, vd)
    beta = torch.sigmoid(x.beta.double())
    s = state.double() * torch.exp(kda_gate(x.f, weights))[:, :, None, :]  # decay the K axis (rows of the fla state)
    s = s + (beta[..., None] * (vc - torch.einsum("nhvk,nhk->nhv", s, k)))[..., None] * k[:, :, None, :]
    o = gated_rms_norm(torch.einsum("nhvk,nhk->nhv", s, q), x.gate, weights)
    return o, s, window[:, 1:]


def conv_qkv(windows: torch.Tensor, weights: KDADecodeWeights, h: int, kd: int, vd: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The state-independent vectors of tokens from their conv windows [N, 4, C] (oldest input first, float64):
    conv + SiLU, then q (L2-normalized, scaled) and k (L2-normalized) [N, H, K] and v [N, H, V]."""
    y = torch.nn.functional.silu((windows * weights.conv_weight.double().reshape(-1, CONV_WIDTH).T).sum(1))
    n = y.shape[0]
    qc, kc, vc = y[:, :h * kd].view(n, h, kd), y[:, h * kd:2 * h * kd].view(n, h, kd), y[:, 2 * h * kd:].view(n, h, vd)
    scale = weights.scale if weights.scale is not None else kd ** -0.5
    q = qc / torch.sqrt((qc * qc).sum(-1, keepdim=True) + QK_NORM_EPS) * scale
    k = kc / torch.sqrt((kc * kc).sum(-1, keepdim=True) + QK_NORM_EPS)
    return q, k, vc


def gated_rms_norm(o: torch.Tensor, gate: torch.Tensor, weights: KDADecodeWeights) -> torch.Tensor:
    """The head-wise RMSNorm of the outputs o [..., V], times the norm weight and sigmoid(output gate)."""
    o = o * torch.rsqrt((o * o).mean(-1, keepdim=True) + weights.norm_eps)
    return o * weights.o_norm_weight.double() * torch.sigmoid(gate.double())


def decode_reference(tokens: TokenInputs, state: torch.Tensor, conv_state: torch.Tensor, weights: KDADecodeWeights
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token-by-token decode of one sequence, no speculation: tokens fields [L, H, *], state [H, V, K],
    conv_state [3, C]. Returns (o [L, H, V], state and conv state after the last token), float64."""
    outs = []
    s, c = state[None].double(), conv_state[None].double()
    for t in range(tokens.q.shape[0]):
        o, s, c = reference_token_step(tokens.select(slice(t, t + 1)), s, c, weights)
        outs.append(o[0])
    o = torch.stack(outs) if outs else torch.empty(0, *tokens.gate.shape[1:], dtype=torch.float64)
    return o, s[0], c[0]


def spec_decode_step_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, f: torch.Tensor, beta: torch.Tensor,
                           gate: torch.Tensor, weights: KDADecodeWeights, cache: KDADecodeCache,
                           state_indices: torch.Tensor, num_accepted: torch.Tensor,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """`kda_decode_step` in plain torch (float64 math, same cache updates): the executable statement of its API."""
    bsz, t, h, kd = q.shape
    vd = v.shape[-1]
    out = torch.empty_like(gate) if out is None else out
    new = TokenInputs(q, k, v, f, beta, gate)
    for b in range(bsz):
        slot = int(state_indices[b])
        if slot < 0:
            continue
        s, c = cache.state[slot:slot + 1].double(), cache.conv_state[slot:slot + 1].double()
        n_replay = min(max(int(num_accepted[b]), 0), cache.max_drafts)
        for j in range(n_replay):
            row = cache.draft_proj[slot, j]
            replayed = TokenInputs(q=row[:, :kd], k=row[:, kd:2 * kd], v=row[:, 2 * kd:2 * kd + vd],
                                   f=row[:, 2 * kd + vd:], beta=cache.draft_beta[slot, j], gate=gate[b, 0])
            _, s, c = reference_token_step(replayed.select(None), s, c, weights)
        for i in range(t):
            o, s, c = reference_token_step(new.select((b, slice(i, i + 1))), s, c, weights)
            out[b, i] = o[0].to(out.dtype)
            if i == 0:
                cache.state[slot] = s[0].to(cache.state.dtype)
                cache.conv_state[slot] = c[0].to(cache.conv_state.dtype)
            else:
                cache.draft_proj[slot, i - 1] = torch.cat([q[b, i], k[b, i], v[b, i], f[b, i]], -1)
                cache.draft_beta[slot, i - 1] = beta[b, i]
    return out


# -------------------------------------------------------------------------------------------------- simulator

StepFn = Callable[..., torch.Tensor]  # the signature of kda_decode_step(q, k, v, f, beta, gate, weights, cache,
                                      # state_indices, num_accepted, out=...)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected| (a normwise bound, stricter than fla's RMS ratio)."""
    expected = expected.double()
    return float((actual.double() - expected).abs().max() / expected.abs().max().clamp_min(1e-30))


@dataclass
class SimulationReport:
    """Errors of a simulation against the token-by-token reference, and what the run covered."""

    output_error: float  # committed tokens' outputs
    state_error: float  # recurrent state at each request's last certain token
    conv_error: float  # conv window at the same token
    committed_tokens: int
    accepted_counts: list[int] = field(default_factory=list)  # every (step, request) acceptance drawn
    padding_rows: int = 0
    idle_request_steps: int = 0  # (step, request) pairs where the request was not in the batch


def simulate_spec_decode(step_fn: StepFn, *, num_requests: int, batch_rows: int, num_slots: int, heads: int,
                         head_k_dim: int, head_v_dim: int, num_drafts: int, steps: int,
                         dtype: torch.dtype = torch.bfloat16, seed: int = 0, device: str = "cpu",
                         max_drafts: int | None = None, lower_bound: float = -5.0) -> SimulationReport:
    """Run `steps` speculative decode steps through `step_fn`, then compare with `decode_reference`.

    Each step puts a random subset of the requests into random batch rows (the rest are padding rows with slot -1
    and garbage accepted counts), draws random projections for the bonus token and the drafts, calls `step_fn`
    with NaN-poisoned outputs, and draws each request's acceptance in [0, num_drafts] (with 2+ rows in the batch one
    accepts none and one accepts all). The draft cache starts as NaN, so reading a draft that was never written
    shows up. Committed tokens are each step's bonus plus its accepted drafts."""
    gen = torch.Generator().manual_seed(seed)
    h, kd, vd = heads, head_k_dim, head_v_dim
    weights = random_weights(h, kd, vd, gen, lower_bound)
    cache = KDADecodeCache.allocate(num_slots, h, kd, vd, max_drafts or max(num_drafts, 1), dtype, "cpu",
                                    replay_deltas=True)  # any variant may run, the `deltas` ones too
    cache.state.copy_(torch.randn(cache.state.shape, generator=gen))  # as if after prefill
    cache.conv_state.copy_(torch.randn(cache.conv_state.shape, generator=gen).to(dtype))
    cache.draft_proj.fill_(float("nan"))
    cache.draft_beta.fill_(float("nan"))
    slots = torch.randperm(num_slots, generator=gen)[:num_requests].tolist()
    init_state = {r: cache.state[slots[r]].clone() for r in range(num_requests)}
    init_conv = {r: cache.conv_state[slots[r]].clone() for r in range(num_requests)}
    cache = _to_device(cache, device)
    weights = _to_device(weights, device)

    pending = [0] * num_requests  # drafts accepted at the request's last step, replayed at its next one
    committed: dict[int, list[TokenInputs]] = {r: [] for r in range(num_requests)}
    outputs: dict[int, list[torch.Tensor]] = {r: [] for r in range(num_requests)}
    last_accept = [0] * num_requests
    report = SimulationReport(0.0, 0.0, 0.0, 0)
    for _ in range(steps):
        n_active = int(torch.randint(1, min(batch_rows, num_requests) + 1, (1,), generator=gen))
        active = torch.randperm(num_requests, generator=gen)[:n_active].tolist()
        rows = torch.randperm(batch_rows, generator=gen)[:n_active].tolist()
        row_request = {row: r for row, r in zip(rows, active)}
        report.padding_rows += batch_rows - n_active
        report.idle_request_steps += num_requests - n_active
        state_indices = torch.full((batch_rows,), -1, dtype=torch.int32)
        num_accepted = torch.randint(0, num_drafts + 1, (batch_rows,), generator=gen, dtype=torch.int32)
        for row, r in row_request.items():
            state_indices[row] = slots[r]
            num_accepted[row] = pending[r]
        x = TokenInputs.random((batch_rows, num_drafts + 1), h, kd, vd, dtype, gen)
        out = torch.full(x.gate.shape, float("nan"), dtype=dtype, device=device)
        o = step_fn(*(t.to(device) for t in x.as_tuple()), weights, cache, state_indices.to(device),
                    num_accepted.to(device), out=out).cpu()
        accept = _draw_acceptance(len(row_request), num_drafts, gen)
        for (row, r), a in zip(row_request.items(), accept):
            committed[r].append(x.select((row, slice(0, a + 1))))
            outputs[r].append(o[row, :a + 1])
            pending[r] = last_accept[r] = a
            report.accepted_counts.append(a)

    final_state, final_conv = cache.state.cpu(), cache.conv_state.cpu()
    o_errs, s_errs, c_errs = [], [], []
    for r in range(num_requests):  # the reference runs on `device` too (float64), then compares on the CPU
        if not committed[r]:
            continue
        tokens = TokenInputs.cat(committed[r])
        tokens = TokenInputs(*(t.to(device) for t in tokens.as_tuple()))
        certain = tokens.q.shape[0] - 1 - last_accept[r]  # the last bonus token: where the pool state stands
        ref_o, ref_state, ref_conv = decode_reference(tokens.select(slice(0, certain + 1)),
                                                      init_state[r].to(device), init_conv[r].to(device), weights)
        ref_o_tail, _, _ = decode_reference(tokens.select(slice(certain + 1, None)), ref_state, ref_conv, weights)
        report.committed_tokens += tokens.q.shape[0]
        o_errs.append((torch.cat(outputs[r]), torch.cat([ref_o.cpu(), ref_o_tail.cpu()])))
        s_errs.append((final_state[slots[r]], ref_state.cpu()))
        c_errs.append((final_conv[slots[r]], ref_conv.cpu()))
    report.output_error = _stacked_error(o_errs)
    report.state_error = _stacked_error(s_errs)
    report.conv_error = _stacked_error(c_errs)
    return report


def _draw_acceptance(n: int, num_drafts: int, gen: torch.Generator) -> list[int]:
    accept = torch.randint(0, num_drafts + 1, (n,), generator=gen).tolist()
    if n >= 2 and num_drafts > 0:  # mixed in one batch: someone rejects everything, someone accepts everything
        first, second = torch.randperm(n, generator=gen)[:2].tolist()
        accept[first], accept[second] = 0, num_drafts
    return accept


def _stacked_error(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    if not pairs:
        return 0.0
    return relative_error(torch.cat([a.reshape(-1) for a, _ in pairs]), torch.cat([b.reshape(-1) for _, b in pairs]))


def _to_device(obj, device: str):
    fields = {name: (value.to(device) if isinstance(value, torch.Tensor) else value)
              for name, value in vars(obj).items()}
    return type(obj)(**fields)
