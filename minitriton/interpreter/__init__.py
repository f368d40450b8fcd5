"""The CPU interpreter for the tile IR (numpy): the project's correctness oracle, used under MINITRITON_INTERPRET=1.

    interpret(func, grid, args)              run an mt.func over a grid on CPU torch tensors / Python numbers
    compile_function(func)(grid, args)       the same, compiling once for repeated runs

Modules: values.py (number representation, rounding, casts), memory.py (virtual address space, checked access),
elementwise.py / tiles.py / memops.py / tma_ops.py /
async_ops.py (what each op does), program.py (compilation into closures, control flow,
the run loop). Semantics that ops.py leaves open are documented in those modules' docstrings.
"""
from .program import CompiledFunction, compile_function, interpret

__all__ = ["CompiledFunction", "compile_function", "interpret"]
