"""Sweep softmax launch shapes on the GPU (4096 x 8192 bf16): one program per row vs the persistent row loop at
several grids and warp counts; prints microseconds and the fraction of the copy bandwidth for each."""
from __future__ import annotations

import torch

from benchmarks.harness import copy_bandwidth, do_bench
from minitriton.kernels.examples import softmax as S

ROWS, COLS = 4096, 8192


def main() -> None:
    x = torch.randn(ROWS, COLS, device="cuda").to(torch.bfloat16)
    ref = S.reference(x).float()
    copy = copy_bandwidth()
    floor_us = 2 * x.numel() * 2 / copy * 1e6
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def check_and_time(name, fn):
        out = fn()
        err = (out.float() - ref).abs().max().item()
        us = do_bench(fn) * 1e3
        print(f"{name:40s} {us:8.2f} us  {floor_us / us:6.1%} of copy  max err {err:.2e}", flush=True)

    for warps in (4, 8, 16):
        def per_row(w=warps):
            out = torch.empty_like(x)
            S.softmax_kernel[(ROWS,)](x, out, COLS, COLS, COLS, BLOCK=COLS, ONE_BLOCK=True, num_warps=w)
            return out
        check_and_time(f"one program per row, {warps} warps", per_row)
    for warps in (4, 8, 16):
        for per_sm in (1, 2, 3, 4, 6, 8):
            grid = min(ROWS, sms * per_sm)

            def rows(w=warps, g=grid):
                out = torch.empty_like(x)
                S.softmax_rows_kernel[(g,)](x, out, ROWS, COLS, COLS, COLS, BLOCK=COLS, num_warps=w)
                return out
            check_and_time(f"row loop, {warps} warps, grid {grid} ({per_sm}/SM)", rows)


if __name__ == "__main__":
    main()
