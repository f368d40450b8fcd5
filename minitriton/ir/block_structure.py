"""Block structure of a dot's operands: which square blocks of a and b may be nonzero.

`mt.dot(a, b, acc, block_structure=(S, a_kind, b_kind))` says: split a [M, K] and b [K, N] into S x S blocks;
block (i, j) of an operand (block row i, block column j) is allowed by its kind:

    "full"          every block
    "diag"          j == i          (block-diagonal: the per-16-row inverses of a chunked solve)
    "lower"         j <= i          (block-lower-triangular, diagonal blocks included)
    "strict_lower"  j <  i

The frontend zeroes each operand outside its allowed blocks (explicit `mt.where` masks in the IR), so the dot's
value is exactly acc + mask(a) @ mask(b) whatever the inputs hold: the interpreter needs nothing else, and a
kernel that breaks its promise gets the masked product, never garbage. The dot keeps the structure as attrs
`block`, `a_blocks`, `b_blocks`; the mma.sync codegen (codegen/mma.py) uses them to skip, per warp, the
tensor-core instructions and operand-fragment loads whose every product meets a zero block (`active`).
"""
from __future__ import annotations

from typing import Iterable

KINDS = ("full", "diag", "lower", "strict_lower")

Structure = tuple[int, str, str]  # (block size, a's kind, b's kind)


def allowed(kind: str, i: int, j: int) -> bool:
    """Whether block (i, j) of an operand of `kind` may be nonzero."""
    if kind == "full":
        return True
    if kind == "diag":
        return i == j
    if kind == "lower":
        return j <= i
    if kind == "strict_lower":
        return j < i
    raise ValueError(f"unknown block kind {kind!r}; expected one of {KINDS}")


def active(structure: Structure, rows: Iterable[int], ks: Iterable[int], cols: Iterable[int]) -> bool:
    """Whether some product a[r, k] * b[k, c] (r in rows, k in ks, c in cols; tile indices) can be nonzero."""
    size, a_kind, b_kind = structure
    row_blocks = {r // size for r in rows}
    k_blocks = {k // size for k in ks}
    col_blocks = {c // size for c in cols}
    return any(allowed(a_kind, i, kb) and allowed(b_kind, kb, j)
               for i in row_blocks for kb in k_blocks for j in col_blocks)


def structure_of(attrs: dict) -> Structure | None:
    """The (block, a_blocks, b_blocks) attrs of an mt.dot, or None for a dense dot."""
    if "block" not in attrs:
        return None
    return int(attrs["block"]), str(attrs.get("a_blocks", "full")), str(attrs.get("b_blocks", "full"))
