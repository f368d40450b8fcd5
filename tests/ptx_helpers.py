"""Helpers for the PTX tests: build kernels, lower them to PTX, and run them three ways on the same inputs —
the interpreter (the reference), the PTX simulator (tests/ptx_sim.py, on the CPU) and, where a GPU is present,
the CUDA driver through cuda-bindings (`launch_on_gpu`: a minimal launcher for tests; the real one is
minitriton/runtime's).

A kernel is given as a zero-argument *maker* returning a fresh Module, because tiling rewrites the module in
place and the interpreter runs the untiled one.
"""
from __future__ import annotations

import ctypes
import re
from typing import Any, Callable, Sequence

import torch

from minitriton.codegen import emit_ptx
from minitriton.compiler import PIPELINE
from minitriton.frontend import compile_to_ir
from minitriton.interpreter import interpret
from minitriton.ir import Builder, Module, function_body, make_function, tensor
from minitriton.ir.types import PointerType, ScalarType, Type
from minitriton.passes import run_passes
from ptx_sim import run_ptx

Maker = Callable[[], Module]


def dsl(fn: Any, types: dict[str, Type], constexprs: dict[str, Any] | None = None,
        divisibility: dict[str, int] | None = None, num_warps: int = 4) -> Maker:
    """A maker compiling a DSL kernel (canonicalized, as the compiler's pipeline does)."""

    def make() -> Module:
        m = compile_to_ir(fn, types, constexprs or {}, divisibility=divisibility or {}, num_warps=num_warps)
        return run_passes(m, ["canonicalize"])

    return make


def lower(make: Maker) -> tuple[str, str, int]:
    """(PTX, kernel name, threads per CTA) of a fresh module after the compiler's passes from tiling on (the maker
    already canonicalized it)."""
    module = run_passes(make(), PIPELINE[PIPELINE.index("tiling"):])
    func = module.functions[0]
    name = func.attrs["sym_name"]
    return emit_ptx(module, name), name, int(func.attrs.get("num_warps", 4)) * 32


def clone_args(args: Sequence[Any]) -> list[Any]:
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def run_interpreted(make: Maker, grid: Sequence[int], args: Sequence[Any]) -> list[Any]:
    out = clone_args(args)
    interpret(make().functions[0], tuple(grid), out)
    return out


def run_simulated(make: Maker, grid: Sequence[int], args: Sequence[Any], ptx: str | None = None) -> list[Any]:
    text, name, threads = lower(make)
    out = clone_args(args)
    run_ptx(ptx or text, name, tuple(grid), out, threads)
    return out


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float64 (NaN when got has a NaN where want does not)."""
    g, w = got.double(), want.double()
    if not torch.equal(torch.isnan(g), torch.isnan(w)):
        return float("nan")
    g, w = torch.nan_to_num(g), torch.nan_to_num(w)
    return ((g - w).norm() / w.norm().clamp_min(1e-30)).item()


# --------------------------------------------------------------------------------------- builder kernels


OpSpec = tuple[str, Sequence[int], ScalarType, dict]  # (op name, input indices, result type, attributes)


def elementwise_kernel(in_types: Sequence[ScalarType], ops: Sequence[OpSpec], n: int = 256,
                       num_warps: int = 4) -> Maker:
    """Loads in0..ink (n elements each, one program) and stores op_j(inputs) to out_j for each op, every pointer
    16-byte aligned: kernel `ew(in0, .., ink, out0, .., outm)`."""

    def make() -> Module:
        params = [PointerType(t) for t in in_types] + [PointerType(o[2]) for o in ops]
        names = [f"in{i}" for i in range(len(in_types))] + [f"out{j}" for j in range(len(ops))]
        func = make_function("ew", params, names, num_warps=num_warps, divisibility=[16] * len(params))
        b = Builder(function_body(func))
        args = function_body(func).args
        offs = b.create1("mt.arange", [], tensor([n], ScalarType("i32")), start=0, end=n)
        ptrs = [b.create1("mt.addptr", [b.create1("mt.splat", [a], tensor([n], a.type)), offs], tensor([n], a.type))
                for a in args]
        loaded = [b.create1("mt.load", [p], tensor([n], t)) for p, t in zip(ptrs, in_types)]
        for j, (name, inputs, out_type, attrs) in enumerate(ops):
            result = b.create1(name, [loaded[i] for i in inputs], tensor([n], out_type), **attrs)
            b.create("mt.store", [ptrs[len(in_types) + j], result])
        b.create("mt.return")
        return Module([func])

    return make


# -------------------------------------------------------------------------------------------- on a GPU


def _ok(result: Any) -> Any:
    from cuda.bindings import driver as cu

    err, *rest = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver error {err}")
    return rest[0] if len(rest) == 1 else rest


_PARAM_CTYPE = {"u64": ctypes.c_uint64, "u32": ctypes.c_uint32, "s32": ctypes.c_int32, "f32": ctypes.c_float,
                "f64": ctypes.c_double}


def launch_on_gpu(ptx: str, name: str, grid: Sequence[int], args: Sequence[Any], threads: int) -> list[Any]:
    """Run the PTX with the driver (cuModuleLoadData + cuLaunchKernel) on copies of args moved to the GPU; returns
    the arguments with tensors copied back to the CPU."""
    from cuda.bindings import driver as cu

    torch.zeros(1, device="cuda")  # makes torch's primary context current for the driver API
    module = _ok(cu.cuModuleLoadData(ptx.encode() + b"\0"))
    try:
        fn = _ok(cu.cuModuleGetFunction(module, name.encode()))
        entry = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
        types = re.findall(r"\.param\s+\.(\w+)\s+\w+", entry.group(1)) if entry else []
        device_args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
        slots = [_PARAM_CTYPE[t](a.data_ptr() if isinstance(a, torch.Tensor) else a)
                 for t, a in zip(types, device_args)]
        params = (ctypes.c_void_p * len(slots))(*[ctypes.addressof(s) for s in slots])
        g = tuple(grid) + (1,) * (3 - len(grid))
        stream = torch.cuda.current_stream().cuda_stream
        _ok(cu.cuLaunchKernel(fn, g[0], g[1], g[2], threads, 1, 1, 0, stream, ctypes.addressof(params), 0))
        torch.cuda.synchronize()
    finally:
        _ok(cu.cuModuleUnload(module))
    return [a.cpu() if isinstance(a, torch.Tensor) else a for a in device_args]
