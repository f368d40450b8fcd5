"""Where a launch's host time goes, below any Python launcher: cuLaunchKernel of an empty kernel timed from C (a
loop compiled with the system C compiler, when there is one), through ctypes, and through cuda-bindings, all on
the same function, stream and prebuilt parameter array in one process.

    python tools/launch_floor.py            # prints microseconds per launch for each way in
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
import time

import torch

C_LOOP = r"""
#include <stdint.h>
#include <time.h>
typedef int (*launch_t)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**, void**);
double c_loop(void *launch, void *fn, void *stream, void **params, int n) {
    struct timespec a, b;
    launch_t f = (launch_t)launch;
    for (int i = 0; i < 100; ++i) f(fn, 1, 1, 1, 32, 1, 1, 0, stream, params, 0);
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < n; ++i) f(fn, 1, 1, 1, 32, 1, 1, 0, stream, params, 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n / 1e3;
}
"""


def per_launch_us(fn, n: int = 20000, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    torch.cuda.synchronize()
    return best


def main() -> None:
    import minitriton as mt
    from cuda.bindings import driver as cu

    @mt.kernel
    def empty():
        pass

    empty[(1,)]()
    torch.cuda.synchronize()
    (variant,) = empty._variants.values()
    fn = variant.functions[torch.cuda.current_device()]
    fn_ptr = int(fn)
    stream_raw = torch.cuda.current_stream().cuda_stream
    params = variant.params.address
    libcuda = ctypes.CDLL("libcuda.so.1")
    launch = libcuda.cuLaunchKernel
    launch.restype = ctypes.c_int
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    results = {"mt empty[(1,)]()": per_launch_us(lambda: empty[(1,)]())}
    stream = cu.CUstream(stream_raw)
    results["cuda-bindings cuLaunchKernel"] = per_launch_us(
        lambda: cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, params, 0))
    results["ctypes cuLaunchKernel"] = per_launch_us(lambda: launch(fn_ptr, 1, 1, 1, 32, 1, 1, 0, stream_raw, params, None))
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc:
        with tempfile.TemporaryDirectory() as d:
            src, lib = os.path.join(d, "loop.c"), os.path.join(d, "loop.so")
            open(src, "w").write(C_LOOP)
            subprocess.run([cc, "-O2", "-shared", "-fPIC", src, "-o", lib], check=True)
            loop = ctypes.CDLL(lib).c_loop
            loop.restype = ctypes.c_double
            loop.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int]
            addr = ctypes.cast(launch, ctypes.c_void_p).value
            results["C loop cuLaunchKernel"] = min(loop(addr, fn_ptr, stream_raw, params, 20000) for _ in range(3))
            torch.cuda.synchronize()
    else:
        results["C loop cuLaunchKernel"] = None
    print(f"C compiler: {cc}")
    for k, v in results.items():
        print(f"{k:34s} {'-' if v is None else f'{v:.2f} us'}")


if __name__ == "__main__":
    main()
