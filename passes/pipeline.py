"""Pass "pipeline": software pipelining of dot K loops — the loads feeding an mt.dot become asynchronous copies into
a `num_stages`-deep ring of shared-memory slots, issued num_stages - 1 iterations ahead.

Runs after "dot-lowering" (it also works on tile IR without layouts). It rewrites an `scf.for` (lb, ub, step) whose
body block holds `mt.load`s of this form (the candidates):

  %a = mt.load %p, %mask, %zero      %p a carried value advanced by `mt.addptr %p, %inc` in its yield, %inc
                                     loop-invariant; %mask (optional) computed from the induction variable and
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

On IR with layouts the copies use a copy layout (blocked, 16 / element-size elements per thread along the rows, so
each thread issues whole 16-byte cp.async): the initial pointers and increments are converted to it once, before
the loop; the masks' index math is recomputed in it (a convert_layout only when it is not simple index math).

Copies past the end of the loop are fully masked (they write zeros and read nothing), so every iteration commits
exactly one group and the wait count is constant. Slot (i+S-1) % S is the one read in iteration i-1, so it is
rewritten only after its last read (the codegen puts a barrier between a slot's reads and its next copy).

num_stages: the func attr `num_stages` (the compiler sets it from the launch option, default 3), overridden by an
int attr `num_stages` on the scf.for. The rings live in static shared memory next to the codegen's scratch buffer:
when S rings do not fit SMEM_BUDGET with an estimate of the scratch the loop's dots need, S is lowered (down to 2).
With num_stages < 2, no candidate load, or no room for two stages, the loop stays unchanged.
"""
from __future__ import annotations

from minitriton.ir import Block, Module, Operation, Value
from minitriton.ir.layouts import blocked_for_shape, slice_of
from minitriton.ir.ops import OPS
from minitriton.ir.types import LayoutAttr, ScalarType, TensorType, i1, layout, with_scalar

from .axis_info import AxisAnalysis
from .dce import eliminate_dead_code
from .registry import register_pass

DEFAULT_STAGES = 3
# Static shared memory of a kernel (codegen/context.py SMEM_LIMIT): the rings and the codegen's scratch buffer share it.
SMEM_BUDGET = 48 * 1024
COPY_BYTES = 16  # cp.async.cg copies 16 bytes
STAGING_OPS = ("mt.convert_layout", "mt.local_alloc")


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
        while stages >= 2 and rings + stages * per_stage + _scratch_estimate(loop) > SMEM_BUDGET:
            stages -= 1  # a shallower ring rather than none
        if stages >= 2:
            _pipeline_loop(loop, loads, stages)
            rings += stages * per_stage
            changed = True
    return changed


def _tile_bytes(t: TensorType) -> int:
    return t.numel * t.scalar.bytes  # type: ignore[union-attr]


def _scratch_estimate(loop: Operation) -> int:
    """The scratch shared memory the loop's dots are likely to need besides the rings (codegen's `smem`, reused by
    every lowering): the larger of staging both operands (padded / 1024-aligned) and moving the f32 accumulator
    between layouts (rows padded by 16 bytes)."""
    need = 0
    for op in loop.walk():
        if op.name == "mt.dot":
            a, b, acc = (v.type for v in op.operands[:3])
            (m, k), n = a.shape, b.shape[1]  # type: ignore[union-attr]
            operands = (m + 16) * k * a.scalar.bytes + (k + 16) * n * b.scalar.bytes + 1024  # type: ignore
            need = max(need, operands, m * (n * acc.scalar.bytes + 16))  # type: ignore[union-attr]
    return need


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
    ptr = op.operands[0]
    if body.carried_index(ptr) is None or _increment(body, ptr) is None:
        return False
    if len(op.operands) > 1 and not (body.cloneable(op.operands[1], iv_ok=True)
                                     and _prefix_mask(analysis, op.operands[1], _chunk(op))):
        return False
    if len(op.operands) > 2 and not _is_zero(op.operands[2]):
        return False
    return _feeds_dot_only(func, op.result) and _rows_copyable(analysis, op)


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
    if op.name == "mt.cmp" and op.attrs.get("predicate") in ("lt", "le"):
        x, bound = (analysis.info(o) for o in op.operands)
        return x.contiguity[-1] % chunk == 0 and bound.constancy[-1] % chunk == 0
    return False


def _rows_copyable(analysis: AxisAnalysis, op: Operation) -> bool:
    """Whether every row of the tile is made of whole, aligned 16-byte chunks."""
    elem = op.result.type.scalar.bytes  # type: ignore[union-attr]
    shape = op.result.type.shape
    info = analysis.info(op.operands[0])
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


