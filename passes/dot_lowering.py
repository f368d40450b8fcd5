"""Pass "dot-lowering": puts each mt.dot that tensor cores can compute on them, and records the choice in the IR.

Runs after "tiling". For every mt.dot whose a and b are f16 or bf16 (or f32 with input_precision "tf32" or
"tf32x3": mma.sync m16n8k8 on tf32, kWidth 1; tf32x3 issues three per step, codegen/mma.py), it picks (func attr
`dot_instruction`: "auto", the default, or "wgmma" / "mma" / "fma" to force one where it applies; a dot's own attr
`instruction`, from `mt.dot(..., instruction=)`, overrides it for that dot):

  wgmma.mma_async m64nNk16  num_warps a multiple of 4, M a multiple of 16 * num_warps (64 rows per warpgroup and
                            instruction), N a multiple of 8, K of 16, a and b together within the shared-memory
                            budget;
  mma.sync m16n8k16         M % 16 == N % 8 == K % 16 (tf32: 8) == 0 and warps that tile them: warpsPerCTA
                            [WM, WN] with WM * WN = num_warps, WM as large as M allows (16 * WM | M), 8 * WN | N;
                            each operand within the shared-memory budget;
  neither                   the dot stays as it is (codegen/dot.py: FMAs on CUDA cores).

and rewrites the dot (`A: tensor<64x32xbf16, #blocked>` etc.) into

  mma.sync:  %a2 = mt.convert_layout %a : #blocked -> #mt.dot_op<{opIdx = 0, parent = #mma, kWidth = 2}>
             %b2 = mt.convert_layout %b : #blocked1 -> #mt.dot_op<{opIdx = 1, parent = #mma, kWidth = 2}>
             %d  = mt.dot %a2, %b2, %acc : -> #mma
                   with #mma = #mt.mma<{version = 2, warpsPerCTA = [WM, WN], instrShape = [16, 8]}>
  wgmma:     %a2 = mt.local_alloc %a : #blocked -> #mt.shared<{swizzle = S, order = [1, 0]}>   (K-major)
             %b2 = mt.local_alloc %b : #blocked1 -> #mt.shared<{swizzle = S, order = [0, 1]}>  (K-major)
             %d  = mt.dot %a2, %b2, %acc : -> #mt.mma<{version = 3, warpsPerCTA = [num_warps, 1],
                                                      instrShape = [16, min(N, 256), 16]}>

with S = min(128, 2 * K) bytes (the widest swizzle atom the K extent fills). The shared-memory budget of a wgmma
applies to staging its operands: when both are K-loop loads the "pipeline" pass will put in rings (its own
candidate test, passes/pipeline.py), the dot reads the ring slots in place instead and the larger budget of the
rings (dynamic shared memory, pipeline.DYNAMIC_BUDGET for two stages) applies. The operand ops are placed right
after the operand's definition (so a loop-invariant operand is converted once, outside the loop).

The accumulator layout should not stop at the dot: an accumulator carried through a K loop must stay in the mma
layout across iterations, and attention's softmax between two dots works best in it. Rather than a separate
conversion-removal pass, the layouts are solved again (tiling's solver, passes/tiling.py) with these dots'
accumulators fixed to their #mt.mma layouts as the first anchors: the mma layout floods through the carried
values, elementwise ops and reductions (`#mt.slice` of it) until it meets a load / store anchor, where a
`mt.convert_layout` appears (the epilogue). The IR's earlier convert_layouts and encodings are dropped first,
and unused ops (index math the first solve had recomputed in other layouts) are removed at the end (dce).

A tf32 dot takes both operands in kPairs order (`with_k_pairs`) when that makes more of them register renamings of
the tiles the solve gave them: an A in an accumulator's thread map (an earlier dot's result, or a tile loaded in
that blocked layout), or a B that is a transposed accumulator. So a recurrent state held as an accumulator is the
next product's operand without a pass through shared memory.
"""
from __future__ import annotations

from dataclasses import dataclass

