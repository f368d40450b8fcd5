"""Explicit warp specialization in the frontend: `mt.ring` buffers and `with mt.warp_specialize():` blocks of
`with mt.partition(...):` blocks (minitriton/language.py says what a kernel author writes).

IR produced (the same ops passes/warp_specialize.py builds for `@mt.kernel(warp_specialize=True)`):

    ring = mt.ring(shape, dtype, S)   %r = mt.alloc_ring {stages = S, tma_barriers, explicit} : tensor<S x shape>
    fill index i                      slot = i % S, parity = (i / S) % 2 (a shift and a mask when S is a power of 2)
    ring.put(i, desc, [row, col])     mt.async_wait %r, slot, 1 - parity {empty}
                                      mt.async_copy %r, slot, %desc, row, col, true      (TMA)
    ring.put(i, tile)                 mt.async_wait %r, slot, 1 - parity {empty};  mt.ring_store %r, slot, tile
    ring.get(i)                       mt.async_wait %r, slot, parity;  mt.local_load %r, slot
    ring.release(i)                   mt.ring_release %r, slot, true
    with mt.warp_specialize():        mt.warp_specialize {warps = [...], registers = [...]} ({...}, {...})

Fill i of a slot is that slot's (i / S)-th, whose full barrier phase has parity (i / S) % 2; the producer's wait for
the slot to be empty waits for the release of fill i - S, the phase of the opposite parity (a fresh barrier counts
the phase before its first as complete, so the first S fills do not wait). The passes fill in what depends on the
whole kernel: the barriers' arrival counts, where the rings live in shared memory, the rings' layouts (wgmma
operands read in place), and which dots run asynchronously.

Rules checked here, each a CompilationError at the kernel line: the block sits at the kernel's top level (not in
runtime control flow), holds only partitions, and nothing follows it; rings are allocated before it; a tile
never crosses into a partition from outside; outside the partitions the kernel computes scalars only.
"""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any

from minitriton import language as mtl
from minitriton.errors import CompilationError
from minitriton.ir import Block, Region
from minitriton.ir.partitions import place
from minitriton.ir.types import ScalarType, TensorDescType, TensorType, i1, i32

from .semantic import Semantic, TileValue, describe

if TYPE_CHECKING:
    from .ast_to_ir import KernelCompiler


class RingValue:
    """A ring buffer in kernel code: its mt.alloc_ring value, slot shape, element type and stage count."""

    def __init__(self, handle: Any, shape: tuple[int, ...], dtype: ScalarType, stages: int):
        self.handle, self.shape, self.dtype, self.stages = handle, shape, dtype, stages

    def __repr__(self) -> str:
        return f"ring<{self.stages} x {list(self.shape)} x {self.dtype}>"


def make_ring(sem: Semantic, shape: Any, dtype: Any, stages: Any) -> RingValue:
    slot = sem.static_shape(shape)
    s = sem.check_dtype(dtype)
    n = sem.static_int(stages, "ring stages")
    if len(slot) != 2:
        raise CompilationError(f"a ring's slot is a 2-D tile, got shape {list(slot)}")
    if n < 2:
        raise CompilationError(f"a ring needs at least 2 stages, got {n}")
    t = TensorType((n,) + slot, s)
    handle = sem.b.create1("mt.alloc_ring", [], t, stages=n, tma_barriers=True, explicit=True)
    return RingValue(handle, slot, s, n)


def ring_attribute(sem: Semantic, ring: RingValue, name: str) -> Any:
    """`ring.put` / `get` / `release` (bound methods), `ring.shape` / `dtype` / `stages`."""
    from .ast_to_ir import BoundMethod

    if name in ("shape", "dtype", "stages"):
        return getattr(ring, name)
    methods = {"put": lambda i, *what: put(sem, ring, i, *what), "get": lambda i: get(sem, ring, i),
               "release": lambda i: release(sem, ring, i)}
    if name not in methods:
        raise CompilationError(f"a ring has no attribute '{name}' (it has put, get, release, shape, dtype, stages)")
    return BoundMethod(methods[name], name)


