"""The op set of the tile IR, declared in one table: what each op means and what it requires.

Each entry is an OpSpec: a one-line meaning, traits, and a `check` function that raises VerifyError when the op is
malformed. The verifier (verifier.py) calls the checks; the interpreter (interpreter/) and the codegen give the ops
their behaviour, following the meanings written here.

Conventions for tile (pre-layout) IR:
- A "tile" is a `tensor<...>` of power-of-two dims; scalars are plain types. Elementwise ops take operands of one
  identical type (the frontend inserts casts, splats and broadcasts), except where noted.
- Integer signedness lives in the type (i32 vs ui32): div, rem, shr, cmp and casts follow it.
- Float math on f16/bf16 is computed in f32 and rounded back to the operand type.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .block_structure import KINDS as BLOCK_KINDS
from .core import Operation
from .types import FunctionType, LayoutAttr, PointerType, ScalarType, TensorDescType, TensorType, Type, with_scalar, i1


class VerifyError(Exception):
    """An op breaks its contract. The message names the op and its source location."""


def fail(op: Operation, msg: str) -> None:
    where = f" at {op.loc}" if op.loc else ""
    raise VerifyError(f"'{op.name}'{where}: {msg}")


@dataclass(frozen=True)
class OpSpec:
    name: str
    doc: str
    check: Callable[[Operation], None]
    pure: bool = True  # no side effects: CSE may merge it and DCE may drop it when unused
    terminator: bool = False
    regions: int = 0  # how many regions the op has; -1: one or more
    traits: frozenset[str] = field(default_factory=frozenset)


OPS: dict[str, OpSpec] = {}


def op(name: str, doc: str, *, pure: bool = True, terminator: bool = False, regions: int = 0,
       traits: tuple[str, ...] = ()) -> Callable[[Callable[[Operation], None]], Callable[[Operation], None]]:
    """Declare an op: the decorated function is its structural check."""

    def register(check: Callable[[Operation], None]) -> Callable[[Operation], None]:
        OPS[name] = OpSpec(name, doc, check, pure, terminator, regions, frozenset(traits))
        return check

    return register


# ----------------------------------------------------------------------------------------------- helpers


def counts(o: Operation, operands: int | tuple[int, ...], results: int | tuple[int, ...]) -> None:
    ok_ops = operands if isinstance(operands, tuple) else (operands,)
    ok_res = results if isinstance(results, tuple) else (results,)
    if len(o.operands) not in ok_ops:
        fail(o, f"expects {' or '.join(map(str, ok_ops))} operands, got {len(o.operands)}")
    if len(o.results) not in ok_res:
        fail(o, f"expects {' or '.join(map(str, ok_res))} results, got {len(o.results)}")


def attr(o: Operation, key: str, kind: type | tuple[type, ...]) -> object:
    if key not in o.attrs:
        fail(o, f"missing attribute '{key}'")
    v = o.attrs[key]
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        fail(o, f"attribute '{key}' = {v!r} has the wrong kind")
    return v


def same_types(o: Operation, types: list[Type], what: str = "operands") -> None:
    if len({strip(t) for t in types}) > 1:
        fail(o, f"{what} must have one type, got {', '.join(map(str, types))}")


def strip(t: Type) -> Type:
    """The type without its layout encoding (layouts may differ only where an op says so)."""
    return t.with_encoding(None) if isinstance(t, TensorType) else t


def shape_of(t: Type) -> tuple[int, ...]:
    return t.shape


def scalar_kind(o: Operation, t: Type, *, floats: bool = True, ints: bool = True, ptrs: bool = False) -> None:
    s = t.scalar
    if isinstance(s, PointerType):
        if not ptrs:
            fail(o, f"does not take pointers, got {t}")
        return
    if s.is_float and not floats:
        fail(o, f"needs integer operands, got {t}")
    if s.is_int and not ints:
        fail(o, f"needs floating-point operands, got {t}")


# ------------------------------------------------------------------------------------------- structure


@op("builtin.module", "The top level; one region holding mt.func kernels.", pure=False, regions=1)
def _module(o: Operation) -> None:
    counts(o, 0, 0)


@op("mt.func", "A kernel. Entry block args are its parameters; attrs sym_name, function_type, arg_names.",
    pure=False, regions=1)
def _func(o: Operation) -> None:
    counts(o, 0, 0)
    attr(o, "sym_name", str)
    ftype = attr(o, "function_type", FunctionType)
    args = o.regions[0].block.args
    if [a.type for a in args] != list(ftype.inputs):  # type: ignore[union-attr]
        fail(o, "entry block arguments do not match function_type")
    names = o.attrs.get("arg_names")
    if names is not None and len(names) != len(args):
        fail(o, "arg_names has the wrong length")


@op("mt.return", "Ends a kernel.", pure=False, terminator=True)
def _return(o: Operation) -> None:
    counts(o, 0, 0)


# -------------------------------------------------------------------------------------- values, indices


@op("mt.constant", "A number (attr `value`: int, float or bool); a tensor result holds it in every element.")
def _constant(o: Operation) -> None:
    counts(o, 0, 1)
    v = attr(o, "value", (int, float, bool))
    s = o.result.type.scalar
    if isinstance(s, PointerType):
        fail(o, "constants cannot be pointers")
    if isinstance(v, float) and not s.is_float:
        fail(o, f"float value {v} for integer type {s}")


@op("mt.program_id", "The program's index along grid axis `axis` (0, 1 or 2), as i32.")
def _program_id(o: Operation) -> None:
    counts(o, 0, 1)
    if attr(o, "axis", int) not in (0, 1, 2):
        fail(o, "axis must be 0, 1 or 2")
    if o.result.type != ScalarType("i32"):
        fail(o, "result must be i32")


OPS["mt.num_programs"] = OpSpec("mt.num_programs", "The grid's size along axis `axis`, as i32.", _program_id)


@op("mt.arange", "tensor<N x i32> holding start, start+1, ..., end-1 (attrs start, end; N a power of two).")
def _arange(o: Operation) -> None:
    counts(o, 0, 1)
    start, end = attr(o, "start", int), attr(o, "end", int)
    t = o.result.type
    if not isinstance(t, TensorType) or t.shape != (end - start,) or t.element != ScalarType("i32"):  # type: ignore
        fail(o, f"result must be tensor<{end - start}xi32>")  # type: ignore[operator]


# -------------------------------------------------------------------------------------------- shapes


@op("mt.splat", "A tensor holding the scalar operand in every element.")
def _splat(o: Operation) -> None:
    counts(o, 1, 1)
    src, res = o.operands[0].type, o.result.type
    if src.is_tensor or not res.is_tensor or src != res.scalar:
        fail(o, f"splats a scalar to a tensor of its type, got {src} -> {res}")


@op("mt.broadcast", "Repeats size-1 dims of the operand to the result's shape (same rank).")
def _broadcast(o: Operation) -> None:
    counts(o, 1, 1)
    src, res = o.operands[0].type, o.result.type
    if not (src.is_tensor and res.is_tensor) or len(src.shape) != len(res.shape) or src.scalar != res.scalar:
        fail(o, f"bad broadcast {src} -> {res}")
    for a, b in zip(src.shape, res.shape):
        if a != b and a != 1:
            fail(o, f"cannot broadcast {src} to {res}")


@op("mt.expand_dims", "Inserts a dim of size 1 at attr `axis`.")
def _expand_dims(o: Operation) -> None:
    counts(o, 1, 1)
    axis = attr(o, "axis", int)
    src, res = o.operands[0].type, o.result.type
    shape = list(src.shape)
    shape.insert(axis, 1)  # type: ignore[arg-type]
    if not src.is_tensor or tuple(shape) != res.shape or src.scalar != res.scalar:
        fail(o, f"bad expand_dims {src} -> {res} at axis {axis}")


@op("mt.reshape", "The same elements in row-major order, in the result's shape.")
def _reshape(o: Operation) -> None:
    counts(o, 1, 1)
    src, res = o.operands[0].type, o.result.type
    if not (src.is_tensor and res.is_tensor) or src.numel != res.numel or src.scalar != res.scalar:  # type: ignore
        fail(o, f"bad reshape {src} -> {res}")


@op("mt.trans", "Permutes dims: result dim i is operand dim order[i] (attr `order`).")
def _trans(o: Operation) -> None:
    counts(o, 1, 1)
    order = list(attr(o, "order", (list, tuple)))  # type: ignore[arg-type]
    src, res = o.operands[0].type, o.result.type
    if sorted(order) != list(range(len(src.shape))) or tuple(src.shape[i] for i in order) != res.shape:
        fail(o, f"bad trans {src} -> {res} with order {order}")


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@op("mt.extract_slice", "The sub-tile operand[offsets[0]:offsets[0]+sizes[0], ...] (attrs `offsets`, `sizes`, one "
    "per dim, compile-time): every size a power of two, every offset a multiple of its size, the slice inside the "
    "operand; the result's shape is `sizes`.")
def _extract_slice(o: Operation) -> None:
    counts(o, 1, 1)
    offsets = list(attr(o, "offsets", (list, tuple)))  # type: ignore[arg-type]
    sizes = list(attr(o, "sizes", (list, tuple)))  # type: ignore[arg-type]
    src, res = o.operands[0].type, o.result.type
    if not (src.is_tensor and res.is_tensor) or src.scalar != res.scalar or tuple(sizes) != res.shape \
            or len(offsets) != len(src.shape):
        fail(o, f"bad extract_slice {src} -> {res} with offsets {offsets}, sizes {sizes}")
    for off, size, extent in zip(offsets, sizes, src.shape):
        if not _is_pow2(size) or off % size or not 0 <= off <= extent - size:
            fail(o, f"extract_slice of {size} elements at {off} from {extent}: sizes must be powers of two, "
                 "offsets multiples of them, inside the operand")


@op("mt.concat", "The operands (tiles of one type, a power-of-two count of them) laid end to end along attr `axis`: "
    "operand i fills result[..., i*n:(i+1)*n, ...] with n the operands' extent along axis.")
def _concat(o: Operation) -> None:
    axis = attr(o, "axis", int)
    n = len(o.operands)
    counts(o, n, 1)
    if not _is_pow2(n) or n < 2:
        fail(o, f"concat needs a power-of-two count (at least 2) of operands, got {n}")
    same_types(o, [v.type for v in o.operands])
    src, res = o.operands[0].type, o.result.type
    if not (src.is_tensor and res.is_tensor) or not 0 <= axis < len(src.shape) or src.scalar != res.scalar:
        fail(o, f"bad concat of {src} along {axis} -> {res}")
    want = tuple(s * n if d == axis else s for d, s in enumerate(src.shape))
    if want != res.shape:
        fail(o, f"concat of {n} x {src} along {axis} gives shape {want}, not {res.shape}")


@op("mt.convert_layout", "The same tile in another layout encoding (inserted by the tiling pass; the values do not "
    "change, only which thread holds which element).")
def _convert_layout(o: Operation) -> None:
    counts(o, 1, 1)
    src, res = o.operands[0].type, o.result.type
    if not (src.is_tensor and res.is_tensor) or strip(src) != strip(res):
        fail(o, f"converts a tile to the same shape and element type, got {src} -> {res}")


@op("mt.local_alloc", "A copy of the operand tile in shared memory, laid out as the result's `#mt.shared` encoding "
    "says (inserted by the dot-lowering pass for wgmma operands; the values do not change).")
def _local_alloc(o: Operation) -> None:
    counts(o, 1, 1)
    src, res = o.operands[0].type, o.result.type
    if not (src.is_tensor and res.is_tensor) or strip(src) != strip(res):
        fail(o, f"copies a tile to the same shape and element type, got {src} -> {res}")
    if res.encoding is None or res.encoding.kind != "shared":  # type: ignore[union-attr]
        fail(o, f"result must have a #mt.shared encoding, got {res}")


# ------------------------------------------------------------------------ software pipelining (passes/pipeline.py)


def _ring_of(o: Operation) -> TensorType:
    ring = o.operands[0].type
    if not isinstance(ring, TensorType) or len(ring.shape) < 2:
        fail(o, f"first operand must be a ring buffer tensor<STAGES x ...>, got {ring}")
    return ring  # type: ignore[return-value]


def _slot_operand(o: Operation, index: int) -> None:
    t = o.operands[index].type
    if not isinstance(t, ScalarType) or not t.is_int:
        fail(o, f"the slot must be an integer scalar, got {t}")


@op("mt.alloc_ring", "A shared-memory ring buffer of `stages` slots, tensor<STAGES x ...>: slot s holds one tile "
    "(the leading dim is the stage); its contents start undefined (the interpreter: zeros). Each execution is a "
    "new buffer.", pure=False)
def _alloc_ring(o: Operation) -> None:
    counts(o, 0, 1)
    t = o.result.type
    stages = attr(o, "stages", int)
    if not isinstance(t, TensorType) or len(t.shape) < 2 or t.shape[0] != stages or stages < 2:
        fail(o, f"result must be tensor<{stages}x...> with at least 2 stages, got {t}")


@op("mt.async_copy", "Starts copying the pointees of a tile of pointers into slot `slot` of a ring; operands (ring, "
    "slot, ptr[, mask]). Masked-off lanes write 0 (cp.async's zero fill). The copy joins the current group; it is "
    "complete once an mt.async_wait has left fewer groups pending than were committed after it. TMA form: operands "
    "(ring, slot, desc, row, col, valid), see _tma_ring_copy.", pure=False)
def _async_copy(o: Operation) -> None:
    if len(o.operands) > 2 and isinstance(o.operands[2].type, TensorDescType):
        _tma_ring_copy(o)
        return
    counts(o, (3, 4), 0)
    ring = _ring_of(o)
    _slot_operand(o, 1)
    p = o.operands[2].type
    if not p.is_pointer or tuple(shape_of(p)) != tuple(ring.shape[1:]) or p.scalar.pointee != ring.scalar:  # type: ignore
        fail(o, f"copies a tile of pointers to {ring.scalar} of shape {list(ring.shape[1:])}, got {p}")
    if len(o.operands) > 3 and strip(o.operands[3].type) != strip(with_scalar(p, i1)):
        fail(o, f"mask must be {with_scalar(p, i1)}")


def _tma_ring_copy(o: Operation) -> None:
    """The TMA form of mt.async_copy (passes/pipeline.py, rings read in place by wgmma): operands (ring, slot, desc,
    row, col, valid): one thread copies the tile whose first element is (row, col) of the descriptor's tensor into
    the slot, in the descriptor's boxes (zeros outside the tensor), completing on the slot's mbarrier (the ring has
    attr `tma_barriers`); nothing when `valid` is false. Not part of a cp.async group: an mt.async_wait with
    operands (ring, slot, phase) waits for it."""
    counts(o, 6, 0)
    ring = _ring_of(o)
    _slot_operand(o, 1)
    desc: TensorDescType = o.operands[2].type  # type: ignore[assignment]
    if desc.element != ring.scalar:
        fail(o, f"a descriptor of {desc.element} cannot fill a ring of {ring.scalar}")
    for i in (3, 4):
        _slot_operand(o, i)
    if o.operands[5].type != i1:
        fail(o, f"valid must be i1, got {o.operands[5].type}")


@op("mt.async_commit", "Closes the current group of mt.async_copy ops (cp.async.commit_group).", pure=False)
def _async_commit(o: Operation) -> None:
    counts(o, 0, 0)


@op("mt.async_wait", "Waits until at most `pending` committed groups of async copies are incomplete "
    "(cp.async.wait_group pending), then makes their data visible to the whole block. With operands (ring, slot, "
    "phase) instead (TMA rings): waits until the TMA copies into the slot of the fill whose phase parity is `phase` "
    "(fill j of a slot has parity j % 2) landed; with attr `barrier`, then a block barrier; with attr `empty` "
    "(warp-specialized rings, passes/warp_specialize.py), waits instead until the consumers released the slot "
    "(the ring's empty barriers, see mt.ring_release) for the phase of that parity.", pure=False)
def _async_wait(o: Operation) -> None:
    if o.operands:  # the TMA form: (ring, slot, phase): the slot's mbarrier completed the phase of that parity
        counts(o, 3, 0)
        _ring_of(o)
        _slot_operand(o, 1)
        _slot_operand(o, 2)
        return
    _pending_count(o)


def _pending_count(o: Operation) -> None:
    """A wait op: no operands or results, attr `pending` >= 0."""
    counts(o, 0, 0)
    pending = attr(o, "pending", int)
    if pending < 0:  # type: ignore[operator]
        fail(o, f"pending must be >= 0, got {pending}")


@op("mt.local_load", "Reads slot `slot` of a ring buffer as a tile (in the result's layout); operands (ring, slot). "
    "The slot's group must have been waited for.", pure=False)
def _local_load(o: Operation) -> None:
    _one_slot(o)


def _one_slot(o: Operation) -> TensorType:
    """Checks (ring, slot) -> one slot of the ring; returns the ring's type."""
    counts(o, 2, 1)
    ring = _ring_of(o)
    _slot_operand(o, 1)
    res = o.result.type
    if not isinstance(res, TensorType) or tuple(res.shape) != tuple(ring.shape[1:]) or res.scalar != ring.scalar:
        fail(o, f"result must be one slot, tensor<{'x'.join(map(str, ring.shape[1:]))}x{ring.scalar}>, got {res}")
    return ring


