"""The chunked (WY) form of the KDA speculative decode step (kernels_src/kda_chunked_reference.py) against the
token-by-token statement of the API (kda_reference.spec_decode_step_torch), float64 on the CPU: the algebra a
chunked decode kernel would implement, checked before any kernel exists."""
from __future__ import annotations

import pytest
import torch

from minitriton.kernels import kda_chunked_reference as chunked
from minitriton.kernels.kda_decode import KDADecodeCache
from minitriton.kernels.kda_reference import TokenInputs, random_weights, spec_decode_step_torch

BOUND = 1e-10  # float64 on both sides; the forms differ only in summation order


def _cache(gen: torch.Generator, slots: int, h: int, kd: int, vd: int, drafts: int) -> KDADecodeCache:
    return KDADecodeCache.allocate(slots, h, kd, vd, drafts, torch.float64, "cpu").randomize_(gen)


@pytest.mark.parametrize("tokens", [1, 4, 8])
def test_chunked_step_equals_token_by_token(tokens: int) -> None:
    """Rows with 0, some and all drafts accepted, plus a padding row: outputs, committed state, conv window and
    the draft cache match to 1e-10 (relative to the largest value)."""
    gen = torch.Generator().manual_seed(tokens)
    h, kd, vd, drafts = 3, 16, 32, 7
    w = random_weights(h, kd, vd, gen, lower_bound=-5.0)
    cache = _cache(gen, 5, h, kd, vd, drafts)
    x = TokenInputs.random((4, tokens), h, kd, vd, torch.float64, gen)
    idx = torch.tensor([3, 0, -1, 2])
    acc = torch.tensor([0, 7, 2, 3])
    ref_cache = cache.clone()
    want = spec_decode_step_torch(*x.as_tuple(), w, ref_cache, idx, acc, out=torch.zeros_like(x.gate))
    got = chunked.spec_decode_step_chunked(*x.as_tuple(), w, cache, idx, acc, out=torch.zeros_like(x.gate))
    err = lambda a, b: ((a - b).abs().max() / b.abs().max()).item()
    live = idx >= 0
    assert err(got[live], want[live]) <= BOUND
    for name in ("state", "conv_state", "draft_proj", "draft_beta"):
        assert err(getattr(cache, name), getattr(ref_cache, name)) <= BOUND, name


def test_chunk_identities() -> None:
    """The closed form of one chunk: S_n from the deltas equals the recurrence's state after every prefix, and the
    outputs equal S_i q_i, for random gates down to the floor (exponents stay <= 0)."""
    gen = torch.Generator().manual_seed(9)
    h, n, kd, vd = 2, 6, 8, 5
    s0 = torch.randn(h, vd, kd, generator=gen, dtype=torch.float64)
    q, k = (torch.randn(h, n, kd, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(h, n, vd, generator=gen, dtype=torch.float64)
    beta = torch.rand(h, n, generator=gen, dtype=torch.float64)
    g = -5 * torch.rand(h, n, kd, generator=gen, dtype=torch.float64)
    d, gamma = chunked.chunk_deltas(s0, k, v, beta, g)
    outs = chunked.chunk_outputs(s0, q, k, d, gamma)
    s = s0
    for i in range(n):
        s = s * torch.exp(g[:, i])[:, None, :]
        delta = beta[:, i, None] * (v[:, i] - torch.einsum("hvk,hk->hv", s, k[:, i]))
        s = s + delta[:, :, None] * k[:, i, None, :]
        assert torch.allclose(delta, d[:, i], rtol=0, atol=1e-12)
        assert torch.allclose(chunked.chunk_state(s0, k, d, gamma, i + 1), s, rtol=0, atol=1e-12)
        assert torch.allclose(outs[:, i], torch.einsum("hvk,hk->hv", s, q[:, i]), rtol=0, atol=1e-12)
