"""Pass "pipeline": software pipelining of dot K loops — the loads feeding an mt.dot become asynchronous copies into
a `num_stages`-deep ring of shared-memory slots, issued num_stages - 1 iterations ahead.

Runs after "dot-lowering" (it also works on tile IR without layouts). It rewrites an `scf.for` (lb, ub, step) whose
body block holds `mt.load`s of this form (the candidates):

  %a = mt.load %p, %mask, %zero      %p a carried value (or a convert_layout of one) advanced by
                                     `mt.addptr %p, %inc` in its yield, %inc loop-invariant; %mask (optional) computed from the induction variable and
                                     loop-invariant values only; `other` absent or the constant 0 (cp.async zero-fills)
  ... %a used only as operand a / b of mt.dot (directly, or through the mt.convert_layout / mt.local_alloc that
      stages it for the dot)

and whose pointer rows allow 16-byte copies (axis analysis: the innermost dim contiguous for >= 16 bytes and its
address 16-byte aligned), into (S = num_stages; iteration j's values written _j; iv_j = lb + j * step):

  %ring = mt.alloc_ring {stages = S} : tensor<S x (tile)>                   one per load, before the loop
  prologue, for j in 0 .. S-2:  mt.async_copy %ring[j], %p_j, %mask_j & (iv_j < ub);  mt.async_commit
  scf.for %iv (..., %pf = %p_{S-1}):                                    steady state, iteration i:
      mt.async_wait {pending = S-2}                                     the group of iteration i has landed
      %a = mt.local_load %ring[i % S]                                   replaces the load
      mt.async_copy %ring[(i+S-1) % S], %pf, %mask_{i+S-1} & (iv_{i+S-1} < ub);  mt.async_commit
      ... the old body ...;  yield ..., mt.addptr %pf, %inc
  mt.async_wait {pending = 0}                                           epilogue: drain the last (empty) groups

The loop also carries i, i % S and (i + S - 1) % S (i32; each next value an add, a compare and a select), so no
division or remainder runs per iteration.

A copy whose mask axis analysis proves constant over each 16-byte run gets attr `uniform_runs` (the codegen reads
one lane's predicate per run). On IR with layouts the copies use a copy layout (blocked, 16 / element-size
elements per thread along the rows, so each thread issues whole 16-byte cp.async): the initial pointers and
increments are converted to it once, before the loop; the masks' index math is recomputed in it (through tiling's
convert_layouts; a convert_layout only when it is not simple index math).

Copies past the end of the loop are fully masked (they write zeros and read nothing), so every iteration commits
exactly one group and the wait count is constant. Slot (i+S-1) % S is the one read in iteration i-1, so it is
rewritten only after its last read (the codegen puts a barrier between a slot's reads and its next copy).

Slots read in place by wgmma (the Hopper main loop). When every candidate load of the loop feeds wgmma dots only
(through the mt.local_alloc dot-lowering put in front of them: 16-bit elements, a #mt.mma version 3 result), the
rings are laid out as the wgmma operands (`#mt.shared<{swizzle = S, order = [1, 0], operand = 0 | 1, stages}>`:
A K-major, B MN-major, S = min(128, 2 x the contiguous extent); codegen/wgmma.py) and the dot reads the slot:

  %a = mt.ring_slot %ring[i % S] : #mt.shared<{swizzle = S, order = [1, 0], operand = 0}>   replaces the load and
                                                                                            its mt.local_alloc
and, when the loop holds exactly one dot, both of whose operands are such slots and whose accumulator is only
carried (block arg -> dot -> yield), the dot becomes asynchronous: attr `async_groups = 1` (wgmma.wait_group 1 then a barrier: every warpgroup's dot of the
previous iteration retired, this one still runs), an `mt.dot_wait {pending = 0}` follows the loop, and the
steady-state copies (into slot (i + S - 1) % S, the one iteration i - 1 read) move to right after the dot.
With S >= 4 (DEFERRED_WAIT_STAGES) the copies run S - 2 iterations ahead instead, into slot (i + S - 2) % S, the
one iteration i - 2 read: every thread passed the barrier at the top of iteration i after its wgmma.wait_group 1
of iteration i - 1, so every warpgroup's dot i - 2 has retired. The dot gets attr `deferred_wait` (it ends with
its commit: no wait, no barrier), the copies follow it while it runs, then `mt.dot_wait {pending = 1}`: one
barrier per iteration instead of two, the copies' address math overlapping the wgmmas. Such a
loop carries no prefetch pointers: they are recomputed as %p_0 + (i + S - 1) * %inc (i64 offsets), since a carried
pointer tile keeps every lane's pointer live across the loop while the copies use one per 16 bytes. These
rings may exceed the static limit: they then go to dynamic shared memory (attr `dynamic_offset` on mt.alloc_ring,
func attr `dynamic_shared_memory` their total plus RING_ALIGN of alignment slack), within DYNAMIC_BUDGET less
the static scratch estimate.

Rings too large for static shared memory in a loop whose dots are not wgmma (e.g. FlashKDA's recurrence with
carried pointers) go to dynamic shared memory the same way, within DYNAMIC_BUDGET, and their prefetch pointers are
likewise recomputed from iteration 0's instead of carried (such loops are register-bound).

TMA rings (docs/kernels/gemm.md v2). When such an asynchronous in-place loop's loads (128B-swizzled slots) read
pointer tiles `X_ptr + rows[:, None] * stride + cols[None, :]` (rows / cols `origin + arange`, unit column stride,
moved per iteration by a constant number of columns or a constant times `stride` rows) and the kernel has a
TensorDescType argument `X_tma` whose box is the ring's (codegen/tma.py wgmma_ring_boxes: [8, BLOCK_K] for A,
or [2, 1, 8, BLOCK_K] over A viewed as [M / 64, 8, 8, K] (two row groups a box), [BLOCK_K, 64] for B), the
kernel promises that descriptor describes the same matrix (address, row pitch, and the
bounds the load's mask tests, which TMA's zero fill then replaces), and the ring is filled by TMA instead:

  %ring = mt.alloc_ring {stages = S, tma_barriers}                    one mbarrier per slot (codegen)
  prologue, j < ahead:  mt.async_copy %ring, j, %X_tma, row_j, col_j, (iv_j < ub)     no groups
  scf.for (..., %i, %read, %write, %phase):
      mt.async_wait %ring, %read, %phase  (per ring; the last {barrier}: then a block barrier)
      ... the dot on the slots ...;  mt.async_copy %ring, %write, %X_tma, row_{i+ahead}, col_{i+ahead}, valid
      [mt.dot_wait {pending = 1}]
  mt.dot_wait {pending = 0}                                             every fill was waited for: nothing drains
with row_j = row origin + j * rows per iteration (likewise col_j); %phase (the parity of the slot's fill, i / S
% 2) flips when %read wraps. The slot schedule, and what orders a refill after the dots that read the slot (the
block barrier after the wait, every thread past its wgmma.wait_group of the previous iteration), are the cp.async
ring's.

num_stages: the func attr `num_stages` (the compiler sets it from the launch option, default 3), overridden by an
int attr `num_stages` on the scf.for. Other rings live in static shared memory next to the codegen's scratch
buffer: when S rings do not fit SMEM_BUDGET (DYNAMIC_BUDGET for in-place rings) with an estimate of the scratch
the loop's dots need, S is lowered (down to 2).
With num_stages < 2, no candidate load, or no room for two stages, the loop stays unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

from minitriton.ir import Block, Module, Operation, Value
from minitriton.ir.layouts import blocked_for_shape, slice_of
from minitriton.ir.ops import OPS
from minitriton.ir.types import LayoutAttr, ScalarType, TensorDescType, TensorType, i1, i64, layout, with_scalar

from .axis_info import AxisAnalysis
from .dce import eliminate_dead_code
from .registry import register_pass

DEFAULT_STAGES = 3
# Static shared memory of a kernel (codegen/context.py SMEM_LIMIT): the rings and the codegen's scratch buffer share it.
SMEM_BUDGET = 48 * 1024
COPY_BYTES = 16  # cp.async.cg copies 16 bytes
# Shared memory an sm_90 block may use (227 KB) less what the codegen's scratch buffer and alignment may take.
DYNAMIC_BUDGET = 227 * 1024
RING_ALIGN = 1024  # the 128B swizzle atom
# From this many stages on, an async dot's loop refills the slot read two iterations back: one barrier per iteration.
DEFERRED_WAIT_STAGES = 4
STAGING_OPS = ("mt.convert_layout", "mt.local_alloc")
TMA_SWIZZLE = 128  # TMA-fed rings: the 128B swizzle TMA and wgmma share


@register_pass("pipeline")
def pipeline(module: Module) -> Module:
    """Pipeline the dot K loops of every kernel (see the module docstring)."""
    for func in module.functions:
        if pipeline_function(func):
            eliminate_dead_code(module)  # the replaced loads' masks and the old carried pointers
    return module


def pipeline_function(func: Operation) -> bool:
    """Pipeline the eligible loops of `func`; True when one changed."""
    default = int(func.attrs.get("num_stages", DEFAULT_STAGES))
    analysis = None
    rings = 0  # bytes of the rings already placed in this kernel
    dynamic = 0  # bytes of the rings read in place by wgmma (1024-aligned)
    changed = False
    for loop in [op for op in func.walk() if op.name == "scf.for"]:
        stages = int(loop.attrs.get("num_stages", default))
        if stages < 2:
            continue
        if analysis is None:
            analysis = AxisAnalysis(func)
        loads = [op for op in loop.regions[0].block.ops if _is_candidate(func, loop, op, analysis)]
        if not loads:
            continue
        per_stage = sum(_tile_bytes(load.result.type) for load in loads)  # type: ignore[arg-type]
        direct = [_direct_operand(func, load) for load in loads]
        if all(d is not None for d in direct):
            while stages >= 2 and dynamic + stages * per_stage + RING_ALIGN + _scratch_estimate(loop, direct=True) \
                    > DYNAMIC_BUDGET:
                stages -= 1
            if stages >= 2:
                sources = _tma_sources(func, loop, loads, direct)  # type: ignore[arg-type]
                if sources is not None:
                    dynamic += _pipeline_loop_tma(loop, loads, stages, direct, dynamic, sources)  # type: ignore
                else:
                    dynamic += _pipeline_loop(loop, loads, stages, direct, dynamic,  # type: ignore[arg-type]
                                              _uniform_runs(analysis, loads))
                changed = True
            continue
        static_stages = stages
        while static_stages >= 2 and rings + static_stages * per_stage + _scratch_estimate(loop) > SMEM_BUDGET:
            static_stages -= 1  # a shallower ring rather than none
        if static_stages >= 2:
            _pipeline_loop(loop, loads, static_stages, [None] * len(loads), 0, _uniform_runs(analysis, loads))
            rings += static_stages * per_stage
            changed = True
            continue
        # rings too large for static shared memory (big operand tiles): dynamic shared memory, as in-place rings
        while stages >= 2 and dynamic + stages * per_stage + RING_ALIGN + _scratch_estimate(loop) > DYNAMIC_BUDGET:
            stages -= 1
        if stages >= 2:
            dynamic += _pipeline_loop(loop, loads, stages, [None] * len(loads), dynamic,
                                      _uniform_runs(analysis, loads), planned=True)
            changed = True
    _place_rings(func, rings)
    return changed


def _uniform_runs(analysis: AxisAnalysis, loads: list[Operation]) -> list[bool]:
    """Per load: whether its mask is constant over every 16-byte run (axis analysis), so a copy's src-size is 16
    or 0 from one lane's predicate (attr `uniform_runs` on its mt.async_copy ops)."""
    return [len(ld.operands) > 1 and analysis.info(ld.operands[1]).constancy[-1] % _chunk(ld) == 0 for ld in loads]


