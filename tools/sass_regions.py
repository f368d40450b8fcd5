"""Loops and a latency model of a kernel's SASS (no GPU): where the serialized memory round trips of one warp are.

    python tools/sass_regions.py staged_pf [--drafts 7] [--l2 550]     (a kda_decode staged variant at K3)
    python tools/sass_regions.py FILE.sass [--l2 550]                  (any `nvdisasm -c` listing)

Prints every loop (a backward branch: its instruction range, its size and its LDG / SHFL / CCTL / spill counts) and,
for each loop body and each stretch of straight-line code between loops, the time one warp takes through it in an
in-order model: an instruction issues one cycle after the previous one or when its source registers are ready,
whichever is later; global loads take L cycles (shown at L = 40, an L1 hit, and at --l2, an L2 round trip under
load), local loads (spill reloads) --local (40: L1 hits), shuffles 25, shared loads 30, MUFU / S2R 20, everything
else 5. The slope between the two columns is
the number of memory round trips the warp waits out one after another. It models one warp alone (no contention,
no barrier waits): docs/kernels/kda_decode.md ("prefetching the staged kernel's columns") fits it to measurements.
nvdisasm is taken from $NVDISASM, then PATH.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

Instr = tuple[int, str]  # (byte offset, text without the trailing ';')
NO_DEST = ("STG", "STS", "STL", "BRA", "BAR", "EXIT", "CCTL", "RED", "ATOM", "ST", "WARPSYNC", "NOP", "MEMBAR")
COUNTED = ("LDG", "STG", "LDL", "STL", "BAR", "SHFL", "CCTL", "LDS", "STS")


def parse(sass: str) -> tuple[list[Instr], dict[str, int]]:
    """The instructions of an nvdisasm listing and its labels (label -> instruction index)."""
    ins: list[Instr] = []
    labels: dict[str, int] = {}
    for line in sass.splitlines():
        m = re.match(r"^(\.L_x_\d+):", line.strip())
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    return ins, labels


def loops(ins: list[Instr], labels: dict[str, int]) -> list[tuple[int, int]]:
    """[start, end) instruction ranges of the backward branches, innermost last among equals."""
    found = set()
    for i, (_, text) in enumerate(ins):
        m = re.search(r"BRA\s+`?\(?(\.L_x_\d+)", text)
        if m and labels.get(m.group(1), len(ins)) <= i:
            found.add((labels[m.group(1)], i + 1))
    return sorted(found)


def _regs(operand: str) -> list[str]:
    out = []
    for m in re.finditer(r"\b(U?R\d+|U?P\d+)(\.64)?", operand):
        out.append(m.group(1))
        if m.group(2):  # a 64-bit address pair
            out.append(re.sub(r"\d+", lambda x: str(int(x.group()) + 1), m.group(1)))
    return out


def _split(text: str) -> tuple[str, list[str], list[str]]:
    """(base opcode, destination registers, source registers) of one instruction."""
    guard = []
    if text.startswith("@"):
        g, text = text.split(None, 1)
        guard = _regs(g)
    parts = text.split(None, 1)
    op = parts[0]
    operands = [o.strip() for o in parts[1].split(",")] if len(parts) > 1 else []
    base = op.split(".")[0]
    dests: list[str] = []
    rest = operands
    if base not in NO_DEST and operands:
        width = 4 if ".128" in op else 2 if (".64" in op or ".WIDE" in op) else 1
        first = _regs(operands[0])
        if first:
            r = first[0]
            n = width if r.startswith(("R", "UR")) else 1
            dests = [re.sub(r"\d+", lambda x: str(int(x.group()) + k), r) for k in range(n)]
        rest = operands[1:]
        while rest and re.fullmatch(r"!?U?P(\d+|T)", rest[0]) and base not in ("SEL", "FSEL", "USEL"):
            dests += [p for p in _regs(rest[0])]
            rest = rest[1:]
    srcs = [r for o in rest for r in _regs(o)] + guard
    return base, dests, srcs


def latency(body: list[Instr], mem: int, local: int = 40) -> int:
    """Cycles one warp takes through `body` in the in-order model (global loads: `mem` cycles, local: `local`)."""
    ready: dict[str, int] = {}
    t = 0
    for _, text in body:
        base, dests, srcs = _split(text)
        start = max([t + 1] + [ready.get(s, 0) for s in srcs])
        lat = mem if base == "LDG" else local if base == "LDL" else 30 if base == "LDS" else 25 if base == "SHFL" else \
            20 if base in ("MUFU", "S2R", "S2UR") else 5
        for d in dests:
            ready[d] = start + lat
        t = start
    return max([t] + list(ready.values()))


def opcodes(body: list[Instr]) -> collections.Counter:
    """How many of each base opcode (guard and modifiers dropped) `body` holds."""
    return collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0] for _, text in body)


def counts(body: list[Instr]) -> str:
    ops = opcodes(body)
    return " ".join(f"{k} {ops[k]}" for k in COUNTED if ops[k])


def regions(ins: list[Instr], found: list[tuple[int, int]]) -> list[tuple[str, int, int]]:
    """The innermost loops and the straight-line stretches between them, in order, inside the outermost loop
    (the whole listing when there is none)."""
    outer = max(found, key=lambda r: r[1] - r[0]) if found else (0, len(ins))
    inner = [r for r in found if r != outer and outer[0] <= r[0] and r[1] <= outer[1] and r[1] - r[0] > 1]
    out, at = [], outer[0]
    for a, b in inner:
        if a > at:
            out.append(("straight", at, a))
        out.append(("loop", a, b))
        at = b
    if at < outer[1]:
        out.append(("straight", at, outer[1]))
    return out


def staged_sass(variant: str, drafts: int) -> str:
    """nvdisasm of a kda_decode staged variant's K3 cubin."""
    from minitriton.kernels import kda_decode

    compiled = kda_decode.staged_k3_spec(variant, drafts).compile(target="cubin")
    meta = compiled.metadata
    print(f"{variant} (K3, k = {drafts}): {meta['registers']} registers, spills {meta['spill_stores']} / "
          f"{meta['spill_loads']} B, PTX prefetch.global {compiled.ptx.count('prefetch.global')}")
    sass = disassemble(compiled.cubin)
    if sass is None:
        sys.exit("nvdisasm not found: set NVDISASM")
    return sass


