"""cp.async (non-bulk) for the PTX simulator (tests/ptx_sim.py): the copies of codegen/async_copy.py.

- `cp.async.cg.shared.global [dst], [src], 16, n;` (also .ca, sizes 4 / 8 / 16): the copy is performed when issued
  (reads n bytes from global memory, bounds- and alignment-checked, writes them and 16 - n zero bytes to shared
  memory through the race detector), but its bytes are *in flight* for the issuing thread: they join the thread's
  open group.
- `cp.async.commit_group;` closes each active thread's open group (an empty group is a group).
- `cp.async.wait_group N;` completes, per thread, every committed group but the newest N: their bytes become
  *landed*, visible to that thread only.
- `bar.sync` makes every landed byte visible to all threads.
Reading a byte that is in flight (any thread), or landed but not yet published by a bar.sync (a thread other than
its copier), raises SimError: the read would see stale data on hardware. So does a cp.async into a byte still in
flight. The checks apply to every generic shared read (ld.shared, ldmatrix) through SharedMemory's guard hook.
A cp.async is a generic-proxy write for the tensor-core unit (tests/ptx_sim_mma.py): a wgmma reading its bytes
needs a `fence.proxy.async` by the copier after its wait, and it may not land in bytes an in-flight wgmma reads.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ptx_sim import SimError

FREE, IN_FLIGHT, LANDED = 0, 1, 2


class AsyncCopyUnit:
    def __init__(self, cta: Any):
        self.cta = cta
        size = cta.smem.data.size
        self.state = np.zeros(size, dtype=np.int8)
        self.owner = np.full(size, -1, dtype=np.int64)
        self.group = np.full(size, -1, dtype=np.int64)  # the owner's group number of an in-flight byte
        self.open_group = np.zeros(cta.n, dtype=np.int64)  # per thread: number of the group being filled
        self.chained = cta.smem.guard
        cta.smem.guard = self

    # -- the shared-memory guard hook

    def check_read(self, tids: np.ndarray, idx: np.ndarray) -> None:
        if self.chained is not None:
            self.chained.check_read(tids, idx)
        st, own = self.state[idx], self.owner[idx]
        who = np.broadcast_to(tids[:, None], idx.shape)
        bad = (st == IN_FLIGHT) | ((st == LANDED) & (own != who))
        if np.any(bad):
            k = tuple(np.argwhere(bad)[0])
            what = "still in flight (its cp.async group was not waited for)" if st[k] == IN_FLIGHT else \
                "landed for its copier but not published by a bar.sync"
            raise SimError(f"thread {int(who[k])} reads shared byte {int(idx[k])} copied by thread {int(own[k])}, "
                           f"{what}")

    def check_write(self, tids: np.ndarray, idx: np.ndarray) -> None:
        if self.chained is not None:
            self.chained.check_write(tids, idx)
        if np.any(self.state[idx] == IN_FLIGHT):
            raise SimError("a shared-memory write to bytes a cp.async is still copying into")

    # -- instructions

    def cp(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        if mods[:1] != ["async"]:
            raise SimError(f"unsupported cp.{'.'.join(mods)}")
        if mods[1:2] == ["commit_group"]:
            self.open_group[mask] += 1
            return
        if mods[1:2] == ["wait_group"]:
            self._wait(int(ops[0]), mask)
            return
        if mods[2:4] != ["shared", "global"] or mods[1] not in ("ca", "cg"):
            raise SimError(f"unsupported cp.{'.'.join(mods)}")
        self._copy(ops, mask)

    def _copy(self, ops: list[str], mask: np.ndarray) -> None:
        cta = self.cta
        size = int(ops[2])
        if size not in (4, 8, 16):
            raise SimError(f"cp.async copies 4, 8 or 16 bytes, got {size}")
        tids = np.nonzero(mask)[0]
        if not len(tids):
            return
        dst = cta.address(ops[0])[tids]
        src = cta.address(ops[1])[tids]
        n = cta.get(ops[3], "u32")[tids].astype(np.int64) if len(ops) > 3 else np.full(len(tids), size)
        if np.any((n < 0) | (n > size)):
            raise SimError(f"cp.async src-size {int(n[(n < 0) | (n > size)][0])} outside 0 .. {size}")
        raw = np.zeros((len(tids), size), dtype=np.uint8)
        for i, (a, cnt) in enumerate(zip(src, n)):  # per thread: only the bytes the src-size asks for are read
            if cnt:
                if a % size:
                    raise SimError(f"misaligned cp.async source {int(a):#x} for {size} bytes")
                raw[i, :cnt] = cta.gmem.read(np.array([a], dtype=np.int64), size)[0, :cnt]
        if np.any(dst % size):
            raise SimError(f"misaligned cp.async destination {int(dst[dst % size != 0][0])}")
        cta.smem.write(tids, dst, raw)
        if cta.tc is not None:  # cp.async writes through the generic proxy: a wgmma reader needs fence.proxy.async
            cta.tc.note_shared_write(tids, dst, size)
        idx = dst[:, None] + np.arange(size)
        self.state[idx] = IN_FLIGHT
        self.owner[idx] = np.broadcast_to(tids[:, None], idx.shape)
        self.group[idx] = np.broadcast_to(self.open_group[tids][:, None], idx.shape)

    def _wait(self, pending: int, mask: np.ndarray) -> None:
        flying = np.nonzero(self.state == IN_FLIGHT)[0]
        if not len(flying):
            return
        own = self.owner[flying]
        committed = self.open_group[own]  # groups numbered below this are committed
        done = mask[own] & (self.group[flying] < committed - pending)
        self.state[flying[done]] = LANDED

    def barrier(self) -> None:
        landed = self.state == LANDED
        self.state[landed] = FREE
        self.owner[landed] = -1
