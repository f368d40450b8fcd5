"""Benchmark: the KDA speculative decode step (minitriton.kernels.kda_decode) against fla 0.6.0.

    python benchmarks/bench_kda_decode.py [--shapes 256x12,64x96] [--drafts 0,1,3,7] [--graph] [--no-save]
                                          [--variant NAME]

Rows, per shape (B requests x H heads, K = V = 128, bf16 activations, fp32 state) and draft count k (ours: the
default variant, kda_decode.DEFAULT_VARIANT, or --variant NAME, e.g. `staged`; tools/kda_decode_ab.py compares all
of kda_decode.VARIANTS):
  ours a=k     our step replaying all k drafts of the previous step (the worst case) + 1 + k new tokens
  ours a=0     our step replaying nothing (k > 0 only)
Peers, measured in the same run on the same tensors:
  fla_T1        fla `fused_recurrent_kda` on one token per request (T=1), new final state (the issue's 132/271 us)
  fla_T1_pool   fla `fused_recurrent_kda_fwd`, T=1, in-place state pool (vLLM decode)
  fla_snapshot  fla `fused_recurrent_kda_fwd` on T = 1 + k tokens, state after every token written to its own pool
                slot (ssm_state_indices [B, 1+k], num_accepted_tokens): vLLM's spec-decode snapshot path
  ours_k0       our k = 0 step (peer/ours >= 1/1.3 is the "k = 7 step <= 1.3x k = 0 step" target)
fla does not run the short conv or the output norm (ours does both), so the comparison favours fla.
floor = state bytes (one read + one write, fp32) / measured copy bandwidth: floor/ours is the fraction of copy
bandwidth our step reaches on its state traffic (target >= 0.8).

Importable without fla or a GPU (tests and tools import it); fla is imported when its peer runs.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

try:
    from benchmarks import harness
except ImportError:  # run as a script: benchmarks/ is not a package on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import harness  # type: ignore[no-redef]

SHAPES = ((256, 12), (64, 96))
DRAFTS = (0, 1, 3, 7)
HEAD_DIM = 128
LOWER_BOUND = -5.0


@dataclass
class Problem:
    """One shape's tensors on the GPU, shared by our step and the fla peers."""

    batch: int
    heads: int
    drafts: int
    x: Any  # kda_reference.TokenInputs, fields [B, 1 + drafts, H, *] bf16
    weights: Any  # KDADecodeWeights
    cache: Any  # KDADecodeCache with one slot per request, random committed state and drafts
    state_indices: torch.Tensor  # [B] int32
    out: torch.Tensor

    @property
    def head_dim(self) -> int:
        return self.x.q.shape[-1]

    @property
    def device(self) -> torch.device:
        return self.x.q.device

    @property
    def state_bytes(self) -> int:
        """One read and one write of every request's fp32 state."""
        return 2 * self.batch * self.heads * self.head_dim ** 2 * 4


def make_problem(batch: int, heads: int, drafts: int, seed: int = 0, head_dim: int = HEAD_DIM,
                 device: str = "cuda") -> Problem:
    from minitriton.kernels.kda_decode import KDADecodeCache
    from minitriton.kernels.kda_reference import TokenInputs, random_weights

    gen = torch.Generator().manual_seed(seed)
    d = head_dim
    x = TokenInputs.random((batch, drafts + 1), heads, d, d, torch.bfloat16, gen)
    x = TokenInputs(*(t.to(device) for t in x.as_tuple()))
    w = random_weights(heads, d, d, gen, lower_bound=LOWER_BOUND)
    w = type(w)(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in vars(w).items()})
    cache = KDADecodeCache.allocate(batch, heads, d, d, max(drafts, 1), torch.bfloat16, device, replay_deltas=True)
    cache.state.normal_()
    cache.conv_state.normal_()
    cache.draft_proj.normal_()
    cache.draft_beta.normal_()
    cache.draft_delta.uniform_()  # delta rows for the `deltas` variants' first (warm-up) replay: values, not zeros
    idx = torch.arange(batch, dtype=torch.int32, device=device)
    return Problem(batch, heads, drafts, x, w, cache, idx, torch.empty_like(x.gate))


def ours(p: Problem, accepted: int, variant: str | None = None) -> Callable[[], Any]:
    """Our step replaying `accepted` drafts (variant: a kda_decode.VARIANTS name; None: the default)."""
    from minitriton.kernels.kda_decode import kda_decode_step

    acc = torch.full((p.batch,), accepted, dtype=torch.int32, device=p.device)
    return lambda: kda_decode_step(*p.x.as_tuple(), p.weights, p.cache, p.state_indices, acc, out=p.out,
                                   variant=variant)


