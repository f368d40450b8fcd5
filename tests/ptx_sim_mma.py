"""Tensor-core instructions for the PTX simulator (tests/ptx_sim.py): ldmatrix, mma.sync m16n8k16 and wgmma.

Implemented from the PTX ISA's descriptions, written independently of the codegen (codegen/mma.py,
codegen/wgmma.py), so a wrong fragment or address in the codegen shows up as wrong numbers:

- `ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16`: lane 8q + r gives the address of row r (16 bytes) of
  matrix q; destination register q of lane l gets row l / 4, 16-bit columns 2 (l % 4) and 2 (l % 4) + 1 (low half
  first); with .trans the matrix is transposed first. Every lane of the warp must take part; reads are race-checked
  as reads by the lane that gave the address.
- `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32` and `mma.sync.aligned.m16n8k8.row.col.f32.tf32.
  tf32.f32` (the low 13 bits of each tf32 register ignored): the ISA's fragment tables (groupID = lane >> 2,
  threadID_in_group = lane % 4); D = C + A B computed in float64 and rounded once to f32.
- `wgmma.fence` / `wgmma.mma_async` / `wgmma.commit_group` / `wgmma.wait_group`: per warpgroup (4 warps, all of
  whose threads must take part, with uniform descriptors); the operands are read from shared memory through the
  64-bit matrix descriptors (K-major, 128 / 64 / 32-byte swizzle: byte address bits [4, 4 + b) XOR bits
  [7, 7 + b), 8-row groups SBO bytes apart; with imm-trans-b = 1, B is MN-major: CuTe's canonical
  ((T, S/16, m), (8, k)) : ((1, T, LBO), (S/16 T, SBO)) in elements, T = 8 per 16 bytes — S / 2 consecutive N
  values per S-byte row, N atoms LBO bytes apart, k rows S bytes apart, 8-row groups SBO apart, same XOR),
  D = (scale-d ? D : 0) + A B in float64, rounded to f32. Checked:
  the accumulator registers were not written by another instruction since the last wgmma.fence; the shared bytes
  read were not written by a generic store since that thread's last `fence.proxy.async` (the async proxy would not
  see them); no instruction reads an accumulator before the `wgmma.wait_group` that covers its group; no store
  or cp.async writes shared bytes a wgmma of a group not yet covered by a `wgmma.wait_group` reads (the
  simulator reads operands at issue, the hardware later: such a write would race).
"""
from __future__ import annotations

from typing import Any

import numpy as np

WARPGROUP = 128


def _error(msg: str) -> Exception:
    from ptx_sim import SimError

    return SimError(msg)


def _split(text: str) -> list[str]:
    from ptx_sim import _split_operands

    return _split_operands(text[1:-1] if text.startswith("{") else text)


def _halves_to_float(bits: np.ndarray, t: str) -> np.ndarray:
    """16-bit patterns as float64 values of type t (bf16 or f16)."""
    bits = bits.astype(np.uint16)
    if t == "bf16":
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if t == "f16":
        return bits.view(np.float16).astype(np.float64)
    raise _error(f"tensor-core operands of type {t} are not simulated")


def _live_warps(mask: np.ndarray, what: str) -> np.ndarray:
    """The warps that execute a `.sync.aligned` warp instruction: a guard must be uniform across each warp (the
    codegen predicates whole warps off, e.g. block-structured dots); mixed lanes are an error."""
    per_warp = mask.reshape(-1, 32)
    if np.any(per_warp.any(axis=1) & ~per_warp.all(axis=1)):
        raise _error(f"{what} with a guard that differs between the lanes of a warp")
    return np.nonzero(per_warp.all(axis=1))[0]


