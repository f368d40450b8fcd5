"""User-facing errors. A CompilationError always names the kernel's file, line and column and shows the line."""
from __future__ import annotations

import linecache

from .ir.core import Location


class CompilationError(Exception):
    """A mistake in kernel code: unsupported construct, type or shape mismatch, missing constexpr, ..."""

    def __init__(self, message: str, loc: Location | None = None):
        self.message = message
        self.loc = loc
        super().__init__(self.render())

    def render(self) -> str:
        if self.loc is None:
            return self.message
        text = f"{self.loc.file}:{self.loc.line}:{self.loc.col}: error: {self.message}"
        src = linecache.getline(self.loc.file, self.loc.line).rstrip("\n")
        if src:
            text += f"\n    {src}\n    {' ' * self.loc.col}^"
        return text


class InterpreterError(RuntimeError):
    """A kernel did something illegal while interpreted (e.g. an unmasked out-of-bounds access)."""

    def __init__(self, message: str, loc: Location | None = None):
        self.loc = loc
        where = f"{loc.file}:{loc.line}:{loc.col}: " if loc else ""
        src = linecache.getline(loc.file, loc.line).strip() if loc else ""
        super().__init__(f"{where}{message}" + (f"\n    {src}" if src else ""))
