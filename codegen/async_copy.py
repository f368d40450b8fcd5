"""The software-pipelining ops (passes/pipeline.py) in PTX: shared-memory rings filled with cp.async.

  mt.alloc_ring   a `.shared .align 128 .b8 mt_ringN[bytes]` variable of its own (it lives across the whole loop,
                  so it cannot share the scratch buffer `smem` the other lowerings reuse); slot s of a
                  tensor<S x R x C> ring is R x C elements, row-major, unpadded, at mt_ringN + s * R * C * size
  mt.async_copy   per 16-byte run of the pointer tile (the pass gave it a copy layout with 16 / size elements per
                  thread along the rows): `cp.async.cg.shared.global [dst], [src], 16, n;` with n = size * (number
                  of true mask lanes of the run): the pass proved the true lanes come first in every run, and the
                  hardware zero-fills bytes n .. 15 (n = 0: no global read, 16 zero bytes); with attr
                  `uniform_runs` (the lanes of a run agree) n = 16 or 0 from the run's first lane
  mt.async_commit `cp.async.commit_group;`
  mt.async_wait   `cp.async.wait_group N;` then `bar.sync` (other threads' copies become visible, and every read
                  of the slot the next copy overwrites — made in the previous iteration — is finished)
  mt.local_load   ld.shared of the slot in the result's layout (16-byte vectors where the registers allow)
  mt.ring_slot    the slot's address (a view a wgmma dot reads in place)

Rings laid out as wgmma operands (`#mt.shared<{swizzle = S, order = [1, 0], operand = 0 | 1 | 2, stages}>`, passes/
pipeline.py): each 16-byte copy goes to where codegen/wgmma.py's `operand_offset` puts its first element (the
offset is GF(2)-linear in the coordinates: the thread's part once, in the prologue, XORed with each run's), the
ring is 1024-byte aligned (the 128B swizzle atom), and mt.async_wait adds `fence.proxy.async.shared::cta` between
the wait and the bar.sync (cp.async writes through the generic proxy, wgmma reads through the async one). A ring
with attr `dynamic_offset` lives in the kernel's dynamic shared memory (`.extern .shared .align 1024 .b8 mt_dyn[]`,
at that offset from mt_dyn rounded up to 1024 bytes; the pass sized it, alignment slack included, in the func
attr `dynamic_shared_memory`) instead of a static variable of its own.

TMA-fed rings (passes/pipeline.py "TMA rings"; docs/kernels/gemm.md v2):
  mt.alloc_ring {tma_barriers}   also `.shared .align 8 .b64 mt_barsN[S]`: one mbarrier per slot, arrival count 1,
                                 initialized by thread 0, `fence.mbarrier_init`, bar.sync
  mt.async_copy (ring, slot, desc, row, col, valid)   thread 0, when valid: `mbarrier.arrive.expect_tx` of the tile's
                                 bytes on the slot's barrier, then one `cp.async.bulk.tensor.2d` per box of
                                 codegen/tma.py `wgmma_ring_boxes` (16 [8, 64] boxes of A per 128 rows, one [K, 64]
                                 box of B per column atom) at its offset of the slot, completing on that barrier
  mt.async_wait (ring, slot, phase)   spin on `mbarrier.try_wait.parity` of the slot's barrier; attr `barrier`: then
                                 bar.sync. TMA writes and wgmma reads both go through the async proxy: no fence.

Warp-specialized rings (passes/warp_specialize.py; docs/kernels/gemm.md v3):
  mt.alloc_ring {empty_arrivals = W}  also `.shared .align 8 .b64 mt_emptyN[S]`: the slots' empty barriers,
                                 arrival count W (one per consumer warpgroup)
  mt.async_wait {empty}          spins on the slot's empty barrier instead (the producer, before refilling it)
  mt.ring_release (ring, slot, valid)   when valid: thread 0 of each consumer warpgroup (attr arrive "warpgroup",
                                 the default: the consumers read the slot through wgmma and waited for it), or every
                                 thread (arrive "thread": they read it with ld.shared) does
                                 `mbarrier.arrive.shared::cta.b64 _, [empty slot barrier]`
  mt.alloc_ring {full_arrivals = F}  the full barriers count F arrivals (default 1: a TMA fill's arrive.expect_tx)
  mt.ring_store (ring, slot, tile)   each thread stores its elements into the slot (st.shared, 16-byte vectors
                                 where the registers allow; for a slot laid out as a wgmma operand, at
                                 codegen/wgmma.py's operand offsets), then `fence.proxy.async.shared::cta` when a
                                 wgmma reads the slot, then arrives on the slot's full barrier
The partitions themselves are codegen/ptx.py's lower_warp_specialize; inside one, KernelContext gives barriers,
the leader and the scratch buffer of that partition.
"""
from __future__ import annotations