@op("mt.ring_slot", "Slot `slot` of a ring buffer as a shared-memory tile (a view: no data moves; operands (ring, "
    "slot)); the result's `#mt.shared` encoding says how the slot is laid out (with operand = 2 the view is the "
    "slot transposed: B of a dot whose slot holds B^T). A wgmma mt.dot reads it in place. "
    "The slot's group must have been waited for, and the slot is not rewritten before the dot that reads it retired.",
    pure=False)
def _ring_slot(o: Operation) -> None:
    res = o.result.type
    if isinstance(res, TensorType) and res.encoding is not None and res.encoding.get("operand") == 2:
        ring = _ring_of(o)  # B^T: the view is the slot transposed (wgmma reads the [N, K] slot K-major)
        _slot_operand(o, 1)
        if tuple(res.shape) != tuple(ring.shape[1:])[::-1] or res.scalar != ring.scalar:
            fail(o, f"a B^T view (operand = 2) is one slot transposed, "
                    f"tensor<{'x'.join(map(str, ring.shape[1:][::-1]))}x{ring.scalar}>, got {res}")
    else:
        ring = _one_slot(o)
    if ring.encoding is not None and (res.encoding is None or res.encoding.kind != "shared"):
        fail(o, f"a slot of a ring with a layout has a #mt.shared encoding, got {res}")


