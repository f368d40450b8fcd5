"""Per-kernel GPU time of one call, from torch.profiler: which kernel of a multi-kernel op takes the time.

    python tools/profile_kernels.py flash_kda [BxTxH ...]      (default: the five issue shapes)

Prints, per shape, each CUDA kernel's GPU microseconds per call (over 5 calls), ours and the
peer (fla), largest first.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import kernel_times  # noqa: E402


def flash_kda(shapes: list[tuple[int, int, int]]) -> None:
    from benchmarks import bench_flash_kda as b

    for B, T, H in shapes:
        p = b.make_problem(B, T, H)
        for name, make in (("ours", lambda: b.ours(p, None)), ("fla", lambda: b.fla(p))):
            try:
                rows = kernel_times(make())
            except Exception as e:  # report and go on
                print(f"B={B} T={T} H={H} {name}: FAILED {type(e).__name__}: {str(e)[:200]}")
                continue
            total = sum(t for _, t in rows)
            print(f"B={B} T={T} H={H} {name}: {total:9.1f} us of kernels per call")
            for key, t in rows[:8]:
                print(f"    {t:9.1f} us  {key[:90]}")
        del p
        torch.cuda.empty_cache()


if __name__ == "__main__":
    what, *shape_args = sys.argv[1:] or ["flash_kda"]
    from benchmarks.bench_flash_kda import SHAPES

    shapes = [tuple(int(x) for x in s.split("x")) for s in shape_args] or list(SHAPES)
    {"flash_kda": flash_kda}[what](shapes)  # type: ignore[arg-type]
