"""Pass "warp-specialize": kernels whose warps split into partitions (`mt.warp_specialize`), in two forms that
leave the same IR behind (docs/kernels/gemm.md v3, docs/warp_specialization.md).

**Automatic** (func attr `warp_specialize`, from `@mt.kernel(warp_specialize=True)`): a TMA-fed wgmma ring loop
(passes/pipeline.py "TMA rings") in the function's top-level block is split into a producer warpgroup that fills
the ring and consumer warps that run the dots. Anything else is left unchanged. It rewrites (S stages, N =
num_warps consumer warps; the pipeline pass's output on the left):

  %ring = mt.alloc_ring {tma_barriers}            %ring = mt.alloc_ring {tma_barriers, empty_arrivals = N / 4}
  prologue: mt.async_copy %ring, j, ...  (j < ahead)        (dropped: the producer issues every fill)
  scf.for (..., %i, %read, %write, %phase) {       mt.warp_specialize {warps = [N, 4], registers = [232, 40]} ({
    mt.async_wait %ring, %read, %phase {barrier}     scf.for (..., %i, %read, %write, %phase) {   consumer warps
    %s = mt.ring_slot ...; %d = mt.dot ...             mt.async_wait %ring, %read, %phase    (no block barrier)
    mt.async_copy %ring, %write, %desc, row, col       %d = mt.dot {async_groups = 1, deferred_wait}
    [mt.dot_wait {pending = 1}]                        mt.dot_wait {pending = 1}        dot i - 1 retired
  }                                                    mt.ring_release %ring, (read - 1) % S, %i > 0 }
  mt.dot_wait {pending = 0}                          mt.dot_wait {pending = 0}; epilogue ...
  epilogue ...                                     }, {                                   producer warpgroup
  mt.return                                          scf.for %iv (%j = 0, %slot = 0, %ph = 0) {
                                                       mt.async_wait %ring, %slot, 1 - %ph {empty}
                                                       mt.async_copy %ring, %slot, %desc, row(j), col(j), true
                                                       yield j + 1, next slot, ph flipped when slot wraps }
                                                   })
                                                   mt.return
The producer waits on a slot's empty barrier for the parity opposite to its fill count's (a fresh mbarrier counts
the phase before its first as complete, so the first S waits pass at once); each consumer warpgroup arrives once
per slot after its wgmma.wait_group 1 shows the dot that read the slot retired. Code before the loop stays outside
the partitions, laid out for the consumer warps (which keep thread ids 0 .. 32 N - 1, so its tiles are theirs).

**Explicit** (the kernel has an mt.warp_specialize block of its own, frontend/partitions.py): the rings' protocol
is completed from who uses them. For each ring (mt.alloc_ring {explicit}):
- one partition fills it, by TMA (`full_arrivals = 1`: the leader's arrive.expect_tx) or by mt.ring_store (every
  one of its threads arrives: `full_arrivals` = its threads); one partition releases it: when that partition reads
  the slots only in place through wgmma dots, one arrival per warpgroup (after its wgmma.wait_group; attr
  `arrive = "warpgroup"` on its mt.ring_release ops), else one per thread (`arrive = "thread"`);
- it goes to dynamic shared memory (attr `dynamic_offset`, 1024-aligned; func attr `dynamic_shared_memory`).

Both forms end with func attrs `num_warps` = the block's warps (the launcher's block size and `.maxntid`),
`consumer_warps` = partition 0's (what code outside the partitions is laid out for) and `min_blocks_per_sm` 1
unless set, when a partition has a register budget (`.minnctapersm 1`: without a register cap at entry ptxas
ignores setmaxnreg, C7508). Register budget (minitriton/ir/partitions.py checks it): sum of 32 * warps *
registers <= 65536.
"""
from __future__ import annotations

from minitriton.errors import CompilationError
from minitriton.ir import Block, Module, Operation, Region, Value
from minitriton.ir.partitions import (REGISTER_FILE, WARPGROUP_WARPS, Partition, block_warps, enclosing_partition,
                                      partitions_of)
from minitriton.ir.types import ScalarType, i1

from .pipeline import _carry, _Inserter
from .registry import register_pass

PRODUCER_WARPS = 4  # one warpgroup: setmaxnreg acts per warpgroup
PRODUCER_REGISTERS = 40  # CUTLASS's producer count: scalars only (TMA coordinates, slot, phase)
CONSUMER_REGISTERS = 232


@register_pass("warp-specialize")
def warp_specialize(module: Module) -> Module:
    for func in module.functions:
        if "consumer_warps" in func.attrs:
            continue  # already specialized
        explicit = next((op for op in func.regions[0].block.ops if op.name == "mt.warp_specialize"), None)
        if explicit is not None:
            complete_explicit(func, explicit)
        elif func.attrs.get("warp_specialize"):
            specialize_function(func)
    return module


# ---------------------------------------------------------------------------------------------- explicit


