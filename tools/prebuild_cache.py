"""Compile FlashKDA's kernels here, into a kernel cache the GPU machine reuses, so its scarce time is not spent in
the compiler (~10-15 s per FlashKDA variant, a quarter of a `flash` step).

    python tools/prebuild_cache.py [--out=.mtcache] [--knob=NAME=VALUE[,...] ...] [BxTxH ...]

For the default constants, `sub16` (the variants tool's reference) and each `--knob` set (as
tools/flash_kda_variants.py takes them), at each shape (default that tool's two) and the oracle check's T1000 H4,
with and without an initial state: every launch chunk_kda would make is recorded (nothing runs) and its variant
compiled with `JITFunction.precompile` into --out. The cache key depends on the arguments' dtypes, alignment and
int classes and on the compiler and kernel sources, not on the device or paths, and ptxas here is the device's
13.0, so `tools/gpu_session.sh` copies a carried `.mtcache` into $MINITRITON_CACHE_DIR and the launches find
their cubins there: carry ".mtcache" next to ".whl". Any mismatch costs only the compile it would have cost.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flash_kda_ptx import recorded_launches  # noqa: E402
from flash_kda_variants import DEFAULT_SHAPES, ORACLE_SHAPE, knob, parse_knob  # noqa: E402


def prebuild(settings: tuple[tuple[str, object], ...], shapes: list[tuple[int, int, int]]) -> int:
    """Compile every kernel chunk_kda launches under `settings` at `shapes` (B x T x H); returns how many."""
    with contextlib.ExitStack() as stack:
        for name, value in settings:
            stack.enter_context(knob(name, value))
        count = 0
        for B, T, H in shapes:
            for h0 in (True, False):
                for kernel, _, args, constexprs in recorded_launches(T, H, 128, 128, None, initial_state=h0, batch=B):
                    kernel.precompile(*args, **constexprs)
                    count += 1
        return count


def main(argv: list[str]) -> None:
    out, knobs, shapes = ".mtcache", [()], []
    for arg in argv:
        if arg.startswith("--out="):
            out = arg.split("=", 1)[1]
        elif arg.startswith("--knob="):
            knobs.append(parse_knob(arg.split("=", 1)[1]))
        elif arg.startswith("--"):
            sys.exit(f"unknown option {arg} (see the docstring)")
        else:
            shapes.append(tuple(int(x) for x in arg.split("x")))
    os.environ["MINITRITON_CACHE_DIR"] = os.path.abspath(out)
    shapes = (shapes or list(DEFAULT_SHAPES)) + [ORACLE_SHAPE[:3]]
    for settings in [(("INTRA_VARIANT", "sub16"),), *knobs]:
        t0 = time.time()
        n = prebuild(settings, shapes)
        label = ",".join(f"{k}={v}" for k, v in settings) or "defaults"
        print(f"{label}: {n} launches compiled or found in {time.time() - t0:.1f} s", flush=True)
    print(f"cache: {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
