"""The PTX simulator (tests/ptx_sim.py) for warp-specialized kernels: a CTA's threads split into groups, each with
its own program counter (passes/warp_specialize.py: the consumer warps, then the producer warpgroup).

    run_ws_ptx(ptx, name, grid, args, consumer_threads, producer_threads=128, policy="round_robin")

Each group runs in lockstep as the base simulator runs a whole CTA (its branches must be uniform over the group,
its registers are checked for definition over the group), and the groups interleave:
- at an `mbarrier.try_wait` whose phase has not completed the group blocks (on the GPU it spins) and another runs;
  when every unfinished group is blocked that is a deadlock (SimError "deadlock");
- `bar.sync N[, count]` is a named barrier: a group arrives with all its threads (else "divergent") and waits until
  `count` threads (default: the whole CTA) arrived at barrier N; then the shared-memory race detector forgets the
  accesses of the threads that took part (the ones that did not are not ordered by it);
- plain `mbarrier.arrive` (an empty-slot release) counts one arrival per thread that executes it;
- `setmaxnreg` must be executed by whole warpgroups (`.sync.aligned`).
Scheduling policy: "round_robin" switches group after every mbarrier / barrier instruction (fine interleaving),
"greedy" runs a group until it blocks or exits (a producer runs as far ahead as its waits let it). Both are legal
executions; tests run both. On top of the base checks (TMA data read only after the full-barrier wait, no TMA into
bytes an in-flight wgmma reads), a TMA load may not land in bytes whose previous TMA fill nobody waited for yet (a
producer that does not wait for the empty barrier overwrites a fill the consumers have not consumed).

Not modelled: the consumer warpgroups run as one group (lockstep) — wgmma groups are tracked per CTA by
tests/ptx_sim_mma.py, so splitting them would need per-warpgroup wgmma state.
"""
from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

from ptx_sim import CTA, SimError, run_ptx

WARPGROUP = 128