def complete_explicit(func: Operation, split: Operation) -> None:
    """The explicit form (module docstring): ring protocols, ring memory, the block's func attrs."""
    rings = [op for op in func.regions[0].block.ops if op.name == "mt.alloc_ring" and op.attrs.get("explicit")]
    for alloc in rings:
        _ring_protocol(func, alloc)
    _place_rings(func, rings)
    _set_block_attrs(func, partitions_of(split))


def _set_block_attrs(func: Operation, parts: list[Partition]) -> None:
    func.attrs["consumer_warps"] = parts[0].warps
    func.attrs["num_warps"] = block_warps(parts)
    if any(p.registers for p in parts):
        func.attrs.setdefault("min_blocks_per_sm", 1)


_FILLS = ("mt.async_copy", "mt.ring_store")


def _ring_protocol(func: Operation, alloc: Operation) -> None:
    ring = alloc.result
    users = [op for op in func.walk() if ring in op.operands]
    fills = [op for op in users if op.name in _FILLS]
    releases = [op for op in users if op.name == "mt.ring_release"]
    reads = [op for op in users if op.name in ("mt.local_load", "mt.ring_slot")]
    filler = _one_partition(fills, alloc, "filled")
    reader = _one_partition(releases + reads, alloc, "read and released")
    if filler is None or reader is None:
        return
    by_tma = {op.name == "mt.async_copy" for op in fills}
    if len(by_tma) > 1:
        raise CompilationError("a ring is filled either by TMA (ring.put(i, desc, ...)) or from registers "
                               "(ring.put(i, tile)), not both", fills[0].loc)
    alloc.attrs["full_arrivals"] = 1 if by_tma == {True} else filler.threads
    in_place = all(op.name == "mt.ring_slot" for op in reads) and filler is not reader
    per_warpgroup = in_place and reader.warps % WARPGROUP_WARPS == 0
    alloc.attrs["empty_arrivals"] = reader.warps // WARPGROUP_WARPS if per_warpgroup else reader.threads
    for op in releases:
        op.attrs["arrive"] = "warpgroup" if per_warpgroup else "thread"


def _one_partition(ops: list[Operation], alloc: Operation, what: str) -> Partition | None:
    """The one partition holding all of `ops` (None when there are none); an error when they are in several or
    outside the partitions."""
    found = {}
    for op in ops:
        where = enclosing_partition(op)
        if where is None:
            raise CompilationError(f"a ring is {what} inside the partitions of mt.warp_specialize only", op.loc)
        found[where[1].index] = where[1]
    if len(found) > 1:
        raise CompilationError(f"a ring is {what} by one partition only (here partitions "
                               f"{', '.join(map(str, sorted(found)))}); use one ring per direction", alloc.loc)
    return next(iter(found.values()), None)


def _place_rings(func: Operation, rings: list[Operation]) -> None:
    """Every explicit ring in dynamic shared memory, 1024-aligned (the 128B swizzle atom), after any ring the
    pipeline pass placed there."""
    from .pipeline import DYNAMIC_BUDGET, RING_ALIGN

    offset = max(0, int(func.attrs.get("dynamic_shared_memory", RING_ALIGN)) - RING_ALIGN)
    for alloc in rings:
        t = alloc.result.type
        alloc.attrs["dynamic_offset"] = offset
        offset += -(-t.numel * t.scalar.bytes // RING_ALIGN) * RING_ALIGN  # type: ignore[union-attr]
    if rings:
        if offset + RING_ALIGN > DYNAMIC_BUDGET:
            raise CompilationError(f"the kernel's rings need {offset} bytes of shared memory; an SM holds at most "
                                   f"{DYNAMIC_BUDGET - RING_ALIGN} (use fewer stages or smaller tiles)",
                                   rings[0].loc)
        func.attrs["dynamic_shared_memory"] = offset + RING_ALIGN


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
    split = _split_roles(func, top, loop, consumers)
    producer_block = split.regions[1].block
    _build_producer(producer_block, loop, rings, copies, iteration, stages)
    _rewrite_consumer_loop(loop, waits, copies, dots[0], rings, read_slot, counter, stages)
    for ring in rings:
        ring.defining_op.attrs["empty_arrivals"] = consumers // 4  # type: ignore[union-attr]
    _set_block_attrs(func, partitions_of(split))
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
    """An mt.warp_specialize in front of the loop: the loop and everything after it (but the terminator) move into
    partition 0 (the consumers, warps 0 .. consumers - 1); partition 1 (the producer warpgroup) is empty for
    _build_producer. Returns the op."""
    start = top.ops.index(loop)
    moved = top.ops[start:-1]
    consumer, producer = Block(), Block()
    for op in moved:
        top.ops.remove(op)
        op.parent = None
    for op in moved:
        consumer.append(op)
    for block in (consumer, producer):
        block.append(Operation("scf.yield", [], [], loc=loop.loc))
    split = Operation("mt.warp_specialize", [], [], {"warps": [consumers, PRODUCER_WARPS],
                                                      "registers": [consumer_registers(consumers),
                                                                    PRODUCER_REGISTERS]},
                      regions=[Region([consumer]), Region([producer])], loc=loop.loc)
    top.insert(start, split)
    return split


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