def disassemble(cubin: bytes) -> str | None:
    """nvdisasm's listing of a cubin ($NVDISASM, or nvdisasm on PATH); None without the tool."""
    disasm = os.environ.get("NVDISASM") or shutil.which("nvdisasm")
    if disasm is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([disasm, "-c", f.name], capture_output=True, text=True, check=True).stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", help="a .sass file, or a kda_decode staged variant name")
    ap.add_argument("--drafts", type=int, default=7)
    ap.add_argument("--l2", type=int, default=550, help="cycles of an L2 round trip under load")
    ap.add_argument("--local", type=int, default=40, help="cycles of a spill reload")
    args = ap.parse_args(argv)
    path = Path(args.what)
    sass = path.read_text() if path.suffix == ".sass" else staged_sass(args.what, args.drafts)
    ins, labels = parse(sass)
    found = loops(ins, labels)
    print(f"{len(ins)} instructions")
    for a, b in found:
        print(f"loop [{a}, {b}) at {ins[a][0]:#x}..{ins[b - 1][0] + 16:#x}: {b - a} instructions; {counts(ins[a:b])}")
    print(f"one warp, in order: cycles at L = 40 / {args.l2} (round trips = slope)")
    for kind, a, b in regions(ins, found):
        fast, slow = latency(ins[a:b], 40, args.local), latency(ins[a:b], args.l2, args.local)
        trips = (slow - fast) / (args.l2 - 40)
        print(f"  {kind:8s} [{a}, {b}) {b - a:5d} instr: {fast:6d} / {slow:6d}  ~{trips:.1f} trips  ({counts(ins[a:b])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