class WarpSpecializedCTA(CTA):
    """A CTA whose thread groups have separate program counters (module docstring)."""

    def __init__(self, *args: Any, groups: Sequence[range], policy: str = "round_robin") -> None:
        super().__init__(*args)
        if sorted(t for g in groups for t in g) != list(range(self.n)):
            raise SimError(f"the groups {groups} do not partition the CTA's {self.n} threads")
        self.groups = [np.isin(np.arange(self.n), list(g)) for g in groups]
        self.policy = policy
        self.named: dict[int, tuple[int, int, list[int]]] = {}  # barrier id -> (count, arrived, waiting groups)
        self.yielded = False
        self.arriving: dict[int, set[int]] = {}  # mbarrier -> warpgroups that arrived in its current phase
        self.released: dict[int, set[int]] = {}  # mbarrier -> warpgroups whose arrivals completed its last phase

    # -- scheduling

    def run(self) -> None:
        pcs = [0] * len(self.groups)
        state = ["ready"] * len(self.groups)  # ready | bar | done
        current, steps = 0, 0
        while True:
            runnable = [g for g in range(len(self.groups)) if state[g] == "ready" and self._can_run(pcs[g], g)]
            if not runnable:
                if all(s == "done" for s in state):
                    break
                raise SimError("deadlock: every warp group waits " + "; ".join(
                    f"group {g} at PTX line {self.k.code[pcs[g] - (state[g] == 'bar')].line} "
                    f"({self.k.code[pcs[g] - (state[g] == 'bar')].text})"
                    for g in range(len(self.groups)) if state[g] != "done"))
            current = next((g for g in runnable if g >= current), runnable[0])
            self.yielded = False
            while state[current] == "ready" and self._can_run(pcs[current], current) and not self.yielded:
                steps += 1
                if steps > 50_000_000:
                    raise SimError("runaway loop")
                pcs[current] = self._step(pcs[current], current, state)
            if self.policy == "round_robin" or state[current] != "ready" or not self._can_run(pcs[current], current):
                current = (current + 1) % len(self.groups)
        if self.tma is not None:
            self.tma.at_exit()

    def _can_run(self, pc: int, group: int) -> bool:
        """False while the group sits at an mbarrier.try_wait whose phase has not completed."""
        ins = self.k.code[pc]
        if not ins.opcode.startswith("mbarrier.try_wait"):
            return True
        self.active = self.groups[group]  # registers are checked over the group that reads them
        self.reading = self.active
        mask = self._mask(ins, group)
        self.reading = mask
        if not mask.any():
            return True
        a, bar = self.tma.barrier_at(ins.operands[1], mask)  # type: ignore[union-attr]
        if bar is None:
            return True  # the base simulator reports it
        parity = self.get(ins.operands[2], "u32")[mask]
        return bar.phases_done % 2 != int(parity[0])

    def _mask(self, ins: Any, group: int) -> np.ndarray:
        mask = self.groups[group]
        if ins.guard:
            p = self.get(ins.guard.lstrip("!"), "pred")
            mask = mask & (~p if ins.guard.startswith("!") else p)
        return mask

    def _step(self, pc: int, group: int, state: list[str]) -> int:
        ins = self.k.code[pc]
        self.active = self.groups[group]
        self.reading = self.active  # the guard is read over the group; the instruction's operands over its mask
        mask = self._mask(ins, group)
        self.reading = mask
        op = ins.opcode
        try:
            if op.startswith("bra"):
                if np.any(mask) and not np.array_equal(mask, self.groups[group]):
                    raise SimError(f"divergent branch (taken by {int(mask.sum())} of the group's "
                                   f"{int(self.groups[group].sum())} threads)")
                return self.k.labels[ins.operands[0]] if np.any(mask) else pc + 1
            if op == "ret":
                state[group] = "done"
                return pc
            if op.startswith("bar.sync") or op.startswith("barrier.sync"):
                self._named_barrier(ins.operands, mask, group, state)
                return pc + 1
            if op.startswith("mbarrier"):
                self.yielded = True
            self.execute(ins, mask)
        except SimError as e:
            raise SimError(f"PTX line {ins.line}: {ins.text}: {e}") from None
        return pc + 1

    # -- named barriers

    def _named_barrier(self, ops: list[str], mask: np.ndarray, group: int, state: list[str]) -> None:
        if not np.array_equal(mask, self.groups[group]):
            raise SimError("bar.sync not reached by every thread of the group (divergent)")
        ident = int(ops[0])
        count = int(ops[1]) if len(ops) > 1 else self.n
        if count % 32 or count > self.n:
            raise SimError(f"bar.sync {ident}, {count}: the count must be a multiple of 32 and at most the CTA's")
        want, arrived, waiting = self.named.get(ident, (count, 0, []))
        if want != count:
            raise SimError(f"bar.sync {ident} with thread counts {want} and {count}")
        arrived += int(mask.sum())
        waiting = waiting + [group]
        if arrived > count:
            raise SimError(f"bar.sync {ident}, {count}: {arrived} threads arrived")
        self.yielded = True
        if arrived < count:
            self.named[ident] = (count, arrived, waiting)
            state[group] = "bar"
            return
        self.named.pop(ident, None)
        for g in waiting:
            state[g] = "ready"
        self._forget_accesses(np.flatnonzero(np.logical_or.reduce([self.groups[g] for g in waiting])))

    def _forget_accesses(self, threads: np.ndarray) -> None:
        """The barrier orders the participants' shared-memory accesses (a byte several threads read stays
        recorded as such unless every thread took part)."""
        smem = self.smem
        if threads.size == self.n:
            smem.barrier()
        else:
            smem.writer[np.isin(smem.writer, threads)] = -1
            smem.reader[np.isin(smem.reader, threads)] = -1
        self.gmem.barrier()

    # -- instructions the base simulator runs in lockstep only

    def op_bar(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        raise SimError("bar.sync reached the lockstep handler")  # _step handles barriers

    def op_mbarrier(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        if mods[0] == "arrive" and "expect_tx" not in mods:
            a, bar = self.tma.barrier_at(ops[1], mask)  # type: ignore[union-attr]
            if a < 0:
                return
            if bar is None:
                raise SimError("mbarrier.arrive on an uninitialized mbarrier")
            # release: the arriving thread's warpgroup (its warpgroup-collective wgmma reads retired before it)
            warpgroups = np.unique(np.flatnonzero(mask) // WARPGROUP)
            self.arriving.setdefault(a, set()).update(int(w) for w in warpgroups)
            bar.pending -= int(mask.sum())
            if bar.pending < 0:
                raise SimError("more arrivals on an mbarrier than its init count in one phase")
            done = bar.phases_done
            self.tma.try_complete(a, bar)  # type: ignore[union-attr]
            if bar.phases_done != done:
                self.released[a] = self.arriving.pop(a, set())
            return
        if mods[0] == "try_wait":
            a, _ = self.tma.barrier_at(ops[1], mask)  # type: ignore[union-attr]
            super().op_mbarrier(mods, ops, mask)
            if a >= 0 and self.released.get(a):  # acquire: the releasing threads' accesses are ordered before
                self._acquire(self.released[a])
            return
        super().op_mbarrier(mods, ops, mask)

    def _acquire(self, warpgroups: set[int]) -> None:
        """A wait that observed a phase the warpgroups' arrivals completed: their shared-memory accesses are
        ordered before the waiter's next ones (bytes several threads read are forgotten only when every thread
        outside the waiting group released)."""
        threads = np.flatnonzero(np.isin(np.arange(self.n) // WARPGROUP, list(warpgroups)))
        smem = self.smem
        smem.writer[np.isin(smem.writer, threads)] = -1
        smem.reader[np.isin(smem.reader, threads)] = -1
        others = np.flatnonzero(~self.active)
        if np.isin(others, threads).all():
            smem.reader[smem.reader == -2] = -1

    def op_cp(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        if mods[:3] == ["async", "bulk", "tensor"] and mask.any() and mods[4] == "shared::cluster":
            start = int(self.address(ops[0])[mask][0])
            tm, _ = self.tma.tensor_map(ops[1], mask)  # type: ignore[union-attr]
            if np.any(self.tma.loaded_by[start:start + tm.box_bytes] >= 0):  # type: ignore[union-attr]
                raise SimError("a TMA load into shared memory whose previous TMA fill nobody waited for (the "
                               "producer refills a slot the consumers have not released)")
        super().op_cp(mods, ops, mask)

    def op_cvta(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        if mods[0] != "param":
            super().op_cvta(mods, ops, mask)
            return
        from ptx_sim_tma import PARAM_WINDOW, cvta_param

        value = self.get(ops[1], "u64").astype(np.int64)  # other groups' lanes may not hold the address yet
        self.set(ops[0], cvta_param(np.where(mask, value, PARAM_WINDOW)).astype(np.uint64), "u64", mask)

    def op_setmaxnreg(self, mods: list[str], ops: list[str], mask: np.ndarray) -> None:
        count = int(ops[0])
        if count % 8 or not 24 <= count <= 256 or mods[:1] not in (["inc"], ["dec"]):
            raise SimError(f"setmaxnreg.{'.'.join(mods)} {count}: inc / dec of a multiple of 8 in 24..256")
        groups = mask.reshape(-1, WARPGROUP) if self.n % WARPGROUP == 0 else None
        if groups is None or np.any(groups.any(axis=1) & ~groups.all(axis=1)):
            raise SimError("setmaxnreg executed by part of a warpgroup (it is .sync.aligned)")


def run_ws_ptx(ptx: str, name: str, grid: Sequence[int] | int, args: Sequence[Any], consumer_threads: int,
               producer_threads: int = WARPGROUP, policy: str = "round_robin") -> None:
    """run_ptx with the consumer threads and the producer warpgroup on separate program counters."""
    groups = [range(consumer_threads), range(consumer_threads, consumer_threads + producer_threads)]
    threads = consumer_threads + producer_threads
    declared = re.search(r"\.maxntid (\d+)", ptx)
    if declared and int(declared.group(1)) != threads:
        raise SimError(f".maxntid {declared.group(1)} but the launch has {threads} threads")

    def make_cta(*cta_args: Any) -> WarpSpecializedCTA:
        return WarpSpecializedCTA(*cta_args, groups=groups, policy=policy)

    run_ptx(ptx, name, grid, args, threads, make_cta=make_cta)
