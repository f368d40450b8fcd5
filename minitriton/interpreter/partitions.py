"""Warp-specialized kernels in the interpreter: `mt.warp_specialize` partitions run as threads of one program, and
ring slots have full / empty barriers with the hardware's phase semantics, so a wrong protocol deadlocks or fails
here as it would on the GPU (with the kernel line).

    mt.warp_specialize        each region in a thread of its own, all sharing the program's values; the op
                              returns when every partition finished (the first error any of them raised re-raised)
    mt.alloc_ring {tma_barriers}  the slots (zeros) and, per slot, a full and an empty barrier: counts of completed
                              phases (one arrival completes a phase here: a partition is one thread of control)
    mt.async_copy (TMA form)  when valid: slot = the tile at (row, col) of the descriptor's matrix (zeros outside
                              it), then the slot's full barrier completes a phase
    mt.ring_store             slot = the tile, then the full barrier completes a phase
    mt.async_wait (ring form) blocks until the slot's full (attr empty: empty) barrier completed the phase of the
                              parity operand: true once the barrier's current phase has the other parity (a fresh
                              barrier is in phase 0, so waiting for parity 1 passes at once, as on the GPU)
    mt.ring_release           when valid: the slot's empty barrier completes a phase

A fill into a slot whose previous fill nobody released, or a release of a slot that holds no fill, is an error: on
the GPU it overwrites data a consumer may still read. When every running partition waits, that is a deadlock: an
InterpreterError names the waits.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import InterpreterError
from ..ir.core import Operation
from ..ir.types import TensorDescType
from .async_ops import _slot
from .tma_ops import Descriptor, box, check_coordinates
from .values import dtype_of, from_raw

Step = Callable[[list, Any], None]
SlotOf = Callable[[Any], int]


@dataclass
class RingBarriers:
    """Completed phases of each slot's full and empty barrier."""

    full: list[int]
    empty: list[int]

    @classmethod
    def fresh(cls, stages: int) -> "RingBarriers":
        return cls([0] * stages, [0] * stages)


class Aborted(InterpreterError):
    """A partition stops because another one failed (that one's error is the one reported)."""