from minitriton.ir import Operation, Value
from minitriton.ir.layouts import ThreadMap, vector_groups
from minitriton.ir.types import ScalarType, TensorDescType, TensorType

from .context import KernelContext
from .mma import store_width
from .tma import arrive_expect_tx, tma_load, wgmma_ring_boxes
from .wgmma import ALIGN, _linear, offset_of_register, operand_offset, possible_bits

COPY_BYTES = 16


DYNAMIC = "mt_dyn"


def lower_alloc_ring(ctx: KernelContext, op: Operation) -> None:
    _alloc_ring_memory(ctx, op)
    if op.attrs.get("tma_barriers"):
        _alloc_slot_barriers(ctx, op)


def _alloc_ring_memory(ctx: KernelContext, op: Operation) -> None:
    t: TensorType = op.result.type  # type: ignore[assignment]
    enc = t.encoding
    operand = _wgmma_operand(t)
    if enc is not None and operand is None and (enc.kind != "shared" or enc.get("swizzle", 0) != 0 or tuple(
            enc.get("order", (1, 0))) != (1, 0) or len(t.shape) != 3):
        raise ctx.error(f"rings are laid out row-major and unswizzled (#mt.shared<{{swizzle = 0, order = [1, 0]}}>), "
                        f"or as wgmma operands (operand = 0 | 1 | 2), got {t}")
    if operand is not None:
        ctx.async_proxy_rings = True  # type: ignore[attr-defined]
    if "dynamic_offset" in op.attrs:
        if not any(DYNAMIC in d for d in ctx.shared_decls):
            ctx.shared_decls.append(f".extern .shared .align {ALIGN} .b8 {DYNAMIC}[];")
        offset = int(op.attrs["dynamic_offset"])
        ctx.bind(op.result, [ctx.in_prologue(("ring", DYNAMIC, offset), "b32",
                                             f"add.u32 {{d}}, {_dynamic_base(ctx)}, {offset};")])
        return
    name = f"mt_ring{sum(1 for d in ctx.shared_decls if 'mt_ring' in d)}"
    align = ALIGN if operand is not None else 128
    ctx.shared_decls.append(f".shared .align {align} .b8 {name}[{t.numel * t.scalar.bytes}];")  # type: ignore
    ctx.bind(op.result, [ctx.in_prologue(("ring", name), "b32", f"mov.u32 {{d}}, {name};")])


def _dynamic_base(ctx: KernelContext) -> str:
    """mt_dyn rounded up to ALIGN (the swizzle is applied to absolute address bits: the pass reserved ALIGN bytes
    more than the rings need, so the alignment does not rest on where the driver puts dynamic shared memory)."""
    raw = ctx.in_prologue(("dyn", DYNAMIC), "b32", f"mov.u32 {{d}}, {DYNAMIC};")
    bumped = ctx.in_prologue(("dyn+", DYNAMIC), "b32", f"add.u32 {{d}}, {raw}, {ALIGN - 1};")
    return ctx.in_prologue(("dyn_aligned", DYNAMIC), "b32", f"and.b32 {{d}}, {bumped}, {-ALIGN & 0xFFFFFFFF:#x};")


