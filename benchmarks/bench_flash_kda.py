"""Benchmark: KDA chunked prefill (minitriton.kernels.flash_kda.chunk_kda) against fla 0.6.0 chunk_kda.

    python benchmarks/bench_flash_kda.py [--shapes 1x32768x96,8x4096x32] [--state-precision tf32|bf16]
                                         [--context-parallel auto|on|off] [--recurrence-warps 4|8]
                                         [--intra-variant sliced|chunk64|sub16] [--knob NAME=VALUE[,...]]
                                         [--no-save]

Rows, per shape B x T x H (K = V = 128, bf16 q/k/v/g, raw beta logits, no initial state, fp32 final state):
  ours   chunk_kda(...) with the default (automatic) context-parallel choice
Peer, measured in the same run on the same tensors:
  fla    fla.ops.kda.chunk_kda(safe_gate=True, lower_bound=-5, use_qk_l2norm_in_kernel=True,
         use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True), FLA_FLASH_KDA=0 so fla runs its own Triton
         pipeline (not the FlashKDA CUTLASS kernels it dispatches to when they are installed).
floor = max(bytes / measured copy bandwidth, FLOPs / 700 TFLOP/s): bytes = the inputs read once + o written once +
the final state (`min_bytes`), FLOPs = the chunked algorithm's tensor-core work with causal tiles halved
(`algorithm_flops`). floor/ours is the roofline fraction. The target (issue 5) is fla/ours >= 2.5.
Two tables: call to call (do_bench: what an eager caller waits, host work between launches included) and, with
the same columns, the sum of each side's kernel times (torch.profiler: GPU work only). fla launches eight
kernels a call, so where it is host-bound the two differ (B1 T8192 H12 on an H100: 1.28 against 0.56 ms).

Importable without fla or a GPU (tests import it); fla is imported when its peer runs.
"""
from __future__ import annotations

import argparse
import os
import re
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

SHAPES = ((1, 32768, 96), (1, 32768, 16), (8, 4096, 32), (1, 8192, 12), (1, 131072, 4))
HEAD_DIM = 128
LOWER_BOUND = -5.0
CHUNK = 64
PEAK_FLOPS = 700e12  # dense bf16 tensor-core FLOP/s the roofline uses (measured GEMM: ~790e12)


@dataclass
class Problem:
    """One shape's inputs on the GPU, shared by ours and fla."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        B, T, H, K = self.q.shape
        return B, T, H, K, self.v.shape[-1]


def make_problem(batch: int, seq_len: int, heads: int, head_dim: int = HEAD_DIM, seed: int = 0,
                 device: str = "cuda") -> Problem:
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (batch, seq_len, heads, head_dim)

    def randn(*s: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.randn(*s, generator=gen, device=device, dtype=dtype)

    return Problem(q=randn(*shape), k=randn(*shape), v=randn(*shape), g=randn(*shape),
                   beta=randn(batch, seq_len, heads), A_log=torch.rand(heads, generator=gen, device=device) - 0.5,
                   dt_bias=randn(heads * head_dim, dtype=torch.float32))


def min_bytes(B: int, T: int, H: int, K: int, V: int, elem: int = 2, final_state: bool = True) -> int:
    """q, k, g [B,T,H,K] and v [B,T,H,V] read once, beta [B,T,H] read once, o [B,T,H,V] written once (all `elem`
    bytes), plus the fp32 final state [B,H,K,V] written once."""
    tokens = B * T * H
    return tokens * ((3 * K + 2 * V) * elem + elem) + (B * H * K * V * 4 if final_state else 0)


def algorithm_flops(B: int, T: int, H: int, K: int, V: int, chunk: int = CHUNK) -> int:
    """Tensor-core FLOPs (2 per multiply-add) of the chunked algorithm, per token and head: the state products
    w S, qg S (2 C K V per chunk) and kg^T v_new (C K V); the causal tiles Aqk, L (C/2 x K each per token),
    w = Ainv kb and u = Ainv (beta v) (C/2 x K and C/2 x V), and Aqk v_new (C/2 x V). The UT solve is left out."""
    per_token = 2 * (3 * K * V + chunk // 2 * (2 * K + K + V + V))
    return B * T * H * per_token


def ours(p: Problem, context_parallel: bool | None, cp_segment_len: int | None = None) -> Callable[[], Any]:
    from minitriton.kernels.flash_kda import chunk_kda

    return lambda: chunk_kda(p.q, p.k, p.v, p.g, p.beta, A_log=p.A_log, dt_bias=p.dt_bias, lower_bound=LOWER_BOUND,
                             output_final_state=True, context_parallel=context_parallel,
                             cp_segment_len=cp_segment_len)


def fla(p: Problem) -> Callable[[], Any]:
    os.environ.setdefault("FLA_FLASH_KDA", "0")  # compare with fla's own kernels, not its FlashKDA dispatch
    from fla.ops.kda import chunk_kda

    def call() -> Any:
        with torch.inference_mode():
            return chunk_kda(p.q, p.k, p.v, p.g, p.beta, A_log=p.A_log, dt_bias=p.dt_bias, output_final_state=True,
                             use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                             safe_gate=True, lower_bound=LOWER_BOUND)

    return call


def _or_none(measure: Callable[[], float]) -> float | None:
    """measure(), or None with the reason logged when it cannot run (a missing fla, or an API that changed: the
    row is reported without this peer)."""
    try:
        return measure()
    except Exception as e:
        harness.log(f"skipped: {type(e).__name__}: {e}")
        return None


def kernel_ms(make: Callable[[], Callable[[], Any]]) -> float | None:
    """Milliseconds of GPU kernel time per call, summed over the call's kernels (None when it cannot run)."""
    return _or_none(lambda: sum(us for _, us in harness.kernel_times(make())) / 1e3)


