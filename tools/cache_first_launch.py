"""Measure the time to first launch of a kernel that is already in the on-disk cache, in a fresh process.

    python tools/cache_first_launch.py            # runs twice: a cold process fills the cache, a warm one measures

The warm process creates the CUDA context, allocates its tensors and sets up the driver bindings first (CUDA setup,
reported separately), then times the first `kernel[grid](...)` call: cache lookup, module load and launch, without
running the compiler.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time


def child() -> None:
    import torch

    torch.cuda.init()
    x = torch.randn(1 << 20, device="cuda")
    y, out = torch.randn_like(x), torch.empty_like(x)
    torch.cuda.synchronize()
    from minitriton.kernels.examples.vector_add import add_kernel
    import minitriton.compiler as compiler
    from minitriton.runtime import get_driver

    t_driver = time.perf_counter()
    get_driver()  # CUDA setup, like the context: imports cuda.bindings (~25 ms) and calls cuInit once per process
    driver_ms = (time.perf_counter() - t_driver) * 1e3

    compiled = []
    real = compiler.compile_kernel
    compiler.compile_kernel = lambda *a, **k: compiled.append(1) or real(*a, **k)  # count compiler runs
    profile = None
    if os.environ.get("MT_PROFILE"):
        import cProfile
        profile = cProfile.Profile()
        profile.enable()
    t0 = time.perf_counter()
    add_kernel[(x.numel() // 1024,)](x, y, out, x.numel(), BLOCK=1024)
    t1 = time.perf_counter()
    if profile is not None:
        import pstats
        profile.disable()
        pstats.Stats(profile, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
    torch.cuda.synchronize()
    ok = torch.equal(out, x + y)
    print(json.dumps({"first_launch_ms": (t1 - t0) * 1e3, "compiled": len(compiled), "correct": ok,
                      "driver_setup_ms": driver_ms}))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child()
        return 0
    env = dict(os.environ, MINITRITON_CACHE_DIR=tempfile.mkdtemp(prefix="mt-cache-"))
    runs = []
    for label in ("cold", "warm"):
        out = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True)
        if out.returncode:
            print(out.stdout, out.stderr)
            return 1
        r = json.loads(out.stdout.strip().splitlines()[-1])
        if label == "warm" and os.environ.get("MT_PROFILE"):
            print(out.stderr[-6000:])
        runs.append(r)
        print(f"{label} process: first launch {r['first_launch_ms']:.2f} ms, compiler runs {r['compiled']}, "
              f"correct {r['correct']} (driver setup before it, not counted: {r['driver_setup_ms']:.1f} ms)")
    warm = runs[1]
    good = warm["compiled"] == 0 and warm["first_launch_ms"] < 5 and warm["correct"]
    print("second process launches from the cache without compiling in < 5 ms:", "yes" if good else "NO")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
