"""Check a module: every op is known and well-formed (ops.py), every use is dominated by its definition, and
every region has the right shape. Runs after each pass in tests and under MINITRITON_VERIFY=1."""
from __future__ import annotations

from .core import Block, Module, Operation
from .ops import OPS, VerifyError, fail


def verify(module: Module | Operation) -> None:
    """Raise VerifyError naming the first problem found."""
    root = module.op if isinstance(module, Module) else module
    _verify_op(root, visible=set())


def _verify_op(o: Operation, visible: set[int]) -> None:
    spec = OPS.get(o.name)
    if spec is None:
        fail(o, "unknown op")
    for v in o.operands:
        if id(v) not in visible:
            fail(o, f"operand {v!r} is not defined before this use")
    if spec.regions > 0 and len(o.regions) != spec.regions:  # type: ignore[union-attr]
        fail(o, f"expects {spec.regions} regions, got {len(o.regions)}")  # type: ignore[union-attr]
    if spec.regions < 0 and not o.regions:  # type: ignore[union-attr]
        fail(o, "expects at least one region")
    for region in o.regions:
        if len(region.blocks) != 1:
            fail(o, "each region must have exactly one block")
        _verify_block(region.block, set(visible))
    spec.check(o)  # type: ignore[union-attr]


def _verify_block(block: Block, visible: set[int]) -> None:
    visible.update(id(a) for a in block.args)
    for i, o in enumerate(block.ops):
        if o.parent is not block:
            fail(o, "op's parent link is broken")
        is_last = i == len(block.ops) - 1
        spec = OPS.get(o.name)
        if spec is not None and spec.terminator and not is_last:
            fail(o, "terminator in the middle of a block")
        _verify_op(o, visible)
        visible.update(id(r) for r in o.results)
    parent = block.parent_op
    if parent is not None and parent.name != "builtin.module":
        last = block.terminator
        if last is None or not OPS[last.name].terminator:
            raise VerifyError(f"'{parent.name}' at {parent.loc}: region does not end in a terminator")
