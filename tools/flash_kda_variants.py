"""Time FlashKDA's phase-1 variants (chunk64, sub16) and phase-2 warp choices on the GPU, ours only, per kernel
(torch.profiler), at the shapes given (default B1 T32768 H16 and B1 T8192 H12).

    python tools/flash_kda_variants.py [BxTxH ...]
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_flash_kda as bench  # noqa: E402
from minitriton.kernels import flash_kda  # noqa: E402
from tools.profile_kernels import kernel_times  # noqa: E402


def main() -> None:
    shapes = [tuple(int(x) for x in s.split("x")) for s in sys.argv[1:]] or [(1, 32768, 16), (1, 8192, 12)]
    for B, T, H in shapes:
        p = bench.make_problem(B, T, H)
        for variant in ("chunk64", "sub16"):
            flash_kda.INTRA_VARIANT = variant
            rows = kernel_times(bench.ours(p, None))
            total = sum(t for _, t in rows)
            print(f"B={B} T={T} H={H} {variant}: {total:9.1f} us  " + ", ".join(f"{k} {t:.1f}" for k, t in rows))
        del p
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
