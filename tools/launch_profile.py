"""Time the Python side of a launch on the CPU: `kernel[grid](x, y, out, n, BLOCK=128)` with a no-op driver.

    python tools/launch_profile.py [--rounds 15] [--number 20000]

No GPU, compiler or ptxas is needed: a stand-in compiler returns a CompiledKernel whose parameters follow the
argument types, and the driver answers device -1 (so CPU tensors pass the device check), stream 0, and a launch
that does nothing. The driver's current_device / current_stream are C builtins; its launch is a Python function,
whose own cost is measured and subtracted from "Python overhead".

The breakdown is cumulative and honest about the real code: binder.generate(..., stop_after=STAGE) ends the
generated launch function after STAGE, so each line is (time up to STAGE) - (time up to the stage before). Every
number is the best of `rounds` interleaved rounds of `number` calls (this measures the code, not the noise of a
shared machine).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import minitriton as mt  # noqa: E402
from minitriton import compiler  # noqa: E402
from minitriton.compiler import CompiledKernel  # noqa: E402
from minitriton.ir.types import PointerType  # noqa: E402
from minitriton.runtime import binder, set_driver  # noqa: E402
from minitriton.runtime.specialize import type_spelling  # noqa: E402

N = 1024


@mt.kernel
def empty():
    pass


@mt.kernel
def add3(x, y, out, n, BLOCK: mt.constexpr):
    pass


OK = (0,)


def noop_launch(*args: Any) -> tuple:
    return OK


class NoopDriver:
    """The driver interface with nothing behind it (see minitriton/runtime/driver.py)."""

    current_device = (-1).__int__  # C builtins: no Python frame, like the real driver's torch getters
    current_stream = abs
    streams = {1: "the stream"}  # raw handle abs(-1) -> the stream object, a dict hit like the real driver's
    launch = staticmethod(noop_launch)

    def load_function(self, image: Any, name: str, device: int) -> int:
        return 0

    def max_shared_per_block(self, device: int) -> int:
        return 227 * 1024


def stand_in_compile(fn, arg_types, constexprs, *, num_warps=4, num_stages=3, **_: Any) -> CompiledKernel:
    params = [{"name": n, "type": type_spelling(t), "size": 8 if isinstance(t, PointerType) else max(1, t.bits // 8),
               "align": 8 if isinstance(t, PointerType) else max(1, t.bits // 8)} for n, t in arg_types.items()]
    meta = {"name": fn.__name__, "num_warps": num_warps, "num_stages": num_stages, "params": params, "shared": 0,
            "dynamic_shared": 0}
    return CompiledKernel(fn.__name__, "", b"cubin", meta)


def best_ns(fns: dict[str, Callable[[], Any]], rounds: int, number: int) -> dict[str, float]:
    """Best time per call of each function, in ns, over interleaved rounds."""
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(number):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / number * 1e9)
    return best


def staged(kernel: Any, grid: tuple, args: tuple, kwargs: dict) -> dict[str, Callable[[], Any]]:
    """The launch function cut after each stage (plus `kernel[grid]` alone), all warmed up."""
    fns: dict[str, Callable[[], Any]] = {}
    for stage in binder.STAGES:
        fn = binder.build_factory(kernel, torch.Tensor, stop_after=stage)(grid, None)
        fns[stage] = (lambda fn=fn: fn(*args, **kwargs))
    full = kernel[grid]
    fns["full launch function"] = lambda: full(*args, **kwargs)
    return fns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--number", type=int, default=20000)
    args = parser.parse_args(argv)

    compiler.compile_kernel = stand_in_compile
    previous = set_driver(NoopDriver())
    try:
        x, y, out = torch.randn(N), torch.randn(N), torch.randn(N)
        empty[(1,)]()
        add3[(8,)](x, y, out, N, BLOCK=128)  # compile (stand-in) and record the entries
        prepared = add3.prepare((8,), x, y, out, N, BLOCK=128) if hasattr(add3, "prepare") else None
        totals = {
            "empty[(1,)]()": lambda: empty[(1,)](),
            "add3[(8,)](x, y, out, n, BLOCK=128)": lambda: add3[(8,)](x, y, out, N, BLOCK=128),
            "driver stand-ins alone": lambda: (NoopDriver.current_device(), NoopDriver.streams[
                NoopDriver.current_stream(-1)], noop_launch(0, 8, 1, 1, 128, 1, 1, 0, 0, 0, 0)),
            "  of which launch()": lambda: noop_launch(0, 8, 1, 1, 128, 1, 1, 0, 0, 0, 0),
            "empty loop body": lambda: None,
        }
        if prepared is not None:
            totals["prepared()  (same arguments)"] = prepared
            totals["prepared(x, y, out, n)  (new arguments)"] = lambda: prepared(x, y, out, N)
        stages = {"add3[(8,)]": lambda: add3[(8,)]}
        stages.update(staged(add3, (8, 1, 1), (x, y, out, N), {"BLOCK": 128}))
        results = best_ns({**totals, **stages}, args.rounds, args.number)
    finally:
        set_driver(previous)

    loop = results["empty loop body"]
    driver_cost = results["driver stand-ins alone"] - loop
    launch_stub = results["  of which launch()"] - loop
    print(f"Host time per launch with a no-op driver (best of {args.rounds} x {args.number}; "
          f"loop overhead {loop:.0f} ns subtracted)\n")
    for name in totals:
        if name == "empty loop body":
            continue
        value = results[name] - loop
        line = f"  {name:44s} {value:7.0f} ns"
        if not name.startswith(" ") and name != "driver stand-ins alone":
            stub = driver_cost if "prepared()" not in name else launch_stub
            line += f"   Python overhead (minus the driver stand-ins) {value - stub:6.0f} ns"
        print(line)
    print("\nBreakdown of add3[(8,)](x, y, out, n, BLOCK=128), cumulative stages of the generated function:\n")
    print(f"  {'kernel[grid] (cached launch function)':44s} {results['add3[(8,)]'] - loop:7.0f} ns")
    previous_time = loop
    descriptions = {
        "bind": "call + bind (*extra/**unknown check)",
        "interpret": "MINITRITON_INTERPRET check",
        "device": "driver tuple + current_device()",
        "arguments": "arguments: data_ptr/device/dtype, int class",
        "lookup": "key tuple + entry lookup + unpack",
        "grid": "grid (static: unpack the validated tuple)",
        "stream": "current_stream() + stream object",
        "pack": "owner check + struct.pack_into",
        "launch": "launch() call + error check",
    }
    for stage in binder.STAGES:
        value = results[stage]
        print(f"  {descriptions[stage]:44s} {value - previous_time:7.0f} ns")
        previous_time = value
    print(f"  {'(full launch function, for comparison)':44s} {results['full launch function'] - loop:7.0f} ns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