@op("mt.dot_wait", "Waits until at most `pending` groups of asynchronous dots (an mt.dot with attr `async_groups`: "
    "wgmma.commit_group / wgmma.wait_group) are still running; their results are readable after it.", pure=False)
def _dot_wait(o: Operation) -> None:
    _pending_count(o)


# ---------------------------------------------------------------------- warp specialization


@op("mt.warp_specialize", "Runs its regions at once, each on warps of its own (partitions; minitriton/ir/partitions.py "
    "places them): attrs `warps` (per partition, powers of two; partition 0 is the default partition, the "
    "kernel's num_warps) and `registers` (per partition: the setmaxnreg count, 0 for none). Each region ends in "
    "scf.yield and sees the values defined before the op; tiles do not cross into a partition (scalars, "
    "pointers, descriptors and rings do). Partitions talk through rings (mt.alloc_ring): full and empty "
    "mbarriers per slot. Nothing follows the op but the kernel's return.", pure=False, regions=-1)
def _warp_specialize(o: Operation) -> None:
    from .partitions import place

    counts(o, 0, 0)
    warps, registers = attr(o, "warps", (list, tuple)), attr(o, "registers", (list, tuple))
    if len(o.regions) != len(warps):  # type: ignore[arg-type]
        fail(o, f"has {len(o.regions)} regions for {len(warps)} partitions")  # type: ignore[arg-type]
    try:
        place(list(warps), list(registers))  # type: ignore[arg-type]
    except ValueError as e:
        fail(o, str(e))
    for region in o.regions:
        _yields(o, region.block, [])