class TensorCoreUnit:
    """Per-CTA state of the tensor-core instructions (attached to a ptx_sim.CTA)."""

    def __init__(self, cta: Any):
        self.cta = cta
        self.unfenced = np.full(cta.smem.data.size, -1, dtype=np.int64)  # generic writer not yet proxy-fenced
        self.fenced_at: dict[int, int] = {}  # warpgroup -> step of its last wgmma.fence
        self.written_at: dict[str, int] = {}  # register -> step of its last write by a non-wgmma instruction
        self.step = 0
        self.inside = False  # executing a wgmma (its own register traffic is exempt from the checks)
        self.pending: list[set[str]] = [set()]  # per not-yet-waited commit group; the last one is open
        self.pending_reads: list[list[np.ndarray]] = [[]]  # the shared bytes each of those groups reads

    # -- hooks called by the simulator

    def note_write(self, name: str) -> None:
        self.step += 1
        if not self.inside:
            self.written_at[name] = self.step

    def check_read(self, name: str) -> None:
        if not self.inside and any(name in group for group in self.pending):
            raise _error(f"register {name} (a wgmma accumulator) read before wgmma.wait_group covered it")

    def note_shared_write(self, tids: np.ndarray, addrs: np.ndarray, size: int) -> None:
        idx = addrs[:, None] + np.arange(size)
        for group in self.pending_reads:
            for read in group:
                if np.isin(idx.ravel(), read).any():
                    raise _error("a shared-memory write to bytes an in-flight wgmma reads (its group was not "
                                 "covered by wgmma.wait_group)")
        self.unfenced[idx] = np.broadcast_to(tids[:, None], idx.shape)

    def fence(self, mods: list[str], mask: np.ndarray) -> None:
        if mods[:2] == ["proxy", "async"]:
            threads = np.nonzero(mask)[0]
            self.unfenced[np.isin(self.unfenced, threads)] = -1

    # -- ldmatrix

    def ldmatrix(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        cta = self.cta
        live = _live_warps(mask, "ldmatrix")
        if "m8n8" not in mods or mods[-1] != "b16" or "shared" not in mods:
            raise _error(f"unsupported ldmatrix.{'.'.join(mods)}")
        count = int(next(m for m in mods if m.startswith("x"))[1:])
        trans = "trans" in mods
        dsts = _split(ops[0])
        if len(dsts) != count:
            raise _error(f"ldmatrix.x{count} needs {count} destinations")
        addrs = cta.address(ops[1])
        tids = np.arange(cta.n)
        lane, warp = tids % 32, tids // 32
        warps = cta.n // 32
        for q in range(count):
            providers = (live[:, None] * 32 + 8 * q + np.arange(8)[None, :]).ravel()
            raw = cta.smem.read(providers, addrs[providers], 16)
            matrix = np.zeros((warps, 8, 8), dtype=np.uint16)
            matrix[live] = np.ascontiguousarray(raw).view(np.uint16).reshape(len(live), 8, 8)
            if trans:
                lo = matrix[warp, 2 * (lane % 4), lane // 4]
                hi = matrix[warp, 2 * (lane % 4) + 1, lane // 4]
            else:
                lo = matrix[warp, lane // 4, 2 * (lane % 4)]
                hi = matrix[warp, lane // 4, 2 * (lane % 4) + 1]
            cta.set(dsts[q], lo.astype(np.uint32) | (hi.astype(np.uint32) << 16), "b32", mask)

    # -- mma.sync

    def mma(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        cta = self.cta
        shape, t = mods[2] if len(mods) > 2 else "", mods[6] if len(mods) > 6 else ""
        known = (shape == "m16n8k16" and t in ("bf16", "f16")) or (shape == "m16n8k8" and t == "tf32")
        if not known or mods[:2] != ["sync", "aligned"] or mods[3:6] != ["row", "col", "f32"] or mods[7] != t \
                or mods[8] != "f32":
            raise _error(f"unsupported mma.{'.'.join(mods)}")
        _live_warps(mask, "mma.sync")
        d, a, b, c = (_split(x) for x in ops)
        if (len(d), len(a), len(b), len(c)) != (4, 4, 2, 4):
            raise _error(f"mma.{shape} takes 4 D, 4 A, 2 B and 4 C registers")
        n = cta.n
        lane = np.arange(n) % 32
        warp = np.arange(n) // 32
        group, tig = lane >> 2, lane % 4
        k = 16 if shape == "m16n8k16" else 8
        c_vals = np.stack([cta.get(x, "f32").astype(np.float64) for x in c], axis=1)
        warps = n // 32
        A = np.zeros((warps, 16, k))
        B = np.zeros((warps, k, 8))
        C = np.zeros((warps, 16, 8))
        if t == "tf32":  # the ISA's m16n8k8 .tf32 tables; the hardware reads the top 19 bits of each register
            a_vals, b_vals = self._tf32(a), self._tf32(b)
            for i in range(4):
                A[warp, group + 8 * (i % 2), tig + 4 * (i // 2)] = a_vals[:, i]
            for i in range(2):
                B[warp, tig + 4 * i, group] = b_vals[:, i]
        else:  # the ISA's m16n8k16 tables
            a_vals = self._halves(a, t)  # (n, 8): a0..a7
            b_vals = self._halves(b, t)  # (n, 4): b0..b3
            for i in range(8):
                row = group if i in (0, 1, 4, 5) else group + 8
                col = tig * 2 + (i & 1) + (0 if i < 4 else 8)
                A[warp, row, col] = a_vals[:, i]
            for i in range(4):
                row = tig * 2 + (i & 1) + (0 if i < 2 else 8)
                B[warp, row, group] = b_vals[:, i]
        for i in range(4):
            row = group if i < 2 else group + 8
            C[warp, row, tig * 2 + (i & 1)] = c_vals[:, i]
        D = C + A @ B
        for i in range(4):
            row = group if i < 2 else group + 8
            cta.set(d[i], D[warp, row, tig * 2 + (i & 1)].astype(np.float32), "f32", mask)

    def _tf32(self, regs: list[str]) -> np.ndarray:
        words = [self.cta.get(r, "b32").astype(np.uint32) & np.uint32(0xFFFFE000) for r in regs]
        return np.stack([w.view(np.float32).astype(np.float64) for w in words], axis=1)

    def _halves(self, regs: list[str], t: str) -> np.ndarray:
        cols = []
        for r in regs:
            word = self.cta.get(r, "b32").astype(np.uint32)
            cols += [_halves_to_float(word & 0xFFFF, t), _halves_to_float(word >> 16, t)]
        return np.stack(cols, axis=1)

    # -- wgmma

    def wgmma(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        kind = mods[0]
        if mods[1:3] != ["sync", "aligned"]:
            raise _error(f"unsupported wgmma.{'.'.join(mods)}")
        groups = self._warpgroups(mask)
        if kind == "fence":
            for g in groups:
                self.fenced_at[g] = self.step
        elif kind == "commit_group":
            self.pending.append(set())
            self.pending_reads.append([])
        elif kind == "wait_group":
            keep = int(ops[0])
            closed, reads = self.pending[:-1], self.pending_reads[:-1]
            self.pending = (closed[len(closed) - keep:] if keep else []) + [self.pending[-1]]
            self.pending_reads = (reads[len(reads) - keep:] if keep else []) + [self.pending_reads[-1]]
        elif kind == "mma_async":
            self.inside = True  # wgmmas chain on their accumulators without waiting
            try:
                self._mma_async(mods[3:], ops, groups)
            finally:
                self.inside = False
        else:
            raise _error(f"unsupported wgmma.{kind}")

    def _warpgroups(self, mask: np.ndarray) -> list[int]:
        n = self.cta.n
        if n % WARPGROUP:
            raise _error(f"wgmma needs whole warpgroups, the CTA has {n} threads")
        per_group = mask.reshape(-1, WARPGROUP)
        if np.any(per_group.any(axis=1) != per_group.all(axis=1)):
            raise _error("wgmma with some threads of a warpgroup inactive")
        return [int(g) for g in np.nonzero(per_group.all(axis=1))[0]]

    def _mma_async(self, mods: list[str], ops: list[str], groups: list[int]) -> None:
        cta = self.cta
        shape, dtype, atype, btype = mods[0], mods[1], mods[2], mods[3]
        if not (shape.startswith("m64n") and shape.endswith("k16")) or dtype != "f32" or atype != btype \
                or atype not in ("bf16", "f16"):
            raise _error(f"unsupported wgmma.mma_async.{'.'.join(mods)}")
        n_cols = int(shape[4:-3])
        d = _split(ops[0])
        a_regs = _split(ops[1]) if ops[1].strip().startswith("{") else None  # A from registers: no trans-a
        if len(d) != n_cols // 2 or len(ops) != (7 if a_regs else 8) or (a_regs and len(a_regs) != 4):
            raise _error(f"wgmma m64n{n_cols}k16 takes {n_cols // 2} accumulators, A (a descriptor or 4 words) "
                         f"and {'5' if a_regs else '6'} more operands")
        imm = [o.strip() for o in ops[4:]]
        if a_regs:
            imm.insert(2, "0")
        if imm[:3] != ["1", "1", "0"] or imm[3] not in ("0", "1"):
            raise _error(f"only scale-a = scale-b = 1, K-major A and K- or N-major B are simulated, got {ops[4:]}")
        trans_b = imm[3] == "1"
        tids = np.arange(cta.n)
        for g in groups:
            fence_step = self.fenced_at.get(g)
            if fence_step is None or any(self.written_at.get(r, -1) > fence_step for r in d + (a_regs or [])):
                raise _error("wgmma.mma_async accumulators or A registers written since the warpgroup's last "
                             "wgmma.fence")
            sel = tids[g * WARPGROUP:(g + 1) * WARPGROUP]
            desc_b = self._uniform(cta.get(ops[2], "u64")[sel], "descriptor")
            scale_d = self._scale_d(ops[3], sel)
            if a_regs:
                A = self._register_a(a_regs, sel, atype)
            else:
                A = self._operand(self._uniform(cta.get(ops[1], "u64")[sel], "descriptor"), 64, atype,
                                  int(sel[0]))  # 64 x 16
            B = self._operand_mn(desc_b, n_cols, btype, int(sel[0])) if trans_b else \
                self._operand(desc_b, n_cols, btype, int(sel[0])).T  # 16 x N
            lane, warp_in_group = sel % 32, (sel // 32) % 4
            group_id, tig = lane >> 2, lane % 4
            rows = np.stack([warp_in_group * 16 + group_id + 8 * ((j >> 1) & 1) for j in range(len(d))], axis=1)
            cols = np.stack([(j >> 2) * 8 + tig * 2 + (j & 1) for j in range(len(d))], axis=1)
            old = np.stack([cta.get(r, "f32")[sel].astype(np.float64) for r in d], axis=1)
            prod = (A @ B)[rows, cols]
            new = (old if scale_d else 0.0) + prod
            mask = np.zeros(cta.n, dtype=bool)
            mask[sel] = True
            for j, r in enumerate(d):
                full = np.zeros(cta.n, dtype=np.float32)
                full[sel] = new[:, j].astype(np.float32)
                cta.set(r, full, "f32", mask)
            self.pending[-1].update(d)

    def _register_a(self, regs: list[str], sel: np.ndarray, t: str) -> np.ndarray:
        """The warpgroup's 64 x 16 A from its threads' four words: mma.sync m16n8k16's A fragment per warp (word
        r: row g + 8 (r & 1), columns 2 t + 8 (r >> 1) + {0, 1} of the warp's 16 rows)."""
        lane, warp = sel % 32, (sel // 32) % 4
        g, tig = lane >> 2, lane % 4
        A = np.zeros((64, 16))
        for r, name in enumerate(regs):
            word = self.cta.get(name, "b32")[sel].astype(np.uint32)
            rows, col = 16 * warp + g + 8 * (r & 1), 2 * tig + 8 * (r >> 1)
            A[rows, col] = _halves_to_float(word & 0xFFFF, t)
            A[rows, col + 1] = _halves_to_float(word >> 16, t)
        return A

    def _uniform(self, values: np.ndarray, what: str) -> int:
        if np.any(values != values[0]):
            raise _error(f"wgmma {what} differs between threads of a warpgroup")
        return int(values[0])

    def _scale_d(self, op: str, sel: np.ndarray) -> bool:
        if op.startswith("%"):
            return bool(self._uniform(self.cta.get(op, "pred")[sel], "scale-d"))
        return bool(int(op))

    def _operand(self, desc: int, rows: int, t: str, reader: int) -> np.ndarray:
        """The rows x 16 K-major operand a descriptor points at (values as float64)."""
        start = (desc & 0x3FFF) << 4
        sbo = ((desc >> 32) & 0x3FFF) << 4
        base_offset, mode = (desc >> 49) & 7, desc >> 62
        if mode not in (1, 2, 3) or base_offset:
            raise _error(f"descriptor {desc:#x}: only 128/64/32-byte swizzles with base offset 0 are simulated")
        swizzle = {1: 128, 2: 64, 3: 32}[mode]
        r = np.arange(rows)[:, None]
        chunk = np.arange(2)[None, :]  # 16 K values of 2 bytes: two 16-byte chunks per row
        addr = start + (r // 8) * sbo + (r % 8) * swizzle + 16 * chunk
        return self._read_chunks(addr, swizzle, reader, t).reshape(rows, 16)

    def _operand_mn(self, desc: int, cols: int, t: str, reader: int) -> np.ndarray:
        """The 16 x cols MN-major operand (imm-trans-b = 1) a descriptor points at (values as float64)."""
        start = (desc & 0x3FFF) << 4
        lbo = ((desc >> 16) & 0x3FFF) << 4
        sbo = ((desc >> 32) & 0x3FFF) << 4
        base_offset, mode = (desc >> 49) & 7, desc >> 62
        if mode not in (1, 2, 3) or base_offset:
            raise _error(f"descriptor {desc:#x}: only 128/64/32-byte swizzles with base offset 0 are simulated")
        swizzle = {1: 128, 2: 64, 3: 32}[mode]
        atom = swizzle // 2  # N values per row of an atom
        if cols % 8:
            raise _error(f"MN-major wgmma operand of {cols} columns")
        k = np.arange(16)[:, None]
        n0 = 8 * np.arange(cols // 8)[None, :]  # the first column of each 16-byte chunk
        addr = start + (n0 // atom) * lbo + (k // 8) * sbo + (k % 8) * swizzle + (n0 % atom) * 2
        return self._read_chunks(addr, swizzle, reader, t).reshape(16, cols)

    def _read_chunks(self, addr: np.ndarray, swizzle: int, reader: int, t: str) -> np.ndarray:
        """The 8 16-bit values of each 16-byte chunk at (unswizzled) `addr`, as float64, one row per chunk."""
        bits = {128: 7, 64: 3, 32: 1}[swizzle]
        phys = addr ^ (((addr >> 7) & bits) << 4)
        flat = phys.ravel().astype(np.int64)
        if np.any(flat % 16):
            raise _error("wgmma operand chunk not 16-byte aligned")
        idx = flat[:, None] + np.arange(16)
        if np.any(self.unfenced[idx] >= 0):
            raise _error("wgmma reads shared memory written by a generic store not followed by fence.proxy.async")
        raw = self.cta.smem.read(np.full(flat.size, reader), flat, 16)
        self.pending_reads[-1].append(np.unique(idx.ravel()))
        halves = np.ascontiguousarray(raw).view(np.uint16).reshape(flat.size, 8)
        return _halves_to_float(halves, t)