def time_ms(make: Callable[[], Callable[[], Any]]) -> float | None:
    """Median milliseconds of one call (None, with the reason logged, when it cannot run)."""
    def measure() -> float:
        fn = make()
        fn()  # compile / autotune outside the timing
        torch.cuda.synchronize()
        return harness.do_bench(fn)

    return _or_none(measure)


def parse_knob(text: str) -> tuple[tuple[str, object], ...]:
    """'NAME=VALUE[,NAME=VALUE...]' -> ((NAME, VALUE as int, bool or str), ...); each NAME must be one of
    flash_kda's module constants."""
    from minitriton.kernels import flash_kda

    settings = []
    for part in text.split(","):
        name, sep, raw = part.partition("=")
        if not sep or not name.isupper() or not hasattr(flash_kda, name):
            sys.exit(f"--knob={text}: expected NAME=VALUE[,NAME=VALUE...] with each NAME one of flash_kda's module "
                     f"constants")
        value: object = {"True": True, "False": False}.get(raw, raw)
        if isinstance(value, str) and re.fullmatch(r"-?\d+", raw):
            value = int(raw)
        settings.append((name, value))
    return tuple(settings)


def run(shapes=SHAPES, state_precision: str | None = None, context_parallel: bool | None = None,
        recurrence_warps: int | None = None, intra_variant: str | None = None,
        knobs: tuple[tuple[str, object], ...] = ()) -> tuple["harness.Table", "harness.Table"]:
    """(call-to-call table, kernel-time table) at `shapes`; `knobs`: flash_kda module constants set first."""
    from minitriton.kernels import flash_kda

    for name, value in knobs:
        setattr(flash_kda, name, value)

    if state_precision is not None:  # None: the module's default (bf16x2 since 2026-12-06), as chunk_kda runs it
        flash_kda.STATE_PRECISION = state_precision
    if recurrence_warps is not None:  # A/B of the phase-2 occupancy choice (flash_kda.RECURRENCE_WARPS)
        flash_kda.RECURRENCE_WARPS = recurrence_warps
    if intra_variant is not None:  # A/B of the phase-1 kernel (flash_kda.INTRA_VARIANT)
        flash_kda.INTRA_VARIANT = intra_variant
    bandwidth = harness.copy_bandwidth()
    table = harness.Table("flash_kda", "KDA chunked prefill (K = V = 128, bf16, fp32 final state)", unit="ms",
                          notes={"copy_bandwidth_Bps": bandwidth, "peak_flops": PEAK_FLOPS,
                                 "state_precision": flash_kda.STATE_PRECISION, "context_parallel": context_parallel,
                                 "recurrence_warps": flash_kda.RECURRENCE_WARPS or "auto",
                                 "intra_variant": flash_kda.INTRA_VARIANT,
                                 "knobs": ", ".join(f"{n}={v}" for n, v in knobs) or "defaults"})
    kernels = harness.Table("flash_kda_kernels", "KDA chunked prefill, GPU kernel time per call (sum of kernels)",
                            unit="ms", notes=dict(table.notes))
    for B, T, H in shapes:
        p = make_problem(B, T, H)
        dims = p.shape
        floor = max(min_bytes(*dims) / bandwidth, algorithm_flops(*dims) / PEAK_FLOPS) * 1e3
        mine = time_ms(lambda: ours(p, context_parallel))
        peer = time_ms(lambda: fla(p))
        if mine is not None:
            table.add("chunk_kda", f"B={B},T={T},H={H}", mine, {"fla": peer}, floor=floor)
        mine_k, peer_k = kernel_ms(lambda: ours(p, context_parallel)), kernel_ms(lambda: fla(p))
        if mine_k is not None:
            kernels.add("chunk_kda", f"B={B},T={T},H={H}", mine_k, {"fla": peer_k}, floor=floor)
        del p
        torch.cuda.empty_cache()
    return table, kernels


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES), help="BxTxH,BxTxH,...")
    ap.add_argument("--state-precision", choices=("bf16x2", "tf32", "bf16"),
                    help="override flash_kda.STATE_PRECISION (default: the module's, bf16x2)")
    ap.add_argument("--context-parallel", default="auto", choices=("auto", "on", "off"))
    ap.add_argument("--recurrence-warps", type=int, choices=(4, 8),
                    help="override flash_kda.RECURRENCE_WARPS (default: chosen per launch)")
    ap.add_argument("--intra-variant", choices=("sliced", "chunk64", "sub16"), help="override flash_kda.INTRA_VARIANT")
    ap.add_argument("--knob", default="", help="flash_kda module constants, NAME=VALUE[,NAME=VALUE...]")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args(argv)
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    cp = {"auto": None, "on": True, "off": False}[args.context_parallel]
    tables = run(shapes, args.state_precision, cp, args.recurrence_warps, args.intra_variant,
                 parse_knob(args.knob) if args.knob else ())
    for table in tables:
        print(table.format())
        if not args.no_save:
            table.save()


if __name__ == "__main__":
    main()