@op("mt.ring_store", "Writes a tile into slot `slot` of a ring (operands (ring, slot, tile)), then announces the "
    "fill on the slot's full barrier (each storing thread arrives: the ring's `full_arrivals` counts them). "
    "The writer waited for the slot to be empty first (mt.async_wait {empty}).", pure=False)
def _ring_store(o: Operation) -> None:
    counts(o, 3, 0)
    ring = _ring_of(o)
    _slot_operand(o, 1)
    t = o.operands[2].type
    if not isinstance(t, TensorType) or tuple(t.shape) != tuple(ring.shape[1:]) or t.scalar != ring.scalar:
        fail(o, f"stores one slot, tensor<{'x'.join(map(str, ring.shape[1:]))}x{ring.scalar}>, got {t}")


@op("mt.ring_release", "Consumers release slot `slot` of a TMA ring (operands (ring, slot, valid)): one arrival "
    "per consumer warpgroup on the slot's empty barrier (the ring has attr `empty_arrivals`), made after the "
    "warpgroup's dots reading the slot retired; the producer's mt.async_wait {empty} waits for it. Nothing when "
    "`valid` is false.", pure=False)
def _ring_release(o: Operation) -> None:
    counts(o, 3, 0)
    _ring_of(o)
    _slot_operand(o, 1)
    if o.operands[2].type != i1:
        fail(o, f"valid must be i1, got {o.operands[2].type}")


# -------------------------------------------------------------------------------------------- memory


@op("mt.addptr", "Pointer plus an integer offset counted in elements of the pointee (elementwise).")
def _addptr(o: Operation) -> None:
    counts(o, 2, 1)
    p, off = o.operands[0].type, o.operands[1].type
    if not p.is_pointer or off.scalar.is_pointer or not off.scalar.is_int or shape_of(p) != shape_of(off):  # type: ignore
        fail(o, f"adds an integer offset of the pointer's shape to a pointer, got {p}, {off}")
    if strip(o.result.type) != strip(p):
        fail(o, "result must have the pointer's type")


