"""ptxas report and bar.sync count of every FlashKDA kernel as a call at the given shape launches it, without a GPU.

    python tools/flash_kda_ptx.py [--T 8192 --H 12 --K 128 --V 128] [--context-parallel]

chunk_kda runs on CPU tensors with its launches recorded instead of run (kernels_src/flash_kda.py `_launch` is the
one seam); each recorded kernel is compiled with the argument types and constexprs of its launch, 16-byte aligned
pointers as the runtime specializes them, and reported: registers, spills, shared memory (ptxas, when on PATH) and
the bar.sync in its PTX, per innermost loop (tools/barrier_sites.py). `--lines N` adds, per kernel, the N source
lines with the most shared-memory instructions in the PTX (st.shared, ld.shared, ldmatrix, bar.sync, next to the
mma and global-memory counts of the same line): which ops stage tiles through shared memory, statically.
`--per-warp` adds the mma.sync / ldmatrix each warp executes, evaluating the warp-uniform guards of
block-structured dots (codegen/mma.py `_warp_guard`: `bfe.u32 bit, MASK, warp % n, 1; setp.ne.u32 p, bit, 0`).
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from barrier_sites import counted_barriers  # noqa: E402

DTYPES = {torch.bfloat16: "bf16", torch.float32: "f32", torch.int32: "i32", torch.int64: "i64"}


def recorded_launches(T: int, H: int, K: int, V: int, context_parallel: bool | None,
                      initial_state: bool = True, batch: int = 1) -> list:
    """(kernel, grid, args, constexprs) of every launch chunk_kda makes at B = `batch`, with a final state and
    (unless initial_state is False) an initial one. Nothing runs, so the inputs are uninitialized CPU tensors
    (only their shapes, dtypes and alignment reach the launches: large shapes cost no random draws)."""
    from minitriton.kernels import flash_kda

    import os

    launches = []
    original, interpret = flash_kda._launch, os.environ.get("MINITRITON_INTERPRET")
    flash_kda._launch = lambda kernel, grid, args, **constexprs: launches.append((kernel, grid, args, constexprs))
    os.environ["MINITRITON_INTERPRET"] = "1"  # CPU tensors are accepted then; nothing is launched here anyway
    try:
        B, bf16 = batch, torch.bfloat16
        flash_kda.chunk_kda(q=torch.empty(B, T, H, K, dtype=bf16), k=torch.empty(B, T, H, K, dtype=bf16),
                            v=torch.empty(B, T, H, V, dtype=bf16), g=torch.empty(B, T, H, K, dtype=bf16),
                            beta=torch.empty(B, T, H, dtype=bf16), A_log=torch.zeros(H), dt_bias=torch.zeros(H * K),
                            initial_state=torch.zeros(B, H, K, V) if initial_state else None,
                            output_final_state=True, context_parallel=context_parallel)
    finally:
        flash_kda._launch = original
        if interpret is None:
            del os.environ["MINITRITON_INTERPRET"]
        else:
            os.environ["MINITRITON_INTERPRET"] = interpret
    return launches


def compile_launch(kernel, args, constexprs) -> tuple:  # type: ignore[no-untyped-def]
    """(CompiledKernel, Counter of (innermost loop) -> bar.sync) for one recorded launch."""
    from minitriton.compiler import compile_kernel
    from minitriton.ir.types import PointerType, ScalarType
    from minitriton.runtime import TensorDescriptor

    types, divisible = {}, {}
    for name, a in zip(kernel.runtime_params, args):
        if isinstance(a, torch.Tensor):
            types[name] = PointerType(ScalarType(DTYPES[a.dtype]))
            divisible[name] = 16
        elif isinstance(a, TensorDescriptor):  # the warp-specialized recurrence's TMA operands
            types[name] = a.type
        else:
            types[name] = ScalarType("f32" if isinstance(a, float) else "i32")
    options = dict(constexprs)
    warps = options.pop("num_warps", 4)
    stages = options.pop("num_stages", 3)
    with counted_barriers() as sites:
        compiled = compile_kernel(kernel.fn, types, options, divisibility=divisible, num_warps=warps,
                                  num_stages=stages, min_blocks_per_sm=kernel.min_blocks_per_sm)
    loops: collections.Counter = collections.Counter()
    for (_, _, loop), n in sites.items():
        loops[loop] += n
    return compiled, loops


_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)")
_GUARD = re.compile(r"^@!?%\w+\s+")
_CLASSES = (("st.shared", "st.shared"), ("ld.shared", "ld.shared"), ("ldmatrix", "ldmatrix"),
            ("bar.sync", "bar"), ("mma.sync", "mma"), ("wgmma.mma_async", "mma"), ("ld.global", "ld.global"),
            ("st.global", "st.global"))


def ptx_lines(ptx: str) -> dict[int, collections.Counter]:
    """Instruction classes of the PTX per kernel source line (the `.loc` above each instruction)."""
    lines: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    current = 0
    for text in ptx.splitlines():
        loc = _LOC.match(text)
        if loc:
            current = int(loc.group(2))
            continue
        op = _GUARD.sub("", text.strip()).split(" ", 1)[0]
        if not op or op.startswith((".", "//", "}", "{", "$")):
            continue
        counts = lines[current]
        counts["all"] += 1
        for prefix, name in _CLASSES:
            if op.startswith(prefix):
                counts[name] += 1
                break
    return lines


_GUARDED = re.compile(r"^\s*@(%p\d+) (\S+)")


def per_warp_counts(ptx: str, warps: int) -> list[collections.Counter]:
    """mma.sync and ldmatrix executed by each warp: unguarded ones by all, warp-guarded ones by the warps in their
    mask (other guards count as executed)."""
    consts = dict(re.findall(r"mov\.b32 (%r\d+), (\d+);", ptx))
    index = dict(re.findall(r"and\.b32 (%r\d+), %r\d+, (\d+);", ptx))
    bits = {b: (int(consts[m]), int(index[i])) for b, m, i in
            re.findall(r"bfe\.u32 (%r\d+), (%r\d+), (%r\d+), 1;", ptx) if m in consts and i in index}
    preds = {p: bits[b] for p, b in re.findall(r"setp\.ne\.u32 (%p\d+), (%r\d+), 0;", ptx) if b in bits}
    counts = [collections.Counter() for _ in range(warps)]
    for line in ptx.splitlines():
        guarded = _GUARDED.match(line)
        op = guarded.group(2) if guarded else line.strip().split(" ", 1)[0]
        kind = "mma" if op.startswith("mma.sync") else "ldmatrix" if op.startswith("ldmatrix") else None
        if kind is None:
            continue
        for w in range(warps):
            if guarded and guarded.group(1) in preds:
                mask, low_bits = preds[guarded.group(1)]
                if not (mask >> (w & low_bits)) & 1:
                    continue
            counts[w][kind] += 1
    return counts


def _print_lines(ptx: str, top: int) -> None:
    lines = ptx_lines(ptx)
    smem = lambda c: c["st.shared"] + c["ld.shared"] + c["ldmatrix"]  # noqa: E731
    cols = ("st.shared", "ld.shared", "ldmatrix", "bar", "mma", "ld.global", "st.global", "all")
    print("    line  " + " ".join(f"{c:>9}" for c in cols))
    for line, c in sorted(lines.items(), key=lambda kv: -smem(kv[1]))[:top]:
        print(f"    {line:5d} " + " ".join(f"{c[k]:9d}" for k in cols))
    total = collections.Counter()
    for c in lines.values():
        total.update(c)
    print("    total " + " ".join(f"{total[k]:9d}" for k in cols))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for dim, default in (("T", 8192), ("H", 12), ("K", 128), ("V", 128)):
        parser.add_argument(f"--{dim}", type=int, default=default)
    parser.add_argument("--context-parallel", action="store_true", default=None)
    parser.add_argument("--lines", type=int, default=0, metavar="N",
                        help="also print the N source lines with the most shared-memory instructions")
    parser.add_argument("--kernel", default="", help="only kernels whose name contains this")
    parser.add_argument("--per-warp", action="store_true", help="also print each warp's mma.sync / ldmatrix")
    args = parser.parse_args(argv)
    seen = set()
    for kernel, grid, launch_args, constexprs in recorded_launches(args.T, args.H, args.K, args.V,
                                                                    args.context_parallel):
        key = (kernel.__name__, tuple(sorted(constexprs.items())))
        if key in seen or args.kernel not in kernel.__name__:
            continue
        seen.add(key)
        compiled, loops = compile_launch(kernel, launch_args, constexprs)
        report = compiled.report() if compiled.metadata.get("registers") is not None else "(ptxas not on PATH)"
        print(f"{kernel.__name__} grid {grid} {constexprs}")
        print(f"    {report}")
        print(f"    bar.sync in the PTX: {sum(loops.values())}; per innermost loop: "
              + ", ".join(f"{loop} {n}" for loop, n in loops.most_common()))
        if args.lines:
            _print_lines(compiled.ptx, args.lines)
        if args.per_warp:
            for w, c in enumerate(per_warp_counts(compiled.ptx, constexprs.get("num_warps", 4))):
                print(f"    warp {w}: mma.sync {c['mma']}, ldmatrix {c['ldmatrix']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
