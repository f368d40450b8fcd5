"""The compilation pipeline: Python function -> tile IR (frontend) -> passes -> PTX (codegen) -> cubin (ptxas).

`compile_kernel` runs it for one specialization and returns a CompiledKernel: the PTX, the cubin (None when ptxas
is not on PATH: the driver then JIT-compiles the PTX at load time), and JSON-ready metadata — the entry name, the
parameter layout the launcher packs (name, Triton-spelled type, PTX size and alignment of each parameter), num_warps,
shared memory, and the ptxas report (registers, spills).

MINITRITON_DUMP_IR=1 prints the IR after the frontend and after each pass, and the PTX, to stderr.
The frontend, passes and codegen are imported when first used, so importing this module is cheap.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from minitriton.errors import CompilationError

# Passes run on every kernel, in order (names looked up in the pass registry when a kernel compiles).
# "pipeline" (cp.async rings for K-loops; wgmma dots read the slots in place, asynchronously: passes/pipeline.py)
# is verified on the CPU (ptxas, PTX simulator replays of every kernel test) but not yet on the H200.
# "warp-specialize" acts on kernels compiled with warp_specialize=True (TMA rings: a producer warpgroup) and on
# kernels with an explicit mt.warp_specialize block (ring protocols); the func attr num_warps then counts every
# partition's warps, so the launcher's block size follows (passes/warp_specialize.py). "async-dots" keeps one wgmma
# in flight in explicit partitions' K loops (passes/async_dots.py).
PIPELINE: list[str] = ["canonicalize", "tiling", "dot-lowering", "pipeline", "warp-specialize", "async-dots",
                       "defer-dot-waits"]
# The interpreter runs tile IR: only clean-ups, no layout assignment.
INTERPRET_PIPELINE: list[str] = ["canonicalize"]

ARCH = "sm_90a"
TARGETS = ("ir", "ptx", "cubin")


@dataclass
class CompiledKernel:
    """One compiled specialization. `metadata` is what the cache stores as JSON and the launcher reads."""

    name: str
    ptx: str | None
    cubin: bytes | None
    metadata: dict[str, Any]
    ir: dict[str, str] = field(default_factory=dict)  # stage -> IR text, when compiled with keep_ir=True

    @property
    def num_warps(self) -> int:
        return int(self.metadata["num_warps"])

    @property
    def registers(self) -> int | None:
        return self.metadata.get("registers")

    def report(self) -> str:
        """One line: registers, shared memory and spills (as ptxas reported them)."""
        m = self.metadata
        if m.get("registers") is None:
            return f"{self.name}: no ptxas report (ptxas was not run)"
        return (f"{self.name}: {m['registers']} registers, {m.get('shared', 0)} bytes static shared memory, "
                f"{m.get('dynamic_shared', 0)} bytes dynamic, {m.get('spill_stores', 0)} bytes spill stores, "
                f"{m.get('spill_loads', 0)} bytes spill loads, num_warps={m['num_warps']}")


# ------------------------------------------------------------------------------------------- pipeline


def compile_kernel(fn: Callable, arg_types: dict[str, Any], constexprs: dict[str, Any], *,
                   divisibility: dict[str, int] | None = None, equal_to_one: set[str] | None = None,
                   num_warps: int = 4, num_stages: int = 3, target: str = "cubin",
                   keep_ir: bool = False, min_blocks_per_sm: int | None = None,
                   warp_specialize: bool = False) -> CompiledKernel:
    """Compile one specialization of `fn`.

    target: "ir" stops after the passes (ptx None), "ptx" stops after codegen, "cubin" also runs ptxas when it is
    on PATH (cubin stays None otherwise). keep_ir records the IR text after the frontend and after the passes.
    min_blocks_per_sm (CUDA's __launch_bounds__ minBlocks): the PTX entry gets `.minnctapersm N`, so ptxas limits
    registers to let N programs share an SM. warp_specialize: a TMA-fed wgmma ring gets a producer warpgroup
    (passes/warp_specialize.py; metadata num_warps then includes its 4 warps).
    """
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
    module, stages = build_ir(fn, arg_types, constexprs, divisibility=divisibility, equal_to_one=equal_to_one,
                              num_warps=num_warps, num_stages=num_stages, pipeline=PIPELINE, keep_ir=keep_ir,
                              warp_specialize=warp_specialize)
    func = module.functions[0]
    if min_blocks_per_sm:
        func.attrs["min_blocks_per_sm"] = int(min_blocks_per_sm)
    name = func.attrs["sym_name"]
    meta = base_metadata(func, num_stages, constexprs)
    if target == "ir":
        return CompiledKernel(name, None, None, meta, stages)
    from minitriton.codegen import emit_ptx

    ptx = emit_ptx(module, name)
    dump_stage("PTX", ptx)
    meta["params"] = param_layout(func, ptx, name)
    cubin = None
    if target == "cubin" and ptxas_path() is not None:
        cubin, report = ptxas_metadata(ptx)
        meta.update(report)
    return CompiledKernel(name, ptx, cubin, meta, stages)


def build_ir(fn: Callable, arg_types: dict[str, Any], constexprs: dict[str, Any], *,
             divisibility: dict[str, int] | None = None, equal_to_one: set[str] | None = None,
             num_warps: int = 4, num_stages: int = 3, pipeline: list[str] | None = None,
             keep_ir: bool = False, warp_specialize: bool = False) -> tuple[Any, dict[str, str]]:
    """Frontend then passes; returns the module and (with keep_ir) the IR text per stage."""
    from minitriton.frontend import compile_to_ir
    from minitriton.passes import get_pass
    from minitriton.ir import verify

    module = compile_to_ir(fn, arg_types, constexprs, divisibility=divisibility or {},
                           equal_to_one=equal_to_one or set(), num_warps=num_warps)
    for func in module.functions:  # the pipelining pass reads num_stages from the kernel
        func.attrs.setdefault("num_stages", num_stages)
        if warp_specialize:
            func.attrs["warp_specialize"] = True
    stages: dict[str, str] = {}
    record_stage(stages, "frontend", module, keep_ir)
    for pass_name in PIPELINE if pipeline is None else pipeline:
        module = get_pass(pass_name)(module)
        verify(module)
        record_stage(stages, pass_name, module, keep_ir)
    return module, stages


def record_stage(stages: dict[str, str], stage: str, module: Any, keep_ir: bool) -> None:
    dumping = dump_enabled()
    if not keep_ir and not dumping:
        return  # printing costs; only when someone reads it
    text = str(module)
    if keep_ir:
        stages[stage] = text
    if dumping:
        dump_stage(f"IR after {stage}", text)


def dump_enabled() -> bool:
    return os.environ.get("MINITRITON_DUMP_IR", "") not in ("", "0")


def dump_stage(title: str, text: str) -> None:
    if dump_enabled():
        sys.stderr.write(f"// -----// {title} //----- //\n{text}\n")


def base_metadata(func: Any, num_stages: int, constexprs: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": func.attrs["sym_name"],
        "num_warps": int(func.attrs.get("num_warps", 4)),
        "num_stages": int(func.attrs.get("num_stages", num_stages)),
        "dynamic_shared": int(func.attrs.get("dynamic_shared_memory", 0)),
        # a kernel that waits on the previous grid (mt.grid_dependency_wait) may be launched before it finishes
        "programmatic_launch": any(op.name == "mt.griddep_wait" for op in func.walk()),
        "params": func_params(func),
        "constexprs": {k: repr(v) for k, v in constexprs.items()},
        "registers": None, "shared": None, "spill_stores": None, "spill_loads": None, "ptxas_log": None,
    }


# ------------------------------------------------------------------------------------ PTX parameters

_PTX_PARAM = re.compile(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.([a-z]+)(\d+)\s+[\w$%]+\s*(?:\[(\d+)\])?")


def ptx_entry_params(ptx: str, name: str) -> list[tuple[str, int, int]]:
    """The parameters of `.entry name(...)` as (PTX type, size in bytes, alignment), in order."""
    match = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\(([^)]*)\)", ptx)
    if match is None:
        if re.search(r"\.entry\s+" + re.escape(name) + r"\b", ptx):
            return []  # `.entry name` with no parameter list
        raise CompilationError(f"codegen produced no `.entry {name}` in the PTX")
    params = []
    for align, kind, bits, count in _PTX_PARAM.findall(match.group(1)):
        size = int(bits) // 8 * (int(count) if count else 1)
        params.append((f".{kind}{bits}", size, int(align) if align else int(bits) // 8))
    return params


def param_layout(func: Any, ptx: str, name: str) -> list[dict[str, Any]]:
    """Each kernel argument with the size and alignment its PTX parameter declares (what the launcher packs)."""
    params = func_params(func)
    declared = ptx_entry_params(ptx, name)
    if len(declared) != len(params):
        raise CompilationError(f"kernel '{name}': the PTX entry declares {len(declared)} parameters but the IR "
                               f"function has {len(params)} arguments")
    out = []
    for p, (ptx_type, size, align) in zip(params, declared):
        out.append({**p, "ptx": ptx_type, "size": size, "align": align})
    return out


def func_params(func: Any) -> list[dict[str, Any]]:
    from minitriton.runtime.specialize import type_spelling

    types = func.attrs["function_type"].inputs
    names = func.attrs.get("arg_names") or [f"arg{i}" for i in range(len(types))]
    return [{"name": n, "type": type_spelling(t)} for n, t in zip(names, types)]


# ---------------------------------------------------------------------------------------------- ptxas


def ptxas_path() -> str | None:
    """Where ptxas is (None when it is not on PATH: the driver then JIT-compiles the PTX at load time)."""
    from minitriton.codegen.ptxas import ptxas_path as find

    return find()


def ptxas_metadata(ptx: str) -> tuple[bytes, dict[str, Any]]:
    """Assemble with codegen's run_ptxas (`ptxas -arch=sm_90a -v -lineinfo`; PtxasError on failure or C7508);
    returns the cubin and its report as metadata fields."""
    from minitriton.codegen import run_ptxas

    report = run_ptxas(ptx, ARCH)
    return report.cubin, {"registers": report.registers, "shared": report.smem, "spill_stores": report.spill_stores,
                          "spill_loads": report.spill_loads, "stack": report.stack, "ptxas_log": report.log.strip()}


# ----------------------------------------------------------------------------------- compiler version


@functools.lru_cache(maxsize=None)
def compiler_version() -> str:
    """A hash of every source file of the compiler (minitriton, frontend, passes, codegen), once per process.

    Any edit to the compiler changes it, so cached kernels built by another version are never reused.
    (runtime/cache.py memoizes it on disk by the files' sizes and mtimes: reading them all takes milliseconds.)
    """
    digest = hashlib.sha256()
    for root, path in compiler_sources():
        digest.update(os.path.relpath(path, root).encode())
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:32]


def compiler_sources() -> list[tuple[str, str]]:
    """(root, path) of every .py / .lark file of the compiler, in a fixed order."""
    found = []
    for root in _compiler_roots():
        for folder, subfolders, files in os.walk(root):
            subfolders[:] = sorted(d for d in subfolders if d != "__pycache__")
            found += [(root, os.path.join(folder, n)) for n in sorted(files) if n.endswith((".py", ".lark"))]
    return found


def _compiler_roots() -> list[str]:
    """The folders of minitriton and of the packages mapped into it (frontend/, passes/, codegen/)."""
    roots = [os.path.dirname(os.path.realpath(__file__))]
    for sub in ("minitriton.frontend", "minitriton.passes", "minitriton.codegen"):
        spec = importlib.util.find_spec(sub)  # finds the folder without importing the package
        if spec is not None and spec.submodule_search_locations:
            roots.extend(os.path.realpath(p) for p in spec.submodule_search_locations)
    # minitriton/ holds runtime/, ir/, interpreter/: drop roots nested in another (a source install)
    return [r for i, r in enumerate(roots)
            if r not in roots[:i] and not any(r.startswith(u + os.sep) for u in roots if u != r)]