# PTX cache operators of a global load (Triton's `cache_modifier` spellings): .ca caches in L1 and L2, .cg in L2
# only (skips L1), .cs streams (evict first), .lu is the last use, .cv re-fetches (volatile-like)
CACHE_MODIFIERS = (".ca", ".cg", ".cs", ".lu", ".cv")
# Bytes the L2 fetches from DRAM on a global load's miss (`ld.global.L2::256B`): the line pair around it, so a
# stream that reads its rows 128 bytes at a time has its next line on the way without another request in flight
L2_PREFETCH_BYTES = (64, 128, 256)
PREFETCH_LEVELS = ("L1", "L2")
CACHE_LINE_BYTES = 128  # what one mt.prefetch brings in (the tiling pass and the codegen size runs by it)


@op("mt.load", "Reads pointee values; operands (ptr[, mask[, other]]). Masked-off lanes give `other` (else 0). "
    "Optional attr `cache_modifier` (one of CACHE_MODIFIERS): the PTX cache operator of the global load. Optional "
    "attr `l2_prefetch` (one of L2_PREFETCH_BYTES): the bytes the L2 fetches on a miss. Optional attr `layout` "
    "(#mt.blocked): the layout the tiling pass gives the load instead of the coalesced one.", pure=False)
def _load(o: Operation) -> None:
    counts(o, (1, 2, 3), 1)
    p = o.operands[0].type
    if not p.is_pointer:
        fail(o, f"first operand must be a pointer, got {p}")
    if "cache_modifier" in o.attrs and attr(o, "cache_modifier", str) not in CACHE_MODIFIERS:
        fail(o, f"cache_modifier must be one of {', '.join(CACHE_MODIFIERS)}, got {o.attrs['cache_modifier']!r}")
    _explicit_layout(o, p)
    if "l2_prefetch" in o.attrs and attr(o, "l2_prefetch", int) not in L2_PREFETCH_BYTES:
        fail(o, f"l2_prefetch must be one of {', '.join(map(str, L2_PREFETCH_BYTES))}, got {o.attrs['l2_prefetch']!r}")
    want = with_scalar(p, p.scalar.pointee)  # type: ignore[union-attr]
    if strip(o.result.type) != strip(want):
        fail(o, f"result must be {want}")
    if len(o.operands) > 1 and strip(o.operands[1].type) != strip(with_scalar(p, i1)):
        fail(o, f"mask must be {with_scalar(p, i1)}")
    if len(o.operands) > 2 and strip(o.operands[2].type) != strip(want):
        fail(o, f"other must be {want}")


def _explicit_layout(o: Operation, p: Type) -> None:
    """An explicit `layout` attr (mt.load / mt.store): a #mt.blocked of the pointer tile's rank."""
    enc = o.attrs.get("layout")
    if enc is not None and (not p.is_tensor or not isinstance(enc, LayoutAttr) or enc.kind != "blocked"
                            or len(enc.get("order")) != len(p.shape)):  # type: ignore[union-attr]
        fail(o, f"attr layout must be a #mt.blocked layout of the pointer tile's rank, got {enc}")


@op("mt.store", "Writes values; operands (ptr, value[, mask]). Masked-off lanes write nothing. Optional attr "
    "`layout` as mt.load's.", pure=False)
def _store(o: Operation) -> None:
    counts(o, (2, 3), 0)
    p, v = o.operands[0].type, o.operands[1].type
    _explicit_layout(o, p)
    if not p.is_pointer or strip(v) != strip(with_scalar(p, p.scalar.pointee)):  # type: ignore[union-attr]
        fail(o, f"stores {p} <- {v}: value must match the pointee and shape")
    if len(o.operands) > 2 and strip(o.operands[2].type) != strip(with_scalar(p, i1)):
        fail(o, f"mask must be {with_scalar(p, i1)}")


@op("mt.prefetch", "A hint: brings the memory lines holding the pointees into the cache level attr `level` (\"L1\" "
    "or \"L2\"); operands (ptr[, mask]). Reads nothing into the program and changes no value; masked-off lanes "
    "touch nothing. Enabled lanes must point at valid elements, as for mt.load (the interpreter checks them).",
    pure=False)
def _prefetch(o: Operation) -> None:
    counts(o, (1, 2), 0)
    p = o.operands[0].type
    if not p.is_pointer:
        fail(o, f"first operand must be a pointer, got {p}")
    if len(o.operands) > 1 and strip(o.operands[1].type) != strip(with_scalar(p, i1)):
        fail(o, f"mask must be {with_scalar(p, i1)}")
    if attr(o, "level", str) not in PREFETCH_LEVELS:
        fail(o, f"level must be one of {', '.join(PREFETCH_LEVELS)}, got {o.attrs['level']!r}")


@op("mt.barrier", "Every thread of the program waits here; global and shared memory writes issued before it are "
    "visible to all of the program's threads after it (bar.sync with its memory ordering).", pure=False)
def _barrier(o: Operation) -> None:
    counts(o, 0, 0)


FENCE_SEMANTICS = ("acq_rel", "release", "acquire")


@op("mt.fence", "A GPU-scope memory fence in each thread, attr `sem` one of FENCE_SEMANTICS (fence.<sem>.gpu): "
    "release orders the thread's accesses before it before its writes after it, acquire its reads before it "
    "before its accesses after it (on Hopper it invalidates the SM's L1), acq_rel both, for every program on the "
    "device. With atomics it makes a flag between programs: writes; mt.barrier; fence release; atomic signal, and "
    "atomic poll; fence acquire; reads.", pure=False)
def _fence(o: Operation) -> None:
    counts(o, 0, 0)
    if attr(o, "sem", str) not in FENCE_SEMANTICS:
        fail(o, f"sem must be one of {', '.join(FENCE_SEMANTICS)}, got {o.attrs['sem']!r}")