def _wgmma_operand(t: TensorType) -> int | None:
    enc = t.encoding
    if enc is None or enc.kind != "shared" or enc.get("operand") not in (0, 1, 2):
        return None
    return int(enc.get("operand"))


def lower_ring_slot(ctx: KernelContext, op: Operation) -> None:
    ctx.bind(op.result, [_slot_base(ctx, op.operands[0], op.operands[1])])


def _slot_base(ctx: KernelContext, ring: Value, slot: Value) -> str:
    """The address of the ring slot (a register)."""
    t: TensorType = ring.type  # type: ignore[assignment]
    slot_bytes = t.numel // t.shape[0] * t.scalar.bytes  # type: ignore[union-attr]
    base = ctx.new("b32")
    ctx.emit(f"mad.lo.u32 {base}, {ctx.get1(slot)}, {slot_bytes}, {ctx.get(ring)[0]};")
    return base


def _thread_addr(ctx: KernelContext, slot_base: str, tmap: ThreadMap, cols: int, size: int) -> str:
    addr = ctx.new("b32")
    ctx.emit(f"mad.lo.u32 {addr}, {ctx.linear_base(tmap, (cols, 1))}, {size}, {slot_base};")
    return addr


def lower_async_copy(ctx: KernelContext, op: Operation) -> None:
    if isinstance(op.operands[2].type, TensorDescType):
        _tma_ring_copy(ctx, op)
        return
    ring, slot, ptr = op.operands[:3]
    tmap = ctx.tmap(ptr)
    size = ring.type.scalar.bytes  # type: ignore[union-attr]
    width, cols = COPY_BYTES // size, tmap.shape[1]
    try:
        groups = vector_groups(tmap, 1, width)
    except ValueError as e:
        raise ctx.error(f"mt.async_copy needs runs of {width} elements per thread along the rows: {e}") from None
    ptrs = ctx.get(ptr)
    masks = ctx.get(op.operands[3]) if len(op.operands) > 3 else None
    owner = ctx.owner_pred(tmap)
    operand = _wgmma_operand(ring.type)  # type: ignore[arg-type]
    if operand is not None:
        dst = _operand_destinations(ctx, _slot_base(ctx, ring, slot), tmap, groups, operand, ring.type)
    else:
        addr = _thread_addr(ctx, _slot_base(ctx, ring, slot), tmap, cols, size)
        dst = [f"{addr}+{size * (row * cols + col)}" for row, col in (tmap.reg_offsets[g[0]] for g in groups)]
    uniform = bool(op.attrs.get("uniform_runs", False))  # the pass proved each run's lanes agree
    for group, at in zip(groups, dst):
        run = [masks[r] for r in (group[:1] if uniform else group)] if masks else None
        src_size = _src_size(ctx, run, size) if run is None or not uniform else _whole_or_none(ctx, run[0])
        guard = f"@{owner} " if owner else ""
        ctx.emit(f"{guard}cp.async.cg.shared.global [{at}], [{ptrs[group[0]]}], {COPY_BYTES}, {src_size};")


def ring_warps(ctx: KernelContext, ring_t: TensorType) -> int:
    """The warps of the wgmma dots that read the ring's slots (their A rows are permuted for that count): the ring
    layout's `warps` (explicit partitions: the reading partition's), else the warps of the code outside the
    partitions (the pipeline pass's rings: its consumers', also when the producer warpgroup fills them)."""
    return int(ring_t.encoding.get("warps", ctx.outer_warps))  # type: ignore[union-attr]


