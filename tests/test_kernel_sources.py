"""The kernel sources (kernels_src/*.py): no module defines a top-level name twice. A second `def` of the same name
silently replaces the first for every kernel that calls it (an @mt.func is looked up by name when a kernel is
compiled): on 2026-12-02 a new helper `_new_token` in kda_decode.py replaced the loop kernel's own."""
from __future__ import annotations

import ast
import collections
from pathlib import Path

import pytest

SOURCES = sorted((Path(__file__).resolve().parents[1] / "kernels_src").rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_top_level_name_is_defined_twice(path: Path) -> None:
    tree = ast.parse(path.read_text())
    names = collections.Counter(node.name for node in tree.body
                                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
    assert not [n for n, c in names.items() if c > 1], f"defined more than once in {path.name}"