@op("mt.griddep_wait", "Programmatic dependent launch: waits until the grids the launch depends on (the previous "
    "kernel in the stream) have completed and their memory is visible (griddepcontrol.wait). A kernel holding it is "
    "launched with programmatic stream serialization: it may start while the previous kernel runs.", pure=False)
def _griddep_wait(o: Operation) -> None:
    counts(o, 0, 0)


@op("mt.griddep_launch", "Programmatic dependent launch: this program no longer holds back the next kernel in the "
    "stream from starting (griddepcontrol.launch_dependents); that kernel's mt.griddep_wait still waits for this "
    "whole grid to complete.", pure=False)
def _griddep_launch(o: Operation) -> None:
    counts(o, 0, 0)


@op("mt.atomic_add", "Atomically adds `value` at ptr and returns the old values; (ptr, value[, mask]).", pure=False)
def _atomic_add(o: Operation) -> None:
    counts(o, (2, 3), 1)
    _store(Operation("mt.store", o.operands, [], loc=o.loc))
    if strip(o.result.type) != strip(o.operands[1].type):
        fail(o, "result must have the value's type")


# ------------------------------------------------------------------------------- tensor descriptors (TMA)


def _descriptor_operands(o: Operation, extra: int) -> TensorDescType:
    """Check (desc, c_0 .. c_{rank-1}, *extra): a descriptor then one i32 coordinate per block dim."""
    if not o.operands or not isinstance(o.operands[0].type, TensorDescType):
        fail(o, f"first operand must be a !mt.tensordesc, got {o.operands[0].type if o.operands else 'nothing'}")
    desc: TensorDescType = o.operands[0].type  # type: ignore[assignment]
    rank = len(desc.block_shape)
    if len(o.operands) != 1 + rank + extra:
        fail(o, f"expects the descriptor, {rank} coordinates{' and a tile' if extra else ''}, "
                f"got {len(o.operands)} operands")
    for v in o.operands[1:1 + rank]:
        if v.type != ScalarType("i32"):
            fail(o, f"coordinates must be i32 scalars, got {v.type}")
    return desc


@op("mt.descriptor_load", "Reads the box of the descriptor's block shape whose first element sits at the coordinates "
    "(operands after the descriptor: i32 element offsets, outermost dim first) of the global tensor the descriptor "
    "describes. Elements outside the tensor (a coordinate < 0 or >= that dim's extent) read as 0 (TMA zero fill). "
    "The result is the block's tensor type.", pure=False)
def _descriptor_load(o: Operation) -> None:
    desc = _descriptor_operands(o, 0)
    if len(o.results) != 1 or strip(o.result.type) != desc.block:
        fail(o, f"result must be {desc.block}")


@op("mt.descriptor_store", "Writes the tile (last operand: the descriptor's block type, or a whole number of blocks "
    "along each dim, stored as that many boxes) into the tensor from the coordinates on (as mt.descriptor_load); "
    "elements outside the global tensor are not written (TMA clips).", pure=False)
def _descriptor_store(o: Operation) -> None:
    desc = _descriptor_operands(o, 1)
    counts(o, len(o.operands), 0)
    t = o.operands[-1].type
    block = desc.block
    if not isinstance(t, TensorType) or t.scalar != block.scalar or len(t.shape) != len(block.shape) \
            or any(n % b for n, b in zip(t.shape, block.shape)):
        fail(o, f"the stored tile must be {block} or a whole number of such blocks along each dim, got {t}")


# ---------------------------------------------------------------------------------------- elementwise


def _elementwise(o: Operation, n: int, **kinds: bool) -> None:
    counts(o, n, 1)
    types = [v.type for v in o.operands] + [o.result.type]
    same_types(o, types, "operands and result")
    scalar_kind(o, types[0], **kinds)


def _binary(name: str, doc: str, **kinds: bool) -> None:
    OPS[name] = OpSpec(name, doc, lambda o: _elementwise(o, 2, **kinds), traits=frozenset({"elementwise"}))


def _unary(name: str, doc: str, **kinds: bool) -> None:
    OPS[name] = OpSpec(name, doc, lambda o: _elementwise(o, 1, **kinds), traits=frozenset({"elementwise"}))


_binary("mt.add", "a + b (integers wrap).")
_binary("mt.sub", "a - b (integers wrap).")
_binary("mt.mul", "a * b (integers wrap).")
_binary("mt.div", "a / b: IEEE division for floats, truncation toward zero for integers (C semantics).")
_binary("mt.rem", "Remainder with the sign of a (C fmod / %); x % 0 is undefined for integers.")
_binary("mt.maximum", "max(a, b); for floats a NaN operand yields the other operand (PTX max.f32).")
_binary("mt.minimum", "min(a, b); for floats a NaN operand yields the other operand (PTX min.f32).")
_binary("mt.and", "Bitwise and (logical for i1).", floats=False)
_binary("mt.or", "Bitwise or (logical for i1).", floats=False)
_binary("mt.xor", "Bitwise xor (logical for i1).", floats=False)
_binary("mt.shl", "a << b; shifts of the bit width or more give 0.", floats=False)
_binary("mt.shr", "a >> b: arithmetic for signed, logical for unsigned types; over-wide shifts saturate.",
        floats=False)
_binary("mt.pow", "a ** b for floats.", ints=False)
_unary("mt.neg", "-a.")
_unary("mt.not", "Bitwise not (~a; logical not for i1).", floats=False)
_unary("mt.abs", "|a|.")
for _name, _doc in [
    ("exp", "e ** a"), ("exp2", "2 ** a"), ("log", "natural log"), ("log2", "log base 2"), ("sqrt", "square root"),
    ("rsqrt", "1 / sqrt(a)"), ("sigmoid", "1 / (1 + exp(-a))"), ("sin", "sine"), ("cos", "cosine"),
    ("tanh", "hyperbolic tangent"), ("floor", "round toward -inf"), ("ceil", "round toward +inf"),
    ("erf", "error function"),
]:
    _unary(f"mt.{_name}", f"{_doc} (floats; f16/bf16 computed in f32).", ints=False)


