"""KDA speculative decode step (minitriton.kernels.kda_decode): the kernel through the interpreter at small shapes,
driven by the simulator (random drafts, random acceptance, padding rows, reshuffled batches) against the
token-by-token float64 reference; the reference against the paper's matrix form; the simulator's ability to fail;
the host wrapper's graph-safety (it never reads device data). GPU tests at the end (`-m gpu`) run the compiled
kernel at the benchmark shapes and under CUDA-graph capture."""
from __future__ import annotations

import functools
import shutil
import sys
from pathlib import Path

import pytest
import torch

from minitriton.kernels import kda_decode
from minitriton.kernels.kda_decode import KDADecodeCache, KDADecodeWeights, kda_decode_step
from minitriton.kernels.kda_reference import (TokenInputs, decode_reference, random_weights, simulate_spec_decode,
                                              spec_decode_step_torch)

SMALL = dict(num_requests=4, batch_rows=3, num_slots=6, heads=2)
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINITRITON_INTERPRET", "1")


def clone_cache(cache: KDADecodeCache) -> KDADecodeCache:
    return cache.clone()


def on_device(obj, device: str):
    """A copy of a weights / cache dataclass with its tensors on `device`."""
    return type(obj)(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in vars(obj).items()})


def random_cache(num_slots: int, h: int, kd: int, vd: int, max_drafts: int, dtype: torch.dtype,
                 gen: torch.Generator) -> KDADecodeCache:
    return KDADecodeCache.allocate(num_slots, h, kd, vd, max_drafts, dtype, "cpu", replay_deltas=True).randomize_(gen)


# ------------------------------------------------------------------------------------------ the reference


def paper_form_step(x: TokenInputs, state: torch.Tensor, conv: torch.Tensor, w: KDADecodeWeights):
    """One token for one sequence written independently of kda_reference: explicit conv taps, and the paper's
    S' = (I - b k k^T) Diag(alpha) S + b k v^T on the K-first state S = state^T, o = S'^T q."""
    h, kd = x.q.shape
    vd = x.v.shape[-1]
    raw = torch.cat([x.q.reshape(-1), x.k.reshape(-1), x.v.reshape(-1)]).double()
    taps = w.conv_weight.double()
    y = taps[:, 3] * raw + sum(taps[:, i] * conv[i].double() for i in range(3))
    y = y * torch.sigmoid(y)
    qc, kc, vc = y[:h * kd].view(h, kd), y[h * kd:2 * h * kd].view(h, kd), y[2 * h * kd:].view(h, vd)
    o_all, s_all = [], []
    for head in range(h):
        q = qc[head] / (qc[head].square().sum() + 1e-6).sqrt() * kd ** -0.5
        k = kc[head] / (kc[head].square().sum() + 1e-6).sqrt()
        g = w.lower_bound * torch.sigmoid(w.a_log[head].double().exp()
                                          * (x.f[head].double() + w.dt_bias.double().view(h, kd)[head]))
        b = torch.sigmoid(x.beta[head].double())
        s_kf = state[head].double().T
        s_kf = (torch.eye(kd, dtype=torch.float64) - b * torch.outer(k, k)) @ torch.diag(g.exp()) @ s_kf \
            + b * torch.outer(k, vc[head])
        o = s_kf.T @ q
        o = o / (o.square().mean() + w.norm_eps).sqrt()
        o = o * w.o_norm_weight.double() * torch.sigmoid(x.gate[head].double())
        o_all.append(o)
        s_all.append(s_kf.T)
    return torch.stack(o_all), torch.stack(s_all), torch.cat([conv[1:].double(), raw[None]])


def test_reference_matches_the_paper_form() -> None:
    gen = torch.Generator().manual_seed(1)
    h, kd, vd = 3, 8, 16
    w = random_weights(h, kd, vd, gen)
    state = torch.randn(h, vd, kd, generator=gen, dtype=torch.float64)
    conv = torch.randn(3, 2 * h * kd + h * vd, generator=gen, dtype=torch.float64)
    tokens = TokenInputs.random((4,), h, kd, vd, torch.float64, gen)
    ref_o, ref_s, ref_c = decode_reference(tokens, state, conv, w)
    s, c = state, conv
    for t in range(4):
        o, s, c = paper_form_step(tokens.select(t), s, c, w)
        assert torch.allclose(o, ref_o[t], rtol=1e-10, atol=1e-12)
    assert torch.allclose(s, ref_s, rtol=1e-10, atol=1e-12)
    assert torch.equal(c, ref_c)


# ------------------------------------------------------------------------------------------ the simulator


def test_simulator_with_the_torch_step_matches_token_by_token() -> None:
    """The torch statement of the API (replay + new tokens + draft cache), fp32 everywhere: errors are fp32 rounding
    of the stored state only."""
    rep = simulate_spec_decode(spec_decode_step_torch, **SMALL, head_k_dim=8, head_v_dim=8, num_drafts=3, steps=20,
                               dtype=torch.float32, seed=3)
    assert rep.output_error < 1e-6 and rep.state_error < 1e-6 and rep.conv_error == 0
    assert 0 in rep.accepted_counts and 3 in rep.accepted_counts and rep.padding_rows > 0
    assert rep.idle_request_steps > 0


def no_replay(*args, out):  # forgets the accepted drafts
    args = list(args)
    args[9] = torch.zeros_like(args[9])
    return spec_decode_step_torch(*args, out=out)


def replays_one_too_many(*args, out):
    args = list(args)
    args[9] = (args[9] + 1).clamp_max(args[7].max_drafts)
    return spec_decode_step_torch(*args, out=out)


def ignores_slots(*args, out):  # every row uses slot = row (the batch was reshuffled, so this is wrong)
    args = list(args)
    idx = args[8]
    args[8] = torch.where(idx >= 0, torch.arange(idx.numel(), dtype=idx.dtype), idx)
    return spec_decode_step_torch(*args, out=out)


@pytest.mark.parametrize("broken", [no_replay, replays_one_too_many, ignores_slots])
def test_simulator_catches_broken_steps(broken) -> None:
    rep = simulate_spec_decode(broken, **SMALL, head_k_dim=8, head_v_dim=8, num_drafts=3, steps=8,
                               dtype=torch.float32, seed=4)
    assert max(rep.output_error, rep.state_error) > 0.05 or rep.output_error != rep.output_error  # NaN counts


# ------------------------------------------------------------------------------------------ the kernel


def test_kernel_plain_decode_fp32(interpret: None) -> None:
    """k = 0 (no speculation): each step is one token per request."""
    rep = simulate_spec_decode(kda_decode_step, **SMALL, head_k_dim=16, head_v_dim=16, num_drafts=0, steps=6,
                               dtype=torch.float32, seed=5)
    assert rep.output_error < 2e-5 and rep.state_error < 2e-5 and rep.conv_error == 0, rep


@pytest.mark.parametrize("variant,kd,vd", [("stream", 32, 32), ("stream_l32_pf2", 32, 256), ("loop", 16, 16)])
def test_kernel_plain_decode_variants_bf16_20_steps(interpret: None, variant: str, kd: int, vd: int) -> None:
    """k = 0 through each kernel variant (the streamed T = 1 kernel in 2 chunks, in 4 chunks each loaded 2 ahead, and
    the general kernel), bf16, 20 steps: the simulator's bounds."""
    step = functools.partial(kda_decode_step, variant=variant)
    rep = simulate_spec_decode(step, **SMALL, head_k_dim=kd, head_v_dim=vd, num_drafts=0, steps=20,
                               dtype=torch.bfloat16, seed=14)
    assert rep.output_error <= 1e-2 and rep.state_error <= 2e-3 and rep.conv_error == 0, rep
    assert rep.committed_tokens >= 30