def _ring_type(load: Operation, stages: int) -> TensorType:
    """tensor<S x tile>; with layouts, `#mt.shared<{swizzle = 0, order = [1, 0], stages = S}>`: slots row-major and
    unswizzled, as codegen/async_copy.py lays them out."""
    t: TensorType = load.result.type  # type: ignore[assignment]
    enc = None if t.encoding is None else layout("shared", swizzle=0, order=[1, 0], stages=stages)
    return TensorType((stages,) + tuple(t.shape), t.scalar, enc)


def _pipeline_loop(loop: Operation, loads: list[Operation], stages: int) -> None:
    body = _Body(loop)
    block, parent = body.block, loop.parent
    assert parent is not None
    func = _function_of(loop)
    num_warps = int(func.attrs.get("num_warps", 4))
    lb, ub, step = loop.operands[:3]
    it: ScalarType = lb.type  # type: ignore[assignment]
    pre = _Inserter(parent, loop, loop.loc)

    rings, incs, encs, ptrs = [], [], [], []
    for load in loads:
        rings.append(pre.value("mt.alloc_ring", [], _ring_type(load, stages), stages=stages))
        encs.append(copy_layout(load, num_warps))
        inc = pre.clone(body, _increment(body, load.operands[0]), {})  # type: ignore[arg-type]
        incs.append(_in_layout(pre, inc, encs[-1]))
        init = loop.operands[3 + body.carried_index(load.operands[0])]  # type: ignore[operator]
        ptrs.append(_in_layout(pre, init, encs[-1]))

    # prologue: iterations 0 .. S-2
    for j in range(stages - 1):
        slot = pre.const(j, it)  # also the iteration number
        iv_j = pre.value("mt.add", [lb, pre.value("mt.mul", [slot, step], it)], it) if j else lb
        valid = pre.value("mt.cmp", [iv_j, ub], i1, predicate="lt")
        for n, load in enumerate(loads):
            if j:
                ptrs[n] = pre.value("mt.addptr", [ptrs[n], incs[n]], ptrs[n].type)
            mask = _copy_mask(pre, body, load, iv_j, valid, encs[n])
            pre.add("mt.async_copy", [rings[n], slot, ptrs[n], mask], [])
        pre.add("mt.async_commit", [], [])
    first_prefetch = [pre.value("mt.addptr", [p, inc], p.type) for p, inc in zip(ptrs, incs)]

    # the loop carries the prefetch pointers
    pf_args = [block.add_arg(p.type) for p in first_prefetch]
    loop.operands.extend(first_prefetch)
    n_results = len(loop.results)
    loop.results.extend(Value(p.type, loop, n_results + i) for i, p in enumerate(first_prefetch))

    # steady state, at the top of the body
    top = _Inserter(block, block.ops[0], loop.loc)
    top.add("mt.async_wait", [], [], pending=stages - 2)
    iv = body.iv
    index = top.value("mt.div", [top.value("mt.sub", [iv, lb], it), step], it)
    read_slot = top.value("mt.rem", [index, top.const(stages, it)], it)
    write_slot = top.value("mt.rem", [top.value("mt.add", [index, top.const(stages - 1, it)], it),
                                      top.const(stages, it)], it)
    iv_pf = top.value("mt.add", [iv, top.value("mt.mul", [top.const(stages - 1, it), step], it)], it)
    valid = top.value("mt.cmp", [iv_pf, ub], i1, predicate="lt")
    for n, load in enumerate(loads):
        local = top.value("mt.local_load", [rings[n], read_slot], load.result.type)
        loop.replace_all_uses(load.result, local)
    for n, load in enumerate(loads):
        mask = _copy_mask(top, body, load, iv_pf, valid, encs[n])
        top.add("mt.async_copy", [rings[n], write_slot, pf_args[n], mask], [])
    top.add("mt.async_commit", [], [])
    for load in loads:
        load.erase()

    # next prefetch pointers, yielded
    yield_op = block.terminator
    assert yield_op is not None
    tail = _Inserter(block, yield_op, loop.loc)
    for pf, inc in zip(pf_args, incs):
        yield_op.operands.append(tail.value("mt.addptr", [pf, inc], pf.type))

    # epilogue: nothing may be in flight when the loop ends
    at = parent.ops.index(loop) + 1
    _Inserter(parent, parent.ops[at] if at < len(parent.ops) else None, loop.loc).add("mt.async_wait", [], [],
                                                                                      pending=0)


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
    if op.name not in _RELAYOUT_SAME + ("mt.splat", "mt.constant", "mt.arange", "mt.expand_dims"):
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
