"""Pass "defer-dot-waits": a wgmma dot that reads no staged operand (A from registers or a ring slot, B a ring slot:
nothing of it lives in the shared scratch the next dot would overwrite) commits without waiting for itself; its
wait moves down to the first op that needs it, so the dots after it issue while it runs.

  %d1 = mt.dot %s, %w, %c1                       %d1 = mt.dot %s, %w, %c1 {async_groups = 1, deferred_wait}
  %d2 = mt.dot %s, %q, %c2                       %d2 = mt.dot %s, %q, %c2 {async_groups = 1, deferred_wait}
  %v = mt.sub %u, %d1                            mt.dot_wait {pending = 1}          d1 retired, d2 may run on
  ...                                            %v = mt.sub %u, %d1
  %e = mt.dot %v, %k, %d2                        ...
                                                 %e = mt.dot %v, %k, %d2 {...}      chained on d2's accumulator
  scf.yield %e                                   mt.dot_wait {pending = 0}
                                                 scf.yield %e

Groups retire in issue order, so waiting for dot i is `wgmma.wait_group P` with P the deferred dots issued after
it. An op needs a pending dot when it uses the dot's result, with one exception: a deferred dot whose accumulator
is that result (wgmma accumulates into an in-flight accumulator in order, as a K loop's wgmmas do). Every op with
regions, every release, fill or register store of a ring (a release must follow the dots that read the slot), every other dot and the
block's terminator waits for all of them (waiting on a slot's full barrier or reading another slot need not). The accumulator operand of a deferred dot has no other use (its
registers become the result's: `async_groups` makes the update in place, codegen/wgmma.py), unless it is a
constant, which the codegen copies into fresh registers before the wgmma issues.

It acts on the blocks of explicit warp-specialize partitions only, where dots read rings in place; loops the
async-dots pass made asynchronous are left alone (their dots carry `async_groups` already).
"""
from __future__ import annotations

from minitriton.ir import Block, Module, Operation
from minitriton.ir.partitions import enclosing_partition

from .registry import register_pass

# ops after which no dot may still read a slot or hold its group open: a release lets the slot be refilled, a fill or
# a register store writes shared memory a dot may be reading, an explicit wait counts the groups itself
WAIT_FOR_ALL = ("mt.ring_release", "mt.async_copy", "mt.ring_store", "mt.dot_wait")


@register_pass("defer-dot-waits")
def defer_dot_waits(module: Module) -> Module:
    for func in module.functions:
        blocks = {id(op.parent): op.parent for op in func.walk()
                  if op.name == "mt.dot" and op.parent is not None and enclosing_partition(op) is not None}
        for block in blocks.values():
            _defer_in(func, block)
    return module


def deferrable(func: Operation, dot: Operation) -> bool:
    """A synchronous wgmma dot whose operands are registers or ring slots and whose accumulator is used by it
    alone."""
    enc = dot.result.type.encoding  # type: ignore[union-attr]
    if enc is None or enc.kind != "mma" or enc.get("version") != 3 or "async_groups" in dot.attrs:
        return False
    a, b = (v.defining_op for v in dot.operands[:2])
    a_enc = dot.operands[0].type.encoding  # type: ignore[union-attr]
    a_ok = a_enc is not None and a_enc.kind == "dot_op" or (a is not None and a.name == "mt.ring_slot")
    if not a_ok or b is None or b.name != "mt.ring_slot":
        return False
    acc = dot.operands[2]
    if acc.defining_op is not None and acc.defining_op.name == "mt.constant":
        return True  # codegen/wgmma.py starts such an accumulator in registers of its own
    return [op for op in func.walk() if acc in op.operands] == [dot]


def _defer_in(func: Operation, block: Block) -> None:
    pending: list[Operation] = []
    for op in list(block.ops):
        can_defer = op.name == "mt.dot" and deferrable(func, op)
        if pending:
            needed = _needed(op, pending, can_defer)
            if needed is not None:
                _wait_before(block, op, pending, needed)
        if can_defer:
            _defer(op, pending)


def _defer(dot: Operation, pending: list[Operation]) -> None:
    dot.attrs["async_groups"] = 1
    dot.attrs["deferred_wait"] = True
    pending.append(dot)


def _needed(op: Operation, pending: list[Operation], can_defer: bool) -> int | None:
    """The index in `pending` of the last dot `op` must wait for (None: none); `can_defer`: op is a deferrable
    dot."""
    if op.regions or op.name in WAIT_FOR_ALL or op is op.parent.terminator \
            or (op.name == "mt.dot" and not can_defer):  # type: ignore[union-attr]
        return len(pending) - 1
    last = None
    for i, dot in enumerate(pending):
        chained = op.name == "mt.dot" and op.operands[2] is dot.result and dot.result not in op.operands[:2]
        if dot.result in op.operands and not chained:
            last = i
    return last


def _wait_before(block: Block, op: Operation, pending: list[Operation], last: int) -> None:
    """`mt.dot_wait` before `op` retiring pending[0 .. last] (groups retire in order)."""
    wait = Operation("mt.dot_wait", [], [], attrs={"pending": len(pending) - last - 1}, loc=op.loc)
    block.insert(block.ops.index(op), wait)
    del pending[:last + 1]