@pytest.mark.parametrize("lower_bound", [-5.0, -20.0])
def test_t1_kernel_replays_accepted_drafts(interpret: None, lower_bound: float) -> None:
    """A k = 0 step after a step that drafted (num_accepted > 0): the streamed kernel replays the drafts chunk by
    chunk (4 chunks here; -20 renormalizes every 2 drafts) and matches the torch step, cache included."""
    gen = torch.Generator().manual_seed(15)
    h, kd, vd, drafts, rows = 2, 32, 64, 5, 4
    assert kda_decode.state_chunk_rows(vd, 4, kda_decode.state_k_split(kd)[0], 1) == vd // 4
    w = random_weights(h, kd, vd, gen, lower_bound)
    cache = random_cache(6, h, kd, vd, drafts, torch.float32, gen)
    expected = clone_cache(cache)
    x = TokenInputs.random((rows, 1), h, kd, vd, torch.float32, gen)
    idx = torch.tensor([5, -1, 0, 2], dtype=torch.int32)
    acc = torch.tensor([5, 2, 0, 3], dtype=torch.int32)
    out = torch.full_like(x.gate, float("nan"))
    kda_decode_step(*x.as_tuple(), w, cache, idx, acc, out=out)
    ref = spec_decode_step_torch(*x.as_tuple(), w, expected, idx, acc, out=torch.full_like(x.gate, float("nan")))
    live = idx >= 0
    assert torch.allclose(out[live], ref[live], rtol=1e-5, atol=1e-5)
    assert out[~live].isnan().all()
    for name in ("state", "conv_state", "draft_proj", "draft_beta"):
        assert torch.allclose(getattr(cache, name), getattr(expected, name), rtol=1e-5, atol=1e-5), name


def test_kernel_spec_decode_bf16_20_steps(interpret: None) -> None:
    """The issue's acceptance test at CI shapes: 20 steps, K = V = 16, H = 2, B = 3, 3 drafts, bf16 activations,
    acceptance 0 / all / mixed in one batch, padding rows, requests moving between rows and sitting out steps."""
    rep = simulate_spec_decode(kda_decode_step, **SMALL, head_k_dim=16, head_v_dim=16, num_drafts=3, steps=20,
                               dtype=torch.bfloat16, seed=6)
    assert rep.output_error <= 1e-2, rep  # bf16 outputs
    assert rep.state_error <= 2e-3, rep  # fp32 state
    assert rep.conv_error == 0, rep  # the conv window holds raw bf16 inputs: exact
    assert 0 in rep.accepted_counts and 3 in rep.accepted_counts and rep.padding_rows > 0
    assert rep.committed_tokens > 60


def test_kernel_spec_decode_fp32_7_drafts_k32(interpret: None) -> None:
    rep = simulate_spec_decode(kda_decode_step, num_requests=3, batch_rows=3, num_slots=4, heads=2, head_k_dim=32,
                               head_v_dim=32, num_drafts=7, steps=6, dtype=torch.float32, seed=7)
    assert rep.output_error < 2e-5 and rep.state_error < 2e-5 and rep.conv_error == 0, rep
    assert 0 in rep.accepted_counts and 7 in rep.accepted_counts


def test_kernel_k_differs_from_v_and_small_draft_count(interpret: None) -> None:
    """K != V, and a step with fewer drafts (1) than the draft cache holds (3)."""
    rep = simulate_spec_decode(kda_decode_step, **SMALL, head_k_dim=8, head_v_dim=16, num_drafts=1, steps=6,
                               dtype=torch.float32, seed=8, max_drafts=3)
    assert rep.output_error < 2e-5 and rep.state_error < 2e-5 and rep.conv_error == 0, rep


@pytest.mark.parametrize("variant", [None, "stream_l32_pf2_delta"])
@pytest.mark.parametrize("lower_bound", [-20.0, -39.0])
def test_kernel_deferred_decay_renormalizes(interpret: None, lower_bound: float, variant: str | None) -> None:
    """Strong gates renormalize the deferred decay every 2 tokens (-20) or every token (-39), inside the replay and
    the draft loops (at -5, 7 drafts never reach the period of 8): the results still match the reference. With
    cached deltas the replay folds each run's D where the drafts' loop did."""
    assert kda_decode.renorm_period(lower_bound) == (2 if lower_bound == -20.0 else 1)
    step = functools.partial(kda_decode_step, variant=variant)
    rep = simulate_spec_decode(step, **SMALL, head_k_dim=16, head_v_dim=16, num_drafts=5, steps=8,
                               dtype=torch.float32, seed=13, lower_bound=lower_bound)
    assert rep.output_error < 2e-5 and rep.state_error < 2e-5 and rep.conv_error == 0, rep


def check_step_against_torch(seed: int, kd: int, vd: int, drafts: int, accepted: list[int],
                             variant: str | None = None) -> None:
    """One step from a random cache (random committed state, conv window, and stale drafts in every slot; rows use
    slots 5, -1 (padding), 0, 2): outputs, state, conv window and draft cache equal the torch step's; padding rows
    and the slots not in the batch (1, 3, 4) are untouched."""
    gen = torch.Generator().manual_seed(seed)
    h = 2
    w = random_weights(h, kd, vd, gen)
    cache = random_cache(6, h, kd, vd, drafts, torch.float32, gen)
    expected = clone_cache(cache)
    x = TokenInputs.random((4, drafts + 1), h, kd, vd, torch.float32, gen)
    state_indices = torch.tensor([5, -1, 0, 2], dtype=torch.int32)
    num_accepted = torch.tensor(accepted, dtype=torch.int32)
    out = torch.full_like(x.gate, float("nan"))
    kda_decode_step(*x.as_tuple(), w, cache, state_indices, num_accepted, out=out, variant=variant)
    ref = spec_decode_step_torch(*x.as_tuple(), w, expected, state_indices, num_accepted,
                                 out=torch.full_like(x.gate, float("nan")))
    live = state_indices >= 0
    assert torch.allclose(out[live], ref[live], rtol=1e-5, atol=1e-5)
    assert out[~live].isnan().all()  # padding rows are not written
    for name in ("state", "conv_state", "draft_proj", "draft_beta"):
        got, want = getattr(cache, name), getattr(expected, name)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), name
    for slot in (1, 3, 4):  # not in the batch
        assert torch.equal(cache.state[slot], expected.state[slot])


@pytest.mark.parametrize("variant", [None, "stream_l32_pf2_delta"])
def test_kernel_step_matches_torch_step_including_the_cache(interpret: None, variant: str | None) -> None:
    """The default kernel, 3 drafts (3 / 2 / 0 / 1 accepted), K = V = 16; the delta variant replays the random
    cache's stale drafts from their raw projections (they have no delta rows) and writes its drafts' rows."""
    check_step_against_torch(9, 16, 16, 3, [3, 2, 0, 1], variant=variant)


@pytest.mark.parametrize("variant,kd,vd,dtype,drafts,steps", [
    ("stream_scratch", 16, 16, torch.bfloat16, 3, 20),  # one chunk of 16 rows
    ("stream_scratch", 32, 64, torch.bfloat16, 3, 20),  # 4 chunks of 16 rows (4 warps, KL = 8)
    ("stream_scratch_vc64", 32, 64, torch.float32, 7, 8),  # 2 chunks of 32 rows (2 rows per lane group), fp32
    ("chunked", 16, 16, torch.bfloat16, 3, 20),  # WY chunks of 4 rows (TR = TN = 4)
    ("chunked", 32, 64, torch.float32, 7, 8),  # WY chunks of 8 rows, fp32: against the recurrence to 2e-5
    ("chunked_tc", 16, 16, torch.bfloat16, 3, 20),  # the whole state at once, chunks padded to 8 rows
    ("chunked_tc", 32, 64, torch.float32, 7, 8),  # tf32x3 products (emulated): still within 2e-5 of fp32
    ("staged", 16, 16, torch.bfloat16, 3, 20),  # the whole state in registers, vectors staged up front (4 warps)
    ("staged", 32, 64, torch.float32, 7, 8),  # 2 state rows per thread (outputs packed from 2 registers)
    ("staged_col", 32, 64, torch.float32, 7, 8),  # a V column per thread (2 warps): no shuffle in the token loops
    ("staged_col", 16, 32, torch.bfloat16, 3, 20),  # one warp
    ("stream_l32_pf2_delta", 16, 16, torch.bfloat16, 3, 20),  # the loop kernel replaying cached deltas
    ("stream_l32_pf2_delta", 32, 64, torch.float32, 7, 8),
    ("stream_l32_pf2_delta_rpf", 16, 16, torch.bfloat16, 3, 20),  # the same with its rows prefetched into L1
    ("stream_l32_pf2_rpf", 32, 64, torch.float32, 7, 8),  # the raw replay with its rows prefetched
])
def test_t_gt_1_kernels_spec_decode(interpret: None, variant: str, kd: int, vd: int, dtype: torch.dtype,
                                    drafts: int, steps: int) -> None:
    """The other T > 1 kernels through the simulator: `kda_decode_scratch_kernel` (per-token vectors staged in a
    scratch, the state in V chunks), `kda_decode_chunked_kernel` (replayed drafts and new tokens as two WY
    chunks, kda_chunked_reference.py) and `kda_decode_staged_kernel` (the whole state in registers, the per-token
    vectors staged in a scratch up front, no barrier in the token loops). Random acceptance (0, all, mixed), padding
    rows, requests moving between rows."""
    step = functools.partial(kda_decode_step, variant=variant)
    rep = simulate_spec_decode(step, **SMALL, head_k_dim=kd, head_v_dim=vd, num_drafts=drafts, steps=steps,
                               dtype=dtype, seed=16)
    if dtype == torch.bfloat16:
        assert rep.output_error <= 1e-2 and rep.state_error <= 2e-3 and rep.conv_error == 0, rep
    else:
        assert rep.output_error < 2e-5 and rep.state_error < 2e-5 and rep.conv_error == 0, rep
    assert 0 in rep.accepted_counts and drafts in rep.accepted_counts and rep.padding_rows > 0


