"""A/B of the general KDA decode kernel's register cap (min_blocks_per_sm 2 vs none) at B256 H12, k = 0 and k = 7
(all accepted), ours only: which specializations should fit two programs per SM. k = 0 runs the general kernel
here (variant "loop"), not the streamed T = 1 kernel; tools/kda_decode_ab.py compares all variants.

    python tools/kda_decode_cap.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_kda_decode as bench  # noqa: E402
from minitriton.kernels import kda_decode  # noqa: E402


def main() -> None:
    kernel = kda_decode.kda_decode_step_kernel
    for drafts in (0, 7):
        p = bench.make_problem(256, 12, drafts)
        for cap in (2, None):
            kernel.min_blocks_per_sm = cap
            kernel.clear_cache()  # recompile (the disk cache key includes the cap)
            us = bench.time_us(lambda: bench.ours(p, drafts, "loop"), graph=False)
            print(f"k={drafts} min_blocks_per_sm={cap}: {us:.1f} us", flush=True)


if __name__ == "__main__":
    main()
