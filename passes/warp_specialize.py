"""Pass "warp-specialize": a TMA-fed wgmma ring (passes/pipeline.py "TMA rings") split into a producer warpgroup
that fills the ring and consumer warps that run the dots (docs/kernels/gemm.md v3).

Acts only on a kernel with func attr `warp_specialize` (the compiler sets it from `@mt.kernel(warp_specialize=True)`;
off by default) whose TMA ring loop sits in the function's top-level block; anything else is left unchanged. It
rewrites (S stages, N = num_warps consumer warps; the pipeline pass's output on the left):

  %ring = mt.alloc_ring {tma_barriers}            %ring = mt.alloc_ring {tma_barriers, empty_arrivals = N / 4}
  prologue: mt.async_copy %ring, j, ...  (j < ahead)        (dropped: the producer issues every fill)
  scf.for (..., %i, %read, %write, %phase) {       %role = mt.warp_role {consumer_warps = N}
    mt.async_wait %ring, %read, %phase {barrier}   scf.if %role {                       producer warpgroup
    %s = mt.ring_slot ...; %d = mt.dot ...           mt.set_max_registers {count = 40, increase = false}
    mt.async_copy %ring, %write, %desc, row, col     scf.for %iv (%j = 0, %slot = 0, %ph = 0) {
    [mt.dot_wait {pending = 1}]                        mt.async_wait %ring, %slot, 1 - %ph {empty}
  }                                                    mt.async_copy %ring, %slot, %desc, row(j), col(j), true
  mt.dot_wait {pending = 0}                            yield j + 1, next slot, ph flipped when slot wraps }
  epilogue ...                                     } else {                                    consumer warps
  mt.return                                          mt.set_max_registers {count = 232, increase = true}
                                                     scf.for (..., %i, %read, %write, %phase) {
                                                       mt.async_wait %ring, %read, %phase    (no block barrier)
                                                       %d = mt.dot {async_groups = 1, deferred_wait}
                                                       mt.dot_wait {pending = 1}        dot i - 1 retired
                                                       mt.ring_release %ring, (read - 1) % S, %i > 0 }
                                                     mt.dot_wait {pending = 0}; epilogue ... }
                                                   mt.return
Func attrs: `num_warps` becomes N + 4 (the launcher's block size and `.maxntid`), `consumer_warps` = N (what every
layout, the wgmma operand offsets and the TMA boxes were built for: the codegen keeps using N), and
`min_blocks_per_sm` 1 unless set (`.minnctapersm 1`: without a register cap at entry ptxas ignores setmaxnreg,
C7508). Consumer warps keep their thread ids, so nothing else changes. The producer waits on a slot's empty barrier
for the parity opposite to its fill count's (a fresh mbarrier counts the phase before its first as complete, so
the first S waits pass at once); each consumer warpgroup arrives once per slot after its wgmma.wait_group 1 shows
the dot that read the slot retired. In the codegen, block barriers inside the consumer branch become
`bar.sync 1, 32 * N` (the producer never reaches them) and the producer's elected thread is thread 32 * N.
Register budget (checked): 32 * N * inc + 128 * dec <= 65536.
"""
from __future__ import annotations

from minitriton.ir import Block, Module, Operation, Region, Value
from minitriton.ir.types import ScalarType, i1

from .pipeline import _carry, _Inserter
from .registry import register_pass

PRODUCER_WARPS = 4  # one warpgroup: setmaxnreg acts per warpgroup
PRODUCER_REGISTERS = 40  # CUTLASS's producer count: scalars only (TMA coordinates, slot, phase)
CONSUMER_REGISTERS = 232
REGISTER_FILE = 65536


@register_pass("warp-specialize")
def warp_specialize(module: Module) -> Module:
    for func in module.functions:
        if func.attrs.get("warp_specialize") and "consumer_warps" not in func.attrs:
            specialize_function(func)
    return module