@dataclass
class Scheduler:
    """Lets the partitions of one program wait for each other, and tells a deadlock from a wait."""

    running: int
    cond: threading.Condition = field(default_factory=threading.Condition)
    waiting: dict[int, tuple[str, Callable[[], bool]]] = field(default_factory=dict)  # thread -> (what, ready)
    failed: BaseException | None = None

    def wait_until(self, ready: Callable[[], bool], what: str, op: Operation) -> None:
        with self.cond:
            me = threading.get_ident()
            self.waiting[me] = (what, ready)
            try:
                while not ready():
                    if self.failed is not None:
                        raise Aborted("another partition failed", op.loc)
                    # a deadlock: every running partition waits, and no wait can be met (a waiter that was
                    # notified but has not run yet still counts as waiting: its condition tells)
                    if len(self.waiting) >= self.running and not any(r() for _, r in self.waiting.values()):
                        waits = "; ".join(sorted(w for w, _ in self.waiting.values()))
                        self.failed = InterpreterError(f"deadlock: every partition waits ({waits})", op.loc)
                        self.cond.notify_all()
                        raise self.failed
                    self.cond.wait()
            finally:
                self.waiting.pop(me, None)

    def changed(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def done(self, error: BaseException | None) -> None:
        with self.cond:
            self.running -= 1
            if error is not None and self.failed is None:
                self.failed = error
            self.cond.notify_all()


def ring_barriers(ctx: Any, ring_slot: int) -> RingBarriers:
    return ctx.rings[ring_slot]


def build_alloc_ring(op: Operation, use: SlotOf, define: SlotOf) -> Step:
    t, out = op.result.type, define(op.result)
    stages, barriers = int(op.attrs["stages"]), bool(op.attrs.get("tma_barriers"))

    def alloc_ring(env: list, ctx: Any) -> None:
        env[out] = np.zeros(t.shape, dtype=dtype_of(t))
        if barriers:
            ctx.rings[out] = RingBarriers.fresh(stages)

    return alloc_ring


def _filled(ctx: Any, ring: int, s: int, op: Operation) -> None:
    """A fill landed in slot s: its full barrier completes a phase."""
    bars = ring_barriers(ctx, ring)
    if bars.full[s] > bars.empty[s]:
        raise InterpreterError(f"ring slot {s} is filled again before its previous fill was released (the consumer "
                               "may still read it); wait for the slot to be empty first (ring.put does)", op.loc)
    bars.full[s] += 1
    _notify(ctx)


def _notify(ctx: Any) -> None:
    if ctx.scheduler is not None:
        ctx.scheduler.changed()


def tma_tile(desc: Descriptor, shape: tuple[int, ...], row: int, col: int) -> tuple[np.ndarray, np.ndarray]:
    """(addresses, inside) of the [R, C] tile whose first element is (row, col) of the descriptor's matrix: a 2-D
    descriptor's own coordinates, or for the [M / 64, 8, 8, K] view of A in paired boxes the row split into
    (row / 64, row / 8 % 8, row % 8) (codegen/async_copy.py)."""
    if len(desc.shape) == 2:
        return box(desc, shape, [row, col])
    if len(desc.shape) == 4 and desc.shape[1:3] == (8, 8):
        matrix = Descriptor(desc.base, (desc.shape[0] * 64, desc.shape[3]), (desc.strides[2], desc.strides[3]),
                            desc.element)
        return box(matrix, shape, [row, col])
    raise InterpreterError(f"a ring is filled from a 2-D descriptor or the [M / 64, 8, 8, K] view of a matrix, got "
                           f"a descriptor of shape {desc.shape}", None)


def build_tma_ring_copy(op: Operation, use: SlotOf, define: SlotOf) -> Step:
    ring, slot, desc, row, col, valid = (use(v) for v in op.operands)
    t: TensorDescType = op.operands[2].type  # type: ignore[assignment]
    shape = tuple(op.operands[0].type.shape[1:])  # type: ignore[union-attr]
    s, loc = t.element, op.loc

    def tma_ring_copy(env: list, ctx: Any) -> None:
        if not env[valid]:
            return
        r, c = int(env[row]), int(env[col])
        check_coordinates(op, s, [r, c], store=False)
        addrs, inside = tma_tile(env[desc], shape, r, c)
        raw = ctx.memory.gather(addrs.reshape(-1), inside.reshape(-1), s, op.name, loc, shape)
        k = _slot(env, ring, slot, op)
        env[ring][k] = from_raw(raw, s).reshape(shape)
        _filled(ctx, ring, k, op)

    return tma_ring_copy


def build_ring_store(op: Operation, use: SlotOf, define: SlotOf) -> Step:
    ring, slot, tile = (use(v) for v in op.operands)

    def ring_store(env: list, ctx: Any) -> None:
        k = _slot(env, ring, slot, op)
        env[ring][k] = env[tile]
        _filled(ctx, ring, k, op)

    return ring_store


def build_ring_wait(op: Operation, use: SlotOf, define: SlotOf) -> Step:
    ring, slot, phase = (use(v) for v in op.operands)
    kind = "empty" if op.attrs.get("empty") else "full"

    def ring_wait(env: list, ctx: Any) -> None:
        k, parity = _slot(env, ring, slot, op), int(env[phase]) & 1
        counts = getattr(ring_barriers(ctx, ring), kind)
        ready = lambda: counts[k] % 2 != parity  # noqa: E731 - the phase of that parity completed
        if ready():
            return
        what = f"slot {k}'s {kind} barrier, parity {parity}, at {op.loc}"
        if ctx.scheduler is None:
            raise InterpreterError(f"deadlock: waits for {what} outside any partition", op.loc)
        ctx.scheduler.wait_until(ready, what, op)

    return ring_wait


def build_ring_release(op: Operation, use: SlotOf, define: SlotOf) -> Step:
    ring, slot, valid = (use(v) for v in op.operands)

    def ring_release(env: list, ctx: Any) -> None:
        if not env[valid]:
            return
        k = _slot(env, ring, slot, op)
        bars = ring_barriers(ctx, ring)
        if bars.empty[k] >= bars.full[k]:
            raise InterpreterError(f"ring slot {k} is released but holds no fill", op.loc)
        bars.empty[k] += 1
        _notify(ctx)

    return ring_release


def build_warp_specialize(op: Operation, compile_block: Callable[[Any], Any]) -> Step:
    regions = [compile_block(r.block) for r in op.regions]

    def warp_specialize(env: list, ctx: Any) -> None:
        scheduler = Scheduler(len(regions))
        saved, ctx.scheduler = ctx.scheduler, scheduler
        errors: list[BaseException] = []

        def run(region: Any) -> None:
            error = None
            try:
                with np.errstate(all="ignore"):  # per thread: the program's setting does not carry over
                    region.run(env, ctx, ())
            except BaseException as e:  # noqa: BLE001 - reported by the op below
                error = e
                errors.append(e)
            scheduler.done(error)

        threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in regions]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            ctx.scheduler = saved
        if errors:
            raise next((e for e in errors if not isinstance(e, Aborted)), errors[0])

    return warp_specialize


def build_async_copy(op: Operation, use: SlotOf, define: SlotOf) -> Step:
    """mt.async_copy in either form: TMA (a descriptor operand) or cp.async (pointers, async_ops)."""
    from . import async_ops

    if len(op.operands) > 2 and isinstance(op.operands[2].type, TensorDescType):
        return build_tma_ring_copy(op, use, define)
    return async_ops.build_async_copy(op, use, define)


def build_async_wait(op: Operation, use: SlotOf, define: SlotOf) -> Step:
    """mt.async_wait: on a ring slot's barrier (operands), or a cp.async group wait (nothing to do here)."""
    if op.operands:
        return build_ring_wait(op, use, define)
    return lambda env, ctx: None


STEP_BUILDERS: dict[str, Callable[[Operation, SlotOf, SlotOf], Step]] = {
    "mt.alloc_ring": build_alloc_ring, "mt.async_copy": build_async_copy, "mt.async_wait": build_async_wait,
    "mt.ring_store": build_ring_store, "mt.ring_release": build_ring_release,
}