def _operand_destinations(ctx: KernelContext, slot_base: str, tmap: ThreadMap, groups: list[list[int]],
                          operand: int, ring_t: TensorType) -> list[str]:
    """The shared address of each 16-byte run in a slot laid out as wgmma operand `operand`."""
    offset = operand_offset(operand, tuple(ring_t.shape[1:]), ring_t.encoding.get("swizzle"),  # type: ignore
                            ring_warps(ctx, ring_t))
    bits = (possible_bits(tmap, 0), possible_bits(tmap, 1))
    base = _linear(ctx, [ctx.dim_base(tmap.dims[d]) for d in (0, 1)], bits, offset)
    start = ctx.new("b32")
    ctx.emit(f"add.u32 {start}, {slot_base}, {base};")
    out = []
    for group in groups:
        off = tmap.reg_offsets[group[0]]
        if all(bits[d] & off[d] == 0 for d in (0, 1)):  # base + off == base ^ off: offset(base) ^ offset(off)
            if offset(off[0], off[1]) & int(_max_offset(ctx, bits, offset)):  # overlapping bits: XOR, not add
                moved, addr = ctx.new("b32"), ctx.new("b32")
                ctx.emit(f"xor.b32 {moved}, {base}, {offset(off[0], off[1])};")
                ctx.emit(f"add.u32 {addr}, {slot_base}, {moved};")
                out.append(addr)
            else:
                out.append(f"{start}+{offset(off[0], off[1])}")
            continue
        moved = offset_of_register(ctx, tmap, off, offset)
        addr = ctx.new("b32")
        ctx.emit(f"add.u32 {addr}, {slot_base}, {moved};")
        out.append(addr)
    return out


def _max_offset(ctx: KernelContext, bits: tuple[int, int], offset) -> int:  # type: ignore[no-untyped-def]
    """The bits the thread-dependent part of an offset may have set (OR over its GF(2) basis)."""
    acc = 0
    for d in (0, 1):
        for b in range(bits[d].bit_length()):
            if bits[d] >> b & 1:
                acc |= offset(1 << b, 0) if d == 0 else offset(0, 1 << b)
    return acc


def _whole_or_none(ctx: KernelContext, pred: str) -> str:
    n = ctx.new("b32")
    ctx.emit(f"selp.u32 {n}, {COPY_BYTES}, 0, {pred};")
    return n


def _src_size(ctx: KernelContext, preds: list[str] | None, size: int) -> str:
    """Bytes to read: size per true lane (they come first in the run), 16 without a mask."""
    if preds is None:
        return str(COPY_BYTES)
    if len(set(preds)) == 1:
        n = ctx.new("b32")
        ctx.emit(f"selp.u32 {n}, {COPY_BYTES}, 0, {preds[0]};")
        return n
    total = None
    for p in preds:
        n = ctx.new("b32")
        ctx.emit(f"selp.u32 {n}, {size}, 0, {p};")
        if total is not None:
            ctx.emit(f"add.u32 {n}, {n}, {total};")
        total = n
    return total  # type: ignore[return-value]


def lower_async_commit(ctx: KernelContext, op: Operation) -> None:
    ctx.emit("cp.async.commit_group;")


def lower_async_wait(ctx: KernelContext, op: Operation) -> None:
    if op.operands:
        _tma_ring_wait(ctx, op)
        return
    ctx.emit(f"cp.async.wait_group {int(op.attrs['pending'])};")
    if getattr(ctx, "async_proxy_rings", False):  # a wgmma reads the slots through the async proxy
        ctx.emit("fence.proxy.async.shared::cta;")
    ctx.barrier()


