"""The warp-specialized recurrence (flash_kda.RECURRENCE_WS) against the default recurrence, in the fewest GPU
seconds: per shape, one call each way on the same inputs, the two answers compared (output and final state, the
relative error figure of the tests), then each one's per-kernel times (torch profiler) and, last, fla's.

    python tools/flash_kda_ws_ab.py [--no-fla] [BxTxH ...]          (default 1x8192x12)

For a short device call: the variants tool (tools/flash_kda_variants.py) checks every form against sub16 and the
float64 oracle first, which this leaves to the GPU tests (`-k warp_specialized`).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_flash_kda as bench  # noqa: E402
from benchmarks.harness import kernel_times  # noqa: E402
from minitriton.kernels import flash_kda, kda_ref  # noqa: E402


def summary(rows: list[tuple[str, float]]) -> str:
    return f"{sum(t for _, t in rows):8.1f} us: " + ", ".join(f"{k} {t:.1f}" for k, t in rows)


def main(argv: list[str]) -> None:
    with_fla = "--no-fla" not in argv
    shapes = [tuple(int(n) for n in a.split("x")) for a in argv if not a.startswith("--")] or [(1, 8192, 12)]
    ws_default = flash_kda.RECURRENCE_WS
    for B, T, H in shapes:
        t0 = time.time()
        p = bench.make_problem(B, T, H)
        call = bench.ours(p, None)
        flash_kda.RECURRENCE_WS = False
        o, s = call()
        default = kernel_times(call)
        flash_kda.RECURRENCE_WS = True
        o_ws, s_ws = call()
        ws = kernel_times(call)
        flash_kda.WS_CP_PROGRAMS = not flash_kda.WS_CP_PROGRAMS  # the other segment count
        ws_other = kernel_times(call)
        flash_kda.WS_CP_PROGRAMS = not flash_kda.WS_CP_PROGRAMS
        flash_kda.RECURRENCE_WS = ws_default
        print(f"B={B} T={T} H={H}: WS vs default output {kda_ref.relative_error(o, o_ws):.2e}, "
              f"state {kda_ref.relative_error(s, s_ws):.2e}", flush=True)
        print(f"  default {summary(default)}", flush=True)
        print(f"  ws      {summary(ws)}   (WS_CP_PROGRAMS={flash_kda.WS_CP_PROGRAMS})", flush=True)
        print(f"  ws      {summary(ws_other)}   (WS_CP_PROGRAMS={not flash_kda.WS_CP_PROGRAMS})", flush=True)
        if with_fla:
            print(f"  fla     {summary(kernel_times(bench.fla(p)))}", flush=True)
        print(f"  ({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
