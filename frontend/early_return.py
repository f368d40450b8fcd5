"""Early `return` inside a runtime `if`, rewritten away on the syntax tree before the body is compiled.

The IR's `scf.if` has no way out of the function, so

    if slot < 0:                      if slot < 0:
        return              ->            pass
    rest                              else:
                                          rest

The statements after an `if` that may return (a bare `return` in it, in nested ifs too) move into each of its
branches that does not end in a return, recursively (so `if ... elif ...` chains and nested ifs work; the moved
statements may be duplicated, once per such branch). Only bare `return` (no value) and only in the function's own
statement list or its ifs: a return inside a loop body would need `break`, so it stays an error (stmt_Return), and a
value-returning early return in an @mt.func stays an error too.
"""
from __future__ import annotations

import ast
from typing import Sequence


def fold_early_returns(stmts: Sequence[ast.stmt]) -> list[ast.stmt]:
    """`stmts` with the statements after each `if` that may return moved into its branches that do not return."""
    out: list[ast.stmt] = []
    for i, s in enumerate(stmts):
        if isinstance(s, ast.If) and (_may_return(s.body) or _may_return(s.orelse)):
            rest = list(stmts[i + 1:])
            out.append(ast.copy_location(ast.If(test=s.test, body=_branch(s.body, rest),
                                                orelse=_branch(s.orelse, rest)), s))
            return out
        out.append(s)
    return out


def _may_return(stmts: Sequence[ast.stmt]) -> bool:
    return any((isinstance(s, ast.Return) and s.value is None) or
               (isinstance(s, ast.If) and (_may_return(s.body) or _may_return(s.orelse))) for s in stmts)


def _ends_in_return(stmts: Sequence[ast.stmt]) -> bool:
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, ast.Return):
        return last.value is None
    return isinstance(last, ast.If) and _ends_in_return(last.body) and _ends_in_return(last.orelse)


def _branch(stmts: Sequence[ast.stmt], rest: list[ast.stmt]) -> list[ast.stmt]:
    """The branch's statements, then `rest` unless the branch returns; with its trailing bare return dropped."""
    if _ends_in_return(stmts):
        body = list(stmts[:-1]) if isinstance(stmts[-1], ast.Return) else list(stmts)
    else:
        body = list(stmts) + rest
    folded = fold_early_returns(body)
    return folded or [ast.Pass()]