def fill_position(sem: Semantic, ring: RingValue, index: Any) -> tuple[TileValue, TileValue]:
    """(slot, phase parity) of fill `index` as i32 scalars."""
    if not (isinstance(index, int) or (isinstance(index, TileValue) and not index.is_tile
                                       and isinstance(index.dtype, ScalarType) and index.dtype.is_int
                                       and not index.dtype.is_bool)):
        raise CompilationError(f"a ring's fill index is an integer scalar (0, 1, 2, ...), got {describe(index)}")
    if isinstance(index, int) and index < 0:
        raise CompilationError(f"a ring's fill index counts fills from 0, got {index}")
    i = sem.cast(sem.to_value(index, like=i32), i32)
    n = ring.stages
    if n & (n - 1) == 0:
        slot = sem.binary("and", i, n - 1)
        parity = sem.binary("and", sem.binary("shr", i, n.bit_length() - 1), 1)
    else:
        slot = sem.binary("rem", i, n)
        parity = sem.binary("and", sem.binary("floordiv", i, n), 1)
    return slot, parity


def put(sem: Semantic, ring: RingValue, index: Any, *what: Any) -> None:
    slot, parity = fill_position(sem, ring, index)
    if len(what) == 2:
        desc, coords = what
        if not (isinstance(desc, TileValue) and isinstance(desc.type, TensorDescType)):
            raise CompilationError(f"ring.put(i, desc, [row, col]) takes a tensor descriptor, got {describe(desc)}")
        if desc.type.element != ring.dtype:
            raise CompilationError(f"a descriptor of {desc.type.element} cannot fill a ring of {ring.dtype}")
        if not isinstance(coords, (tuple, list)) or len(coords) != 2:
            raise CompilationError("ring.put(i, desc, [row, col]) takes the tile's first row and column, got "
                                   f"{describe(coords)}")
        row, col = (sem.cast(sem.to_value(c, like=i32), i32) for c in coords)
        for c, x in zip(coords, (row, col)):
            if x.is_tile or not x.dtype.is_int:  # type: ignore[union-attr]
                raise CompilationError(f"ring.put coordinates must be integer scalars, got {describe(c)}")
        _wait_empty(sem, ring, slot, parity)
        valid = sem.constant(True, i1)
        sem.b.create("mt.async_copy", [ring.handle, slot.handle, desc.handle, row.handle, col.handle, valid.handle])
        return
    if len(what) == 1:
        tile = sem.broadcast_to(sem.cast(what[0], ring.dtype), ring.shape)
        _wait_empty(sem, ring, slot, parity)
        sem.b.create("mt.ring_store", [ring.handle, slot.handle, tile.handle])
        return
    raise CompilationError("ring.put takes (i, desc, [row, col]) for a TMA fill or (i, tile) for a tile of "
                           "registers")


def _wait_empty(sem: Semantic, ring: RingValue, slot: TileValue, parity: TileValue) -> None:
    other = sem.binary("xor", parity, 1)
    sem.b.create("mt.async_wait", [ring.handle, slot.handle, other.handle], attrs={"empty": True})


def get(sem: Semantic, ring: RingValue, index: Any) -> TileValue:
    slot, parity = fill_position(sem, ring, index)
    sem.b.create("mt.async_wait", [ring.handle, slot.handle, parity.handle])
    return TileValue(sem.b.create1("mt.local_load", [ring.handle, slot.handle], TensorType(ring.shape, ring.dtype)))


def release(sem: Semantic, ring: RingValue, index: Any) -> None:
    slot, _ = fill_position(sem, ring, index)
    valid = sem.constant(True, i1)
    sem.b.create("mt.ring_release", [ring.handle, slot.handle, valid.handle])


# ------------------------------------------------------------------------------------------- the block


def is_ring(v: Any) -> bool:
    op = getattr(v, "defining_op", None)
    return op is not None and op.name == "mt.alloc_ring"


