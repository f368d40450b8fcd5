"""Launch overhead: host microseconds per launch, MiniTriton vs Triton JIT vs raw cuda-bindings cuLaunchKernel.

Two kernels: an empty one (no parameters) and a 3-tensor one (x, y, out, n: a 128-element masked add), launched as
users do (`add3[(1,)](x, y, out, n, BLOCK=128)`: the grid lookup, binding and specialization key are part of the
time). Two more rows time `add3.prepare(...)`, a launch function bound to the variant: called with no arguments it
re-launches the prepared ones, called with new tensors it checks that they fit the variant (no Triton peer).
The raw launch calls cuLaunchKernel on MiniTriton's own compiled function with its prebuilt parameter array: it is
the floor (what the driver call alone costs from Python), so floor/ours is the share of our launch spent in the
driver. tools/launch_profile.py breaks the Python side down on the CPU.
"""
from __future__ import annotations

from typing import Any, Callable

import minitriton as mt

from .harness import Table, host_time_us, log

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
    stream = cu.CUstream(torch.cuda.current_stream().cuda_stream)
    threads = launcher.threads
    return lambda: cu.cuLaunchKernel(fn, 1, 1, 1, threads, 1, 1, 0, stream, address, 0)


def triton_peers() -> Any:
    try:
        from . import triton_peers as peers
    except ImportError:
        log("triton is not installed: no Triton column")
        return None
    return peers


def run() -> Table:
    import torch

    table = Table("launch", "Launch overhead (host us per launch; lower is better)", unit="us",
                  notes={"floor": "raw cuLaunchKernel"})
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
        floor = host_time_us(raw_launch(kernel))
        peer_times = {}
        if triton_fn is not None:
            triton_fn()
            peer_times[f"triton {peers.triton.__version__}"] = host_time_us(triton_fn)
        table.add(name, shape, host_time_us(ours), peer_times, floor=floor)
    prepared = add3.prepare((1,), x, y, out, N, BLOCK=N)
    out.zero_()
    prepared(x, y, out, N)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x + y)
    floor = host_time_us(raw_launch(add3))
    table.add("3 tensors, prepared()", f"n={N}, same arguments", host_time_us(prepared), {}, floor=floor)
    table.add("3 tensors, prepared(x, y, out, n)", f"n={N}, arguments checked",
              host_time_us(lambda: prepared(x, y, out, N)), {}, floor=floor)
    return table