@pytest.mark.parametrize("lower_bound", [-20.0, -39.0])
def test_scratch_kernel_deferred_decay_renormalizes(interpret: None, lower_bound: float) -> None:
    """Strong gates end a run of the deferred decay every 2 tokens (-20) or every token (-39): the scratch kernel
    folds each run's D column into the chunk, in the replay and in the drafts, and still matches the reference."""
    step = functools.partial(kda_decode_step, variant="stream_scratch")
    rep = simulate_spec_decode(step, **SMALL, head_k_dim=16, head_v_dim=32, num_drafts=5, steps=8,
                               dtype=torch.float32, seed=13, lower_bound=lower_bound)
    assert rep.output_error < 2e-5 and rep.state_error < 2e-5 and rep.conv_error == 0, rep
    assert max(rep.accepted_counts) >= 3


@pytest.mark.parametrize("lower_bound,one_run", [(-5.0, True), (-6.0, True), (-10.0, False), (-20.0, False),
                                                 (-39.0, False)])
def test_staged_kernel_runs_of_the_deferred_decay(interpret: None, lower_bound: float, one_run: bool) -> None:
    """The staged kernel's runs of the deferred decay (5 drafts): ONE_RUN when the replayed drafts (5) and the new
    tokens (6) each fit `renorm_period` (-5: 8, -6: 6), else runs of 4 (-10), 2 (-20) or 1 (-39) inside the replay
    and the new tokens, folded between runs (cumsum / cummin in the prologue): all match."""
    assert kda_decode.staged_one_run(5, 6, lower_bound) == one_run
    step = functools.partial(kda_decode_step, variant="staged")
    rep = simulate_spec_decode(step, **SMALL, head_k_dim=16, head_v_dim=32, num_drafts=5, steps=8,
                               dtype=torch.float32, seed=25, lower_bound=lower_bound)
    assert rep.output_error < 2e-5 and rep.state_error < 2e-5 and rep.conv_error == 0, rep
    assert 0 in rep.accepted_counts and 5 in rep.accepted_counts


STAGED_L1 = ["staged_cg", "staged_pf", "staged_pf_rows", "staged_pf_sec", "staged_pf1", "staged_pf2", "staged_touch",
             "staged_pf_late"]


@pytest.mark.parametrize("variant", ["staged_pf_late"])
def test_staged_kernel_with_its_rows_in_l1_matches_the_reference(interpret: None, variant: str) -> None:
    """A staged variant that brings what the prologue wrote into L1 (the conv taps, the sequence area and the token
    rows prefetched, the state prefetched into L2 and loaded after the prologue: every prefetch staged_pf has)
    computes what `staged` does: 7 drafts, fp32, through the simulator. The interpreter checks every prefetched
    address as it checks a load's (a prefetch past the scratch would raise). staged_pf1 and staged_touch run in
    the interpreter as the PTX simulator tests' reference, staged_pf2 in the next test; staged_cg, staged_pf,
    staged_pf_rows and staged_pf_sec differ from these only in constants the host wrapper test checks."""
    step = functools.partial(kda_decode_step, variant=variant)
    rep = simulate_spec_decode(step, **SMALL, head_k_dim=32, head_v_dim=64, num_drafts=7, steps=8,
                               dtype=torch.float32, seed=16)
    assert rep.output_error < 2e-5 and rep.state_error < 2e-5 and rep.conv_error == 0, rep
    assert 0 in rep.accepted_counts and 7 in rep.accepted_counts


def test_staged_kernel_prefetch_per_token_without_one_run(interpret: None) -> None:
    """Runs of 2 (-20: not ONE_RUN): `staged_pf2` prefetches the item's rows at once instead (still correct)."""
    step = functools.partial(kda_decode_step, variant="staged_pf2")
    rep = simulate_spec_decode(step, **SMALL, head_k_dim=16, head_v_dim=32, num_drafts=5, steps=6,
                               dtype=torch.float32, seed=25, lower_bound=-20.0)
    assert rep.output_error < 2e-5 and rep.state_error < 2e-5 and rep.conv_error == 0, rep


@pytest.mark.parametrize("variant", ["staged", "staged_col"])
def test_staged_kernel_step_matches_torch_step_including_the_cache(interpret: None, variant: str) -> None:
    """`staged` (and on the column-owner state), 5 drafts (5 / 2 / 0 / 3 accepted), K = 32, V = 64: outputs,
    state, conv window, draft cache."""
    check_step_against_torch(23, 32, 64, 5, [5, 2, 0, 3], variant=variant)


@pytest.mark.parametrize("lower_bound", [-10.0, -39.0])
def test_column_owner_staged_kernel_runs_of_the_deferred_decay(interpret: None, lower_bound: float) -> None:
    """`staged_col` where the deferred decay's runs are shorter than the step (not ONE_RUN: folds in both halves)."""
    step = functools.partial(kda_decode_step, variant="staged_col")
    rep = simulate_spec_decode(step, **SMALL, head_k_dim=16, head_v_dim=32, num_drafts=5, steps=8,
                               dtype=torch.float32, seed=17, lower_bound=lower_bound)
    assert rep.output_error < 2e-5 and rep.state_error < 2e-5 and rep.conv_error == 0, rep


def test_scratch_kernel_step_matches_torch_step_including_the_cache(interpret: None) -> None:
    """`stream_scratch`, 5 drafts (5 / 2 / 0 / 3 accepted), K = 32, V = 64: 4 chunks."""
    check_step_against_torch(17, 32, 64, 5, [5, 2, 0, 3], variant="stream_scratch")


def test_chunked_kernel_step_matches_torch_step_including_the_cache(interpret: None) -> None:
    """"chunked", 5 drafts (5 / 2 / 0 / 3 accepted), K = 32, V = 64."""
    check_step_against_torch(19, 32, 64, 5, [5, 2, 0, 3], variant="chunked")


def test_chunked_kernel_falls_back_when_the_decay_would_overflow(interpret: None) -> None:
    """Chunks whose cumulative log-decay could pass CHUNK_MAX_LOG_DECAY (e^-G would overflow fp32) run the loop
    kernel instead; K3's floor (-5) with 8-row chunks takes the chunked kernel."""
    assert kda_decode._chunks_fit(7, 8, -5.0) and not kda_decode._chunks_fit(7, 8, -20.0)
    assert not kda_decode._chunks_fit(31, 8, -1.0)  # 32 rows: more than the inverse's doublings cover
    step = functools.partial(kda_decode_step, variant="chunked")
    rep = simulate_spec_decode(step, **SMALL, head_k_dim=16, head_v_dim=16, num_drafts=5, steps=6,
                               dtype=torch.float32, seed=21, lower_bound=-20.0)
    assert rep.output_error < 2e-5 and rep.state_error < 2e-5 and rep.conv_error == 0, rep


