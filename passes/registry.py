"""The pass registry: every pass is a function Module -> Module registered under a name.

    @register_pass("cse")
    def cse(module: Module) -> Module:
        '''Merges pure ops with equal names, operands and attributes into the first one.'''

`minitriton opt FILE.mtir --pass cse,dce` and the compiler's pipeline look passes up here by name.
"""
from __future__ import annotations

from typing import Callable, Iterable

from minitriton.ir import Module, verify

PassFn = Callable[[Module], Module]
PASSES: dict[str, PassFn] = {}


def register_pass(name: str) -> Callable[[PassFn], PassFn]:
    def register(fn: PassFn) -> PassFn:
        if name in PASSES:
            raise ValueError(f"pass {name!r} registered twice")
        PASSES[name] = fn
        return fn

    return register


def get_pass(name: str) -> PassFn:
    try:
        return PASSES[name]
    except KeyError:
        known = ", ".join(sorted(PASSES))
        raise KeyError(f"unknown pass {name!r}; known passes: {known}") from None


def run_passes(module: Module, names: Iterable[str], verify_each: bool = True) -> Module:
    """Run the named passes in order, verifying the IR after each one (a broken pass is caught where it broke)."""
    for name in names:
        module = get_pass(name)(module)
        if verify_each:
            verify(module)
    return module
