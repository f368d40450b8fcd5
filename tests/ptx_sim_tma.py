"""TMA and mbarrier instructions for the PTX simulator (tests/ptx_sim.py), modelled from the PTX ISA and the H200
measurements in /work/shared/reference/hopper_ptx.md, independently of the codegen.

Tensor maps. A kernel argument that is an `mt.TensorDescriptor` is a `.param .align 64 .b8 name[128]` parameter:
its tensor's storage span is placed in global memory, and the parameter symbol's address is a *param-space*
address. `cvta.param.u64` turns it into the generic address that `cp.async.bulk.tensor` takes; using the
param-space address directly is an error (on the H200 it fails with "misaligned address").

    cp.async.bulk.tensor.Nd.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [tmap, {x, y}], [bar]
        copies the box at the coordinates (innermost first, in elements; may be negative) into shared memory at dst:
        elements outside the tensor are zeros; with the 128B swizzle, 16-byte chunk j of the box's 128-byte row r
        lands at chunk j ^ (r % 8) of that row (dst must then be 1024-aligned, else 128-aligned). The bytes then
        complete that many bytes of the barrier's transaction count. The destination must not be in use: every
        generic access to it must be separated from the copy by a bar.sync, and generic writes to it must have
        been followed by `fence.proxy.async.shared::cta` in the writing thread.
    cp.async.bulk.tensor.Nd.global.shared::cta.bulk_group [tmap, {x, y}], [src]
        copies shared memory (unswizzled as above) to the box, dropping the elements outside the tensor. The
        source must have been written before a bar.sync and fenced with fence.proxy.async by its writers. It
        stays in use (generic writes to it are errors) until the issuing thread's `cp.async.bulk.wait_group N`
        leaves at most N committed groups; a kernel must not exit with a store in flight.
The copies happen at once; what the simulator checks is the ordering the PTX promises.

mbarriers (`.b64` shared variables; generic loads and stores to them are errors):
    mbarrier.init.shared::cta.b64 [bar], count          expected arrivals per phase; phase 0
    mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], n   per active thread: tx += n, then one arrival
    mbarrier.try_wait.parity.shared::cta.b64 p, [bar], parity
        true when the phase of that parity has completed (the current phase's parity differs). A phase completes
        when all arrivals came and the transaction count is back to 0; tx below 0 is an error. Because the threads
        run in lockstep and copies complete at once, a false answer means the loop would spin forever: an error.
        Bytes a TMA load wrote can be read (ld.shared) only after a successful wait on its barrier, and a TMA load
        may not land in bytes an in-flight wgmma (not yet covered by wgmma.wait_group) reads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ptx_sim import GlobalMemory, SimError, _split_operands

PARAM_WINDOW = 1 << 56  # param-space addresses of tensor-map parameters (fake)
GENERIC_PARAM = 1 << 57  # their generic addresses (after cvta.param)
TENSOR_MAP_BYTES = 128
SWIZZLE_SPAN = 128


# ------------------------------------------------------------------------------------------- tensor maps


@dataclass(frozen=True)
class TensorMap:
    """What the simulator needs of a CUtensorMap: the tensor in global memory and the box."""

    base: int  # global address of element (0, ..., 0)
    shape: tuple[int, ...]  # outermost first
    strides: tuple[int, ...]  # elements
    box: tuple[int, ...]
    elem: int  # bytes
    swizzle: int  # 0 or 128

    @property
    def box_bytes(self) -> int:
        return int(np.prod(self.box)) * self.elem


def storage_span(t: torch.Tensor, shape: tuple[int, ...], strides: tuple[int, ...]) -> torch.Tensor:
    """A flat view of the elements from t's first element to its last (what the tensor map can address)."""
    n = 1 + sum((s - 1) * st for s, st in zip(shape, strides))
    return torch.as_strided(t, (n,), (1,), t.storage_offset())


def add_descriptor(gmem: GlobalMemory, index: int, desc: Any, base: int) -> tuple[int, TensorMap]:
    """Register a descriptor argument whose tensor span was placed at `base`; returns its param-space address."""
    tm = TensorMap(base, tuple(desc.shape), tuple(desc.strides), tuple(desc.block_shape),
                   desc.tensor.element_size(), desc.swizzle_bytes)
    maps = getattr(gmem, "tensor_maps", None)
    if maps is None:
        maps = gmem.tensor_maps = {}  # type: ignore[attr-defined]
    maps[GENERIC_PARAM + index * TENSOR_MAP_BYTES] = tm
    return PARAM_WINDOW + index * TENSOR_MAP_BYTES, tm


