"""One call of each named case inside a CUDA profiler range, for Nsight Compute (`tools/ncu_profile.sh`).

    python tools/ncu_cases.py CASE [CASE ...]      (cases: see CASES; `--list` prints them)

Each case builds its inputs, runs once to compile and warm up, then runs once more between cudaProfilerStart and
cudaProfilerStop, so `ncu --profile-from-start off` profiles exactly one call's kernels per case. All cases share
one process (one torch import, one compile per kernel).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

Call = Callable[[], Any]


def gemm(kind: str, block_n: int, stages: int, size: int = 8192) -> Call:
    from minitriton.kernels.examples import matmul as mm

    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(size, size, device="cuda", generator=gen).bfloat16()
    b = torch.randn(size, size, device="cuda", generator=gen).bfloat16()
    config = next(c for c in mm.MATMUL_CONFIGS
                  if c.kwargs["BLOCK_N"] == block_n and c.num_stages == stages and c.kwargs["BLOCK_M"] == 128)
    if kind == "cublas":
        return lambda: a @ b
    if kind == "ws":
        return lambda: mm.matmul_tma_ws(a, b, config)
    meta = dict(config.kwargs)

    def ring() -> Any:
        c = torch.empty_like(a)
        mm.matmul_kernel[mm._matmul_grid({"M": size, "N": size, **meta})](
            a, b, c, c, size, size, size, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
            c.stride(1), **meta, num_warps=config.num_warps, num_stages=config.num_stages)
        return c

    return ring


def warp_decode(batch: int, variant: str | None = None) -> Call:
    import bench_warp_decode as bench

    from minitriton.kernels import warp_decode as wd

    layer = bench.make_layer(bench.SHAPE)
    layout = wd.variant_layout(variant) if variant else "auto"  # a named variant reads its own layout
    w13 = wd.prepare_experts(layer.w13_blocks, layer.w13_scales, layout=layout)
    w2 = wd.prepare_experts(layer.w2_blocks, layer.w2_scales, layout=layout)
    x, ids, weights = bench.make_batch(bench.SHAPE, batch)
    return lambda: wd.moe_decode(x, ids, weights, w13, w2, use_dot=True, variant=variant)


def kda_decode(accepted: int, drafts: int, variant: str | None = None) -> Call:
    import bench_kda_decode as bench

    return bench.ours(bench.make_problem(256, 12, drafts), accepted, variant)


def flash_kda(seq_len: int) -> Call:
    import bench_flash_kda as bench

    return bench.ours(bench.make_problem(1, seq_len, 12), None)


CASES: dict[str, Callable[[], Call]] = {
    "gemm_cublas": lambda: gemm("cublas", 256, 4),
    "gemm_ring_n256_s4": lambda: gemm("ring", 256, 4),
    "gemm_ws_n256_s3": lambda: gemm("ws", 256, 3),
    "gemm_ws_n256_s4": lambda: gemm("ws", 256, 4),
    "warp_b1": lambda: warp_decode(1),
    "warp_b16": lambda: warp_decode(16),
    "warp_b16_h16": lambda: warp_decode(16, "v5_p2_lb_h16"),
    # the v7 kernels (2026-12-01 late): scale words carried, per-pair down, DSL routing; _x: cross-item prefetch
    "warp_b1_v7": lambda: warp_decode(1, "v7_u3c"),
    "warp_b1_v7x": lambda: warp_decode(1, "v7_u3c_x_cg_vpf"),
    "warp_b16_v7": lambda: warp_decode(16, "v7_u3c"),
    "warp_b16_v7x": lambda: warp_decode(16, "v7_u3c_x_cg_vpf"),
    "kda_k0": lambda: kda_decode(0, 0),
    "kda_k7": lambda: kda_decode(7, 7),
    "kda_scratch_k7": lambda: kda_decode(7, 7, "stream_scratch_vc64"),
    "kda_chunked_k7": lambda: kda_decode(7, 7, "chunked"),
    "kda_chunked_tc_k7": lambda: kda_decode(7, 7, "chunked_tc"),
    "kda_staged_k7": lambda: kda_decode(7, 7, "staged"),
    "kda_staged_pf_k7": lambda: kda_decode(7, 7, "staged_pf"),
    "kda_staged_pf1_k7": lambda: kda_decode(7, 7, "staged_pf1"),
    "kda_staged_touch_k7": lambda: kda_decode(7, 7, "staged_touch"),
    "kda_staged_pf_late_k7": lambda: kda_decode(7, 7, "staged_pf_late"),
    "flash_t8192": lambda: flash_kda(8192),
}


def main(names: list[str]) -> int:
    if not names or names == ["--list"]:
        print("cases:", " ".join(CASES))
        return 0 if names else 2
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"unknown cases {unknown}; known: {list(CASES)}", file=sys.stderr)
        return 2
    for name in names:
        call = CASES[name]()
        call()  # compile and warm up outside the profiled range
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        call()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print(f"[ncu_cases] {name} profiled", flush=True)
        del call
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
