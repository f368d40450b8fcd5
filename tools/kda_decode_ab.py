"""A/B of the KDA decode step's kernel variants (kda_decode.VARIANTS) on the GPU, in one run: each variant is first
checked against the float64 torch step, then timed at B256 H12 and B64 H96 (K = V = 128, bf16, fp32 state) at
k = 0, k = 7 with all 7 drafts accepted and k = 7 with none, next to fla's fused_recurrent_kda T=1 pool path and
its snapshot path (benchmarks/bench_kda_decode.py calls and finds fla). Prints one table.

    python tools/kda_decode_ab.py [--variants stream,loop,...] [--shapes 256x12,64x96] [--graph] [--no-check]

Columns: k0 / k7a7 / k7a0 in us; fla_T1 (pool) and fla_snap (k = 7 snapshot path); k0/fla = k0 / fla_T1 (target
<= 1); snap/k7 = fla_snap / k7a7 (target >= 3); k7/k0 = k7a7 / k0 (target <= 1.3); bw = state floor / k0, the
fraction of copy bandwidth the k = 0 step reaches on its state bytes (target >= 0.8). k = 7 runs the variant's
T > 1 kernel, so variants that share it (same kernel, warps and chunk rows) share those columns (timed once,
marked '='). `stream_scratch` and `stream_scratch_vc64` time the streamed T > 1 kernel (`kda_decode_scratch_kernel`)
in the k7 columns; run them alone with `--variants stream,stream_scratch,stream_scratch_vc64`. `staged` times
`kda_decode_staged_kernel` (the whole state in registers, the per-token vectors staged up front, no barrier in the
token loops) against the loop kernel: `--variants stream_l32_pf2,staged`. The staged variants with their token rows
brought into L1 (`staged_cg` the control: the state read .cg only; `staged_pf`, `staged_pf_rows`, `staged_pf_sec`,
`staged_pf1`, `staged_pf2`, `staged_touch`, `staged_pf_late`; docs/kernels/kda_decode.md, "prefetching the staged
kernel's columns") are the same kernel with other constexprs, each timed: `--variants stream_l32_pf2,staged,
staged_cg,staged_pf,staged_pf_rows,staged_pf_sec,staged_pf1,staged_pf2,staged_touch,staged_pf_late` (one word).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import bench_kda_decode as bench  # noqa: E402
from benchmarks import harness  # noqa: E402
from minitriton.kernels import kda_decode  # noqa: E402


def check_variant(variant: str, drafts: int, accepted: list[int], seed: int = 1, d: int = 128,
                  device: str = "cuda") -> tuple[float, float]:
    """Two steps at H = 4, K = V = d, bf16 against spec_decode_step_torch (float64): (output, state) errors of the
    second, max |got - ref| / max |ref| over live rows. Rows: the accepted counts given (both steps), plus a padding
    row. The first step replays stale random drafts; the second replays the first's (for a `deltas` variant, from
    the delta rows the first wrote)."""
    from minitriton.kernels.kda_reference import TokenInputs, random_weights, spec_decode_step_torch

    gen = torch.Generator().manual_seed(seed)
    h, rows = 4, len(accepted) + 1
    w = random_weights(h, d, d, gen)
    cache = kda_decode.KDADecodeCache.allocate(rows + 2, h, d, d, max(drafts, 7), torch.bfloat16, "cpu",
                                               replay_deltas=True)
    cache.randomize_(gen)
    idx = torch.tensor(list(range(rows - 1)) + [-1], dtype=torch.int32)
    acc = torch.tensor(accepted + [3], dtype=torch.int32)
    ref_cache = cache.clone()
    dev = lambda obj: type(obj)(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in vars(obj).items()})
    gcache, gw = dev(cache), dev(w)
    for _ in range(2):
        x = TokenInputs.random((rows, drafts + 1), h, d, d, torch.bfloat16, gen)
        ref = spec_decode_step_torch(*x.as_tuple(), w, ref_cache, idx, acc,
                                     out=torch.zeros_like(x.gate, dtype=torch.float64))
        out = kda_decode.kda_decode_step(*(t.to(device) for t in x.as_tuple()), gw, gcache, idx.to(device),
                                         acc.to(device), variant=variant).cpu().double()
    live = idx >= 0
    err = lambda a, b: ((a - b).abs().max() / b.abs().max()).item()
    return err(out[live], ref[live]), err(gcache.state.cpu().double(), ref_cache.state.double())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(kda_decode.VARIANTS))
    ap.add_argument("--shapes", default="256x12,64x96")
    ap.add_argument("--graph", action="store_true", help="time CUDA-graph replays")
    ap.add_argument("--no-check", action="store_true")
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]

    ok = {}
    for v in variants:
        if args.no_check:
            ok[v] = True
            continue
        errs = [check_variant(v, 0, [0, 0, 2]), check_variant(v, 7, [7, 0, 3])]
        ok[v] = all(o <= 1e-2 and s <= 2e-3 for o, s in errs)
        print(f"check {v}: (output, state) errors k=0 {errs[0][0]:.2e} {errs[0][1]:.2e}, "
              f"k=7 {errs[1][0]:.2e} {errs[1][1]:.2e} -> {'ok' if ok[v] else 'FAILED'}", flush=True)

    bandwidth = harness.copy_bandwidth()
    head = (f"{'variant':<20}{'shape':<10}{'k0':>8}{'k7a7':>9}{'k7a0':>9}{'fla_T1':>9}{'fla_snap':>9}"
            f"{'k0/fla':>8}{'snap/k7':>8}{'k7/k0':>7}{'bw':>6}")
    lines = [f"copy bandwidth {bandwidth / 1e12:.2f} TB/s, graph={args.graph}", head]
    fmt = lambda x, w, p=1: f"{x:>{w}.{p}f}" if x is not None else f"{'-':>{w}}"
    for batch, heads in shapes:
        p0 = bench.make_problem(batch, heads, 0)
        fla_t1 = bench.time_us(lambda: bench.fla_t1_pool(p0), args.graph)
        floor = p0.state_bytes / bandwidth * 1e6
        p7 = bench.make_problem(batch, heads, 7)
        fla_snap = bench.time_us(lambda: bench.fla_snapshot(p7), args.graph)
        timed_t7: dict[tuple[str, int], tuple] = {}
        for v in variants:
            if not ok[v]:
                lines.append(f"{v:<20}{batch}x{heads:<7} FAILED the check: not timed")
                continue
            k0 = bench.time_us(lambda: bench.ours(p0, 0, v), args.graph)
            key = kda_decode.VARIANTS[v].t_gt_1
            shared = key in timed_t7
            if not shared:
                timed_t7[key] = (bench.time_us(lambda: bench.ours(p7, 7, v), args.graph),
                                 bench.time_us(lambda: bench.ours(p7, 0, v), args.graph))
            k7a7, k7a0 = timed_t7[key]
            ratio = lambda a, b: a / b if a is not None and b is not None else None
            mark = "=" if shared else " "
            lines.append(f"{v:<20}{f'{batch}x{heads}':<10}{fmt(k0, 8)}{fmt(k7a7, 8)}{mark}{fmt(k7a0, 8)}{mark}"
                         f"{fmt(fla_t1, 9)}{fmt(fla_snap, 9)}{fmt(ratio(k0, fla_t1), 8, 2)}"
                         f"{fmt(ratio(fla_snap, k7a7), 8, 2)}{fmt(ratio(k7a7, k0), 7, 2)}{fmt(ratio(floor, k0), 6, 2)}")
            print(lines[-1], flush=True)
        del p0, p7
        torch.cuda.empty_cache()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
