"""dce: dead code elimination.

Rewrites, repeatedly until nothing changes, in every block (nested regions included):
- a pure op (OpSpec.pure in ops.py) or an mt.load whose results are all unused into nothing (a load only reads);
- an scf.for / scf.if / scf.while whose results are all unused and whose regions hold no side-effecting op (store,
  atomic, or any other impure op that is not a load or scf control flow) into nothing;
- an scf.for carried value whose result is unused and whose block argument only feeds its own yield slot, through
  pure ops that nothing else uses, into a loop without that value: the init operand, block argument, yield operand,
  result and those pure ops are removed. (Chains through nested regions are kept, to stay simple.)
"""
from __future__ import annotations

from collections import Counter

from minitriton.ir import OPS, Block, Module, Operation, Value, function_body

from .registry import register_pass

CONTROL_FLOW = ("scf.for", "scf.if", "scf.while")
# Impure ops that still have no effect besides their results (a load reads; region terminators only pass values).
NO_SIDE_EFFECTS = ("mt.load", "scf.yield", "scf.condition") + CONTROL_FLOW


def has_side_effects(op: Operation) -> bool:
    """Whether `op` or an op nested in it writes memory or does anything else besides computing its results."""
    for inner in op.walk():
        spec = OPS.get(inner.name)
        if inner.name not in NO_SIDE_EFFECTS and (spec is None or not spec.pure):
            return True
    return False


def is_removable_when_unused(op: Operation) -> bool:
    spec = OPS.get(op.name)
    if spec is None or spec.terminator:
        return False
    if op.regions:
        return op.name in CONTROL_FLOW and not has_side_effects(op)
    return not has_side_effects(op)


def count_uses(root: Operation) -> Counter[Value]:
    return Counter(v for op in root.walk() for v in op.operands)


# ---------------------------------------------------------------------------------------------- dead ops


def _erase_dead_ops(block: Block, uses: Counter[Value]) -> bool:
    """Erase dead ops bottom-up, so a chain of dead ops goes in one sweep; `uses` is kept up to date."""
    changed = False
    for op in reversed(list(block.ops)):
        for region in op.regions:
            for inner in region.blocks:
                changed |= _erase_dead_ops(inner, uses)
        if all(uses[r] == 0 for r in op.results) and is_removable_when_unused(op):
            for erased in op.walk():
                uses.subtract(erased.operands)
            op.erase()
            changed = True
    return changed


# ------------------------------------------------------------------------------- dead carried values


def _users(root: Operation) -> dict[Value, list[Operation]]:
    users: dict[Value, list[Operation]] = {}
    for op in root.walk():
        for v in op.operands:
            users.setdefault(v, []).append(op)
    return users


def _is_pure_leaf(op: Operation) -> bool:
    spec = OPS.get(op.name)
    return spec is not None and spec.pure and not op.regions


def _dead_chain(loop: Operation, slot: int, users: dict[Value, list[Operation]]) -> list[Operation] | None:
    """The pure ops fed by carried value `slot` of scf.for `loop` if they, and the block argument, feed nothing
    but that value's own yield operand; None when the value is needed."""
    body = loop.regions[0].block
    terminator = body.terminator
    chain: dict[Operation, None] = {}  # an ordered set
    pending = [body.args[1 + slot]]
    while pending:
        value = pending.pop()
        for user in users.get(value, []):
            if user is terminator:
                if any(v is value and i != slot for i, v in enumerate(user.operands)):
                    return None  # feeds another carried value
            elif _is_pure_leaf(user):
                if user not in chain:
                    chain[user] = None
                    pending.extend(user.results)
            else:
                return None  # used by control flow or an op with effects
    return list(chain)


def _drop_carried_values(loop: Operation, slots: list[int], chains: list[Operation]) -> Operation:
    """Rebuild scf.for `loop` without the carried values `slots`; returns the new loop, in the old one's place."""
    keep = [i for i in range(len(loop.results)) if i not in slots]
    body = loop.regions[0].block
    for op in chains:
        op.erase()
    terminator = body.terminator
    terminator.operands = [terminator.operands[i] for i in keep]  # type: ignore[union-attr]
    body.args = [body.args[0]] + [body.args[1 + i] for i in keep]
    for index, arg in enumerate(body.args):
        arg.index = index
    operands = loop.operands[:3] + [loop.operands[3 + i] for i in keep]
    region = loop.regions.pop()
    new_loop = Operation("scf.for", operands, [loop.results[i].type for i in keep], loop.attrs, [region], loop.loc)
    block = loop.parent
    block.insert(block.ops.index(loop), new_loop)  # type: ignore[union-attr]
    loop.erase()
    return new_loop


def _drop_dead_carried_values(func: Operation) -> bool:
    """Drop the dead carried values of the first scf.for that has some; True when one was rewritten."""
    uses = count_uses(func)
    for loop in [op for op in func.walk() if op.name == "scf.for"]:
        if all(uses[r] for r in loop.results):
            continue
        users = _users(loop)
        slots: list[int] = []
        chains: dict[Operation, None] = {}  # ordered set: chains of two dead values may share an op
        for slot, result in enumerate(loop.results):
            chain = _dead_chain(loop, slot, users) if uses[result] == 0 else None
            if chain is not None:
                slots.append(slot)
                chains.update(dict.fromkeys(chain))
        if slots:
            new_loop = _drop_carried_values(loop, slots, list(chains))
            kept = [r for i, r in enumerate(loop.results) if i not in slots]
            func.replace_uses(dict(zip(kept, new_loop.results)))
            return True  # the use counts are stale now: the caller runs another round
    return False


def eliminate_dead_code(module: Module) -> bool:
    """DCE every kernel of `module` in place, to a fixed point; True when anything changed."""
    changed = False
    for func in module.functions:
        while True:
            round_changed = _erase_dead_ops(function_body(func), count_uses(func))
            round_changed |= _drop_dead_carried_values(func)
            if not round_changed:
                break
            changed = True
    return changed


@register_pass("dce")
def dce(module: Module) -> Module:
    """Remove unused side-effect-free ops, loops and ifs, and unused carried loop values (see the module doc)."""
    eliminate_dead_code(module)
    return module
