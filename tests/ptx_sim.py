"""A small PTX simulator for the subset MiniTriton emits, so PTX can be *run* on the CPU in tests.

    run_ptx(ptx, name, grid, args, num_threads)   # args: CPU torch tensors (pointers, updated in place) and numbers

One CTA at a time, all its threads in lockstep: every register is a numpy array over the threads. That model is
only faithful if the code never diverges, so it checks what the codegen promises instead of assuming it:
- every branch is uniform across the CTA (`SimError: divergent branch` otherwise);
- shared memory has no races: a read of a byte another thread wrote since the last `bar.sync`, a write to a byte
  another thread read or wrote (with a different value) since then, all raise;
- global accesses stay inside the tensors passed (masked-off lanes must not touch memory) and are aligned;
  prefetches change nothing but are held to the same bounds;
- no active thread reads a register (lane) that was never written.
TMA copies, mbarriers and tensor-map parameters (mt.TensorDescriptor arguments) are simulated, with their
ordering rules checked, by tests/ptx_sim_tma.py; ldmatrix, mma.sync and wgmma by tests/ptx_sim_mma.py; cp.async
and its groups (a read of a slot whose group was not waited for raises) by tests/ptx_sim_async.py.
Arithmetic is IEEE where PTX is (`.rn` ops, cvt rounding modes); the `.approx` functions are computed exactly in
float32 (the simulator checks data movement and indexing, not the hardware's approximation error).
"""
from __future__ import annotations

import functools
import math
import re
import struct
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Sequence

import numpy as np
import torch

from minitriton.ir.numeric import bf16_round, round_exact
from minitriton.ir.types import SCALAR_TYPES


class SimError(AssertionError):
    """The PTX did something the codegen promises never to do (or the simulator does not know)."""


# ------------------------------------------------------------------------------------------------ types

_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
_SINT = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}
_FLOAT = {16: np.float16, 32: np.float32, 64: np.float64}
_REG_BITS = {".pred": 1, ".b16": 16, ".b32": 32, ".f32": 32, ".b64": 64, ".f64": 64}
MAX_SHARED_BYTES = 227 * 1024  # a block's shared memory with the opt-in (H100 / H200)


@functools.lru_cache(maxsize=None)  # called for every operand of every instruction
def _bits(t: str) -> int:
    if t == "pred":
        return 1
    return int(re.sub(r"[a-z]", "", t))


@functools.lru_cache(maxsize=None)
def _reg_prefix(name: str) -> str:
    """'%r' of '%r12': the register class a name belongs to."""
    return re.match(r"%[a-z]+", name).group(0)  # type: ignore[union-attr]


def _kind(t: str) -> str:
    """'s', 'u', 'f', 'bf' or 'b' (raw bits) for a PTX type name."""
    if t.startswith("bf"):
        return "bf"
    return t[0]


def _dtype(t: str) -> Any:
    if t == "pred":
        return np.bool_
    k, n = _kind(t), _bits(t)
    if k == "s":
        return _SINT[n]
    if k == "f":
        return _FLOAT[n]
    return _UINT[n]  # u, b, bf (bf16 kept as bits)


def _to_float32(bits16: np.ndarray) -> np.ndarray:
    return (bits16.astype(np.uint32) << 16).view(np.float32)


# ------------------------------------------------------------------------------------------------ parsing


@dataclass
class Instr:
    guard: str | None  # predicate register, "!" prefixed when negated
    opcode: str
    operands: list[str]
    line: int
    text: str


def _split_operands(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for c in text:
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
        if c == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += c
    if cur.strip():
        out.append(cur.strip())
    return out


@dataclass
class Kernel:
    name: str
    params: list[tuple[str, str]]  # (name, type)
    regs: dict[str, int]  # register prefix -> bits
    smem: int
    code: list[Instr]
    labels: dict[str, int]
    shared: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # name -> (offset, bytes, bits)
    uses_tma: bool = False  # TMA / mbarrier instructions appear (tests/ptx_sim_tma.py)


def parse(ptx: str, name: str) -> Kernel:
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)\s*(.*?)\{(.*)\}", ptx, re.S)
    if m is None:
        raise SimError(f"no entry {name}")
    # `.param .u64 x`, and `.param .align 64 .b8 x[128]` (a TMA tensor map: type "tmap")
    params = [("tmap" if count else t, n) for t, n, count in
              re.findall(r"\.param\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+(\w+)(\[\d+\])?", m.group(1))]
    body = m.group(3)
    regs = {pfx: _REG_BITS[t] for t, pfx in re.findall(r"\.reg\s+(\.\w+)\s+(%\w+)<\d+>;", body)}
    shared, size = {}, 0  # every .shared variable, laid out in declaration order
    for align, bits, sname, count in re.findall(r"\.shared\s+\.align\s+(\d+)\s+\.b(\d+)\s+(\w+)(?:\[(\d+)\])?;",
                                                body):
        size += -size % int(align)
        nbytes = int(bits) // 8 * int(count or 1)
        shared[sname] = (size, nbytes, int(bits))
        size += nbytes
    # `.extern .shared .align A .b8 name[]` (dynamic shared memory, module scope): after the static variables, up to
    # the opt-in limit of a block (the launch sizes it; the simulator gives it all that is left)
    for align, sname in re.findall(r"\.extern\s+\.shared\s+\.align\s+(\d+)\s+\.b8\s+(\w+)\[\];", ptx):
        size += -size % int(align)
        shared[sname] = (size, MAX_SHARED_BYTES - size, 8)
        size = MAX_SHARED_BYTES
    code, labels = [], {}
    start_line = ptx[:m.start(3)].count("\n") + 1
    for i, raw in enumerate(body.split("\n")):
        line = raw.split("//")[0].strip()
        if not line or line.startswith((".reg", ".shared", ".loc")):
            continue
        if line.endswith(":"):
            labels[line[:-1]] = len(code)
            continue
        for stmt in filter(None, (s.strip() for s in line.split(";"))):
            guard = None
            if stmt.startswith("@"):
                guard, stmt = stmt[1:].split(None, 1)
            parts = stmt.split(None, 1)
            code.append(Instr(guard, parts[0], _split_operands(parts[1]) if len(parts) > 1 else [],
                              start_line + i, raw.strip()))
    uses_tma = any(ins.opcode.startswith(("mbarrier", "cp.async.bulk")) for ins in code)
    return Kernel(name, [(n, t) for t, n in params], regs, size, code, labels, shared, uses_tma)