def cvta_param(addr: np.ndarray) -> np.ndarray:
    bad = (addr < PARAM_WINDOW) | (addr >= GENERIC_PARAM)
    if np.any(bad):
        raise SimError(f"cvta.param of {int(addr[bad][0]):#x}, which is not a kernel parameter's address")
    return addr - PARAM_WINDOW + GENERIC_PARAM


def swizzle_chunks(box_bytes: np.ndarray, swizzle: int) -> np.ndarray:
    """The box as it lies in shared memory: 16-byte chunk j of 128-byte row r at chunk j ^ (r % 8) (H200 rule)."""
    if swizzle == 0:
        return box_bytes
    rows = box_bytes.reshape(-1, SWIZZLE_SPAN // 16, 16)
    out = np.empty_like(rows)
    r = np.arange(rows.shape[0])[:, None]
    j = np.arange(rows.shape[1])[None, :]
    out[r, j ^ (r % 8)] = rows[r, j]
    return out.reshape(-1)


def unswizzle_chunks(smem_bytes: np.ndarray, swizzle: int) -> np.ndarray:
    """Inverse of swizzle_chunks (the xor is its own inverse)."""
    if swizzle == 0:
        return smem_bytes
    rows = smem_bytes.reshape(-1, SWIZZLE_SPAN // 16, 16)
    r = np.arange(rows.shape[0])[:, None]
    j = np.arange(rows.shape[1])[None, :]
    return rows[r, j ^ (r % 8)].reshape(-1)


def box_addresses(tm: TensorMap, coords_inner_first: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(global address, inside the tensor) of every box element, row-major over the box."""
    coords = list(reversed(coords_inner_first))
    idx = np.indices(tm.box).reshape(len(tm.box), -1).T + np.array(coords)[None, :]
    inside = np.all((idx >= 0) & (idx < np.array(tm.shape)[None, :]), axis=1)
    addrs = tm.base + (idx * np.array(tm.strides)[None, :]).sum(axis=1) * tm.elem
    return addrs.astype(np.int64), inside


# ------------------------------------------------------------------------------------------- the unit


@dataclass
class MBarrier:
    expected: int
    pending: int
    tx: int = 0
    phases_done: int = 0


@dataclass
class TmaUnit:
    """The TMA engine, mbarriers and async-proxy bookkeeping of one CTA (attached to its shared memory as the
    guard that checks generic accesses)."""

    cta: Any
    barriers: dict[int, MBarrier] = field(default_factory=dict)
    pending_stores: list[list[tuple[int, int]]] = field(default_factory=list)  # committed groups (byte ranges)
    open_group: list[tuple[int, int]] = field(default_factory=list)  # stores not yet committed

    def __post_init__(self) -> None:
        size = self.cta.smem.data.size
        self.is_barrier = np.zeros(size, dtype=bool)
        for name, (offset, nbytes, bits) in self.cta.k.shared.items():
            if bits == 64 and name != "smem":
                self.is_barrier[offset:offset + nbytes] = True
        self.loaded_by = np.full(size, -1, dtype=np.int64)  # barrier whose wait makes the byte readable
        self.being_stored = np.zeros(size, dtype=bool)  # source of a TMA store in flight
        self.unfenced = np.full(size, -1, dtype=np.int64)  # thread whose generic write awaits fence.proxy.async
        self.cta.smem.guard = self

    # -- checks on generic shared-memory accesses (called by SharedMemory)

    def check_read(self, tids: np.ndarray, idx: np.ndarray) -> None:
        if np.any(self.is_barrier[idx]):
            raise SimError("generic load from an mbarrier")
        if np.any(self.loaded_by[idx] >= 0):
            raise SimError("reads shared memory a TMA load wrote before waiting on its mbarrier")

    def check_write(self, tids: np.ndarray, idx: np.ndarray) -> None:
        if np.any(self.is_barrier[idx]):
            raise SimError("generic store to an mbarrier")
        if np.any(self.being_stored[idx]):
            raise SimError("writes shared memory a TMA store is still reading (no cp.async.bulk.wait_group)")
        if np.any(self.loaded_by[idx] >= 0):
            raise SimError("writes shared memory a TMA load is filling (before the mbarrier wait)")
        self.unfenced[idx.ravel()] = np.broadcast_to(tids[:, None], idx.shape).ravel()

    # -- instructions

    def fence(self, mods: list[str], mask: np.ndarray) -> None:
        if mods[:2] == ["proxy", "async"]:
            active = np.flatnonzero(mask)
            self.unfenced[np.isin(self.unfenced, active)] = -1
        elif mods[0] != "mbarrier_init" and mods not in (["acq_rel", "gpu"], ["release", "gpu"], ["acquire", "gpu"]):
            raise SimError(f"unsupported fence.{'.'.join(mods)}")

    def barrier_at(self, op: str, mask: np.ndarray) -> tuple[int, MBarrier | None]:
        addrs = self.cta.address(op)[mask]
        if addrs.size == 0:
            return -1, None
        if np.any(addrs != addrs[0]):
            raise SimError("threads name different mbarriers in one instruction")
        a = int(addrs[0])
        if a % 8 or not self.is_barrier[a:a + 8].all():
            raise SimError(f"shared address {a} is not an mbarrier (.shared .b64 variable)")
        return a, self.barriers.get(a)

    def mbarrier(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        kind = mods[0]
        if kind == "init":
            a, _ = self.barrier_at(ops[0], mask)
            if a >= 0:
                count = int(ops[1])
                self.barriers[a] = MBarrier(count, count)
            return
        if kind == "arrive" and "expect_tx" in mods:
            a, bar = self.barrier_at(ops[1], mask)
            if a < 0:
                return
            if bar is None:
                raise SimError("mbarrier.arrive on an uninitialized mbarrier")
            arrivals = int(mask.sum())
            bar.tx += int(ops[2]) * arrivals
            bar.pending -= arrivals
            if bar.pending < 0:
                raise SimError("more arrivals on an mbarrier than its init count in one phase")
            self.try_complete(a, bar)
            return
        if kind == "try_wait" and "parity" in mods:
            a, bar = self.barrier_at(ops[1], mask)
            if a < 0:
                return
            if bar is None:
                raise SimError("mbarrier.try_wait on an uninitialized mbarrier")
            parity = self.cta.get(ops[2], "u32")[mask]
            if np.any(parity != parity[0]) or int(parity[0]) not in (0, 1):
                raise SimError("threads wait on different phase parities")
            if bar.phases_done % 2 == int(parity[0]):  # that phase is the current one: still pending
                raise SimError(f"deadlock: waiting for phase parity {int(parity[0])} of an mbarrier that has "
                               f"completed {bar.phases_done} phases, with {bar.pending} arrivals and {bar.tx} "
                               "transaction bytes outstanding and nothing left to complete it")
            self.loaded_by[self.loaded_by == a] = -1
            self.cta.set(ops[0].split("|")[0], np.ones(self.cta.n, dtype=bool), "pred", mask)
            return
        raise SimError(f"unsupported mbarrier.{'.'.join(mods)}")

    def try_complete(self, a: int, bar: MBarrier) -> None:
        if bar.pending == 0 and bar.tx == 0:
            bar.phases_done += 1
            bar.pending = bar.expected

    def tensor_map(self, text: str, mask: np.ndarray) -> tuple[TensorMap, list[int]]:
        inner = text.strip()[1:-1]  # "[%rd2, {%r6, %r4}]"
        reg, coords = _split_operands(inner)
        addr = int(self.cta.get(reg, "u64")[mask][0])
        if PARAM_WINDOW <= addr < GENERIC_PARAM:
            raise SimError("TMA given the tensor map's param-space address: take its generic address with "
                           "cvta.param.u64 (on the H200 this fails with 'misaligned address')")
        tm = getattr(self.cta.gmem, "tensor_maps", {}).get(addr)
        if tm is None:
            raise SimError(f"{addr:#x} is not the address of a tensor map")
        values = [int(self.cta.get(c, "s32")[mask][0]) for c in _split_operands(coords.strip()[1:-1])]
        if len(values) != len(tm.box):
            raise SimError(f"{len(values)} coordinates for a rank-{len(tm.box)} tensor map")
        return tm, values

    def check_box_place(self, start: int, tm: TensorMap) -> None:
        align = 1024 if tm.swizzle else 128
        if start % align:
            raise SimError(f"TMA box at shared address {start} is not {align}-byte aligned")
        if start + tm.box_bytes > self.cta.smem.data.size or np.any(self.is_barrier[start:start + tm.box_bytes]):
            raise SimError(f"TMA box of {tm.box_bytes} bytes at {start} does not fit the shared buffer")

    def bulk_tensor(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        if int(mask.sum()) != 1:
            raise SimError(f"a TMA copy issued by {int(mask.sum())} threads (expected one)")
        rank = int(mods[3][:-1])
        smem = self.cta.smem
        if mods[4] == "shared::cluster":  # global -> shared, completing on an mbarrier
            start = int(self.cta.address(ops[0])[mask][0])
            tm, coords = self.tensor_map(ops[1], mask)
            a, bar = self.barrier_at(ops[2], mask)
            if bar is None:
                raise SimError("TMA load completing on an uninitialized mbarrier")
            self.check_box_place(start, tm)
            span = slice(start, start + tm.box_bytes)
            if np.any(smem.writer[span] != -1) or np.any(smem.reader[span] != -1):
                raise SimError("TMA load overwrites shared memory threads accessed since the last bar.sync")
            if np.any(self.unfenced[span] != -1):
                raise SimError("TMA load over generic writes not ordered by fence.proxy.async")
            self.check_not_read_by_running_wgmma(start, tm.box_bytes)
            addrs, inside = box_addresses(tm, coords)
            data = np.zeros((addrs.size, tm.elem), dtype=np.uint8)
            if inside.any():
                data[inside] = self.cta.gmem.read(addrs[inside], tm.elem)
            smem.data[span] = swizzle_chunks(data.reshape(-1), tm.swizzle)
            self.loaded_by[span] = a
            bar.tx -= tm.box_bytes
            if bar.tx < 0:
                raise SimError(f"a TMA load completed {tm.box_bytes} bytes on an mbarrier that expected fewer")
            self.try_complete(a, bar)
        elif mods[4] == "global" and mods[5] == "shared::cta":  # shared -> global, in a bulk group
            tm, coords = self.tensor_map(ops[0], mask)
            start = int(self.cta.address(ops[1])[mask][0])
            self.check_box_place(start, tm)
            span = slice(start, start + tm.box_bytes)
            if np.any(smem.writer[span] != -1):
                raise SimError("TMA store of shared memory written since the last bar.sync")
            if np.any(self.unfenced[span] != -1):
                raise SimError("TMA store of shared memory whose writes were not fenced with fence.proxy.async")
            if np.any(self.loaded_by[span] >= 0):
                raise SimError("TMA store of shared memory a TMA load is still filling")
            data = unswizzle_chunks(smem.data[span].copy(), tm.swizzle).reshape(-1, tm.elem)
            addrs, inside = box_addresses(tm, coords)
            if inside.any():
                self.cta.gmem.write(addrs[inside], data[inside])
            self.being_stored[span] = True
            self.open_group.append((start, start + tm.box_bytes))
        else:
            raise SimError(f"unsupported cp.async.bulk.tensor.{'.'.join(mods[3:])}")
        if rank != len(tm.box):
            raise SimError(f".{rank}d copy with a rank-{len(tm.box)} tensor map")

    def check_not_read_by_running_wgmma(self, start: int, nbytes: int) -> None:
        """A TMA load must not land in bytes a wgmma not yet covered by wgmma.wait_group reads (TMA-fed rings)."""
        tc = getattr(self.cta, "tc", None)
        if tc is None:
            return
        span = np.arange(start, start + nbytes)
        for group in tc.pending_reads:
            for read in group:
                if np.isin(span, read).any():
                    raise SimError("a TMA load into shared memory an in-flight wgmma reads (its group was not "
                                   "covered by wgmma.wait_group)")

    def bulk_group(self, kind: str, ops: list[str], mask: np.ndarray) -> None:
        if not mask.any():
            return
        if kind == "commit_group":
            if self.open_group:
                self.pending_stores.append(self.open_group)
            self.open_group = []
            return
        keep = int(ops[0])
        while len(self.pending_stores) > keep:
            for lo, hi in self.pending_stores.pop(0):
                self.being_stored[lo:hi] = False

    def cp(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        if mods[:3] == ["async", "bulk", "tensor"]:
            if mask.any():
                self.bulk_tensor(mods, ops, mask)
        elif mods[:2] == ["async", "bulk"] and mods[2] in ("commit_group", "wait_group"):
            self.bulk_group(mods[2], ops, mask)
        else:
            raise SimError(f"unsupported cp.{'.'.join(mods)}")

    def at_exit(self) -> None:
        if self.open_group or self.pending_stores:
            raise SimError("the kernel exits with a TMA store in flight (no cp.async.bulk.wait_group)")
