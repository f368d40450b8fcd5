"""cse: common subexpression elimination.

Rewrites every pure op (OpSpec.pure in ops.py, without regions) that repeats an earlier op with the same name,
operands, attributes and result types into that earlier op's results, and erases it. An op is "earlier" when it
dominates the repeat: it comes before it in the same block, or in a block enclosing the repeat's region (a value
defined outside scf.for / scf.if / scf.while is visible inside). Ops in sibling regions (then / else, or two
loops) are never merged, and an outer op is never replaced by an inner one. Loads, stores and atomics are not pure
and are never merged.
"""
from __future__ import annotations

from collections import ChainMap
from typing import Any, Hashable

from minitriton.ir import OPS, Block, Module, Operation, Value, function_body

from .registry import register_pass

OpKey = tuple[Hashable, ...]


def freeze_attr(v: Any) -> Hashable:
    """A hashable key equal only for attributes that print the same: 0.0 and -0.0, 1 and 1.0, 1 and True differ."""
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, int):
        return ("int", v)
    if isinstance(v, float):
        return ("float", v.hex())
    if isinstance(v, (list, tuple)):
        return ("list", tuple(freeze_attr(x) for x in v))
    return (type(v).__name__, v)  # str, types and layouts are immutable and compare by value


def op_key(op: Operation, operands: list[Value]) -> OpKey:
    attrs = tuple(sorted((k, freeze_attr(v)) for k, v in op.attrs.items()))
    return (op.name, tuple(operands), attrs, tuple(r.type for r in op.results))


def is_mergeable(op: Operation) -> bool:
    spec = OPS.get(op.name)
    return spec is not None and spec.pure and not op.regions and bool(op.results)


def _cse_block(block: Block, seen: ChainMap, mapping: dict[Value, Value]) -> bool:
    """Merge repeats in `block` and its nested regions; `seen` holds the ops visible here, by key."""
    changed = False
    for op in list(block.ops):
        operands = [mapping.get(v, v) for v in op.operands]  # a replacement is never replaced itself
        if is_mergeable(op):
            key = op_key(op, operands)
            earlier = seen.get(key)
            if earlier is not None:
                mapping.update(zip(op.results, earlier.results))
                op.erase()
                changed = True
                continue
            seen[key] = op
        for region in op.regions:
            for inner in region.blocks:
                changed |= _cse_block(inner, seen.new_child(), mapping)
    return changed


def eliminate_common_subexpressions(module: Module) -> bool:
    """CSE every kernel of `module` in place; True when anything changed."""
    changed = False
    for func in module.functions:
        mapping: dict[Value, Value] = {}
        changed |= _cse_block(function_body(func), ChainMap(), mapping)
        func.replace_uses(mapping)
    return changed


@register_pass("cse")
def cse(module: Module) -> Module:
    """Merge repeated pure ops into the dominating first occurrence (see the module doc)."""
    eliminate_common_subexpressions(module)
    return module