# ----------------------------------------------------------------------------------------------- memory


class GlobalMemory:
    """Tensors at fake, well-aligned addresses; every access is bounds- and alignment-checked.

    A race detector for one CTA: which thread wrote each byte since the last bar.sync (or the CTA's start). A thread
    that reads a byte another thread wrote in that window reads it without ordering (the kernel needs a barrier,
    mt.barrier() in the DSL). Accesses passed without `tids` (atomics, the async copy units) are not tracked."""

    def __init__(self) -> None:
        self.bases: list[int] = []
        self.buffers: list[np.ndarray] = []
        self.next = 1 << 32
        self.writers: dict[int, np.ndarray] = {}  # buffer -> writing thread per byte (-1: none since the barrier)
        self.touched: list[tuple[int, np.ndarray]] = []

    def add(self, data: np.ndarray) -> int:
        base = self.next
        self.bases.append(base)
        self.buffers.append(data)
        self.next += ((data.nbytes + 4095) // 4096 + 1) * 4096
        return base

    def barrier(self) -> None:
        """Every write so far is ordered before every later read (bar.sync, or a new CTA)."""
        for w, idx in self.touched:
            self.writers[w][idx] = -1
        self.touched.clear()

    def locate(self, addrs: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        """(buffer index, byte offset) of each access of `size` bytes; raises on a bad one."""
        if np.any(addrs % size):
            bad = int(addrs[addrs % size != 0][0])
            raise SimError(f"misaligned global access of {size} bytes at {bad:#x}")
        which = np.searchsorted(np.array(self.bases, dtype=np.int64), addrs, side="right") - 1
        ok = which >= 0
        offs = addrs - np.array(self.bases, dtype=np.int64)[np.maximum(which, 0)]
        sizes = np.array([b.nbytes for b in self.buffers], dtype=np.int64)[np.maximum(which, 0)]
        ok &= (offs >= 0) & (offs + size <= sizes)
        if not np.all(ok):
            bad = int(addrs[~ok][0])
            raise SimError(f"global access of {size} bytes at {bad:#x} is outside every tensor")
        return which, offs

    def read(self, addrs: np.ndarray, size: int, tids: np.ndarray | None = None) -> np.ndarray:
        which, offs = self.locate(addrs, size)
        out = np.zeros((len(addrs), size), dtype=np.uint8)
        for w in np.unique(which):
            sel = which == w
            idx = offs[sel, None] + np.arange(size)
            if tids is not None and w in self.writers:
                self._check_ordered(self.writers[w][idx], tids[sel, None], int(self.bases[w]) + idx)
            out[sel] = self.buffers[w][idx]
        return out

    def write(self, addrs: np.ndarray, raw: np.ndarray, tids: np.ndarray | None = None) -> None:
        size = raw.shape[1]
        which, offs = self.locate(addrs, size)
        for w in np.unique(which):
            sel = which == w
            idx = offs[sel, None] + np.arange(size)
            self.buffers[w][idx] = raw[sel]
            if tids is not None:
                if w not in self.writers:
                    self.writers[w] = np.full(self.buffers[w].nbytes, -1, dtype=np.int64)
                self.writers[w][idx] = np.broadcast_to(tids[sel, None], idx.shape)
                self.touched.append((w, idx.ravel()))

    @staticmethod
    def _check_ordered(writer: np.ndarray, reader: np.ndarray, addr: np.ndarray) -> None:
        bad = (writer != -1) & (writer != reader)
        if np.any(bad):
            k = tuple(np.argwhere(bad)[0])
            raise SimError(f"global-memory race: thread {int(np.broadcast_to(reader, bad.shape)[k])} reads byte "
                           f"{int(addr[k]):#x} written by thread {int(writer[k])} of this CTA since the last "
                           "bar.sync (a barrier, mt.barrier(), must order them)")


class SharedMemory:
    """The smem buffer with a race detector: who wrote / read each byte since the last bar.sync (-1 nobody, -2
    several threads)."""

    def __init__(self, size: int):
        self.data = np.zeros(max(size, 1), dtype=np.uint8)
        self.guard: Any = None  # extra checks of generic accesses (the TMA unit, tests/ptx_sim_tma.py)
        self.barrier()

    def barrier(self) -> None:
        self.writer = np.full(self.data.size, -1, dtype=np.int64)
        self.reader = np.full(self.data.size, -1, dtype=np.int64)

    def _bytes(self, tids: np.ndarray, addrs: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        if np.any((addrs < 0) | (addrs + size > self.data.size) | (addrs % size != 0)):
            bad = int(addrs[(addrs < 0) | (addrs + size > self.data.size) | (addrs % size != 0)][0])
            raise SimError(f"shared access of {size} bytes at {bad} (buffer {self.data.size} bytes)")
        idx = addrs[:, None] + np.arange(size)
        return idx, np.broadcast_to(tids[:, None], idx.shape)

    def read(self, tids: np.ndarray, addrs: np.ndarray, size: int) -> np.ndarray:
        idx, who = self._bytes(tids, addrs, size)
        if self.guard is not None:
            self.guard.check_read(tids, idx)
        w = self.writer[idx]
        bad = (w != -1) & (w != who)
        if np.any(bad):
            k = np.argwhere(bad)[0]
            raise SimError(f"shared-memory race: thread {int(who[tuple(k)])} reads byte {int(idx[tuple(k)])} "
                           f"written by thread {int(w[tuple(k)])} since the last bar.sync")
        flat, readers = idx.ravel(), who.ravel()
        lo = np.full(self.data.size, np.iinfo(np.int64).max)
        hi = np.full(self.data.size, -1)
        np.minimum.at(lo, flat, readers)
        np.maximum.at(hi, flat, readers)
        touched = np.unique(flat)
        old = self.reader[touched]
        single = lo[touched] == hi[touched]
        self.reader[touched] = np.where(single & ((old == -1) | (old == lo[touched])), lo[touched], -2)
        return self.data[idx]

    def write(self, tids: np.ndarray, addrs: np.ndarray, raw: np.ndarray) -> None:
        idx, who = self._bytes(tids, addrs, raw.shape[1])
        if self.guard is not None:
            self.guard.check_write(tids, idx)
        r = self.reader[idx]
        if np.any((r != -1) & (r != who)):
            raise SimError("shared-memory race: a thread writes a byte another thread read since the last bar.sync")
        w = self.writer[idx]
        if np.any((w != -1) & (w != who) & (self.data[idx] != raw)):
            raise SimError("shared-memory race: two threads write different values to one byte")
        flat, vals = idx.ravel(), raw.ravel()
        order = np.argsort(flat, kind="stable")
        f, v = flat[order], vals[order]
        same = f[1:] == f[:-1]
        if np.any(same & (v[1:] != v[:-1])):
            raise SimError("shared-memory race: threads write different values to one byte in one instruction")
        self.data[flat] = vals
        self.writer[flat] = who.ravel()


# ------------------------------------------------------------------------------------------------ running


class CTA:
    def __init__(self, kernel: Kernel, nthreads: int, ctaid: tuple[int, int, int], nctaid: tuple[int, int, int],
                 params: dict[str, int | float], gmem: GlobalMemory):
        self.k, self.n = kernel, nthreads
        self.ctaid, self.nctaid = ctaid, nctaid
        self.params, self.gmem = params, gmem
        self.smem = SharedMemory(kernel.smem)
        self.regs: dict[str, np.ndarray] = {}
        self.defined: dict[str, np.ndarray] = {}
        self.active = np.ones(nthreads, dtype=bool)
        self.reading = self.active  # the threads an instruction reads registers in: its guard's (run)
        self.tma = None
        if kernel.uses_tma:
            from ptx_sim_tma import TmaUnit

            self.tma = TmaUnit(self)
        self.tc = None  # ldmatrix / mma.sync / wgmma state (tests/ptx_sim_mma.py)
        if any(ins.opcode.startswith(("ldmatrix", "mma", "wgmma")) for ins in kernel.code):
            from ptx_sim_mma import TensorCoreUnit

            self.tc = TensorCoreUnit(self)
        self.cp_async = None  # cp.async groups (tests/ptx_sim_async.py)
        if any(ins.opcode.startswith("cp.async") and not ins.opcode.startswith("cp.async.bulk") for ins in kernel.code):
            from ptx_sim_async import AsyncCopyUnit

            self.cp_async = AsyncCopyUnit(self)

    # -- operands

    def reg_bits(self, name: str) -> int:
        return self.k.regs[_reg_prefix(name)]

    def read_reg(self, name: str) -> np.ndarray:
        if self.tc is not None:
            self.tc.check_read(name)
        if name not in self.regs:
            raise SimError(f"register {name} read before any write")
        undefined = self.reading & self.active & ~self.defined[name]
        if np.any(undefined):
            raise SimError(f"register {name} read in thread {int(np.argmax(undefined))} where it was never written")
        return self.regs[name]

    def write_reg(self, name: str, value: np.ndarray, mask: np.ndarray) -> None:
        if self.tc is not None:
            self.tc.note_write(name)
        bits = self.reg_bits(name)
        if bits == 1:
            value = value.astype(bool)
        else:
            value = value.astype(_UINT[bits])
        if name not in self.regs:
            self.regs[name] = np.zeros(self.n, dtype=value.dtype)
            self.defined[name] = np.zeros(self.n, dtype=bool)
        self.regs[name] = np.where(mask, value, self.regs[name])
        self.defined[name] = self.defined[name] | mask

    def get(self, op: str, t: str) -> np.ndarray:
        """Operand `op` interpreted as PTX type `t` (an array over threads)."""
        if op.startswith("%") and "." in op:
            special, axis = op[1:].split(".")
            idx = "xyz".index(axis)
            v = {"tid": np.arange(self.n) if idx == 0 else np.zeros(self.n), "ntid": np.full(self.n, self.n),
                 "ctaid": np.full(self.n, self.ctaid[idx]), "nctaid": np.full(self.n, self.nctaid[idx])}[special]
            return v.astype(_dtype(t))
        if op.startswith("%"):
            raw = self.read_reg(op)
            if t == "pred":
                return raw.astype(bool)
            rb, tb = self.reg_bits(op), _bits(t)
            if rb == 1:
                raise SimError(f"predicate {op} read as {t}")
            u = raw.astype(_UINT[tb])  # truncates a wider register, zero-extends a narrower one
            return u.view(_dtype(t)) if _kind(t) in ("s", "f") else u
        if op in self.k.shared:  # a shared variable: its offset in the shared window
            return np.full(self.n, self.k.shared[op][0], dtype=_dtype(t))
        if op in self.params:
            return np.full(self.n, self.params[op]).astype(_dtype(t))
        return np.full(self.n, _immediate(op, t), dtype=_dtype(t))

    def set(self, dst: str, value: np.ndarray, t: str, mask: np.ndarray) -> None:
        """Write a value of type t; a wider register gets it sign- (s types) or zero-extended."""
        bits = self.reg_bits(dst)
        if t == "pred" or bits == 1:
            self.write_reg(dst, np.asarray(value, dtype=bool), mask)
            return
        tb = _bits(t)
        value = np.asarray(value).astype(_dtype(t))
        raw = value.view(_UINT[tb]) if value.dtype.itemsize * 8 == tb else value.astype(_UINT[tb])
        if bits > tb:
            raw = value.astype(_SINT[bits]).view(_UINT[bits]) if _kind(t) == "s" else raw.astype(_UINT[bits])
        elif bits < tb:
            raw = raw.astype(_UINT[bits])
        self.write_reg(dst, raw, mask)

    def address(self, op: str) -> np.ndarray:
        m = re.fullmatch(r"\[([^+\]]+)(?:\+(-?\d+))?\]", op)
        if m is None:
            raise SimError(f"bad address {op}")
        base, off = m.group(1), int(m.group(2) or 0)
        if base in self.params:
            return np.full(self.n, -1, dtype=np.int64)  # a parameter: handled by ld.param
        kind = "u64" if base.startswith("%rd") else "u32"
        return self.get(base, kind).astype(np.int64) + off

    # -- execution

    def run(self) -> None:
        pc, code, steps = 0, self.k.code, 0
        while pc < len(code):
            ins = code[pc]
            steps += 1
            if steps > 50_000_000:
                raise SimError("runaway loop")
            mask = self.reading = self.active
            if ins.guard:
                neg = ins.guard.startswith("!")
                p = self.get(ins.guard.lstrip("!"), "pred")
                mask = mask & (~p if neg else p)
            op = ins.opcode
            try:
                if op.startswith("bra"):
                    if np.any(mask) and not np.all(mask):
                        raise SimError(f"divergent branch (taken by {int(mask.sum())} of {self.n} threads)")
                    pc = self.k.labels[ins.operands[0]] if np.all(mask) else pc + 1
                    continue
                if op == "ret":
                    if self.tma is not None:
                        self.tma.at_exit()
                    return
                self.reading = mask  # a guarded-off thread's registers may be unwritten: not read there
                self.execute(ins, mask)
            except SimError as e:
                raise SimError(f"PTX line {ins.line}: {ins.text}: {e}") from None
            pc += 1

    def execute(self, ins: Instr, mask: np.ndarray) -> None:
        parts = ins.opcode.split(".")
        name = parts[0]
        handler = getattr(self, f"op_{name}", None)
        if handler is None:
            raise SimError(f"unsupported instruction {ins.opcode}")
        handler(parts[1:], ins.operands, mask)

    # -- data movement

    def op_mov(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        t = mods[-1]
        dst, src = ops
        if dst.startswith("{"):  # unpack: mov.b32 {lo, hi}, r
            parts = _split_operands(dst[1:-1])
            width = _bits(t) // len(parts)
            whole = self.get(src, f"b{_bits(t)}").astype(np.uint64)
            for i, p in enumerate(parts):
                self.set(p, (whole >> np.uint64(i * width)) & np.uint64((1 << width) - 1), f"b{width}", mask)
            return
        if src.startswith("{"):  # pack
            parts = _split_operands(src[1:-1])
            width = _bits(t) // len(parts)
            acc = np.zeros(self.n, dtype=np.uint64)
            for i, p in enumerate(parts):
                acc |= self.get(p, f"b{width}").astype(np.uint64) << np.uint64(i * width)
            self.set(dst, acc, f"b{_bits(t)}", mask)
            return
        self.set(dst, self.get(src, t), t, mask)

    def op_ld(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        space, t = mods[0], mods[-1]  # cache operators (ld.global.cg.v4.b32) change no value
        vec = next((int(m[1]) for m in mods[1:-1] if len(m) == 2 and m[0] == "v"), 1)
        dsts = _split_operands(ops[0][1:-1]) if ops[0].startswith("{") else [ops[0]]
        if space == "param":
            pname = ops[1][1:-1]
            self.set(dsts[0], np.full(self.n, self.params[pname]), t, mask)
            return
        size = _bits(t) // 8
        tids = np.nonzero(mask)[0]
        addrs = self.address(ops[1])[tids]
        _check_aligned(addrs, vec * size, "ld." + space)
        if space == "shared":
            raw = self.smem.read(tids, addrs, vec * size)
        else:
            raw = self.gmem.read(addrs, vec * size, tids)
        for k, d in enumerate(dsts):
            vals = np.zeros(self.n, dtype=_UINT[8 * size])
            vals[tids] = np.ascontiguousarray(raw[:, k * size:(k + 1) * size]).view(_UINT[8 * size]).ravel()
            self.set(d, vals.view(_dtype(t)) if _kind(t) in ("s", "f") else vals, t, mask)

    def op_st(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        space, t = mods[0], mods[-1]
        srcs = _split_operands(ops[1][1:-1]) if ops[1].startswith("{") else [ops[1]]
        size = _bits(t) // 8
        tids = np.nonzero(mask)[0]
        addrs = self.address(ops[0])[tids]
        _check_aligned(addrs, len(srcs) * size, "st." + space)
        raw = np.concatenate([np.ascontiguousarray(self.get(s, f"b{8 * size}")[tids]).view(np.uint8)
                              .reshape(len(tids), size) for s in srcs], axis=1)
        if space == "shared":
            self.smem.write(tids, addrs, raw)
            if self.tc is not None:
                self.tc.note_shared_write(tids, addrs, raw.shape[1])
        else:
            self.gmem.write(addrs, raw, tids)

    def op_prefetch(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        """A cache hint: no effect, but an enabled thread's address must lie in a tensor (as the interpreter checks;
        on the GPU a stray prefetch is harmless, so only here would a wrong one show)."""
        if mods[:1] != ["global"] or mods[1:] not in (["L1"], ["L2"]):
            raise SimError(f"unsupported prefetch{''.join('.' + m for m in mods)}")
        self.gmem.locate(self.address(ops[0])[np.nonzero(mask)[0]], 1)

    def op_atom(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        t = mods[-1]
        size = _bits(t) // 8
        addrs = self.address(ops[1])
        vals = self.get(ops[2], t)
        old = np.zeros(self.n, dtype=_dtype(t))
        for tid in np.nonzero(mask)[0]:  # threads in order: one serialization of the atomics
            a = addrs[tid:tid + 1]
            cur = self.gmem.read(a, size)[0].view(_dtype(t))[0]
            old[tid] = cur
            with np.errstate(over="ignore"):
                if t == "bf16":
                    total = _to_float32(np.array([cur, vals[tid]], dtype=np.uint16)).sum(dtype=np.float32)
                    new = (np.asarray(bf16_round(total), np.float32).reshape(1).view(np.uint32) >> 16).astype(
                        np.uint16)
                else:
                    new = np.array([cur + vals[tid]], dtype=_dtype(t))
            self.gmem.write(a, new.view(np.uint8).reshape(1, size))
        self.set(ops[0], old, t, mask)

    def op_cvta(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        value = self.get(ops[1], "u64")
        if mods[0] == "param":  # a tensor-map parameter's generic address (tests/ptx_sim_tma.py)
            from ptx_sim_tma import cvta_param

            value = cvta_param(value.astype(np.int64)).astype(np.uint64)
        self.set(ops[0], value, "u64", mask)

    def _tma_unit(self) -> Any:
        if self.tma is None:
            raise SimError("TMA / mbarrier instruction in a kernel the parser saw none in")
        return self.tma

    def op_mbarrier(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        self._tma_unit().mbarrier(mods, ops, mask)

    def op_griddepcontrol(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        if mods not in (["wait"], ["launch_dependents"]):  # kernels run one after another here: nothing to do
            raise SimError(f"unsupported griddepcontrol.{'.'.join(mods)}")

    def op_fence(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        if self.tc is not None:
            self.tc.fence(mods, mask)
        if self.tma is not None:
            self.tma.fence(mods, mask)
        elif mods[:2] != ["proxy", "async"] and mods[0] != "mbarrier_init" and mods not in (["acq_rel", "gpu"], ["release", "gpu"], ["acquire", "gpu"]):
            raise SimError(f"unsupported fence.{'.'.join(mods)}")

    def op_ldmatrix(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        self.tc.ldmatrix(mods, ops, mask)  # type: ignore[union-attr]  (set when the kernel has one)

    def op_mma(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        self.tc.mma(mods, ops, mask)  # type: ignore[union-attr]

    def op_wgmma(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        self.tc.wgmma(mods, ops, mask)  # type: ignore[union-attr]

    def op_cp(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        if self.cp_async is not None and mods[:1] == ["async"] and mods[1:2] != ["bulk"]:
            self.cp_async.cp(mods, ops, mask)
            return
        self._tma_unit().cp(mods, ops, mask)

    def op_bar(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        if not np.all(mask):
            raise SimError("bar.sync not reached by every thread")
        self.smem.barrier()
        self.gmem.barrier()
        if self.cp_async is not None:
            self.cp_async.barrier()

    def op_shfl(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        mode = mods[1]
        if not np.all(mask):
            raise SimError("shfl.sync with inactive threads")
        dst = ops[0].split("|")[0]
        a = self.get(ops[1], "b32")
        b = self.get(ops[2], "u32").astype(np.int64)
        c = self.get(ops[3], "u32").astype(np.int64)
        lane = np.arange(self.n) % 32
        warp0 = np.arange(self.n) - lane
        seg = (c >> 8) & 0x1F
        max_lane = (lane & seg) | (c & 0x1F & ~seg)
        min_lane = lane & seg
        if mode == "up":
            j = lane - b
            ok = j >= max_lane
        elif mode == "down":
            j = lane + b
            ok = j <= max_lane
        elif mode == "bfly":
            j = lane ^ b
            ok = j <= max_lane
        else:
            j = min_lane | (b & 0x1F & ~seg)
            ok = j <= max_lane
        j = np.where(ok, j, lane)
        self.set(dst, a[warp0 + j], "b32", mask)

    # -- integer and bit ops

    def _binary(self, ops: list[str], t: str, fn: Any, mask: np.ndarray) -> None:
        a, b = self.get(ops[1], t), self.get(ops[2], t)
        with np.errstate(all="ignore"):
            self.set(ops[0], fn(a, b), t, mask)

    def _packed_half(self, ops: list[str], t: str, fn: Any, mask: np.ndarray) -> None:
        """`<op>.rn.{bf16x2,f16x2}`: both 16-bit halves computed exactly in f64 and rounded once to the half type
        (f64 then f16 / bf16 is an innocuous double rounding for add / sub / mul)."""
        a, b = (self.get(x, "b32").astype(np.uint32) for x in ops[1:3])
        out = np.zeros(self.n, dtype=np.uint32)
        for shift in (0, 16):
            ha, hb = ((v >> np.uint32(shift)) & np.uint32(0xFFFF) for v in (a, b))
            if t == "bf16x2":
                x, y = _to_float32(ha).astype(np.float64), _to_float32(hb).astype(np.float64)
                with np.errstate(all="ignore"):
                    r = bf16_round(fn(x, y).astype(np.float32))  # f64 -> f32 -> bf16: innocuous double roundings
                bits = np.asarray(r, np.float32).view(np.uint32) >> np.uint32(16)
                bits = np.where(np.isnan(r), np.uint32(0x7FFF), bits)
            else:
                x, y = ha.astype(np.uint16).view(np.float16), hb.astype(np.uint16).view(np.float16)
                with np.errstate(all="ignore"):
                    bits = fn(x.astype(np.float64), y.astype(np.float64)).astype(np.float16).view(np.uint16)
            out |= bits.astype(np.uint32) << np.uint32(shift)
        self.set(ops[0], out, "b32", mask)

    def op_add(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        if mods[-1] in ("bf16x2", "f16x2"):
            self._packed_half(ops, mods[-1], np.add, mask)
            return
        self._binary(ops, mods[-1], np.add, mask)

    def op_sub(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        if mods[-1] in ("bf16x2", "f16x2"):
            self._packed_half(ops, mods[-1], np.subtract, mask)
            return
        self._binary(ops, mods[-1], np.subtract, mask)

    def op_mul(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        t = mods[-1]
        if mods[0] == "wide":
            raise SimError("mul.wide is not emitted")
        if t in ("bf16x2", "f16x2"):
            self._packed_half(ops, t, np.multiply, mask)
            return
        self._binary(ops, t, np.multiply, mask)

    def op_mad(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        t = mods[-1]
        if mods[0] == "wide":
            wide = f"{t[0]}{2 * _bits(t)}"
            a = self.get(ops[1], t).astype(_dtype(wide))
            b = self.get(ops[2], t).astype(_dtype(wide))
            c = self.get(ops[3], wide)
            with np.errstate(all="ignore"):
                self.set(ops[0], a * b + c, wide, mask)
            return
        a, b, c = (self.get(x, t) for x in ops[1:])
        with np.errstate(all="ignore"):
            self.set(ops[0], a * b + c, t, mask)

    def op_div(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        t = mods[-1]
        if t.startswith("f"):
            self._float_binary(ops, t, np.divide, mask)
            return
        q = [_cdiv(int(x), int(y)) for x, y in zip(self.get(ops[1], t), self.get(ops[2], t))]
        self.set(ops[0], _wrap(q, t), t, mask)

    def op_rem(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        t = mods[-1]
        r = [int(x) - _cdiv(int(x), int(y)) * int(y) if int(y) else 0
             for x, y in zip(self.get(ops[1], t), self.get(ops[2], t))]
        self.set(ops[0], _wrap(r, t), t, mask)

    def op_min(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        t = mods[-1]
        self._binary(ops, t, np.fmin if t.startswith("f") else np.minimum, mask)

    def op_max(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        t = mods[-1]
        self._binary(ops, t, np.fmax if t.startswith("f") else np.maximum, mask)

    def _logic(self, ops: list[str], t: str, fn: Any, mask: np.ndarray) -> None:
        if t == "pred":
            self.set(ops[0], fn(self.get(ops[1], "pred"), self.get(ops[2], "pred")), "pred", mask)
        else:
            self._binary(ops, t, fn, mask)

    def op_and(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        self._logic(ops, mods[-1], np.bitwise_and, mask)

    def op_or(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        self._logic(ops, mods[-1], np.bitwise_or, mask)

    def op_xor(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        self._logic(ops, mods[-1], np.bitwise_xor, mask)

    def op_not(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        t = mods[-1]
        self.set(ops[0], ~self.get(ops[1], t), t, mask)

    def op_neg(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        t = mods[-1]
        with np.errstate(all="ignore"):
            self.set(ops[0], -self.get(ops[1], t), t, mask)

    def op_abs(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        t = mods[-1]
        with np.errstate(all="ignore"):
            self.set(ops[0], np.abs(self.get(ops[1], t)), t, mask)

    def op_shl(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        t = mods[-1]
        n = _bits(t)
        a = self.get(ops[1], t).astype(np.uint64)
        s = self.get(ops[2], "u32").astype(np.uint64)
        keep = np.uint64((1 << n) - 1)
        out = np.where(s >= n, np.uint64(0), (a << np.minimum(s, np.uint64(n - 1))) & keep)
        self.set(ops[0], out.astype(_UINT[n]), t, mask)

    def op_shr(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        t = mods[-1]
        n = _bits(t)
        a = self.get(ops[1], t)
        s = np.minimum(self.get(ops[2], "u32").astype(np.int64), n)
        if t[0] == "s":
            out = np.where(s >= n, np.where(a < 0, -1, 0), a.astype(np.int64) >> np.minimum(s, n - 1))
        else:
            out = np.where(s >= n, 0, a.astype(np.uint64) >> np.minimum(s, n - 1).astype(np.uint64))
        self.set(ops[0], out.astype(_dtype(t)), t, mask)

    def op_bfe(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        t = mods[-1]
        a = self.get(ops[1], "u32").astype(np.uint64)
        pos, length = self.get(ops[2], "u32").astype(np.uint64), self.get(ops[3], "u32").astype(np.uint64)
        field = (a >> pos) & ((np.uint64(1) << length) - np.uint64(1))
        if t[0] == "s":
            sign = (field >> (length - np.uint64(1))) & np.uint64(1)
            field = np.where(sign == 1, field | (~((np.uint64(1) << length) - np.uint64(1)) & np.uint64(0xFFFFFFFF)),
                             field)
        self.set(ops[0], field.astype(np.uint32), "b32", mask)

    def op_bfi(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        a, b = self.get(ops[1], "u32").astype(np.uint64), self.get(ops[2], "u32").astype(np.uint64)
        pos, length = self.get(ops[3], "u32").astype(np.uint64), self.get(ops[4], "u32").astype(np.uint64)
        field = ((np.uint64(1) << length) - np.uint64(1)) << pos
        self.set(ops[0], ((b & ~field) | ((a << pos) & field)) & np.uint64(0xFFFFFFFF), "u32", mask)

    def op_setp(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        cmp, t = mods[0], mods[-1]
        a, b = self.get(ops[1], t), self.get(ops[2], t)
        with np.errstate(all="ignore"):
            unordered = (np.isnan(a) | np.isnan(b)) if t.startswith("f") else np.zeros(self.n, bool)
            if cmp in ("nan", "num"):  # unordered / ordered tests
                self.set(ops[0], unordered if cmp == "nan" else ~unordered, "pred", mask)
                return
            base = cmp.rstrip("u") if cmp not in ("eq", "ne", "lt", "le", "gt", "ge") else cmp
            r = {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[base]
        if cmp.endswith("u") and cmp not in ("eq", "ne", "lt", "le", "gt", "ge"):
            r = r | unordered
        elif t.startswith("f"):
            r = r & ~unordered
        self.set(ops[0], r, "pred", mask)

    def op_selp(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        t = mods[-1]
        c = self.get(ops[3], "pred")
        self.set(ops[0], np.where(c, self.get(ops[1], t), self.get(ops[2], t)), t, mask)

    # -- floating point

    def _float_binary(self, ops: list[str], t: str, fn: Any, mask: np.ndarray) -> None:
        a, b = self.get(ops[1], t), self.get(ops[2], t)
        with np.errstate(all="ignore"):
            self.set(ops[0], fn(a, b).astype(_dtype(t)), t, mask)

    def op_fma(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        t = mods[-1]
        if t == "bf16":
            a, b, c = (_to_float32(self.get(x, "b16")).astype(np.float64) for x in ops[1:])
        else:
            a, b, c = (self.get(x, t).astype(np.float64) for x in ops[1:])
        r = _fma_f64_exact(a, b, c, t) if t in FAST_FMA_TYPES else \
            np.array([_exact_fma(x, y, z, t) for x, y, z in zip(a, b, c)])
        if t == "bf16":
            self.set(ops[0], (r.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16), "b16", mask)
        else:
            self.set(ops[0], r.astype(_dtype(t)), t, mask)

    def _unary_float(self, ops: list[str], t: str, fn: Any, mask: np.ndarray) -> None:
        with np.errstate(all="ignore"):
            x = self.get(ops[1], t)
            self.set(ops[0], np.asarray(fn(x.astype(np.float64))).astype(_dtype(t)), t, mask)

    def op_ex2(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        self._unary_float(ops, "f32", np.exp2, mask)

    def op_lg2(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        self._unary_float(ops, "f32", np.log2, mask)

    def op_sqrt(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        t = mods[-1]
        with np.errstate(all="ignore"):
            self.set(ops[0], np.sqrt(self.get(ops[1], t)), t, mask)

    def op_rsqrt(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        self._unary_float(ops, mods[-1], lambda x: 1.0 / np.sqrt(x), mask)

    def op_rcp(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        t = mods[-1]
        with np.errstate(all="ignore"):
            self.set(ops[0], (np.ones(1, dtype=_dtype(t)) / self.get(ops[1], t)).astype(_dtype(t)), t, mask)

    def op_sin(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        self._unary_float(ops, "f32", np.sin, mask)

    def op_cos(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        self._unary_float(ops, "f32", np.cos, mask)

    def op_tanh(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        self._unary_float(ops, "f32", np.tanh, mask)

    def op_copysign(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        t = mods[-1]
        self.set(ops[0], np.copysign(self.get(ops[2], t), self.get(ops[1], t)), t, mask)

    def op_cvt(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        rnd = mods[0] if mods[0] in ("rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi", "rna") else None
        dt, st = mods[-2], mods[-1]
        if st == "bf16":
            x = _to_float32(self.get(ops[1], "b16"))
        else:
            x = self.get(ops[1], st)
        self.set(ops[0], _convert(x, st, dt, rnd), _store_type(dt), mask)


FAST_FMA_TYPES = {"f32": np.float32, "f16": np.float16}  # products of these are exact in f64


def _fma_f64_exact(a: np.ndarray, b: np.ndarray, c: np.ndarray, t: str) -> np.ndarray:
    """a * b + c rounded once to type t, vectorized, for f32 / f16 operands given as f64 (what `_exact_fma` gives,
    without rational arithmetic). The product is exact in f64 (48 of 53 bits); TwoSum gives s = fl64(p + c) and
    its exact error e. Rounding s to t rounds p + c correctly unless s is exactly a tie of t (every tie is an f64
    value, so none lies strictly between s and p + c): then s is nudged one f64 step toward e first."""
    to = FAST_FMA_TYPES[t]
    with np.errstate(all="ignore"):
        p = a * b
        s = p + c
        bv = s - p
        e = (p - (s - bv)) + (c - bv)
        up, down = np.nextafter(s, np.inf).astype(to), np.nextafter(s, -np.inf).astype(to)
        tie = (up != down) & (s.astype(to) != s)  # the two neighbours round apart and s is not a value of t
        nudged = np.where(e > 0, up, down)
        return np.where(tie & (e != 0) & np.isfinite(e), nudged, s.astype(to)).astype(np.float64)


def _exact_fma(x: float, y: float, z: float, t: str) -> float:
    """x * y + z rounded once to float type t (exact rational arithmetic; IEEE results for the special values)."""
    with np.errstate(all="ignore"):
        if not all(math.isfinite(v) for v in (x, y, z)):
            return x * y + z
    exact = Fraction(x) * Fraction(y) + Fraction(z)
    return round_exact(exact, SCALAR_TYPES[t]) if exact != 0 else (x * y + z)


def _store_type(t: str) -> str:
    return "b16" if t == "bf16" else "b32" if t == "tf32" else t


def _convert(x: np.ndarray, st: str, dt: str, rnd: str | None) -> np.ndarray:
    if st == "bf16":
        st = "f32"  # read as its exact f32 value
    with np.errstate(all="ignore"):
        if dt == "bf16":
            f32 = x.astype(np.float32) if st.startswith("f") else \
                np.array([_int_to_float(int(v), "f32") for v in x], dtype=np.float32)
            return (np.asarray(bf16_round(f32), np.float32).view(np.uint32) >> 16).astype(np.uint16)
        if dt == "tf32":
            bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
            if rnd == "rna":  # to nearest, ties away from zero
                rounded = ((bits + 0x1000) & 0xFFFFE000).astype(np.uint32)
            elif rnd == "rn":  # to nearest, ties to even
                rounded = ((bits + 0xFFF + ((bits >> 13) & 1)) & 0xFFFFE000).astype(np.uint32)
            else:
                raise SimError(f"cvt to tf32 with rounding {rnd!r} is not simulated")
            return np.where(np.isfinite(x), rounded, x.astype(np.float32).view(np.uint32))
        if dt.startswith("f") and st.startswith("f"):
            f = x.astype(np.float64)
            if rnd in ("rni", "rmi", "rpi", "rzi"):
                f = {"rni": np.rint, "rmi": np.floor, "rpi": np.ceil, "rzi": np.trunc}[rnd](f)
            return f.astype(_dtype(dt))
        if dt.startswith("f"):  # int -> float, one rounding
            return np.array([_int_to_float(int(v), dt) for v in x], dtype=_dtype(dt))
        if st.startswith("f"):  # float -> int: truncate, saturate, NaN -> 0
            info = np.iinfo(_dtype(dt))
            out = [0 if math.isnan(v) else int(info.min) if v <= info.min else int(info.max) if v >= info.max
                   else int(math.trunc(v)) for v in x.astype(np.float64)]
            return np.array(out, dtype=object).astype(_dtype(dt))
        return _wrap([int(v) for v in x], dt)  # int -> int: the value, wrapped


def _cdiv(x: int, y: int) -> int:
    """C division: truncation toward zero (0 for y == 0: the simulator's choice for undefined)."""
    if y == 0:
        return 0
    q = abs(x) // abs(y)
    return -q if (x < 0) != (y < 0) else q


def _wrap(values: list[int], t: str) -> np.ndarray:
    n = _bits(t)
    out = []
    for v in values:
        v &= (1 << n) - 1
        if _kind(t) == "s" and v >= 1 << (n - 1):
            v -= 1 << n
        out.append(v)
    return np.array(out, dtype=_dtype(t))


def _int_to_float(v: int, dt: str) -> float:
    """An integer rounded once to f16 / f32 / f64 (Python's int -> float conversion is correctly rounded)."""
    if dt == "f64":
        return float(v)
    mant = 11 if dt == "f16" else 24
    if v == 0:
        return 0.0
    shift = max(0, abs(v).bit_length() - mant)  # keep `mant` significant bits, rounding half to even
    q, r = divmod(abs(v), 1 << shift)
    half = 1 << (shift - 1) if shift else 0
    if shift and (r > half or (r == half and q & 1)):
        q += 1
    out = math.ldexp(q, shift) * (1 if v > 0 else -1)
    return float(np.float16(out)) if dt == "f16" else out


def _immediate(op: str, t: str) -> Any:
    if op.startswith("0f"):
        return np.array([int(op[2:], 16)], dtype=np.uint32).view(np.float32)[0].astype(_dtype(t)) \
            if _kind(t) == "f" else int(op[2:], 16)
    if op.startswith("0d"):
        return struct.unpack("<d", struct.pack("<Q", int(op[2:], 16)))[0]
    v = int(op, 0)
    if _kind(t) == "f":
        return float(v)
    n = _bits(t) if t != "pred" else 1
    if t == "pred":
        return bool(v)
    v &= (1 << n) - 1
    if _kind(t) == "s" and v >= 1 << (n - 1):
        v -= 1 << n
    return v


# -------------------------------------------------------------------------------------------------- entry

_TORCH_RAW = {torch.bfloat16: torch.int16, torch.bool: torch.uint8}


def _is_descriptor(a: Any) -> bool:
    return hasattr(a, "tensor_map") and hasattr(a, "block_shape")


def run_ptx(ptx: str, name: str, grid: Sequence[int] | int, args: Sequence[Any], num_threads: int,
            make_cta: Any = None) -> None:
    """Run kernel `name` of `ptx` over `grid` with `args` (CPU tensors are copied in and back). make_cta (the CTA
    class by default) builds each CTA from CTA's arguments (tests/ptx_sim_ws.py: one program counter per role)."""
    kernel = parse(ptx, name)
    grid = (grid,) if isinstance(grid, int) else tuple(grid)
    grid = grid + (1,) * (3 - len(grid))
    if len(kernel.params) != len(args):
        raise SimError(f"{name} takes {len(kernel.params)} parameters, got {len(args)}")
    gmem = GlobalMemory()
    params: dict[str, int | float] = {}
    arrays = []
    for index, ((pname, ptype), a) in enumerate(zip(kernel.params, args)):
        if (ptype == "tmap") != _is_descriptor(a):
            raise SimError(f"parameter {pname} (.{ptype}) got {type(a).__name__}")
        if ptype == "tmap":  # an mt.TensorDescriptor: its tensor's span in global memory, the map in param space
            from ptx_sim_tma import add_descriptor, storage_span

            span = storage_span(a.tensor, tuple(a.shape), tuple(a.strides))
            raw = span.detach().contiguous().view(_TORCH_RAW.get(span.dtype, span.dtype)).numpy().copy()
            raw = raw.view(np.uint8)
            params[pname], _ = add_descriptor(gmem, index, a, gmem.add(raw.reshape(-1)))
            arrays.append((span, raw))
        elif isinstance(a, torch.Tensor):
            raw = a.detach().contiguous().view(_TORCH_RAW.get(a.dtype, a.dtype)).numpy().copy().view(np.uint8)
            params[pname] = gmem.add(raw.reshape(-1))
            arrays.append((a, raw))
        else:
            params[pname] = float(a) if ptype.startswith("f") else int(a)
    for z in range(grid[2]):
        for y in range(grid[1]):
            for x in range(grid[0]):
                gmem.barrier()  # CTAs run one after another here: a later CTA sees every earlier write
                (make_cta or CTA)(kernel, num_threads, (x, y, z), grid, params, gmem).run()  # type: ignore[arg-type]
    for tensor, raw in arrays:
        raw_t = torch.from_numpy(raw.view(np.uint8).copy())
        view_dtype = _TORCH_RAW.get(tensor.dtype, tensor.dtype)
        tensor.copy_(raw_t.view(view_dtype).view(tensor.dtype).reshape(tensor.shape))


def _check_aligned(addrs: np.ndarray, nbytes: int, what: str) -> None:
    """A vector access (or any access) must be aligned to its size, as on the GPU (misaligned address fault)."""
    bad = addrs % nbytes != 0 if nbytes > 1 else np.zeros(0, dtype=bool)
    if bad.any():
        raise SimError(f"misaligned {what} of {nbytes} bytes at address {int(addrs[np.argmax(bad)])}")
