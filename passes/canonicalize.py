"""canonicalize: constant-fold, cse and dce, repeated until none of them changes the IR.

Each pass can expose work for the others (a fold makes two ops identical for CSE, CSE leaves an op unused for
DCE, DCE removes a use that blocked nothing yet), so one round is not enough; every change removes an op or
turns one into a constant, so the rounds end.
"""
from __future__ import annotations

from minitriton.ir import Module

from .constant_fold import fold_module
from .cse import eliminate_common_subexpressions
from .dce import eliminate_dead_code
from .registry import register_pass

MAX_ROUNDS = 100  # far more than any kernel needs; hitting it means two rewrites undo each other (a bug)


def canonicalize_module(module: Module) -> int:
    """Run the three passes to a fixed point in place; returns the number of rounds that changed something."""
    for rounds in range(MAX_ROUNDS):
        changed = fold_module(module)
        changed |= eliminate_common_subexpressions(module)
        changed |= eliminate_dead_code(module)
        if not changed:
            return rounds
    raise RuntimeError(f"canonicalize did not reach a fixed point in {MAX_ROUNDS} rounds")


@register_pass("canonicalize")
def canonicalize(module: Module) -> Module:
    """Fold, CSE and DCE until the IR stops changing."""
    canonicalize_module(module)
    return module