from minitriton.ir.layouts import blocked, default_layout, identity, register_permutation, thread_map
from minitriton.ir import Block, Module, Operation, Value
from minitriton.ir.core import insert_after_definition
from minitriton.ir.ops import DOT_INSTRUCTIONS
from minitriton.ir.mma_layouts import (dot_operand_layout, dot_operand_thread_map, is_accumulator_blocked, mma_layout,
                                      shared_layout, tiles_accumulator, warps_of)
from minitriton.errors import CompilationError
from minitriton.ir.partitions import warps_of_ops
from minitriton.ir.types import LayoutAttr, TensorType, layout

from .dce import eliminate_dead_code
from .registry import register_pass
from .tiling import assign_layouts

# The static shared memory a kernel may use (codegen/context.py SMEM_LIMIT): operands are staged through it.
SMEM_BUDGET = 48 * 1024
CHOICES = DOT_INSTRUCTIONS  # func attr dot_instruction, or a dot's own attr instruction
DEFAULT_CHOICE = "auto"  # for kernels without a `dot_instruction` attr ("mma" keeps wgmma off everywhere)
TENSOR_CORE_TYPES = ("f16", "bf16")
TF32_PRECISIONS = ("tf32", "tf32x3")  # f32 dots that may run on tf32 tensor cores (tf32x3: three products each)
K_WIDTH = 2  # 16-bit elements: two K-adjacent values per 32-bit register of an mma.sync fragment


@dataclass(frozen=True)
class DotChoice:
    """The instruction chosen for one dot and the layouts that say so."""

    instruction: str  # "wgmma" or "mma"
    accumulator: LayoutAttr
    a: LayoutAttr
    b: LayoutAttr


@register_pass("dot-lowering")
def dot_lowering(module: Module) -> Module:
    """Put eligible dots on tensor cores (see the module docstring)."""
    if any([lower_dots(func) for func in module.functions]):
        eliminate_dead_code(module)  # index math the first tiling recomputed per layout, now unused
    return module


def lower_dots(func: Operation) -> bool:
    """Rewrite the eligible dots of `func`; True when there was one."""
    warps = warps_of_ops(func)  # each dot is laid out on its partition's warps (minitriton/ir/partitions.py)
    default = func.attrs.get("dot_instruction", DEFAULT_CHOICE)
    if default not in CHOICES:
        raise ValueError(f"dot-lowering: dot_instruction must be one of {CHOICES}, got {default!r}")
    chosen = {}
    for op in func.walk():
        if op.name == "mt.dot":
            _check_not_lowered(func, op)
            slots = ring_slot_operands(op)
            in_rings = operands_in_rings(func, op) or (slots is not None and None not in slots)
            b_in_ring = slots is not None and slots[0] is None  # B read in place, A from registers or staged
            prefer = op.attrs.get("instruction", default)  # a dot's own `mt.dot(..., instruction=)` wins
            choice = choose(op, warps[op], prefer if prefer != "auto" else default, in_rings, b_in_ring)
            if choice is not None:
                chosen[op] = choice
    if not chosen:
        return False
    strip_layouts(func)
    anchors = {op: c.accumulator for op, c in chosen.items()}
    for op in func.walk():  # dots left on CUDA cores keep a blocked accumulator: an #mma layout flooding in from a
        if op.name == "mt.dot" and op not in chosen and not _tiny(op, warps[op]):  # tensor-core neighbour may not
            anchors[op] = default_layout(op.result.type.shape, warps[op])  # tile their shape
    for op, choice in chosen.items():  # operands built by a reshape: hold them in their fragments' threads
        if choice.instruction == "mma":
            for i, enc in ((0, choice.a), (1, choice.b)):
                producer = op.operands[i].defining_op
                frag = fragment_blocked(enc, op.operands[i].type.shape)
                if producer is not None and producer.name == "mt.reshape" and frag is not None:
                    anchors.setdefault(producer, frag)
    assign_layouts(func, anchors)
    for op, choice in list(chosen.items()):
        chosen[op] = with_k_pairs(op, choice)
    memo: dict[tuple[Value, LayoutAttr], Value] = {}
    for op, choice in chosen.items():
        slots = ring_slot_operands(op) if choice.instruction == "wgmma" else None
        if slots is not None:
            read_rings_in_place(func, op, warps[op], slots)
        for i, enc in ((0, choice.a), (1, choice.b)):
            if slots is None or slots[i] is None:
                op.operands[i] = _operand_in(op.operands[i], enc, memo)
    verify_dot_layouts(func)
    return True


