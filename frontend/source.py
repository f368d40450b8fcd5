"""Kernel source: the parsed AST of a Python function with its true file positions, and the `@mt.func` wrapper.

Line numbers in the AST are shifted to the file's, and columns to the undedented source, so every IR location
and every CompilationError points at the real file:line:col.
"""
from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any, Callable

from minitriton.errors import CompilationError
from minitriton.ir import Location


@dataclass
class FunctionSource:
    fn: Callable[..., Any]
    file: str
    tree: ast.FunctionDef
    indent: int  # columns removed by dedent; added back to every col_offset

    def loc(self, node: ast.AST) -> Location:
        return Location(self.file, getattr(node, "lineno", self.tree.lineno),
                        getattr(node, "col_offset", 0) + self.indent)

    @property
    def globals(self) -> dict[str, Any]:
        return self.fn.__globals__  # type: ignore[attr-defined]

    @property
    def closure(self) -> dict[str, Any]:
        """Values the function closes over (for kernels defined inside other functions, e.g. in tests)."""
        code = self.fn.__code__  # type: ignore[attr-defined]
        cells = self.fn.__closure__ or ()  # type: ignore[attr-defined]
        out = {}
        for name, cell in zip(code.co_freevars, cells):
            try:
                out[name] = cell.cell_contents
            except ValueError:  # an empty cell: the name is not bound yet
                pass
        return out


@functools.lru_cache(maxsize=None)
def _parse(fn: Callable[..., Any]) -> FunctionSource:
    try:
        lines, first = inspect.getsourcelines(fn)
        file = inspect.getsourcefile(fn) or "<unknown>"
    except (OSError, TypeError) as e:
        raise CompilationError(f"cannot read the source of {getattr(fn, '__name__', fn)!r}: {e}") from None
    src = "".join(lines)
    dedented = textwrap.dedent(src)
    indent = len(lines[0]) - len(lines[0].lstrip())
    if dedented == src:
        indent = 0
    tree = ast.parse(dedented)
    ast.increment_lineno(tree, first - 1)
    fdef = tree.body[0]
    if not isinstance(fdef, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise CompilationError(f"{fn!r} is not a plain function definition", Location(file, first, 0))
    return FunctionSource(fn, file, fdef, indent)  # type: ignore[arg-type]


def function_source(fn: Callable[..., Any]) -> FunctionSource:
    return _parse(fn)


class InlineFunction:
    """A helper under `@mt.func`: callable from kernels, where its body is inlined at each call."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    @property
    def source(self) -> FunctionSource:
        return function_source(self.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"@mt.func {self.__name__} can only be called from kernel code")

    def __repr__(self) -> str:
        return f"<mt.func {self.__name__}>"


def func(fn: Callable[..., Any]) -> InlineFunction:
    """Decorator for helper functions called from kernels; their bodies are inlined at each call site."""
    return InlineFunction(fn)
