"""Launch overhead: host microseconds per launch, MiniTriton vs Triton JIT vs raw cuda-bindings cuLaunchKernel.

Two kernels: an empty one (no parameters) and a 3-tensor one (x, y, out, n: a 128-element masked add), launched as
users do (`add3[(1,)](x, y, out, n, BLOCK=128)`: the grid lookup, binding and specialization key are part of the
time). Two more rows time `add3.prepare(...)`, a launch function bound to the variant: called with no arguments it
re-launches the prepared ones, called with new tensors it checks that they fit the variant (no Triton peer).
Two references launch MiniTriton's own compiled function with its prebuilt parameter array: cuda-bindings'
cuLaunchKernel from Python ("cuda-bindings raw", the floor of any launcher built on cuda-bindings) and a loop in C
(compiled here with the system C compiler) calling libcuda's cuLaunchKernel: the floor, what the driver alone costs
per launch, so floor/ours is the share of our launch spent in the driver. tools/launch_profile.py breaks the Python
side down on the CPU.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from typing import Any, Callable

import minitriton as mt

from .harness import Table, host_time_us, log, triton_peers

N = 128


@mt.kernel
def empty():
    pass


@mt.kernel
def add3(x, y, out, n, BLOCK: mt.constexpr):
    offs = mt.arange(0, BLOCK)
    mask = offs < n
    mt.store(out + offs, mt.load(x + offs, mask=mask) + mt.load(y + offs, mask=mask), mask=mask)


def raw_launch(kernel: Any) -> Callable[[], Any]:
    """cuLaunchKernel on the kernel's only compiled variant, with the parameters it last packed (no Python work)."""
    import torch
    from cuda.bindings import driver as cu

    (launcher,) = kernel._variants.values()
    device = torch.cuda.current_device()
    fn, address = launcher.functions[device], launcher.params.address
    fn = cu.CUfunction(fn) if isinstance(fn, int) else fn  # an int handle when the C launcher is in use
    stream = cu.CUstream(torch.cuda.current_stream().cuda_stream)
    threads = launcher.threads
    return lambda: cu.cuLaunchKernel(fn, 1, 1, 1, threads, 1, 1, 0, stream, address, 0)


C_LOOP = r"""
#include <time.h>
typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                        void **, void **);
double c_loop(void *launch, void *fn, unsigned threads, void *stream, void **params, int n) {
    struct timespec a, b;
    launch_t f = (launch_t)launch;
    for (int i = 0; i < 500; ++i) f(fn, 1, 1, 1, threads, 1, 1, 0, stream, params, 0);
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < n; ++i) f(fn, 1, 1, 1, threads, 1, 1, 0, stream, params, 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n / 1e3;
}
"""


def c_loop_us(kernel: Any, n: int = 20000, repeats: int = 3) -> float | None:
    """Microseconds per cuLaunchKernel of the kernel's only variant from a C loop (None without a C compiler)."""
    import torch

    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    (launcher,) = kernel._variants.values()
    fn = int(launcher.functions[torch.cuda.current_device()])
    launch = ctypes.cast(ctypes.CDLL("libcuda.so.1").cuLaunchKernel, ctypes.c_void_p).value
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = os.path.join(tmp, "loop.c"), os.path.join(tmp, "loop.so")
        with open(src, "w") as f:
            f.write(C_LOOP)
        subprocess.run([cc, "-O2", "-shared", "-fPIC", src, "-o", lib], check=True)
        loop = ctypes.CDLL(lib).c_loop
        loop.restype = ctypes.c_double
        loop.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_int]
        stream = torch.cuda.current_stream().cuda_stream
        best = min(loop(launch, fn, launcher.threads, stream, launcher.params.address, n) for _ in range(repeats))
    torch.cuda.synchronize()
    return best


def run() -> Table:
    import torch

    from minitriton.runtime import c_launch
    from minitriton.runtime.driver import get_driver

    table = Table("launch", "Launch overhead (host us per launch; lower is better)", unit="us",
                  notes={"floor": "cuLaunchKernel from C"})
    table.notes["launcher"] = ("C extension (runtime/c_launch.py)" if get_driver().c_launch
                               else f"cuda-bindings ({c_launch.why_unavailable()})")
    x, y, out = (torch.randn(N, device="cuda") for _ in range(3))
    peers = triton_peers()
    cases = [
        ("empty", "grid (1,)", lambda: empty[(1,)](), empty,
         (lambda: peers.empty[(1,)]()) if peers else None),
        ("3 tensors", f"n={N}, grid (1,)", lambda: add3[(1,)](x, y, out, N, BLOCK=N), add3,
         (lambda: peers.add3[(1,)](x, y, out, N, BLOCK=N)) if peers else None),
    ]
    for name, shape, ours, kernel, triton_fn in cases:
        ours()  # compile and load
        if kernel is add3:
            torch.cuda.synchronize()
            torch.testing.assert_close(out, x + y)  # the kernel we time computes the right thing
        peer_times = {"cuda-bindings raw": host_time_us(raw_launch(kernel))}
        if triton_fn is not None:
            triton_fn()
            peer_times[f"triton {peers.triton.__version__}"] = host_time_us(triton_fn)
        table.add(name, shape, host_time_us(ours), peer_times, floor=c_loop_us(kernel))
    prepared = add3.prepare((1,), x, y, out, N, BLOCK=N)
    out.zero_()
    prepared(x, y, out, N)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x + y)
    floor = c_loop_us(add3)
    table.add("3 tensors, prepared()", f"n={N}, same arguments", host_time_us(prepared), {}, floor=floor)
    table.add("3 tensors, prepared(x, y, out, n)", f"n={N}, arguments checked",
              host_time_us(lambda: prepared(x, y, out, N)), {}, floor=floor)
    return table