@op("mt.fma", "a * b + c, fused (one rounding) for floats.", traits=("elementwise",))
def _fma(o: Operation) -> None:
    _elementwise(o, 3, ints=False)


CMP_PREDICATES = ("eq", "ne", "lt", "le", "gt", "ge")


@op("mt.cmp", "Compares a and b with attr `predicate` (eq ne lt le gt ge); i1 result of the operands' shape.",
    traits=("elementwise",))
def _cmp(o: Operation) -> None:
    counts(o, 2, 1)
    same_types(o, [v.type for v in o.operands])
    if attr(o, "predicate", str) not in CMP_PREDICATES:
        fail(o, f"predicate must be one of {CMP_PREDICATES}")
    if strip(o.result.type) != strip(with_scalar(o.operands[0].type, i1)):
        fail(o, "result must be i1 of the operands' shape")


@op("mt.select", "cond ? a : b elementwise; cond is i1 of the same shape.", traits=("elementwise",))
def _select(o: Operation) -> None:
    counts(o, 3, 1)
    c, a, b = (v.type for v in o.operands)
    same_types(o, [a, b, o.result.type], "values and result")
    if strip(c) != strip(with_scalar(a, i1)):
        fail(o, f"condition must be {with_scalar(a, i1)}, got {c}")


@op("mt.cast", "Converts values to the result's element type: floats round to nearest even, float -> int truncates "
    "toward zero and saturates (NaN -> 0), int -> int wraps, x -> i1 is x != 0.", traits=("elementwise",))
def _cast(o: Operation) -> None:
    counts(o, 1, 1)
    src, res = o.operands[0].type, o.result.type
    if src.shape != res.shape or src.is_pointer or res.is_pointer:
        fail(o, f"bad cast {src} -> {res}")


@op("mt.bitcast", "Reinterprets the bits as the result's element type (same bit width; pointers <-> i64).",
    traits=("elementwise",))
def _bitcast(o: Operation) -> None:
    counts(o, 1, 1)
    src, res = o.operands[0].type, o.result.type

    def bits(t: Type) -> int:
        return 64 if t.is_pointer else t.scalar.bits  # type: ignore[union-attr]

    if src.shape != res.shape or bits(src) != bits(res):
        fail(o, f"bitcast needs equal bit widths and shapes, got {src} -> {res}")


@op("mt.bitcast_split", "Reinterprets each element as two of half its width (a width-changing bitcast): operand "
    "[..., n] of a 64-, 32- or 16-bit type -> result [..., n, 2] of a 32-, 16- or 8-bit type (16 -> 8: integers "
    "only); result[..., i, 0] holds the low half of operand[..., i]'s bits and result[..., i, 1] the high half "
    "(little-endian, as in memory).")
def _bitcast_split(o: Operation) -> None:
    counts(o, 1, 1)
    src, res = o.operands[0].type, o.result.type
    if not isinstance(src, TensorType) or not isinstance(res, TensorType) or src.is_pointer or res.is_pointer:
        fail(o, f"bitcast_split takes and gives tensors of numbers, got {src} -> {res}")
    narrow_float = src.scalar.bits == 16 and (src.scalar.is_float or res.scalar.is_float)
    if (res.shape != (*src.shape, 2) or src.scalar.bits not in (16, 32, 64) or res.scalar.bits * 2 != src.scalar.bits
            or narrow_float or res.scalar.is_bool):
        fail(o, f"bitcast_split needs [..., n] of 64/32/16 bits -> [..., n, 2] of half the width (16 -> 8 for "
                f"integers), got {src} -> {res}")


# ----------------------------------------------------------------------------------- reductions, dot

REDUCE_KINDS = ("sum", "max", "min")


@op("mt.reduce", "Combines along attr `axis` with attr `kind` (sum max min) in the element type; the axis is "
    "removed (a scalar when none is left).")
def _reduce(o: Operation) -> None:
    counts(o, 1, 1)
    src = o.operands[0].type
    axis = attr(o, "axis", int)
    if attr(o, "kind", str) not in REDUCE_KINDS:
        fail(o, f"kind must be one of {REDUCE_KINDS}")
    if not src.is_tensor or not 0 <= axis < len(src.shape):  # type: ignore[operator]
        fail(o, f"axis {axis} out of range for {src}")
    shape = src.shape[:axis] + src.shape[axis + 1:]  # type: ignore[operator]
    if strip(o.result.type) != strip(TensorType(shape, src.scalar) if shape else src.scalar):
        fail(o, f"result of reducing {src} over axis {axis} must have shape {shape}")


@op("mt.scan", "Inclusive prefix combine along attr `axis` with attr `kind` (sum max min); same type.")
def _scan(o: Operation) -> None:
    counts(o, 1, 1)
    src = o.operands[0].type
    axis = attr(o, "axis", int)
    if attr(o, "kind", str) not in REDUCE_KINDS:
        fail(o, f"kind must be one of {REDUCE_KINDS}")
    if not src.is_tensor or not 0 <= axis < len(src.shape) or strip(src) != strip(o.result.type):  # type: ignore
        fail(o, f"bad scan of {src} over axis {axis}")


DOT_PRECISIONS = ("ieee", "tf32", "tf32x3")
DOT_INSTRUCTIONS = ("auto", "wgmma", "mma", "fma")  # passes/dot_lowering.py CHOICES