def _place_rings(func: Operation, static_rings: int) -> None:
    """Rings read in place go to dynamic shared memory when, with the other rings and the scratch estimate, they
    would not fit the static limit; static otherwise (the PTX simulator and small kernels keep plain variables)."""
    allocs = [op for op in func.walk() if op.name == "mt.alloc_ring" and "planned_offset" in op.attrs]
    if not allocs:
        return
    total = max(int(op.attrs["planned_offset"]) + _tile_bytes(op.result.type) for op in allocs)  # type: ignore
    scratch = max((_scratch_estimate(op, direct=True) for op in func.walk() if op.name == "scf.for"), default=0)
    dynamic = static_rings + total + scratch > SMEM_BUDGET
    for op in allocs:
        offset = op.attrs.pop("planned_offset")
        if dynamic:
            op.attrs["dynamic_offset"] = offset
    if dynamic:  # + RING_ALIGN: the codegen rounds the dynamic base up to it (codegen/async_copy.py)
        func.attrs["dynamic_shared_memory"] = total + RING_ALIGN


def _tile_bytes(t: TensorType) -> int:
    return t.numel * t.scalar.bytes  # type: ignore[union-attr]


def _scratch_estimate(loop: Operation, direct: bool = False) -> int:
    """The scratch shared memory the loop's dots are likely to need besides the rings (codegen's `smem`, reused by
    every lowering): the larger of staging both operands (padded / 1024-aligned) and moving the f32 accumulator
    between layouts (rows padded by 16 bytes); when `direct` (the dots read the ring slots), only the accumulator's
    conversion, within the static limit."""
    need = 0
    for op in loop.walk():
        if op.name == "mt.dot":
            a, b, acc = (v.type for v in op.operands[:3])
            (m, k), n = a.shape, b.shape[1]  # type: ignore[union-attr]
            if direct:  # only the accumulator's conversion (codegen/layout_moves.py): unpadded, in pieces
                need = max(need, _conversion_scratch(m * n * acc.scalar.bytes))  # type: ignore[union-attr]
                continue
            operands = (m + 16) * k * a.scalar.bytes + (k + 16) * n * b.scalar.bytes + 1024  # type: ignore
            need = max(need, operands, m * (n * acc.scalar.bytes + 16))  # type: ignore[union-attr]
    return need