def compile_warp_specialize(kc: "KernelCompiler", node: ast.With) -> None:
    """`with mt.warp_specialize():` -> one mt.warp_specialize op, a region per `with mt.partition(...)` inside."""
    if kc.region_depth:
        raise CompilationError("mt.warp_specialize must be at the kernel's top level, not inside a runtime loop "
                               "or if")
    parts: list[tuple[ast.With, mtl.partition]] = []
    for stmt in node.body:
        if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            continue
        spec = _partition_of(kc, stmt)
        if spec is None:
            raise kc.located(CompilationError("a `with mt.warp_specialize():` block holds only `with "
                                              "mt.partition(...):` blocks"), stmt)
        parts.append((stmt, spec))  # type: ignore[arg-type]
    if len(parts) < 2:
        raise CompilationError(f"mt.warp_specialize needs at least two partitions, got {len(parts)}")
    warps, registers = [], []
    for j, (stmt, spec) in enumerate(parts):
        w = kc.num_warps if spec.warps is None else spec.warps
        if j == 0 and w != kc.num_warps:
            raise kc.located(CompilationError(
                f"the first partition is the default partition: it runs on the kernel's num_warps ({kc.num_warps}) "
                f"warps, got warps={w}; launch with num_warps={w} instead"), stmt)
        if not isinstance(w, int) or not isinstance(spec.registers, int) or isinstance(w, bool):
            raise kc.located(CompilationError("mt.partition takes compile-time ints: warps=..., registers=..."),
                             stmt)
        warps.append(w)
        registers.append(spec.registers)
    try:
        place(warps, registers)
    except ValueError as e:
        raise CompilationError(str(e)) from None
    regions = []
    for stmt, _ in parts:
        with kc.at(stmt):
            block, _scope = kc.run_region(stmt.body, dict(kc.scope), [])
            kc.yield_into(block, [])
        _check_no_tile_enters(block)
        regions.append(Region([block]))
    kc.builder.create("mt.warp_specialize", attrs={"warps": warps, "registers": registers}, regions=regions)


def _partition_of(kc: "KernelCompiler", stmt: ast.stmt) -> mtl.partition | None:
    if not isinstance(stmt, ast.With) or len(stmt.items) != 1 or stmt.items[0].optional_vars is not None:
        return None
    value = kc.expr(stmt.items[0].context_expr)
    return value if isinstance(value, mtl.partition) else None


def _check_no_tile_enters(block: Block) -> None:
    """A tile used in the partition must be computed in it (the partitions lay out tiles for their own warps)."""
    inside: set[int] = set()

    def visit(b: Block) -> None:
        inside.update(id(a) for a in b.args)
        for op in b.ops:
            for v in op.operands:
                if isinstance(v.type, TensorType) and id(v) not in inside and not is_ring(v):
                    raise CompilationError(f"the tile {v.type} used here was computed outside the partition; "
                                           "compute tiles inside the partition that uses them (partitions share "
                                           "scalars, pointers, descriptors and mt.ring buffers)", op.loc)
            for r in op.regions:
                visit(r.block)
            inside.update(id(r) for r in op.results)

    visit(block)


def check_specialized_kernel(entry: Block) -> None:
    """Whole-kernel rules once the body is compiled: rings and mt.warp_specialize go together, nothing follows the
    block, and outside the partitions only scalars are computed."""
    ws = [op for op in entry.ops if op.name == "mt.warp_specialize"]
    rings = [op for op in _walk(entry) if op.name == "mt.alloc_ring" and op.attrs.get("explicit")]
    if not ws:
        if rings:
            raise CompilationError("mt.ring buffers connect the partitions of an mt.warp_specialize block; this "
                                   "kernel has none", rings[0].loc)
        return
    if len(ws) > 1:
        raise CompilationError("a kernel has at most one mt.warp_specialize block", ws[1].loc)
    after = entry.ops[entry.ops.index(ws[0]) + 1:]
    for op in after:
        if op.name != "mt.return":
            raise CompilationError("nothing may follow the mt.warp_specialize block (its partitions end the "
                                   "kernel)", op.loc)
    for op in entry.ops[:entry.ops.index(ws[0])]:
        if any(isinstance(r.type, TensorType) for r in op.results) and op.name != "mt.alloc_ring":
            raise CompilationError("outside its partitions a warp-specialized kernel computes scalars only; move "
                                   "this tile into the partition that uses it", op.loc)
    for ring in rings:
        if ring.parent is not entry:
            raise CompilationError("allocate mt.ring buffers before the mt.warp_specialize block (at the kernel's "
                                   "top level), so every partition sees them", ring.loc)


def _walk(block: Block):  # type: ignore[no-untyped-def]
    for op in block.ops:
        yield op
        for r in op.regions:
            yield from _walk(r.block)
