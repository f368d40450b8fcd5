"""Per-kernel GPU time of one call, from torch.profiler: which kernel of a multi-kernel op takes the time.

    python tools/profile_kernels.py flash_kda [BxTxH ...]      (default: the five issue shapes)

Prints, per shape, each CUDA kernel's total microseconds over `REPEAT` calls divided by REPEAT, ours and the
peer (fla), largest first.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPEAT = 5


def kernel_times(fn) -> list[tuple[str, float]]:  # type: ignore[no-untyped-def]
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPEAT):
            fn()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / REPEAT) for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r[1])


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