def _conversion_scratch(nbytes: int) -> int:
    """The scratch a layout conversion of an `nbytes` tile takes: all of it when it fits the static limit, else
    the power-of-two pieces both exchanges (codegen/layout_moves.py) move it in (32 KB of the 48)."""
    return nbytes if nbytes <= SMEM_BUDGET else 1 << (SMEM_BUDGET.bit_length() - 1)


def _direct_operand(func: Operation, load: Operation) -> tuple[int, int] | None:
    """(wgmma operand index, swizzle) when the load feeds only wgmma dots, as the same operand, through
    mt.local_alloc: its ring can be laid out as that operand and read in place. None otherwise."""
    t: TensorType = load.result.type  # type: ignore[assignment]
    if t.encoding is None or t.scalar.bytes != 2:  # type: ignore[union-attr]
        return None
    index = set()
    for user, _ in _users(func, load.result):
        if user.name != "mt.local_alloc":
            return None
        for dot, i in _users(func, user.result):
            enc = dot.result.type.encoding if dot.name == "mt.dot" else None  # type: ignore[union-attr]
            if enc is None or enc.kind != "mma" or enc.get("version") != 3 or i > 1:
                return None
            index.add(i)
    if len(index) != 1:
        return None
    operand = index.pop()
    contiguous = t.shape[1]
    swizzle = min(128, 2 * contiguous)
    if swizzle < 32 or (2 * contiguous) % swizzle:
        return None
    if operand == 1 and min(contiguous, 256) % (swizzle // 2):
        return None
    return operand, swizzle


# ---------------------------------------------------------------------------------------------- matching


class _Body:
    """Questions about values relative to one loop's body block."""

    def __init__(self, loop: Operation):
        self.loop = loop
        self.block: Block = loop.regions[0].block
        self.iv = self.block.args[0]

    def inside(self, v: Value) -> bool:
        op = v.defining_op
        if op is None:
            return v.owner is self.block
        while op is not None:
            if op is self.loop:
                return True
            op = op.parent_op
        return False

    def cloneable(self, v: Value, iv_ok: bool) -> bool:
        """Whether `v` is loop-invariant or pure ops on invariants (and the induction variable when iv_ok)."""
        if not self.inside(v):
            return True
        if v is self.iv:
            return iv_ok
        op = v.defining_op
        if op is None or op.parent is not self.block or op.regions:
            return False
        spec = OPS.get(op.name)
        return spec is not None and spec.pure and all(self.cloneable(o, iv_ok) for o in op.operands)

    def carried_index(self, v: Value) -> int | None:
        """The carried slot of a body argument (0-based among carried values), else None."""
        if v.owner is self.block and v is not self.iv:
            return self.block.args.index(v) - 1
        return None


def _is_candidate(func: Operation, loop: Operation, op: Operation, analysis: AxisAnalysis) -> bool:
    if op.name != "mt.load" or not isinstance(op.result.type, TensorType) or len(op.result.type.shape) != 2:
        return False
    body = _Body(loop)
    ptr = _through_converts(op.operands[0])  # the copies convert the pointers to their own layout anyway
    if body.carried_index(ptr) is None or _increment(body, ptr) is None:
        return False
    if len(op.operands) > 1 and not (body.cloneable(op.operands[1], iv_ok=True)
                                     and _prefix_mask(analysis, op.operands[1], _chunk(op))):
        return False
    if len(op.operands) > 2 and not _is_zero(op.operands[2]):
        return False
    return _feeds_dot_only(func, op.result) and _rows_copyable(analysis, op, ptr)


def would_ring(func: Operation, loop: Operation, load: Operation, analysis: AxisAnalysis) -> bool:
    """`_is_candidate` on IR that still has tiling's convert_layouts between values (for dot-lowering, which asks
    before it re-solves the layouts): the same tests, looking through convert_layout."""
    if load.name != "mt.load" or not isinstance(load.result.type, TensorType) or len(load.result.type.shape) != 2:
        return False
    body = _Body(loop)
    ptr = _through_converts(load.operands[0])
    index = body.carried_index(ptr)
    if index is None:
        return False
    nxt = body.block.terminator.operands[index].defining_op  # type: ignore[union-attr]
    if nxt is None or nxt.name != "mt.addptr" or _through_converts(nxt.operands[0]) is not ptr \
            or not body.cloneable(nxt.operands[1], iv_ok=False):
        return False
    if len(load.operands) > 1 and not (body.cloneable(load.operands[1], iv_ok=True)
                                       and _prefix_mask(analysis, load.operands[1], _chunk(load))):
        return False
    if len(load.operands) > 2 and not _is_zero(load.operands[2]):
        return False
    return _rows_copyable(analysis, load, ptr)


def _through_converts(v: Value) -> Value:
    while v.defining_op is not None and v.defining_op.name == "mt.convert_layout":
        v = v.defining_op.operands[0]
    return v


def _increment(body: _Body, ptr: Value) -> Value | None:
    """%inc when the carried pointer's next value is `mt.addptr ptr, %inc` with %inc loop-invariant."""
    nxt = body.block.terminator.operands[body.carried_index(ptr)]  # type: ignore[index,union-attr]
    op = nxt.defining_op
    if op is None or op.name != "mt.addptr" or op.operands[0] is not ptr or op.parent is not body.block:
        return None
    return op.operands[1] if body.cloneable(op.operands[1], iv_ok=False) else None


def _is_zero(v: Value) -> bool:
    op = v.defining_op
    return op is not None and op.name == "mt.constant" and op.attrs.get("value") in (0, 0.0) \
        and not isinstance(op.attrs.get("value"), bool)


def _users(func: Operation, v: Value) -> list[tuple[Operation, int]]:
    return [(op, i) for op in func.walk() for i, o in enumerate(op.operands) if o is v]


def _feeds_dot_only(func: Operation, v: Value) -> bool:
    users = _users(func, v)
    if not users:
        return False
    for op, i in users:
        if op.name in STAGING_OPS:
            if not _feeds_dot_only(func, op.result):
                return False
        elif op.name != "mt.dot" or i > 1:
            return False
    return True


def _chunk(load: Operation) -> int:
    """Elements per 16-byte copy."""
    return COPY_BYTES // load.result.type.scalar.bytes  # type: ignore[union-attr]


def _prefix_mask(analysis: AxisAnalysis, mask: Value, chunk: int) -> bool:
    """Whether, within every aligned run of `chunk` elements along the innermost dim, the true lanes of `mask` come
    first (cp.async's src-size zero-fills a suffix of the 16 bytes): a mask constant over the run, `x < bound` with
    x contiguous over the run and bound constant over it, or an and / broadcast of such masks."""
    if analysis.info(mask).constancy[-1] % chunk == 0:
        return True
    op = mask.defining_op
    if op is None:
        return False
    if op.name == "mt.and":
        return all(_prefix_mask(analysis, o, chunk) for o in op.operands)
    if op.name == "mt.broadcast":
        return op.operands[0].type.shape[-1] == 1 or _prefix_mask(analysis, op.operands[0], chunk)
    if op.name == "mt.convert_layout":  # the same values
        return _prefix_mask(analysis, op.operands[0], chunk)
    if op.name == "mt.cmp" and op.attrs.get("predicate") in ("lt", "le"):
        x, bound = (analysis.info(o) for o in op.operands)
        return x.contiguity[-1] % chunk == 0 and bound.constancy[-1] % chunk == 0
    return False


def _rows_copyable(analysis: AxisAnalysis, op: Operation, ptr: Value | None = None) -> bool:
    """Whether every row of the tile is made of whole, aligned 16-byte chunks (`ptr`: the load's pointers)."""
    elem = op.result.type.scalar.bytes  # type: ignore[union-attr]
    shape = op.result.type.shape
    info = analysis.info(op.operands[0] if ptr is None else ptr)
    return (shape[-1] * elem % COPY_BYTES == 0 and info.contiguity[-1] * elem >= COPY_BYTES
            and info.contiguity[-1] * elem % COPY_BYTES == 0 and info.divisibility[-1] % COPY_BYTES == 0)


# --------------------------------------------------------------------------------------------- rewriting


class _Inserter:
    """Inserts ops into a block before a fixed op (or at the end of the block when `before` is None)."""

    def __init__(self, block: Block, before: Operation | None, loc):  # type: ignore[no-untyped-def]
        self.block, self.before, self.loc = block, before, loc

    def add(self, name: str, operands: list[Value], result_types: list, **attrs) -> Operation:  # type: ignore
        new = Operation(name, operands, result_types, attrs, loc=self.loc)
        index = len(self.block.ops) if self.before is None else self.block.ops.index(self.before)
        self.block.insert(index, new)
        return new

    def value(self, name: str, operands: list[Value], t, **attrs) -> Value:  # type: ignore[no-untyped-def]
        return self.add(name, operands, [t], **attrs).result

    def const(self, value: int, t: ScalarType) -> Value:
        return self.value("mt.constant", [], t, value=value)

    def clone(self, body: _Body, v: Value, env: dict[Value, Value]) -> Value:
        """`v` computed here, with the body's values replaced per `env` (the induction variable, mostly)."""
        if v in env:
            return env[v]
        if not body.inside(v):
            return v
        op = v.defining_op
        assert op is not None
        new = self.add(op.name, [self.clone(body, o, env) for o in op.operands], [r.type for r in op.results],
                       **op.attrs)
        for old, fresh in zip(op.results, new.results):
            env[old] = fresh
        return env[v]


def _ring_type(load: Operation, stages: int, direct: tuple[int, int] | None = None) -> TensorType:
    """tensor<S x tile>; with layouts, `#mt.shared<{swizzle = 0, order = [1, 0], stages = S}>`: slots row-major and
    unswizzled, as codegen/async_copy.py lays them out; read in place by wgmma (`direct` = (operand, swizzle)),
    `#mt.shared<{swizzle, order = [1, 0], operand, stages = S}>`."""
    t: TensorType = load.result.type  # type: ignore[assignment]
    if direct is not None:
        enc = layout("shared", swizzle=direct[1], order=[1, 0], operand=direct[0], stages=stages)
    else:
        enc = None if t.encoding is None else layout("shared", swizzle=0, order=[1, 0], stages=stages)
    return TensorType((stages,) + tuple(t.shape), t.scalar, enc)


def _slot_type(load: Operation, direct: tuple[int, int]) -> TensorType:
    t: TensorType = load.result.type  # type: ignore[assignment]
    return t.with_encoding(layout("shared", swizzle=direct[1], order=[1, 0], operand=direct[0]))


def _async_dot(loop: Operation, loads: list[Operation]) -> Operation | None:
    """The loop's only dot when both its operands are the loads' (through their mt.local_alloc: they become ring
    slots; a staged operand would be rewritten in the scratch buffer under the running wgmma) and its accumulator
    is only carried: a body argument used by the dot alone, the dot's result used by the yield alone, at the same
    carried position (so it can stay in flight across iterations)."""
    body = _Body(loop)
    dots = [op for op in loop.walk() if op.name == "mt.dot"]
    if len(dots) != 1 or dots[0].parent is not body.block:
        return None
    dot = dots[0]
    staged = [v.defining_op for v in dot.operands[:2]]
    if any(s is None or s.name != "mt.local_alloc" or s.operands[0].defining_op not in loads for s in staged):
        return None
    acc = dot.operands[2]
    slot = body.carried_index(acc)
    func = _function_of(loop)
    if slot is None or len(_users(func, acc)) != 1 or _users(func, dot.result) != [(body.block.terminator, slot)]:
        return None
    return dot


def _pipeline_loop(loop: Operation, loads: list[Operation], stages: int,
                   direct: list[tuple[int, int] | None], offset: int, uniform: list[bool],
                   planned: bool = False) -> int:
    """Rewrite the loop (module docstring); the bytes of the in-place rings (and with `planned`, of every ring:
    they go to dynamic shared memory, `_place_rings`) placed from `offset` on."""
    body = _Body(loop)
    in_place = all(d is not None for d in direct)
    async_dot = _async_dot(loop, loads) if in_place else None
    # iterations the copies run ahead; an async dot with S >= 4 slots refills the slot iteration i - 2 read (free
    # since the barrier at the top of iteration i: every warpgroup waited for its dot i - 2 in iteration i - 1), so
    # the barrier after the dot's wait is not needed (`deferred_wait`)
    deferred = async_dot is not None and stages >= DEFERRED_WAIT_STAGES
    ahead = stages - 2 if deferred else stages - 1
    block, parent = body.block, loop.parent
    assert parent is not None
    func = _function_of(loop)
    num_warps = int(func.attrs.get("num_warps", 4))
    lb, ub, step = loop.operands[:3]
    it: ScalarType = lb.type  # type: ignore[assignment]
    pre = _Inserter(parent, loop, loop.loc)

    rings, incs, encs, ptrs = [], [], [], []
    placed = offset
    for load, d in zip(loads, direct):
        ring_t = _ring_type(load, stages, d)
        if d is None and not planned:
            rings.append(pre.value("mt.alloc_ring", [], ring_t, stages=stages))
        else:
            rings.append(pre.value("mt.alloc_ring", [], ring_t, stages=stages, planned_offset=placed))
            placed += -(-_tile_bytes(ring_t) // RING_ALIGN) * RING_ALIGN
        encs.append(copy_layout(load, num_warps))
        ptr = _through_converts(load.operands[0])
        inc = pre.clone(body, _increment(body, ptr), {})  # type: ignore[arg-type]
        incs.append(_in_layout(pre, inc, encs[-1]))
        init = loop.operands[3 + body.carried_index(ptr)]  # type: ignore[operator]
        ptrs.append(_in_layout(pre, init, encs[-1]))
    bases = list(ptrs)  # iteration 0's pointers

    # prologue: iterations 0 .. ahead-1
    for j in range(ahead):
        slot = pre.const(j, it)  # also the iteration number
        iv_j = pre.value("mt.add", [lb, pre.value("mt.mul", [slot, step], it)], it) if j else lb
        valid = pre.value("mt.cmp", [iv_j, ub], i1, predicate="lt")
        for n, load in enumerate(loads):
            if j:
                ptrs[n] = pre.value("mt.addptr", [ptrs[n], incs[n]], ptrs[n].type)
            mask = _copy_mask(pre, body, load, iv_j, valid, encs[n])
            pre.add("mt.async_copy", [rings[n], slot, ptrs[n], mask], [], **_copy_attrs(uniform[n]))
        pre.add("mt.async_commit", [], [])
    pf_args: list[Value] = []
    # in-place rings, and the big (dynamic) rings of register-heavy loops, recompute the prefetch pointers from
    # iteration 0's: carried pointer tiles would hold registers across the loop
    recompute = in_place or planned
    if not recompute:  # the loop carries the prefetch pointers
        first_prefetch = [pre.value("mt.addptr", [p, inc], p.type) for p, inc in zip(ptrs, incs)]
        pf_args = _carry(loop, first_prefetch)
    else:
        wide_incs = [pre.value("mt.cast", [inc], with_scalar(inc.type, i64)) for inc in incs]

    # the iteration number and the slots it reads and writes, carried (a division and two remainders per
    # iteration would sit between the barrier and the first wgmma, on the critical path)
    index, read_slot, write_slot = _carry(loop, [pre.const(0, it), pre.const(0, it), pre.const(ahead, it)])

    # steady state, at the top of the body
    top = _Inserter(block, block.ops[0], loop.loc)
    top.add("mt.async_wait", [], [], pending=ahead - 1)
    iv = body.iv
    iv_pf = top.value("mt.add", [iv, top.value("mt.mul", [top.const(ahead, it), step], it)], it)
    valid = top.value("mt.cmp", [iv_pf, ub], i1, predicate="lt")
    func_op = _function_of(loop)
    for n, load in enumerate(loads):
        if direct[n] is None:
            local = top.value("mt.local_load", [rings[n], read_slot], load.result.type)
            loop.replace_all_uses(load.result, local)
            continue
        _read_in_place(top, loop, func_op, rings[n], read_slot, load, direct[n])  # type: ignore[arg-type]
    # the copies overwrite the slot iteration i - 1 read: after its dot retired (an async dot: after this one)
    put = top
    if async_dot is not None:
        put = _Inserter(block, block.ops[block.ops.index(async_dot) + 1], loop.loc)
    if recompute:
        ahead_index = put.value("mt.cast", [put.value("mt.add", [index, put.const(ahead, it)], it)], i64)
        for inc, base in zip(wide_incs, bases):
            steps = put.value("mt.splat", [ahead_index], inc.type)
            pf_args.append(put.value("mt.addptr", [base, put.value("mt.mul", [steps, inc], inc.type)], base.type))
    for n, load in enumerate(loads):
        mask = _copy_mask(put, body, load, iv_pf, valid, encs[n])
        put.add("mt.async_copy", [rings[n], write_slot, pf_args[n], mask], [], **_copy_attrs(uniform[n]))
    put.add("mt.async_commit", [], [])
    yield_op, tail = _end_of_body(put, loop, loads, deferred)
    # next prefetch pointers, yielded
    for pf, inc in zip(pf_args if not recompute else [], incs):
        yield_op.operands.append(tail.value("mt.addptr", [pf, inc], pf.type))
    one = tail.const(1, it)
    yield_op.operands.append(tail.value("mt.add", [index, one], it))
    for slot in (read_slot, write_slot):
        yield_op.operands.append(_next_slot(tail, slot, stages, one))

    # epilogue: nothing may be in flight when the loop ends
    after = _after_loop(loop)
    if async_dot is not None:
        async_dot.attrs["async_groups"] = 1
        if deferred:
            async_dot.attrs["deferred_wait"] = True
        after.add("mt.dot_wait", [], [], pending=0)
    after.add("mt.async_wait", [], [], pending=0)
    return placed - offset


def _read_in_place(ins: _Inserter, loop: Operation, func_op: Operation, ring: Value, slot: Value,
                   load: Operation, direct: tuple[int, int]) -> None:
    """Point the load's staging (the shared-memory copy feeding the dot) at the ring slot itself: wgmma reads
    the operand in place."""
    view = ins.value("mt.ring_slot", [ring, slot], _slot_type(load, direct))
    for staging, _ in _users(func_op, load.result):
        loop.replace_all_uses(staging.result, view)
        staging.erase()


def _end_of_body(put: _Inserter, loop: Operation, loads: list[Operation], deferred: bool
                 ) -> tuple[Operation, _Inserter]:
    """Close a rewritten steady state: the deferred wait for the previous dot (after the copies), the replaced loads
    erased; returns the loop's yield and an inserter in front of it (for the carried values' next values)."""
    if deferred:
        put.add("mt.dot_wait", [], [], pending=1)
    for load in loads:
        load.erase()
    yield_op = loop.regions[0].block.terminator
    assert yield_op is not None
    return yield_op, _Inserter(loop.regions[0].block, yield_op, loop.loc)


def _after_loop(loop: Operation) -> _Inserter:
    """An inserter right after `loop` in its block (the drain of what the loop left in flight)."""
    parent = loop.parent
    assert parent is not None
    at = parent.ops.index(loop) + 1
    return _Inserter(parent, parent.ops[at] if at < len(parent.ops) else None, loop.loc)


def _is_last_slot(ins: _Inserter, slot: Value, stages: int) -> Value:
    return ins.value("mt.cmp", [slot, ins.const(stages - 1, slot.type)], i1, predicate="eq")


def _next_slot(ins: _Inserter, slot: Value, stages: int, one: Value, last: Value | None = None) -> Value:
    """slot + 1, wrapping to 0 after the last of `stages` (`last`: that test, when already built)."""
    last = last if last is not None else _is_last_slot(ins, slot, stages)
    return ins.value("mt.select", [last, ins.const(0, slot.type), ins.value("mt.add", [slot, one], slot.type)],
                     slot.type)


# ------------------------------------------------------------------------------------------- TMA rings


@dataclass(frozen=True)
class _TmaSource:
    """Where a load's tile comes from, for TMA: the descriptor argument, the tile's first (row, col) at iteration 0
    (None: 0) and how far it moves per iteration, in elements."""

    desc: Value
    row0: Value | None
    col0: Value | None
    row_step: int
    col_step: int


def _tma_sources(func: Operation, loop: Operation, loads: list[Operation],
                 direct: list[tuple[int, int]]) -> list[_TmaSource] | None:
    """One _TmaSource per load when the loop can be fed by TMA (module docstring, "TMA rings"), else None."""
    if _async_dot(loop, loads) is None or any(d[1] != TMA_SWIZZLE for d in direct):
        return None
    body = _Body(loop)
    num_warps = int(func.attrs.get("num_warps", 4))
    out = []
    for load, (operand, _) in zip(loads, direct):
        source = _tma_source(func, body, load, operand, num_warps)
        if source is None:
            return None
        out.append(source)
    return out


def _tma_source(func: Operation, body: _Body, load: Operation, operand: int, num_warps: int) -> _TmaSource | None:
    from minitriton.codegen.tma import wgmma_ring_boxes

    t: TensorType = load.result.type  # type: ignore[assignment]
    try:
        wgmma_ring_boxes(operand, tuple(t.shape), num_warps, t.scalar.bytes)  # type: ignore[arg-type]
    except ValueError:
        return None
    ptr = _through_converts(load.operands[0])
    index = body.carried_index(ptr)
    inc = _increment(body, ptr)
    if index is None or inc is None:
        return None
    terms = _pointer_terms(body.loop.operands[3 + index])
    if terms is None:
        return None
    base, (row0, row_stride), col0 = terms
    desc = _descriptor_argument(func, base)
    if desc is None or desc.type.element != t.scalar:  # type: ignore[union-attr]
        return None
    try:  # the descriptor's rank picks the boxes (rank 4: A's row groups in pairs, codegen/tma.py)
        box = wgmma_ring_boxes(operand, tuple(t.shape), num_warps, t.scalar.bytes,  # type: ignore[arg-type]
                               rank=len(desc.type.block_shape))[0][1]  # type: ignore[union-attr]
    except ValueError:
        return None
    if tuple(desc.type.block_shape) != tuple(box):  # type: ignore[union-attr]
        return None
    steps = _steps(inc, row_stride)
    if steps is None:
        return None
    return _TmaSource(desc, row0, col0, steps[0], steps[1])


def _descriptor_argument(func: Operation, base: Value) -> Value | None:
    """The TensorDescType argument `<name>_tma` of a pointer argument `<name>_ptr` (the kernel's promise that it
    describes the same matrix: pointer, row pitch and the bounds the load's mask tests)."""
    block = func.regions[0].block
    names = func.attrs.get("arg_names") or []
    if base.owner is not block or base not in block.args or len(names) != len(block.args):
        return None
    name = names[block.args.index(base)]
    if not name.endswith("_ptr"):
        return None
    want = name[:-len("_ptr")] + "_tma"
    for arg, n in zip(block.args, names):
        if n == want and isinstance(arg.type, TensorDescType):
            return arg
    return None


def _strip(v: Value) -> Value:
    """Through the ops that do not change which element a lane names (layout conversions, broadcasts)."""
    while v.defining_op is not None and v.defining_op.name in ("mt.convert_layout", "mt.broadcast"):
        v = v.defining_op.operands[0]
    return v


def _pointer_terms(ptr: Value) -> tuple[Value, tuple[Value | None, Value], Value | None] | None:
    """(base pointer, (first row, row stride), first col) of a pointer tile `base + rows[:, None] * stride +
    cols[None, :]` (rows / cols `first + arange(0, n)` or `arange(0, n)`; unit column stride); None otherwise."""
    v, terms = _strip(ptr), []
    while v.defining_op is not None and v.defining_op.name == "mt.addptr":
        terms.append(_strip(v.defining_op.operands[1]))
        v = _strip(v.defining_op.operands[0])
    if v.defining_op is None or v.defining_op.name != "mt.splat" or len(terms) != 2:
        return None
    base = v.defining_op.operands[0]
    row = col = None
    for term in terms:
        op = term.defining_op
        if op is not None and op.name == "mt.expand_dims" and op.attrs.get("axis") == 0:
            col = ("col", _index_origin(op.operands[0]))
        elif op is not None and op.name == "mt.mul":
            for a, b in (op.operands, op.operands[::-1]):
                a_op, b_op = _strip(a).defining_op, _strip(b).defining_op
                if a_op is not None and a_op.name == "mt.expand_dims" and a_op.attrs.get("axis") == 1 \
                        and b_op is not None and b_op.name == "mt.splat":
                    row = (_index_origin(a_op.operands[0]), b_op.operands[0])
                    break
    if row is None or col is None or row[0] is False or col[1] is False:
        return None
    return base, row, col[1]  # type: ignore[return-value]


def _index_origin(v: Value) -> Value | None | bool:
    """s for an index vector `splat(s) + arange(0, n)`, None for `arange(0, n)`, False for anything else."""
    v = _through_converts(v)
    op = v.defining_op
    if op is not None and op.name == "mt.arange" and op.attrs.get("start") == 0:
        return None
    if op is not None and op.name == "mt.add":
        for a, b in (op.operands, op.operands[::-1]):
            a_op, b_op = _through_converts(a).defining_op, _through_converts(b).defining_op
            if a_op is not None and a_op.name == "mt.splat" and b_op is not None and b_op.name == "mt.arange" \
                    and b_op.attrs.get("start") == 0:
                return a_op.operands[0]
    return False


def _steps(inc: Value, row_stride: Value) -> tuple[int, int] | None:
    """(rows, cols) the tile moves per iteration when the pointer increment is a constant c (c columns: the
    column stride is 1) or a splat of c * row_stride (c rows)."""
    op = _strip(inc).defining_op
    if op is not None and op.name == "mt.splat":
        op = op.operands[0].defining_op
        if op is not None and op.name == "mt.mul":
            for a, b in (op.operands, op.operands[::-1]):
                c = _int_constant(a)
                if c is not None and b is row_stride:
                    return c, 0
            return None
    c = _int_constant(inc) if op is None or op.name != "mt.mul" else None
    return (0, c) if c is not None else None


def _int_constant(v: Value) -> int | None:
    op = _strip(v).defining_op
    if op is None or op.name == "mt.splat":
        op = op.operands[0].defining_op if op is not None else None
    if op is None or op.name != "mt.constant":
        return None
    value = op.attrs.get("value")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _pipeline_loop_tma(loop: Operation, loads: list[Operation], stages: int, direct: list[tuple[int, int]],
                       offset: int, sources: list[_TmaSource]) -> int:
    """The in-place async-dot schedule of `_pipeline_loop` with TMA copies (module docstring, "TMA rings"); the
    bytes of the rings placed from `offset` on."""
    body = _Body(loop)
    async_dot = _async_dot(loop, loads)
    assert async_dot is not None
    deferred = stages >= DEFERRED_WAIT_STAGES
    ahead = stages - 2 if deferred else stages - 1
    block, parent = body.block, loop.parent
    assert parent is not None
    lb, ub, step = loop.operands[:3]
    it: ScalarType = lb.type  # type: ignore[assignment]
    pre = _Inserter(parent, loop, loop.loc)

    rings, placed = [], offset
    for load, d in zip(loads, direct):
        ring_t = _ring_type(load, stages, d)
        rings.append(pre.value("mt.alloc_ring", [], ring_t, stages=stages, planned_offset=placed,
                               tma_barriers=True))
        placed += -(-_tile_bytes(ring_t) // RING_ALIGN) * RING_ALIGN

    def copy(ins: _Inserter, slot: Value, iteration: Value, valid: Value) -> None:
        for ring, src in zip(rings, sources):
            row = _coordinate(ins, src.row0, src.row_step, iteration, it)
            col = _coordinate(ins, src.col0, src.col_step, iteration, it)
            ins.add("mt.async_copy", [ring, slot, src.desc, row, col, valid], [])

    for j in range(ahead):  # prologue: iterations 0 .. ahead-1
        slot = pre.const(j, it)
        iv_j = pre.value("mt.add", [lb, pre.value("mt.mul", [slot, step], it)], it) if j else lb
        copy(pre, slot, slot, pre.value("mt.cmp", [iv_j, ub], i1, predicate="lt"))

    index, read_slot, write_slot, phase = _carry(loop, [pre.const(0, it), pre.const(0, it), pre.const(ahead, it),
                                                        pre.const(0, it)])
    top = _Inserter(block, block.ops[0], loop.loc)
    for n, ring in enumerate(rings):  # the slot's fill landed; then every thread is past its older dots' waits
        top.add("mt.async_wait", [ring, read_slot, phase], [], **({"barrier": True} if n == len(rings) - 1 else {}))
    func_op = _function_of(loop)
    for ring, load, d in zip(rings, loads, direct):
        _read_in_place(top, loop, func_op, ring, read_slot, load, d)
    put = _Inserter(block, block.ops[block.ops.index(async_dot) + 1], loop.loc)
    iv_pf = put.value("mt.add", [body.iv, put.value("mt.mul", [put.const(ahead, it), step], it)], it)
    valid = put.value("mt.cmp", [iv_pf, ub], i1, predicate="lt")
    copy(put, write_slot, put.value("mt.add", [index, put.const(ahead, it)], it), valid)
    yield_op, tail = _end_of_body(put, loop, loads, deferred)
    one = tail.const(1, it)
    yield_op.operands.append(tail.value("mt.add", [index, one], it))
    wraps = _is_last_slot(tail, read_slot, stages)
    yield_op.operands.append(_next_slot(tail, read_slot, stages, one, wraps))
    yield_op.operands.append(_next_slot(tail, write_slot, stages, one))
    yield_op.operands.append(tail.value("mt.select", [wraps, tail.value("mt.sub", [one, phase], it), phase], it))

    async_dot.attrs["async_groups"] = 1
    if deferred:
        async_dot.attrs["deferred_wait"] = True
    after = _after_loop(loop)
    after.add("mt.dot_wait", [], [], pending=0)  # every fill was waited for in the loop: no copy is in flight
    return placed - offset


def _coordinate(ins: _Inserter, origin: Value | None, per_iteration: int, iteration: Value, it: ScalarType) -> Value:
    """origin + iteration * per_iteration (i32), folded where parts are zero."""
    moved = None
    if per_iteration:
        moved = ins.value("mt.mul", [iteration, ins.const(per_iteration, it)], it)
    if origin is None:
        return moved if moved is not None else ins.const(0, it)
    return origin if moved is None else ins.value("mt.add", [origin, moved], it)


def _carry(loop: Operation, inits: list[Value]) -> list[Value]:
    """Add carried values to the loop (initial values `inits`); their body arguments. The caller appends their
    next values to the yield, in the same order, after any carried values added before."""
    block = loop.regions[0].block
    args = [block.add_arg(v.type) for v in inits]
    loop.operands.extend(inits)
    n_results = len(loop.results)
    loop.results.extend(Value(v.type, loop, n_results + i) for i, v in enumerate(inits))
    return args


def _copy_attrs(uniform: bool) -> dict:  # type: ignore[type-arg]
    return {"uniform_runs": True} if uniform else {}


def copy_layout(load: Operation, num_warps: int) -> LayoutAttr | None:
    """The layout the copies use when the IR has layouts: each thread holds 16-byte runs along the rows (a blocked
    layout with sizePerThread [1, 16 / element size]); None on tile IR without layouts."""
    t: TensorType = load.operands[0].type  # type: ignore[assignment]
    if t.encoding is None:
        return None
    return blocked_for_shape(t.shape, num_warps, [1, _chunk(load)])


def _in_layout(ins: _Inserter, v: Value, enc: LayoutAttr | None) -> Value:
    if enc is None or not isinstance(v.type, TensorType) or v.type.encoding == enc:
        return v
    return ins.value("mt.convert_layout", [v], v.type.with_encoding(enc))


# Ops recomputed in the copy layout (a mask's index math) instead of converting their result through shared memory.
_RELAYOUT_SAME = ("mt.and", "mt.or", "mt.cmp", "mt.add", "mt.sub", "mt.mul", "mt.broadcast")
RELAYOUT_LIMIT = 24


def _mask_in_layout(ins: _Inserter, mask: Value, enc: LayoutAttr | None) -> Value:
    """The mask in the copy layout: its index math recomputed there when it is small and simple (no per-iteration
    trip through shared memory), else a convert_layout."""
    if enc is None or mask.type.encoding == enc:  # type: ignore[union-attr]
        return mask
    plan: list[tuple[Value, LayoutAttr]] = []
    if _plan_relayout(mask, enc, plan, set()):
        memo: dict[tuple[Value, LayoutAttr], Value] = {}
        for v, want in plan:  # operands before users
            op = v.defining_op
            assert op is not None
            if op.name == "mt.convert_layout":  # the same values: its operand, recomputed in `want`
                memo[(v, want)] = memo[(op.operands[0], want)]
                continue
            operands = [memo[(o, _operand_layout(op, want))] if isinstance(o.type, TensorType) else o
                        for o in op.operands]
            memo[(v, want)] = ins.add(op.name, operands, [v.type.with_encoding(want)], **op.attrs).result
        return memo[(mask, enc)]
    return _in_layout(ins, mask, enc)


def _operand_layout(op: Operation, want: LayoutAttr) -> LayoutAttr:
    return slice_of(op.attrs["axis"], want) if op.name == "mt.expand_dims" else want


def _plan_relayout(v: Value, want: LayoutAttr, plan: list, seen: set) -> bool:  # type: ignore[type-arg]
    """Post-order list of (value, layout) to recompute; False when v's definition is not simple index math."""
    if (v, want) in seen:
        return True
    op = v.defining_op
    if op is None or op.regions or len(seen) >= RELAYOUT_LIMIT:
        return False
    if op.name not in _RELAYOUT_SAME + ("mt.splat", "mt.constant", "mt.arange", "mt.expand_dims",
                                        "mt.convert_layout"):
        return False
    for o in op.operands:
        if isinstance(o.type, TensorType) and not _plan_relayout(o, _operand_layout(op, want), plan, seen):
            return False
    seen.add((v, want))
    plan.append((v, want))
    return True


def _copy_mask(ins: _Inserter, body: _Body, load: Operation, iv: Value, valid: Value,
               enc: LayoutAttr | None) -> Value:
    """The load's mask at induction value `iv` in the copy layout, and'ed with `valid` (the iteration exists)."""
    ptr_t = load.operands[0].type
    mask_t = with_scalar(ptr_t, i1)
    if enc is not None:
        mask_t = mask_t.with_encoding(enc)  # type: ignore[attr-defined]
    live = ins.value("mt.splat", [valid], mask_t)
    if len(load.operands) < 2:
        return live
    mask = _mask_in_layout(ins, ins.clone(body, load.operands[1], {body.iv: iv}), enc)
    return ins.value("mt.and", [mask, live], mask_t)


def _function_of(op: Operation) -> Operation:
    while op.name != "mt.func":
        parent = op.parent_op
        assert parent is not None
        op = parent
    return op
