"""The software-pipelining ops (passes/pipeline.py) in PTX: shared-memory rings filled with cp.async.

  mt.alloc_ring   a `.shared .align 128 .b8 mt_ringN[bytes]` variable of its own (it lives across the whole loop,
                  so it cannot share the scratch buffer `smem` the other lowerings reuse); slot s of a
                  tensor<S x R x C> ring is R x C elements, row-major, unpadded, at mt_ringN + s * R * C * size
  mt.async_copy   per 16-byte run of the pointer tile (the pass gave it a copy layout with 16 / size elements per
                  thread along the rows): `cp.async.cg.shared.global [dst], [src], 16, n;` with n = size * (number
                  of true mask lanes of the run): the pass proved the true lanes come first in every run, and the
                  hardware zero-fills bytes n .. 15 (n = 0: no global read, 16 zero bytes)
  mt.async_commit `cp.async.commit_group;`
  mt.async_wait   `cp.async.wait_group N;` then `bar.sync` (other threads' copies become visible, and every read
                  of the slot the next copy overwrites — made in the previous iteration — is finished)
  mt.local_load   ld.shared of the slot in the result's layout (16-byte vectors where the registers allow)
"""
from __future__ import annotations

from minitriton.ir import Operation, Value
from minitriton.ir.layouts import ThreadMap, vector_groups
from minitriton.ir.types import ScalarType, TensorType

from .context import KernelContext
from .mma import store_width

COPY_BYTES = 16


def lower_alloc_ring(ctx: KernelContext, op: Operation) -> None:
    t: TensorType = op.result.type  # type: ignore[assignment]
    enc = t.encoding
    if enc is not None and (enc.kind != "shared" or enc.get("swizzle", 0) != 0 or tuple(enc.get("order", (1, 0)))
                            != (1, 0) or len(t.shape) != 3):
        raise ctx.error(f"rings are laid out row-major and unswizzled (#mt.shared<{{swizzle = 0, order = [1, 0]}}>), "
                        f"got {t}")
    name = f"mt_ring{sum(1 for d in ctx.shared_decls if 'mt_ring' in d)}"
    ctx.shared_decls.append(f".shared .align 128 .b8 {name}[{t.numel * t.scalar.bytes}];")  # type: ignore[union-attr]
    ctx.bind(op.result, [ctx.in_prologue(("ring", name), "b32", f"mov.u32 {{d}}, {name};")])


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
    addr = _thread_addr(ctx, _slot_base(ctx, ring, slot), tmap, cols, size)
    for group in groups:
        row, col = tmap.reg_offsets[group[0]]
        src_size = _src_size(ctx, [masks[r] for r in group] if masks else None, size)
        guard = f"@{owner} " if owner else ""
        ctx.emit(f"{guard}cp.async.cg.shared.global [{addr}+{size * (row * cols + col)}], [{ptrs[group[0]]}], "
                 f"{COPY_BYTES}, {src_size};")


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
    ctx.emit(f"cp.async.wait_group {int(op.attrs['pending'])};")
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