def consumer_registers(consumer_warps: int) -> int:
    """The most registers per consumer thread the register file allows next to a producer at PRODUCER_REGISTERS
    (a multiple of 8, at most CONSUMER_REGISTERS)."""
    spare = (REGISTER_FILE - 32 * PRODUCER_WARPS * PRODUCER_REGISTERS) // (32 * consumer_warps)
    return min(CONSUMER_REGISTERS, spare // 8 * 8)


def specialize_function(func: Operation) -> bool:
    """Split the function's TMA ring loop into producer and consumer roles; False (IR unchanged) when there is
    none in the top-level block."""
    top = func.regions[0].block
    loop = next((op for op in top.ops if op.name == "scf.for" and _ring_waits(op)), None)
    if loop is None:
        return False
    waits = _ring_waits(loop)
    rings = [w.operands[0] for w in waits]
    if any(r.defining_op is None or not r.defining_op.attrs.get("tma_barriers") for r in rings):
        return False
    body = loop.regions[0].block
    copies = [op for op in body.ops if op.name == "mt.async_copy"]
    if len(copies) != len(rings) or [c.operands[0] for c in copies] != rings:
        return False
    dots = [op for op in body.ops if op.name == "mt.dot" and op.attrs.get("async_groups")]
    if len(dots) != 1:
        return False
    consumers = int(func.attrs.get("num_warps", 4))
    if consumers % 4:
        return False
    read_slot = waits[0].operands[1]
    index = _iteration_index(body, copies[0])
    if index is None:
        return False
    iteration, counter = index
    if not all(_depends_only_on(body, v, iteration) for c in copies for v in c.operands[3:5]):
        return False
    stages = int(rings[0].defining_op.attrs["stages"])  # type: ignore[union-attr]

    _drop_prologue_copies(top, loop, rings)
    role_if = _split_roles(func, top, loop, consumers)
    producer_block = role_if.regions[0].block
    _build_producer(producer_block, loop, rings, copies, iteration, stages)
    _rewrite_consumer_loop(loop, waits, copies, dots[0], rings, read_slot, counter, stages)
    for ring in rings:
        ring.defining_op.attrs["empty_arrivals"] = consumers // 4  # type: ignore[union-attr]
    func.attrs["consumer_warps"] = consumers
    func.attrs["num_warps"] = consumers + PRODUCER_WARPS
    func.attrs.setdefault("min_blocks_per_sm", 1)
    return True


def _ring_waits(loop: Operation) -> list[Operation]:
    return [op for op in loop.regions[0].block.ops if op.name == "mt.async_wait" and op.operands]


def _iteration_index(body: Block, copy: Operation) -> tuple[Value, Value] | None:
    """The value `%i + ahead` the in-loop copy's coordinates are computed from, and the carried counter %i."""
    args = set(body.args)
    for op in body.ops:
        if op.name == "mt.add" and op.operands[0] in args and op.operands[1].defining_op is not None \
                and op.operands[1].defining_op.name == "mt.constant" and _feeds(op.result, copy, body):
            return op.result, op.operands[0]
    return None


def _feeds(v: Value, target: Operation, body: Block) -> bool:
    """Whether `v` reaches an operand of `target` through ops of `body`."""
    frontier, seen = [v], set()
    while frontier:
        x = frontier.pop()
        if x in seen:
            continue
        seen.add(x)
        for op in body.ops:
            if x in op.operands:
                if op is target:
                    return True
                frontier.extend(op.results)
    return False


def _drop_prologue_copies(top: Block, loop: Operation, rings: list[Value]) -> None:
    """The pipeline pass's prologue fills go: the producer's loop issues every fill."""
    for op in list(top.ops[:top.ops.index(loop)]):
        if op.name == "mt.async_copy" and op.operands[0] in rings:
            feeding = [v.defining_op for v in op.operands[1:]]
            op.erase()
            _erase_dead(top, feeding)


def _erase_dead(block: Block, candidates: list[Operation | None]) -> None:
    """Erase ops of `block` among `candidates` (and, transitively, what fed them) whose results nobody uses."""
    from .pipeline import _function_of

    while candidates:
        op = candidates.pop()
        if op is None or op.parent is not block or op.name not in _PURE_SCALAR:
            continue
        func = _function_of(op)
        if any(r in other.operands for other in func.walk() for r in op.results):
            continue
        feeding = [v.defining_op for v in op.operands]
        op.erase()
        candidates.extend(feeding)


_PURE_SCALAR = {"mt.constant", "mt.add", "mt.sub", "mt.mul", "mt.cmp", "mt.select", "mt.and"}


def _split_roles(func: Operation, top: Block, loop: Operation, consumers: int) -> Operation:
    """scf.if on mt.warp_role in front of the loop; the loop and everything after it (but the terminator) move into
    the else (consumer) branch. Returns the scf.if."""
    start = top.ops.index(loop)
    moved = top.ops[start:-1]
    role_op = Operation("mt.warp_role", [], [i1], {"consumer_warps": consumers}, loc=loop.loc)
    producer, consumer = Block(), Block()
    role_if = Operation("scf.if", [role_op.result], [], {}, regions=[Region([producer]), Region([consumer])],
                        loc=loop.loc)
    for op in moved:
        top.ops.remove(op)
        op.parent = None
    top.insert(start, role_op)
    top.insert(start + 1, role_if)
    _Inserter(producer, None, loop.loc).add("mt.set_max_registers", [], [], count=PRODUCER_REGISTERS,
                                            increase=False)
    _Inserter(consumer, None, loop.loc).add("mt.set_max_registers", [], [], count=consumer_registers(consumers),
                                            increase=True)
    for op in moved:
        consumer.append(op)
    for block in (producer, consumer):
        block.append(Operation("scf.yield", [], [], loc=loop.loc))
    return role_if


def _build_producer(block: Block, loop: Operation, rings: list[Value], copies: list[Operation], iteration: Value,
                    stages: int) -> None:
    """The producer's loop over the consumer loop's iterations: wait until the slot is empty, fill it."""
    lb, ub, step = loop.operands[:3]
    it: ScalarType = lb.type  # type: ignore[assignment]
    pre = _Inserter(block, block.terminator, loop.loc)
    zero = pre.const(0, it)
    body = Block([it])
    producer_loop = Operation("scf.for", [lb, ub, step], [], {}, regions=[Region([body])], loc=loop.loc)
    block.insert(block.ops.index(block.terminator), producer_loop)  # type: ignore[arg-type]
    body.append(Operation("scf.yield", [], [], loc=loop.loc))
    j, slot, phase = _carry(producer_loop, [zero, zero, zero])
    ins = _Inserter(body, body.terminator, loop.loc)
    one = ins.const(1, it)
    empty_parity = ins.value("mt.sub", [one, phase], it)  # fill n waits for release n - 1: parity (n - 1) % 2
    for ring in rings:
        ins.add("mt.async_wait", [ring, slot, empty_parity], [], empty=True)
    valid = ins.value("mt.constant", [], i1, value=True)
    consumer_body = loop.regions[0].block
    env: dict[Value, Value] = {iteration: j}
    for copy in copies:
        row, col = (_clone(ins, consumer_body, v, env) for v in copy.operands[3:5])
        ins.add("mt.async_copy", [copy.operands[0], slot, copy.operands[2], row, col, valid], [])
    wraps = ins.value("mt.cmp", [slot, ins.const(stages - 1, it)], i1, predicate="eq")
    next_slot = ins.value("mt.select", [wraps, ins.const(0, it), ins.value("mt.add", [slot, one], it)], it)
    next_phase = ins.value("mt.select", [wraps, ins.value("mt.sub", [one, phase], it), phase], it)
    body.terminator.operands.extend([ins.value("mt.add", [j, one], it), next_slot, next_phase])  # type: ignore


def _depends_only_on(body: Block, v: Value, iteration: Value) -> bool:
    """Whether `v` can be recomputed outside the loop from `iteration` (no other loop-carried value feeds it)."""
    if v is iteration:
        return True
    if v in body.args:
        return False
    op = v.defining_op
    if op is None or op.parent is not body:
        return True
    return not op.regions and all(_depends_only_on(body, o, iteration) for o in op.operands)


def _clone(ins: _Inserter, body: Block, v: Value, env: dict[Value, Value]) -> Value:
    """`v` recomputed at `ins` with the consumer body's values replaced per `env`; values defined outside the
    consumer loop are used as they are (they dominate the role split)."""
    if v in env:
        return env[v]
    op = v.defining_op
    if op is None or op.parent is not body:
        if v in body.args:
            raise ValueError(f"a TMA coordinate depends on a loop-carried value other than the iteration: {v}")
        return v
    new = ins.add(op.name, [_clone(ins, body, o, env) for o in op.operands], [r.type for r in op.results],
                  **op.attrs)
    for old, fresh in zip(op.results, new.results):
        env[old] = fresh
    return env[v]


def _rewrite_consumer_loop(loop: Operation, waits: list[Operation], copies: list[Operation], dot: Operation,
                           rings: list[Value], read_slot: Value, counter: Value, stages: int) -> None:
    """No fills and no block barrier in the consumer loop; the dot's wait retires the previous dot, whose slot is
    then released to the producer."""
    body = loop.regions[0].block
    for wait in waits:
        wait.attrs.pop("barrier", None)
    for copy in copies:
        feeding = [v.defining_op for v in copy.operands[1:]]
        copy.erase()
        _erase_dead(body, feeding)
    dot.attrs["deferred_wait"] = True
    after_dot = body.ops[body.ops.index(dot) + 1]
    if not (after_dot.name == "mt.dot_wait" and after_dot.attrs.get("pending") == 1):
        after_dot = _Inserter(body, after_dot, loop.loc).add("mt.dot_wait", [], [], pending=1)
    at = body.ops.index(after_dot) + 1
    ins = _Inserter(body, body.ops[at], loop.loc)
    it: ScalarType = read_slot.type  # type: ignore[assignment]
    first = ins.value("mt.cmp", [read_slot, ins.const(0, it)], i1, predicate="eq")
    previous = ins.value("mt.select", [first, ins.const(stages - 1, it),
                                       ins.value("mt.sub", [read_slot, ins.const(1, it)], it)], it)
    started = ins.value("mt.cmp", [counter, ins.const(0, it)], i1, predicate="gt")
    for ring in rings:
        ins.add("mt.ring_release", [ring, previous, started], [])