# ---------------------------------------------------------------------------------------------- choice


def operands_in_rings(func: Operation, op: Operation) -> bool:
    """Whether both operands of the dot are loads the pipeline pass will turn into ring copies (a wgmma then reads
    them in place: no staging buffer)."""
    from .axis_info import AxisAnalysis
    from .pipeline import would_ring

    loads = [v.defining_op for v in op.operands[:2]]
    if any(ld is None or ld.name != "mt.load" for ld in loads):
        return False
    loop = loads[0].parent_op  # type: ignore[union-attr]
    if loop is None or loop.name != "scf.for" or loads[1].parent_op is not loop:  # type: ignore[union-attr]
        return False
    if int(loop.attrs.get("num_stages", func.attrs.get("num_stages", 0))) < 2:
        return False
    analysis = AxisAnalysis(func)
    return all(would_ring(func, loop, ld, analysis) for ld in loads)  # type: ignore[arg-type]


def ring_slot_operands(op: Operation) -> tuple[Operation | None, Operation | None] | None:
    """Per operand of the dot, the mt.local_load of an explicit ring (mt.ring, frontend/partitions.py) that gives
    it, or None; for B also through an mt.trans (a slot holding B^T [N, K], read K-major). None when neither
    operand is a slot, or A is one and B is not (a wgmma reads such slots in place: both, or B alone with A in
    registers or staged)."""
    a = _explicit_ring_load(op.operands[0])
    b = _explicit_ring_load(op.operands[1]) or _transposed_load(op.operands[1])
    if b is None:
        return None
    return a, b


def _transposed_load(v: Value) -> Operation | None:
    """The explicit ring's mt.local_load that `v` is the transpose of (a B^T slot), or None."""
    trans = v.defining_op
    if trans is None or trans.name != "mt.trans" or list(trans.attrs.get("order", ())) != [1, 0]:
        return None
    return _explicit_ring_load(trans.operands[0])


def _explicit_ring_load(v: Value) -> Operation | None:
    ld = v.defining_op
    if ld is None or ld.name != "mt.local_load" or ld.operands[0].defining_op is None \
            or not ld.operands[0].defining_op.attrs.get("explicit"):
        return None
    return ld