def lower_local_load(ctx: KernelContext, op: Operation) -> None:
    ring, slot = op.operands
    tmap = ctx.tmap(op.result)
    s: ScalarType = op.result.type.scalar  # type: ignore[assignment]
    size, cols = s.bytes, tmap.shape[1]
    if size not in (2, 4):
        raise ctx.error(f"mt.local_load of {s} elements is not supported (16- and 32-bit only)")
    addr = _thread_addr(ctx, _slot_base(ctx, ring, slot), tmap, cols, size)
    width = store_width(tmap, 1, size)
    groups = vector_groups(tmap, 1, width) if width > 1 else [[r] for r in range(tmap.num_regs)]
    out = [""] * tmap.num_regs
    for group in groups:
        row, col = tmap.reg_offsets[group[0]]
        at = f"[{addr}+{size * (row * cols + col)}]"
        if size == 2 and len(group) == 1:
            out[group[0]] = ctx.new("b16")
            ctx.emit(f"ld.shared.b16 {out[group[0]]}, {at};")
            continue
        words = [ctx.new("b32") for _ in range(len(group) * size // 4)]
        vec = "" if len(words) == 1 else f".v{len(words)}"
        body = words[0] if len(words) == 1 else "{" + ", ".join(words) + "}"
        ctx.emit(f"ld.shared{vec}.b32 {body}, {at};")
        if size == 4:
            for r, w in zip(group, words):
                out[r] = w if s.name != "f32" else _as_f32(ctx, w)
            continue
        for i, w in enumerate(words):
            lo, hi = ctx.new("b16"), ctx.new("b16")
            ctx.emit(f"mov.b32 {{{lo}, {hi}}}, {w};")
            out[group[2 * i]], out[group[2 * i + 1]] = lo, hi
    ctx.bind(op.result, out)


def _as_f32(ctx: KernelContext, w: str) -> str:
    f = ctx.new("f32")
    ctx.emit(f"mov.b32 {f}, {w};")
    return f


# ------------------------------------------------------------------------------------- TMA-fed rings


MBARRIER_BYTES = 8


def _alloc_slot_barriers(ctx: KernelContext, op: Operation) -> None:
    """One mbarrier per slot (`.shared .align 8 .b64 mt_barsN[S]`, arrival count 1: the leader's
    arrive.expect_tx), initialized here by the leader and published to every thread by a bar.sync."""
    stages = int(op.attrs["stages"])
    name = f"mt_bars{sum(1 for d in ctx.shared_decls if 'mt_bars' in d)}"
    ctx.shared_decls.append(f".shared .align {MBARRIER_BYTES} .b64 {name}[{stages}];")
    bars = ctx.in_prologue(("ring_bars", name), "b32", f"mov.u32 {{d}}, {name};")
    _slot_barriers(ctx)[ctx.get(op.result)[0]] = bars
    leader = ctx.owner_pred(None)
    arrivals = int(op.attrs.get("full_arrivals", 1))
    for s in range(stages):
        ctx.emit(f"@{leader} mbarrier.init.shared::cta.b64 [{bars}+{MBARRIER_BYTES * s}], {arrivals};")
    if "empty_arrivals" in op.attrs:
        _alloc_empty_barriers(ctx, op, stages, leader)
    ctx.emit("fence.mbarrier_init.release.cluster;")
    ctx.barrier()


def _barrier_table(ctx: KernelContext, kind: str) -> dict[str, str]:
    """ring register -> the register holding the address of its `kind` ("full" or "empty") slot barriers."""
    tables = ctx.__dict__.setdefault("ring_barrier_tables", {})
    return tables.setdefault(kind, {})


def _barrier_of(ctx: KernelContext, kind: str, ring: Value, slot: Value) -> str:
    """The address of the ring slot's `kind` mbarrier."""
    bars = _barrier_table(ctx, kind).get(ctx.get(ring)[0])
    if bars is None:
        what = ("a TMA ring copy or wait on a ring without slot barriers (attr tma_barriers)" if kind == "full" else
                "an empty-slot wait or release on a ring without empty barriers (attr empty_arrivals)")
        raise ctx.error(what)
    bar = ctx.new("b32")
    ctx.emit(f"mad.lo.u32 {bar}, {ctx.get1(slot)}, {MBARRIER_BYTES}, {bars};")
    return bar


def _slot_barriers(ctx: KernelContext) -> dict[str, str]:
    return _barrier_table(ctx, "full")


def _slot_barrier(ctx: KernelContext, ring: Value, slot: Value) -> str:
    return _barrier_of(ctx, "full", ring, slot)


def _tma_ring_copy(ctx: KernelContext, op: Operation) -> None:
    """mt.async_copy (ring, slot, desc, row, col, valid): the leader, when valid, announces the tile's bytes on the
    slot's barrier, then issues the boxes (codegen/tma.py wgmma_ring_boxes) at their offsets of the slot."""
    ring, slot, desc, row, col, valid = op.operands
    ring_t: TensorType = ring.type  # type: ignore[assignment]
    operand = _wgmma_operand(ring_t)
    if operand is None:
        raise ctx.error("TMA ring copies fill rings laid out as wgmma operands")
    shape = tuple(ring_t.shape[1:])
    box_shape = tuple(desc.type.block_shape)  # type: ignore[union-attr]
    reader_warps = ring_warps(ctx, ring_t)
    boxes = wgmma_ring_boxes(operand, shape, reader_warps, ring_t.scalar.bytes,  # type: ignore[arg-type,union-attr]
                             rank=len(box_shape))
    if any(tuple(b) != box_shape for _, b, _ in boxes):
        what = ("A", "B", "B^T")[operand]
        raise ctx.error(f"the descriptor's box {list(box_shape)} is not the box this ring is filled with: the slots "
                        f"hold wgmma operand {what} for {reader_warps} warps, filled in {list(boxes[0][1])} boxes "
                        f"(examples/matmul.py tma_ring_descriptors builds such descriptors)")
    issue = ctx.new("pred")
    ctx.emit(f"and.pred {issue}, {ctx.leader()}, {ctx.get1(valid)};")
    base = _slot_base(ctx, ring, slot)
    bar = _slot_barrier(ctx, ring, slot)
    nbytes = shape[0] * shape[1] * ring_t.scalar.bytes  # type: ignore[union-attr]
    arrive_expect_tx(ctx, bar, nbytes, issue)
    tensor_map, r0, c0 = ctx.get1(desc), ctx.get1(row), ctx.get1(col)
    for (dr, dc), _, at in boxes:
        row, col = ctx.plus(r0, dr), ctx.plus(c0, dc)
        coords = [row, col] if len(box_shape) == 2 else _paired_rows(ctx, row) + [col]
        tma_load(ctx, f"{base}+{at}" if at else base, tensor_map, coords, bar, issue)


def _paired_rows(ctx: KernelContext, row: str) -> list[str]:
    """The outer coordinates (q, u, g) = (row / 64, row / 8 % 8, 0) of A row `row` in its [M / 64, 8, 8, K] view
    (wgmma_ring_boxes rank 4)."""
    q, u, g = ctx.new("b32"), ctx.new("b32"), ctx.new("b32")
    ctx.emit(f"shr.s32 {q}, {row}, 6;")
    ctx.emit(f"bfe.u32 {u}, {row}, 3, 3;")
    ctx.emit(f"mov.b32 {g}, 0;")
    return [q, u, g]





def _tma_ring_wait(ctx: KernelContext, op: Operation) -> None:
    """mt.async_wait (ring, slot, phase): spin on the slot barrier's phase of that parity; attr barrier: bar.sync."""
    ring, slot, phase = op.operands
    bar = _empty_barrier(ctx, ring, slot) if op.attrs.get("empty") else _slot_barrier(ctx, ring, slot)
    done, loop = ctx.new("pred"), ctx.new_label("ring_wait")
    ctx.label(loop)
    ctx.emit(f"mbarrier.try_wait.parity.shared::cta.b64 {done}, [{bar}], {ctx.get1(phase)};")
    ctx.emit(f"@!{done} bra {loop};")
    if op.attrs.get("barrier"):
        ctx.barrier()


# ------------------------------------------------------------------------------- warp specialization


def _alloc_empty_barriers(ctx: KernelContext, op: Operation, stages: int, leader: str) -> None:
    """The slots' empty barriers (`mt_emptyN[S]`, one arrival per consumer warpgroup), initialized with the full
    ones (the same fence and bar.sync publish them)."""
    name = f"mt_empty{sum(1 for d in ctx.shared_decls if 'mt_empty' in d)}"
    ctx.shared_decls.append(f".shared .align {MBARRIER_BYTES} .b64 {name}[{stages}];")
    bars = ctx.in_prologue(("ring_empty", name), "b32", f"mov.u32 {{d}}, {name};")
    _empty_barriers(ctx)[ctx.get(op.result)[0]] = bars
    arrivals = int(op.attrs["empty_arrivals"])
    for s in range(stages):
        ctx.emit(f"@{leader} mbarrier.init.shared::cta.b64 [{bars}+{MBARRIER_BYTES * s}], {arrivals};")


def _empty_barriers(ctx: KernelContext) -> dict[str, str]:
    return _barrier_table(ctx, "empty")


def _empty_barrier(ctx: KernelContext, ring: Value, slot: Value) -> str:
    return _barrier_of(ctx, "empty", ring, slot)


WARPGROUP_THREADS = 128


def lower_ring_release(ctx: KernelContext, op: Operation) -> None:
    """Thread 0 of each consumer warpgroup (after its wgmma.wait_group), or with attr arrive "thread" every thread,
    arrives on the slot's empty barrier."""
    ring, slot, valid = op.operands
    signal = ctx.get1(valid)
    if op.attrs.get("arrive", "warpgroup") == "warpgroup":
        in_group = ctx.in_prologue(("tid_in_warpgroup",), "b32", f"and.b32 {{d}}, {ctx.tid}, {WARPGROUP_THREADS - 1};")
        first = ctx.in_prologue(("warpgroup_first",), "pred", f"setp.eq.u32 {{d}}, {in_group}, 0;")
        signal = ctx.new("pred")
        ctx.emit(f"and.pred {signal}, {first}, {ctx.get1(valid)};")
    bar = _empty_barrier(ctx, ring, slot)
    ctx.emit(f"@{signal} mbarrier.arrive.shared::cta.b64 _, [{bar}];")


def lower_ring_store(ctx: KernelContext, op: Operation) -> None:
    """Each thread writes its elements of the tile into the slot, then arrives on the slot's full barrier."""
    ring, slot, tile = op.operands
    ring_t: TensorType = ring.type  # type: ignore[assignment]
    tmap = ctx.tmap(tile)
    size = ring_t.scalar.bytes  # type: ignore[union-attr]
    base = _slot_base(ctx, ring, slot)
    regs = ctx.get(tile)
    owner = ctx.owner_pred(tmap)  # replicated elements: written once
    operand = _wgmma_operand(ring_t)
    if operand is None:
        width = store_width(tmap, 1, size)
        groups = vector_groups(tmap, 1, width) if width > 1 else [[r] for r in range(tmap.num_regs)]
        addr = _thread_addr(ctx, base, tmap, tmap.shape[1], size)
        cols = tmap.shape[1]
        places = [f"{addr}+{size * (r * cols + c)}" for r, c in (tmap.reg_offsets[g[0]] for g in groups)]
    else:
        width = min(store_width(tmap, 1, size), COPY_BYTES // size)
        groups = vector_groups(tmap, 1, width) if width > 1 else [[r] for r in range(tmap.num_regs)]
        places = _operand_destinations(ctx, base, tmap, groups, operand, ring_t)
    guard = f"@{owner} " if owner else ""
    for group, at in zip(groups, places):
        _store_run(ctx, guard, at, [regs[r] for r in group], size)
    if operand is not None:  # the slot is read by wgmma, through the async proxy
        ctx.emit("fence.proxy.async.shared::cta;")
    bar = _slot_barrier(ctx, ring, slot)
    ctx.emit(f"mbarrier.arrive.shared::cta.b64 _, [{bar}];")


def _store_run(ctx: KernelContext, guard: str, at: str, vals: list[str], size: int) -> None:
    """st.shared of consecutive elements (16- or 32-bit) packed into 32-bit words where there are two or more."""
    if size == 4:
        words = vals
    elif len(vals) == 1:
        ctx.emit(f"{guard}st.shared.b16 [{at}], {vals[0]};")
        return
    else:
        words = []
        for lo, hi in zip(vals[0::2], vals[1::2]):
            w = ctx.new("b32")
            ctx.emit(f"mov.b32 {w}, {{{lo}, {hi}}};")
            words.append(w)
    body = words[0] if len(words) == 1 else "{" + ", ".join(words) + "}"
    vec = "" if len(words) == 1 else f".v{len(words)}"
    ctx.emit(f"{guard}st.shared{vec}.b32 [{at}], {body};")