def _fla_kwargs(p: Problem) -> dict[str, Any]:
    return dict(A_log=p.weights.a_log[:p.heads], dt_bias=p.weights.dt_bias, use_qk_l2norm_in_kernel=True,
                use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, lower_bound=LOWER_BOUND,
                state_v_first=True)


def fla_t1(p: Problem) -> Callable[[], Any]:
    from fla.ops.kda import fused_recurrent_kda

    q, k, v, f, beta = (t[:, :1].contiguous() for t in (p.x.q, p.x.k, p.x.v, p.x.f, p.x.beta))
    h0 = p.cache.state.clone()
    kw = _fla_kwargs(p)
    return lambda: fused_recurrent_kda(q, k, v, f, beta, initial_state=h0, output_final_state=True, **kw)


def fla_t1_pool(p: Problem) -> Callable[[], Any]:
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    q, k, v, f, beta = (t[:, :1].contiguous() for t in (p.x.q, p.x.k, p.x.v, p.x.f, p.x.beta))
    pool = p.cache.state.clone()
    kw = _fla_kwargs(p)
    return lambda: fused_recurrent_kda_fwd(q, k, v, f, beta, initial_state=pool, inplace_final_state=True,
                                           ssm_state_indices=p.state_indices, **kw)


def fla_snapshot(p: Problem) -> Callable[[], Any]:
    """vLLM's spec verify: read slot idx[n, accepted-1], write the state after token t to slot idx[n, t]."""
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    t = p.drafts + 1
    pool = torch.randn(p.batch * t, p.heads, p.head_dim, p.head_dim, device=p.device)
    idx = torch.arange(p.batch * t, dtype=torch.int32, device=p.device).view(p.batch, t)
    accepted = torch.full((p.batch,), t, dtype=torch.int32, device=p.device)
    kw = _fla_kwargs(p)
    x = p.x
    return lambda: fused_recurrent_kda_fwd(x.q, x.k, x.v, x.f, x.beta, initial_state=pool, inplace_final_state=True,
                                           ssm_state_indices=idx, num_accepted_tokens=accepted, **kw)


def time_us(make: Callable[[], Callable[[], Any]], graph: bool) -> float | None:
    """Median microseconds of one call (None, with the reason logged, when the peer cannot run)."""
    try:
        fn = make()
        fn()  # compile / autotune outside the timing (and the capture)
        torch.cuda.synchronize()
        if graph:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            fn = g.replay
        return harness.do_bench(fn) * 1e3
    except Exception as e:  # a missing fla, or an API that changed: report the row without this peer
        harness.log(f"skipped: {type(e).__name__}: {e}")
        return None


def run(shapes=SHAPES, drafts=DRAFTS, graph: bool = False, variant: str | None = None) -> "harness.Table":
    bandwidth = harness.copy_bandwidth()
    table = harness.Table("kda_decode", "KDA speculative decode step (K = V = 128, bf16, fp32 state)",
                          notes={"copy_bandwidth_Bps": bandwidth, "graph": graph, "variant": variant or "default",
                                 "fla_note": "fla peers exclude the short conv and the output norm"})
    for batch, heads in shapes:
        shape = f"B={batch},H={heads}"
        base = make_problem(batch, heads, 0)
        ours_k0 = time_us(lambda: ours(base, 0, variant), graph)
        t1 = time_us(lambda: fla_t1(base), graph)
        t1_pool = time_us(lambda: fla_t1_pool(base), graph)
        floor = base.state_bytes / bandwidth * 1e6
        del base
        for k in drafts:
            p = make_problem(batch, heads, k)
            snap = time_us(lambda: fla_snapshot(p), graph)
            peers = {"fla_T1": t1, "fla_T1_pool": t1_pool, "fla_snapshot": snap, "ours_k0": ours_k0}
            for accepted in ((k, 0) if k else (0,)):
                mine = time_us(lambda: ours(p, accepted, variant), graph)
                if mine is not None:
                    table.add(f"k={k} a={accepted}", shape, mine, peers, floor=floor)
            del p
            torch.cuda.empty_cache()
    return table


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(f"{b}x{h}" for b, h in SHAPES), help="BxH,BxH,...")
    ap.add_argument("--drafts", default=",".join(map(str, DRAFTS)))
    ap.add_argument("--graph", action="store_true", help="time CUDA-graph replays (no launch overhead)")
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--variant", default=None, help="a kda_decode.VARIANTS name (default: DEFAULT_VARIANT)")
    args = ap.parse_args(argv)
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    table = run(shapes, [int(k) for k in args.drafts.split(",")], args.graph, args.variant)
    print(table.format())
    if not args.no_save:
        table.save()


if __name__ == "__main__":
    main()
