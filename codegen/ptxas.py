"""Assemble PTX with `ptxas -arch=sm_90a -v -lineinfo` and read its report.

    report = run_ptxas(ptx)        # PtxasReport: registers, smem, spill_stores, spill_loads, stack, cubin, log
    cubin, log = run_ptxas(ptx)    # the same, unpacked (the form minitriton/compiler.py uses)

A rejected kernel raises PtxasError (a CompilationError): the ptxas message, the failing PTX line, and — through
the nearest `.loc` above it — the kernel's source line. Warning C7508 (setmaxnreg ignored) is an error too.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from minitriton.errors import CompilationError
from minitriton.ir import Location


@dataclass
class PtxasReport:
    """What `ptxas -v` said about the kernel (the first entry, when the PTX holds several)."""

    registers: int
    smem: int  # static shared memory, bytes
    spill_stores: int
    spill_loads: int
    stack: int
    cubin: bytes
    log: str

    def __iter__(self) -> Iterator[object]:
        return iter((self.cubin, self.log))


class PtxasError(CompilationError):
    """ptxas rejected the PTX. `ptx_line` is the failing PTX text, `loc` the kernel source line it came from."""

    def __init__(self, message: str, ptx: str = "", log: str = ""):
        self.log = log
        self.ptx_line, loc = _locate(ptx, log)
        text = message + (f"\n  PTX: {self.ptx_line.strip()}" if self.ptx_line else "")
        super().__init__(text, loc)


def ptxas_path() -> str | None:
    return shutil.which("ptxas")


def run_ptxas(ptx: str, arch: str = "sm_90a") -> PtxasReport:
    """Assemble `ptx` for `arch`; raises PtxasError on failure, FileNotFoundError when ptxas is not on PATH."""
    exe = ptxas_path()
    if exe is None:
        raise FileNotFoundError("ptxas is not on PATH")
    with tempfile.TemporaryDirectory(prefix="minitriton-ptxas-") as tmp:
        src, out = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        src.write_text(ptx)
        proc = subprocess.run([exe, f"-arch={arch}", "-v", "-lineinfo", "-o", str(out), str(src)],
                              capture_output=True, text=True)
        log = (proc.stdout + proc.stderr).replace(str(src), "kernel.ptx")
        if proc.returncode != 0:
            raise PtxasError(f"ptxas rejected the kernel:\n{_errors(log)}", ptx, log)
        if "C7508" in log:
            raise PtxasError(f"ptxas ignored setmaxnreg (C7508: the entry needs .maxntid and .minnctapersm 1):\n"
                             f"{_errors(log)}", ptx, log)
        cubin = out.read_bytes()
    return PtxasReport(_number(r"Used (\d+) registers", log), _number(r"(\d+) bytes smem", log),
                       _number(r"(\d+) bytes spill stores", log), _number(r"(\d+) bytes spill loads", log),
                       _number(r"(\d+) bytes stack frame", log), cubin, log)


def _number(pattern: str, log: str) -> int:
    m = re.search(pattern, log)
    return int(m.group(1)) if m else 0


def _errors(log: str) -> str:
    lines = [ln for ln in log.splitlines() if "error" in ln or "C7508" in ln]
    return "\n".join(lines or log.splitlines())


_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+(\d+)")
_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"((?:[^"\\]|\\.)*)"')


def _locate(ptx: str, log: str) -> tuple[str, Location | None]:
    """(the PTX line of the first error, the kernel source location of the nearest .loc above it)."""
    m = re.search(r"line (\d+); (?:error|warning)", log)
    if m is None or not ptx:
        return "", None
    lines = ptx.splitlines()
    number = int(m.group(1))
    if not 1 <= number <= len(lines):
        return "", None
    files = {}
    for line in lines:
        f = _FILE.match(line)
        if f:
            files[f.group(1)] = f.group(2).replace('\\"', '"').replace("\\\\", "\\")
    for line in reversed(lines[:number]):
        loc = _LOC.match(line)
        if loc and loc.group(1) in files:
            return lines[number - 1], Location(files[loc.group(1)], int(loc.group(2)), max(0, int(loc.group(3)) - 1))
    return lines[number - 1], None
