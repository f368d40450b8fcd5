"""The source fingerprint of a kernel: what, besides the specialization, decides the code it compiles to.

It hashes the kernel's source, and transitively the helper functions (`@mt.func` helpers, other kernels, plain
functions) and the simple constants (ints, floats, bools, strings, dtypes) that its code reads from its globals and
closure. The on-disk cache key includes it, so editing a helper or a module-level BLOCK constant recompiles.
"""
from __future__ import annotations

import hashlib
import types
from typing import Any, Callable


def source_fingerprint(fn: Callable) -> str:
    """Hash of fn's source plus, transitively, the helper functions and constants it names.

    Helpers and constants are found through the function's globals and closure: every name its code reads that is
    bound to a Python function (or to an object wrapping one in `.fn`, like a Kernel or an @mt.func helper).
    minitriton's own functions are covered by the compiler version and skipped.
    """
    hasher = hashlib.sha256()
    seen: set[int] = set()
    pending = [fn]
    while pending:
        f = pending.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        hasher.update(f"{f.__qualname__}\n".encode())  # not the module: a script and its import share entries
        hasher.update(_function_source(f).encode())
        for name, value in _referenced_values(f):
            helper = _as_function(value)
            if helper is not None:
                if not (helper.__module__ or "").startswith("minitriton"):
                    pending.append(helper)
            elif isinstance(value, (int, float, bool, str, type(None))) or _is_dtype(value):
                hasher.update(f"{name}={value!r}\n".encode())
    return hasher.hexdigest()


def _referenced_values(f: types.FunctionType) -> list[tuple[str, Any]]:
    """(name, value) of every global the code reads and every variable it closes over, sorted by name."""
    found = {n: f.__globals__[n] for n in _global_names(f.__code__) if n in f.__globals__}
    for name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
        try:
            found[name] = cell.cell_contents
        except ValueError:  # an empty cell: not bound yet
            pass
    return sorted(found.items(), key=lambda item: item[0])


def _function_source(f: types.FunctionType) -> str:
    """What decides the IR compiled from f, read from its code object (microseconds, unlike inspect.getsource,
    which re-tokenizes the file and would dominate a cached first launch): bytecode, constants, names, positions
    (line and column table: the IR's locations come from them), the file, and the annotations and defaults
    (`BLOCK: mt.constexpr = 128`). Comment-only edits do not change it, and do not change the IR either."""
    extras = f"{f.__code__.co_filename}\n{f.__annotations__!r}\n{f.__defaults__!r}\n{f.__kwdefaults__!r}\n"
    return extras + _code_text(f.__code__)


def _code_text(code: types.CodeType) -> str:
    """Bytecode, constants, names and positions, nested code objects included (their repr holds an address)."""
    consts = [_code_text(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts]
    parts = [code.co_code.hex(), ",".join(code.co_names), ",".join(code.co_varnames), str(code.co_firstlineno),
             code.co_linetable.hex()]
    return "|".join(parts + consts)


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _as_function(value: Any) -> types.FunctionType | None:
    if isinstance(value, types.FunctionType):
        return value
    inner = getattr(value, "fn", None) if not isinstance(value, types.ModuleType) else None
    return inner if isinstance(inner, types.FunctionType) else None


def _is_dtype(value: Any) -> bool:
    from minitriton.ir.types import ScalarType

    return isinstance(value, ScalarType)
