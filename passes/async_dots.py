"""Pass "async-dots": in the partitions of an explicit `mt.warp_specialize` block, a loop's wgmma dot that reads
ring slots in place becomes asynchronous: one dot stays in flight while the next waits for its slots, and each
slot is released one iteration later, once the dot that read it retired (what passes/warp_specialize.py builds
for the automatic form, found here in code the kernel author wrote with ring.get / ring.release).

  scf.for ... (%acc) {                          scf.for ... (%acc, %prev = 0, %started = false) {
    mt.async_wait %ra, %s, %ph                    mt.async_wait %ra, %s, %ph            (and %rb alike)
    %a = mt.ring_slot %ra, %s                     %a = mt.ring_slot %ra, %s
    %d = mt.dot %a, %b, %acc                      %d = mt.dot %a, %b, %acc {async_groups = 1, deferred_wait}
    mt.ring_release %ra, %s, true                 mt.dot_wait {pending = 1}                 dot i - 1 retired
    scf.yield %d                                  mt.ring_release %ra, %prev, %started      fill i - 1's slot
  }                                               scf.yield %d, %s, true
                                                }
                                                mt.dot_wait {pending = 0}
                                                mt.ring_release %ra, %prev_last, %started_last

It acts on an scf.for inside a partition whose body holds exactly one mt.dot, both of whose operands are
mt.ring_slot views of rings, whose accumulator is only carried (body argument -> dot -> yield, at one position),
and which releases exactly those slots (the same ring and slot values, `valid` true) after the dot, with nothing
between the dot and the releases reading the slots. Other loops stay as they are: their dots wait for themselves
(wgmma.wait_group 0), which is correct, only slower.
"""
from __future__ import annotations

from minitriton.ir import Module, Operation, Value
from minitriton.ir.partitions import enclosing_partition
from minitriton.ir.types import i1, i32

from .dce import eliminate_dead_code
from .pipeline import _carry, _Inserter
from .registry import register_pass


@register_pass("async-dots")
def async_dots(module: Module) -> Module:
    changed = False
    for func in module.functions:
        for loop in [op for op in func.walk() if op.name == "scf.for"]:
            if enclosing_partition(loop) is not None:
                match = _match(loop)
                if match is not None:
                    _make_async(loop, *match)
                    changed = True
    if changed:
        eliminate_dead_code(module)  # the moved releases' `true` constants
    return module


def _match(loop: Operation) -> tuple[Operation, list[Operation]] | None:
    """(the dot, its slots' releases) when the loop has the form of the module docstring."""
    body = loop.regions[0].block
    dots = [op for op in loop.walk() if op.name == "mt.dot"]
    if len(dots) != 1 or dots[0].parent is not body or "async_groups" in dots[0].attrs:
        return None
    dot = dots[0]
    views = [v.defining_op for v in dot.operands[:2]]
    if any(v is None or v.name != "mt.ring_slot" for v in views):
        return None
    acc = dot.operands[2]
    if acc not in body.args[1:]:
        return None
    position = body.args.index(acc) - 1
    uses_of = lambda v: [op for op in loop.walk() if v in op.operands]  # noqa: E731
    if uses_of(acc) != [dot] or uses_of(dot.result) != [body.terminator] \
            or body.terminator.operands.index(dot.result) != position:  # type: ignore[union-attr]
        return None
    after = body.ops[body.ops.index(dot) + 1:]
    releases = []
    for view in views:
        ring, slot = view.operands  # type: ignore[union-attr]
        found = [op for op in after if op.name == "mt.ring_release" and op.operands[0] is ring
                 and op.operands[1] is slot and _is_true(op.operands[2])]
        if len(found) != 1:
            return None
        releases.append(found[0])
    last = max(body.ops.index(r) for r in releases)
    between = body.ops[body.ops.index(dot) + 1:last]
    if any(v.result in op.operands for op in between for v in views):  # type: ignore[union-attr]
        return None
    return dot, releases


def _is_true(v: Value) -> bool:
    op = v.defining_op
    return op is not None and op.name == "mt.constant" and op.attrs.get("value") is True


def _make_async(loop: Operation, dot: Operation, releases: list[Operation]) -> None:
    body = loop.regions[0].block
    outside = _Inserter(loop.parent, loop, loop.loc)  # type: ignore[arg-type]
    slots: list[Value] = []
    for r in releases:
        if r.operands[1] not in slots:
            slots.append(r.operands[1])
    zero, false = outside.const(0, i32), outside.value("mt.constant", [], i1, value=False)
    carried = _carry(loop, [zero] * len(slots) + [false])
    prev, started = carried[:-1], carried[-1]
    dot.attrs["async_groups"] = 1
    dot.attrs["deferred_wait"] = True
    inside = _Inserter(body, body.ops[body.ops.index(dot) + 1], loop.loc)
    inside.add("mt.dot_wait", [], [], pending=1)
    for r in releases:
        r.erase()
        inside.add("mt.ring_release", [r.operands[0], prev[slots.index(r.operands[1])], started], [], **r.attrs)
    true = _Inserter(body, body.terminator, loop.loc).value("mt.constant", [], i1, value=True)
    body.terminator.operands.extend(slots + [true])  # type: ignore[union-attr]
    final_prev, final_started = loop.results[-len(carried):-1], loop.results[-1]
    after = loop.parent.ops[loop.parent.ops.index(loop) + 1]  # type: ignore[union-attr]
    drain = _Inserter(loop.parent, after, loop.loc)  # type: ignore[arg-type]
    drain.add("mt.dot_wait", [], [], pending=0)
    for r in releases:
        drain.add("mt.ring_release", [r.operands[0], final_prev[slots.index(r.operands[1])], final_started], [],
                  **r.attrs)