@pytest.mark.parametrize("variant", [None, "stream_scratch", "staged"])
def test_kernel_num_accepted_int64_and_clamped(interpret: None, variant: str | None) -> None:
    """num_accepted may be int64; values past the draft cache are clamped to it (never read out of bounds)."""
    gen = torch.Generator().manual_seed(10)
    h, kd, vd, drafts = 2, 8, 8, 2
    w = random_weights(h, kd, vd, gen)
    cache = random_cache(3, h, kd, vd, drafts, torch.float32, gen)
    expected = clone_cache(cache)
    x = TokenInputs.random((2, drafts + 1), h, kd, vd, torch.float32, gen)
    idx = torch.tensor([2, 0], dtype=torch.int64)
    out = kda_decode_step(*x.as_tuple(), w, cache, idx, torch.tensor([9, -3]), variant=variant)
    ref = spec_decode_step_torch(*x.as_tuple(), w, expected, idx, torch.tensor([2, 0]))
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5)
    assert torch.allclose(cache.state, expected.state, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------ the host wrapper


class RecordingKernel:
    """Stands in for the compiled kernel: records the launch instead of running it."""

    def __init__(self) -> None:
        self.launches: list[tuple] = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((grid, args, kwargs))


def meta_step_inputs(b: int, t: int, h: int, kd: int, vd: int, drafts: int):
    m = dict(device="meta")
    x = [torch.empty(b, t, h, kd, dtype=torch.bfloat16, **m), torch.empty(b, t, h, kd, dtype=torch.bfloat16, **m),
         torch.empty(b, t, h, vd, dtype=torch.bfloat16, **m), torch.empty(b, t, h, kd, dtype=torch.bfloat16, **m),
         torch.empty(b, t, h, dtype=torch.bfloat16, **m), torch.empty(b, t, h, vd, dtype=torch.bfloat16, **m)]
    c = 2 * h * kd + h * vd
    w = KDADecodeWeights(torch.empty(c, 1, 4, **m), torch.empty(128, **m), torch.empty(h * kd, **m),
                         torch.empty(vd, **m))
    cache = KDADecodeCache.allocate(b + 5, h, kd, vd, drafts, torch.bfloat16, "meta", replay_deltas=True)
    idx = torch.empty(b, dtype=torch.int32, **m)
    return x, w, cache, idx, torch.empty(b, dtype=torch.int32, **m)


def test_host_wrapper_reads_no_device_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """Graph capture needs a launch that never syncs: on 'meta' tensors any read of the data would raise."""
    fake = RecordingKernel()
    monkeypatch.setattr(kda_decode, "kda_decode_step_kernel", fake)
    x, w, cache, idx, acc = meta_step_inputs(b=5, t=8, h=96, kd=128, vd=128, drafts=7)
    out = kda_decode_step(*x, w, cache, idx, acc)
    assert out.shape == (5, 8, 96, 128) and out.dtype == torch.bfloat16
    (grid, args, kwargs), = fake.launches
    assert grid == (96, 5)
    # the default (stream_l32_pf2_rpf): 8 rows (7 drafts, 8 tokens) of 16 lines (a 1.5 KB delta row) prefetched
    assert kwargs == dict(H=96, K=128, V=128, NUM_DRAFTS=7, MAX_DRAFTS=7, KL=8, KV=4, num_warps=8, ROWS_PREFETCH=8,
                          PL=16)
    assert args[-5] == pytest.approx(128 ** -0.5) and args[-4] == -5.0 and args[-2] == 8  # renorm every 40/5
    assert args[-1] is cache.state  # the delta rows' pointer, unused without WRITE_DELTAS


def test_host_wrapper_keeps_track_of_the_drafts_deltas(monkeypatch: pytest.MonkeyPatch) -> None:
    """A `deltas` variant at k >= 1 launches the loop kernel writing delta rows, replaying from them only when the
    cache's drafts have them; any step that writes drafts records whether they do; k = 0 changes nothing; a cache
    without delta rows is refused by name."""
    general, streamed = RecordingKernel(), RecordingKernel()
    monkeypatch.setattr(kda_decode, "kda_decode_step_kernel", general)
    monkeypatch.setattr(kda_decode, "kda_decode_t1_kernel", streamed)
    x, w, cache, idx, acc = meta_step_inputs(b=5, t=8, h=96, kd=128, vd=128, drafts=7)
    delta = functools.partial(kda_decode_step, *x, w, cache, idx, acc, variant="stream_l32_pf2_delta")
    replays = []
    for step in (delta, delta, functools.partial(kda_decode_step, *x, w, cache, idx, acc), delta):
        step()
        (_, args, kwargs) = general.launches[-1]
        assert args[-1] is cache.draft_delta or "WRITE_DELTAS" not in kwargs
        replays.append((kwargs.get("WRITE_DELTAS"), kwargs.get("REPLAY_DELTAS"), cache.drafts_have_deltas))
    # a fresh cache has no drafts to replay (deltas trivially); the default variant's drafts have none
    assert replays == [(True, True, True), (True, True, True), (None, None, False), (True, False, True)]
    x1, _, _, _, _ = meta_step_inputs(b=5, t=1, h=96, kd=128, vd=128, drafts=7)
    kda_decode_step(*x1, w, cache, idx, acc, variant="stream_l32_pf2_delta")
    assert len(streamed.launches) == 1 and cache.drafts_have_deltas
    cache.draft_delta = None
    with pytest.raises(ValueError, match="needs draft_delta"):
        delta()
    # the delta rows are opt-in: a plain cache has none (16% of the cache at K = V = 128)
    assert KDADecodeCache.allocate(2, 96, 128, 128, 7, torch.bfloat16, "meta").draft_delta is None


def test_host_wrapper_launches_the_persistent_scratch_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """variant="stream_scratch" at k = 7 launches `kda_decode_scratch_kernel` on a persistent grid (2 programs off
    the GPU) over the B * H items, with one scratch per program, reading no device data (meta tensors); k = 0
    still runs the streamed T = 1 kernel."""
    fake = RecordingKernel()
    monkeypatch.setattr(kda_decode, "kda_decode_scratch_kernel", fake)
    x, w, cache, idx, acc = meta_step_inputs(b=5, t=8, h=96, kd=128, vd=128, drafts=7)
    kda_decode_step(*x, w, cache, idx, acc, variant="stream_scratch")
    (grid, args, kwargs), = fake.launches
    assert grid == (2,)
    assert kwargs == dict(H=96, K=128, V=128, NUM_DRAFTS=7, MAX_DRAFTS=7, KL=8, KV=4, VC=32, TP=16, TN=8,
                          num_warps=8)
    scratch, items = args[-2:]
    assert items == 5 * 96 and scratch.dtype == torch.float32
    assert scratch.numel() == 2 * kda_decode.scratch_floats(128, 128, 7, 8) == 2 * (16 * 772 + 19 * 384)
    kda_decode_step(*x, w, cache, idx, acc, variant="stream_scratch_vc64")
    assert fake.launches[-1][2]["VC"] == 64
    t1 = RecordingKernel()
    monkeypatch.setattr(kda_decode, "kda_decode_t1_kernel", t1)
    x, w, cache, idx, acc = meta_step_inputs(b=5, t=1, h=96, kd=128, vd=128, drafts=7)
    kda_decode_step(*x, w, cache, idx, acc, variant="stream_scratch")
    assert len(t1.launches) == 1 and len(fake.launches) == 2


def test_host_wrapper_launches_the_persistent_staged_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """variant="staged" at k = 7 launches `kda_decode_staged_kernel` on a persistent grid (2 programs off the GPU)
    with one scratch per program (74.5 KB at K3), reading no device data; ONE_RUN at K3's -5 (runs of 8), not at
    -20 (runs of 2); k = 0 runs the streamed T = 1 kernel as stream_l32_pf2 does."""
    fake = RecordingKernel()
    monkeypatch.setattr(kda_decode, "kda_decode_staged_kernel", fake)
    x, w, cache, idx, acc = meta_step_inputs(b=5, t=8, h=96, kd=128, vd=128, drafts=7)
    kda_decode_step(*x, w, cache, idx, acc, variant="staged")
    (grid, args, kwargs), = fake.launches
    assert grid == (2,)
    assert kwargs == dict(H=96, K=128, V=128, NUM_DRAFTS=7, MAX_DRAFTS=7, KL=8, KV=4, TH=8, TN=8, OR=4,
                          ONE_RUN=True, num_warps=8)
    scratch, items = args[-2:]
    assert items == 5 * 96 and scratch.dtype == torch.float32
    assert scratch.numel() == 2 * kda_decode.staged_scratch_floats(128, 128, 7, 8, 8) == 2 * (16 * 644 + 8 * 128
                                                                                              + 19 * 384)
    # at least 8 rows a half at K3 (the prologue's tiles stay coalescing anchors), more when the drafts need them
    assert [kda_decode.staged_half_rows(d, d + 1, 128, 8) for d in (1, 3, 7, 9)] == [8, 8, 8, 16]
    assert kda_decode.staged_one_run(7, 8, -5.0) and not kda_decode.staged_one_run(7, 8, -6.0)  # runs of 8 / 6
    w.lower_bound = -20.0
    kda_decode_step(*x, w, cache, idx, acc, variant="staged")
    assert fake.launches[-1][2]["ONE_RUN"] is False
    t1 = RecordingKernel()
    monkeypatch.setattr(kda_decode, "kda_decode_t1_kernel", t1)
    x, w, cache, idx, acc = meta_step_inputs(b=5, t=1, h=96, kd=128, vd=128, drafts=7)
    kda_decode_step(*x, w, cache, idx, acc, variant="staged")
    assert len(t1.launches) == 1 and len(fake.launches) == 2
    assert t1.launches[0][2]["KL"] == 32 and t1.launches[0][2]["PREFETCH"] == 2  # as stream_l32_pf2


def test_host_wrapper_passes_the_staged_prefetch_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """The L1 variants launch the same kernel with their prefetch constexprs (K3, k = 7: 16 token rows of 644
    floats are 322 lines, 512 pointers, or 1288 sectors, 2048; per token 21 line steps plus the row's last float,
    32; the sequence area's 19 rows of 384 floats 228 lines, 256, or 912 sectors, 1024); `staged` passes none of
    them (it compiles exactly as before they existed)."""
    fake = RecordingKernel()
    monkeypatch.setattr(kda_decode, "kda_decode_staged_kernel", fake)
    x, w, cache, idx, acc = meta_step_inputs(b=5, t=8, h=96, kd=128, vd=128, drafts=7)
    want = {"staged": {}, "staged_cg": dict(STATE_CACHE=".cg"),
            "staged_pf": dict(PREFETCH=1, PF=32, NPF=512, NPS=256, STATE_CACHE=".cg"),
            "staged_pf_rows": dict(PREFETCH=1, PF=32, NPF=512, STATE_CACHE=".cg"),
            "staged_pf_sec": dict(PREFETCH=1, PF=8, NPF=2048, NPS=1024, STATE_CACHE=".cg"),
            "staged_pf1": dict(PREFETCH=2, PF=32, NPF=32, AHEAD=1, NPS=256, STATE_CACHE=".cg"),
            "staged_pf2": dict(PREFETCH=2, PF=32, NPF=32, AHEAD=2, NPS=256, STATE_CACHE=".cg"),
            "staged_touch": dict(PREFETCH=3, PF=32, NPF=512, NPS=256, STATE_CACHE=".cg"),
            "staged_pf_late": dict(PREFETCH=1, PF=32, NPF=512, NPS=256, STATE_CACHE=".cg", LATE_STATE=True)}
    assert set(want) == {"staged", *STAGED_L1}
    for variant, options in want.items():
        kda_decode_step(*x, w, cache, idx, acc, variant=variant)
        kwargs = fake.launches[-1][2]
        names = ("PREFETCH", "PF", "NPF", "AHEAD", "NPS", "STATE_CACHE", "LATE_STATE")
        assert {k: kwargs[k] for k in kwargs if k in names} == options


def test_host_wrapper_dispatches_k0_to_the_streamed_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """k = 0 with variant="stream" launches the streamed T = 1 kernel (32-row chunks at K = V = 128, 8 warps),
    reading no device data; variant="loop" launches the general kernel instead; an unknown variant is rejected."""
    streamed, general = RecordingKernel(), RecordingKernel()
    monkeypatch.setattr(kda_decode, "kda_decode_t1_kernel", streamed)
    monkeypatch.setattr(kda_decode, "kda_decode_step_kernel", general)
    x, w, cache, idx, acc = meta_step_inputs(b=5, t=1, h=96, kd=128, vd=128, drafts=7)
    kda_decode_step(*x, w, cache, idx, acc, variant="stream")
    (grid, _, kwargs), = streamed.launches
    assert grid == (96, 5) and not general.launches
    assert kwargs == dict(H=96, K=128, V=128, MAX_DRAFTS=7, KL=8, KV=4, VC=32, PREFETCH=1, num_warps=8)
    kda_decode_step(*x, w, cache, idx, acc, variant="loop")
    (_, _, kwargs), = general.launches
    assert kwargs["NUM_DRAFTS"] == 0 and len(streamed.launches) == 1
    with pytest.raises(ValueError, match="unknown variant"):
        kda_decode_step(*x, w, cache, idx, acc, variant="nope")


@pytest.mark.parametrize("problem", ["drafts", "state_dtype", "beta_shape", "noncontig", "idx_float"])
def test_host_wrapper_rejects_bad_inputs(problem: str) -> None:
    x, w, cache, idx, acc = meta_step_inputs(b=2, t=4, h=2, kd=16, vd=16, drafts=3)
    if problem == "drafts":
        cache = KDADecodeCache.allocate(4, 2, 16, 16, 2, torch.bfloat16, "meta")
    elif problem == "state_dtype":
        cache.state = cache.state.to(torch.bfloat16)
    elif problem == "beta_shape":
        x[4] = x[4][..., None]
    elif problem == "noncontig":
        x[0] = x[0].transpose(1, 2).contiguous().transpose(1, 2)
    elif problem == "idx_float":
        idx = idx.float()
    with pytest.raises(ValueError, match="kda_decode_step"):
        kda_decode_step(*x, w, cache, idx, acc)


def test_aot_specializations_build_ir() -> None:
    """The K3-shape specializations (H = 96, K = V = 128, 0 and 7 drafts) go through the frontend and passes."""
    for spec in kda_decode.kda_decode_step_kernel.specializations:
        assert spec.compile(target="ir").metadata is not None


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on PATH")
def test_k3_kernel_fits_two_programs_per_sm() -> None:
    """The kernel asks for 2 resident programs per SM (`.minnctapersm 2`, so one program's state loads and stores
    overlap another's token loop): at the K3 shape with 7 drafts ptxas must fit 8 warps in 128 registers.
    (Spill traffic is allowed: ptxas keeps it out of the inner token loops; docs/kernels/kda_decode.md.)"""
    spec = kda_decode.kda_decode_step_kernel.specializations[-1]
    assert spec.constexprs["NUM_DRAFTS"] == 7 and spec.num_warps == 8
    compiled = spec.compile(target="cubin")
    assert ".minnctapersm 2" in compiled.ptx
    assert compiled.metadata["registers"] <= 128


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on PATH")
def test_k3_t1_kernel_fits_two_programs_per_sm_without_spills() -> None:
    """The streamed T = 1 kernel at the K3 shape (variant "stream" for k = 0) holds a 32-row chunk of the state
    (16 registers) plus the next chunk in flight: ptxas fits 8 warps in 128 registers with no spills at all."""
    spec, = kda_decode.kda_decode_t1_kernel.specializations
    v = kda_decode.VARIANTS["stream"]
    assert v.t1_kernel == "kda_decode_t1_kernel" and spec.num_warps == v.t1_warps == 8
    assert spec.constexprs["VC"] == kda_decode.state_chunk_rows(128, 8, spec.constexprs["KL"], v.t1_rows) == 32
    compiled = spec.compile(target="cubin")
    assert ".minnctapersm 2" in compiled.ptx
    assert compiled.metadata["registers"] <= 128, compiled.report()
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.report()


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on PATH")
@pytest.mark.parametrize("vc", [32, 64])
def test_k3_scratch_kernel_fits_two_programs_per_sm(vc: int) -> None:
    """The persistent T > 1 kernel at the K3 shape (k = 7, chunks of 32 / 64 rows): 8 warps in 128 registers for
    2 programs per SM. ptxas spills a few per-item values (40 / 56 B, stored and reloaded outside the chunk and
    token loops: docs/kernels/kda_decode.md); the bound keeps that from growing."""
    spec, = [s for s in kda_decode.kda_decode_scratch_kernel.specializations if s.constexprs["VC"] == vc]
    assert spec.constexprs["NUM_DRAFTS"] == 7 and spec.num_warps == 8
    compiled = spec.compile(target="cubin")
    assert ".minnctapersm 2" in compiled.ptx
    assert compiled.metadata["registers"] <= 128, compiled.report()
    assert compiled.metadata["spill_stores"] <= 64 and compiled.metadata["spill_loads"] <= 64, compiled.report()


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on PATH")
def test_k3_staged_kernel_fits_two_programs_per_sm() -> None:
    """The staged kernel at the K3 shape (k = 1, 3, 7, ONE_RUN): the whole state (64 registers) plus a token's
    columns in 128 registers, for 2 programs of 8 warps per SM. ptxas spills 308-336 B, prologue values and part of
    the state across the prologue (none in the token loops: nvdisasm, docs/kernels/kda_decode.md); the bound keeps
    that from growing."""
    specs = kda_decode.kda_decode_staged_kernel.specializations
    assert [s.constexprs["NUM_DRAFTS"] for s in specs] == [1, 3, 7]  # k = 1 / 3 once spilled 5-9 KB (TH < 8)
    for spec in specs:
        assert spec.constexprs["ONE_RUN"] and spec.constexprs["TH"] == 8 and spec.num_warps == 8
        compiled = spec.compile(target="cubin")
        assert ".minnctapersm 2" in compiled.ptx
        assert compiled.metadata["registers"] <= 128, compiled.report()
        assert compiled.metadata["spill_stores"] <= 384 and compiled.metadata["spill_loads"] <= 384, compiled.report()


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on PATH")
@pytest.mark.parametrize("variant", ["staged_pf_late"])  # staged_pf1 too when its loops change (~3 s each)
def test_k3_staged_prefetch_variants_fit_like_staged(variant: str) -> None:
    """staged_pf_late (the sequence area and the token rows prefetched after the prologue's barriers, the state
    into L2 at the item's start and loaded after the prologue) and staged_pf1 (the rows per token, one ahead) at
    the K3 shape, k = 7: still 128 registers and at most about staged's spills (312 / 316 B; 156 / 248 and 340 /
    340), the prefetches in the PTX (`prefetch.global.L1`: 3 for the conv taps, 1 per thread for the sequence
    area; the rows 2 per thread, for staged_pf1 one in each token loop, the peeled tokens and the first row;
    staged_pf_late's state 2 per thread into L2), the state loaded with ld.global.cg, and no bar.sync inside the
    token loops."""
    tool = _barrier_tool()
    kernel = kda_decode.kda_decode_staged_kernel
    with tool.counted_barriers() as counts:
        compiled = kda_decode.staged_k3_spec(variant, 7).compile(target="cubin")
    assert compiled.metadata["registers"] <= 128, compiled.report()
    assert compiled.metadata["spill_stores"] <= 384 and compiled.metadata["spill_loads"] <= 384, compiled.report()
    assert compiled.ptx.count("prefetch.global.L1") == 3 + 1 + (2 if variant == "staged_pf_late" else 4)
    assert compiled.ptx.count("prefetch.global.L2") == (2 if variant == "staged_pf_late" else 0)
    assert compiled.ptx.count("ld.global.cg.v4.b32") == 16  # the state: 64 fp32 per thread
    assert {loop for (_, _, loop) in counts} <= {"-", f"kda_decode.py:{_item_loop_line(kernel)}:4"}, counts


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on PATH")
def test_k3_column_owner_staged_kernel_loops_have_no_barrier() -> None:
    """staged_col at the K3 shape, k = 7 (4 warps, a V column per thread): every bar.sync is outside the token loops
    (the prologue's and the norm's), and it fits 255 registers with at most 1 KB of spills (872 B on 2026-12-02:
    the prologue runs at 4 warps next to the 128 state registers in flight)."""
    tool = _barrier_tool()
    kernel = kda_decode.kda_decode_staged_kernel
    with tool.counted_barriers() as counts:
        compiled = kda_decode.staged_k3_spec("staged_col", 7).compile(target="cubin")
    assert compiled.metadata["spill_stores"] <= 1024 and compiled.metadata["spill_loads"] <= 1024, compiled.report()
    assert {loop for (_, _, loop) in counts} <= {"-", f"kda_decode.py:{_item_loop_line(kernel)}:4"}, counts


def _barrier_tool():  # type: ignore[no-untyped-def]
    """tools/barrier_sites.py as a module."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "barrier_sites.py"
    spec = importlib.util.spec_from_file_location("barrier_sites", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def _item_loop_line(kernel) -> int:  # type: ignore[no-untyped-def]
    """The source line of a persistent kernel's item loop (the only loop a barrier may be in)."""
    import inspect

    lines, first = inspect.getsourcelines(kernel.fn)
    item_loop, = [first + i for i, line in enumerate(lines) if "for item in range(pid, num_items" in line]
    return item_loop


def test_k3_staged_kernel_has_no_barrier_in_its_token_loops() -> None:
    """What the staged kernel is for: at the K3 shape every bar.sync of its PTX is outside the token loops (in the
    item loop's prologue and output norm, or before it), per tools/barrier_sites.py; the general kernel has 4 per
    replayed and 8 per new token."""
    kernel = kda_decode.kda_decode_staged_kernel
    counts = _barrier_tool().barrier_sites(kernel)
    loops = {loop for (_, _, loop) in counts}
    assert loops <= {"-", f"kda_decode.py:{_item_loop_line(kernel)}:4"}, counts
    assert 0 < sum(counts.values()) <= 20, counts


def test_benchmark_module_imports_and_runs_our_step_on_cpu(interpret: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/bench_kda_decode.py imports without fla or a GPU, and its closure for our step runs."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_kda_decode.py"
    spec = importlib.util.spec_from_file_location("bench_kda_decode", path)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # dataclasses look their module up there
    spec.loader.exec_module(bench)
    p = bench.make_problem(2, 2, 3, head_dim=16, device="cpu")
    p.out.fill_(float("nan"))
    bench.ours(p, accepted=3)()
    assert p.out.isfinite().all() and p.state_bytes == 2 * 2 * 2 * 16 * 16 * 4


# -------------------------------------------------------------------------------- compiled PTX on the simulator

CACHE_OUTPUTS = ("o_ptr", "state_ptr", "conv_state_ptr", "draft_proj_ptr", "draft_beta_ptr", "draft_delta_ptr")


def compiled_step_matches_interpreter(kernel_name: str, kd: int, vd: int, num_warps: int, lower_bound: float,
                                      drafts: int, variant: str | None = None, seed: int = 21) -> str:
    """One step (replays of 3, 1 and 2 drafts, a padding row) compiled to PTX and run on tests/ptx_sim.py from the
    same inputs as the interpreter: outputs, state, conv window and draft cache agree (1e-5: ptxas contracts mul +
    add into fma, skipping one rounding). Returns the PTX."""
    helpers = pytest.importorskip("ptx_helpers")
    from minitriton.ir.types import PointerType, ScalarType

    gen = torch.Generator().manual_seed(seed)
    h, rows = 1, 3
    w = random_weights(h, kd, vd, gen, lower_bound)
    cache = random_cache(4, h, kd, vd, max(drafts, 3), torch.float32, gen)
    # both sides read the same rows: random delta rows are as good as true ones here
    cache.drafts_have_deltas = True
    x = TokenInputs.random((rows, drafts + 1), h, kd, vd, torch.float32, gen)
    fake = RecordingKernel()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kda_decode, kernel_name, fake)
        kda_decode_step(*x.as_tuple(), w, cache, torch.tensor([3, -1, 0], dtype=torch.int32),
                        torch.tensor([3, 1, 2], dtype=torch.int32), out=torch.full_like(x.gate, float("nan")),
                        num_warps=num_warps, variant=variant)
    (grid, args, constexprs), = fake.launches
    kernel = getattr(kda_decode, kernel_name)
    params = kernel.runtime_params
    names = {torch.float32: "f32", torch.int32: "i32"}
    types = {n: PointerType(ScalarType(names[a.dtype])) if isinstance(a, torch.Tensor) else
             ScalarType("i32" if isinstance(a, int) else "f32") for n, a in zip(params, args)}
    options = dict(constexprs)
    num_warps = options.pop("num_warps")
    make = helpers.dsl(kernel.fn, types, options, divisibility={n: 16 for n in params if n.endswith("_ptr")},
                       num_warps=num_warps)
    ptx, _, _ = helpers.lower(make)
    assert "shfl.sync.bfly" in ptx and "ld.global.v" in ptx  # K reductions in a warp, vector state loads
    want = helpers.run_interpreted(make, grid, args)
    got = helpers.run_simulated(make, grid, args)
    for i, n in enumerate(params):
        if n in CACHE_OUTPUTS:
            assert helpers.rel_err(got[i], want[i]) <= 1e-5, n
    return ptx


@pytest.mark.parametrize("kd,vd,num_warps,lower_bound", [(16, 16, 4, -20.0), (32, 32, 4, -5.0)])
@pytest.mark.parametrize("variant", [None, "stream_l32_pf2_delta", "stream_l32_pf2_delta_rpf", "stream_l32_pf2_rpf"])
def test_compiled_ptx_matches_the_interpreter(kd: int, vd: int, num_warps: int, lower_bound: float,
                                              variant: str | None) -> None:
    """The general kernel (3 drafts): checks what the interpreter cannot, the split [KJ, V, KL, KV] state tile's
    layout, its shuffle reductions and the vector loads / stores; with cached deltas also the replay's row loads in
    the state's slice layouts, the run-end folds (lower_bound -20: runs of 2) and the delta rows' stores."""
    compiled_step_matches_interpreter("kda_decode_step_kernel", kd, vd, num_warps, lower_bound, drafts=3,
                                      variant=variant)


@pytest.mark.parametrize("kd,vd,num_warps,lower_bound,variant", [
    (16, 16, 4, -20.0, "stream"),  # one chunk (KL = 4)
    (32, 32, 4, -5.0, "stream"),  # two chunks of 16 rows
    (32, 128, 2, -20.0, "stream_l32_pf2"),  # 4 chunks of 32 rows, each loaded two chunks ahead
    (64, 64, 4, -5.0, "stream_l32"),  # a state row in 16 lanes (KL = 16, KJ = 1), 2 chunks of 4 rows per group
    (128, 128, 8, -5.0, "stream"),  # the K3 head: 8 warps, KL = 8, 4 chunks of 32 rows (~15 s)
])
def test_compiled_t1_kernel_matches_the_interpreter(kd: int, vd: int, num_warps: int, lower_bound: float,
                                                     variant: str) -> None:
    """The streamed T = 1 kernel: chunk loads and stores, the slices of v, the concat of the chunks' outputs for
    the norm, and its replay pass (accepted drafts of a previous step, replayed chunk by chunk and written back
    before the token's pass reloads the chunks)."""
    kernel_name = kda_decode.VARIANTS[variant].t1_kernel
    ptx = compiled_step_matches_interpreter(kernel_name, kd, vd, num_warps, lower_bound, drafts=0, variant=variant)
    assert "st.shared" in ptx  # the v slices / output pieces do move between layouts (the test covers them)


@pytest.mark.parametrize("kd,vd,num_warps,lower_bound,variant", [
    (16, 16, 4, -20.0, "stream_scratch"),  # one chunk of 16 rows (KL = 4)
    (32, 64, 4, -5.0, "stream_scratch"),  # 4 chunks of 16 rows
    (32, 64, 4, -20.0, "stream_scratch_vc64"),  # 2 chunks of 32 rows (2 rows per lane group), runs of 2 tokens
])
def test_compiled_scratch_kernel_matches_the_interpreter(kd: int, vd: int, num_warps: int, lower_bound: float,
                                                         variant: str) -> None:
    """The streamed T > 1 kernel (3 drafts; replays of 3, 1 and 2 drafts, a padding row) on the PTX simulator: the
    scratch rows written in the 1-D layout and read back as state columns by other threads, the chunks' outputs
    written to the scratch and read back for the norm. The simulator's global-memory race detector checks the
    two mt.barrier() calls (without the first, all three cases fail; see docs/kernels/kda_decode.md)."""
    assert kda_decode.VARIANTS[variant].kernel == "kda_decode_scratch_kernel"
    compiled_step_matches_interpreter("kda_decode_scratch_kernel", kd, vd, num_warps, lower_bound, drafts=3,
                                      variant=variant)


@pytest.mark.parametrize("kd,vd,num_warps,lower_bound", [
    (16, 16, 4, -20.0),  # runs of 2 (cumsum / cummin, folds inside the loops), one state row per thread
    (32, 64, 4, -5.0),  # ONE_RUN, 2 rows per thread: outputs packed from 2 registers
    (128, 128, 8, -5.0),  # the K3 head: 8 warps, KL = 8, 4 rows per thread, TH = 8 (~7 s)
])
def test_compiled_staged_kernel_matches_the_interpreter(kd: int, vd: int, num_warps: int, lower_bound: float) -> None:
    """The staged kernel (3 drafts; replays of 3, 1 and 2 drafts, a padding row; 2 programs over 3 items, so one
    program reuses its scratch) on the PTX simulator: the columns read from the scratch in the state's layout, the
    outputs stored packed from the row layout and read back for the norm, the sequence area's shifted conv reads.
    The global-memory race detector checks the barriers (removing the one before the output norm fails)."""
    assert kda_decode.VARIANTS["staged"].kernel == "kda_decode_staged_kernel"
    compiled_step_matches_interpreter("kda_decode_staged_kernel", kd, vd, num_warps, lower_bound, drafts=3,
                                      variant="staged")


@pytest.mark.parametrize("kd,vd,lower_bound,variant", [
    (32, 64, -5.0, "staged_pf1"),  # ONE_RUN: the first row after the prologue, then each token the next one
    (16, 16, -20.0, "staged_touch"),  # the item's rows at once (touched by loads; the store that never runs)
])
def test_compiled_staged_prefetch_kernel_matches_the_interpreter(kd: int, vd: int, lower_bound: float,
                                                                 variant: str) -> None:
    """The L1 variants' PTX on the simulator (4 warps): the prefetches' addresses stay inside the scratch (the
    simulator bounds-checks them), the probe's predicated-off stores write nothing, and the step is `staged`'s."""
    ptx = compiled_step_matches_interpreter("kda_decode_staged_kernel", kd, vd, 4, lower_bound, drafts=3,
                                            variant=variant)
    assert ("prefetch.global.L1" in ptx) == (variant != "staged_touch") and "ld.global.cg" in ptx


@pytest.mark.parametrize("kd,vd,num_warps", [(32, 64, 4), (64, 32, 2)])
def test_compiled_tensor_core_chunked_kernel_matches_the_interpreter(kd: int, vd: int, num_warps: int) -> None:
    """chunked_tc's PTX on the simulator (3 drafts in chunks of 8 rows; the state [V, K] on warps [num_warps, 1]):
    the state loaded in the accumulator's layout is the A operand of its products by renaming (kPairs), every
    state product is three tf32 mma.sync (tf32x3), the committed state is stored from the accumulator."""
    ptx = compiled_step_matches_interpreter("kda_decode_chunked_kernel", kd, vd, num_warps, -5.0, drafts=3,
                                            variant="chunked_tc")
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in ptx


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on PATH")
def test_k3_tensor_core_chunked_kernel_keeps_the_state_in_registers() -> None:
    """chunked_tc at the K3 shape (7 drafts, 8 warps): every state product on tensor cores with the state as its A
    operand in place (no ldmatrix, no shared-memory staging of the [128, 128] state: the kernel's shared memory
    holds only token tiles), 201 mma.sync (67 m16n8k8 steps per warp, three each), ptxas within 512 B of spills
    (the measured 1.1 ms is latency, not spills: docs/kernels/kda_decode.md)."""
    spec = next(s for s in kda_decode.kda_decode_chunked_kernel.specializations if s.constexprs.get("WHOLE"))
    assert spec.constexprs["PRECISION"] == "tf32x3" and spec.num_warps == 8
    compiled = spec.compile(target="cubin")
    assert "ldmatrix" not in compiled.ptx and compiled.ptx.count("mma.sync.aligned.m16n8k8") == 201
    assert compiled.metadata["spill_stores"] <= 512 and compiled.metadata["shared"] < 64 * 1024, compiled.report()


@pytest.mark.parametrize("kd,vd,lower_bound", [(32, 64, -5.0), (16, 32, -20.0)])
def test_compiled_column_owner_staged_kernel_matches_the_interpreter(kd: int, vd: int, lower_bound: float) -> None:
    """staged_col's PTX on the simulator (V / 32 warps: 2 and 1; ONE_RUN, and runs of 2 with folds): the state in
    and out in the column layout, the K vectors as broadcast loads, each thread's own outputs stored in place and
    read back for the norm; the race detector checks the barriers."""
    compiled_step_matches_interpreter("kda_decode_staged_kernel", kd, vd, vd // 32, lower_bound, drafts=3,
                                      variant="staged_col")


# ------------------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# The default (None) at every benchmark shape and k, and the k >= 1 kernels that are measured or may become the
# default; the opt-in probes measured slower (docs/kernels/kda_decode.md) carry the `probe` mark, which
# tools/gpu_session.sh leaves out unless GPU_MARK=gpu (they cost most of this file's GPU time: a kernel to compile
# and 20 steps at B = 256 each).
BENCHMARK_CASES = [
    (256, 12, 7, None), (256, 12, 3, None), (256, 12, 1, None), (256, 12, 0, None), (64, 96, 7, None),
    (64, 96, 3, None), (64, 96, 0, None), (256, 12, 7, "stream_l32_pf2"), (64, 96, 0, "stream_l32"),
    (256, 12, 7, "stream_l32_pf2_delta_rpf"), (64, 96, 3, "stream_l32_pf2_delta"),
    (256, 12, 7, "chunked_tc"), (64, 96, 3, "chunked_tc"),
]
PROBE_CASES = [
    (64, 96, 0, "stream_w4"), (64, 96, 0, "stream_l32_pf2"), (256, 12, 7, "stream_scratch"),
    (64, 96, 3, "stream_scratch"), (64, 96, 7, "stream_scratch_vc64"), (256, 12, 7, "chunked"),
    (64, 96, 3, "chunked"), (64, 96, 7, "chunked_2cta"), (256, 12, 7, "staged"), (64, 96, 7, "staged"),
    (64, 96, 3, "staged"), (256, 12, 1, "staged"), (256, 12, 7, "staged_pf"), (64, 96, 7, "staged_pf"),
    (256, 12, 7, "staged_pf1"), (256, 12, 7, "staged_touch"), (256, 12, 7, "staged_pf_late"),
    (256, 12, 7, "staged_col"), (64, 96, 7, "staged_col"), (256, 12, 1, "staged_col"),
    (64, 96, 7, "staged_pf_late"), (64, 96, 7, "chunked_tc"), (256, 12, 1, "chunked_tc"),
    (256, 12, 7, "chunked_tc1"), (256, 12, 7, "chunked_tc_2cta"), (256, 12, 7, "stream_l32_pf2_delta"),
]


def probes(cases: list[tuple]) -> list:
    """`cases` as pytest params with the `probe` mark."""
    return [pytest.param(*case, marks=pytest.mark.probe) for case in cases]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("batch,heads,drafts,variant", [*BENCHMARK_CASES, *probes(PROBE_CASES)])
def test_gpu_spec_decode_benchmark_shapes(monkeypatch: pytest.MonkeyPatch, batch: int, heads: int,
                                          drafts: int, variant: str | None) -> None:
    monkeypatch.delenv("MINITRITON_INTERPRET", raising=False)
    step = functools.partial(kda_decode_step, variant=variant)
    rep = simulate_spec_decode(step, num_requests=batch + 8, batch_rows=batch, num_slots=batch + 16,
                               heads=heads, head_k_dim=128, head_v_dim=128, num_drafts=drafts, steps=20,
                               dtype=torch.bfloat16, seed=11, device="cuda")
    assert rep.output_error <= 1e-2 and rep.state_error <= 2e-3 and rep.conv_error == 0, rep


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("drafts,variant", [(7, None), (3, None), (0, None), (7, "chunked_tc"),
                                            (7, "stream_l32_pf2_delta"),
                                            *probes([(3, "stream_scratch"), (7, "chunked"), (7, "staged"),
                                                     (7, "staged_pf"), (7, "staged_pf_late")])])
def test_gpu_cuda_graph_replay_with_device_side_counts(monkeypatch: pytest.MonkeyPatch, drafts: int,
                                                       variant: str | None) -> None:
    """Capture one step, change the accepted counts and slots in place, replay: equals an eager step (k = 0: the
    streamed kernel, whose padding rows are masked rather than branched around)."""
    monkeypatch.delenv("MINITRITON_INTERPRET", raising=False)
    gen = torch.Generator().manual_seed(12)
    h, kd, vd, rows = 12, 128, 128, 16
    w = on_device(random_weights(h, kd, vd, gen), "cuda")
    cache = on_device(random_cache(rows + 4, h, kd, vd, drafts, torch.bfloat16, gen), "cuda")
    eager_cache = clone_cache(cache)
    x = [t.cuda() for t in TokenInputs.random((rows, drafts + 1), h, kd, vd, torch.bfloat16, gen).as_tuple()]
    idx = torch.arange(rows, dtype=torch.int32, device="cuda")
    acc = torch.zeros(rows, dtype=torch.int32, device="cuda")
    out = torch.empty(rows, drafts + 1, h, vd, dtype=torch.bfloat16, device="cuda")
    kda_decode_step(*x, w, clone_cache(cache), idx, acc, out=out, variant=variant)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kda_decode_step(*x, w, cache, idx, acc, out=out, variant=variant)
    idx.copy_(torch.randperm(rows + 4, generator=gen)[:rows].to(torch.int32))
    idx[3] = -1
    acc.copy_(torch.randint(0, cache.max_drafts + 1, (rows,), generator=gen).to(torch.int32))  # k = 0: 0 or 1
    out.fill_(float("nan"))
    graph.replay()
    ref = kda_decode_step(*x, w, eager_cache, idx, acc, variant=variant)
    live = idx >= 0
    assert torch.equal(out[live], ref[live])
    assert torch.equal(cache.state, eager_cache.state)


def test_column_owner_probe(interpret: None) -> None:
    """tools/column_owner_probe.py, the layout the next k >= 1 kernel is to be built on (each thread a whole V
    column of the state, mt.load(layout=...)): the recurrence core matches float64 torch through the interpreter,
    and at K3 (K = V = 128, 4 warps) its token loop compiles with no block barrier, no shuffle and at most 256 B of
    spills (measured 168 B, 526 SASS a token: 382 FFMA, 98 LDG)."""
    sys.path.insert(0, str(REPO / "tools"))
    import column_owner_probe as probe

    S, kq, vv, beta = probe.problem(2, 3, "cpu")
    state, o = S.clone(), torch.full(vv.shape, float("nan"))
    probe.column_owner_tokens[(2,)](state, kq, vv, beta, o, 3, K=probe.K, V=probe.V, num_warps=probe.V // 32)
    want_S, want_o = probe.reference(S, kq, vv, beta)
    assert ((state.double() - want_S).norm() / want_S.norm()).item() < 1e-6
    assert ((o.double() - want_o).norm() / want_o.norm()).item() < 1e-6
    if shutil.which("ptxas") is None:
        return
    compiled = probe.column_owner_tokens.aot_spec(probe.SIGNATURE, probe.V // 32, None, None, K=probe.K,
                                                  V=probe.V).compile(target="cubin")
    assert "bar.sync" not in compiled.ptx and "shfl" not in compiled.ptx
    assert compiled.metadata["spill_stores"] <= 256