@op("mt.dot", "acc + a @ b for 2-D tiles: a MxK, b KxN (f16/bf16/f32, same type), acc MxN f32. Products are exact, "
    "sums in f32. Attr `input_precision`: 'ieee', or 'tf32' (f32 inputs rounded to tf32 first). Optional attrs "
    "`block`, `a_blocks`, `b_blocks` (ir/block_structure.py): the operands are zero outside those blocks (masked "
    "before the dot). "
    "Optional attr `k_chains`: independent accumulation chains per tile over alternating K steps (mma.sync); "
    "`instruction`: auto / wgmma / mma / fma for this dot (passes/dot_lowering.py).")
def _dot(o: Operation) -> None:
    counts(o, 3, 1)
    a, b, c = (v.type for v in o.operands)
    if not all(t.is_tensor and len(t.shape) == 2 for t in (a, b, c)):
        fail(o, "operands must be 2-D tiles")
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2 or c.shape != (m, n) or strip(o.result.type) != strip(c):
        fail(o, f"shape mismatch: {a} @ {b} + {c}")
    if a.scalar != b.scalar or a.scalar.name not in ("f16", "bf16", "f32"):  # type: ignore[union-attr]
        fail(o, f"a and b must both be f16, bf16 or f32, got {a.scalar} and {b.scalar}")
    if c.scalar != ScalarType("f32"):
        fail(o, "the accumulator must be f32")
    if o.attrs.get("input_precision", "ieee") not in DOT_PRECISIONS:
        fail(o, f"input_precision must be one of {DOT_PRECISIONS}")
    if "block" in o.attrs:  # block_structure (ir/block_structure.py): the operands are masked explicitly
        size = attr(o, "block", int)
        for name in ("a_blocks", "b_blocks"):
            if attr(o, name, str) not in BLOCK_KINDS:
                fail(o, f"{name} must be one of {BLOCK_KINDS}")
        if size <= 0 or m % size or k % size or n % size:
            fail(o, f"block {size} must divide M, K and N ({m}, {k}, {n})")
    if "k_chains" in o.attrs and attr(o, "k_chains", int) < 1:  # type: ignore[operator]
        fail(o, "k_chains must be at least 1")
    if "instruction" in o.attrs and attr(o, "instruction", str) not in DOT_INSTRUCTIONS:
        fail(o, f"instruction must be one of {DOT_INSTRUCTIONS}")


# -------------------------------------------------------------------------------------- control flow


@op("scf.for", "for iv in range(lb, ub, step) with carried values: operands (lb, ub, step, *init); the body "
    "block takes (iv, *carried) and ends in scf.yield(*next); results are the final carried values. step > 0.",
    pure=False, regions=1)
def _for(o: Operation) -> None:
    if len(o.operands) < 3:
        fail(o, "needs lb, ub and step")
    lb, ub, step = (v.type for v in o.operands[:3])
    if not (lb == ub == step and isinstance(lb, ScalarType) and lb.is_int):
        fail(o, f"lb, ub and step must be one integer type, got {lb}, {ub}, {step}")
    inits = [v.type for v in o.operands[3:]]
    block = o.regions[0].block
    if [a.type for a in block.args] != [lb] + inits:
        fail(o, "body arguments must be (iv, *carried) matching the operands")
    _yields(o, block, inits)
    if [strip(r.type) for r in o.results] != [strip(t) for t in inits]:
        fail(o, "results must match the carried values")


@op("scf.if", "if cond (i1 scalar): then-region else else-region; each ends in scf.yield of the results.",
    pure=False, regions=2)
def _if(o: Operation) -> None:
    counts(o, 1, tuple(range(len(o.results) + 1)))
    if o.operands[0].type != i1:
        fail(o, f"condition must be an i1 scalar, got {o.operands[0].type}")
    for region in o.regions:
        _yields(o, region.block, [r.type for r in o.results])


@op("scf.while", "Loop: the before-region (args = carried) ends in scf.condition(c, *fwd); if c, the after-region "
    "(args = fwd) ends in scf.yield(*next carried); results are the last fwd.", pure=False, regions=2)
def _while(o: Operation) -> None:
    before, after = o.regions[0].block, o.regions[1].block
    if [a.type for a in before.args] != [v.type for v in o.operands]:
        fail(o, "before-region arguments must match the operands")
    cond = before.terminator
    if cond is None or cond.name != "scf.condition":
        fail(o, "before-region must end in scf.condition")
    fwd = [v.type for v in cond.operands[1:]]  # type: ignore[union-attr]
    if [a.type for a in after.args] != fwd or [r.type for r in o.results] != fwd:
        fail(o, "after-region arguments and results must match scf.condition's forwarded values")
    _yields(o, after, [v.type for v in o.operands])


@op("scf.yield", "Ends a region of scf.for / scf.if / scf.while with its values.", pure=False, terminator=True)
def _yield(o: Operation) -> None:
    counts(o, tuple(range(len(o.operands) + 1)), 0)


@op("scf.condition", "Ends scf.while's before-region: (cond, *forwarded).", pure=False, terminator=True)
def _condition(o: Operation) -> None:
    if not o.operands or o.operands[0].type != i1:
        fail(o, "first operand must be an i1 condition")


def _yields(o: Operation, block, types: list[Type]) -> None:  # type: ignore[no-untyped-def]
    t = block.terminator
    if t is None or t.name != "scf.yield":
        fail(o, "region must end in scf.yield")
    if [strip(v.type) for v in t.operands] != [strip(x) for x in types]:
        fail(o, f"yields ({', '.join(str(v.type) for v in t.operands)}), expected ({', '.join(map(str, types))})")