def read_rings_in_place(func: Operation, dot: Operation, num_warps: int,
                        slots: tuple[Operation | None, Operation | None]) -> None:
    """The wgmma `dot` reads its ring operands straight from their slots: each mt.local_load becomes an
    mt.ring_slot view, and its ring takes the operand's layout (`#mt.shared<{swizzle, order = [1, 0], operand,
    stages, warps}>`: A K-major (operand 0), B MN-major (operand 1), or B^T (operand 2: the slot holds B
    transposed, [N, K] with K contiguous, which wgmma reads K-major, imm-trans-b 0); `warps` the consumer warps
    the A rows are permuted for, which the producer's TMA boxes follow). A ring read in place is read only that
    way (its slots are swizzled)."""
    for i, load in enumerate(slots):
        if load is None:
            continue
        ring = load.operands[0]
        t: TensorType = load.result.type  # type: ignore[assignment]
        transposed = i == 1 and dot.operands[1] is not load.result  # B = mt.trans(slot)
        operand = 2 if transposed else i
        contiguous = t.shape[1]
        swizzle = min(128, 2 * contiguous)
        if swizzle < 32 or (2 * contiguous) % swizzle or (operand == 1 and min(contiguous, 256) % (swizzle // 2)):
            raise CompilationError(f"a ring slot of {list(t.shape)} cannot be read in place as wgmma operand "
                                   f"{'ab'[i]}{'^T' if transposed else ''}: its rows must be a whole number of "
                                   "32, 64 or 128-byte swizzle atoms", dot.loc)
        stages = int(ring.defining_op.attrs["stages"])  # type: ignore[union-attr]
        enc = layout("shared", swizzle=swizzle, order=[1, 0], operand=operand, stages=stages, warps=num_warps)
        current = ring.type.encoding  # type: ignore[union-attr]
        if current is not None and current.get("operand") is not None and current != enc:
            raise CompilationError("one ring is read in place by wgmma dots that want different layouts", dot.loc)
        readers = [dot.operands[i]] + ([load.result] if transposed else [])
        for user in func.walk():
            if ring in user.operands and user.name == "mt.local_load" and user is not load \
                    and not any(_explicit_ring_load(v) is user or _transposed_load(v) is user
                                for d in func.walk() if d.name == "mt.dot" for v in d.operands[:2]):
                raise CompilationError("a ring a wgmma dot reads in place is swizzled for it: read it only as "
                                       "that dot's operand", user.loc)
            if any(r in user.operands for r in readers) and user.name not in ("mt.dot", "mt.trans"):
                raise CompilationError("a ring slot a wgmma dot reads in place is that dot's operand only; "
                                       "read the ring again for other uses", user.loc)
        ring.type = ring.type.with_encoding(enc)
        view_t = dot.operands[i].type if transposed else t
        view = Operation("mt.ring_slot", list(load.operands),
                         [view_t.with_encoding(layout("shared", swizzle=swizzle, order=[1, 0], operand=operand))],
                         loc=load.loc)
        block = load.parent
        block.insert(block.ops.index(load) + 1, view)  # type: ignore[union-attr]
        old = dot.operands[i]
        dot.operands[i] = view.result
        if transposed and not any(old in o.operands for o in func.walk()):
            old.defining_op.erase()  # type: ignore[union-attr]
        if not any(load.result in o.operands for o in func.walk()):
            load.erase()


def choose(op: Operation, num_warps: int, prefer: str = "auto", in_rings: bool = False,
           b_in_ring: bool = False) -> DotChoice | None:
    """The tensor-core instruction for `op` (None: CUDA cores); `in_rings`: wgmma would read both operands from
    ring slots in place; `b_in_ring`: only B (A then comes from registers or is staged)."""
    a, b = op.operands[0].type, op.operands[1].type
    (m, k), n = a.shape, b.shape[1]
    tf32 = a.scalar.name == "f32" and op.attrs.get("input_precision") in TF32_PRECISIONS  # type: ignore
    if prefer == "fma" or not (tf32 or a.scalar.name in TENSOR_CORE_TYPES):  # type: ignore[union-attr]
        return None
    if not tf32 and prefer in ("auto", "wgmma"):
        a_regs = not in_rings and a_in_accumulator_layout(op, through_loops=True)
        if fits_wgmma(m, n, k, num_warps, in_rings, a_staged=not a_regs, b_staged=not b_in_ring):
            return _wgmma_choice(m, n, k, num_warps, a_regs)
    if prefer in ("auto", "mma"):
        k_width = 1 if tf32 else K_WIDTH
        warps = mma_v2_warps(m, n, k, num_warps, k_width, a_staged=not (tf32 and a_in_accumulator_layout(op)))
        if warps is not None:
            acc = mma_layout(2, warps, [16, 8])
            return DotChoice("mma", acc, dot_operand_layout(0, acc, k_width), dot_operand_layout(1, acc, k_width))
    return None


def with_k_pairs(op: Operation, choice: DotChoice) -> DotChoice:
    """A tf32 mma.sync dot with both operands in kPairs order (minitriton/ir/mma_layouts.py) when that makes more of
    its operands register renamings of the tiles the layout solve gave them than the plain order does: an A held
    in an accumulator's thread map (an earlier dot's result, a tile loaded in the accumulator's blocked layout),
    or a B that is a transposed accumulator (a state S^T [V, K] feeding x @ S). Otherwise `choice` unchanged."""
    if choice.instruction != "mma" or choice.a.get("kWidth") != 1:
        return choice
    acc = choice.accumulator
    pairs = (dot_operand_layout(0, acc, 1, k_pairs=True), dot_operand_layout(1, acc, 1, k_pairs=True))

    def renames(encs: tuple[LayoutAttr, LayoutAttr]) -> int:
        count = 0
        for v, enc in zip(op.operands[:2], encs):
            src = v.type.encoding  # type: ignore[union-attr]
            shape = tuple(v.type.shape)  # type: ignore[union-attr]
            if src is not None and register_permutation(thread_map(src, shape), dot_operand_thread_map(enc, shape),
                                                        identity) is not None:
                count += 1
        return count

    if renames(pairs) > renames((choice.a, choice.b)):
        return DotChoice("mma", acc, *pairs)
    return choice


def _tiny(op: Operation, num_warps: int) -> bool:
    """A dot result with fewer elements than threads: every layout holds copies of it, and the solver never gives
    it an mma layout (tiling's `_copies_in_warps`), so it needs no anchor. Left free, it takes the layout of the
    tiles around it (a chunk's [8, 8] matrices next to its [8, 128] token rows) instead of spreading its own
    default, which replicates them, into them."""
    m, n = op.result.type.shape  # type: ignore[union-attr]
    return m * n < 32 * num_warps


def fits_wgmma(m: int, n: int, k: int, num_warps: int, in_rings: bool = False, a_staged: bool = True,
               b_staged: bool = True) -> bool:
    """Whether `wgmma.mma_async m64nNk16` tiles an m x n x k dot of 16-bit operands on num_warps warps (operands
    staged per dot, or read in place from two or more ring stages when `in_rings`; A not staged at all when it is
    taken from registers, `a_staged` False; B not when it is read in place from an explicit ring, `b_staged`
    False)."""
    from .pipeline import DYNAMIC_BUDGET

    a_bytes = -(-m * k * 2 // 1024) * 1024 if a_staged else 0
    staged = a_bytes + (n * k * 2 if b_staged else 0)  # A, then B at the next 1024 bytes (codegen/wgmma.py)
    budget = SMEM_BUDGET
    if in_rings:
        # 2 stages, and the static scratch buffer for the epilogue (the codegen keeps it within the static limit)
        staged, budget = 2 * (m + n) * k * 2 + min(m * (4 * n + 16), SMEM_BUDGET), DYNAMIC_BUDGET
    return (num_warps % 4 == 0 and m % (16 * num_warps) == 0 and n % 8 == 0 and k % 16 == 0
            and staged <= budget)


def mma_v2_warps(m: int, n: int, k: int, num_warps: int, k_width: int = K_WIDTH, a_staged: bool = True
                 ) -> list[int] | None:
    """warpsPerCTA [WM, WN] for mma.sync m16n8k16 (m16n8k8 for tf32, k_width 1; WM as large as M allows), or None
    when the warps cannot tile the shape or an operand does not fit in shared memory (A only when `a_staged`:
    an A operand renamed from the accumulator layout, `a_in_accumulator_layout`, never goes there)."""
    if m % 16 or n % 8 or k % (8 * k_width):
        return None
    wm = 1
    while wm * 2 <= num_warps and 16 * wm * 2 <= m:
        wm *= 2
    wn = num_warps // wm
    if 8 * wn > n:
        return None
    elem, pad = 4 // k_width, 16 * k_width // 4  # bytes per element; elements in the 16-byte row padding
    a_staged = a_staged or wn != 1  # the renaming needs WN = 1
    a_bytes = max((m + pad) * k, m * (k + pad)) if a_staged else 0
    padded = max(a_bytes, (k + pad) * n, k * (n + pad)) * elem
    return [wm, wn] if padded <= SMEM_BUDGET else None


def a_in_accumulator_layout(op: Operation, through_loops: bool = False) -> bool:
    """Whether the A operand of a dot is a tile held in an mma accumulator's thread map: an mt.dot result, or a load
    with an explicit layout of the accumulator's form (sizePerThread [1, 2], threadsPerWarp [8, 4], warps [W, 1]),
    through elementwise ops (and, `through_loops`, through a loop-carried value to what the loop yields: a
    recurrent state updated by a dot). Such an A is taken by register renaming (tf32: kPairs, `with_k_pairs`;
    wgmma: A from registers), so its size does not count against the shared-memory budget."""
    v = op.operands[0]
    return _from_accumulator(v, tuple(v.type.shape), through_loops, set(), 32)  # type: ignore[union-attr]


def _from_accumulator(v: Value, shape: tuple[int, ...], through_loops: bool, seen: set[int], depth: int) -> bool:
    """`a_in_accumulator_layout`'s walk up from `v`: the first same-shape operand of each elementwise producer, or
    (`through_loops`) any of them and through loop-carried values (a state `u - x @ S` or `S * d + ...`)."""
    if depth == 0 or id(v) in seen:
        return False
    seen.add(id(v))
    producer = getattr(v, "defining_op", None)
    if producer is None:
        yielded = _yielded_for(v) if through_loops else None
        return yielded is not None and _from_accumulator(yielded, shape, through_loops, seen, depth - 1)
    if producer.name == "mt.dot":
        return True
    if producer.name == "mt.load":
        enc = producer.attrs.get("layout")
        return enc is not None and is_accumulator_blocked(enc)
    same = [o for o in producer.operands if isinstance(o.type, TensorType) and tuple(o.type.shape) == shape]
    if producer.name in ("mt.convert_layout", "mt.reshape", "mt.trans") or not same:
        return False
    return any(_from_accumulator(o, shape, through_loops, seen, depth - 1)
               for o in (same if through_loops else same[:1]))


def _yielded_for(v: Value) -> Value | None:
    """The value an scf.for yields into its loop-carried block argument `v` (None for any other value)."""
    owner = getattr(v, "owner", None)
    block = owner if isinstance(owner, Block) else None
    loop = block.parent_op if block is not None else None
    if loop is None or loop.name != "scf.for" or v.index == 0:
        return None
    yield_op = block.terminator
    if yield_op is None or len(yield_op.operands) < v.index:
        return None
    return yield_op.operands[v.index - 1]


def fragment_blocked(enc: LayoutAttr, shape: tuple[int, ...]) -> LayoutAttr | None:
    """A blocked layout putting every element of an mma.sync operand (`#mt.dot_op` enc over shape) in the thread
    whose fragment holds it (register order aside), or None when the warps make none: A [M, K] with WN = 1 is
    [1, kWidth] x [8, 4] lanes x [WM, 1] warps, B [K, N] with WM = 1 is [kWidth, 1] x [4, 8] x [1, WN], K fastest.
    A reshape producing the operand in it makes the operand's conversion a register rename (no shared memory):
    that is how dequantized weights feed the tensor cores straight from registers."""
    wm, wn = warps_of(enc)
    k_width, op_idx = enc.get("kWidth"), enc.get("opIdx")
    if op_idx == 0 and wn == 1:
        cand = blocked([1, k_width], [8, 4], [wm, 1], [1, 0])
    elif op_idx == 1 and wm == 1:
        cand = blocked([k_width, 1], [4, 8], [1, wn], [0, 1])
    else:
        return None
    try:
        frag, mine = dot_operand_thread_map(enc, shape), thread_map(cand, shape)
    except ValueError:
        return None
    if frag.num_regs != mine.num_regs or any(sorted(frag.elements(t)) != sorted(mine.elements(t))
                                             for t in range(frag.num_threads)):
        return None
    return cand


def _wgmma_choice(m: int, n: int, k: int, num_warps: int, a_regs: bool = False) -> DotChoice:
    """wgmma with both operands staged K-major, or (`a_regs`) A taken from registers (`#mt.dot_op` of the
    version 3 accumulator: a renaming of an accumulator-layout tile)."""
    acc = mma_layout(3, [num_warps, 1], [16, min(n, 256), 16])
    swizzle = min(128, 2 * k)
    a = dot_operand_layout(0, acc, K_WIDTH) if a_regs else shared_layout(swizzle, [1, 0])
    return DotChoice("wgmma", acc, a, shared_layout(swizzle, [0, 1]))


def _check_not_lowered(func: Operation, op: Operation) -> None:
    for v in list(op.operands) + list(op.results):
        enc = v.type.encoding if isinstance(v.type, TensorType) else None
        if enc is not None and enc.kind in ("mma", "dot_op", "shared"):
            raise ValueError(f"dot-lowering: {func.attrs.get('sym_name')} already went through dot-lowering "
                             f"({v.type})")


# ------------------------------------------------------------------------------------------- rewriting


def strip_layouts(func: Operation) -> None:
    """Undo tiling's output: drop convert_layouts (their uses read the operand), encodings and vector widths."""
    mapping: dict[Value, Value] = {}
    for op in list(func.walk()):
        if op.name == "mt.convert_layout":
            src = op.operands[0]
            mapping[op.result] = mapping.get(src, src)
            op.erase()
    func.replace_uses(mapping)
    for op in func.walk():
        op.attrs.pop("vector_width", None)
        values = list(op.results) + [a for r in op.regions for blk in r.blocks for a in blk.args]
        for v in values:
            if isinstance(v.type, TensorType):
                v.type = v.type.with_encoding(None)


def _operand_in(v: Value, enc: LayoutAttr, memo: dict[tuple[Value, LayoutAttr], Value]) -> Value:
    """`v` as a dot operand in `enc`: a convert_layout (dot_op) or a local_alloc (shared) right after v's
    definition, shared by the dots that want the same."""
    key = (v, enc)
    if key not in memo:
        name = "mt.local_alloc" if enc.kind == "shared" else "mt.convert_layout"
        loc = v.defining_op.loc if v.defining_op is not None else None
        new = Operation(name, [v], [v.type.with_encoding(enc)], loc=loc)
        insert_after_definition(v, new)
        memo[key] = new.result
    return memo[key]


def verify_dot_layouts(func: Operation) -> None:
    """Every dot is either untouched (blocked operands, CUDA cores) or consistently on tensor cores."""
    for op in func.walk():
        if op.name != "mt.dot":
            continue
        acc = op.result.type.encoding
        a, b = (v.type.encoding for v in op.operands[:2])
        where = f"dot-lowering of {func.attrs.get('sym_name')}: 'mt.dot' at {op.loc}"
        if acc is None or acc.kind != "mma":
            if any(e is not None and e.kind in ("dot_op", "shared") for e in (a, b)):
                raise ValueError(f"{where}: tensor-core operands without an mma result")
            continue
        if op.operands[2].type.encoding != acc:
            raise ValueError(f"{where}: the accumulator must have the result's layout")
        if not tiles_accumulator(acc, op.result.type.shape):
            raise ValueError(f"{where}: {acc} does not tile {op.result.type}")
        if acc.get("version") == 2:
            k_width = 1 if op.operands[0].type.scalar.name == "f32" else K_WIDTH  # type: ignore[union-attr]
            pairs = a is not None and bool(a.get("kPairs"))
            want = (dot_operand_layout(0, acc, k_width, pairs), dot_operand_layout(1, acc, k_width, pairs))
        else:  # wgmma: both staged, or A in registers (#mt.dot_op of this accumulator)
            a_regs = a is not None and a.kind == "dot_op" and a == dot_operand_layout(0, acc, K_WIDTH)
            want = (a if a_regs or (a is not None and a.kind == "shared") else None,
                    b if b is not None and b.kind == "shared" else None)
        if (a, b) != want or None in want:
            raise ValueError(f"{where}: operands {a}, {b} do not match the result's {acc}")
