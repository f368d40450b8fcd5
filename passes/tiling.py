"""Pass "tiling": layout assignment. Rewrites tile IR without encodings into IR where every tensor type carries a
distributed layout (`#mt.blocked` / `#mt.slice`, meaning in minitriton/ir/layouts.py), inserting
`mt.convert_layout` (or recomputing cheap index math) where a consumer needs another layout than its producer's.

How layouts are chosen (Triton's convert_to_ttgpuir + coalesce + remove_layout_conversions, in one pass):

1. Anchors. Every load / store / atomic on a tile of pointers gets a coalesced layout from the axis analysis
   (passes/axis_info.py): dims ordered by the pointer's contiguity (most contiguous fastest), and a per-thread
   vector along the fastest dim of w = min(contiguity, alignment / element size, 16 bytes / element size,
   elements / threads, mask constancy) elements: 4 x f32 or 8 x bf16 for an aligned arange-based access, 1 when
   the alignment is unknown. Lanes are spread as Triton's BlockedEncodingAttr::get does. Warps are placed
   reduction-aware: `_reductions` follows the anchor's tile through elementwise ops, broadcasts, carried values
   and reduces to every reduction of it, and `reduction_aware` picks, among the placements that keep a subset of
   the reduced dims within warps (blocked_for_shape's keep_in_warp), the one that combines the fewest elements
   across warps (through shared memory); e.g. a [128, 128] state reduced over axis 1 on 8 warps gets
   warpsPerCTA = [8, 1] instead of Triton's [2, 4]. Lanes, hence coalescing and vector width, are unchanged. The width is recorded on the op as `vector_width` for the codegen. A TMA descriptor load's result
   is an anchor too (`descriptor_layout`: 16-byte vectors along the innermost dim, which the 128B swizzle keeps
   contiguous in shared memory); a descriptor store takes its tile in whatever layout it has.
   *Small* accesses are not anchors up front (`_is_weak`: a load, or a store, of at most one 16-byte vector per
   thread whose tile is not, through elementwise ops, a loop-carried value): the first flood that reaches a small
   load through its consumers (not through its index math) decides it, in a blocked layout equivalent to the
   wanted one when there is one (so it keeps its vectors), e.g. an activation vector is read
   replicated by every warp from L1 in slice(0, weight layout) instead of being converted through shared memory
   each step (a replicated read costs at most as many instructions as the shared-memory loads of a conversion,
   and no barrier). Small stores, and small loads no flood reaches, are coalesced as above once the other anchors
   have flooded.
   Loop-carried tiles are excluded because copies of them would occupy registers for the whole loop.
2. Propagation. The rest of the kernel is a graph of *nodes*: an op (or one carried value of an scf.for / scf.if /
   scf.while) ties the layouts of its tensor operands and results: elementwise ops, broadcast, scan, loads,
   stores and carried values use one layout for all; reduce gives slice(axis, L) of its operand's L;
   expand_dims takes slice(axis, L) and gives L; trans permutes a blocked layout (free in registers); reshape
   and the a / b operands of dot are free (the codegen moves them through shared memory), except that a reshape
   which only splits or only merges dims takes, from its operand's side, the blocked layout keeping every element
   in its thread (`split_layout` / `merge_layout`: a register rename) when there is one. A static slice (extract_slice) takes its source's
   layout when that makes it a register selection (`subtile_layout`), else its consumers decide and the codegen
   moves the elements; a concat and its pieces share the result's layout when every piece is then a register
   selection of the result, else the pieces are free (docs/layouts.md). A width-changing bitcast
   (bitcast_split, [..., n] -> [..., n, 2]) gives its result the operand's layout plus a fastest in-thread dim of
   2 (`bitcast_split_layout`: a register rename), and takes from a result layout holding that dim in-thread its
   slice over it. From each anchor, in
   program order, layouts flood through the ties to every node not yet decided. A reduce reached from its result,
   or an expand_dims reached from its operand, with a layout that is not the matching slice stays undecided: the
   small side does not choose the layout of the big tile (the big tile's own flood decides it, and the conversion
   lands on the small side). Nodes no flood reaches get the default layout (one element per thread, last dim
   fastest; a reduce from its operand's side, an expand_dims from its result's). A scalar stays a scalar.
   A flood is refused where it would give a 2-D tile without a size-1 dim copies in several warps through an mma
   accumulator layout, or through that accumulator's blocked form ([1, 2] / [8, 4] / [W, 1],
   `is_accumulator_blocked`: the layout a state is loaded in to be an accumulator or an A operand without
   conversion; `_copies_in_warps`): a few token rows
   next to a [128, 128] state would otherwise be computed 8 times over; their own anchors decide them instead
   (docs/layouts.md, "Tensor-core neighbours"). Explicit `layout=` loads and stores keep their attr, so
   dot-lowering's second solve anchors them again.
3. Materialization. Where an operand's layout differs from what its consumer was decided with, the operand is
   used as is with a `mt.convert_layout` when the two layouts are equivalent (`layouts_equivalent`: every
   element in the same thread and register; the codegen lowers it to a register rename), else recomputed in the
   wanted layout when it is cheap index math (arange / splat / constant / broadcast / expand_dims / integer and
   pointer arithmetic, at most REMAT_LIMIT ops), else converted by one `mt.convert_layout` placed right after
   its definition (hoisted out of the loops that use it). Several slices of one tile that would each move
   elements into one layout in which all of them are register selections share one conversion of the tile
   instead, when their moves would store more than the tile (`_share_slice_conversions`).

Warp-specialized kernels (`mt.warp_specialize`): each partition's tiles are laid out for that partition's warps
(minitriton/ir/partitions.py; no tile crosses a partition boundary, the frontend checks). Rings (mt.alloc_ring
values) live in shared memory and get no distributed layout: a tile read from a slot (mt.local_load) takes the
layout its consumers want, and a tile written to one (mt.ring_store) keeps whatever layout it has.

Preconditions: a kernel straight from the frontend (no encodings yet); attr `num_warps` (default 4).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from minitriton.errors import CompilationError
from minitriton.ir import Block, Module, Operation, Value
from minitriton.ir.core import insert_after_definition
from minitriton.ir.layouts import (WARP_SIZE, blocked, blocked_equivalent, blocked_for_shape, default_layout, is_blocked,
                                   is_slice, layouts_equivalent, permute_layout, registers_in_box, slice_of,
                                   merge_layout, split_layout, subtile_layout, thread_map, vector_groups)
from minitriton.ir.mma_layouts import is_accumulator_blocked
from minitriton.ir.ops import CACHE_LINE_BYTES, OPS
from minitriton.ir.types import LayoutAttr, PointerType, TensorType, layout

from minitriton.ir.partitions import warps_of_ops

from .axis_info import AxisAnalysis, AxisInfo
from .registry import register_pass

REMAT_LIMIT = 16  # ops recomputed at most to avoid one layout conversion
MAX_VECTOR_BYTES = 16

Slot = tuple[Operation, int]  # (op, operand index): one use of a value

# Ops whose tensor operands and results all share one layout.
_SAME = {"mt.addptr", "mt.load", "mt.store", "mt.prefetch", "mt.atomic_add", "mt.broadcast", "mt.splat", "mt.arange",
         "mt.constant", "mt.scan"} | {name for name, spec in OPS.items() if "elementwise" in spec.traits}
_MEMORY = ("mt.load", "mt.store", "mt.prefetch", "mt.atomic_add")
_MASK_INDEX = {"mt.load": 1, "mt.store": 2, "mt.prefetch": 1, "mt.atomic_add": 2}
# Integer / pointer ops cheap enough to recompute in another layout instead of converting their result.
_CHEAP = {"mt.arange", "mt.constant", "mt.splat", "mt.broadcast", "mt.expand_dims", "mt.addptr", "mt.add", "mt.sub",
          "mt.mul", "mt.div", "mt.rem", "mt.and", "mt.or", "mt.xor", "mt.shl", "mt.shr", "mt.maximum",
          "mt.minimum", "mt.neg", "mt.not", "mt.cmp", "mt.select", "mt.cast"}


@register_pass("tiling")
def tiling(module: Module) -> Module:
    """Give every tensor of every kernel a layout encoding (see the module docstring)."""
    for func in module.functions:
        assign_layouts(func)
    return module


def assign_layouts(func: Operation, dot_layouts: dict[Operation, LayoutAttr] | None = None) -> None:
    """Solve and materialize the layouts of `func`. `dot_layouts` fixes the accumulator layout of some dots
    (passes/dot_lowering.py re-runs the solver with their #mt.mma layouts), and the result layout of reshapes that
    produce a dot operand (a blocked layout holding the operand's mma fragments: no shared-memory trip): those
    anchors flood first."""
    for op in func.walk():
        for v in op.results + [a for r in op.regions for b in r.blocks for a in b.args]:
            if isinstance(v.type, TensorType) and v.type.encoding is not None:
                raise ValueError(f"tiling: {func.attrs.get('sym_name')} already has layouts ({v.type})")
    solver = _Solver(func, dot_layouts or {})
    solver.solve()
    solver.materialize()
    verify_layouts(func)


# ------------------------------------------------------------------------------------------------ nodes


@dataclass(eq=False)
class _Node:
    """Ports tied by one rule: `defs` (tensor values it decides) and `uses` (operand slots it constrains)."""

    rule: str  # an op name, or "same" for a carried value of scf ops
    op: Operation
    defs: list[Value] = field(default_factory=list)
    uses: list[Slot] = field(default_factory=list)
    decided: bool = False


def _is_tensor(v: Value) -> bool:
    """A tile the solver lays out: a tensor in registers (not a shared-memory ring, whose layout dot-lowering or the
    codegen picks)."""
    return isinstance(v.type, TensorType) and not _is_ring(v)


def _is_ring(v: Value) -> bool:
    op = v.defining_op
    return op is not None and op.name == "mt.alloc_ring"


Config = tuple[dict[Value, LayoutAttr], dict[Slot, "LayoutAttr | None"]]


def _rule(node: _Node, hint_def: Value | None, hint_use: Slot | None, hint: LayoutAttr) -> Config | None:
    """The node's layouts given one port's layout, or None when that port does not determine them."""
    name = node.rule
    if name == "same" or name in _SAME:
        return {v: hint for v in node.defs}, {s: hint for s in node.uses}
    op = node.op
    if name == "mt.reduce":
        axis = op.attrs["axis"]
        if hint_use is not None:
            operand = hint
        elif is_slice(hint) and hint.get("dim") == axis:
            operand = hint.get("parent")
        else:
            return None  # many operand layouts reduce to this one or none does: the operand's side decides
        return {v: slice_of(axis, operand) for v in node.defs}, {s: operand for s in node.uses}
    if name == "mt.expand_dims":
        axis = op.attrs["axis"]
        if hint_def is not None:
            result = hint
        elif is_slice(hint) and hint.get("dim") == axis:
            result = hint.get("parent")
        else:
            return None  # the result's side decides (its layout is the one the big tile lives in)
        return {op.result: result}, {(op, 0): slice_of(axis, result)}
    if name == "mt.trans":
        perm = list(op.attrs["order"])
        inverse = [perm.index(d) for d in range(len(perm))]
        if hint_def is not None:
            return {op.result: hint}, {(op, 0): permute_layout(hint, inverse) if is_blocked(hint) else None}
        if is_blocked(hint):
            return {op.result: permute_layout(hint, perm)}, {(op, 0): hint}
        return None
    if name == "mt.reshape":
        if hint_def is None:  # from the operand: only a split or merge that keeps every element in its thread
            src, dst = op.operands[0].type.shape, op.result.type.shape
            renamed = split_layout(hint, src, dst) or merge_layout(hint, src, dst)
            return None if renamed is None else ({op.result: renamed}, {(op, 0): hint})
        return {op.result: hint}, {(op, 0): None}
    if name == "mt.extract_slice":
        if hint_def is not None:  # the small side does not choose the source's layout: any source will do
            return {op.result: hint}, {(op, 0): None}
        offsets, sizes = op.attrs["offsets"], op.attrs["sizes"]
        sub = subtile_layout(hint, op.operands[0].type.shape, offsets, sizes)
        return None if sub is None else ({op.result: sub}, {(op, 0): hint})
    if name == "mt.concat":
        return _concat_rule(op, hint_def is not None, hint)
    if name == "mt.bitcast_split":
        return _bitcast_split_rule(op, hint_def is not None, hint)
    if name in ("mt.descriptor_load", "mt.local_load"):
        return {op.result: hint}, {}
    if name == "mt.ring_store":
        return {}, {s: None for s in node.uses}  # the tile is written to shared memory from any layout
    if name == "mt.descriptor_store":
        return {}, {s: None for s in node.uses}  # the tile is written to shared memory from any layout
    if name == "mt.dot":
        if hint_use is not None and hint_use[1] != 2:
            return None  # a and b go through shared memory: their layouts say nothing about the result's
        return {op.result: hint}, {(op, 0): None, (op, 1): None, (op, 2): hint}
    raise ValueError(f"tiling: no layout rule for '{name}'")


def _concat_rule(op: Operation, from_result: bool, hint: LayoutAttr) -> Config | None:
    """Concat is a register assembly when every piece, in the result's layout, is a register selection of the
    result (subtile_layout): then the pieces and the result share that layout. Otherwise a layout given for the
    result leaves the pieces free (the codegen moves them through shared memory), and one given for a piece
    decides nothing."""
    axis, shape = op.attrs["axis"], op.result.type.shape
    piece = op.operands[0].type.shape
    offsets = [[i * piece[axis] if d == axis else 0 for d in range(len(shape))] for i in range(len(op.operands))]
    assembles = all(subtile_layout(hint, shape, off, piece) is not None for off in offsets)
    if assembles:
        return {op.result: hint}, {(op, i): hint for i in range(len(op.operands))}
    if from_result:
        return {op.result: hint}, {(op, i): None for i in range(len(op.operands))}
    return None


def _pair_in_thread(enc: LayoutAttr, dim: int) -> bool:
    """Both elements of the size-2 dim `dim` sit in one thread's registers (bitcast_split's halves)."""
    return (is_blocked(enc) and enc.get("sizePerThread")[dim] == 2 and enc.get("threadsPerWarp")[dim] == 1
            and enc.get("warpsPerCTA")[dim] == 1)


def bitcast_split_layout(enc: LayoutAttr, shape: Sequence[int]) -> LayoutAttr | None:
    """The result layout of bitcast_split of an operand [..., n] in layout `enc`: the operand's layout with a new
    fastest dim of 2 registers (each thread splits the elements it holds: a register rename). A slice over that
    last dim of such a layout (e.g. the pairs were made by an in-thread sum of [..., n, 2] values) gives back its
    parent. None when no blocked layout is equivalent to `enc`."""
    rank = len(shape)
    if is_slice(enc) and enc.get("dim") == rank and _pair_in_thread(enc.get("parent"), rank):
        return enc.get("parent")
    base = blocked_equivalent(enc, shape)
    if base is None:
        return None
    return blocked([*base.get("sizePerThread"), 2], [*base.get("threadsPerWarp"), 1],
                   [*base.get("warpsPerCTA"), 1], [rank, *base.get("order")])


def _bitcast_split_rule(op: Operation, from_result: bool, hint: LayoutAttr) -> Config | None:
    """bitcast_split is a register rename when each thread holds both halves of the elements it splits: from the
    operand's side the result takes `bitcast_split_layout`; from the result's side only a layout holding the pair
    dim in-thread decides (the operand is then its slice over that dim), any other leaves it to the operand."""
    rank = len(op.operands[0].type.shape)
    if from_result:
        if not _pair_in_thread(hint, rank):
            return None
        return {op.result: hint}, {(op, 0): slice_of(rank, hint)}
    pairs = bitcast_split_layout(hint, op.operands[0].type.shape)
    return None if pairs is None else ({op.result: pairs}, {(op, 0): hint})


# ----------------------------------------------------------------------------------------------- solver


class _Solver:
    def __init__(self, func: Operation, dot_layouts: dict[Operation, LayoutAttr] | None = None):
        self.func = func
        self.dot_layouts = dot_layouts or {}
        self.op_warps = warps_of_ops(func)  # the warps of each op's partition (minitriton/ir/partitions.py)
        self.nodes: list[_Node] = []
        self.def_node: dict[Value, _Node] = {}
        self.slot_node: dict[Slot, _Node] = {}
        self.users: dict[Value, list[Slot]] = {}
        self.layout: dict[Value, LayoutAttr] = {}
        self.required: dict[Slot, LayoutAttr | None] = {}
        self.vector_width: dict[Operation, int] = {}
        self.line_tail: dict[Operation, bool] = {}  # prefetches: whether each run's last element needs its own
        self.queue: deque[_Node] = deque()
        self._build(func.regions[0].block)

    # -- graph

    def _add(self, node: _Node) -> None:
        if not node.defs and not node.uses:
            return
        self.nodes.append(node)
        for v in node.defs:
            self.def_node[v] = node
        for s in node.uses:
            self.slot_node[s] = node
            self.users.setdefault(s[0].operands[s[1]], []).append(s)

    def _build(self, block: Block) -> None:
        for op in block.ops:
            for region in op.regions:
                self._build(region.block)
            if op.name in ("scf.yield", "scf.condition", "mt.return", "mt.func"):
                continue  # terminators' slots belong to their parent's carried-value nodes
            if op.name == "scf.for":
                body = op.regions[0].block
                for i, r in enumerate(op.results):
                    if _is_tensor(r):
                        self._add(_Node("same", op, [body.args[i + 1], r], [(op, 3 + i), (body.terminator, i)]))
            elif op.name == "scf.if":
                for i, r in enumerate(op.results):
                    if _is_tensor(r):
                        self._add(_Node("same", op, [r], [(reg.block.terminator, i) for reg in op.regions]))
            elif op.name == "scf.while":
                before, after = op.regions[0].block, op.regions[1].block
                for i, a in enumerate(before.args):
                    if _is_tensor(a):
                        self._add(_Node("same", op, [a], [(op, i), (after.terminator, i)]))
                for j, a in enumerate(after.args):
                    if _is_tensor(a):
                        self._add(_Node("same", op, [a, op.results[j]], [(before.terminator, j + 1)]))
            else:
                self._add(_Node(op.name, op, [r for r in op.results if _is_tensor(r)],
                                [(op, i) for i, v in enumerate(op.operands) if _is_tensor(v)]))

    # -- deciding

    def _decide(self, node: _Node, config: Config) -> None:
        defs, uses = config
        node.decided = True
        self.layout.update(defs)
        self.required.update(uses)
        self.queue.append(node)

    def _try(self, node: _Node, hint_def: Value | None, hint_use: Slot | None, hint: LayoutAttr) -> None:
        if node.decided:
            return
        if node in self.weak:
            # only a load's consumers decide it (not its index math)
            if hint_def is not None and not self._copies_in_warps(node, ({hint_def: hint}, {})):
                self._decide_weak(node, hint)
            return
        config = _rule(node, hint_def, hint_use, hint)
        if config is not None and not self._copies_in_warps(node, config):
            self._decide(node, config)

    def _copies_in_warps(self, node: _Node, config: Config) -> bool:
        """Whether `config` lays out a 2-D tile without a size-1 dim so that several warps hold copies of it: an
        mma layout over a tile it does not tile (8 token rows against an accumulator on 8 warps of 8 rows each),
        or the blocked layout of an mma accumulator (a state loaded in it, `is_accumulator_blocked`) over a tile
        large enough to give every thread its own elements. Such a flood is refused: the tile (a chunk's [8, 128]
        token rows next to a [128, 128] state) is laid out from its own anchors instead of every warp computing
        all of it in 8x the registers, and a conversion appears where it meets the other side. Other blocked
        layouts flood as before (a kernel may want a K vector copied into every warp: kda_decode's staged
        kernel); broadcast operands ([1, N]) and 1-D slices keep the flood's layout (their copies are the
        point)."""
        defs, uses = config
        values = [(v, enc) for v, enc in defs.items()] + [(s[0].operands[s[1]], enc) for s, enc in uses.items()]
        for v, enc in values:
            if enc is None or not isinstance(v.type, TensorType) or len(v.type.shape) != 2:
                continue
            rows, cols = v.type.shape
            if min(rows, cols) == 1:
                continue
            spread = rows * cols >= WARP_SIZE * self.op_warps[node.op]  # else copies in any blocked layout
            if enc.kind == "mma" or (spread and is_accumulator_blocked(enc)):
                if any(d.distinct_warps < d.wpc for d in thread_map(enc, v.type.shape).dims):
                    return True
        return False

    def _decide_coalesced(self, node: _Node) -> None:
        if node.rule == "mt.prefetch":
            enc, width, self.line_tail[node.op] = prefetch_layout(node.op, self.analysis, self.op_warps[node.op])
        else:
            enc, width = coalesced_layout(node.op, self.analysis, self.op_warps[node.op], self._reductions(node))
        self.vector_width[node.op] = width
        self._decide(node, ({v: enc for v in node.defs}, {s: enc for s in node.uses}))

    def _decide_explicit(self, node: _Node) -> None:
        """A load or store with an explicit `layout` attr: that layout, whatever the coalescing would pick (checked against
        the program's warps here, where num_warps is known), its vector width what the layout and the axis facts
        allow."""
        op = node.op
        enc = op.attrs["layout"]  # kept: dot-lowering solves the layouts again
        warps = 1
        for w in enc.get("warpsPerCTA"):
            warps *= w
        if warps != self.op_warps[op]:
            raise CompilationError(f"{op.name[3:]}(layout=...) places {warps} warps (warps_per_cta "
                                   f"{list(enc.get('warpsPerCTA'))}); the program has {self.op_warps[op]}", op.loc)
        self.vector_width[op] = width_in_layout(op, self.analysis, enc)
        self._decide(node, ({v: enc for v in node.defs}, {s: enc for s in node.uses}))

    def _is_weak(self, node: _Node) -> bool:
        """A small access: a load / store of at most one 16-byte vector per thread whose tile is not (through
        elementwise ops) loop-carried. Not an anchor up front: a small load takes the layout its consumers want when
        their flood reaches it (reading it replicated, every warp its own copy from L1, is cheaper than converting it
        through shared memory); a small store, and a small load no flood reached, is coalesced after the big
        anchors' floods, so its index math does not choose the layouts of the big computation."""
        if node.rule == "mt.prefetch":
            return True  # it has no consumers and picks no layout for others: laid out last, by its own lines
        if node.rule not in ("mt.load", "mt.store"):
            return False
        if self._reaches_carried(node):
            return False
        t = node.op.operands[0].type
        per_thread = max(1, MAX_VECTOR_BYTES // t.scalar.pointee.bytes)  # type: ignore[union-attr]
        return t.numel <= self.op_warps[node.op] * WARP_SIZE * per_thread

    def _reaches_carried(self, node: _Node) -> bool:
        """Whether the access's tile is (through elementwise ops, either way) a loop-carried value: a replicated
        layout there would hold its copies in registers for the whole loop."""
        seen: set[Value] = set()
        stack = list(node.defs) if node.rule == "mt.load" else [node.op.operands[1]]  # the data, not the index math
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            near = [self.slot_node[s] for s in self.users.get(v, [])] + \
                   ([self.def_node[v]] if v in self.def_node else [])
            for other in near:
                if other.rule == "same":
                    return True
                if other.rule in _SAME and other.rule not in _MEMORY and other.rule != "mt.broadcast":
                    stack.extend(other.defs)
                    stack.extend(s[0].operands[s[1]] for s in other.uses)
        return False

    def _decide_weak(self, node: _Node, hint: LayoutAttr) -> None:
        """Decide a weak access in `hint`, or in a blocked layout equivalent to it (vectorizable; the conversion to
        `hint` is then a register rename)."""
        shape = node.op.operands[0].type.shape
        enc = blocked_equivalent(hint, shape) or hint
        width = width_in_layout(node.op, self.analysis, enc) if is_blocked(enc) else 1
        self.vector_width[node.op] = width
        self._decide(node, ({v: enc for v in node.defs}, {s: enc for s in node.uses}))

    def _reductions(self, anchor: _Node) -> list[tuple[int, int]]:
        """The reductions of the anchor's tile, as (anchor dim reduced, elements reduced): reduces reached from its
        values through ops that keep the tile's dims (elementwise, broadcast, loads / stores, carried values) and
        through the reduces themselves (a reduce's result keeps the other dims, in the same lanes and warps)."""
        rank = len(anchor.op.operands[0].type.shape)
        found: list[tuple[int, int]] = []
        seen: set[Value] = set()
        start = list(anchor.defs) + [s[0].operands[s[1]] for s in anchor.uses]
        stack: list[tuple[Value, tuple[int, ...]]] = [(v, tuple(range(rank))) for v in start]
        while stack:
            v, dims = stack.pop()  # dims[i]: the anchor dim that dim i of v is
            if v in seen or len(v.type.shape) != len(dims):  # type: ignore[union-attr]
                continue
            seen.add(v)
            for slot in self.users.get(v, []):
                node = self.slot_node[slot]
                if node.rule == "mt.reduce":
                    axis = node.op.attrs["axis"]
                    found.append((dims[axis], v.type.numel))  # type: ignore[union-attr]
                    stack.extend((r, dims[:axis] + dims[axis + 1:]) for r in node.defs)
                elif node.rule == "same" or node.rule in _SAME:
                    stack.extend((r, dims) for r in node.defs)
        return found

    def _flood(self) -> None:
        while self.queue:
            node = self.queue.popleft()
            for slot in node.uses:  # backward: producers of operands take the layout asked for
                want = self.required.get(slot)
                producer = self.def_node.get(slot[0].operands[slot[1]])
                if want is not None and producer is not None:
                    self._try(producer, slot[0].operands[slot[1]], None, want)
            for v in node.defs:  # forward: consumers take the layout given
                for slot in self.users.get(v, []):
                    self._try(self.slot_node[slot], None, slot, self.layout[v])

    def solve(self) -> None:
        analysis = AxisAnalysis(self.func)
        for node in self.nodes:  # 0. fixed dot accumulators (and dot operands): they flood first, as far as they reach
            fixed = self.dot_layouts.get(node.op)
            op = node.op
            if fixed is not None and node.rule == "mt.dot":
                self._decide(node, ({op.result: fixed}, {(op, 0): None, (op, 1): None, (op, 2): fixed}))
            elif fixed is not None and node.rule == "mt.reshape":  # a reshape feeding a dot operand
                self._decide(node, ({op.result: fixed}, {(op, 0): None}))
        dots, self.queue = self.queue, deque()
        self.analysis = analysis
        self.weak: set[_Node] = set()
        for node in self.nodes:  # 1. anchors, all fixed before any flooding so no flood can override one
            if node.rule in ("mt.load", "mt.store") and "layout" in node.op.attrs:  # explicit: layout=mt.blocked
                self._decide_explicit(node)
            elif node.rule in _MEMORY and node.uses and node.uses[0][1] == 0:
                if self._is_weak(node):
                    self.weak.add(node)  # decided by the flood that reaches it first (see _try)
                    continue
                self._decide_coalesced(node)
            elif node.rule == "mt.descriptor_load":
                warps = self.op_warps[node.op]
                self._decide(node, ({node.op.result: descriptor_layout(node.op.result.type, warps)}, {}))
        self.queue, anchors = dots, self.queue
        self._flood()
        self.queue = anchors
        self._flood()
        for node in self.nodes:  # small accesses no strong anchor reached: coalesced, like the others
            if node in self.weak and not node.decided:
                self._decide_coalesced(node)
                self._flood()
        for node in self.nodes:  # 2. dots whose result no anchor reached, then everything else
            if node.rule == "mt.dot" and not node.decided:
                self._decide_default(node)
                self._flood()
        for node in self.nodes:
            if not node.decided:
                self._decide_default(node)
                self._flood()

    def _decide_default(self, node: _Node) -> None:
        # The default of the larger side: a reduce's operand, an expand_dims' result, else the first result.
        ports: list[tuple[Value | None, Slot | None, Value]] = [(v, None, v) for v in node.defs]
        uses = [(None, s, s[0].operands[s[1]]) for s in node.uses]
        ports = uses + ports if node.rule == "mt.reduce" else ports + uses
        for hint_def, hint_use, v in ports:
            self._try(node, hint_def, hint_use, default_layout(v.type.shape, self.op_warps[node.op]))
            if node.decided:
                break
        assert node.decided, f"tiling: could not decide {node.rule}"

    # -- rewriting

    def materialize(self) -> None:
        for v, enc in self.layout.items():
            v.type = v.type.with_encoding(enc)
        for op in self.func.walk():  # rings: row-major, unswizzled slots until a wgmma reads one in place
            if op.name == "mt.alloc_ring" and op.result.type.encoding is None:
                op.result.type = op.result.type.with_encoding(ring_layout(op.attrs["stages"]))
        self.memo: dict[tuple[Value, LayoutAttr], Value] = {}
        self._share_slice_conversions()
        for slot, want in list(self.required.items()):
            op, i = slot
            v = op.operands[i]
            if want is not None and v.type.encoding != want:
                op.operands[i] = self._in_layout(v, want)
        for op, width in self.vector_width.items():
            op.attrs["vector_width"] = width
        for op, tail in self.line_tail.items():
            op.attrs["line_tail"] = tail

    def _share_slice_conversions(self) -> None:
        """Slices of one tile that each move elements (not a register selection in the tile's layout) into one
        blocked layout R in which each of them would be a selection: the tile is converted to R once and those
        slices become selections of it, when their moves would store more than the tile ([64, K] gate rows taken
        in four 16-row slices: one exchange instead of four, each writing most of the tile)."""
        slices: dict[Value, list[Operation]] = {}
        for op in self.func.walk():
            if op.name == "mt.extract_slice" and _is_tensor(op.operands[0]):
                slices.setdefault(op.operands[0], []).append(op)
        for v, ops in slices.items():
            by_target: dict[LayoutAttr, list[Operation]] = {}
            for op in ops:
                target = op.result.type.encoding
                if (not self._is_selection(op, v.type.encoding) and is_blocked(target)
                        and self._is_selection(op, target)):
                    by_target.setdefault(target, []).append(op)  # type: ignore[arg-type]
            for target, group in by_target.items():
                if len(group) < 2:
                    continue
                tmap = thread_map(v.type.encoding, v.type.shape)  # type: ignore[arg-type]
                stored = sum(len(registers_in_box(tmap, tuple(op.attrs["offsets"]), tuple(op.attrs["sizes"])))
                             for op in group)
                if stored <= tmap.num_regs:
                    continue
                converted = self._in_layout(v, target)
                for op in group:
                    op.operands[0] = converted

    @staticmethod
    def _is_selection(op: Operation, enc: LayoutAttr | None) -> bool:
        """Whether the slice `op` of a tile laid out as `enc` is a register selection giving its result's layout."""
        if enc is None:
            return False
        sub = subtile_layout(enc, op.operands[0].type.shape, op.attrs["offsets"], op.attrs["sizes"])
        return sub is not None and sub == op.result.type.encoding

    def _in_layout(self, v: Value, want: LayoutAttr) -> Value:
        """`v` in layout `want`: itself, a recomputation of cheap index math, or a convert_layout of it."""
        if v.type.encoding == want:
            return v
        key = (v, want)
        if key not in self.memo:
            equivalent = layouts_equivalent(v.type.encoding, want, v.type.shape)  # type: ignore[arg-type]
            if not equivalent and _cheap_size(v, REMAT_LIMIT) <= REMAT_LIMIT:
                self.memo[key] = self._recompute(v, want)
            else:
                conv = Operation("mt.convert_layout", [v], [v.type.with_encoding(want)], loc=_loc_of(v))
                insert_after_definition(v, conv)
                self.memo[key] = conv.result
        return self.memo[key]

    def _recompute(self, v: Value, want: LayoutAttr) -> Value:
        op = v.defining_op
        assert op is not None
        node = _Node(op.name, op, [v], [(op, i) for i, x in enumerate(op.operands) if _is_tensor(x)])
        config = _rule(node, v, None, want)
        assert config is not None
        operands = [self._in_layout(x, config[1][(op, i)]) if _is_tensor(x) else x  # type: ignore[arg-type]
                    for i, x in enumerate(op.operands)]
        clone = Operation(op.name, operands, [v.type.with_encoding(want)], dict(op.attrs), loc=op.loc)
        insert_after_definition(v, clone)
        return clone.result


def ring_layout(stages: int) -> LayoutAttr:
    """The shared layout of a ring's slots by default: row-major, unswizzled (codegen/async_copy.py)."""
    return layout("shared", swizzle=0, order=[1, 0], stages=stages)


def _cheap_size(v: Value, limit: int) -> int:
    """How many ops recomputing `v` takes (limit + 1 when it is not cheap index math)."""
    seen: set[int] = set()
    stack = [v]
    while stack:
        x = stack.pop()
        op = x.defining_op
        if op is None or not _is_cheap(op):
            return limit + 1
        if id(op) in seen:
            continue
        seen.add(id(op))
        if len(seen) > limit:
            return limit + 1
        stack.extend(o for o in op.operands if _is_tensor(o))
    return len(seen)


def _is_cheap(op: Operation) -> bool:
    if op.name in ("mt.constant", "mt.splat", "mt.arange"):
        return True
    s = op.results[0].type.scalar if op.results else None
    return op.name in _CHEAP and (isinstance(s, PointerType) or (s is not None and s.is_int))


def _loc_of(v: Value):  # type: ignore[no-untyped-def]
    op = v.defining_op
    return op.loc if op is not None else None


# -------------------------------------------------------------------------------------------- coalescing


def coalesced_layout(op: Operation, analysis: AxisAnalysis, num_warps: int,
                     reductions: list[tuple[int, int]] | None = None) -> tuple[LayoutAttr, int]:
    """The blocked layout and vector width for a load / store / atomic_add on a tile of pointers; the warps are
    placed to keep `reductions` ((dim, elements reduced) pairs) within warps where the tile allows
    (`reduction_aware`)."""
    ptr = op.operands[0]
    shape = ptr.type.shape
    info = analysis.info(ptr)
    order = sorted(range(len(shape)), key=lambda d: (-info.contiguity[d], -d))
    mask = op.operands[_MASK_INDEX[op.name]] if len(op.operands) > _MASK_INDEX[op.name] else None
    width = vector_width(info, analysis.info(mask) if mask is not None else None, order[0], shape,
                         ptr.type.scalar.pointee.bytes, num_warps)  # type: ignore[union-attr]
    if op.name == "mt.atomic_add":
        width = 1  # one atomic per element
    spt = [1] * len(shape)
    spt[order[0]] = width
    return reduction_aware(shape, num_warps, spt, order, reductions or []), width


def prefetch_layout(op: Operation, analysis: AxisAnalysis, num_warps: int) -> tuple[LayoutAttr, int, bool]:
    """The layout of a prefetch's pointers, each thread's run of w consecutive elements along the most contiguous
    dim (w as long as the pointer is contiguous, at least a line's worth of elements before the tile is spread
    thinner over the threads), and whether a run's last element needs a prefetch of its own (`line_tail`): the
    codegen prefetches the run's elements 0, L, 2L, ... (L = elements per 128-byte line), which covers every line
    the run touches when the runs start line-aligned or fit in one line (the pointer's divisibility proves it),
    else the last element's line too. Masks need no constancy: each prefetched element uses its own lane mask."""
    ptr = op.operands[0]
    shape = ptr.type.shape
    info = analysis.info(ptr)
    order = sorted(range(len(shape)), key=lambda d: (-info.contiguity[d], -d))
    size = ptr.type.scalar.pointee.bytes  # type: ignore[union-attr]
    numel = ptr.type.numel
    spread = max(1, numel // (num_warps * WARP_SIZE), CACHE_LINE_BYTES // size)
    width = min(info.contiguity[order[0]], shape[order[0]], spread)
    width = 1 << (max(1, width).bit_length() - 1)
    spt = [1] * len(shape)
    spt[order[0]] = width
    tail = width > 1 and info.divisibility[order[0]] < min(width * size, CACHE_LINE_BYTES)
    return blocked_for_shape(shape, num_warps, spt, order), width, tail


def reduction_aware(shape: tuple[int, ...], num_warps: int, spt: list[int], order: list[int],
                    reductions: list[tuple[int, int]]) -> LayoutAttr:
    """The cheapest of the blocked layouts that keep a subset of the reduced dims within warps (Triton's
    placement being the empty subset). The cost of a layout is the elements its reductions combine across warps
    (through shared memory); ties go to the fewest dims kept, i.e. the placement closest to Triton's."""
    axes = sorted({d for d, _ in reductions})
    best: tuple[int, int] | None = None
    choice = blocked_for_shape(shape, num_warps, spt, order)
    for mask in range(1 << len(axes)):
        keep = [a for i, a in enumerate(axes) if mask >> i & 1]
        enc = blocked_for_shape(shape, num_warps, spt, order, keep_in_warp=keep)
        dims = thread_map(enc, shape).dims
        cost = sum(n for d, n in reductions if dims[d].distinct_warps > 1)
        if best is None or (cost, len(keep)) < best:
            best, choice = (cost, len(keep)), enc
    return choice


def width_in_layout(op: Operation, analysis: AxisAnalysis, enc: LayoutAttr) -> int:
    """The vector width for a load / store on a tile of pointers that a flood put in the blocked layout `enc`: what
    the axis facts allow along its fastest dim, cut to the thread's run there (1 for an atomic)."""
    if op.name == "mt.atomic_add":
        return 1
    ptr = op.operands[0]
    shape, dim = ptr.type.shape, enc.get("order")[0]
    mask = op.operands[_MASK_INDEX[op.name]] if len(op.operands) > _MASK_INDEX[op.name] else None
    width = vector_width(analysis.info(ptr), analysis.info(mask) if mask is not None else None, dim, shape,
                         ptr.type.scalar.pointee.bytes, 1, cap=min(enc.get("sizePerThread")[dim], shape[dim]))
    tmap = thread_map(enc, shape)
    while width > 1:
        try:
            vector_groups(tmap, dim, width)
            return width
        except ValueError:
            width //= 2
    return 1


def descriptor_layout(t: TensorType, num_warps: int) -> LayoutAttr:
    """The layout a TMA-loaded tile is read into from shared memory: runs of up to 16 bytes along the innermost
    dim per thread (one ld.shared.v4 each), threads and warps spread as for a coalesced access."""
    rank, numel = len(t.shape), t.numel
    width = max(1, min(MAX_VECTOR_BYTES // t.element.bytes, t.shape[-1],  # type: ignore[union-attr]
                       numel // (num_warps * WARP_SIZE)))
    return blocked_for_shape(t.shape, num_warps, [1] * (rank - 1) + [width], list(reversed(range(rank))))


def vector_width(ptr: AxisInfo, mask: AxisInfo | None, dim: int, shape: tuple[int, ...], elem_bytes: int,
                 num_warps: int, cap: int | None = None) -> int:
    """Elements per vector access along `dim` that the facts allow (a power of two, 1 when nothing is known), at
    most `cap` (default: the elements per thread when the tile is spread over all threads)."""
    numel = 1
    for s in shape:
        numel *= s
    if cap is None:
        cap = max(1, numel // (num_warps * WARP_SIZE))
    width = min(ptr.contiguity[dim], max(1, ptr.divisibility[dim] // elem_bytes),
                max(1, MAX_VECTOR_BYTES // elem_bytes), cap, shape[dim])
    if mask is not None:
        width = min(width, mask.constancy[dim])
    width = 1 << (max(1, width).bit_length() - 1)
    if width > 1 and width * elem_bytes < 4:
        width = 1  # vectors narrower than one 32-bit word are not worth packing
    return width


# ------------------------------------------------------------------------------------------ verification


def verify_layouts(func: Operation) -> None:
    """Check what the codegen relies on after tiling: every tensor has a layout, and each op's layouts are tied as
    the module docstring says (convert_layout, trans, reshape and dot's a / b being the free places)."""
    name = func.attrs.get("sym_name")

    def bad(op: Operation, msg: str) -> None:
        raise ValueError(f"tiling of {name}: '{op.name}' at {op.loc}: {msg}")

    for op in func.walk():
        values = list(op.operands) + list(op.results)
        for v in values + [a for r in op.regions for b in r.blocks for a in b.args]:
            if isinstance(v.type, TensorType) and v.type.encoding is None:
                bad(op, f"tensor without a layout: {v.type}")
        enc = lambda v: v.type.encoding  # noqa: E731
        tensors = [v for v in values if _is_tensor(v)]
        if op.name in _SAME:
            if len({enc(v) for v in tensors}) > 1:
                bad(op, "operands and results must share one layout")
        elif op.name == "mt.reduce" and op.results and _is_tensor(op.result):
            if enc(op.result) != slice_of(op.attrs["axis"], enc(op.operands[0])):
                bad(op, "result must be the slice of the operand's layout")
        elif op.name == "mt.expand_dims":
            if enc(op.operands[0]) != slice_of(op.attrs["axis"], enc(op.result)):
                bad(op, "operand must be the slice of the result's layout")
        elif op.name == "mt.bitcast_split":
            rank = len(op.operands[0].type.shape)
            if not _pair_in_thread(enc(op.result), rank) or not layouts_equivalent(
                    enc(op.operands[0]), slice_of(rank, enc(op.result)), op.operands[0].type.shape):
                bad(op, "the result must hold each pair in one thread, its operand being the slice over the pairs")
        elif op.name == "mt.dot":
            if enc(op.operands[2]) != enc(op.result):
                bad(op, "accumulator and result must share one layout")
        elif op.name == "scf.for":
            body = op.regions[0].block
            for i, r in enumerate(op.results):
                trio = [op.operands[3 + i], body.args[1 + i], body.terminator.operands[i], r]
                if _is_tensor(r) and len({enc(v) for v in trio}) > 1:
                    bad(op, f"carried value {i} changes layout")
        elif op.name == "scf.if":
            for i, r in enumerate(op.results):
                vs = [r] + [reg.block.terminator.operands[i] for reg in op.regions]
                if _is_tensor(r) and len({enc(v) for v in vs}) > 1:
                    bad(op, f"result {i} changes layout")
        elif op.name == "scf.while":
            before, after = op.regions[0].block, op.regions[1].block
            for i, a in enumerate(before.args):
                vs = [a, op.operands[i], after.terminator.operands[i]]
                if _is_tensor(a) and len({enc(v) for v in vs}) > 1:
                    bad(op, f"carried value {i} changes layout")
            for j, a in enumerate(after.args):
                vs = [a, op.results[j], before.terminator.operands[j + 1]]
                if _is_tensor(a) and len({enc(v) for v in vs}) > 1:
                    bad(op, f"forwarded value {j} changes layout")
